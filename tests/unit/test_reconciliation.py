"""A new leader's JobMaster core takes over the tasks the TaskExecutors kept running (issue 34),
driven by hand: the first leader's core deploys the job; a second core, started the way a new
leader starts it (``reconcile=True``, the latest checkpoint recovered), gets the TaskExecutors'
reports and decides what to adopt and what to restart."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_job_master_core import JOB, Driver, pipeline
from yarnflow.am.jobmaster.actions import CancelTask, DeployTask, FreeSlot, NotifyTaskCheckpoint, RequestSlot
from yarnflow.common.ids import AllocationID, ResourceID
from yarnflow.common.messages import (
    JobReconnectReport,
    ReconciledTask,
    SlotOffer,
    TaskExecutionStateUpdate,
)
from yarnflow.common.states import ExecutionState, JobStatus

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

S = ExecutionState


def first_leader(parallelism: int = 2) -> list[DeployTask]:
    """The job deployed and running under the first leader: its deployments."""
    d = Driver(pipeline(parallelism), execution_checkpointing_interval="1 h")
    d.start()
    deploys = d.of(DeployTask, d.offer_all())
    d.run_all(deploys)
    return deploys


def metadata(deploys: list[DeployTask], finished: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A completed checkpoint's metadata naming every subtask (no state files)."""
    return {"subtasks": {f"{d.tdd.vertex_id}#{d.tdd.subtask_index}": {"files": [], "finished": d.tdd.vertex_id in finished}
                         for d in deploys}}


def new_leader(deploys: list[DeployTask], checkpoint_id: int = 7, **conf: str) -> Driver:
    d = Driver(pipeline(len(deploys) // 2), execution_checkpointing_interval="1 h", **conf)
    assert d.core.checkpoints is not None
    if checkpoint_id:
        d.core.checkpoints.recover(checkpoint_id, metadata(deploys))
    d.core.start(reconcile=True)
    d.drain()
    return d


def report(deploys: list[DeployTask], acked: int = 7, state: ExecutionState = S.RUNNING,
           finals: list[TaskExecutionStateUpdate] | None = None) -> JobReconnectReport:
    """What the TaskExecutor of ``deploys`` (all on one) reports."""
    tasks = [ReconciledTask(d.attempt_id, d.tdd.vertex_id, d.tdd.subtask_index, d.tdd.attempt_number, state,
                            d.tdd.allocation_id, acked) for d in deploys]
    slots = sorted({d.tdd.allocation_id for d in deploys})
    return JobReconnectReport(deploys[0].resource_id, [SlotOffer(AllocationID(a), 0) for a in slots], tasks,
                              finals or [])


def reconnect(d: Driver, deploys: list[DeployTask], **kw: Any) -> list[Any]:
    rid = deploys[0].resource_id
    d.core.task_executor_reconnected(ResourceID(rid), deploys[0].rpc_address, f"{rid}:7000", report(deploys, **kw))
    return d.drain()


def by_te(deploys: list[DeployTask]) -> dict[str, list[DeployTask]]:
    out: dict[str, list[DeployTask]] = {}
    for dep in deploys:
        out.setdefault(dep.resource_id, []).append(dep)
    return out


def test_every_reported_task_is_adopted_as_it_runs_and_told_the_latest_checkpoint_is_complete() -> None:
    deploys = first_leader()
    d = new_leader(deploys)
    assert d.core.reconciling and {ex.state for ex in d.core.graph.current_executions()} == {S.RECONCILING}
    groups = list(by_te(deploys).values())
    for tes in groups[:-1]:
        reconnect(d, tes)
        assert d.core.reconciling  # not every subtask is known yet
    actions = reconnect(d, groups[-1])
    assert not d.core.reconciling and d.core.reconciled == (len(deploys), 0)
    # nothing deployed again, no slot asked for: the same attempts run in the same slots
    assert d.of(DeployTask) == [] and d.of(RequestSlot) == [] and d.of(CancelTask) == []
    assert {ex.attempt_id: (ex.attempt_number, ex.state, ex.slot.allocation_id if ex.slot else None)
            for ex in d.core.graph.current_executions()} == {
        dep.attempt_id: (dep.tdd.attempt_number, S.RUNNING, dep.tdd.allocation_id) for dep in deploys}
    assert d.core.status == JobStatus.RUNNING
    # a two-phase sink commits what the old leader's lost notification did not
    notified = {(a.attempt_id, a.checkpoint_id, a.completed) for a in d.of(NotifyTaskCheckpoint, actions)}
    assert notified == {(dep.attempt_id, 7, True) for dep in deploys}
    # the adopted tasks' TaskExecutors keep their slots: the heartbeat answer lists them
    first = groups[0]
    held = d.core.task_executor_heartbeat(ResourceID(first[0].resource_id), [],
                                          [AllocationID(x.tdd.allocation_id) for x in first])
    assert set(held) == {dep.tdd.allocation_id for dep in first}


def test_a_subtask_nobody_reports_restarts_its_region_from_the_latest_checkpoint_after_the_timeout() -> None:
    deploys = first_leader()
    d = new_leader(deploys)
    groups = list(by_te(deploys).values())
    lost_te = groups[-1]
    for tes in groups[:-1]:
        reconnect(d, tes)
    d.advance(100)
    assert d.core.reconciling
    d.core.reconciliation_timed_out()  # resourcemanager.previous-worker.recovery.timeout: its TaskExecutor is gone
    actions = d.drain()
    assert not d.core.reconciling
    # one pipelined region: the reported tasks are cancelled with it, then all start again from 7
    cancelled = {a.attempt_id for a in d.of(CancelTask, actions)}
    assert cancelled == {dep.attempt_id for tes in groups[:-1] for dep in tes}
    for dep in [x for tes in groups[:-1] for x in tes]:
        d.core.task_state_changed(TaskExecutionStateUpdate(JOB, dep.attempt_id, S.CANCELED))
    d.advance(60_000)
    d.offer_all()
    redeployed = d.of(DeployTask)
    assert len(redeployed) == len(deploys)
    assert all(r.tdd.restore is not None and r.tdd.restore.checkpoint_id == 7 for r in redeployed)
    assert all(r.attempt_id not in {x.attempt_id for x in deploys} for r in redeployed)
    assert any("after the change of AppMaster leader" in h.error.message for h in d.core.failures.history())
    assert lost_te  # (its tasks were never heard of again)


def test_a_task_whose_state_misses_the_latest_checkpoint_is_not_adopted() -> None:
    deploys = first_leader()
    d = new_leader(deploys, checkpoint_id=7)
    groups = list(by_te(deploys).values())
    for tes in groups[:-1]:
        reconnect(d, tes)
    reconnect(d, groups[-1], acked=6)  # it never acknowledged 7: not the state the others are in
    assert d.core.reconciled is not None and d.core.reconciled[1] == len(groups[-1])
    assert d.core.status in (JobStatus.RUNNING, JobStatus.RESTARTING)
    assert {a.attempt_id for a in d.of(CancelTask)} == {dep.attempt_id for dep in deploys}


def test_a_report_after_the_reconciliation_has_its_tasks_cancelled_and_slots_freed() -> None:
    deploys = first_leader()
    d = new_leader(deploys)
    groups = list(by_te(deploys).values())
    for tes in groups:
        reconnect(d, tes)
    assert not d.core.reconciling
    stray = [DeployTask(dep.attempt_id.__class__("stray-attempt"), dep.resource_id, dep.rpc_address,
                        dep.tdd.__class__(**{**dep.tdd.__dict__, "execution_attempt_id": "stray-attempt",
                                             "allocation_id": "stray-slot"})) for dep in groups[0][:1]]
    actions = reconnect(d, stray)
    assert [a.attempt_id for a in d.of(CancelTask, actions)] == ["stray-attempt"]
    assert [a.allocation_id for a in d.of(FreeSlot, actions)] == ["stray-slot"]


def test_updates_while_reconciling_are_applied_once_the_attempts_are_known() -> None:
    deploys = first_leader()
    d = new_leader(deploys)
    groups = list(by_te(deploys).values())
    finished = deploys[0]
    # the update reaches the new JobMaster before the report that names the attempt
    assert d.core.task_state_changed(TaskExecutionStateUpdate(JOB, finished.attempt_id, S.FAILED))
    for tes in groups:
        reconnect(d, tes)
    assert d.core.graph.execution(finished.attempt_id).state in (S.FAILED, S.CANCELED)


def test_a_duplicate_attempt_of_a_subtask_is_cancelled_and_the_latest_adopted() -> None:
    deploys = first_leader()
    d = new_leader(deploys)
    groups = list(by_te(deploys).values())
    dep = groups[0][0]
    older = ReconciledTask("older-attempt", dep.tdd.vertex_id, dep.tdd.subtask_index, dep.tdd.attempt_number - 1,
                           S.RUNNING, dep.tdd.allocation_id, 7)
    first = report(groups[0])
    d.core.task_executor_reconnected(ResourceID(dep.resource_id), dep.rpc_address, "x:7000",
                                     JobReconnectReport(first.resource_id, first.slots, [older, *first.tasks]))
    for tes in groups[1:]:
        reconnect(d, tes)
    d.drain()
    assert [a.attempt_id for a in d.of(CancelTask)] == ["older-attempt"]
    assert d.core.reconciled == (len(deploys), 0)


def test_sources_that_finished_during_the_failover_or_before_the_checkpoint_are_not_run_again() -> None:
    deploys = first_leader()
    sources = [dep for dep in deploys if "src" in dep.tdd.vertex_id]
    d = new_leader(deploys)
    for rid, tes in by_te(deploys).items():
        ended = [dep for dep in tes if dep in sources]
        finals = [TaskExecutionStateUpdate(JOB, dep.attempt_id, S.FINISHED) for dep in ended]
        d.core.task_executor_reconnected(ResourceID(rid), tes[0].rpc_address, f"{rid}:7000",
                                         report(tes, finals=finals))
    d.drain()
    assert d.core.reconciled == (len(deploys), 0) and d.of(DeployTask) == [] and d.of(CancelTask) == []
    states = {ex.attempt_id: ex.state for ex in d.core.graph.current_executions()}
    assert {states[dep.attempt_id] for dep in sources} == {S.FINISHED}
    # FLIP-147: subtasks finished when the latest checkpoint was taken are gone from every
    # TaskExecutor; they stay FINISHED and the others are adopted without waiting for them
    d2 = Driver(pipeline(2), execution_checkpointing_interval="1 h")
    assert d2.core.checkpoints is not None
    src_vertex = sources[0].tdd.vertex_id
    d2.core.checkpoints.recover(7, metadata(deploys, finished=frozenset({src_vertex})))
    d2.core.start(reconcile=True)
    for tes in by_te(deploys).values():
        running = [dep for dep in tes if dep not in sources]
        if running:
            reconnect(d2, running)
    assert not d2.core.reconciling and d2.core.reconciled == (len(deploys), 0)
    assert d2.of(DeployTask) == [] and d2.of(CancelTask) == []


def test_a_cancel_while_reconciling_cancels_the_reported_tasks_where_they_run() -> None:
    deploys = first_leader()
    d = new_leader(deploys)
    groups = list(by_te(deploys).values())
    reconnect(d, groups[0])  # the other TaskExecutor has not reported yet
    d.core.cancel()
    d.drain()
    assert not d.core.reconciling
    assert {a.attempt_id for a in d.of(CancelTask)} == {dep.attempt_id for dep in groups[0]}
    assert d.core.status == JobStatus.CANCELLING
    for dep in groups[0]:
        d.core.task_state_changed(TaskExecutionStateUpdate(JOB, dep.attempt_id, S.CANCELED))
    d.drain()
    assert d.core.status == JobStatus.CANCELED
    # a report after that: its tasks are cancelled too
    late = reconnect(d, groups[1])
    assert {a.attempt_id for a in d.of(CancelTask, late)} == {dep.attempt_id for dep in groups[1]}


def test_a_job_suspended_while_reconciling_takes_nothing_over() -> None:
    deploys = first_leader()
    d = new_leader(deploys)
    d.core.suspend("the leadership was lost again")
    d.drain()
    for tes in by_te(deploys).values():
        reconnect(d, tes)
    d.core.reconciliation_timed_out()
    assert d.drain() == [] and d.core.status == JobStatus.SUSPENDED


def test_a_task_still_deploying_on_its_taskexecutor_is_adopted_initializing_not_deploying() -> None:
    """Flink's RECONCILING goes on to INITIALIZING, RUNNING or an end, never back to DEPLOYING
    (issue 51); the task's own RUNNING update then moves it on."""
    deploys = first_leader()
    d = new_leader(deploys)
    for tes in by_te(deploys).values():
        reconnect(d, tes, state=S.DEPLOYING)
    assert not d.core.reconciling and d.core.reconciled == (len(deploys), 0)
    assert {ex.state for ex in d.core.graph.current_executions()} == {S.INITIALIZING}
    d.core.task_state_changed(TaskExecutionStateUpdate(JOB, deploys[0].attempt_id, S.RUNNING))
    assert d.core.graph.execution(deploys[0].attempt_id).state == S.RUNNING
