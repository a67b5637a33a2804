"""The data exchange between TaskExecutors: one multiplexed Arrow Flight connection per pair,
with credit-based flow control (see ``credit.py``).

Every TaskExecutor runs a ``DataServer``. A consumer's ``DataClient`` holds one connection to
each producer TaskExecutor it reads from: a single Flight ``DoExchange`` stream that carries
every channel between the two, in both directions, as application messages (``_frame``):

- consumer to producer: ``O`` open channel ``c`` on subpartition ``<partition>/<i>`` with the
  channel's initial credit (and its debloated buffer size, if it has one), ``C`` more credit for ``c``, ``K`` close ``c``, ``Z`` the buffer
  size ``c`` wants from now on (buffer debloating, ``debloat.py``);
- producer to consumer: ``S`` the schema of the batches that follow on ``c``, ``D`` a batch
  header (its buffers and the backlog behind it) whose Arrow IPC body is the next message,
  ``Q`` the producer's TaskExecutor is shutting down (the consumer ends the call),
  ``B`` the backlog of a channel waiting for credit, ``F`` the producer has finished (what is
  queued for the channel ends with its end of partition: no checkpoint barrier comes on it
  any more; sent ahead of the data, see ``unaligned._pull_ahead``), ``E`` an event (watermark, barrier, end
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
import logging
import struct
import threading
import time
from typing import TYPE_CHECKING, Any, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from yarnflow.common.errors import RpcConnectionError, UnavailableError
from yarnflow.worker.network.credit import SenderCredit, buffers_for
from yarnflow.worker.elements import EndOfPartition, encode_event
from yarnflow.worker.network.partition import (
    BlockingResultPartition,
    PartitionReleasedError,
    ResultPartitionManager,
    StoredResultPartition,
    Subpartition,
)

if TYPE_CHECKING:
    from yarnflow.common.security import TlsCredentials

log = logging.getLogger(__name__)

EMPTY_SCHEMA = pa.schema([])
EXCHANGE = flight.FlightDescriptor.for_command(b"yarnflow-data/1")
#: kind, channel, count (credit / buffers / backlog / retryable), second count (backlog)
HEADER = struct.Struct("!cIii")
DEFAULT_SEGMENT_SIZE = 1 << 20
#: the backlog a file-backed (blocking) subpartition announces while it has more to send
_FILE_BACKLOG = 8


def frame(kind: bytes, channel: int, a: int = 0, b: int = 0, payload: bytes = b"") -> pa.Buffer:
    return pa.py_buffer(HEADER.pack(kind, channel, a, b) + payload)


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
        self._ahead: list[Any] = []  # a file's next element, or the unsent rest of its batch
        self.schema: pa.Schema | None = None
        self.told_backlog = 0  # the backlog last announced without a batch
        self._max_segment = segment_size
        self.told_finished = sub is None  # (a file-backed channel's producer finished long ago)

    def finish_to_tell(self) -> bool:
        """The producer has finished and its consumer has not been told yet (``F``)."""
        if self.told_finished or self.sub is None or not self.sub.producer_finished:
            return False
        self.told_finished = True
        return True

    def set_buffer_size(self, size: int) -> None:
        """Buffer debloating: the consumer wants buffers of ``size`` bytes (at most the
        server's segment size): batches are cut to the channel's credit in such buffers and
        counted in them, and the subpartition holds as many of them as it holds batches."""
        self._segment = max(1, min(size, self._max_segment))
        if self.sub is not None:
            self.sub.set_buffer_size(self._segment)

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
            return (head, 0) if self._pop(head) is not None else None
        need = buffers_for(head.nbytes, self._segment)
        if need > self.max_buffers and head.num_rows > 1:  # too big for the channel: send a slice
            rows = max(1, head.num_rows * self.max_buffers * self._segment // max(1, head.nbytes))
            if self.credit.credit < self.max_buffers:
                return None
            piece = self._pop(head, rows)
            if piece is None:
                return None
            return piece, min(buffers_for(piece.nbytes, self._segment), self.max_buffers)
        need = min(need, self.max_buffers)
        if not self.credit.can_send(need):
            return None
        return (head, need) if self._pop(head) is not None else None

    def _pop(self, head: Any, rows: int | None = None) -> Any | None:
        """Take ``head`` (or its first ``rows`` rows) out of the queue; None when a priority
        barrier came in front of it meanwhile (the next pick sends the barrier). A pipelined
        subpartition keeps the rest of a sliced batch, so a barrier overtakes it there."""
        if self.sub is not None and not self._ahead:
            return self.sub.take_head(head, rows)
        self._ahead.pop(0)
        if rows is not None and isinstance(head, pa.RecordBatch) and head.num_rows > rows:
            self._ahead.insert(0, head.slice(rows))
            return head.slice(0, rows)
        return head

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
        self._sizes: dict[int, int] = {}  # debloated buffer sizes of channels not open yet
        self._closed = False
        self._rr = 0

    def run(self) -> None:
        self._writer.begin(EMPTY_SCHEMA)
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
                closing = not self._closed  # the server stops under a live connection
                self._closed = True
                for ch in self._channels.values():
                    ch.close()
                self._channels.clear()
            if closing:  # tell the consumer to end the call; its end is what ends our reading
                try:
                    self._writer.write_metadata(frame(b"Q", 0))
                except (flight.FlightError, OSError, pa.ArrowException):
                    pass
            # the reader must not be in use when this call returns (gRPC frees it then)
            control.join(5.0)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- control messages ------------------------------------------------------------------
    def _read_control(self) -> None:
        try:
            while True:
                chunk = self._reader.read_chunk()
                meta = chunk.app_metadata
                if meta is None or meta.size < HEADER.size:
                    continue
                raw = meta.to_pybytes()
                kind, channel, a, b = HEADER.unpack_from(raw)
                with self._cond:
                    if kind == b"O":
                        partition_id, _, index = raw[HEADER.size:].decode().rpartition("/")
                        self._opening[channel] = (partition_id, int(index) if index.isdigit() else -1, a,
                                                  time.monotonic())
                        if b > 0:  # the buffer size the channel asks for from the start
                            self._sizes[channel] = b
                    elif kind == b"C":
                        out = self._channels.get(channel)
                        if out is not None:
                            out.credit.grant(a)
                    elif kind == b"Z":
                        out = self._channels.get(channel)
                        if out is not None:
                            out.set_buffer_size(a)
                        elif channel in self._opening:
                            self._sizes[channel] = a  # applied when the channel opens
                    elif kind == b"K":
                        self._sizes.pop(channel, None)
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
            size = self._sizes.pop(channel, None)
            if size is not None:
                out.set_buffer_size(size)

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
            if out.finish_to_tell():
                return None, channel, -2
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
        if buffers == -2:  # the producer finished: the channel
            w.write_metadata(frame(b"F", element))
            return
        if buffers == -1:  # a backlog announcement: (channel, backlog)
            channel, backlog = element
            w.write_metadata(frame(b"B", channel, 0, backlog))
            return
        if out is None:  # an error: (channel, message, retryable)
            channel, message, retryable = element
            w.write_metadata(frame(b"X", channel, 1 if retryable else 0, 0, message.encode()))
            return
        if isinstance(element, pa.RecordBatch):
            if out.schema is None or not element.schema.equals(out.schema):
                out.schema = element.schema
                w.write_metadata(frame(b"S", out.channel, 0, 0, element.schema.serialize().to_pybytes()))
            with self._cond:
                backlog = out.told_backlog = out.backlog()
            w.write_metadata(frame(b"D", out.channel, buffers, backlog))
            w.write_metadata(element.serialize())
        else:
            w.write_metadata(frame(b"E", out.channel, 0, 0, encode_event(element)))


class DataServer(flight.FlightServerBase):
    def __init__(self, host: str, partitions: ResultPartitionManager, wait_for_partition_s: float = 10.0,
                 segment_size: int = DEFAULT_SEGMENT_SIZE, tls: TlsCredentials | None = None) -> None:
        if tls is None:
            super().__init__(f"grpc+tcp://{host}:0")
        else:  # mutual TLS: only peers with the cluster's certificate get through the handshake
            super().__init__(f"grpc+tls://{host}:0", **tls.flight_server_options())
        self._host = host
        self.partitions = partitions
        self.wait_s = wait_for_partition_s
        self.segment_size = segment_size
        self.closed = False
        self._live: set[_ServerConnection] = set()  # (woken at shutdown: they wait up to 0.5 s otherwise)
        self._live_lock = threading.Lock()

    @property
    def address(self) -> str:
        return f"{self._host}:{self.port}"

    def do_exchange(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
                    reader: flight.MetadataRecordBatchReader, writer: flight.MetadataRecordBatchWriter) -> None:
        if descriptor.command != EXCHANGE.command:
            raise flight.FlightServerError(f"unknown exchange {descriptor.command!r}")
        connection = _ServerConnection(self, context, reader, writer)
        with self._live_lock:
            self._live.add(connection)
        try:
            connection.run()
        finally:
            with self._live_lock:
                self._live.discard(connection)

    def shutdown(self) -> None:
        self.closed = True
        with self._live_lock:
            live = list(self._live)
        for connection in live:  # each ends its call now, not at its next wait's end
            connection._wake()
        super().shutdown()


# -- consumer side -------------------------------------------------------------------------------
