"""Buffer debloating (issue 26): the buffer size a gate asks its producers for follows what its
task processes in the target time (worker/network/debloat.py), a subpartition holds its
capacity in buffers of that size, and a task measures and announces it."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from yarnflow.common.ids import ResultPartitionID
from yarnflow.worker.network.debloat import BufferDebloater
from yarnflow.worker.operators.base import Operator, RuntimeContext
from yarnflow.worker.elements import END_OF_PARTITION
from yarnflow.worker.network.gate import InputGate, LocalInputChannel
from yarnflow.worker.network.partition import PartitionReleasedError, ResultPartitionManager, Subpartition
from yarnflow.worker.runtime.stream_task import StreamTask

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

MIB = 1 << 20


def test_the_size_is_the_throughput_over_the_target_spread_on_the_buffers():
    d = BufferDebloater(target_s=1.0, buffers=20, max_size=MIB, min_size=16 * 1024, samples=1)
    assert d.desired() == MIB  # nothing measured yet: the producers keep the full segment size
    # 2 MB/s while busy: 2 MB wanted in flight over 20 buffers -> 100 kB each
    assert d.on_period(400_000, 0.2) == 100_000
    assert d.on_period(400_000, 0.2) is None  # unchanged: nothing to announce
    # idle periods measure nothing (the task waited for input all along)
    assert d.on_period(0, 0.0) is None and d.throughput == 2_000_000


def test_the_size_is_clamped_and_small_changes_are_not_announced():
    d = BufferDebloater(target_s=1.0, buffers=10, max_size=MIB, min_size=32 * 1024, threshold=0.25, samples=1)
    assert d.on_period(1_000, 1.0) == 32 * 1024  # 1 kB/s: the minimum
    assert d.on_period(35_000 * 10, 1.0) is None  # 35 kB: within 25% of 32 kB
    assert d.on_period(100 * MIB, 1.0) == MIB  # fast: the segment size, no more


def test_the_throughput_is_smoothed_over_the_samples():
    d = BufferDebloater(target_s=1.0, buffers=1, max_size=100 * MIB, min_size=1024, threshold=0.0, samples=3)
    d.on_period(1_000_000, 1.0)
    d.on_period(0, 1.0)  # one slow period moves it half way (alpha = 2 / (3 + 1)), not to zero
    assert d.throughput == pytest.approx(500_000)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="target"):
        BufferDebloater(0, 10, MIB, 1024)
    with pytest.raises(ValueError, match="min"):
        BufferDebloater(1.0, 10, 1024, MIB)


def batch(nbytes: int) -> pa.RecordBatch:
    return pa.record_batch({"v": pa.array(range(nbytes // 8), pa.int64())})


def test_a_subpartition_holds_its_capacity_in_buffers_of_the_announced_size():
    sub = Subpartition(4)
    for _ in range(4):
        sub.add(batch(64 * 1024))
    assert sub.full  # 4 batches, whatever their size
    sub.set_buffer_size(32 * 1024)  # 4 x 32 kB = 128 kB
    while sub.take(0) is not None:
        pass
    sub.add(batch(100 * 1024))
    assert not sub.full
    sub.add(batch(100 * 1024))
    assert sub.full  # 200 kB >= 128 kB
    taken = []

    def add_big() -> None:  # waits for room, and one batch bigger than the whole cap goes in alone
        sub.add(batch(1024 * 1024))
        taken.append(True)

    t = threading.Thread(target=add_big, daemon=True)
    t.start()
    time.sleep(0.1)
    assert not taken
    sub.take(0)
    sub.take(0)
    t.join(2)
    assert taken and sub.backlog() == 1 and sub.full


class Slow(Operator):
    def __init__(self) -> None:
        super().__init__("slow")
        self.rows = 0

    def process_batch(self, b: pa.RecordBatch, input_index: int = 0) -> None:
        time.sleep(0.005)
        self.rows += b.num_rows


def test_a_back_pressured_task_asks_its_producer_for_smaller_buffers():
    """A task that takes ~6 MB/s from a local producer with 1 MiB buffers: after a few periods
    the producer's subpartition is held to its capacity in buffers sized to 100 ms of it."""
    manager = ResultPartitionManager()
    partition = manager.create(ResultPartitionID("job.up"), 1, 8)
    sub = partition.subpartitions[0]
    gate = InputGate(1, capacity=8, floating_buffers=0)
    gate.set_channel(0, LocalInputChannel(manager, "job.up", 0))
    debloater = BufferDebloater(target_s=0.1, buffers=gate.network_buffers(), max_size=MIB, min_size=1024,
                                samples=2)
    slow = Slow()
    task = StreamTask([slow], gate, [0], [], lambda: False, "t", io_metrics=False, debloater=debloater,
                      debloat_period_s=0.05)
    task.wire(lambda op: RuntimeContext("j", "t", 0, 1, 128, 0))
    stop = threading.Event()

    def produce() -> None:
        try:
            while not stop.is_set():
                sub.add(batch(32 * 1024), stop.is_set)
        except PartitionReleasedError:
            pass  # stopped while waiting for room
        sub.add(END_OF_PARTITION)  # (an event is always let in)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    runner = threading.Thread(target=task.invoke, daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while debloater.announced is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert debloater.announced is not None, "the task never announced a buffer size"
        # ~6.5 MB/s x 100 ms over 8 buffers: ~80 kB, far below the 1 MiB segment
        assert 20_000 < debloater.announced < 200_000
        time.sleep(0.3)
        assert sub._max_bytes == 8 * debloater.announced  # the producer's queue follows it
    finally:
        stop.set()
        producer.join(5)
        runner.join(10)
    assert not runner.is_alive()
