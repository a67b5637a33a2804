"""The data exchange (worker/network/flight.py) over real loopback Flight: a DataServer serving a
ResultPartitionManager, read by DataClient channels, all multiplexed on one connection per
pair of processes, with credit-based flow control.

The back-pressure tests are the point of the design: two subpartitions of one producer
partition are read over the one connection; one consumer stalls, the other's channel keeps
flowing, only the producer's writes into the stalled channel stop, and the bytes that channel
holds stay within its credit."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import TAG_VAR
from tests.harness import wait_until
from yarnflow.common.errors import RpcConnectionError
from yarnflow.common.ids import ResultPartitionID
from yarnflow.worker.network.credit import FloatingBufferPool
from yarnflow.worker.network.client import DataClient, aligned
from yarnflow.worker.network.flight import DEFAULT_SEGMENT_SIZE, DataServer, PartitionNotFoundError
from yarnflow.worker.elements import ACTIVE, END_OF_PARTITION, IDLE, Watermark
from yarnflow.worker.network.partition import PartitionReleasedError, ResultPartitionManager

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SERVER_WAIT_S = 0.3  # how long the server waits for a partition it does not know yet


@pytest.fixture
def manager(tmp_path) -> Iterator[ResultPartitionManager]:
    m = ResultPartitionManager(str(tmp_path / "partitions"))
    yield m
    m.close()


@pytest.fixture
def server(manager: ResultPartitionManager) -> Iterator[DataServer]:
    s = DataServer("127.0.0.1", manager, wait_for_partition_s=SERVER_WAIT_S)
    try:
        yield s
    finally:
        manager.close()  # ends every stream still served, so shutdown does not wait on them
        s.shutdown()


@pytest.fixture
def client() -> Iterator[DataClient]:
    c = DataClient()
    yield c
    c.close()


class Consumer:
    """Runs a remote subpartition stream on a thread, keeping every element it gets."""

    def __init__(self, stream: Any, on_element: Callable[[Any], None] | None = None) -> None:
        self.stream = stream
        self.elements: list[Any] = []
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._on_element = on_element
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _push(self, element: Any) -> bool:
        self.elements.append(element)
        if self._on_element is not None:
            self._on_element(element)
        return True

    def _run(self) -> None:
        try:
            self.stream.run(self._push)
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            self.error = exc
        finally:
            self.done.set()

    def wait(self, timeout: float = 15.0) -> Consumer:
        assert self.done.wait(timeout), f"the consumer did not end within {timeout}s"
        self._thread.join(1.0)
        return self

    @property
    def batches(self) -> list[pa.RecordBatch]:
        return [e for e in self.elements if isinstance(e, pa.RecordBatch)]


def rows(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"i": pa.array(range(start, start + n), pa.int64()),
                            "s": pa.array([f"r{x}" for x in range(start, start + n)])})


def same_elements(got: list[Any], sent: list[Any]) -> bool:
    if len(got) != len(sent):
        return False
    for g, s in zip(got, sent, strict=True):
        if isinstance(s, pa.RecordBatch):
            if not (isinstance(g, pa.RecordBatch) and g.equals(s) and g.schema.equals(s.schema)):
                return False
        elif g != s:
            return False
    return True


def produce(sub: Any, elements: list[Any], cancelled: Callable[[], bool] = lambda: False) -> threading.Thread:
    def run() -> None:
        try:
            for e in elements:
                sub.add(e, cancelled)
        except PartitionReleasedError:
            pass

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_consumer_reads_its_subpartition_in_order_with_events(manager, server, client):
    partition = manager.create(ResultPartitionID("job.p1"), 2, capacity=2)
    sent: list[Any] = [Watermark(-5)]  # an event before the first batch
    for k in range(30):
        sent.append(rows(10 * k, 10))
        if k % 7 == 3:
            sent.append(Watermark(1000 + k))
        if k == 12:
            sent += [IDLE, ACTIVE]
    sent += [Watermark(2**63 - 1), END_OF_PARTITION]
    other = [rows(-3, 3), END_OF_PARTITION]
    # the producer writes while the consumer reads (capacity 2: it waits for the consumer)
    producers = [produce(partition.subpartitions[1], sent), produce(partition.subpartitions[0], other)]
    mine = Consumer(client.open(server.address, "job.p1", 1, producer="te-1")).wait()
    assert mine.error is None
    assert same_elements(mine.elements, sent)
    theirs = Consumer(client.open(server.address, "job.p1", 0, producer="te-1")).wait()
    assert theirs.error is None and same_elements(theirs.elements, other)
    for t in producers:
        t.join(5.0)
        assert not t.is_alive()
    # both ends delivered: the producer's TaskExecutor lets the partition go
    assert partition.released and manager.wait_for("job.p1", 0) is None


def test_a_stream_of_events_only(manager, server, client):
    partition = manager.create(ResultPartitionID("job.ev"), 1, capacity=2)
    sent = [Watermark(1), IDLE, Watermark(2), END_OF_PARTITION]
    for e in sent:
        partition.subpartitions[0].add(e)
    consumer = Consumer(client.open(server.address, "job.ev", 0)).wait()
    assert consumer.error is None and consumer.elements == sent


def test_a_schema_change_mid_stream_is_carried_in_order(manager, server, client):
    partition = manager.create(ResultPartitionID("job.schema"), 1, capacity=3)
    other = pa.record_batch({"a": pa.array([None, None]), "b": pa.array([1.5, 2.5])})
    sent = [rows(0, 5), rows(5, 5), Watermark(7), other, other, Watermark(8), rows(10, 5), END_OF_PARTITION]
    producer = produce(partition.subpartitions[0], sent)
    consumer = Consumer(client.open(server.address, "job.schema", 0)).wait()
    producer.join(5.0)
    assert consumer.error is None
    assert same_elements(consumer.elements, sent)


def test_an_unknown_partition_is_not_found_after_retrying(server, client):
    started = time.monotonic()
    consumer = Consumer(client.open(server.address, "job.never", 0, producer="te-9", retry_for_s=1.0)).wait()
    took = time.monotonic() - started
    assert isinstance(consumer.error, PartitionNotFoundError)
    assert isinstance(consumer.error, RpcConnectionError)
    assert "job.never/0" in str(consumer.error) and f"TaskExecutor te-9 at {server.address}" in str(consumer.error)
    assert 1.0 <= took < 1.0 + SERVER_WAIT_S + 3.0
    assert consumer.elements == []


def test_a_subpartition_index_out_of_range_is_not_found(manager, server, client):
    manager.create(ResultPartitionID("job.small"), 2, capacity=1)
    consumer = Consumer(client.open(server.address, "job.small", 5, retry_for_s=0.2)).wait()
    assert isinstance(consumer.error, PartitionNotFoundError) and "job.small/5" in str(consumer.error)


def test_a_partition_registered_after_the_consumer_asked_is_found(manager, server, client):
    consumer = Consumer(client.open(server.address, "job.late", 0, retry_for_s=20.0))
    time.sleep(2.5 * SERVER_WAIT_S)  # the server gave up waiting at least once: the consumer retries
    assert not consumer.done.is_set()
    partition = manager.create(ResultPartitionID("job.late"), 1, capacity=4)
    sent = [rows(0, 4), Watermark(3), rows(4, 4), END_OF_PARTITION]
    for e in sent:
        partition.subpartitions[0].add(e)
    consumer.wait()
    assert consumer.error is None and same_elements(consumer.elements, sent)


# -- back-pressure -------------------------------------------------------------------------------

MIB_BATCH = pa.record_batch({"x": np.arange(128 * 1024, dtype=np.int64)})  # 1 MiB
N_BATCHES = 64
CAPACITY = 2


def test_a_stalled_consumer_back_pressures_only_its_own_channel(manager, server, client):
    partition = manager.create(ResultPartitionID("job.bp"), 2, capacity=CAPACITY)
    stop = threading.Event()
    added = [0, 0]
    finished = [threading.Event(), threading.Event()]

    def producer(index: int) -> None:
        sub = partition.subpartitions[index]
        try:
            for _ in range(N_BATCHES):
                sub.add(MIB_BATCH, stop.is_set)
                added[index] += 1
            sub.add(END_OF_PARTITION, stop.is_set)
            finished[index].set()
        except PartitionReleasedError:
            pass

    resume_a = threading.Event()

    def stall_after_first(element: Any) -> None:
        resume_a.wait(30)  # consumer A stops reading after its first element

    producers = [threading.Thread(target=producer, args=(i,), daemon=True) for i in (0, 1)]
    for t in producers:
        t.start()
    a = Consumer(client.open(server.address, "job.bp", 0, producer="te-1"), stall_after_first)
    b = Consumer(client.open(server.address, "job.bp", 1, producer="te-1"))
    try:
        b.wait(30)
        # B got everything while A is stalled ...
        assert b.error is None
        assert len(b.batches) == N_BATCHES and all(x.equals(MIB_BATCH) for x in b.batches)
        assert b.elements[-1] == END_OF_PARTITION
        assert finished[1].wait(5) and added[1] == N_BATCHES
        # ... and both channels went over one connection, read by one thread
        assert len(client._connections) == 1
        assert sum(1 for t in threading.enumerate() if t.name.startswith("data-client")) == 2  # in, out
        # A's producer stops once A's subpartition is full, and stays stopped
        last, still_since = added[0], time.monotonic()
        while time.monotonic() - still_since < 0.75:
            time.sleep(0.05)
            if added[0] != last:
                last, still_since = added[0], time.monotonic()
        assert len(a.elements) == 1 and not a.done.is_set()
        assert added[0] < N_BATCHES - 2 * CAPACITY, "the producer never felt the stalled consumer"
        assert partition.subpartitions[0].backlog() == CAPACITY
        # what reached A's channel and waits there is bounded by its credit: its exclusive
        # buffers plus the floating ones it may borrow (none here: no gate lends it any)
        assert 0 < a.stream.peak_bytes <= a.stream.credit.owned * DEFAULT_SEGMENT_SIZE
        assert a.stream.credit.owned == 2 and a.stream.backlog() <= 2
        assert producers[0].is_alive() and not finished[0].is_set()
        # A reads again: everything flows, in order, to its end
        resume_a.set()
        a.wait(30)
        assert a.error is None and len(a.batches) == N_BATCHES and a.elements[-1] == END_OF_PARTITION
        assert finished[0].wait(5)
    finally:
        resume_a.set()
        stop.set()
        a.stream.cancel()
        b.stream.cancel()
        for t in producers:
            t.join(5)


# -- failures and cancellation -------------------------------------------------------------------

_PRODUCER = """
import sys, time
import pyarrow as pa
from yarnflow.common.ids import ResultPartitionID
from yarnflow.worker.network.flight import DataServer
from yarnflow.worker.network.partition import ResultPartitionManager

manager = ResultPartitionManager(sys.argv[1])
server = DataServer("127.0.0.1", manager)
sub = manager.create(ResultPartitionID("job.far"), 1, 4).subpartitions[0]
print(server.address, flush=True)
i = 0
while True:  # until killed
    sub.add(pa.record_batch({"i": [i]}))
    i += 1
    time.sleep(0.02)
"""


def test_a_producer_killed_mid_stream_is_a_connection_error_naming_it(client, process_tag, tmp_path):
    env = dict(os.environ, **{TAG_VAR: process_tag})
    proc = subprocess.Popen([sys.executable, "-c", _PRODUCER, str(tmp_path / "far")], stdout=subprocess.PIPE,
                            text=True, env=env, stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        assert address.startswith("127.0.0.1:"), address
        got_five = threading.Event()
        count = [0]

        def on_element(_: Any) -> None:
            count[0] += 1
            if count[0] >= 5:
                got_five.set()

        consumer = Consumer(client.open(address, "job.far", 0, producer="te-far", retry_for_s=30.0), on_element)
        assert got_five.wait(20)
        proc.kill()
        killed_at = time.monotonic()
        consumer.wait(20)
        assert time.monotonic() - killed_at < 10  # not retried as if the partition were yet to come
        assert isinstance(consumer.error, RpcConnectionError)
        assert f"TaskExecutor te-far at {address}" in str(consumer.error)
        assert "job.far/0" in str(consumer.error)
        values = [b.column("i")[0].as_py() for b in consumer.batches]
        assert values == list(range(len(values))) and len(values) >= 5
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_cancel_stops_a_reader_waiting_in_mid_stream(manager, server, client):
    partition = manager.create(ResultPartitionID("job.c1"), 1, capacity=2)
    partition.subpartitions[0].add(rows(0, 2))
    consumer = Consumer(client.open(server.address, "job.c1", 0))
    wait_until(lambda: consumer.elements, 10, "the reader got nothing", interval_s=0.01)
    assert len(consumer.elements) == 1
    started = time.monotonic()
    consumer.stream.cancel()
    consumer.wait(5)
    assert time.monotonic() - started < 1.0
    assert consumer.error is None and len(consumer.elements) == 1


def test_cancel_stops_a_reader_whose_producer_has_sent_nothing_yet(manager, server, client):
    manager.create(ResultPartitionID("job.c2"), 1, capacity=2)
    consumer = Consumer(client.open(server.address, "job.c2", 0))
    time.sleep(0.5)
    started = time.monotonic()
    consumer.stream.cancel()
    consumer.wait(5)
    assert time.monotonic() - started < 1.5
    assert consumer.error is None and consumer.elements == []


def test_cancel_stops_a_reader_waiting_for_a_partition_to_appear(server, client):
    consumer = Consumer(client.open(server.address, "job.c3", 0, retry_for_s=30.0))
    time.sleep(0.5)
    started = time.monotonic()
    consumer.stream.cancel()
    consumer.wait(5)
    assert time.monotonic() - started < SERVER_WAIT_S + 1.5
    assert consumer.error is None and consumer.elements == []


def test_a_blocking_subpartition_is_served_a_batch_at_a_time_not_read_whole(manager, server, client):
    """A consumer of a blocking partition gets its first batch while the server has read only a
    few: the server used to read the subpartition into memory before sending its first batch, so
    a TaskExecutor's memory grew with the input of a BATCH job. The server's reader is held after
    a few batches; a server that reads the whole file first never sends anything while held."""
    pid = ResultPartitionID.of("job", "producer", 0)
    partition = manager.create_blocking(pid, 1)
    batch = pa.record_batch({"v": np.arange(8192, dtype=np.int64)})  # 64 KiB
    total, held_after = 400, 4
    for i in range(total):
        partition.add(0, batch.set_column(0, "v", pa.array(np.full(8192, i, dtype=np.int64))))
    partition.add(0, END_OF_PARTITION)
    produced = 0
    release = threading.Event()
    read = partition.read

    def held(index: int) -> Iterator[Any]:
        nonlocal produced
        for element in read(index):
            if produced == held_after:
                release.wait(30)
            produced += 1
            yield element

    partition.read = held  # type: ignore[method-assign]
    got_first = threading.Event()
    consumer = Consumer(client.open(server.address, str(pid), 0), lambda _: got_first.set())
    try:
        assert got_first.wait(10), f"no batch reached the consumer while the server's reader was held after {held_after}"
    finally:
        release.set()
    consumer.wait(30)
    assert consumer.error is None
    values = [v for b in consumer.batches for v in b.column(0).to_numpy().tolist()]
    assert values == [i for i in range(total) for _ in range(8192)]


# -- credit-based flow control ------------------------------------------------------------------

def test_many_channels_share_one_connection_and_a_stalled_one_stalls_no_other(manager, server, client):
    """Sixteen channels from one producer TaskExecutor (an all-to-all edge's share): one
    connection, one receiving thread, no thread per channel. Eight consumers stop reading; the
    other eight read everything while the stalled ones hold no more than their credit, and the
    stalled ones then read everything too, in order."""
    n, per_channel = 16, 24
    partition = manager.create(ResultPartitionID("job.many"), n, capacity=2)
    pool = FloatingBufferPool(4)
    lock = threading.Lock()
    channels = [client.channel(server.address, "job.many", i, "te-1", exclusive_buffers=2, pool=pool, lock=lock)
                for i in range(n)]
    threads_before = threading.active_count()
    for ch in channels:
        ch.start()
    stop = threading.Event()
    producers = [produce(partition.subpartitions[i], [MIB_BATCH] * per_channel + [END_OF_PARTITION], stop.is_set)
                 for i in range(n)]
    got = [0] * n
    ended = [False] * n

    def drain(i: int) -> None:
        while (element := channels[i].poll()) is not None:
            if isinstance(element, pa.RecordBatch):
                assert element.equals(MIB_BATCH)
                got[i] += 1
            elif element == END_OF_PARTITION:
                ended[i] = True
            else:
                raise AssertionError(f"channel {i} got {element!r}")

    try:
        deadline = time.monotonic() + 30
        while not all(ended[1::2]) and time.monotonic() < deadline:
            for i in range(1, n, 2):  # only the odd channels are read
                drain(i)
            time.sleep(0.002)
        assert all(ended[1::2]) and all(got[i] == per_channel for i in range(1, n, 2))
        # the new threads: the producers', the connection's receiver, nothing per channel
        assert threading.active_count() - threads_before <= n + 1
        assert len(client._connections) == 1
        for i in range(0, n, 2):  # the stalled ones hold at most their credit: exclusive + borrowed
            assert channels[i].queued_bytes <= channels[i].credit.owned * DEFAULT_SEGMENT_SIZE
            assert channels[i].credit.owned <= 2 + pool.size
        held = sum(channels[i].credit.borrowed for i in range(n))
        assert held + pool.available == pool.size
        while not all(ended) and time.monotonic() < deadline:
            for i in range(0, n, 2):
                drain(i)
            time.sleep(0.002)
        assert all(ended) and got == [per_channel] * n
        assert all(ch.peak_bytes <= (2 + pool.size) * DEFAULT_SEGMENT_SIZE for ch in channels)
    finally:
        stop.set()
        for ch in channels:
            ch.cancel()
        for t in producers:
            t.join(5)


def test_batches_larger_than_a_channels_credit_arrive_whole_in_slices(manager, server, client):
    """A 5 MiB batch on a channel with two 1 MiB buffers goes as slices no larger than the
    channel's credit; every row arrives once, in order."""
    partition = manager.create(ResultPartitionID("job.big"), 1, capacity=2)
    big = pa.record_batch({"x": np.arange(5 * 128 * 1024, dtype=np.int64)})
    produce(partition.subpartitions[0], [big, Watermark(9), END_OF_PARTITION])
    consumer = Consumer(client.open(server.address, "job.big", 0, exclusive_buffers=2)).wait()
    assert consumer.error is None
    assert len(consumer.batches) >= 3
    assert all(b.nbytes <= 2 * DEFAULT_SEGMENT_SIZE for b in consumer.batches)
    assert pa.Table.from_batches(consumer.batches).column("x").to_numpy().tolist() == list(range(5 * 128 * 1024))
    assert consumer.elements[-2:] == [Watermark(9), END_OF_PARTITION]


def test_a_producer_shutting_down_ends_its_consumers_channels_with_a_connection_error(tmp_path, client):
    """A TaskExecutor that stops while a consumer still reads from it tells the consumer to
    end the call (its shutdown does not wait for the consumer's TaskExecutor to stop, and the
    call is not freed under the thread still reading it): the channel fails, naming the
    producer, and the producer's shutdown returns at once."""
    manager = ResultPartitionManager(str(tmp_path / "partitions"))
    server = DataServer("127.0.0.1", manager)
    try:
        partition = manager.create(ResultPartitionID("job.stop"), 1, capacity=2)
        partition.subpartitions[0].add(rows(0, 3))
        consumer = Consumer(client.open(server.address, "job.stop", 0, producer="te-stop"))
        wait_until(lambda: consumer.elements, 10, "the consumer got nothing", interval_s=0.01)
        started = time.monotonic()
        server.shutdown()
        assert time.monotonic() - started < 5.0
        consumer.wait(10)
        assert isinstance(consumer.error, RpcConnectionError)
        assert f"TaskExecutor te-stop at {server.address}" in str(consumer.error)
        assert len(consumer.batches) == 1
    finally:
        manager.close()


def test_a_debloated_buffer_size_cuts_what_is_sent_and_holds_the_producers_queue_to_it(manager, server, client):
    """Buffer debloating: the consumer asks for 64 KiB buffers. The producer then sends slices
    no larger than the channel's credit in such buffers, the bytes waiting in the stalled
    channel stay within that credit, and the producer's subpartition holds its capacity in
    such buffers, not in whole batches; every row still arrives once, in order."""
    size = 64 * 1024
    partition = manager.create(ResultPartitionID("job.debloat"), 1, capacity=4)
    sub = partition.subpartitions[0]
    batch = pa.record_batch({"x": np.arange(32 * 1024, dtype=np.int64)})  # 256 KiB
    stop = threading.Event()
    stream = client.channel(server.address, "job.debloat", 0, exclusive_buffers=2)
    stream.set_buffer_size(size)  # asked before the channel opens: sent with the open
    stream.start()
    producer = produce(sub, [batch] * 40 + [END_OF_PARTITION], stop.is_set)
    got: list[Any] = []

    def read(until: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 20
        while not until() and time.monotonic() < deadline:
            e = stream.poll()
            if e is None:
                time.sleep(0.001)
            else:
                got.append(e)

    try:
        # (the producer may fill the queue with whole batches before the channel opens: read past them)
        read(lambda: sum(e.num_rows for e in got if isinstance(e, pa.RecordBatch)) >= 6 * 32 * 1024)
        wait_until(lambda: sub.full and stream.backlog() > 0, 10, "the channel never filled")
        time.sleep(0.3)  # the stalled channel holds what its credit lets through, no more
        assert stream.peak_bytes <= 2 * size
        assert sub.backlog() <= 2  # 4 x 64 KiB hold one 256 KiB batch (and maybe part of one), not 4 batches
        read(lambda: bool(got) and got[-1] == END_OF_PARTITION)
        batches = [e for e in got if isinstance(e, pa.RecordBatch)]
        assert got[-1] == END_OF_PARTITION and all(b.nbytes <= 2 * size for b in batches)
        assert pa.Table.from_batches(batches).column("x").to_numpy().tolist() == list(range(32 * 1024)) * 40
    finally:
        stop.set()
        stream.cancel()
        producer.join(5)


def test_a_consumer_learns_its_producer_finished_before_the_data_in_front_of_the_end_arrives(manager, server,
                                                                                            client):
    """The end of partition waits behind data the channel has no credit for; the consumer is
    told at once that its producer finished (no checkpoint barrier comes on it any more)."""
    partition = manager.create(ResultPartitionID("job.fin"), 1, capacity=8)
    big = pa.record_batch({"x": np.arange(128 * 1024, dtype=np.int64)})  # 1 MiB
    produce(partition.subpartitions[0], [big] * 5 + [END_OF_PARTITION])
    stream = client.open(server.address, "job.fin", 0, exclusive_buffers=2)
    try:
        wait_until(lambda: stream.producer_finished, 10, "the consumer was never told its producer finished")
        assert stream.backlog() <= 2  # the rest (and the end) still wait for credit
        while stream.poll() is not None:
            pass
    finally:
        stream.cancel()


@pytest.mark.parametrize("offset", [0, 1, 3, 8, 13])
def test_a_batch_message_at_any_address_reads_as_a_batch_with_aligned_buffers(offset: int) -> None:
    """gRPC hands a batch's IPC message over wherever its buffer starts: read from ``aligned()``
    every buffer sits at a multiple of its type's width, and the values are the same."""
    batch = pa.record_batch({"i": pa.array(range(1000), pa.int64()), "f": pa.array([x / 3 for x in range(1000)]),
                             "s": pa.array([str(x) for x in range(1000)]), "b": pa.array([x % 2 == 0 for x in range(1000)])})
    message = batch.serialize()
    room = pa.allocate_buffer(message.size + 64)
    raw = np.frombuffer(room, dtype=np.uint8)
    raw[offset:offset + message.size] = np.frombuffer(message, dtype=np.uint8)
    placed = room.slice(offset, message.size)
    assert (placed.address % 8 == 0) == (offset % 8 == 0)
    read = pa.ipc.read_record_batch(aligned(placed), batch.schema)
    assert read.equals(batch)
    for column in read.columns:
        for buf in column.buffers():
            if buf is not None and buf.size:
                assert buf.address % 8 == 0, (column.type, offset)
    assert (aligned(placed) is placed) == (offset % 8 == 0)  # an aligned one is not copied
