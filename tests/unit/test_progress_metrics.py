"""A task's figures move with what it does, while it does it (issue 55): a wait for room or for
input counts as it goes, not when it ends; a slow function's record counters move slice by slice
instead of a whole 65,536-row batch at a time; a fast chain is not sliced."""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow as pa
import pytest

from yarnflow.common.ids import ResultPartitionID
from yarnflow.common.states import Partitioner
from yarnflow.worker.elements import END_OF_PARTITION
from yarnflow.worker.network.gate import InputGate
from yarnflow.worker.network.partition import ResultPartition
from yarnflow.worker.operators.base import Operator, RuntimeContext
from yarnflow.worker.runtime.stream_task import FIRST_SLICE_ROWS, StreamTask
from yarnflow.worker.network.wait_clock import WaitClock
from yarnflow.worker.runtime.writer import RecordWriter

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def rows(n: int, start: int = 0) -> pa.RecordBatch:
    return pa.record_batch({"v": pa.array(range(start, start + n), pa.int64())})


class Counted(Operator):
    """Passes batches on after ``per_row_s`` a row; remembers each call's row count."""

    def __init__(self, per_row_s: float = 0.0) -> None:
        super().__init__("counted")
        self.per_row_s = per_row_s
        self.calls: list[int] = []

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if self.per_row_s:
            time.sleep(self.per_row_s * batch.num_rows)
        self.calls.append(batch.num_rows)
        self.output.collect(batch)


def start(task: StreamTask) -> threading.Thread:
    task.wire(lambda op: RuntimeContext("j", "t", 0, 1, 128, 0))
    t = threading.Thread(target=task.invoke, daemon=True)
    t.start()
    return t


def test_a_wait_in_progress_is_counted_and_reads_never_go_down() -> None:
    clock = WaitClock()
    clock.begin()
    time.sleep(0.2)
    assert clock.ns >= 0.19e9  # mid-wait: already there
    clock.end()
    total = clock.ns
    time.sleep(0.05)
    assert clock.ns == total  # not waiting: it stays
    stop, seen, errors = threading.Event(), [], []

    def waits() -> None:
        while not stop.is_set():
            clock.begin()
            time.sleep(0.0005)
            clock.end()

    t = threading.Thread(target=waits)
    t.start()
    try:
        for _ in range(20_000):
            seen.append(clock.ns)
    finally:
        stop.set()
        t.join()
    errors = [(a, b) for a, b in zip(seen, seen[1:]) if b < a]
    assert not errors, errors[:3]


def test_a_writer_blocked_on_a_full_subpartition_shows_back_pressure_while_it_waits() -> None:
    """A source blocked behind a slow consumer read "back-pressure ok (0 ms/s)" for as long as
    it was blocked: the wait was counted only when it ended."""
    partition = ResultPartition(ResultPartitionID("job.out"), 1, capacity=1)
    writer = RecordWriter(partition, Partitioner.FORWARD, [], 128, 1, 10_000, lambda: False)
    writer.emit(rows(1))  # fills the one buffer
    t = threading.Thread(target=writer.emit, args=(rows(1, 1),), daemon=True)
    t.start()
    time.sleep(0.4)
    assert t.is_alive()  # still waiting for room...
    assert writer.backpressured_ns >= 0.35e9  # ...and counted as back-pressure already
    partition.subpartitions[0].take(0)
    t.join(5)
    assert not t.is_alive() and writer.backpressured_ns >= 0.35e9


def test_a_task_waiting_for_input_shows_idle_time_while_it_waits() -> None:
    gate = InputGate(1, capacity=8)
    task = StreamTask([Counted()], gate, [0], [], lambda: False, "t")
    t = start(task)
    time.sleep(0.4)
    assert gate.idle_ns >= 0.3e9  # nothing came yet: it has been idle all along
    gate.push(0, END_OF_PARTITION)
    t.join(5)
    assert not t.is_alive()


def test_a_slow_functions_counters_move_slice_by_slice() -> None:
    """2 ms a row: a 600-row batch takes 1.2 s. Its records are counted as slices of about
    0.25 s are processed, not all at once at the end (without unaligned checkpoints too)."""
    gate = InputGate(1, capacity=8)
    slow = Counted(0.002)
    task = StreamTask([slow], gate, [0], [], lambda: False, "t")
    t = start(task)
    gate.push(0, rows(600))
    gate.push(0, END_OF_PARTITION)
    counts = []
    for _ in range(12):
        time.sleep(0.1)
        counts.append(task.records_in)
    t.join(10)
    assert not t.is_alive()
    assert sum(slow.calls) == 600 and slow.calls[0] == FIRST_SLICE_ROWS
    assert all(n <= 200 for n in slow.calls), slow.calls  # ~0.25 s of work each (125 rows)
    moving = [n for n in counts if 0 < n < 600]
    assert len(set(moving)) >= 3, counts  # the counter moved several times within the batch


def test_a_fast_chain_takes_whole_batches_even_when_its_output_waits_for_room() -> None:
    """Only the first batch is cut (its first rows measure the pace); a vectorised chain then
    takes every batch whole, even when its writer waits for a slow consumer (that time is
    back-pressure, not the chain's pace)."""
    gate = InputGate(1, capacity=16)
    partition = ResultPartition(ResultPartitionID("job.out"), 1, capacity=1)
    writer = RecordWriter(partition, Partitioner.FORWARD, [], 128, 65_536, 10_000, lambda: False)
    fast = Counted()
    task = StreamTask([fast], gate, [0], [writer], lambda: False, "t")
    t = start(task)
    for i in range(4):
        gate.push(0, rows(65_536, i * 65_536))
    gate.push(0, END_OF_PARTITION)
    taken: list[Any] = []
    while t.is_alive() or partition.subpartitions[0].full:
        time.sleep(0.3)  # a slow consumer: the writer waits for room every time
        element = partition.subpartitions[0].take(0)
        if element is not None:
            taken.append(element)
        if len(taken) > 50:
            break
    t.join(5)
    assert fast.calls == [FIRST_SLICE_ROWS, 65_536 - FIRST_SLICE_ROWS, 65_536, 65_536, 65_536], fast.calls
    assert writer.backpressured_ns > 0.5e9
