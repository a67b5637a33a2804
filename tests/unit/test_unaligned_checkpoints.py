"""Unaligned checkpoints in the task runtime (issue 26): the aligner's unaligned mode and its
aligned-timeout switch, barriers that overtake queued data on both sides of a channel, the
in-flight data a task records and hands over with its snapshot, its encoding, and its replay,
in order, before anything new when a task is restored."""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow as pa
import pytest

from yarnflow.common.ids import ResultPartitionID
from yarnflow.common.states import Partitioner
from yarnflow.worker.network.credit import FloatingBufferPool
from yarnflow.worker.network.client import RemoteInputChannel
from yarnflow.worker.operators.base import Operator, RuntimeContext
from yarnflow.worker.runtime.barriers import BarrierAligner, Decline, InflightComplete, Snapshot
from yarnflow.worker.runtime.checkpoints import decode_channel_state, encode_channel_state
from yarnflow.worker.elements import (
    END_OF_PARTITION,
    IDLE,
    CheckpointBarrier,
    Watermark,
    decode_event,
    encode_event,
)
from yarnflow.worker.network.gate import InputGate
from yarnflow.worker.network.partition import ResultPartition
from yarnflow.worker.runtime.stream_task import StreamTask
from yarnflow.worker.runtime.writer import RecordWriter

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def b(*values: int) -> pa.RecordBatch:
    return pa.record_batch({"v": pa.array(values, pa.int64())})


def unaligned(n: int, timestamp_ms: int = 0, timeout_ms: int = 0) -> CheckpointBarrier:
    return CheckpointBarrier(n, timestamp_ms, True, "", timeout_ms)


def values(elements: list[Any]) -> list[Any]:
    out: list[Any] = []
    for e in elements:
        out += e.column("v").to_pylist() if isinstance(e, pa.RecordBatch) else [e]
    return out


# -- the aligner -------------------------------------------------------------------------------

def test_an_unaligned_barrier_snapshots_at_once_and_records_the_other_channels():
    a = BarrierAligner(3)
    [snap] = a.on_barrier(1, unaligned(5))
    assert isinstance(snap, Snapshot) and snap.unaligned and snap.barrier.checkpoint_id == 5
    assert not any(a.is_blocked(ch) for ch in range(3))  # nothing is held back
    assert [a.is_recording(ch) for ch in range(3)] == [True, False, True]
    assert a.on_barrier(0, unaligned(5)) == []
    assert not a.is_recording(0)
    [done] = a.on_end_of_partition(2)  # an ended channel has nothing more in flight
    assert isinstance(done, InflightComplete) and done.checkpoint_id == 5
    assert a.pending is None and not a.is_recording(1)
    assert a.on_barrier(2, unaligned(5)) == []  # stale


def test_a_newer_checkpoint_declines_an_unaligned_one_still_recording():
    a = BarrierAligner(2)
    a.on_barrier(0, unaligned(1))
    decline, snap = a.on_barrier(0, unaligned(2))
    assert isinstance(decline, Decline) and decline.checkpoint_id == 1
    assert isinstance(snap, Snapshot) and snap.unaligned and snap.barrier.checkpoint_id == 2
    assert a.is_recording(1)


def test_an_aligned_checkpoint_turns_unaligned_after_its_timeout():
    now = [1000.0]
    a = BarrierAligner(3, wall_ms=lambda: now[0])
    barrier = unaligned(7, timestamp_ms=1000, timeout_ms=500)
    assert a.on_barrier(0, barrier) == []  # within the timeout: aligned, channel 0 blocked
    assert a.is_blocked(0) and a.timeout_in() == pytest.approx(0.5)
    now[0] = 1400.0
    assert a.on_timeout() == []
    now[0] = 1500.0
    [snap] = a.on_timeout()
    assert isinstance(snap, Snapshot) and snap.unaligned
    assert not a.is_blocked(0) and [a.is_recording(ch) for ch in range(3)] == [False, True, True]
    assert a.timeout_in() is None
    assert a.on_overtaken(1) == []
    [done] = a.on_barrier(2, barrier)
    assert isinstance(done, InflightComplete)


def test_a_barrier_that_comes_after_the_timeout_is_taken_unaligned_at_once():
    a = BarrierAligner(2, wall_ms=lambda: 5000.0)
    [snap] = a.on_barrier(0, unaligned(3, timestamp_ms=1000, timeout_ms=2000))
    assert snap.unaligned and a.is_recording(1)


def test_an_unaligned_trigger_waits_a_grace_period_aligned_then_each_end_of_partition_completes_a_channel():
    from yarnflow.worker.runtime.barriers import DIRECT_GRACE_MS

    now = [1000.0]
    a = BarrierAligner(3, clock=lambda: now[0] / 1000, wall_ms=lambda: now[0])
    assert a.on_end_of_partition(2) == []
    assert a.on_trigger(unaligned(4, timestamp_ms=900)) == []  # aligned for the grace period
    assert a.timeout_in() == DIRECT_GRACE_MS / 1000
    now[0] += DIRECT_GRACE_MS
    [snap] = a.on_timeout()
    assert snap.unaligned and snap.barrier.checkpoint_id == 4
    assert a.is_recording(0) and a.is_recording(1) and not a.is_recording(2)
    assert a.on_end_of_partition(0) == [] and not a.is_recording(0)
    [done] = a.on_end_of_partition(1)
    assert isinstance(done, InflightComplete) and done.checkpoint_id == 4
    quick = BarrierAligner(1, wall_ms=lambda: now[0])  # the inputs end within the grace: aligned
    assert quick.on_trigger(unaligned(5, timestamp_ms=int(now[0]))) == []
    [snap] = quick.on_end_of_partition(0)
    assert isinstance(snap, Snapshot) and not snap.unaligned


def test_savepoint_and_at_least_once_barriers_stay_aligned():
    a = BarrierAligner(2, wall_ms=lambda: 10**9)
    assert a.on_barrier(0, CheckpointBarrier(1, 0, True)) == []  # aligned_timeout_ms -1
    assert a.is_blocked(0)
    assert not CheckpointBarrier(2, 0, False, "", 0).unaligned_at(10**9)


def test_the_barrier_wire_form_keeps_the_alignment_timeout():
    for barrier in (unaligned(3, 99, 0), unaligned(4, 5, 1500), CheckpointBarrier(5, 6, False, "drain")):
        assert decode_event(encode_event(barrier)) == barrier


# -- overtaking ----------------------------------------------------------------------------------

def test_a_priority_barrier_overtakes_a_subpartitions_queue_and_the_writers_pending_batches():
    partition = ResultPartition(ResultPartitionID("job.p"), 2, capacity=8)
    writer = RecordWriter(partition, Partitioner.FORWARD, [], 128, batch_size=4, buffer_timeout_ms=10_000,
                          cancelled=lambda: False)
    writer.emit(b(1, 2, 3, 4))  # a full batch: queued
    writer.emit(b(5))  # pending in the writer
    writer.emit_watermark(Watermark(9))  # flushes 5, then the watermark
    writer.emit(b(6))
    [out0, out1] = writer.broadcast_priority(unaligned(1))
    assert values(out0) == [1, 2, 3, 4, 5, Watermark(9), 6] and values(out1) == [Watermark(9)]
    sub = partition.subpartitions[0]
    assert sub.take(0) == unaligned(1)  # the barrier first, then everything it overtook
    writer.flush_all()
    rest = []
    while (e := sub.take(0)) is not None:
        rest.append(e)
    assert values(rest) == [1, 2, 3, 4, 5, Watermark(9), 6]


class FedChannel(RemoteInputChannel):
    """A remote channel whose connection's messages the test hands it (it opens nothing)."""

    def start(self) -> None:
        pass


def remote_channel(pool: FloatingBufferPool | None = None) -> RemoteInputChannel:
    ch = FedChannel(None, "127.0.0.1:1", "job.p", 0, "te", 1.0, 4, pool)  # type: ignore[arg-type]
    ch.credit.initial()
    return ch


def test_a_priority_barrier_overtakes_what_a_remote_channel_received():
    ch = remote_channel()
    ch.on_batch(b(1), 1, 0)
    ch.on_event(Watermark(3))
    ch.on_batch(b(2), 1, 0)
    ch.on_event(unaligned(4))
    assert ch.priority and ch.poll() == unaligned(4)
    assert values(ch.overtaken_by(4)) == [1, Watermark(3), 2]
    assert values([ch.poll(), ch.poll(), ch.poll()]) == [1, Watermark(3), 2] and ch.poll() is None


def test_switching_to_unaligned_pulls_a_queued_barrier_or_makes_the_next_one_overtake():
    ch = remote_channel()
    ch.on_batch(b(1), 1, 0)
    ch.on_event(unaligned(6, timeout_ms=5000))  # came aligned: in order
    ch.on_batch(b(2), 1, 0)
    assert values(ch.overtake(6) or []) == [1]
    assert values([ch.poll(), ch.poll()]) == [1, 2]  # the barrier is gone, the data stays
    assert ch.overtake(7) is None  # not here yet: it overtakes when it comes
    ch.on_batch(b(4), 1, 0)
    ch.on_event(unaligned(8))  # came overtaking 4; then the task switches to unaligned: it gets 4
    assert values(ch.overtake(8) or []) == [4] and not ch.priority
    ch.on_batch(b(3), 1, 0)
    ch.on_event(unaligned(7, timeout_ms=5000))
    assert ch.poll() == unaligned(7, timeout_ms=5000) and values(ch.overtaken_by(7)) == [4, 3]


# -- a task taking unaligned checkpoints ---------------------------------------------------------

class Keep(Operator):
    """Passes batches on and keeps every value it saw as its state."""

    def __init__(self) -> None:
        super().__init__("keep")
        self.seen: list[int] = []

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        self.seen += batch.column("v").to_pylist()
        self.output.collect(batch)

    def snapshot_state(self, checkpoint_id: int) -> dict[str, pa.Table]:
        return {"seen": pa.table({"v": pa.array(self.seen, pa.int64())})}


class Slow(Keep):
    """``per_row_s`` of work a row."""

    def __init__(self, per_row_s: float) -> None:
        super().__init__()
        self.per_row_s = per_row_s

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        time.sleep(self.per_row_s * batch.num_rows)
        super().process_batch(batch, input_index)


class Sink:
    def __init__(self) -> None:
        self.taken: dict[int, tuple[list[int], dict[str, list[Any]]]] = {}
        self.declined: dict[int, str] = {}
        self.done = threading.Event()
        self.at: dict[int, float] = {}  # when each snapshot was handed over (time.monotonic)

    def submit(self, checkpoint_id: int, snapshots: list[dict[str, pa.Table]], alignment_ms: int, sync_ms: int,
               channel_state: dict[str, list[Any]] | None = None, start_delay_ms: int = 0) -> None:
        self.taken[checkpoint_id] = (snapshots[0]["seen"].column("v").to_pylist(), channel_state or {})
        self.at[checkpoint_id] = time.monotonic()
        self.done.set()

    def decline(self, checkpoint_id: int, reason: str) -> None:
        self.declined[checkpoint_id] = reason


def ctx() -> RuntimeContext:
    return RuntimeContext("j", "t", 0, 1, 128, 0, checkpointing=True)


def run(task: StreamTask) -> None:
    task.wire(lambda op: ctx())
    errors: list[BaseException] = []

    def invoke() -> None:
        try:
            task.invoke()
        except BaseException as exc:  # noqa: BLE001 - raised below
            errors.append(exc)

    t = threading.Thread(target=invoke, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive()
    if errors:
        raise errors[0]


def test_a_task_records_what_its_channels_deliver_ahead_of_their_barriers():
    """Channel 0 is remote: its priority barrier overtakes 1 and 2, which the task has not
    taken yet. Channel 1 is local: 10 and 11 come ahead of its barrier, after the snapshot.
    The snapshot holds neither; the in-flight data holds both, in order; the task still
    processes all of them after the snapshot."""
    gate = InputGate(2, capacity=16)
    remote = remote_channel()
    gate.set_channel(0, remote)
    partition = ResultPartition(ResultPartitionID("job.out"), 1, capacity=64)
    writer = RecordWriter(partition, Partitioner.FORWARD, [], 128, 1, 10_000, lambda: False)
    keep, sink = Keep(), Sink()
    task = StreamTask([keep], gate, [0, 0], [writer], lambda: False, "t", snapshots=sink)
    remote.on_batch(b(0), 1, 0)
    gate.push(1, b(9))
    state = {"polls": 0}
    original = gate.poll

    def poll(timeout: float | None, channels: Any = None) -> Any:
        state["polls"] += 1
        if state["polls"] == 3:  # 0 and 9 are processed: now 1, 2 and the barrier arrive
            remote.on_batch(b(1), 1, 0)
            remote.on_batch(b(2), 1, 0)
            remote.on_event(unaligned(1))
            remote.on_event(END_OF_PARTITION)
            for e in (b(10), Watermark(5), b(11), unaligned(1), END_OF_PARTITION):
                gate.push(1, e)
        return original(timeout, channels)

    gate.poll = poll  # type: ignore[method-assign]
    run(task)
    seen_at_snapshot, inflight = sink.taken[1]
    assert sorted(seen_at_snapshot) == [0, 9]
    assert values(inflight["@in-0-0"]) == [1, 2]
    assert values(inflight["@in-0-1"]) == [10, Watermark(5), 11]
    assert sorted(keep.seen) == [0, 1, 2, 9, 10, 11]
    # the output: the barrier overtook what the task had sent and its consumer had not taken
    assert values(inflight["@out-0-0"]) == [0, 9]
    out = []
    while (e := partition.subpartitions[0].take(0)) is not None:
        out.append(e)
    assert out[0] == unaligned(1) and sorted(v for v in values(out[1:]) if isinstance(v, int)) == [0, 1, 2, 9, 10, 11]


def test_a_slow_batch_is_processed_in_slices_so_a_barrier_does_not_wait_for_all_of_it():

    gate = InputGate(1, capacity=8)
    remote = remote_channel()
    gate.set_channel(0, remote)
    slow, sink = Slow(0.002), Sink()
    task = StreamTask([slow], gate, [0], [], lambda: False, "t", snapshots=sink, slicing=True)
    remote.on_batch(b(*range(20)), 1, 0)  # learns how slow a row is (40 ms)
    remote.on_batch(b(*range(100, 400)), 1, 0)  # 600 ms unsliced
    threading.Timer(0.25, lambda: (remote.on_event(unaligned(1)), remote.on_event(END_OF_PARTITION))).start()
    run(task)
    seen_at_snapshot, inflight = sink.taken[1]
    assert 20 < len(seen_at_snapshot) < 320, "the barrier waited for the whole batch"
    rest = values(inflight["@in-0-0"])
    assert seen_at_snapshot + rest == list(range(20)) + list(range(100, 400))  # nothing lost, nothing twice
    assert slow.seen == list(range(20)) + list(range(100, 400))


def test_a_restored_task_replays_its_in_flight_data_before_anything_new():
    gate = InputGate(2, capacity=8)
    partition = ResultPartition(ResultPartitionID("job.out"), 1, capacity=64)
    writer = RecordWriter(partition, Partitioner.FORWARD, [], 128, 1, 10_000, lambda: False)
    keep = Keep()
    task = StreamTask([keep], gate, [0, 0], [writer], lambda: False, "t",
                      restored_inputs={1: [b(5), Watermark(1), b(6)], 0: [b(1)]},
                      restored_outputs={(0, 0): [b(100), Watermark(2)]})
    for ch, e in ((0, b(2)), (1, b(7)), (0, END_OF_PARTITION), (1, END_OF_PARTITION)):
        gate.push(ch, e)
    run(task)
    assert keep.seen[:3] == [1, 5, 6] and sorted(keep.seen[3:]) == [2, 7]
    out = []
    while (e := partition.subpartitions[0].take(0)) is not None:
        out.append(e)
    assert values(out[:2]) == [100, Watermark(2)]


def test_in_flight_data_round_trips_through_its_encoding():
    other = pa.record_batch({"s": pa.array(["a", None]), "x": pa.array([1.5, 2.5])})
    elements = [b(1, 2), Watermark(7), other, IDLE, b(3)]
    table, nbytes = encode_channel_state(elements)
    assert nbytes == b(1, 2).nbytes + other.nbytes + b(3).nbytes
    back = decode_channel_state(table)
    assert len(back) == 5 and back[1] == Watermark(7) and back[3] == IDLE
    assert back[0].equals(b(1, 2)) and back[2].equals(other) and back[2].schema.equals(other.schema)


def test_a_task_switches_an_aligned_checkpoint_to_unaligned_after_the_timeout():
    """Channel 0's barrier comes in order (aligned, timeout 300 ms): the task blocks channel 0
    and holds what follows it (20, 21). Channel 1's barrier does not come; after the timeout
    the task snapshots, releases channel 0 and records channel 1 until its barrier: 10, 11.
    The held 20, 21 come after channel 0's barrier: they are in no in-flight data."""
    import time as _time

    gate = InputGate(2, capacity=16)
    keep, sink = Keep(), Sink()
    task = StreamTask([keep], gate, [0, 0], [], lambda: False, "t", snapshots=sink)
    now_ms = int(_time.time() * 1000)
    barrier = unaligned(1, timestamp_ms=now_ms, timeout_ms=300)
    for e in (b(1), barrier, b(20), b(21)):
        gate.push(0, e)
    gate.push(1, b(2))

    def later() -> None:
        _time.sleep(0.6)  # past the timeout: the task went unaligned without channel 1's barrier
        for e in (b(10), b(11), barrier, END_OF_PARTITION):
            gate.push(1, e)
        gate.push(0, END_OF_PARTITION)

    threading.Thread(target=later, daemon=True).start()
    started = _time.monotonic()
    run(task)
    seen_at_snapshot, inflight = sink.taken[1]
    assert sorted(seen_at_snapshot) == [1, 2]  # taken at the switch, before 10, 11 came
    assert values(inflight.get("@in-0-1", [])) == [10, 11]
    assert "@in-0-0" not in inflight  # channel 0 was aligned: nothing of it is in flight
    assert sorted(keep.seen) == [1, 2, 10, 11, 20, 21]
    assert _time.monotonic() - started >= 0.5


def test_a_directly_triggered_unaligned_checkpoint_takes_the_rest_of_the_input_as_in_flight_data():
    """The producers have finished (their ends of partition are queued): the JobMaster triggers
    the task directly. Unaligned, it snapshots at once and takes what the channels still hold as
    in-flight data as fast as it comes, not at the pace of its slow operator; it processes all
    of it afterwards, in order. (Aligned, the checkpoint waits until the task has processed
    everything: the drain this replaces.)"""
    import time as _time

    from yarnflow.worker.runtime.barriers import DIRECT_GRACE_MS
    from yarnflow.worker.runtime.checkpoints import TriggerCheckpoint

    gate = InputGate(2, capacity=64)
    slow, sink = Slow(0.025), Sink()
    task = StreamTask([slow], gate, [0, 0], [], lambda: False, "t", snapshots=sink, slicing=True)
    for i in range(10):
        gate.push(0, b(i, i + 100))
        gate.push(1, b(i + 1000))
    gate.push(0, Watermark(4))
    gate.push(0, END_OF_PARTITION)
    gate.push(1, END_OF_PARTITION)
    triggered = {}

    def trigger() -> None:
        triggered["at"] = _time.monotonic()
        task.mailbox.put(TriggerCheckpoint(3, int(_time.time() * 1000), True, "", 0))

    threading.Timer(0.08, trigger).start()
    run(task)
    finished = _time.monotonic()
    assert sink.done.is_set()
    seen_at_snapshot, inflight = sink.taken[3]
    assert 0 < len(seen_at_snapshot) < 25
    rest0, rest1 = values(inflight.get("@in-0-0", [])), values(inflight.get("@in-0-1", []))
    assert rest0 and rest1 and rest0[-1] == Watermark(4)
    # nothing lost, nothing twice: the snapshot plus the in-flight data is the whole input
    everything = sorted(seen_at_snapshot + [v for v in rest0 + rest1 if isinstance(v, int)])
    assert everything == sorted([*range(10), *range(100, 110), *range(1000, 1010)])
    assert sorted(slow.seen) == everything
    # complete (in-flight data too) once the grace period is over, long before the processing
    # ends (750 ms of it)
    assert sink.at[3] - triggered["at"] < DIRECT_GRACE_MS / 1000 + 0.1 and finished - sink.at[3] > 0.25


def test_a_directly_triggered_aligned_checkpoint_still_waits_for_the_end_of_the_input():
    from yarnflow.worker.runtime.checkpoints import TriggerCheckpoint

    gate = InputGate(1, capacity=8)
    keep, sink = Keep(), Sink()
    task = StreamTask([keep], gate, [0], [], lambda: False, "t", snapshots=sink)
    for e in (b(1), b(2), END_OF_PARTITION):
        gate.push(0, e)
    task.mailbox.put(TriggerCheckpoint(3, 0, True, "", -1))
    run(task)
    seen_at_snapshot, inflight = sink.taken[3]
    assert seen_at_snapshot == [1, 2] and inflight == {}


def test_a_channel_whose_producer_finished_is_taken_ahead_when_a_checkpoint_records_it():
    """Channel 0's producer finished before checkpoint 1 (its queue ends with its end of
    partition: no barrier comes on it); channel 1's producer is running and its barrier
    overtakes. The checkpoint completes as soon as channel 0's rest is taken as in-flight
    data, not once the slow task has processed it."""
    from yarnflow.worker.network.gate import LocalInputChannel
    from yarnflow.worker.network.partition import ResultPartitionManager

    manager = ResultPartitionManager()
    finished = manager.create(ResultPartitionID("job.up0"), 1, 64)
    for i in range(20):
        finished.subpartitions[0].add(b(i))
    finished.subpartitions[0].add(END_OF_PARTITION)
    gate = InputGate(2, capacity=8)
    gate.set_channel(0, LocalInputChannel(manager, "job.up0", 0))
    running = remote_channel()
    gate.set_channel(1, running)
    slow, sink = Slow(0.01), Sink()
    task = StreamTask([slow], gate, [0, 0], [], lambda: False, "t", snapshots=sink, slicing=True)
    running.on_batch(b(100), 1, 0)
    came = {}

    def barrier() -> None:
        came["at"] = time.monotonic()
        running.on_event(unaligned(1))
        running.on_event(END_OF_PARTITION)

    threading.Timer(0.05, barrier).start()
    run(task)
    seen_at_snapshot, inflight = sink.taken[1]
    rest = values(inflight["@in-0-0"])
    other = values(inflight.get("@in-0-1", []))  # 100, if the barrier overtook it
    assert sorted(seen_at_snapshot + rest + other) == sorted([*range(20), 100])
    assert rest == sorted(rest) and rest[-1] == 19  # in order, to the end of the partition
    assert sorted(slow.seen) == sorted([*range(20), 100])
    assert sink.at[1] - came["at"] < 0.1  # not the ~150 ms of processing the rest takes


def test_a_trigger_that_comes_as_a_source_ends_is_taken_unaligned_after_its_chain_finished():
    """The trigger reaches a back-pressured source as its input ends: the snapshot waits for the
    chain to finish (FLIP-147), and then its barrier still overtakes the queued output (it did
    not: it went in order behind it, and the checkpoint waited for the consumers to drain it)."""
    from yarnflow.worker.operators.base import SourceOperator
    from yarnflow.worker.runtime.checkpoints import Mailbox, TriggerCheckpoint
    from yarnflow.worker.elements import MAX_WATERMARK

    class Source(SourceOperator):
        def __init__(self, mailbox: Any) -> None:
            super().__init__("src")
            self.mailbox = mailbox

        def run(self, tick: Any) -> None:
            for i in range(3):
                self.output.collect(b(i))
            self.mailbox.put(TriggerCheckpoint(2, int(time.time() * 1000), True, "", 0))

        def snapshot_state(self, checkpoint_id: int) -> dict[str, pa.Table]:
            return {"seen": pa.table({"v": pa.array([], pa.int64())})}

    partition = ResultPartition(ResultPartitionID("job.out"), 1, capacity=64)
    writer = RecordWriter(partition, Partitioner.FORWARD, [], 1, 1, 10_000, lambda: False)
    sink, mailbox = Sink(), Mailbox()
    task = StreamTask([Source(mailbox)], None, [], [writer], lambda: False, "src", mailbox=mailbox, snapshots=sink,
                      slicing=True)
    run(task)
    _, inflight = sink.taken[2]
    assert values(inflight["@out-0-0"]) == [0, 1, 2, MAX_WATERMARK]
    out = []
    while (e := partition.subpartitions[0].take(0)) is not None:
        out.append(e)
    assert out[0] == unaligned(2, out[0].timestamp_ms)


def test_a_later_checkpoint_finds_the_rest_a_former_one_took_and_completes_at_once():
    """Checkpoint 3 took the finished producers' rest and their ends of partition ahead; the
    task still processes it when checkpoint 4 comes: its in-flight data is what is left of that
    rest, complete at once (the channels will deliver nothing more)."""
    from yarnflow.worker.runtime.checkpoints import TriggerCheckpoint

    from yarnflow.worker.runtime.barriers import DIRECT_GRACE_MS

    gate = InputGate(1, capacity=128)
    slow, sink = Slow(0.01), Sink()
    task = StreamTask([slow], gate, [0], [], lambda: False, "t", snapshots=sink, slicing=True)
    for i in range(80):
        gate.push(0, b(i))
    gate.push(0, END_OF_PARTITION)
    triggered: dict[int, float] = {}

    def trigger(n: int) -> None:
        triggered[n] = time.monotonic()
        task.mailbox.put(TriggerCheckpoint(n, int(time.time() * 1000), True, "", 0))

    threading.Timer(0.05, trigger, (3,)).start()
    threading.Timer(0.3, trigger, (4,)).start()  # 3 took the rest ahead at ~0.25 s
    run(task)
    for n in (3, 4):
        seen, inflight = sink.taken[n]
        rest = values(inflight.get("@in-0-0", []))
        assert seen + rest == list(range(80)) and rest, n  # nothing lost, nothing twice, in order
        assert sink.at[n] - triggered[n] < DIRECT_GRACE_MS / 1000 + 0.05, n
    assert len(sink.taken[4][0]) > len(sink.taken[3][0])


def test_rescaled_in_flight_data_is_read_per_input_and_writer_without_its_watermarks(tmp_path) -> None:
    """A checkpoint dealt to another parallelism (issue 51): ``@rin-`` files are rows to replay
    on a vertex input, ``@rout-`` ones rows to send again through a writer, from every old
    subtask that held them; their watermarks are left out. The task's own (``@in-<input>-<ch>``,
    legacy ``@in-<ch>``, ``@out-<w>-<i>``) stay per channel."""
    import pyarrow.ipc as ipc

    from yarnflow.common.messages import OperatorStateFile, TaskRestore
    from yarnflow.worker.runtime.checkpoints import read_channel_state

    def written(name: str, elements: list) -> OperatorStateFile:
        table, _ = encode_channel_state(elements)
        path = tmp_path / f"{name}.arrow"
        with ipc.new_file(str(path), table.schema) as w:
            w.write_table(table)
        return OperatorStateFile(0, name, str(path), path.stat().st_size)

    files = [written("@rin-1-0-3", [b(1, 2), Watermark(5)]), written("@rin-1-2-0", [b(3)]),
             written("@rout-0-1-2", [Watermark(7), b(4)]), written("@in-0-2", [b(9), Watermark(1)]),
             written("@in-4", [b(8)]), written("@out-1-3", [b(6)])]
    state = read_channel_state(TaskRestore(5, files))
    rows = {k: [r for batch in v for r in batch.column(0).to_pylist()] for k, v in state.rescaled_inputs.items()}
    assert rows == {1: [1, 2, 3]}
    assert [r for batch in state.rescaled_outputs[0] for r in batch.column(0).to_pylist()] == [4]
    assert sorted(state.inputs) == [2, 4] and state.inputs[2][1] == Watermark(1)  # its own: kept as it was
    assert list(state.outputs) == [(1, 3)]


def test_a_keyed_inputs_rescaled_rows_are_kept_by_the_owner_of_their_key_group() -> None:
    from yarnflow.worker.key_assignment import key_groups, operator_index_for_key_groups, own_key_groups

    batch = pa.record_batch({"k": [f"k{i}" for i in range(200)], "v": list(range(200))})
    owners = operator_index_for_key_groups(key_groups(batch, ["k"], 128), 128, 3)
    kept = [own_key_groups(batch, ["k"], 128, 3, i) for i in range(3)]
    assert sorted(v for part in kept for v in part.column("v").to_pylist()) == list(range(200))  # each row once
    for i, part in enumerate(kept):
        assert part.column("v").to_pylist() == [v for v in range(200) if owners[v] == i]
