"""The data exchange between TaskExecutors: one multiplexed Arrow Flight connection per pair,
with credit-based flow control (see ``credit.py``).

Every TaskExecutor runs a ``DataServer``. A consumer's ``DataClient`` holds one connection to
each producer TaskExecutor it reads from: a single Flight ``DoExchange`` stream that carries
every channel between the two, in both directions, as application messages (``_frame``):

- consumer to producer: ``O`` open channel ``c`` on subpartition ``<partition>/<i>`` with the
  channel's initial credit, ``C`` more credit for ``c``, ``K`` close ``c``;
- producer to consumer: ``S`` the schema of the batches that follow on ``c``, ``D`` a batch
  header (its buffers and the backlog behind it) whose Arrow IPC body is the next message,
  ``B`` the backlog of a channel waiting for credit, ``E`` an event (watermark, barrier, end
  of partition), ``X`` an error (``not found``: the consumer asks again until its deadline;
  the producer may not run yet).

The producer's side of a connection sends from one thread (the call's), round robin over the
channels that have both something to send and the credit for it; a batch larger than the
channel's exclusive credit goes as slices. Since nothing is sent without credit, the consumer's
receiving thread never waits for its task: a stalled consumer stalls only its own channels, the
others of the connection keep flowing, and there is no thread per channel on either side.
"""

from __future__ import annotations

import collections
import itertools
import logging
import struct
import threading
import time
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from yarnflow.common.errors import RpcConnectionError, UnavailableError
from yarnflow.worker.network.credit import FloatingBufferPool, ReceiverCredit, SenderCredit, buffers_for
from yarnflow.worker.runtime.elements import CheckpointBarrier, EndOfPartition, decode_event, encode_event
from yarnflow.worker.runtime.partition import (
    BlockingResultPartition,
    PartitionReleasedError,
    ResultPartitionManager,
    StoredResultPartition,
    Subpartition,
)

log = logging.getLogger(__name__)

_EMPTY_SCHEMA = pa.schema([])
_DESCRIPTOR = flight.FlightDescriptor.for_command(b"yarnflow-data/1")
#: kind, channel, count (credit / buffers / backlog / retryable), second count (backlog)
_HEADER = struct.Struct("!cIii")
DEFAULT_SEGMENT_SIZE = 1 << 20
#: the backlog a file-backed (blocking) subpartition announces while it has more to send
_FILE_BACKLOG = 8


def _frame(kind: bytes, channel: int, a: int = 0, b: int = 0, payload: bytes = b"") -> pa.Buffer:
    return pa.py_buffer(_HEADER.pack(kind, channel, a, b) + payload)


class PartitionNotFoundError(RpcConnectionError):
    """The producer's TaskExecutor does not (yet, or any more) serve the partition
    (``partition_id``, keyword)."""


# -- producer side -------------------------------------------------------------------------------

class _OutChannel:
    """One channel a connection serves: a pipelined subpartition, or a file-backed one read a
    batch at a time."""

    def __init__(self, channel: int, name: str, credit: int, segment_size: int,
                 sub: Subpartition | None = None, elements: Iterator[Any] | None = None) -> None:
        self.channel = channel
        self.name = name
        self.credit = SenderCredit(credit)
        self.max_buffers = max(1, credit)  # a batch never needs more than the channel's exclusive credit
        self._segment = segment_size
        self.sub = sub
        self._elements = elements
        self._ahead: list[Any] = []  # a file's next element, or a batch's unsent rest
        self.schema: pa.Schema | None = None
        self.ended = False
        self.bytes_sent = 0
        self.told_backlog = 0  # the backlog last announced without a batch

    def backlog_to_tell(self) -> int | None:
        """The backlog to announce on its own (``B``), when the channel waits for credit with
        more queued than it last said: its consumer then borrows floating buffers for it (a
        backlog announced only with batches would never reach a consumer waiting for one)."""
        head = self.head()
        if not isinstance(head, pa.RecordBatch):
            return None
        backlog = self.backlog() if self.sub is not None else _FILE_BACKLOG
        if backlog <= self.told_backlog:
            return None
        self.told_backlog = backlog
        return backlog

    def head(self) -> Any | None:
        if self._ahead:
            return self._ahead[0]
        if self.sub is not None:
            return self.sub.peek()
        assert self._elements is not None
        element = next(self._elements, None)
        if element is not None:
            self._ahead.append(element)
        return element

    def backlog(self) -> int:
        if self.sub is not None:
            return self.sub.backlog_buffers(self._segment)
        return _FILE_BACKLOG

    def next_to_send(self) -> tuple[Any, int] | None:
        """The element to send now and the credit it takes, or None (nothing to send, or not
        the credit for it). Takes the element out of the queue."""
        head = self.head()
        if head is None:
            return None
        if not isinstance(head, pa.RecordBatch):
            self._pop()
            return head, 0
        need = buffers_for(head.nbytes, self._segment)
        if need > self.max_buffers and head.num_rows > 1:  # too big for the channel: send a slice
            rows = max(1, head.num_rows * self.max_buffers * self._segment // max(1, head.nbytes))
            if self.credit.credit < self.max_buffers:
                return None
            self._pop()
            self._ahead.insert(0, head.slice(rows))
            piece = head.slice(0, rows)
            return piece, min(buffers_for(piece.nbytes, self._segment), self.max_buffers)
        need = min(need, self.max_buffers)
        if not self.credit.can_send(need):
            return None
        self._pop()
        return head, need

    def _pop(self) -> None:
        if self._ahead:
            self._ahead.pop(0)
        elif self.sub is not None:
            self.sub.take(0)

    def close(self) -> None:
        if self.sub is not None:
            self.sub.set_listener(None)


class _ServerConnection:
    """The producer's side of one consumer TaskExecutor's connection."""

    def __init__(self, server: DataServer, context: flight.ServerCallContext,
                 reader: flight.MetadataRecordBatchReader, writer: flight.MetadataRecordBatchWriter) -> None:
        self._server = server
        self._context = context
        self._reader = reader
        self._writer = writer
        self._cond = threading.Condition()
        self._channels: dict[int, _OutChannel] = {}
        self._opening: dict[int, tuple[str, int, int, float]] = {}  # channel -> (partition, index, credit, since)
        self._errors: collections.deque[tuple[int, str, bool]] = collections.deque()  # to send
        self._closed = False
        self._rr = 0

    def run(self) -> None:
        self._writer.begin(_EMPTY_SCHEMA)
        control = threading.Thread(target=self._read_control, name="data-server control", daemon=True)
        control.start()
        try:
            while True:
                with self._cond:
                    if self._closed or self._server.closed:
                        return
                    self._open_pending()
                    work = self._pick()
                    if work is None:
                        self._cond.wait(0.5)  # new partitions, data and credit wake it
                        if self._context.is_cancelled():
                            return
                        continue
                self._send(*work)
        except (flight.FlightError, OSError, pa.ArrowException) as exc:
            log.debug("data connection ended: %s", exc)
        finally:
            with self._cond:
                self._closed = True
                for ch in self._channels.values():
                    ch.close()
                self._channels.clear()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- control messages ------------------------------------------------------------------
    def _read_control(self) -> None:
        try:
            while True:
                chunk = self._reader.read_chunk()
                meta = chunk.app_metadata
                if meta is None or meta.size < _HEADER.size:
                    continue
                raw = meta.to_pybytes()
                kind, channel, a, _ = _HEADER.unpack_from(raw)
                with self._cond:
                    if kind == b"O":
                        partition_id, _, index = raw[_HEADER.size:].decode().rpartition("/")
                        self._opening[channel] = (partition_id, int(index) if index.isdigit() else -1, a,
                                                  time.monotonic())
                    elif kind == b"C":
                        out = self._channels.get(channel)
                        if out is not None:
                            out.credit.grant(a)
                    elif kind == b"K":
                        self._opening.pop(channel, None)
                        out = self._channels.pop(channel, None)
                        if out is not None:
                            out.close()
                    self._cond.notify_all()
        except StopIteration:
            pass
        except (flight.FlightError, OSError, pa.ArrowException, ValueError, struct.error) as exc:
            log.debug("data connection control stream ended: %s", exc)
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _open_pending(self) -> None:
        """Open the channels asked for whose partition is here (or answer not found once the
        server waited long enough for it)."""
        for channel, (partition_id, index, credit, since) in list(self._opening.items()):
            name = f"{partition_id}/{index}"
            try:
                partition = self._server.partitions.peek(partition_id, self._wake)
            except UnavailableError as exc:
                del self._opening[channel]
                self._error(channel, str(exc), retryable=False)
                continue
            if partition is None or not 0 <= index < len(partition.subpartitions):
                if partition is not None or time.monotonic() - since >= self._server.wait_s:
                    del self._opening[channel]
                    self._error(channel, f"partition {name} not found", retryable=True)
                continue
            del self._opening[channel]
            if isinstance(partition, (BlockingResultPartition, StoredResultPartition)):
                if not partition.finished.is_set():
                    self._opening[channel] = (partition_id, index, credit, since)  # until it is
                    if time.monotonic() - since >= self._server.wait_s:
                        del self._opening[channel]
                        self._error(channel, f"partition {name} not found (unfinished)", retryable=True)
                    continue
                out = _OutChannel(channel, name, credit, self._server.segment_size,
                                  elements=partition.read(index))
            else:
                sub = partition.subpartitions[index]
                out = _OutChannel(channel, name, credit, self._server.segment_size, sub=sub)
                sub.set_listener(self._wake)
            self._channels[channel] = out

    def _error(self, channel: int, message: str, retryable: bool) -> None:
        """Queue an error for ``channel`` (sent by ``_pick``)."""
        self._errors.append((channel, message, retryable))

    # -- sending ---------------------------------------------------------------------------
    def _pick(self) -> tuple[_OutChannel | None, Any, int] | None:
        """What to send next, round robin over the channels that have it and its credit."""
        if self._errors:
            return None, self._errors.popleft(), 0
        ids = list(self._channels)
        for k in range(len(ids)):
            channel = ids[(self._rr + k) % len(ids)]
            out = self._channels[channel]
            try:
                work = out.next_to_send()
            except PartitionReleasedError:
                del self._channels[channel]
                out.close()
                return None, (channel, f"partition {out.name} was released", False), 0
            except Exception as exc:  # noqa: BLE001 - a file that cannot be read: the consumer's error
                del self._channels[channel]
                out.close()
                return None, (channel, f"reading partition {out.name} failed: {type(exc).__name__}: {exc}",
                              False), 0
            if work is None:
                backlog = out.backlog_to_tell()
                if backlog is None:
                    continue
                return None, (channel, backlog), -1
            self._rr = (self._rr + k + 1) % max(1, len(ids))
            element, buffers = work
            if isinstance(element, pa.RecordBatch):
                out.credit.take(buffers)
            elif isinstance(element, EndOfPartition):
                del self._channels[channel]
                out.close()
            return out, element, buffers
        return None

    def _send(self, out: _OutChannel | None, element: Any, buffers: int) -> None:
        w = self._writer
        if buffers == -1:  # a backlog announcement: (channel, backlog)
            channel, backlog = element
            w.write_metadata(_frame(b"B", channel, 0, backlog))
            return
        if out is None:  # an error: (channel, message, retryable)
            channel, message, retryable = element
            w.write_metadata(_frame(b"X", channel, 1 if retryable else 0, 0, message.encode()))
            return
        if isinstance(element, pa.RecordBatch):
            if out.schema is None or not element.schema.equals(out.schema):
                out.schema = element.schema
                w.write_metadata(_frame(b"S", out.channel, 0, 0, element.schema.serialize().to_pybytes()))
            with self._cond:
                backlog = out.told_backlog = out.backlog()
            w.write_metadata(_frame(b"D", out.channel, buffers, backlog))
            w.write_metadata(element.serialize())
            out.bytes_sent += element.nbytes
        else:
            w.write_metadata(_frame(b"E", out.channel, 0, 0, encode_event(element)))


class DataServer(flight.FlightServerBase):
    def __init__(self, host: str, partitions: ResultPartitionManager, wait_for_partition_s: float = 10.0,
                 segment_size: int = DEFAULT_SEGMENT_SIZE) -> None:
        super().__init__(f"grpc+tcp://{host}:0")
        self._host = host
        self.partitions = partitions
        self.wait_s = wait_for_partition_s
        self.segment_size = segment_size
        self.closed = False

    @property
    def address(self) -> str:
        return f"{self._host}:{self.port}"

    def do_exchange(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
                    reader: flight.MetadataRecordBatchReader, writer: flight.MetadataRecordBatchWriter) -> None:
        if descriptor.command != _DESCRIPTOR.command:
            raise flight.FlightServerError(f"unknown exchange {descriptor.command!r}")
        _ServerConnection(self, context, reader, writer).run()

    def shutdown(self) -> None:
        self.closed = True
        super().shutdown()


# -- consumer side -------------------------------------------------------------------------------

class _ClientConnection:
    """A consumer TaskExecutor's connection to one producer TaskExecutor: one receiving thread
    dispatches every channel's messages; one sending thread writes the channels' opens, closes
    and credit (a task that takes a batch only adds to its channel's credit: a gRPC write
    waits for the one before it, which a task thread must not)."""

    def __init__(self, owner: DataClient, address: str) -> None:
        self._owner = owner
        self.address = address
        self._client = flight.connect(f"grpc+tcp://{address}")
        self._writer, self._reader = self._client.do_exchange(_DESCRIPTOR)
        self._writer.begin(_EMPTY_SCHEMA)
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
            self.send(_frame(b"K", channel))

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
                    frames += [_frame(b"C", ch, n) for ch, n in self._credits.items()]
                    self._credits.clear()
                for frame in frames:
                    self._writer.write_metadata(frame)
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
                        ch.on_batch(pa.ipc.read_record_batch(meta, schemas[channel]), buffers, backlog)
                    continue
                raw = meta.to_pybytes()
                kind, channel, a, b = _HEADER.unpack_from(raw)
                if kind == b"D":
                    header = (channel, a, b)
                    continue
                if kind == b"S":
                    schemas[channel] = pa.ipc.read_schema(pa.py_buffer(raw[_HEADER.size:]))
                    continue
                ch = self._channels.get(channel)
                if ch is None:
                    continue
                if kind == b"B":
                    ch.on_backlog(b)
                elif kind == b"E":
                    ch.on_event(decode_event(raw[_HEADER.size:]))
                elif kind == b"X":
                    ch.on_error(raw[_HEADER.size:].decode(errors="replace"), retryable=bool(a))
        except StopIteration:
            error: BaseException = ConnectionError("the producer closed the connection")
        except Exception as exc:  # noqa: BLE001 - every channel of the connection gets it
            error = exc
        with self._lock:
            self.failed = error
            channels = list(self._channels.values())
            self._channels.clear()
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

    def __init__(self) -> None:
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
        self._done = False  # ended, failed or cancelled: nothing more arrives
        self._cancelled = False
        self.queued_bytes = 0
        #: the most bytes of batches the channel ever held (in flight: sent, not yet taken)
        self.peak_bytes = 0
        self.bytes_received = 0
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
        conn.send(_frame(b"O", channel, initial, 0, f"{self.partition_id}/{self.subpartition}".encode()))

    def on_batch(self, batch: pa.RecordBatch, buffers: int, backlog: int) -> None:
        with self._lock:
            if self._done:
                return
            announce = self.credit.on_batch(buffers, backlog)
            self._queue.append((batch, buffers))
            self.queued_bytes += batch.nbytes
            self.bytes_received += batch.nbytes
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
        from yarnflow.worker.runtime.gate import ChannelError

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
        from yarnflow.worker.runtime.gate import ChannelError

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
