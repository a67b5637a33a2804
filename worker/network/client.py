"""The consumer's side of the data exchange (see ``flight.py`` for the protocol): one
connection per producer TaskExecutor, and the remote input channels it feeds, each with its
credit (``credit.py``)."""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from yarnflow.common.errors import RpcConnectionError
from yarnflow.worker.network.credit import FloatingBufferPool, ReceiverCredit
from yarnflow.worker.network.flight import EMPTY_SCHEMA, EXCHANGE, HEADER, PartitionNotFoundError, frame
from yarnflow.worker.elements import CheckpointBarrier, EndOfPartition, decode_event

if TYPE_CHECKING:
    from yarnflow.common.security import TlsCredentials

log = logging.getLogger(__name__)


def aligned(message: pa.Buffer) -> pa.Buffer:
    """``message`` (an IPC record batch message, as gRPC handed it over) at an 8-byte aligned
    address: its body's buffers are at multiples of 8 from its start, so the batch read from it
    has every buffer aligned to its type's width, as Arrow compute and Acero want (Acero warned
    about each unaligned one: most of a TaskExecutor's log in a windowed job). gRPC's buffers
    start anywhere; a misaligned one is copied (memcpy speed), an aligned one used as it is."""
    if message.address % 8 == 0:
        return message
    copy = pa.allocate_buffer(message.size)
    np.frombuffer(copy, dtype=np.uint8)[:] = np.frombuffer(message, dtype=np.uint8)
    return copy


class _ClientConnection:
    """A consumer TaskExecutor's connection to one producer TaskExecutor: one receiving thread
    dispatches every channel's messages; one sending thread writes the channels' opens, closes
    and credit (a task that takes a batch only adds to its channel's credit: a gRPC write
    waits for the one before it, which a task thread must not)."""

    def __init__(self, owner: DataClient, address: str) -> None:
        self._owner = owner
        self.address = address
        tls = owner.tls
        self._client = (flight.connect(f"grpc+tcp://{address}") if tls is None else
                        flight.connect(f"grpc+tls://{address}", **tls.flight_client_options()))
        self._writer, self._reader = self._client.do_exchange(EXCHANGE)
        self._writer.begin(EMPTY_SCHEMA)
        self._lock = threading.Lock()
        self._channels: dict[int, RemoteInputChannel] = {}
        self._ids = itertools.count(1)
        self.failed: BaseException | None = None
        self._out = threading.Condition()
        self._outbox: collections.deque[pa.Buffer] = collections.deque()
        self._credits: dict[int, int] = {}
        self._closing = False
        self._thread = threading.Thread(target=self._receive, name=f"data-client {address}", daemon=True)
        self._thread.start()
        self._sender = threading.Thread(target=self._send_loop, name=f"data-client-send {address}", daemon=True)
        self._sender.start()

    def register(self, ch: RemoteInputChannel) -> int:
        """A new channel id for ``ch``, whose messages go to it from now on."""
        with self._lock:
            if self.failed is not None:
                raise self.failed
            channel = next(self._ids)
            self._channels[channel] = ch
        return channel

    def forget(self, channel: int, tell: bool) -> None:
        with self._lock:
            self._channels.pop(channel, None)
        if tell:
            self.send(frame(b"K", channel))

    def send(self, frame: pa.Buffer) -> None:
        """Queue ``frame`` (an open or close), sent in order before any credit queued later."""
        with self._out:
            self._outbox.append(frame)
            self._out.notify()

    def credit(self, channel: int, n: int) -> None:
        """Add ``n`` to the credit announced for ``channel`` (what is queued goes as one frame)."""
        with self._out:
            self._credits[channel] = self._credits.get(channel, 0) + n
            self._out.notify()

    def _send_loop(self) -> None:
        try:
            while True:
                with self._out:
                    while not self._outbox and not self._credits and not self._closing:
                        self._out.wait()
                    if self._closing:
                        break
                    frames = list(self._outbox)
                    self._outbox.clear()
                    frames += [frame(b"C", ch, n) for ch, n in self._credits.items()]
                    self._credits.clear()
                for message in frames:
                    self._writer.write_metadata(message)
        except (flight.FlightError, OSError, pa.ArrowException) as exc:
            log.debug("sending to %s failed: %s", self.address, exc)  # the receiving thread reports it
            return
        try:
            self._writer.done_writing()
        except Exception:  # noqa: BLE001
            pass

    def _receive(self) -> None:
        header: tuple[int, int, int] | None = None  # a batch's (channel, buffers, backlog): its body is next
        schemas: dict[int, pa.Schema] = {}
        try:
            while True:
                meta = self._reader.read_chunk().app_metadata
                if meta is None:
                    continue
                if header is not None:
                    channel, buffers, backlog = header
                    header = None
                    ch = self._channels.get(channel)
                    if ch is not None:
                        ch.on_batch(pa.ipc.read_record_batch(aligned(meta), schemas[channel]), buffers, backlog)
                    continue
                raw = meta.to_pybytes()
                kind, channel, a, b = HEADER.unpack_from(raw)
                if kind == b"D":
                    header = (channel, a, b)
                    continue
                if kind == b"Q":
                    raise ConnectionError("the producer's TaskExecutor is shutting down")
                if kind == b"S":
                    schemas[channel] = pa.ipc.read_schema(pa.py_buffer(raw[HEADER.size:]))
                    continue
                ch = self._channels.get(channel)
                if ch is None:
                    continue
                if kind == b"B":
                    ch.on_backlog(b)
                elif kind == b"F":
                    ch.on_producer_finished()
                elif kind == b"E":
                    ch.on_event(decode_event(raw[HEADER.size:]))
                elif kind == b"X":
                    ch.on_error(raw[HEADER.size:].decode(errors="replace"), retryable=bool(a))
        except StopIteration:
            error: BaseException = ConnectionError("the producer closed the connection")
        except Exception as exc:  # noqa: BLE001 - every channel of the connection gets it
            error = exc
        with self._lock:
            self.failed = error
            channels = list(self._channels.values())
            self._channels.clear()
        with self._out:  # end our half of the call too: the producer's side may be waiting for it
            self._closing = True
            self._out.notify()
        self._owner._lost(self)
        for ch in channels:
            ch.on_connection_lost(error)

    def close(self) -> None:
        with self._out:
            self._closing = True
            self._out.notify()
        self._sender.join(2.0)
        try:
            self._client.close()
        except Exception:  # noqa: BLE001
            pass


class DataClient:
    """A TaskExecutor's connections to other TaskExecutors' data servers, one per address."""

    def __init__(self, tls: TlsCredentials | None = None) -> None:
        self.tls = tls  # the cluster's credentials: mutual TLS to other TaskExecutors
        self._lock = threading.Lock()
        self._connections: dict[str, _ClientConnection] = {}

    def connection(self, address: str) -> _ClientConnection:
        with self._lock:
            conn = self._connections.get(address)
            if conn is None or conn.failed is not None:
                conn = self._connections[address] = _ClientConnection(self, address)
            return conn

    def _lost(self, conn: _ClientConnection) -> None:
        with self._lock:
            if self._connections.get(conn.address) is conn:
                del self._connections[conn.address]

    def channel(self, address: str, partition_id: str, subpartition: int, producer: str = "",
                retry_for_s: float = 30.0, exclusive_buffers: int = 2, pool: FloatingBufferPool | None = None,
                lock: threading.Lock | None = None) -> RemoteInputChannel:
        """A channel to read ``partition_id/subpartition`` from the TaskExecutor at ``address``
        (``producer``: its resource id, for messages), opened by its ``start``; it gives up
        asking for a partition that is not there after ``retry_for_s``."""
        return RemoteInputChannel(self, address, partition_id, subpartition, producer, retry_for_s,
                                  exclusive_buffers, pool, lock)

    def open(self, address: str, partition_id: str, subpartition: int, producer: str = "",
             retry_for_s: float = 30.0, exclusive_buffers: int = 2) -> RemoteInputChannel:
        """``channel``, opened at once."""
        ch = self.channel(address, partition_id, subpartition, producer, retry_for_s, exclusive_buffers)
        ch.start()
        return ch

    def close(self) -> None:
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        for c in connections:
            c.close()


class RemoteInputChannel:
    """A consumer's channel from a remote subpartition: what arrived, in order, until its task
    takes it (``poll``), and the channel's credit. Safe to use from the task's thread and the
    connection's receiving thread."""

    def __init__(self, client: DataClient, address: str, partition_id: str, subpartition: int, producer: str,
                 retry_for_s: float, exclusive_buffers: int, pool: FloatingBufferPool | None,
                 lock: threading.Lock | None = None) -> None:
        self._client = client
        self.address = address
        self.partition_id = partition_id
        self.subpartition = subpartition
        self._producer = f"TaskExecutor {producer} at {address}" if producer else f"the TaskExecutor at {address}"
        self._deadline = time.monotonic() + retry_for_s
        self._backoff = 0.05
        # one lock for the channels of a gate: they share its floating buffers
        self._lock = lock if lock is not None else threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._queue: collections.deque[tuple[Any, int]] = collections.deque()
        self.pending = False  # (a gate need not ask again unwoken: arrivals wake it)
        #: an unaligned checkpoint's barrier waits at the head of the queue
        self.priority = False
        self._prioritized: set[int] = set()  # checkpoints whose barrier overtakes when it comes
        self._overtaken: dict[int, list[Any]] = {}
        self.credit = ReceiverCredit(exclusive_buffers, pool)
        self.credit.on_lent = lambda _, n: self._announce(n)
        self._conn: _ClientConnection | None = None
        self._channel = 0
        self._buffer_size: int | None = None  # buffer debloating: the size last asked for
        #: the producer has finished: what comes ends with the end of partition, no barrier
        self.producer_finished = False
        self._done = False  # ended, failed or cancelled: nothing more arrives
        self._cancelled = False
        self.queued_bytes = 0
        #: the most bytes of batches the channel ever held (in flight: sent, not yet taken)
        self.peak_bytes = 0
        #: called (without locks held) when an element arrives: its gate's wakeup
        self.listener: Callable[[], None] = lambda: None

    # -- connection side --------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            initial = self.credit.announced if self._conn is not None else self.credit.initial()
        try:
            conn = self._client.connection(self.address)
            channel = conn.register(self)
        except Exception as exc:  # noqa: BLE001 - cannot connect: the task's error
            self.on_connection_lost(exc)
            return
        with self._lock:
            self._conn, self._channel = conn, channel
            size = self._buffer_size
        conn.send(frame(b"O", channel, initial, size or 0, f"{self.partition_id}/{self.subpartition}".encode()))

    def set_buffer_size(self, size: int) -> None:
        """Buffer debloating: ask the producer for buffers of ``size`` bytes (sent at once, or
        when the channel opens)."""
        with self._lock:
            self._buffer_size = size
            conn, channel, done = self._conn, self._channel, self._done
        if conn is not None and not done:
            conn.send(frame(b"Z", channel, size))

    def on_batch(self, batch: pa.RecordBatch, buffers: int, backlog: int) -> None:
        with self._lock:
            if self._done:
                return
            announce = self.credit.on_batch(buffers, backlog)
            self._queue.append((batch, buffers))
            self.queued_bytes += batch.nbytes
            self.peak_bytes = max(self.peak_bytes, self.queued_bytes)
            self._arrived.notify_all()
        self._announce(announce)
        self.listener()

    def on_backlog(self, backlog: int) -> None:
        with self._lock:
            if self._done:
                return
            announce = self.credit.on_backlog(backlog)
        self._announce(announce)

    def take_rest(self) -> None:
        """The producer has finished and the task wants all it still holds now: credit for
        its whole backlog (``ReceiverCredit.overdraw``)."""
        with self._lock:
            extra = self.credit.overdraw() if self.producer_finished and not self._done else 0
        self._announce(extra)

    def on_producer_finished(self) -> None:
        self.producer_finished = True
        self.listener()

    def on_event(self, event: Any) -> None:
        with self._lock:
            if self._done:
                return
            if isinstance(event, CheckpointBarrier) and (
                    event.aligned_timeout_ms == 0 or event.checkpoint_id in self._prioritized):
                self._overtake(event)
            else:
                self._queue.append((event, 0))
            if isinstance(event, EndOfPartition):
                self._end(tell=False)
            self._arrived.notify_all()
        self.listener()

    def on_error(self, message: str, retryable: bool) -> None:
        if retryable and time.monotonic() < self._deadline and not self._cancelled:
            delay, self._backoff = self._backoff, min(self._backoff * 2, 1.0)
            with self._lock:
                if self._conn is not None:
                    self._conn.forget(self._channel, tell=False)
                self._conn = None
            timer = threading.Timer(delay, self.start)
            timer.daemon = True
            timer.start()
            return
        cls = PartitionNotFoundError if retryable else RpcConnectionError
        self._fail(cls(f"cannot read partition {self.partition_id}/{self.subpartition} from {self._producer}: "
                       f"{message}", partition_id=self.partition_id))

    def on_connection_lost(self, exc: BaseException) -> None:
        self._fail(RpcConnectionError(
            f"lost the connection to {self._producer} while reading partition {self.partition_id}/"
            f"{self.subpartition}: {_short(exc)}", partition_id=self.partition_id))

    def _fail(self, error: BaseException) -> None:
        from yarnflow.worker.network.gate import ChannelError

        with self._lock:
            if self._done:
                return
            self._queue.append((ChannelError(error), 0))
            self._end(tell=False)
            self._arrived.notify_all()
        self.listener()

    def _overtake(self, barrier: CheckpointBarrier) -> None:
        """(Under the lock.) Put ``barrier`` at the head; keep what it overtook for the task."""
        self._overtaken[barrier.checkpoint_id] = [e for e, _ in self._queue if not isinstance(e, CheckpointBarrier)]
        self._queue.appendleft((barrier, 0))
        self.priority = True

    def overtake(self, checkpoint_id: int) -> list[Any] | None:
        """The task switched checkpoint ``checkpoint_id`` to unaligned: take its barrier out of
        the queue and return what was ahead of it (None: it has not come; it will overtake)."""
        with self._lock:
            for k, (e, _) in enumerate(self._queue):
                if isinstance(e, CheckpointBarrier) and e.checkpoint_id == checkpoint_id:
                    if checkpoint_id in self._overtaken:  # it came first, overtaking: what it overtook
                        ahead = self._overtaken.pop(checkpoint_id)
                        self.priority = False
                    else:
                        ahead = [x for x, _ in itertools.islice(self._queue, k)
                                 if not isinstance(x, CheckpointBarrier)]
                    del self._queue[k]
                    return ahead
            self._prioritized.add(checkpoint_id)
            return None

    def overtaken_by(self, checkpoint_id: int) -> list[Any]:
        """What the (priority) barrier of ``checkpoint_id`` overtook here: arrived, not taken."""
        with self._lock:
            self._prioritized.discard(checkpoint_id)
            return self._overtaken.pop(checkpoint_id, [])

    def _end(self, tell: bool) -> None:
        """(Under the lock.) Nothing more comes on this channel."""
        self._done = True
        if self._conn is not None:
            self._conn.forget(self._channel, tell)
        self.credit.close()

    def _announce(self, credit: int) -> None:
        conn = self._conn
        if credit and conn is not None and not self._done:
            conn.credit(self._channel, credit)

    # -- task side --------------------------------------------------------------------------
    def backlog(self) -> int:
        """Batches arrived and not taken yet."""
        with self._lock:
            return sum(1 for _, buffers in self._queue if buffers)

    def poll(self) -> Any | None:
        """The next element, or None when none has arrived."""
        with self._lock:
            if not self._queue:
                return None
            element, buffers = self._queue.popleft()
            if not buffers:
                self.priority = False
                return element
            self.queued_bytes -= element.nbytes
            announce = self.credit.on_taken(buffers) if not self._done else 0
        self._announce(announce)
        return element

    def run(self, push: Callable[[Any], bool]) -> None:
        """Hand every element to ``push`` until the end of the partition (or ``push`` returns
        False); raises the channel's error. For a consumer with a thread of its own."""
        from yarnflow.worker.network.gate import ChannelError

        while True:
            with self._lock:
                while not self._queue and not self._cancelled:
                    self._arrived.wait(0.5)
                if self._cancelled and not self._queue:
                    return
            element = self.poll()
            if isinstance(element, ChannelError):
                raise element.error
            if element is None:
                continue
            if not push(element) or isinstance(element, EndOfPartition):
                return

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if not self._done:
                self._end(tell=True)
            self._queue.clear()
            self._arrived.notify_all()


def _short(exc: BaseException) -> str:
    return str(exc).split("\n")[0][:300]
