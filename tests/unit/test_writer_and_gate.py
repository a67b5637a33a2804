"""The local data plane: RecordWriter (routing, batching, events), subpartitions and the
partition manager (bounded, released), InputGate (round robin, bounded per channel), and the
WatermarkValve. Some tests use a short-lived thread to show that a call blocks and what wakes it."""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pytest

from yarnflow.common.errors import UnavailableError
from yarnflow.common.ids import ResultPartitionID
from yarnflow.common.states import Partitioner
from yarnflow.worker.runtime import writer as writer_module
from yarnflow.worker.elements import END_OF_PARTITION, IDLE, EndOfPartition, Watermark
from yarnflow.worker.network.gate import ChannelError, InputGate, IteratorChannel, LocalInputChannel
from yarnflow.worker.key_assignment import key_group_range, key_groups
from yarnflow.worker.network.partition import (
    PartitionReleasedError,
    ResultPartition,
    ResultPartitionManager,
    Subpartition,
)
from yarnflow.worker.runtime.outputs import WatermarkValve
from yarnflow.worker.runtime.writer import RecordWriter

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

MAXP = 128
BIG = 10_000  # a subpartition capacity that never blocks


def batch_of(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"i": pa.array(range(start, start + n), pa.int64())})


def drain(sub: Subpartition) -> list[Any]:
    out = []
    while (el := sub.take(0)) is not None:
        out.append(el)
    return out


def batches(elements: list[Any]) -> list[pa.RecordBatch]:
    return [e for e in elements if isinstance(e, pa.RecordBatch)]


def ints(elements: list[Any], col: str = "i") -> list[int]:
    return [v for b in batches(elements) for v in b.column(col).to_pylist()]


def make_writer(n: int, partitioner: Partitioner, batch_size: int = 100, timeout_ms: int = 100,
                keys: tuple[str, ...] = (), producer_index: int = 0,
                capacity: int = BIG, producer_parallelism: int = 1) -> tuple[RecordWriter, ResultPartition]:
    partition = ResultPartition(ResultPartitionID("job.p0"), n, capacity)
    return RecordWriter(partition, partitioner, list(keys), MAXP, batch_size, timeout_ms, lambda: False,
                        producer_index, producer_parallelism=producer_parallelism), partition


class Waiter:
    """Runs ``fn`` on a thread; tells whether it is still blocked and what it ended with."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()

        def run() -> None:
            try:
                self.result = fn()
            except BaseException as exc:  # noqa: BLE001 - inspected by the test
                self.error = exc
            finally:
                self.done.set()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def blocked(self, for_s: float = 0.15) -> bool:
        return not self.done.wait(for_s)

    def finish(self, within_s: float = 2.0) -> Any:
        assert self.done.wait(within_s), "still blocked"
        self._thread.join(1.0)
        return self.result


# -- routing -------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 3, 8, 10, 17])
def test_hash_routing_sends_every_row_to_the_owner_of_its_key_group(n: int):
    rnd = random.Random(n)
    w, partition = make_writer(n, Partitioner.HASH, batch_size=64, keys=("k", "j"))
    sent = []
    for b in range(20):
        rows = [{"k": f"key{rnd.randrange(300)}", "j": rnd.randrange(3), "seq": 1000 * b + r} for r in range(50)]
        sent += rows
        w.emit(pa.RecordBatch.from_pylist(rows))
    w.finish()
    received: list[dict[str, Any]] = []
    for i, sub in enumerate(partition.subpartitions):
        elements = drain(sub)
        assert elements[-1] == END_OF_PARTITION
        got = [r for b in batches(elements) for r in b.to_pylist()]
        if got:
            kgs = key_groups(pa.Table.from_pylist(got), ["k", "j"], MAXP)
            owned = key_group_range(MAXP, n, i)
            assert all(kg in owned for kg in kgs.tolist()), i
        # per channel, rows keep the order in which they were emitted
        assert [r["seq"] for r in got] == sorted(r["seq"] for r in got)
        received += got
    assert sorted(r["seq"] for r in received) == [r["seq"] for r in sent]
    assert sorted(map(repr, received)) == sorted(map(repr, sent))
    assert w.records_out == len(sent)


def test_hash_routing_of_a_missing_key_column_fails():
    w, _ = make_writer(2, Partitioner.HASH, keys=("nope",))
    with pytest.raises(ValueError, match="'nope'"):
        w.emit(batch_of(0, 3))


def test_forward_keeps_everything_in_one_channel_in_order():
    w, partition = make_writer(1, Partitioner.FORWARD, batch_size=7)
    for s in range(0, 50, 5):
        w.emit(batch_of(s, 5))
    w.finish()
    elements = drain(partition.subpartitions[0])
    assert ints(elements) == list(range(50)) and elements[-1] == END_OF_PARTITION


def test_broadcast_sends_every_row_to_every_channel():
    w, partition = make_writer(4, Partitioner.BROADCAST, batch_size=10)
    for s in range(0, 35, 7):
        w.emit(batch_of(s, 7))
    w.finish()
    for sub in partition.subpartitions:
        assert ints(drain(sub)) == list(range(35))


def test_rebalance_deals_batches_round_robin_from_the_producer_index():
    w, partition = make_writer(3, Partitioner.REBALANCE, batch_size=5, producer_index=4)
    for b in range(7):
        w.emit(batch_of(10 * b, 5))
    w.finish()
    got = [ints(drain(sub)) for sub in partition.subpartitions]
    # producer 4 of a 3-way edge starts at channel 1
    assert got == [[v for b in (2, 5) for v in range(10 * b, 10 * b + 5)],
                   [v for b in (0, 3, 6) for v in range(10 * b, 10 * b + 5)],
                   [v for b in (1, 4) for v in range(10 * b, 10 * b + 5)]]


def test_shuffle_sends_each_row_to_a_random_channel_and_loses_none():
    w, partition = make_writer(4, Partitioner.SHUFFLE, batch_size=1000)
    for s in range(0, 4000, 400):
        w.emit(batch_of(s, 400))
    w.finish()
    got = [ints(drain(sub)) for sub in partition.subpartitions]
    assert sorted(v for g in got for v in g) == list(range(4000))
    assert all(800 < len(g) < 1200 for g in got), [len(g) for g in got]  # (per row, not per batch: 10 batches)
    assert all(g == sorted(g) for g in got)  # each channel keeps the producer's order


@pytest.mark.parametrize("producers, consumers, expected", [
    (2, 4, {0: [0, 1], 1: [2, 3]}),  # each producer its half of the consumers
    (4, 2, {0: [0], 1: [0], 2: [1], 3: [1]}),  # consumers shared by neighbours
    (3, 3, {0: [0], 1: [1], 2: [2]}),
])
def test_rescale_deals_round_robin_over_the_producers_share_of_the_consumers(
        producers: int, consumers: int, expected: dict[int, list[int]]) -> None:
    for p in range(producers):
        w, partition = make_writer(consumers, Partitioner.RESCALE, batch_size=5, producer_index=p,
                                   producer_parallelism=producers)
        for b in range(6):
            w.emit(batch_of(10 * b, 5))
        w.finish()
        got = {i: ints(drain(sub)) for i, sub in enumerate(partition.subpartitions)}
        assert [i for i, g in got.items() if g] == expected[p]
        assert sorted(v for g in got.values() for v in g) == [v for b in range(6) for v in range(10 * b, 10 * b + 5)]


def test_global_sends_every_row_to_the_first_channel():
    w, partition = make_writer(3, Partitioner.GLOBAL, batch_size=10, producer_index=2)
    for s in range(0, 30, 10):
        w.emit(batch_of(s, 10))
    w.finish()
    assert [ints(drain(sub)) for sub in partition.subpartitions] == [list(range(30)), [], []]


def test_custom_routes_each_row_where_the_producer_chains_partitioner_says():
    w, partition = make_writer(3, Partitioner.CUSTOM, batch_size=100)
    with pytest.raises(RuntimeError, match="no partition_custom operator"):
        w.emit(batch_of(0, 3))
    w.custom = lambda batch, n: np.array([v % n for v in batch.column("i").to_pylist()])
    w.emit(batch_of(0, 30))
    w.finish()
    assert [ints(drain(sub)) for sub in partition.subpartitions] == [list(range(r, 30, 3)) for r in range(3)]


# -- batching ------------------------------------------------------------------------------------

def test_small_batches_are_coalesced_to_the_batch_size():
    w, partition = make_writer(1, Partitioner.FORWARD, batch_size=10)
    sub = partition.subpartitions[0]
    for b in range(7):
        w.emit(batch_of(3 * b, 3))
    assert [x.num_rows for x in drain(sub)] == [10, 10]  # 21 rows: one left over, still buffered
    w.flush_all()
    assert [(x.num_rows, x.column("i").to_pylist()) for x in drain(sub)] == [(1, [20])]


def test_large_batches_are_split_to_the_batch_size():
    w, partition = make_writer(1, Partitioner.FORWARD, batch_size=10)
    w.emit(batch_of(0, 25))
    sub = partition.subpartitions[0]
    first = drain(sub)
    assert [b.num_rows for b in first] == [10, 10]
    w.emit(batch_of(25, 8))
    w.flush_all()
    rest = drain(sub)
    assert [b.num_rows for b in rest] == [10, 3]
    assert ints(first + rest) == list(range(33))


def test_batches_of_another_schema_are_not_merged():
    w, partition = make_writer(1, Partitioner.FORWARD, batch_size=100)
    w.emit(pa.record_batch({"a": pa.array([None, None])}))  # types not known yet (null column)
    w.emit(pa.record_batch({"a": pa.array([1, 2])}))
    w.emit(pa.record_batch({"a": pa.array([3])}))
    w.flush_all()
    out = drain(partition.subpartitions[0])
    assert [(b.schema.field("a").type, b.num_rows) for b in out] == [(pa.null(), 2), (pa.int64(), 3)]


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_flush_if_due_flushes_a_partial_batch_after_the_buffer_timeout(monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(writer_module, "time", clock)
    w, partition = make_writer(2, Partitioner.BROADCAST, batch_size=100, timeout_ms=50)
    assert w.flush_if_due() is None  # nothing buffered
    w.emit(batch_of(0, 3))
    clock.now += 0.03
    w.emit(batch_of(3, 3))
    assert w.flush_if_due() == pytest.approx(0.02)
    assert all(sub.backlog() == 0 for sub in partition.subpartitions)
    clock.now += 0.02
    assert w.flush_if_due() is None
    for sub in partition.subpartitions:
        out = drain(sub)
        assert [b.num_rows for b in out] == [6]
    # the timeout counts from the oldest row of the next partial batch
    w.emit(batch_of(6, 1))
    clock.now += 0.049
    assert w.flush_if_due() == pytest.approx(0.001)
    assert partition.subpartitions[0].backlog() == 0


def test_a_buffer_timeout_of_minus_one_flushes_only_full_batches_and_events(monkeypatch):
    """``execution.buffer-timeout: -1`` (Flink's, issue 51): no flush on time, only a full
    batch or an event (a barrier, the end) sends the rows."""
    clock = FakeTime()
    monkeypatch.setattr(writer_module, "time", clock)
    w, partition = make_writer(1, Partitioner.FORWARD, batch_size=10, timeout_ms=-1)
    w.emit(batch_of(0, 3))
    clock.now += 3600
    assert w.flush_if_due() is None
    assert partition.subpartitions[0].backlog() == 0  # an hour later: still waiting to fill
    w.emit(batch_of(3, 9))
    assert [b.num_rows for b in drain(partition.subpartitions[0])] == [10]  # full: sent
    w.broadcast_event(Watermark(5))
    assert ints(batches(drain(partition.subpartitions[0]))) == [10, 11]  # the rest goes before the event


def test_events_flush_pending_data_first_and_stay_in_order():
    w, partition = make_writer(3, Partitioner.HASH, batch_size=1000, keys=("i",))
    w.emit(batch_of(0, 30))
    w.emit_watermark(Watermark(5))
    w.emit(batch_of(30, 30))
    w.broadcast_event(IDLE)
    w.emit(batch_of(60, 30))
    w.finish()
    everything = []
    for sub in partition.subpartitions:
        elements = drain(sub)
        events = [e for e in elements if not isinstance(e, pa.RecordBatch)]
        assert events == [Watermark(5), IDLE, END_OF_PARTITION]
        # the rows emitted before an event are in front of it
        positions = {id(e): n for n, e in enumerate(elements)}
        before_wm = ints(elements[:positions[id(events[0])]])
        assert before_wm and all(v < 30 for v in before_wm)
        between = ints(elements[positions[id(events[0])]:positions[id(events[1])]])
        assert all(30 <= v < 60 for v in between)
        everything += ints(elements)
    assert sorted(everything) == list(range(90))


# -- subpartitions and partitions ----------------------------------------------------------------

def test_a_full_subpartition_blocks_the_producer_until_the_consumer_takes():
    sub = Subpartition(2)
    sub.add(batch_of(0, 1))
    sub.add(batch_of(1, 1))
    sub.add(Watermark(1))  # events never count against the capacity
    assert sub.backlog() == 2
    producer = Waiter(lambda: sub.add(batch_of(2, 1)))
    assert producer.blocked()
    assert sub.take(0).column("i").to_pylist() == [0]
    producer.finish()
    assert producer.error is None
    assert [e if isinstance(e, Watermark) else e.column("i")[0].as_py() for e in drain(sub)] == [1, Watermark(1), 2]
    assert sub.take(0.05) is None


def test_a_cancelled_producer_stops_waiting_for_buffer_space():
    sub = Subpartition(1)
    sub.add(batch_of(0, 1))
    cancelled = threading.Event()
    producer = Waiter(lambda: sub.add(batch_of(1, 1), cancelled.is_set))
    assert producer.blocked()
    cancelled.set()
    producer.finish(within_s=1.0)
    assert isinstance(producer.error, PartitionReleasedError)
    assert sub.backlog() == 1


def test_release_wakes_a_blocked_producer_and_a_waiting_consumer():
    full, empty = Subpartition(1), Subpartition(1)
    full.add(batch_of(0, 1))
    producer = Waiter(lambda: full.add(batch_of(1, 1)))
    consumer = Waiter(lambda: empty.take(None))
    assert producer.blocked() and consumer.blocked(0.01)
    full.release()
    empty.release()
    producer.finish(within_s=0.5)
    consumer.finish(within_s=1.0)
    assert isinstance(producer.error, PartitionReleasedError)
    assert isinstance(consumer.error, PartitionReleasedError)
    with pytest.raises(PartitionReleasedError):
        full.add(Watermark(1))


def test_push_back_returns_an_element_to_the_head():
    sub = Subpartition(1)
    sub.add(batch_of(0, 1))
    taken = sub.take(0)
    sub.push_back(taken)
    assert sub.backlog() == 1 and sub.take(0) is taken


def test_partition_manager_wait_for_times_out_or_returns(tmp_path):
    manager = ResultPartitionManager(str(tmp_path))
    started = time.monotonic()
    assert manager.wait_for("job.nope", 0.1) is None
    assert time.monotonic() - started >= 0.1
    waiter = Waiter(lambda: manager.wait_for("job.late", 5.0))
    assert waiter.blocked(0.05)
    created = manager.create(ResultPartitionID("job.late"), 2, 4)
    assert waiter.finish() is created
    assert manager.wait_for("job.late", 0) is created and len(manager) == 1
    manager.close()
    with pytest.raises(UnavailableError):
        manager.wait_for("job.other", 1.0)


def test_a_partition_is_released_once_every_subpartition_delivered_its_end(tmp_path):
    manager = ResultPartitionManager(str(tmp_path))
    partition = manager.create(ResultPartitionID("job.p"), 2, 4)
    a, b = partition.subpartitions
    for sub in (a, b):
        sub.add(batch_of(0, 1))
        sub.add(END_OF_PARTITION)
    assert drain(a)[-1] == END_OF_PARTITION
    assert a.consumed and not b.consumed
    assert manager.wait_for("job.p", 0) is partition and not partition.released
    assert isinstance(b.take(0), pa.RecordBatch)
    assert manager.wait_for("job.p", 0) is partition  # a batch is not the end
    assert isinstance(b.take(0), EndOfPartition)
    assert partition.released and manager.wait_for("job.p", 0) is None and len(manager) == 0


def test_release_all_by_job_prefix(tmp_path):
    manager = ResultPartitionManager(str(tmp_path))
    mine = [manager.create(ResultPartitionID(f"j1.{i}"), 1, 1) for i in range(2)]
    other = manager.create(ResultPartitionID("j2.0"), 1, 1)
    manager.release_all(lambda pid: pid.startswith("j1."))
    assert all(p.released for p in mine) and not other.released and len(manager) == 1


# -- input gate ----------------------------------------------------------------------------------

def test_gate_hands_out_elements_round_robin_skipping_empty_channels():
    gate = InputGate(3, capacity=10)
    for ch, count in ((0, 3), (1, 1), (2, 2)):
        for k in range(count):
            assert gate.push(ch, batch_of(10 * ch + k, 1))
    order = [gate.poll(0) for _ in range(6)]
    assert [(ch, b.column("i")[0].as_py()) for ch, b in order] == [(0, 0), (1, 10), (2, 20), (0, 1), (2, 21), (0, 2)]
    assert gate.poll(0.05) is None


def test_gate_capacity_is_per_channel_and_counts_batches_only():
    gate = InputGate(2, capacity=2)
    gate.push(0, batch_of(0, 1))
    gate.push(0, batch_of(1, 1))
    gate.push(0, Watermark(3))  # not counted
    reader0 = Waiter(lambda: gate.push(0, batch_of(2, 1)))
    assert reader0.blocked()
    for k in range(2):  # the other channel is not affected
        assert gate.push(1, batch_of(100 + k, 1))
    assert gate.backlog() == [2, 2] and reader0.blocked(0.01)
    assert gate.poll(0)[0] == 0  # frees room in channel 0
    assert reader0.finish() is True
    assert gate.backlog() == [2, 2]


def test_cancel_wakes_a_waiting_poll_and_a_blocked_reader():
    empty = InputGate(2, capacity=1)
    poller = Waiter(lambda: empty.poll(None))  # nothing to read
    full = InputGate(2, capacity=1)
    full.push(1, batch_of(0, 1))
    reader = Waiter(lambda: full.push(1, batch_of(1, 1)))  # channel 1 is full
    assert poller.blocked() and reader.blocked(0.01)
    empty.cancel()
    full.cancel()
    assert poller.finish(within_s=1.0) is None
    assert reader.finish(within_s=1.0) is False
    assert full.push(0, Watermark(1)) is False


def test_gate_is_finished_when_every_channel_delivered_its_end():
    gate = InputGate(2, capacity=1)
    gate.push(0, END_OF_PARTITION)
    gate.push(1, batch_of(0, 1))
    gate.poll(0)
    gate.poll(0)
    assert not gate.finished
    gate.push(1, END_OF_PARTITION)
    assert gate.poll(0) == (1, END_OF_PARTITION) and gate.finished


def test_a_failed_channel_hands_its_error_to_the_task():
    gate = InputGate(2, capacity=4)

    def source() -> Any:
        yield batch_of(0, 1)
        raise ConnectionResetError("producer went away")

    gate.set_channel(1, IteratorChannel(source))
    assert isinstance(gate.poll(1.0)[1], pa.RecordBatch)
    ch, element = gate.poll(1.0)
    assert ch == 1 and isinstance(element, ChannelError) and isinstance(element.error, ConnectionResetError)
    assert gate.poll(0.05) is None  # a failed channel gives nothing more


def test_a_local_channel_takes_the_producers_subpartition_and_is_woken_by_its_writes(tmp_path):
    """No thread moves a local channel's elements: the task takes them from the producer's
    subpartition, and a write wakes a task waiting in poll."""
    manager = ResultPartitionManager(str(tmp_path))
    try:
        gate = InputGate(1)
        gate.set_channel(0, LocalInputChannel(manager, "job.local", 0))
        waiter = Waiter(lambda: gate.poll(10.0))
        assert waiter.blocked()  # the partition does not exist yet: the channel asks again
        partition = manager.create(ResultPartitionID("job.local"), 1, capacity=2)
        assert waiter.blocked(0.2)
        started = time.monotonic()
        partition.subpartitions[0].add(batch_of(7, 1))
        ch, element = waiter.finish(within_s=1.0)
        assert ch == 0 and element.column("i")[0].as_py() == 7 and time.monotonic() - started < 0.5
        partition.subpartitions[0].add(END_OF_PARTITION)
        assert gate.poll(1.0) == (0, END_OF_PARTITION) and gate.finished
        assert manager.peek("job.local") is None  # consumed: released
    finally:
        manager.close()


def test_a_local_partition_never_produced_is_a_channel_error(tmp_path):
    manager = ResultPartitionManager(str(tmp_path))
    try:
        gate = InputGate(1)
        gate.set_channel(0, LocalInputChannel(manager, "job.never", 0, wait_for_partition_s=0.2))
        polled = gate.poll(3.0)
        assert polled is not None and isinstance(polled[1], ChannelError)
        assert "job.never" in str(polled[1].error)
    finally:
        manager.close()


# -- watermark valve -----------------------------------------------------------------------------

def test_valve_is_the_minimum_over_channels_and_never_decreases():
    valve = WatermarkValve([0, 1, 2])
    assert valve.on_watermark(0, 10) is None
    assert valve.on_watermark(1, 5) is None
    assert valve.on_watermark(2, 7) == 5
    assert valve.on_watermark(1, 20) == 7
    assert valve.on_watermark(2, 3) is None  # a channel going back changes nothing
    assert valve.on_watermark(1, 1) is None
    assert valve.on_watermark(2, 30) == 10
    assert valve.current == 10


def test_valve_excludes_finished_and_idle_channels():
    valve = WatermarkValve([0, 1, 2])
    valve.on_watermark(0, 100)
    valve.on_watermark(1, 50)
    assert valve.on_end(2) == 50  # the finished channel no longer holds it back
    assert valve.on_status(1, idle=True) == 100
    assert not valve.all_idle
    assert valve.on_status(1, idle=False) is None  # back, but the watermark does not go back
    assert valve.current == 100
    assert valve.on_watermark(1, 150) is None  # 0 is now the minimum (100)
    assert valve.on_watermark(0, 200) == 150
    valve.on_status(0, idle=True)
    valve.on_status(1, idle=True)
    assert valve.all_idle
    assert valve.on_end(0) is None and valve.on_end(1) is None  # nothing live: no new watermark


def test_valve_matches_a_reference_on_random_input():
    rnd = random.Random(7)
    channels = list(range(4))
    valve = WatermarkValve(channels)
    marks = {ch: -(2**63) for ch in channels}
    done: set[int] = set()
    emitted = []
    for _ in range(500):
        ch = rnd.choice(channels)
        if ch in done:
            continue
        if rnd.random() < 0.01:
            done.add(ch)
            out = valve.on_end(ch)
        else:
            marks[ch] = max(marks[ch], rnd.randrange(1000))
            out = valve.on_watermark(ch, marks[ch])
        if out is not None:
            emitted.append(out)
        live = [marks[c] for c in channels if c not in done]
        if live:
            assert valve.current == min(live)
    assert len(emitted) > 10 and emitted == sorted(set(emitted))  # strictly increasing
