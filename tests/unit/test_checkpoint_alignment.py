"""Checkpoints in the task runtime (issue 8): barrier alignment (the pure ``BarrierAligner`` and the
StreamTask driving it through a scripted gate), the mailbox trigger at sources and at tasks whose
upstream finished, snapshot writing and reading, and the barrier's wire form. No threads: the
gate hands out a fixed script, the snapshot sink records what the task hands it."""

from __future__ import annotations

import time
from typing import Any, Callable

import pyarrow as pa
import pytest

from tests.harness import wait_until
from yarnflow.common.ids import ResultPartitionID
from yarnflow.common.messages import OperatorStateFile, TaskRestore
from yarnflow.common.states import Partitioner
from yarnflow.worker.operators.base import Operator, RuntimeContext, SourceOperator
from yarnflow.worker.runtime.barriers import BarrierAligner, Decline, Snapshot
from yarnflow.worker.runtime.checkpoints import (
    NotifyCheckpoint,
    SnapshotWriter,
    StateRestoreError,
    TriggerCheckpoint,
    read_task_state,
)
from yarnflow.worker.elements import (
    END_OF_PARTITION,
    CheckpointBarrier,
    EndOfPartition,
    Watermark,
    decode_event,
    encode_event,
)
from yarnflow.worker.network.gate import InputGate
from yarnflow.worker.network.partition import ResultPartition
from yarnflow.worker.runtime.stream_task import StreamTask
from yarnflow.worker.runtime.writer import RecordWriter

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

EO = True  # exactly-once barriers
ALO = False


def b(v: int) -> pa.RecordBatch:
    return pa.record_batch({"v": pa.array([v], pa.int64())})


def barrier(n: int, exactly_once: bool = EO) -> CheckpointBarrier:
    return CheckpointBarrier(n, 1000 + n, exactly_once)


class ScriptedGate:
    """Hands out ``script`` in order; ``on_empty`` runs when it ran dry (e.g. to put mail)."""

    def __init__(self, script: list[tuple[int, Any]], on_poll: Callable[[int], None] = lambda i: None) -> None:
        self.script = list(script)
        self.polls = 0
        self.on_poll = on_poll

    def poll(self, timeout: float | None) -> tuple[int, Any] | None:
        self.on_poll(self.polls)
        self.polls += 1
        return self.script.pop(0) if self.script else None

    def wakeup(self) -> None:
        pass

    def has_priority(self) -> bool:
        return False

    def overtaken_by(self, channel: int, checkpoint_id: int) -> list[Any]:
        return []


class RecordingWriter:
    output_tag = ""
    backpressured_ns = 0  # (it never waits for room)

    def __init__(self, log: list[Any]) -> None:
        self.log = log

    def emit(self, batch: pa.RecordBatch) -> None:
        self.log.extend(("out", v) for v in batch.column("v").to_pylist())

    def emit_watermark(self, watermark: Watermark) -> None:
        pass

    def broadcast_event(self, event: Any) -> None:
        if isinstance(event, CheckpointBarrier):
            self.log.append(("barrier", event.checkpoint_id))

    def flush_if_due(self) -> float | None:
        return None

    def finish(self) -> None:
        self.log.append(("end",))


class Seen(Operator):
    """Passes batches on and keeps every value it saw as its state."""

    def __init__(self, log: list[Any], fail_snapshot: bool = False) -> None:
        super().__init__("seen")
        self.log = log
        self.seen: list[int] = []
        self.fail_snapshot = fail_snapshot
        self.restored: dict[str, pa.Table] | None = None

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        self.seen += batch.column("v").to_pylist()
        self.output.collect(batch)

    def snapshot_state(self, checkpoint_id: int) -> dict[str, pa.Table]:
        if self.fail_snapshot:
            raise RuntimeError("disk full")
        self.log.append(("snapshot", checkpoint_id))
        return {"seen": pa.table({"v": pa.array(self.seen, pa.int64())})}

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        self.restored = state

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.log.append(("complete", checkpoint_id))

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.log.append(("aborted", checkpoint_id))


class RecordingSink:
    """The task's SnapshotSink: what it would write and acknowledge, and what it declined."""

    def __init__(self, log: list[Any]) -> None:
        self.log = log
        self.taken: dict[int, list[dict[str, pa.Table]]] = {}
        self.alignment: dict[int, int] = {}
        self.start_delay: dict[int, int] = {}
        self.declined: dict[int, str] = {}

    def submit(self, checkpoint_id: int, snapshots: list[dict[str, pa.Table]], alignment_ms: int,
               sync_ms: int, start_delay_ms: int = 0) -> None:
        self.taken[checkpoint_id] = snapshots
        self.alignment[checkpoint_id] = alignment_ms
        self.start_delay[checkpoint_id] = start_delay_ms
        self.log.append(("submitted", checkpoint_id))

    def decline(self, checkpoint_id: int, reason: str) -> None:
        self.declined[checkpoint_id] = reason

    def seen(self, checkpoint_id: int) -> list[int]:
        return self.taken[checkpoint_id][0]["seen"].column("v").to_pylist()


def ctx() -> RuntimeContext:
    return RuntimeContext("j", "t", 0, 1, 128, 0, checkpointing=True)


def run_task(script: list[tuple[int, Any]], channels: int = 2, mails: list[Any] = (),  # type: ignore[assignment]
             on_poll: Callable[[int], None] | None = None, channel_inputs: list[int] | None = None,
             **op_args: Any) -> tuple[list[Any], RecordingSink, Seen, StreamTask]:
    log: list[Any] = []
    op = Seen(log, **op_args)
    sink = RecordingSink(log)
    gate = ScriptedGate(script)
    st = StreamTask([op], gate, channel_inputs or [0] * channels, [RecordingWriter(log)],  # type: ignore[list-item]
                    lambda: False, "task", snapshots=sink)
    if on_poll is not None:
        gate.on_poll = on_poll
    for mail in mails:
        st.mailbox.put(mail)
    st.wire(lambda _: ctx())
    st.invoke()
    return log, sink, op, st


def outputs(log: list[Any]) -> list[Any]:
    return [e for e in log if e[0] in ("out", "barrier", "snapshot", "end")]


# -- the aligner ------------------------------------------------------------------------------

def test_aligner_exactly_once_blocks_until_every_channel_delivered_the_barrier() -> None:
    now = [10.0]
    a = BarrierAligner(3, clock=lambda: now[0])
    assert a.on_barrier(0, barrier(1)) == []
    assert a.is_blocked(0) and not a.is_blocked(1)
    now[0] = 10.25
    assert a.on_barrier(2, barrier(1)) == []
    now[0] = 10.5
    assert a.on_barrier(1, barrier(1)) == [Snapshot(barrier(1), 500)]  # alignment: first barrier to last
    assert not any(a.is_blocked(ch) for ch in range(3))
    assert a.on_barrier(0, barrier(1)) == []  # stale


def test_aligner_at_least_once_blocks_nothing() -> None:
    a = BarrierAligner(2, clock=lambda: 0.0)
    assert a.on_barrier(0, barrier(1, ALO)) == []
    assert not a.is_blocked(0)
    assert a.on_barrier(1, barrier(1, ALO)) == [Snapshot(barrier(1, ALO), 0)]


def test_aligner_newer_barrier_declines_the_older_and_ended_channels_count_as_aligned() -> None:
    a = BarrierAligner(3, clock=lambda: 0.0)
    a.on_barrier(0, barrier(1))
    [decline] = a.on_barrier(1, barrier(2))
    assert isinstance(decline, Decline) and decline.checkpoint_id == 1 and "superseded" in decline.reason
    assert not a.is_blocked(0) and a.is_blocked(1)
    assert a.on_barrier(0, barrier(1)) == []  # the declined one is stale now
    assert a.on_end_of_partition(2) == []
    assert a.on_barrier(0, barrier(2)) == [Snapshot(barrier(2), 0)]


def test_aligner_trigger_completes_when_every_channel_ended() -> None:
    a = BarrierAligner(2, clock=lambda: 0.0)
    a.on_end_of_partition(0)
    assert a.on_trigger(barrier(4)) == []
    assert a.on_end_of_partition(1) == [Snapshot(barrier(4), 0, at_end=True)]  # the cut is the end of input
    both_ended = BarrierAligner(1, clock=lambda: 0.0)
    both_ended.on_end_of_partition(0)
    assert both_ended.on_trigger(barrier(5)) == [Snapshot(barrier(5), 0, at_end=True)]
    # a trigger whose barrier a channel still delivers: the cut is that barrier
    mixed = BarrierAligner(2, clock=lambda: 0.0)
    assert mixed.on_trigger(barrier(6)) == []
    assert mixed.on_end_of_partition(0) == []
    assert mixed.on_barrier(1, barrier(6)) == [Snapshot(barrier(6), 0, at_end=False)]


# -- the StreamTask ---------------------------------------------------------------------------

def test_exactly_once_holds_back_blocked_channels_and_replays_them_in_order() -> None:
    log, sink, op, _ = run_task([(0, b(1)), (0, barrier(1)), (0, b(2)), (1, b(3)), (0, b(4)),
                                 (1, barrier(1)), (1, b(5)), (0, END_OF_PARTITION), (1, END_OF_PARTITION)])
    assert sink.seen(1) == [1, 3]  # 2 and 4 came after channel 0's barrier
    assert outputs(log) == [("out", 1), ("out", 3), ("snapshot", 1), ("barrier", 1), ("out", 2), ("out", 4),
                            ("out", 5), ("end",)]
    assert sink.declined == {}


def test_the_start_delay_is_the_wait_for_the_first_barrier_not_the_alignment() -> None:
    """Flink's start delay: from the trigger to the first barrier at the task. A barrier
    triggered 300 ms ago whose second channel comes 200 ms after the first: ~300, not ~500."""
    now = int(time.time() * 1000)
    late = CheckpointBarrier(1, now - 300, EO)
    _, sink, _, _ = run_task([(0, late), (1, b(1)), (1, late), (0, END_OF_PARTITION), (1, END_OF_PARTITION)],
                             on_poll=lambda i: time.sleep(0.2) if i == 2 else None)
    assert sink.alignment[1] >= 190
    assert 295 <= sink.start_delay[1] < 450, sink.start_delay


def test_at_least_once_processes_everything_and_snapshots_at_the_last_barrier() -> None:
    log, sink, _, _ = run_task([(0, b(1)), (0, barrier(1, ALO)), (0, b(2)), (1, b(3)), (0, b(4)),
                                (1, barrier(1, ALO)), (1, b(5)), (0, END_OF_PARTITION), (1, END_OF_PARTITION)])
    assert sink.seen(1) == [1, 2, 3, 4]
    assert outputs(log) == [("out", 1), ("out", 2), ("out", 3), ("out", 4), ("snapshot", 1), ("barrier", 1),
                            ("out", 5), ("end",)]


def test_a_newer_barrier_declines_the_older_and_is_aligned_instead() -> None:
    log, sink, _, _ = run_task([(0, barrier(1)), (0, b(2)), (1, barrier(2)), (1, b(3)), (0, barrier(2)),
                                (0, b(4)), (0, END_OF_PARTITION), (1, END_OF_PARTITION)])
    assert set(sink.declined) == {1} and "superseded" in sink.declined[1]
    assert sink.seen(2) == [2]
    assert outputs(log) == [("out", 2), ("snapshot", 2), ("barrier", 2), ("out", 3), ("out", 4), ("end",)]


def test_a_channel_that_ended_counts_as_aligned() -> None:
    log, sink, _, _ = run_task([(0, barrier(1)), (0, b(1)), (1, b(2)), (1, END_OF_PARTITION),
                                (0, END_OF_PARTITION)])
    assert sink.seen(1) == [2]
    assert outputs(log) == [("out", 2), ("snapshot", 1), ("barrier", 1), ("out", 1), ("end",)]


def test_alignment_spans_both_inputs_of_a_two_input_task() -> None:
    log, sink, _, _ = run_task([(0, barrier(3)), (0, b(1)), (1, b(2)), (1, barrier(3)),
                                (0, END_OF_PARTITION), (1, END_OF_PARTITION)], channel_inputs=[0, 1])
    assert sink.seen(3) == [2]
    assert outputs(log)[:3] == [("out", 2), ("snapshot", 3), ("barrier", 3)]


def test_a_trigger_through_the_mailbox_waits_until_every_input_ended() -> None:
    log, sink, _, _ = run_task([(0, b(1)), (1, END_OF_PARTITION), (0, b(2)), (0, END_OF_PARTITION)],
                               mails=[TriggerCheckpoint(7, 1, True)])
    assert sink.seen(7) == [1, 2]
    assert outputs(log) == [("out", 1), ("out", 2), ("snapshot", 7), ("barrier", 7), ("end",)]


def test_notifications_run_the_operators_hooks_between_elements() -> None:
    def mail(i: int) -> None:
        if i == 1:
            st_box[0].mailbox.put(NotifyCheckpoint(3, complete=True))
            st_box[0].mailbox.put(NotifyCheckpoint(4, complete=False))

    st_box: list[StreamTask] = []
    log: list[Any] = []
    op = Seen(log)
    gate = ScriptedGate([(0, b(1)), (0, b(2)), (0, END_OF_PARTITION)], mail)
    st = StreamTask([op], gate, [0], [RecordingWriter(log)], lambda: False, "t",  # type: ignore[list-item,arg-type]
                    snapshots=RecordingSink(log))
    st_box.append(st)
    st.wire(lambda _: ctx())
    st.invoke()
    # put while the gate handed out element 2: taken right after it, before the next poll
    assert log == [("out", 1), ("out", 2), ("complete", 3), ("aborted", 4), ("end",)]


def test_mail_wakes_a_task_waiting_on_its_gate() -> None:
    log: list[Any] = []
    gate = InputGate(1, 4)
    st = StreamTask([Seen(log)], gate, [0], [RecordingWriter(log)], lambda: False, "t")  # type: ignore[list-item]
    st.mailbox.put(NotifyCheckpoint(1, complete=True))
    started = time.monotonic()
    assert gate.poll(5.0) is None
    assert time.monotonic() - started < 4.0  # woken by the mail, not by its timeout
    gate.push(0, b(1))
    assert gate.poll(5.0) == (0, b(1))  # woken once, then polls as before


def test_a_failed_snapshot_declines_but_still_forwards_the_barrier() -> None:
    log, sink, _, _ = run_task([(0, barrier(1)), (0, b(1)), (0, END_OF_PARTITION)], channels=1, fail_snapshot=True)
    assert "disk full" in sink.declined[1] and 1 not in sink.taken
    assert outputs(log) == [("barrier", 1), ("out", 1), ("end",)]


class CountingSource(SourceOperator):
    bounded = True

    def __init__(self, n: int, on_batch: Callable[[int], None], log: list[Any] | None = None) -> None:
        super().__init__("counter")
        self.n, self.on_batch, self.emitted = n, on_batch, 0
        self.log = log if log is not None else []

    def run(self, cancelled: Callable[[], bool]) -> None:
        for i in range(self.n):
            if cancelled():
                return
            self.output.collect(b(i))
            self.emitted += 1
            self.on_batch(i)

    def snapshot_state(self, checkpoint_id: int) -> dict[str, pa.Table]:
        self.log.append(("snapshot", checkpoint_id))
        return {"offset": pa.table({"emitted": [self.emitted]})}


def test_a_source_takes_a_triggered_snapshot_at_its_next_tick() -> None:
    log: list[Any] = []
    sink = RecordingSink(log)

    def on_batch(i: int) -> None:
        if i == 1:
            st.mailbox.put(TriggerCheckpoint(1, 5, True))

    src = CountingSource(4, on_batch, log)
    st = StreamTask([src], None, [], [RecordingWriter(log)], lambda: False, "src",  # type: ignore[list-item]
                    snapshots=sink)
    st.wire(lambda _: ctx())
    st.invoke()
    assert sink.taken[1][0]["offset"].to_pylist() == [{"emitted": 2}]
    assert outputs(log) == [("out", 0), ("out", 1), ("snapshot", 1), ("barrier", 1), ("out", 2), ("out", 3),
                            ("end",)]
    assert st.last_barrier_id == 1 and ("submitted", 1) in log


class TwoPhase(Seen):
    """Seen, as a two-phase sink: it needs a final checkpoint after the end of input."""

    @property
    def needs_final_checkpoint(self) -> bool:
        return True

    def finish(self) -> None:
        self.log.append(("finished",))


def test_a_two_phase_sink_keeps_its_task_running_until_a_final_checkpoint_completes() -> None:
    import threading

    log: list[Any] = []
    sink = RecordingSink(log)
    op = TwoPhase(log)
    st = StreamTask([op], ScriptedGate([(0, b(1)), (0, END_OF_PARTITION)]), [0],  # type: ignore[arg-type]
                    [RecordingWriter(log)], lambda: False, "sink", snapshots=sink)  # type: ignore[list-item]
    st.wire(lambda _: ctx())
    st.mailbox.put(NotifyCheckpoint(1, complete=True))  # an older checkpoint completing does not end it
    runner = threading.Thread(target=st.invoke)
    runner.start()
    wait_until(lambda: ("complete", 1) in log and ("finished",) in log, 5, "the chain never finished")
    assert runner.is_alive() and ("end",) not in log  # waiting for a checkpoint taken from now on
    st.mailbox.put(TriggerCheckpoint(2, 5, True))  # direct trigger: its upstream finished
    wait_until(lambda: 2 in sink.taken, 5, "the direct trigger was never snapshotted")
    assert runner.is_alive() and sink.seen(2) == [1]
    st.mailbox.put(NotifyCheckpoint(2, complete=False))  # aborted: it waits for the next one
    st.mailbox.put(TriggerCheckpoint(3, 6, True))
    wait_until(lambda: 3 in sink.taken and ("aborted", 2) in log, 5, "checkpoint 3 was never snapshotted")
    assert runner.is_alive() and ("end",) not in log
    st.mailbox.put(NotifyCheckpoint(3, complete=True))
    runner.join(5)
    assert not runner.is_alive()
    assert outputs(log)[-3:] == [("snapshot", 3), ("barrier", 3), ("end",)]  # partitions end last
    assert log.index(("complete", 3)) < log.index(("end",))


def test_a_direct_trigger_before_the_input_ends_is_taken_after_the_chain_finished() -> None:
    # the JobMaster triggers a task as soon as its upstream finished; that checkpoint covers the
    # end of the input, so a two-phase sink commits its last rows with it and needs no other
    import threading

    log: list[Any] = []
    sink = RecordingSink(log)
    st = StreamTask([TwoPhase(log)], ScriptedGate([(0, b(1)), (0, b(2)), (0, END_OF_PARTITION)]), [0],  # type: ignore[arg-type]
                    [RecordingWriter(log)], lambda: False, "sink", snapshots=sink)  # type: ignore[list-item]
    st.wire(lambda _: ctx())
    st.mailbox.put(TriggerCheckpoint(4, 5, True))
    runner = threading.Thread(target=st.invoke)
    runner.start()
    wait_until(lambda: 4 in sink.taken, 5, "the direct trigger was never snapshotted")
    assert log.index(("finished",)) < log.index(("snapshot", 4))
    st.mailbox.put(NotifyCheckpoint(4, complete=True))
    runner.join(5)
    assert not runner.is_alive() and sink.seen(4) == [1, 2]


def test_a_task_waiting_for_its_final_checkpoint_can_be_cancelled() -> None:
    import threading

    log: list[Any] = []
    cancelled = threading.Event()
    st = StreamTask([TwoPhase(log)], ScriptedGate([(0, END_OF_PARTITION)]), [0],  # type: ignore[arg-type]
                    [RecordingWriter(log)], cancelled.is_set, "sink", snapshots=RecordingSink(log))  # type: ignore[list-item]
    st.wire(lambda _: ctx())
    errors: list[BaseException] = []
    runner = threading.Thread(target=lambda: _capture(st.invoke, errors))
    runner.start()
    wait_until(lambda: ("finished",) in log, 5, "the chain never finished")  # it waits for a final checkpoint now
    cancelled.set()
    runner.join(5)
    assert not runner.is_alive() and "cancelled" in str(errors[0]) and ("end",) not in log


def _capture(fn: Callable[[], None], errors: list[BaseException]) -> None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001
        errors.append(exc)


def test_a_task_restored_as_finished_emits_nothing() -> None:
    log: list[Any] = []
    sink = RecordingSink(log)
    src = CountingSource(3, lambda i: None)
    st = StreamTask([src], None, [], [RecordingWriter(log)], lambda: False, "src",  # type: ignore[list-item]
                    snapshots=sink, restored_finished=True)
    st.wire(lambda _: ctx())
    st.invoke()
    assert log == [("end",)]
    gate = ScriptedGate([(0, b(1)), (0, barrier(2)), (0, END_OF_PARTITION)])
    log2: list[Any] = []
    sink2 = RecordingSink(log2)
    st2 = StreamTask([Seen(log2)], gate, [0], [RecordingWriter(log2)], lambda: False, "t",  # type: ignore[list-item,arg-type]
                     snapshots=sink2, restored_finished=True)
    st2.wire(lambda _: ctx())
    st2.invoke()
    assert log2 == [("end",)] and set(sink2.declined) == {2}


# -- writing and reading state ----------------------------------------------------------------

class NoResponder:
    def acknowledge(self, checkpoint_id: int, snapshot: Any) -> None:
        raise AssertionError("not used")

    def decline(self, checkpoint_id: int, reason: str) -> None:
        raise AssertionError("not used")


def test_snapshot_files_round_trip_through_restore(tmp_path: Any) -> None:
    writer = SnapshotWriter(f"file://{tmp_path}/job", "v1", 2, 3, NoResponder(), "t")
    t = pa.table({"k": ["a", "b"], "n": [1, 2]})
    files = writer.write_files(5, [{}, {"keyed": t, "timers": t.slice(0, 1)}])
    assert [(f.operator_index, f.name) for f in files] == [(1, "keyed"), (1, "timers")]
    assert files[0].path == f"file://{tmp_path}/job/chk-5/v1-2-3/op1-keyed.arrow"
    assert (tmp_path / "job" / "chk-5" / "v1-2-3" / "op1-timers.arrow").stat().st_size == files[1].size_bytes > 0
    state = read_task_state(TaskRestore(5, files), 3)
    assert state[0] == {} and state[2] == {}
    assert state[1]["keyed"].equals(t) and state[1]["timers"].num_rows == 1
    assert writer.write_files(6, [{}, {}]) == []  # nothing to write, nothing written


def test_an_unreadable_state_file_is_named(tmp_path: Any) -> None:
    bad = tmp_path / "op0-x.arrow"
    bad.write_bytes(b"not arrow")
    with pytest.raises(StateRestoreError, match="op0-x.arrow"):
        read_task_state(TaskRestore(1, [OperatorStateFile(0, "x", str(bad))]), 1)
    with pytest.raises(StateRestoreError, match="missing.arrow"):
        read_task_state(TaskRestore(1, [OperatorStateFile(0, "x", str(tmp_path / "missing.arrow"))]), 1)


# -- the barrier on the wire ------------------------------------------------------------------

@pytest.mark.parametrize("event", [CheckpointBarrier(1, 0, True), CheckpointBarrier(2**62, 1_700_000_000_000, False)])
def test_barrier_encode_decode(event: CheckpointBarrier) -> None:
    assert decode_event(encode_event(event)) == event
    with pytest.raises(ValueError, match="malformed"):
        decode_event(b"B1:2")


def test_the_writer_flushes_buffered_data_before_a_barrier_on_every_subpartition() -> None:
    partition = ResultPartition(ResultPartitionID("job.p0"), 2, 100)
    w = RecordWriter(partition, Partitioner.REBALANCE, [], 128, 1000, 10_000, lambda: False)
    w.emit(b(1))
    w.emit(b(2))
    w.broadcast_event(barrier(1))
    w.finish()
    for sub in partition.subpartitions:
        got = []
        while (el := sub.take(0)) is not None:
            got.append(el)
        assert isinstance(got[0], pa.RecordBatch) and got[1:] == [barrier(1), END_OF_PARTITION]
        assert isinstance(got[-1], EndOfPartition)


def test_a_stop_barrier_keeps_its_mode_on_the_wire() -> None:
    for stop in ("", "stop", "drain"):
        barrier = CheckpointBarrier(7, 123, True, stop)
        assert decode_event(encode_event(barrier)) == barrier
    with pytest.raises(ValueError, match="malformed checkpoint barrier"):
        decode_event(b"B7:123:1:halt")


def test_a_direct_trigger_whose_barrier_came_from_upstream_is_taken_at_that_barrier() -> None:
    """The JobMaster triggers a task directly once its upstream finished; if the upstream had
    snapshotted that checkpoint before it finished, its barrier is in the channel: the snapshot is
    taken there (a consistent cut with the upstream's position), not after the chain finished,
    which would put rows the upstream replays after a restore into it twice (a Spark stage's
    STREAMING test saw that)."""
    import threading

    log: list[Any] = []
    sink = RecordingSink(log)
    st = StreamTask([TwoPhase(log)], ScriptedGate([(0, b(1)), (0, barrier(4)), (0, b(2)), (0, END_OF_PARTITION)]),
                    [0], [RecordingWriter(log)], lambda: False, "sink", snapshots=sink)  # type: ignore[arg-type,list-item]
    st.wire(lambda _: ctx())
    st.mailbox.put(TriggerCheckpoint(4, 5, True))  # the direct trigger comes first
    runner = threading.Thread(target=st.invoke)
    runner.start()
    wait_until(lambda: 4 in sink.taken, 5, "checkpoint 4 was never snapshotted")
    assert sink.seen(4) == [1]  # at the barrier: the row after it is not in checkpoint 4
    assert log.index(("snapshot", 4)) < log.index(("finished",))
    st.mailbox.put(NotifyCheckpoint(4, complete=True))  # taken before the end: not the final one
    wait_until(lambda: ("complete", 4) in log, 5, "checkpoint 4 never completed")
    assert runner.is_alive()
    st.mailbox.put(TriggerCheckpoint(5, 6, True))
    wait_until(lambda: 5 in sink.taken, 5, "the final checkpoint was never snapshotted")
    st.mailbox.put(NotifyCheckpoint(5, complete=True))
    runner.join(5)
    assert not runner.is_alive() and sink.seen(5) == [1, 2]
