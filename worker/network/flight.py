"""Arrow Flight data exchange between TaskExecutors.

Every TaskExecutor runs a ``DataServer``. A consumer asks for one subpartition per stream
(ticket ``<partition id>/<subpartition index>``), so each channel has its own HTTP/2 stream
and its own flow-control window: a stalled consumer stops only its own stream, and the
producer's bounded subpartition then stops only the producer's writes into that channel.

Events travel in-band as zero-row batches whose app_metadata encodes the event. A stream has
one schema; when a producer's schema changes, the server ends the stream with a ``R`` marker
and the client reopens it (the subpartition keeps its position).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from yarnflow.common.errors import RpcConnectionError
from yarnflow.worker.runtime.elements import EndOfPartition, decode_event, encode_event
from yarnflow.worker.runtime.partition import (
    BlockingResultPartition,
    PartitionReleasedError,
    ResultPartitionManager,
    StoredResultPartition,
)

log = logging.getLogger(__name__)

_RESUME = b"R"
_EMPTY_SCHEMA = pa.schema([])


class PartitionNotFoundError(RpcConnectionError):
    """The producer's TaskExecutor does not (yet, or any more) serve the partition
    (``partition_id``, keyword)."""


def _ticket(partition_id: str, subpartition: int) -> flight.Ticket:
    return flight.Ticket(f"{partition_id}/{subpartition}".encode())


class DataServer(flight.FlightServerBase):
    def __init__(self, host: str, partitions: ResultPartitionManager, wait_for_partition_s: float = 10.0) -> None:
        super().__init__(f"grpc+tcp://{host}:0")
        self._host = host
        self._partitions = partitions
        self._wait_s = wait_for_partition_s

    @property
    def address(self) -> str:
        return f"{self._host}:{self.port}"

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        partition_id, _, index = ticket.ticket.decode().rpartition("/")
        partition = self._partitions.wait_for(partition_id, self._wait_s)
        if partition is None or not index.isdigit() or int(index) >= len(partition.subpartitions):
            raise flight.FlightUnavailableError(f"partition {partition_id}/{index} not found")
        if isinstance(partition, (BlockingResultPartition, StoredResultPartition)):
            return self._serve_blocking(partition, int(index))
        sub = partition.subpartitions[int(index)]
        pending: list[Any] = []
        # The stream's schema is the first batch's; events before it go out under an empty
        # schema only when no batch is waiting right behind them. With nothing to send yet, the
        # stream opens under the empty schema too (and resumes with the first batch's): the
        # consumer holds an open stream it can cancel, not a call waiting for its first answer.
        while True:
            if context.is_cancelled():
                raise flight.FlightCancelledError("consumer went away")
            try:
                element = sub.take(0.2)
            except PartitionReleasedError:
                raise flight.FlightUnavailableError(f"partition {partition_id} was released") from None
            if element is None:
                break
            pending.append(element)
            if isinstance(element, (pa.RecordBatch, EndOfPartition)):
                break
        first_batch = next((e for e in pending if isinstance(e, pa.RecordBatch)), None)
        schema = first_batch.schema if first_batch is not None else _EMPTY_SCHEMA
        return flight.GeneratorStream(schema, self._generate(context, sub, schema, pending))

    def _serve_blocking(self, partition: BlockingResultPartition | StoredResultPartition,
                        index: int) -> flight.FlightDataStream:
        if not partition.finished.wait(self._wait_s):
            raise flight.FlightUnavailableError(f"partition {partition.partition_id}/{index} not found (unfinished)")
        elements = partition.read(index)
        try:
            first = next(elements)
        except PartitionReleasedError:
            raise flight.FlightUnavailableError(f"partition {partition.partition_id} was released") from None
        schema = first.schema if isinstance(first, pa.RecordBatch) else _EMPTY_SCHEMA
        empty = pa.RecordBatch.from_pylist([], schema=schema)

        def gen() -> Iterator[Any]:  # one batch at a time: the file is never all in memory
            for element in itertools.chain((first,), elements):
                if isinstance(element, pa.RecordBatch):
                    yield element
                else:
                    yield empty, encode_event(element)

        return flight.GeneratorStream(schema, gen())

    def _generate(self, context: flight.ServerCallContext, sub: Any, schema: pa.Schema,
                  pending: list[Any]) -> Iterator[Any]:
        empty = pa.RecordBatch.from_pylist([], schema=schema)
        queue_ = list(pending)
        while True:
            if queue_:
                element = queue_.pop(0)
            else:
                try:
                    element = sub.take(0.2)
                except PartitionReleasedError:
                    return
                if element is None:
                    if context.is_cancelled():
                        return
                    continue
            if isinstance(element, pa.RecordBatch):
                if not element.schema.equals(schema):
                    # hand the element back by ending this stream; the client reopens it
                    sub.push_back(element)
                    yield empty, _RESUME
                    return
                yield element
            else:
                yield empty, encode_event(element)
                if isinstance(element, EndOfPartition):
                    return


class DataClient:
    """Flight connections to other TaskExecutors' data servers, one per address."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[str, flight.FlightClient] = {}

    def _client(self, address: str) -> flight.FlightClient:
        with self._lock:
            client = self._clients.get(address)
            if client is None:
                client = flight.connect(f"grpc+tcp://{address}")
                self._clients[address] = client
            return client

    def open(self, address: str, partition_id: str, subpartition: int, producer: str = "",
             retry_for_s: float = 30.0) -> RemoteSubpartitionStream:
        return RemoteSubpartitionStream(self, address, partition_id, subpartition, retry_for_s, producer)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass


class RemoteSubpartitionStream:
    """Reads one remote subpartition, handing each element to ``push`` until end of partition."""

    def __init__(self, data_client: DataClient, address: str, partition_id: str, subpartition: int,
                 retry_for_s: float, producer: str = "") -> None:
        self._dc = data_client
        self._producer = f"TaskExecutor {producer} at {address}" if producer else f"the TaskExecutor at {address}"
        self._address = address
        self._partition_id = partition_id
        self._subpartition = subpartition
        self._retry_for_s = retry_for_s
        self._reader: flight.FlightStreamReader | None = None
        self._cancelled = False

    def run(self, push: Callable[[Any], bool]) -> None:
        deadline = time.monotonic() + self._retry_for_s
        backoff = 0.05
        while not self._cancelled:
            try:
                self._reader = self._dc._client(self._address).do_get(
                    _ticket(self._partition_id, self._subpartition))
                if self._cancelled:  # cancel() came while the stream was being opened
                    self._reader.cancel()
                    return
                if self._read_stream(push):
                    return
                continue  # schema changed: reopen
            except flight.FlightUnavailableError as exc:
                if self._cancelled:
                    return
                if "not found" in str(exc) and time.monotonic() < deadline:
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 1.0)
                    continue
                raise PartitionNotFoundError(
                    f"cannot read partition {self._partition_id}/{self._subpartition} from "
                    f"{self._producer}: {_short(exc)}", partition_id=self._partition_id) from None
            except (flight.FlightError, OSError) as exc:
                if self._cancelled:
                    return
                raise RpcConnectionError(
                    f"lost the connection to {self._producer} while reading "
                    f"partition {self._partition_id}/{self._subpartition}: {_short(exc)}",
                    partition_id=self._partition_id) from None

    def _read_stream(self, push: Callable[[Any], bool]) -> bool:
        reader = self._reader
        assert reader is not None
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                raise RpcConnectionError(
                    f"the stream of partition {self._partition_id}/{self._subpartition} from {self._producer} "
                    "ended before its end-of-partition", partition_id=self._partition_id) from None
            meta = chunk.app_metadata
            if meta is not None and meta.size:
                raw = meta.to_pybytes()
                if raw == _RESUME:
                    return False
                event = decode_event(raw)
                if not push(event):
                    return True
                if isinstance(event, EndOfPartition):
                    return True
            elif chunk.data is not None and chunk.data.num_rows:
                if not push(chunk.data):
                    return True

    def cancel(self) -> None:
        self._cancelled = True
        if self._reader is not None:
            try:
                self._reader.cancel()
            except Exception:  # noqa: BLE001
                pass


def _short(exc: BaseException) -> str:
    return str(exc).split("\n")[0][:300]
