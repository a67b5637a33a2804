"""The TaskExecutor's JobTable: JobMaster connections, per-job fencing tokens, final updates
kept until acknowledged, heartbeat timeouts, and which slots an allocated-slot report frees.
Driven with a manual clock: no sockets, no threads."""

from __future__ import annotations

import pytest

from yarnflow.common.clock import ManualClock
from yarnflow.common.ids import AllocationID, ExecutionAttemptID, JobID
from yarnflow.common.messages import TaskExecutionStateUpdate
from yarnflow.common.states import ExecutionState
from yarnflow.worker.taskexecutor.job_table import JobTable, slots_to_free

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

J1, J2, J3 = JobID("j1"), JobID("j2"), JobID("j3")


def table(timeout_ms: int = 1000) -> tuple[JobTable, ManualClock]:
    clock = ManualClock()
    return JobTable(clock, timeout_ms), clock


def final(job: JobID, attempt: str, state: ExecutionState = ExecutionState.FINISHED) -> TaskExecutionStateUpdate:
    return TaskExecutionStateUpdate(job, ExecutionAttemptID(attempt), state)


def test_a_final_update_is_kept_until_acknowledged() -> None:
    jobs, _ = table()
    jobs.connect(J1, "jm:1", "tok")
    jobs.task_ended(final(J1, "a1"))
    jobs.task_ended(final(J1, "a2", ExecutionState.FAILED))
    assert {u.execution_attempt_id for u in jobs.unacknowledged(J1)} == {"a1", "a2"}
    jobs.acknowledged(J1, [ExecutionAttemptID("a1")])
    assert [u.execution_attempt_id for u in jobs.unacknowledged(J1)] == ["a2"]
    assert jobs.unacknowledged(J2) == []


def test_a_new_job_master_replaces_the_connection_and_its_pending_updates() -> None:
    jobs, _ = table()
    jobs.connect(J1, "jm:1", "old")
    jobs.task_ended(final(J1, "a1"))
    jobs.connect(J1, "jm:1", "old")  # another slot of the same JobMaster: nothing changes
    assert len(jobs.unacknowledged(J1)) == 1
    conn = jobs.connect(J1, "jm:2", "new")
    assert (conn.address, conn.token) == ("jm:2", "new")
    assert jobs.unacknowledged(J1) == []
    assert jobs.token_of(J1) == "new"


def test_a_silent_job_master_times_out_and_an_answer_resets_the_timer() -> None:
    jobs, clock = table(timeout_ms=1000)
    jobs.connect(J1, "jm:1", "t1")
    jobs.connect(J2, "jm:2", "t2")
    clock.advance(800)
    assert jobs.heard_from(J1, "t1")
    assert not jobs.heard_from(J2, "stale")  # an answer to an old JobMaster's token does not count
    clock.advance(300)
    assert [c.job_id for c in jobs.timed_out()] == [J2]
    assert jobs.silent_ms(jobs.connection(J2)) == 1100  # type: ignore[arg-type]


def test_the_expected_token_is_the_jobs_and_outlives_the_connection() -> None:
    jobs, _ = table()
    jobs.connect(J1, "jm:1", "t1")
    assert jobs.expected_token(J1) == "t1"
    jobs.disconnect(J1)
    assert jobs.connection(J1) is None
    assert jobs.expected_token(J1) == "t1"  # a deposed JobMaster's "t0" is still refused
    jobs.connect(J1, "jm:1", "t2")  # a new JobMaster of the job
    assert jobs.expected_token(J1) == "t2"


def test_a_slot_or_task_given_an_older_token_refuses_every_token() -> None:
    jobs, _ = table()
    jobs.connect(J1, "jm:1", "t2")
    assert jobs.expected_token(J1, holder_token="t2") == "t2"
    assert jobs.expected_token(J1, holder_token="t1") is None


def test_an_unknown_attempt_or_allocation_needs_the_token_of_some_known_job() -> None:
    jobs, _ = table()
    jobs.connect(J1, "jm:1", "t1")
    jobs.connect(J2, "jm:2", "t2")
    assert jobs.expected_token(None) == {"t1", "t2"}
    assert jobs.expected_token(J3) == {"t1", "t2"}
    assert jobs.expected_token(None, holder_token="t2") == {"t2"}
    assert jobs.expected_token(None, holder_token="forged") == frozenset()


def test_ended_tasks_and_freed_slots_remember_their_job() -> None:
    jobs, _ = table()
    jobs.connect(J1, "jm:1", "t1")
    jobs.task_ended(final(J1, "a1"))
    jobs.retire(AllocationID("al1"), J1)
    assert jobs.job_of(ExecutionAttemptID("a1")) == J1
    assert jobs.job_of(AllocationID("al1")) == J1
    assert jobs.job_of(AllocationID("other")) is None


def test_only_active_slots_missing_from_the_report_are_freed() -> None:
    a, b, c = AllocationID("a"), AllocationID("b"), AllocationID("c")
    assert slots_to_free({a, b}, [a]) == {b}
    assert slots_to_free({a}, [a, c]) == set()  # c: an offer in flight is not judged
    assert slots_to_free(set(), []) == set()
