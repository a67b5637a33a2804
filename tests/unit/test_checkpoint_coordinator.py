"""The CheckpointCoordinator core with a manual clock and timers: trigger, acknowledgement,
completion, timeout, decline, max concurrent, min pause, subsumption, retention and tolerable
failures."""

from __future__ import annotations

from typing import Any

import pytest

from yarnflow.am.checkpoint.coordinator import (
    CheckpointCoordinator,
    CheckpointFailureReason,
    CheckpointPlan,
    CheckpointSettings,
    CheckpointStatus,
    DiscardCheckpoint,
    FailJobOnCheckpoints,
    FinalizeCheckpoint,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    TriggerCheckpoint,
)
from yarnflow.common.clock import ManualClock, ManualTimerService
from yarnflow.common.ids import ExecutionAttemptID

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

SRC, MAP, SINK = ExecutionAttemptID("src"), ExecutionAttemptID("map"), ExecutionAttemptID("sink")
ALL = frozenset({SRC, MAP, SINK})


class Driver:
    def __init__(self, **settings: Any) -> None:
        self.clock = ManualClock(10_000)
        self.timers = ManualTimerService(self.clock)
        self.running = True
        self.acknowledge_set = ALL
        self.coordinator = CheckpointCoordinator(
            CheckpointSettings(**{"interval_ms": 1000, "timeout_ms": 5000, **settings}), self.clock, self.timers,
            lambda: CheckpointPlan((SRC,), self.acknowledge_set) if self.running else None)
        self.actions: list[Any] = []

    def drain(self) -> list[Any]:
        new = self.coordinator.drain_actions()
        self.actions.extend(new)
        return new

    def advance(self, ms: int) -> list[Any]:
        self.timers.advance(ms)
        return self.drain()

    def of(self, kind: type, actions: list[Any] | None = None) -> list[Any]:
        return [a for a in (self.actions if actions is None else actions) if isinstance(a, kind)]

    def ack_all(self, checkpoint_id: int, tasks: frozenset[ExecutionAttemptID] = ALL) -> list[Any]:
        for t in sorted(tasks):
            self.coordinator.acknowledge(checkpoint_id, t, f"handle-{checkpoint_id}-{t}", state_size=10)
        return self.drain()

    def complete(self, checkpoint_id: int) -> list[Any]:
        self.ack_all(checkpoint_id)
        self.coordinator.metadata_written(checkpoint_id)
        return self.drain()


def test_periodic_trigger_at_the_sources_then_completion_and_notify() -> None:
    d = Driver()
    d.coordinator.start()
    assert not d.advance(999)
    (trigger,) = d.of(TriggerCheckpoint, d.advance(1))
    assert trigger.tasks == (SRC,) and trigger.exactly_once and trigger.checkpoint_id == 1
    out = d.ack_all(1)
    (finalize,) = d.of(FinalizeCheckpoint, out)
    assert set(finalize.state_handles) == ALL               # metadata written only after every ack
    assert d.coordinator.pending[1].status == CheckpointStatus.FINALIZING
    d.clock.advance(30)
    d.coordinator.metadata_written(1)
    (notify,) = d.of(NotifyCheckpointComplete, d.drain())
    assert set(notify.tasks) == ALL
    latest = d.coordinator.latest_completed
    assert latest is not None and latest.checkpoint_id == 1 and latest.state_size == 30 and latest.duration_ms == 30


def test_an_acknowledgement_of_an_unknown_or_finished_checkpoint_is_ignored() -> None:
    d = Driver()
    assert d.coordinator.trigger() == 1
    assert d.coordinator.acknowledge(1, SRC, "h")
    assert not d.coordinator.acknowledge(1, SRC, "h")        # duplicate
    assert not d.coordinator.acknowledge(7, SRC, "h")        # unknown
    assert not d.coordinator.acknowledge(1, ExecutionAttemptID("other"), "h")
    assert not d.of(FinalizeCheckpoint, d.drain())


def test_a_checkpoint_not_acknowledged_in_time_expires_and_counts_as_a_failure() -> None:
    d = Driver(tolerable_failures=1)
    d.coordinator.trigger()
    d.coordinator.acknowledge(1, SRC, "h")
    d.drain()
    d.advance(4_999)
    assert 1 in d.coordinator.pending
    out = d.advance(1)
    assert 1 not in d.coordinator.pending
    assert d.coordinator.history[0].failure == CheckpointFailureReason.EXPIRED
    assert "2 tasks had not acknowledged" in d.coordinator.history[0].failure_detail
    assert d.of(NotifyCheckpointAborted, out) and d.of(DiscardCheckpoint, out)
    assert not d.of(FailJobOnCheckpoints, out)                 # one failure tolerated
    d.coordinator.trigger()
    d.advance(5_000)
    (fail,) = d.of(FailJobOnCheckpoints)
    assert "2 checkpoints failed in a row" in fail.reason and "tolerable-failed-checkpoints (1)" in fail.reason
    assert set(fail.culprits) == {SRC, MAP, SINK}  # (none acknowledged the second): their regions fail over
    assert d.coordinator.consecutive_failures == 0  # the failover starts the count again


def test_a_decline_aborts_and_a_completion_resets_the_failure_count() -> None:
    d = Driver(tolerable_failures=1)
    d.coordinator.trigger()
    d.coordinator.decline(1, MAP, "state too large")
    d.drain()
    assert d.coordinator.consecutive_failures == 1
    d.coordinator.trigger()
    d.complete(2)
    assert d.coordinator.consecutive_failures == 0
    d.coordinator.trigger()
    d.coordinator.decline(3, MAP, "again")
    assert not d.of(FailJobOnCheckpoints, d.drain())


def test_task_failures_abort_pending_checkpoints_without_failing_the_job() -> None:
    d = Driver(tolerable_failures=0, max_concurrent=3)
    d.coordinator.trigger()
    d.coordinator.trigger()
    d.coordinator.task_failed()
    out = d.drain()
    assert not d.coordinator.pending
    assert len(d.of(NotifyCheckpointAborted, out)) == 2 and not d.of(FailJobOnCheckpoints, out)


def test_max_concurrent_checkpoints_is_respected() -> None:
    d = Driver(max_concurrent=2)
    assert d.coordinator.trigger() == 1
    assert d.coordinator.trigger() == 2
    assert d.coordinator.trigger() is None
    d.complete(1)
    assert d.coordinator.trigger() == 3


def test_a_savepoint_ignores_max_concurrent_and_min_pause() -> None:
    d = Driver(max_concurrent=1, min_pause_ms=500)
    assert d.coordinator.trigger() == 1
    assert d.coordinator.trigger() is None
    assert d.coordinator.trigger(savepoint=True) == 2  # a user asked: it does not wait for the periodic one
    d.complete(2)
    assert d.coordinator.trigger() is None  # min pause after the savepoint
    assert d.coordinator.trigger(savepoint=True) == 3


def test_min_pause_counts_from_the_end_of_the_last_checkpoint() -> None:
    d = Driver(min_pause_ms=500)
    d.coordinator.trigger()
    d.clock.advance(200)
    d.complete(1)
    d.clock.advance(499)
    assert d.coordinator.trigger() is None
    d.clock.advance(1)
    assert d.coordinator.trigger() == 2


def test_min_pause_counts_from_the_last_completed_checkpoint_not_a_failed_one() -> None:
    """Flink's CheckpointRequestDecider (issue 51): a declined or expired checkpoint does not
    delay the next one; the pause follows the last checkpoint that completed."""
    d = Driver(min_pause_ms=500, max_concurrent=2)
    d.coordinator.trigger()
    d.complete(1)
    d.clock.advance(500)
    assert d.coordinator.trigger() == 2
    d.clock.advance(100)
    d.coordinator.decline(2, MAP, "state too large")  # failed 600 ms after checkpoint 1 completed
    d.drain()
    assert d.coordinator.trigger() == 3  # not 500 ms after the failure


def test_a_completed_checkpoint_subsumes_older_pending_ones() -> None:
    d = Driver(max_concurrent=3)
    d.coordinator.trigger()
    d.coordinator.trigger()
    d.complete(2)
    assert 1 not in d.coordinator.pending
    assert d.coordinator.history[0].failure == CheckpointFailureReason.SUBSUMED
    assert d.coordinator.consecutive_failures == 0             # subsumption is no failure


def test_only_num_retained_completed_checkpoints_are_kept() -> None:
    d = Driver(num_retained=2)
    for i in range(1, 5):
        assert d.coordinator.trigger() == i
        d.complete(i)
    assert list(d.coordinator.retained_ids()) == [3, 4]
    assert sorted(a.checkpoint_id for a in d.of(DiscardCheckpoint)) == [1, 2]


def test_a_long_running_job_keeps_the_latest_statistics_and_no_state_handles_but_counts_all() -> None:
    """Every checkpoint's statistics and state handles were kept for the job's life (an
    AppMaster of a job checkpointing every second grew without bound); now the latest
    HISTORY_KEPT are, without their handles, and the counts cover all."""
    from yarnflow.am.checkpoint.coordinator import HISTORY_KEPT

    d = Driver(num_retained=1, tolerable_failures=10_000)
    for i in range(1, HISTORY_KEPT + 51):
        assert d.coordinator.trigger() == i
        if i % 10 == 0:
            d.coordinator.decline(i, SRC, "no")
            d.drain()
        else:
            d.complete(i)
    history = d.coordinator.history
    assert len(history) == HISTORY_KEPT and history[-1].checkpoint_id == HISTORY_KEPT + 50
    assert all(not s.acknowledged for s in history)  # the handles went with the actions
    assert d.coordinator.counts() == (135, 15, 0)
    done = history[-2]
    assert len(done.acks) == len(ALL) and all(a.state_size == 10 for a in done.acks.values())
    assert d.coordinator.trigger() == HISTORY_KEPT + 51
    assert d.coordinator.counts() == (135, 15, 1)


def test_no_trigger_while_not_every_task_runs_and_ids_keep_counting_after() -> None:
    d = Driver()
    d.running = False
    d.coordinator.start()
    assert not d.of(TriggerCheckpoint, d.advance(3_000))
    d.running = True
    (trigger,) = d.of(TriggerCheckpoint, d.advance(1_000))
    assert trigger.checkpoint_id == 1


def test_metadata_that_fails_to_write_aborts_the_checkpoint() -> None:
    d = Driver(tolerable_failures=5)
    d.coordinator.trigger()
    d.ack_all(1)
    d.coordinator.metadata_failed(1, "disk full")
    d.drain()
    assert d.coordinator.latest_completed is None
    assert d.coordinator.history[0].failure == CheckpointFailureReason.FINALIZE_FAILED


def test_stop_aborts_pending_and_triggers_no_more() -> None:
    d = Driver()
    d.coordinator.start()
    d.advance(1_000)
    d.coordinator.stop()
    d.drain()
    assert not d.coordinator.pending
    assert not d.of(TriggerCheckpoint, d.advance(5_000))


def test_a_decline_of_a_superseded_checkpoint_is_not_a_failure() -> None:
    d = Driver(max_concurrent=2, tolerable_failures=0)
    d.coordinator.trigger()
    d.coordinator.trigger()
    d.coordinator.decline(1, MAP, "a newer barrier arrived first")
    out = d.drain()
    assert not d.of(FailJobOnCheckpoints, out)
    assert d.coordinator.history[0].failure == CheckpointFailureReason.SUBSUMED


def test_a_task_that_finished_counts_as_acknowledged() -> None:
    d = Driver()
    d.coordinator.trigger()
    d.coordinator.acknowledge_finished(SRC, "finished")
    d.coordinator.acknowledge(1, MAP, "h")
    d.coordinator.acknowledge(1, SINK, "h")
    (finalize,) = d.of(FinalizeCheckpoint, d.drain())
    assert finalize.state_handles[SRC] == "finished"


def test_a_trigger_that_cannot_reach_a_task_aborts_without_counting() -> None:
    d = Driver(tolerable_failures=0)
    d.coordinator.trigger()
    d.coordinator.trigger_failed(1, SRC, "connection refused")
    out = d.drain()
    assert not d.coordinator.pending and not d.of(FailJobOnCheckpoints, out)
    assert d.coordinator.history[0].failure == CheckpointFailureReason.TASK_NOT_REACHED


def test_a_stop_with_savepoint_holds_every_other_checkpoint_until_it_ends() -> None:
    from yarnflow.am.checkpoint.coordinator import TriggerCheckpoint

    d = Driver(tolerable_failures=0)
    assert d.coordinator.trigger(savepoint=True, stop="stop") == 1
    (trigger,) = d.of(TriggerCheckpoint, d.drain())
    assert trigger.stop == "stop"  # the sources stop after their snapshot
    assert d.coordinator.trigger() is None and d.coordinator.trigger(savepoint=True) is None
    d.advance(1000)
    assert d.of(TriggerCheckpoint, d.drain()) == []  # nor periodic ones
    d.ack_all(1)
    d.coordinator.metadata_failed(1, "savepoint folder not writable")
    assert d.of(FailJobOnCheckpoints, d.drain()) == []  # a failed savepoint does not fail the job
    assert d.coordinator.stopping is None and d.coordinator.trigger() == 2  # the job runs on


def test_a_failed_stop_savepoint_lets_periodic_checkpoints_go_on_after_a_restart() -> None:
    d = Driver()
    d.coordinator.start()
    assert d.coordinator.trigger(savepoint=True, stop="drain") == 1
    d.coordinator.stop()  # the tasks failed on the abort: the job restarts
    d.drain()
    d.coordinator.start()
    assert d.coordinator.trigger() == 2


def test_a_checkpoint_the_jobs_clean_end_overtook_is_no_failure_and_leaves_no_entry() -> None:
    """A job that finished cleanly showed "Failed 1": the checkpoint pending at its end (issue 55).
    A restart or a failure still counts what it aborted."""
    d = Driver()
    d.coordinator.start()
    d.advance(1000)
    d.complete(1)
    d.advance(1000)
    assert 2 in d.coordinator.pending
    d.coordinator.stop(finished=True)
    assert d.coordinator.counts() == (1, 0, 0)
    assert [s.checkpoint_id for s in d.coordinator.history] == [1]
    assert d.of(NotifyCheckpointAborted, d.drain())  # its tasks are still told, its files dropped
    other = Driver()
    other.coordinator.start()
    other.advance(1000)
    other.coordinator.stop()  # ended otherwise, or restarting
    assert other.coordinator.counts() == (0, 1, 0) and len(other.coordinator.history) == 1


def test_subtasks_finished_before_a_checkpoint_count_as_acknowledged_among_all_of_the_jobs() -> None:
    """It showed 2/2 acknowledged of a job of 4 subtasks, two of them finished (issue 55)."""
    d = Driver()
    d.coordinator._plan = lambda: CheckpointPlan((MAP,), frozenset({MAP, SINK}), finished=2)
    assert d.coordinator.trigger() == 1
    stats = d.coordinator.pending[1]
    assert (stats.num_acknowledged, stats.num_subtasks) == (2, 4)
    d.coordinator.acknowledge(1, MAP, "h")
    assert (stats.num_acknowledged, stats.num_subtasks) == (3, 4)


def test_an_in_progress_checkpoint_shows_how_long_it_has_been_under_way() -> None:
    """It showed "Duration 0 ms" 30 s after it was triggered (issue 55)."""
    d = Driver()
    assert d.coordinator.trigger() == 1
    d.clock.advance(30_000)
    stats = d.coordinator.pending[1]
    assert stats.duration_ms == 0 and d.coordinator.elapsed_ms(stats) == 30_000
    d.ack_all(1)
    d.coordinator.metadata_written(1)
    assert d.coordinator.elapsed_ms(stats) == stats.duration_ms == 30_000


def test_a_jobs_deleted_checkpoints_are_marked_discarded() -> None:
    d = Driver(num_retained=1)
    d.coordinator.start()
    for i in (1, 2):
        d.advance(1000)
        d.complete(i)
    first, second = d.coordinator.history
    assert first.discarded and not second.discarded  # subsumed by retention
    d.coordinator.discard_retained()  # the job ended and its folder goes (cancelled, finished)
    assert second.discarded


def test_a_recovered_checkpoints_duration_is_not_the_time_since_1970() -> None:
    """A checkpoint taken over from an earlier leader has no trigger time here: it showed a
    duration of 56 years in the summary (issue 55)."""
    d = Driver()
    d.coordinator.add_recovered(7, state_size=10)
    [stats] = d.coordinator.history
    assert d.coordinator.elapsed_ms(stats) == 0


def test_a_savepoint_is_not_discarded_with_the_jobs_checkpoints() -> None:
    d = Driver()
    d.coordinator.start()
    d.advance(1000)
    d.complete(1)
    savepoint = d.coordinator.trigger(savepoint=True)
    d.complete(savepoint)
    d.coordinator.discard_retained()
    discarded = {s.checkpoint_id: s.discarded for s in d.coordinator.history}
    assert discarded == {1: True, savepoint: False}
