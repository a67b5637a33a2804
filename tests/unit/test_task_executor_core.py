"""The TaskExecutor's core driven by hand, without sockets, threads or sleeps: slot requests and
offers, deployments, cancellation, freeing slots, the JobMaster heartbeat protocol (what is
sent, what an answer frees, a silent or refusing JobMaster) and the tokens calls must carry."""

from __future__ import annotations

import functools

import dataclasses

import pytest

from yarnflow.common.clock import ManualClock
from yarnflow.common.errors import NotFoundError
from yarnflow.common.ids import AllocationID, ExecutionAttemptID, JobID, JobVertexID, ResourceID
from yarnflow.common.messages import (
    AllocatedSlotReport,
    ResourceProfile,
    SlotOffer,
    TaskDeploymentDescriptor,
    TaskExecutionStateUpdate,
)
from yarnflow.common.rpc.endpoint import UNFENCED
from yarnflow.common.states import ExecutionState
from yarnflow.worker.taskexecutor.core import (
    CancelTask,
    CloseJobMasterConnection,
    OfferSlot,
    ReleasePartitions,
    SendHeartbeat,
    StartTask,
    TaskExecutorCore,
)
from yarnflow.worker.taskexecutor.job_table import JobTable
from yarnflow.worker.taskexecutor.slot_table import SlotState, SlotTable

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

JOB, OTHER = JobID("job-1"), JobID("job-2")
JM = "am:1"


def core(slots: int = 2, timeout_ms: int = 1000) -> tuple[TaskExecutorCore, ManualClock]:
    clock = ManualClock()
    c = TaskExecutorCore(ResourceID("te-1"), SlotTable(slots, ResourceProfile(1.0, 512)), JobTable(clock, timeout_ms))
    c.registered("rm-token", "reg-1")
    return c, clock


def allocate(c: TaskExecutorCore, index: int = 0, job: JobID = JOB, token: str = "jm-1",
             accept: bool = True) -> AllocationID:
    alloc = AllocationID(f"alloc-{job}-{index}")
    [offer] = c.slot_requested(index, job, alloc, JM, token)
    assert isinstance(offer, OfferSlot) and offer.offer.slot_index == index and offer.token == token
    assert c.offer_answered(offer.offer, accept) == ([] if accept else c.offer_answered(offer.offer, accept))
    return alloc


def tdd(alloc: AllocationID, job: JobID = JOB, token: str = "jm-1", n: int = 0) -> TaskDeploymentDescriptor:
    return TaskDeploymentDescriptor(job, JobVertexID("v"), f"map ({n + 1}/2)", ExecutionAttemptID(f"a-{alloc}-{n}"),
                                    n, 0, 2, 128, alloc, "file:///job.zip", "0" * 64, jobmaster_fencing_token=token)


def update(t: TaskDeploymentDescriptor, state: ExecutionState) -> TaskExecutionStateUpdate:
    return TaskExecutionStateUpdate(t.job_id, t.execution_attempt_id, state)


def test_a_slot_request_reserves_the_slot_and_offers_it_once() -> None:
    c, _ = core()
    alloc = AllocationID("a1")
    [offer] = c.slot_requested(1, JOB, alloc, JM, "jm-1")
    # (under the registration it has at the ResourceManager: a JobMaster tells a stale offer by it)
    assert offer == OfferSlot(JOB, JM, "jm-1", SlotOffer(alloc, 1, ResourceProfile(1.0, 512), "reg-1"))
    assert c.slot_requested(1, JOB, alloc, JM, "jm-1") == []  # the same request again
    assert c.slots.slots[1].state == SlotState.ALLOCATED
    assert c.offer_answered(offer.offer, True) == []
    assert c.slots.slots[1].state == SlotState.ACTIVE


def test_a_declined_offer_frees_the_slot_and_the_jobs_pipelined_partitions() -> None:
    c, _ = core()
    [offer] = c.slot_requested(0, JOB, AllocationID("a1"), JM, "jm-1")
    assert c.offer_answered(offer.offer, False) == [ReleasePartitions(JOB, pipelined_only=True)]
    assert c.slots.slots[0].state == SlotState.FREE
    assert c.offer_answered(offer.offer, True) == []  # freed meanwhile: nothing to do


def test_a_deployment_starts_a_task_in_its_slot_once() -> None:
    c, _ = core()
    alloc = allocate(c)
    t = tdd(alloc)
    assert c.deploy(t) == [StartTask(t, JM, "jm-1", 0)]
    assert c.deploy(t) == []  # a duplicate: it already runs
    assert c.slots.get(alloc).tasks == {t.execution_attempt_id}  # type: ignore[union-attr]
    with pytest.raises(NotFoundError, match="no slot for allocation"):
        c.deploy(tdd(AllocationID("never")))


def test_a_deployment_whose_offer_answer_is_late_activates_the_slot() -> None:
    c, _ = core()
    [offer] = c.slot_requested(0, JOB, AllocationID("a1"), JM, "jm-1")
    c.deploy(tdd(offer.offer.allocation_id))
    assert c.slots.slots[0].state == SlotState.ACTIVE


def test_freeing_a_slot_cancels_its_tasks_and_it_is_free_once_they_ended() -> None:
    c, _ = core()
    alloc = allocate(c)
    t = tdd(alloc)
    c.deploy(t)
    assert c.free_slot(alloc, "done") == [CancelTask(t.execution_attempt_id)]  # the job still holds it
    assert c.slots.slots[0].state == SlotState.RELEASING
    c.task_ended(update(t, ExecutionState.CANCELED))
    assert c.slots.slots[0].state == SlotState.FREE and c.tasks == {}
    assert c.free_slot(alloc, "again") == []


def test_a_job_keeps_its_pipelined_partitions_while_it_holds_another_slot() -> None:
    c, _ = core()
    first, second = allocate(c, 0), allocate(c, 1)
    assert c.free_slot(first, "scaled in") == []
    assert c.free_slot(second, "done") == [ReleasePartitions(JOB, pipelined_only=True)]


def test_cancelling_an_unknown_task_does_nothing() -> None:
    c, _ = core()
    assert c.cancel_task(ExecutionAttemptID("nope")) == []
    with pytest.raises(NotFoundError, match="triggerCheckpoint 3: task nope is not running"):
        c.running(ExecutionAttemptID("nope"), "triggerCheckpoint 3")


def test_a_heartbeat_carries_running_tasks_slots_and_unacknowledged_final_updates() -> None:
    c, _ = core()
    alloc = allocate(c)
    running, ended = tdd(alloc, n=0), tdd(alloc, n=1)
    c.deploy(running)
    c.deploy(ended)
    c.task_ended(update(ended, ExecutionState.FINISHED))
    [hb] = c.heartbeats_due({running.execution_attempt_id: update(running, ExecutionState.RUNNING)}, [])
    assert isinstance(hb, SendHeartbeat) and (hb.job_id, hb.address, hb.token) == (JOB, JM, "jm-1")
    assert [(u.execution_attempt_id, u.state) for u in hb.payload.executions] == [
        (running.execution_attempt_id, ExecutionState.RUNNING), (ended.execution_attempt_id, ExecutionState.FINISHED)]
    assert hb.payload.allocation_ids == [alloc] and hb.active == {alloc}
    assert c.heartbeats_due({}, []) == []  # one in flight per job
    c.heartbeat_answered(hb, AllocatedSlotReport([alloc]))
    [again] = c.heartbeats_due({running.execution_attempt_id: update(running, ExecutionState.RUNNING)}, [])
    assert [u.execution_attempt_id for u in again.payload.executions] == [running.execution_attempt_id]  # acknowledged


def test_an_active_slot_the_jobmaster_no_longer_lists_is_freed() -> None:
    c, _ = core()
    kept, dropped = allocate(c, 0), allocate(c, 1)
    [hb] = c.heartbeats_due({}, [])
    assert c.heartbeat_answered(hb, AllocatedSlotReport([kept])) == []
    assert c.slots.get(dropped) is None and c.slots.get(kept) is not None


def test_a_job_with_nothing_left_here_is_disconnected_unless_it_holds_partitions() -> None:
    c, _ = core()
    alloc = allocate(c)
    c.free_slot(alloc, "done")
    [hb] = c.heartbeats_due({}, [f"{JOB}.p1"])  # a blocking partition of the job: still connected
    assert hb.payload.allocation_ids == []
    c.heartbeat_answered(hb, AllocatedSlotReport([]))
    assert c.heartbeats_due({}, []) == [CloseJobMasterConnection(JOB)]
    assert c.jobs.connection(JOB) is None


def test_a_silent_jobmaster_is_given_up_with_everything_of_its_job() -> None:
    c, clock = core(timeout_ms=1000)
    alloc = allocate(c)
    t = tdd(alloc)
    c.deploy(t)
    c.heartbeats_due({t.execution_attempt_id: update(t, ExecutionState.RUNNING)}, [])
    c.heartbeat_failed(JOB)
    clock.advance(1500)
    actions = c.heartbeats_due({t.execution_attempt_id: update(t, ExecutionState.RUNNING)}, [])
    assert actions == [CloseJobMasterConnection(JOB), CancelTask(t.execution_attempt_id), ReleasePartitions(JOB)]
    assert c.slots.slots[0].state == SlotState.RELEASING  # free once its task ended


def test_a_refusing_jobmaster_is_gone_unless_a_newer_one_took_over() -> None:
    c, _ = core()
    allocate(c, 0)
    [hb] = c.heartbeats_due({}, [])
    allocate(c, 1, token="jm-2")  # a new JobMaster of the job asked for a slot meanwhile
    assert c.heartbeat_refused(JOB, hb.token, "NOT_FOUND") == []
    assert c.jobs.connection(JOB) is not None
    assert CloseJobMasterConnection(JOB) in c.heartbeat_refused(JOB, "jm-2", "NOT_FOUND")
    assert all(s.state == SlotState.FREE for s in c.slots.slots)


def test_a_new_leader_ends_every_job_of_the_old_one_and_asks_for_a_new_registration() -> None:
    c, _ = core()
    allocate(c, 0, JOB)
    allocate(c, 1, OTHER, token="jm-o")
    actions = c.leader_changed()
    assert {a.job_id for a in actions if isinstance(a, CloseJobMasterConnection)} == {JOB, OTHER}
    assert all(s.state == SlotState.FREE for s in c.slots.slots)
    assert (c.rm_token, c.registration_id) == ("", "")


def test_calls_must_carry_the_token_of_the_jobmaster_their_slot_or_task_belongs_to() -> None:
    c, _ = core()
    alloc = allocate(c)
    t = tdd(alloc)
    c.deploy(t)
    assert c.rm_token_expected() == "rm-token"
    assert c.slot_token(alloc) == "jm-1"
    assert c.task_token(t.execution_attempt_id) == "jm-1"
    assert c.deployment_token(tdd(alloc, n=1)) == "jm-1"
    assert c.deployment_token(tdd(alloc, job=OTHER)) is None  # the slot is another job's
    assert c.job_token(JOB) == "jm-1" and c.job_token(OTHER) is UNFENCED
    allocate(c, 1, token="jm-2")  # the job's new JobMaster: the old slot's token is stale
    assert c.slot_token(alloc) is None
    assert c.task_token(ExecutionAttemptID("unknown")) == {"jm-2"}  # unknown: a current token of some job
    c.registration_lost()
    assert c.registration_id == "" and c.rm_token == "rm-token"


def test_releasing_partitions_of_a_job_never_served_here_does_nothing() -> None:
    c, _ = core()
    assert c.release_partitions(OTHER, ["x"]) == []
    allocate(c)
    [release] = c.release_partitions(JOB, [f"{JOB}.p1"])
    assert release.covers(f"{JOB}.p1") and not release.covers(f"{JOB}.p2") and not release.covers("job-2.p1")
    assert ReleasePartitions(JOB).covers(f"{JOB}.p2")


def test_the_taskexecutor_gives_freed_memory_back_once_idle_after_its_last_task(monkeypatch) -> None:
    """When no task has run for IDLE_RELEASE_MS, what the tasks freed (glibc's heap fragments,
    Arrow's pool, cycles) goes back to the system, on a pool thread, so an idle TaskExecutor does
    not sit at its busiest size (W2 at 20,000,000 records: the whole cluster peaked at 504-514 MB
    while the client read the result beside the idle TaskExecutors, 466-474 MB with this). Not
    at once: the full collection held the interpreter ~25 ms right when a small job's next
    tasks came in (issue 54); a task ending meanwhile puts it off again."""
    import threading
    import time
    import types
    from concurrent.futures import ThreadPoolExecutor

    from yarnflow.common.rpc.endpoint import MainThreadExecutor
    from yarnflow.worker.taskexecutor import task_executor

    monkeypatch.setattr(task_executor, "IDLE_RELEASE_MS", 300)
    released = threading.Semaphore(0)
    monkeypatch.setattr(task_executor, "release_free_memory", released.release)
    a, b, c = ExecutionAttemptID("a"), ExecutionAttemptID("b"), ExecutionAttemptID("c")
    main, io = MainThreadExecutor("te-test").start(), ThreadPoolExecutor(1)
    te = types.SimpleNamespace(core=types.SimpleNamespace(task_ended=lambda u: None), tasks={a: object(), b: object()},
                               _remember_ended=lambda task, update: None, _main=main, _io=io, _tasks_ended=0)
    te._release_if_idle = lambda idle: task_executor.TaskExecutor._release_if_idle(te, idle)  # type: ignore[arg-type]
    done = functools.partial(task_executor.TaskExecutor._task_done, te)
    try:
        main.call(done, TaskExecutionStateUpdate(JOB, a, ExecutionState.FINISHED))
        assert not released.acquire(timeout=0.6)  # b still runs
        main.call(done, TaskExecutionStateUpdate(JOB, b, ExecutionState.FAILED))
        time.sleep(0.15)
        te.tasks[c] = object()  # the next task came and went within the idle time: no release yet
        main.call(done, TaskExecutionStateUpdate(JOB, c, ExecutionState.FINISHED))
        assert not released.acquire(timeout=0.2)
        assert released.acquire(timeout=5)  # 300 ms after c ended
        assert not released.acquire(timeout=0.5)  # once
    finally:
        main.stop()
        io.shutdown()


# -- a change of leader with high-availability.keep-running-tasks (jm_links.py) -------------------

def keeping_core(orphan_timeout_ms: int = 5000) -> tuple[TaskExecutorCore, ManualClock]:
    clock = ManualClock()
    c = TaskExecutorCore(ResourceID("te-1"), SlotTable(2, ResourceProfile(1.0, 512)),
                         JobTable(clock, 1000, orphan_timeout_ms), keep_tasks=True)
    c.registered("rm-token", "reg-1")
    return c, clock


def test_a_new_leader_leaves_streaming_tasks_running_until_its_jobmaster_takes_them_over() -> None:
    c, clock = keeping_core()
    alloc = allocate(c)
    t = tdd(alloc)
    c.deploy(t)
    assert c.leader_changed(keep_tasks=True) == []  # nothing cancelled, freed or closed
    assert c.orphaned(JOB) and t.execution_attempt_id in c.tasks and c.slots.slots[0].state == SlotState.ACTIVE
    assert (c.rm_token, c.registration_id) == ("", "")
    clock.advance(900)
    assert c.heartbeats_due({}, []) == []  # nobody to send them to while orphaned
    # the final update of a task that ended meanwhile waits for the new JobMaster
    c.task_ended(update(t, ExecutionState.FINISHED))
    t2 = tdd(alloc, n=1)
    c.deploy(t2)
    c.registered("rm-token-2", "reg-2")
    [running] = c.reconnect_job(JOB, "am:2", "jm-2")
    assert running.execution_attempt_id == t2.execution_attempt_id and running.jobmaster_fencing_token == "jm-2"
    assert not c.orphaned(JOB)
    assert [u.execution_attempt_id for u in c.jobs.unacknowledged(JOB)] == [t.execution_attempt_id]
    # from now on calls must carry the new JobMaster's token: the old leader's are refused
    assert c.task_token(t2.execution_attempt_id) == "jm-2" and c.slot_token(alloc) == "jm-2"
    assert c.job_token(JOB) == "jm-2"
    [beat] = c.heartbeats_due({}, [])
    assert isinstance(beat, SendHeartbeat) and (beat.address, beat.token) == ("am:2", "jm-2")


def test_orphaned_tasks_are_cancelled_when_no_new_jobmaster_takes_them_over_in_time() -> None:
    c, clock = keeping_core(orphan_timeout_ms=3000)
    alloc = allocate(c)
    t = tdd(alloc)
    c.deploy(t)
    c.leader_changed(keep_tasks=True)
    clock.advance(2900)
    assert c.heartbeats_due({}, []) == []
    clock.advance(200)
    actions = c.heartbeats_due({}, [])
    assert CancelTask(t.execution_attempt_id) in actions and CloseJobMasterConnection(JOB) in actions
    assert c.slots.slots[0].state == SlotState.RELEASING  # (free once its task has stopped)
    c.task_ended(update(t, ExecutionState.CANCELED))
    with pytest.raises(NotFoundError):
        c.reconnect_job(JOB, "am:2", "jm-2")  # nothing of the job is left to take over


def test_a_silent_jobmaster_orphans_its_tasks_instead_of_cancelling_them() -> None:
    c, clock = keeping_core(orphan_timeout_ms=3000)
    alloc = allocate(c)
    c.deploy(tdd(alloc))
    clock.advance(1100)  # heartbeat.timeout: the AppMaster may be dying; a new leader may come
    assert [a for a in c.heartbeats_due({}, []) if not isinstance(a, SendHeartbeat)] == []
    assert c.orphaned(JOB)
    clock.advance(3100)
    assert CloseJobMasterConnection(JOB) in c.heartbeats_due({}, [])


def test_batch_tasks_and_a_core_that_does_not_keep_tasks_give_the_job_up_on_a_new_leader() -> None:
    c, _ = keeping_core()
    alloc = allocate(c)
    batch = dataclasses.replace(tdd(alloc), runtime_mode="BATCH")
    c.deploy(batch)
    assert CancelTask(batch.execution_attempt_id) in c.leader_changed(keep_tasks=True)
    assert c.slots.slots[0].state == SlotState.RELEASING and not c.orphaned(JOB)
    c2, _ = core()
    alloc2 = allocate(c2)
    c2.deploy(tdd(alloc2))
    assert CloseJobMasterConnection(JOB) in c2.leader_changed(keep_tasks=False)
