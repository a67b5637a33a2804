"""The ResourceManager's SlotManager core, driven directly with a ManualClock: registration,
matching and spreading of slot requests, asking for and releasing TaskExecutors, heartbeat
reconciliation through slot reports, and loss of TaskExecutors."""

from __future__ import annotations

import pytest

from yarnflow.am.resourcemanager.slotmanager.slot_manager import (
    AllocateSlot,
    ReleaseWorker,
    SlotManager,
    SlotManagerSettings,
    SlotRequest,
    SlotState,
    StartWorkers,
    TaskExecutorLost,
)
from yarnflow.common.clock import ManualClock
from yarnflow.common.ids import AllocationID, JobID, ResourceID
from yarnflow.common.messages import ResourceProfile, SlotReport, SlotStatus, TaskExecutorRegistration

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

JOB = JobID("job-a")
OTHER_JOB = JobID("job-b")
SLOT = ResourceProfile(1.0, 1024)
TE_A, TE_B, TE_C = ResourceID("te-a"), ResourceID("te-b"), ResourceID("te-c")


def manager(slots_per_worker: int = 2, **settings: int | None) -> tuple[SlotManager, ManualClock]:
    settings.setdefault("heartbeat_timeout_ms", 10_000)
    settings.setdefault("pending_allocation_timeout_ms", 5_000)
    clock = ManualClock(1_000)
    return SlotManager(clock, SlotManagerSettings(slots_per_worker, **settings)), clock  # type: ignore[arg-type]


def registration(rid: ResourceID, slots: int = 2, profile: ResourceProfile = SLOT) -> TaskExecutorRegistration:
    return TaskExecutorRegistration(rid, f"{rid}:6000", f"{rid}:7000", slots, profile)


def request(n: int | str, job: JobID = JOB, profile: ResourceProfile | None = None) -> SlotRequest:
    return SlotRequest(job, AllocationID(f"alloc-{n}"), profile or ResourceProfile(), "jm:1", "jm-token")


def report(*slots: tuple[int, str | None] | tuple[int, str | None, JobID]) -> SlotReport:
    out = []
    for s in slots:
        index, aid = s[0], s[1]
        job = s[2] if len(s) > 2 else (JOB if aid else None)  # type: ignore[misc]
        out.append(SlotStatus(index, SLOT, AllocationID(aid) if aid else None, job))
    return SlotReport(out)


def join(sm: SlotManager, reg: TaskExecutorRegistration, registration_id: str) -> list:  # type: ignore[type-arg]
    """A TaskExecutor registers and sends its first slot report (all slots free) at once, as a
    real one does: the actions of both."""
    actions = sm.register(reg, registration_id)
    return actions + (sm.heartbeat(registration_id, report(*[(i, None) for i in range(reg.num_slots)])) or [])


def allocations(actions: list) -> list[AllocateSlot]:  # type: ignore[type-arg]
    return [a for a in actions if isinstance(a, AllocateSlot)]


def slot_state(sm: SlotManager, rid: ResourceID, index: int) -> SlotState:
    return sm.task_executors[rid].slots[index].state


# ---- registration and matching ---------------------------------------------------------------

def test_registration_adds_free_slots_and_asks_for_nothing() -> None:
    sm, _ = manager()
    assert sm.register(registration(TE_A, 3), "reg-a") == []
    assert sm.total_slots() == 3 and sm.free_slot_count() == 3
    te = sm.by_registration("reg-a")
    assert te is not None and te.resource_id == TE_A
    assert [s.profile for s in te.slots] == [SLOT] * 3
    assert sm.by_registration("nope") is None


def test_a_task_executors_slots_are_handed_out_only_after_its_first_slot_report() -> None:
    """A slot request sent with the registration's answer could reach the TaskExecutor before
    that answer (with the fencing token) does, be refused, and go elsewhere: its slots wait for
    its first report, and count meanwhile as coming (no worker is started for the request)."""
    sm, _ = manager(slots_per_worker=2)
    r = request(1)
    assert sm.request_slot(r) == [StartWorkers(1)]
    assert sm.register(registration(TE_A), "reg-a") == []
    assert sm.pending == {r.allocation_id: r} and sm.pending_slots == 0
    assert sm.request_slot(request(2)) == []       # the free slots to come: no second worker
    actions = sm.heartbeat("reg-a", report((0, None), (1, None)))
    assert sorted(a.request.allocation_id for a in allocations(actions)) == [AllocationID("alloc-1"), AllocationID("alloc-2")]
    assert not sm.pending


def test_request_is_matched_to_a_free_slot() -> None:
    sm, _ = manager()
    join(sm, registration(TE_A), "reg-a")
    r = request(1)
    actions = sm.request_slot(r)
    assert actions == [AllocateSlot(TE_A, 0, r)]
    slot = sm.task_executors[TE_A].slots[0]
    assert (slot.state, slot.allocation_id, slot.job_id) == (SlotState.PENDING, r.allocation_id, JOB)
    assert sm.free_slot_count() == 1 and not sm.pending
    r2 = request(2)
    assert sm.request_slot(r2) == [AllocateSlot(TE_A, 1, r2)]
    assert sm.free_slot_count() == 0


def test_requests_spread_over_task_executors() -> None:
    sm, _ = manager()
    join(sm, registration(TE_A, 2), "reg-a")
    join(sm, registration(TE_B, 2), "reg-b")
    placed = [allocations(sm.request_slot(request(i)))[0].resource_id for i in range(4)]
    assert sorted(placed) == [TE_A, TE_A, TE_B, TE_B]
    assert placed[0] != placed[1]  # the second request goes to the TaskExecutor left untouched


def test_the_task_executor_with_most_free_slots_is_chosen() -> None:
    sm, _ = manager()
    join(sm, registration(TE_A, 1), "reg-a")
    join(sm, registration(TE_B, 3), "reg-b")
    join(sm, registration(TE_C, 2), "reg-c")
    assert allocations(sm.request_slot(request(1)))[0].resource_id == TE_B  # 3 free
    # now B and C have 2 free each, A 1: A is never picked while others have more
    picks = [allocations(sm.request_slot(request(i)))[0].resource_id for i in range(2, 4)]
    assert set(picks) == {TE_B, TE_C}
    assert allocations(sm.request_slot(request(4)))[0].resource_id == TE_A  # now all have 1 free
    assert sm.free_slot_count() == 2


def test_pending_request_is_matched_when_a_task_executor_registers() -> None:
    sm, _ = manager(slots_per_worker=2)
    r = request(1)
    assert sm.request_slot(r) == [StartWorkers(1)]
    assert sm.pending == {r.allocation_id: r} and sm.pending_slots == 2
    actions = join(sm, registration(TE_A), "reg-a")
    assert actions == [AllocateSlot(TE_A, 0, r)]
    assert not sm.pending and sm.pending_slots == 0


def test_duplicate_requests_are_ignored() -> None:
    sm, _ = manager()
    r = request(1)
    assert sm.request_slot(r) == [StartWorkers(1)]
    assert sm.request_slot(r) == []  # still pending: not queued twice, no second worker
    assert len(sm.pending) == 1 and sm.pending_slots == 2
    assert allocations(join(sm, registration(TE_A), "reg-a")) == [AllocateSlot(TE_A, 0, r)]
    assert sm.request_slot(r) == []  # already holds a slot: not given a second one
    assert sm.free_slot_count() == 1 and not sm.pending


def test_cancel_request_drops_a_pending_request() -> None:
    sm, _ = manager()
    r = request(1)
    sm.request_slot(r)
    sm.cancel_request(r.allocation_id)
    assert not sm.pending
    assert join(sm, registration(TE_A), "reg-a") == []


# ---- asking for TaskExecutors ----------------------------------------------------------------

def test_start_workers_for_requests_beyond_free_slots() -> None:
    sm, _ = manager(slots_per_worker=2)
    join(sm, registration(TE_A, 1), "reg-a")
    assert allocations(sm.request_slot(request(0)))  # takes the only free slot
    started = []
    for i in range(1, 6):  # 5 pending requests: 3 workers of 2 slots
        started += [a for a in sm.request_slot(request(i)) if isinstance(a, StartWorkers)]
    assert sum(a.count for a in started) == 3
    assert sm.pending_slots == 6
    assert sm.request_slot(request(6)) == []  # 6 pending fit into the 3 coming workers
    assert sm.request_slot(request(7)) == [StartWorkers(1)]
    assert sm.pending_slots == 8


def test_start_workers_respects_max_slots() -> None:
    sm, _ = manager(slots_per_worker=2, max_slots=4)
    actions = []
    for i in range(5):
        actions += sm.request_slot(request(i))
    assert sum(a.count for a in actions if isinstance(a, StartWorkers)) == 2
    assert sm.pending_slots == 4
    assert sm.request_slot(request(9)) == []  # at the limit: never more than 4 slots
    join(sm, registration(TE_A), "reg-a")
    join(sm, registration(TE_B), "reg-b")
    assert sm.total_slots() == 4 and sm.pending_slots == 0 and len(sm.pending) == 2
    assert sm.request_slot(request(10)) == []


def test_a_failed_worker_start_is_asked_for_again() -> None:
    sm, _ = manager(slots_per_worker=2)
    assert sm.request_slot(request(1)) == [StartWorkers(1)]
    assert sm.worker_start_failed() == [StartWorkers(1)]
    assert sm.pending_slots == 2
    assert sm.worker_terminated(ResourceID("te-never"), "exited") == [StartWorkers(1)]
    assert sm.pending_slots == 2


def test_min_slots_are_started_once() -> None:
    sm, _ = manager(slots_per_worker=2, min_slots=3)
    assert sm.ensure_min_resources() == [StartWorkers(2)]
    assert sm.ensure_min_resources() == []  # the coming workers count
    assert join(sm, registration(TE_A), "reg-a") == []
    assert sm.pending_slots == 2
    assert sm.ensure_min_resources() == []
    assert join(sm, registration(TE_B), "reg-b") == []
    assert sm.pending_slots == 0 and sm.total_slots() == 4
    assert sm.ensure_min_resources() == []


def test_a_new_leader_waits_for_the_previous_workers_before_starting_any() -> None:
    sm, clock = manager(min_slots=4)
    sm.recover_previous_workers(5_000)
    assert sm.ensure_min_resources() == []
    r = request(1)
    assert sm.request_slot(r) == []  # no worker for it either: the old ones are coming back
    # one of the previous leader's TaskExecutors registers: the waiting request gets a slot
    assert allocations(join(sm, registration(TE_A), "reg-a")) == [AllocateSlot(TE_A, 0, r)]
    clock.advance(4_999)
    assert sm.check_timeouts() == []
    clock.advance(1)
    assert sm.check_timeouts() == [StartWorkers(1)]  # the other never came back: a replacement now


def test_previous_workers_that_come_back_in_time_need_no_replacement() -> None:
    sm, clock = manager(min_slots=4)
    sm.recover_previous_workers(5_000)
    assert sm.ensure_min_resources() == []
    join(sm, registration(TE_A), "reg-a")
    join(sm, registration(TE_B), "reg-b")
    clock.advance(5_000)
    assert [a for a in sm.check_timeouts() if isinstance(a, StartWorkers)] == []


def test_min_slots_are_restored_when_a_task_executor_is_lost() -> None:
    sm, _ = manager(slots_per_worker=2, min_slots=2)
    assert sm.ensure_min_resources() == [StartWorkers(1)]
    join(sm, registration(TE_A), "reg-a")
    actions = sm.unregister(TE_A, "gone")
    assert actions == [TaskExecutorLost(TE_A, "gone", ()), StartWorkers(1)]


# ---- heartbeats and slot reports -------------------------------------------------------------

def test_heartbeat_with_unknown_registration_returns_none() -> None:
    sm, _ = manager()
    join(sm, registration(TE_A), "reg-a")
    assert sm.heartbeat("reg-unknown", report()) is None
    assert sm.heartbeat("reg-a", report((0, None), (1, None))) == []


def test_slot_report_confirms_and_frees_allocations() -> None:
    sm, clock = manager()
    join(sm, registration(TE_A), "reg-a")
    sm.request_slot(request(1))
    assert slot_state(sm, TE_A, 0) == SlotState.PENDING
    clock.advance(100)
    assert sm.heartbeat("reg-a", report((0, "alloc-1"), (1, None))) == []
    assert slot_state(sm, TE_A, 0) == SlotState.ALLOCATED
    assert sm.task_executors[TE_A].allocations() == [(JOB, AllocationID("alloc-1"))]
    clock.advance(100)
    sm.heartbeat("reg-a", report((0, None), (1, None)))  # the TaskExecutor freed it
    slot = sm.task_executors[TE_A].slots[0]
    assert (slot.state, slot.allocation_id, slot.job_id) == (SlotState.FREE, None, None)
    assert sm.free_slot_count() == 2


def test_slot_report_adopts_an_allocation_the_manager_did_not_know() -> None:
    sm, _ = manager()
    join(sm, registration(TE_A), "reg-a")
    sm.request_slot(request(0))  # slot 0 pending
    # after a ResourceManager failover a TaskExecutor reports what its slots hold
    sm.heartbeat("reg-a", report((0, "alloc-0"), (1, "alloc-x", OTHER_JOB)))
    slot = sm.task_executors[TE_A].slots[1]
    assert (slot.state, slot.allocation_id, slot.job_id) == (SlotState.ALLOCATED, AllocationID("alloc-x"), OTHER_JOB)
    assert sm.free_slot_count() == 0


def test_slot_report_of_a_queued_allocation_removes_it_from_the_queue() -> None:
    sm, _ = manager()
    join(sm, registration(TE_A, 1), "reg-a")
    r = request(1)
    sm.request_slot(r)
    # the allocation call timed out, so it was put back in the queue; yet the TaskExecutor took it
    sm.allocation_failed(TE_A, 0, r.allocation_id, r)
    assert r.allocation_id in sm.pending
    assert sm.heartbeat("reg-a", report((0, "alloc-1"))) == []
    assert r.allocation_id not in sm.pending
    assert slot_state(sm, TE_A, 0) == SlotState.ALLOCATED
    assert sm.task_executors[TE_A].slots[0].allocation_id == r.allocation_id


def test_slot_report_conflicting_with_a_pending_slot_is_ignored() -> None:
    sm, _ = manager()
    join(sm, registration(TE_A, 1), "reg-a")
    sm.request_slot(request(1))
    sm.heartbeat("reg-a", report((0, "alloc-other")))
    slot = sm.task_executors[TE_A].slots[0]
    assert (slot.state, slot.allocation_id) == (SlotState.PENDING, AllocationID("alloc-1"))


def test_pending_slot_reported_free_is_kept_until_the_pending_timeout() -> None:
    sm, clock = manager(pending_allocation_timeout_ms=5_000)
    join(sm, registration(TE_A, 1), "reg-a")
    sm.request_slot(request(1))
    clock.advance(5_000)
    sm.heartbeat("reg-a", report((0, None)))  # the allocation call may still be on its way
    assert slot_state(sm, TE_A, 0) == SlotState.PENDING
    clock.advance(1)
    sm.heartbeat("reg-a", report((0, None)))
    assert slot_state(sm, TE_A, 0) == SlotState.FREE


def test_a_slot_freed_by_a_report_goes_to_a_queued_request() -> None:
    sm, _ = manager(slots_per_worker=1, max_slots=1)
    join(sm, registration(TE_A, 1), "reg-a")
    sm.request_slot(request(0))
    sm.heartbeat("reg-a", report((0, "alloc-0")))
    r1 = request(1)
    assert sm.request_slot(r1) == []  # no room for more workers
    assert sm.heartbeat("reg-a", report((0, None))) == [AllocateSlot(TE_A, 0, r1)]
    assert sm.task_executors[TE_A].slots[0].allocation_id == r1.allocation_id


def test_slot_report_with_unknown_slot_index_is_ignored() -> None:
    sm, _ = manager()
    join(sm, registration(TE_A, 1), "reg-a")
    assert sm.heartbeat("reg-a", report((5, "alloc-9"), (-1, "alloc-8"))) == []
    assert sm.free_slot_count() == 1


def test_heartbeat_timeout_loses_the_task_executor_with_its_allocations() -> None:
    sm, clock = manager(heartbeat_timeout_ms=10_000)
    join(sm, registration(TE_A), "reg-a")
    join(sm, registration(TE_B), "reg-b")
    a = allocations(sm.request_slot(request(1)))[0].resource_id
    b = allocations(sm.request_slot(request(2, job=OTHER_JOB)))[0].resource_id
    assert {a, b} == {TE_A, TE_B}
    clock.advance(6_000)
    assert sm.heartbeat(sm.task_executors[b].registration_id, report()) == []
    clock.advance(4_000)
    assert sm.check_timeouts() == []  # exactly at the timeout: not yet
    clock.advance(1)
    actions = sm.check_timeouts()
    lost = [x for x in actions if isinstance(x, TaskExecutorLost)]
    assert len(lost) == 1 and lost[0].resource_id == a
    assert lost[0].allocations == ((JOB, AllocationID("alloc-1")),)
    assert "heartbeat" in lost[0].reason
    assert set(sm.task_executors) == {b}
    assert sm.heartbeat("reg-a" if a == TE_A else "reg-b", report()) is None  # must register again


def test_unregister_reports_the_allocations_and_forgets_the_task_executor() -> None:
    sm, _ = manager()
    join(sm, registration(TE_A), "reg-a")
    sm.request_slot(request(1))
    sm.request_slot(request(2))
    actions = sm.unregister(TE_A, "container exited")
    assert actions[0] == TaskExecutorLost(TE_A, "container exited",
                                          ((JOB, AllocationID("alloc-1")), (JOB, AllocationID("alloc-2"))))
    assert sm.total_slots() == 0 and sm.by_registration("reg-a") is None
    assert sm.unregister(TE_A, "again") == []


def test_re_registration_starts_afresh_without_asking_for_a_worker() -> None:
    sm, _ = manager(slots_per_worker=2, min_slots=2)
    assert sm.ensure_min_resources() == [StartWorkers(1)]
    join(sm, registration(TE_A), "reg-a")
    sm.request_slot(request(1))
    actions = join(sm, registration(TE_A), "reg-a2")
    # the same process is back: its old allocations are lost, but it must not be stopped
    assert actions == [TaskExecutorLost(TE_A, "re-registered", ((JOB, AllocationID("alloc-1")),), stop_worker=False)]
    assert sm.pending_slots == 0  # the same TaskExecutor came back: no new one is needed
    assert sm.by_registration("reg-a") is None and sm.by_registration("reg-a2") is not None
    assert sm.free_slot_count() == 2


# ---- failures and frees ----------------------------------------------------------------------

def test_allocation_failed_requeues_the_request_to_another_task_executor() -> None:
    sm, _ = manager()
    join(sm, registration(TE_A, 2), "reg-a")
    join(sm, registration(TE_B, 1), "reg-b")
    r = request(1)
    [first] = allocations(sm.request_slot(r))
    assert first.resource_id == TE_A
    actions = sm.allocation_failed(TE_A, first.slot_index, r.allocation_id, r)
    assert allocations(actions) == [AllocateSlot(TE_B, 0, r)]
    assert slot_state(sm, TE_A, first.slot_index) == SlotState.FREE
    assert sm.free_slot_count() == 2 and not sm.pending


def test_allocation_failed_with_a_stale_allocation_leaves_the_slot_alone() -> None:
    sm, _ = manager()
    join(sm, registration(TE_A, 1), "reg-a")
    r1, r2 = request(1), request(2)
    sm.request_slot(r1)
    sm.free_allocation(r1.allocation_id)
    sm.request_slot(r2)  # slot 0 now belongs to alloc-2
    sm.allocation_failed(TE_A, 0, r1.allocation_id, r1)
    slot = sm.task_executors[TE_A].slots[0]
    assert slot.allocation_id == r2.allocation_id and slot.state == SlotState.PENDING
    assert r1.allocation_id in sm.pending  # r1 waits for another slot


def test_allocation_failed_on_the_only_task_executor_waits_for_the_next_match() -> None:
    sm, _ = manager()
    join(sm, registration(TE_A, 1), "reg-a")
    r = request(1)
    sm.request_slot(r)
    assert allocations(sm.allocation_failed(TE_A, 0, r.allocation_id, r)) == []
    assert r.allocation_id in sm.pending and sm.free_slot_count() == 1
    assert sm.heartbeat("reg-a", report((0, None))) == [AllocateSlot(TE_A, 0, r)]  # retried later


def test_free_allocation_frees_the_slot_and_serves_the_queue() -> None:
    sm, _ = manager(slots_per_worker=1, max_slots=1)
    join(sm, registration(TE_A, 1), "reg-a")
    r1, r2 = request(1), request(2)
    sm.request_slot(r1)
    sm.heartbeat("reg-a", report((0, "alloc-1")))
    assert sm.request_slot(r2) == []
    assert sm.free_allocation(r1.allocation_id) == [AllocateSlot(TE_A, 0, r2)]
    assert sm.free_allocation(AllocationID("alloc-unknown")) == []
    assert sm.free_allocation(r2.allocation_id) == []
    assert sm.free_slot_count() == 1


def test_free_allocation_of_a_queued_request_cancels_it() -> None:
    sm, _ = manager()
    r = request(1)
    sm.request_slot(r)
    sm.free_allocation(r.allocation_id)
    assert not sm.pending
    assert join(sm, registration(TE_A), "reg-a") == []


# ---- idle TaskExecutors ----------------------------------------------------------------------

def test_idle_task_executor_is_released_after_the_idle_timeout() -> None:
    sm, clock = manager(idle_timeout_ms=3_000, heartbeat_timeout_ms=60_000)
    join(sm, registration(TE_A), "reg-a")
    clock.advance(2_999)
    assert sm.check_timeouts() == []
    clock.advance(1)
    [release] = sm.check_timeouts()
    assert isinstance(release, ReleaseWorker) and release.resource_id == TE_A
    assert sm.total_slots() == 0


def test_no_idle_release_without_idle_timeout() -> None:
    sm, clock = manager(heartbeat_timeout_ms=10**9)
    join(sm, registration(TE_A), "reg-a")
    clock.advance(10**8)
    assert sm.check_timeouts() == []
    assert TE_A in sm.task_executors


def test_busy_task_executor_is_not_released() -> None:
    sm, clock = manager(idle_timeout_ms=3_000, heartbeat_timeout_ms=60_000)
    join(sm, registration(TE_A), "reg-a")
    join(sm, registration(TE_B), "reg-b")
    busy = allocations(sm.request_slot(request(1)))[0].resource_id
    clock.advance(3_000)
    sm.heartbeat(sm.task_executors[busy].registration_id, report((0, "alloc-1")))
    [release] = sm.check_timeouts()
    assert isinstance(release, ReleaseWorker) and release.resource_id != busy
    assert set(sm.task_executors) == {busy}


def test_idle_release_keeps_min_slots() -> None:
    sm, clock = manager(slots_per_worker=2, min_slots=2, idle_timeout_ms=1_000, heartbeat_timeout_ms=60_000)
    join(sm, registration(TE_A), "reg-a")
    join(sm, registration(TE_B), "reg-b")
    clock.advance(1_000)
    releases = [a for a in sm.check_timeouts() if isinstance(a, ReleaseWorker)]
    assert len(releases) == 1
    assert sm.total_slots() == 2
    clock.advance(10_000)
    assert sm.check_timeouts() == []


def test_no_idle_release_while_requests_wait() -> None:
    sm, clock = manager(slots_per_worker=2, max_slots=2, idle_timeout_ms=1_000, heartbeat_timeout_ms=60_000)
    join(sm, registration(TE_A, 1, ResourceProfile(1.0, 512)), "reg-a")
    sm.request_slot(request(1, profile=ResourceProfile(4.0, 0)))  # fits nowhere yet
    clock.advance(5_000)
    assert sm.check_timeouts() == []
    assert TE_A in sm.task_executors


def test_idle_time_counts_from_when_the_last_slot_was_freed() -> None:
    sm, clock = manager(idle_timeout_ms=3_000, heartbeat_timeout_ms=60_000)
    join(sm, registration(TE_A, 1), "reg-a")
    r = request(1)
    sm.request_slot(r)
    sm.heartbeat("reg-a", report((0, "alloc-1")))
    clock.advance(2_000)  # no heartbeat in between: the job frees its slot
    sm.free_allocation(r.allocation_id)
    clock.advance(2_000)  # 4 s since the last report of a busy slot, 2 s since the free
    assert sm.check_timeouts() == []
    clock.advance(1_000)
    assert [type(a) for a in sm.check_timeouts()] == [ReleaseWorker]


# ---- resource profiles -----------------------------------------------------------------------

def test_resource_profile_fits_in() -> None:
    small, big = ResourceProfile(1.0, 512), ResourceProfile(2.0, 2048)
    assert small.fits_in(big) and small.fits_in(small)
    assert not big.fits_in(small)
    assert not ResourceProfile(1.0, 4096).fits_in(big)  # memory too large
    assert not ResourceProfile(4.0, 512).fits_in(big)  # cpu too large
    assert ResourceProfile().fits_in(small)  # nothing specified: fits anything
    assert ResourceProfile(0.0, 1024).fits_in(big) and not ResourceProfile(0.0, 4096).fits_in(big)
    assert ResourceProfile(3.0, 0).fits_in(ResourceProfile(0.0, 512))  # unknown slot cpu: accepted
    assert big.fits_in(ResourceProfile())


def test_requests_go_only_to_slots_they_fit_in() -> None:
    sm, _ = manager(slots_per_worker=1)
    join(sm, registration(TE_A, 4, ResourceProfile(1.0, 512)), "reg-a")
    join(sm, registration(TE_B, 1, ResourceProfile(4.0, 8192)), "reg-b")
    big = request(1, profile=ResourceProfile(2.0, 4096))
    assert sm.request_slot(big) == [AllocateSlot(TE_B, 0, big)]  # though A has more free slots
    big2 = request(2, profile=ResourceProfile(2.0, 0))
    assert allocations(sm.request_slot(big2)) == []  # A's 4 free slots are too small
    assert big2.allocation_id in sm.pending
    any_slot = request(3)
    assert allocations(sm.request_slot(any_slot)) == [AllocateSlot(TE_A, 0, any_slot)]


def test_a_request_no_slot_could_ever_meet_fails_at_once() -> None:
    from yarnflow.am.resourcemanager.slotmanager.slot_manager import AllocationFailed

    sm, _ = manager(worker_slot_profile=ResourceProfile(1.0, 512))  # type: ignore[arg-type]
    huge = request(1, profile=ResourceProfile(0, 4096))
    [action] = sm.request_slot(huge)
    assert isinstance(action, AllocationFailed) and action.request == huge
    assert "4096 MB" in action.reason and not sm.pending
    # a request that a new TaskExecutor could meet waits for one instead
    fits = request(2, profile=ResourceProfile(0, 256))
    assert sm.request_slot(fits) == [StartWorkers(1)]
    assert AllocationID("alloc-2") in sm.pending


# ---- scaling a session (yarnflow session scale) and what a job could use -----------------------

def test_scaling_up_starts_the_missing_workers_and_keeps_the_cluster_at_that_size() -> None:
    sm, _ = manager(slots_per_worker=2, max_slots=100)
    join(sm, registration(TE_A), "reg-a")
    assert sm.scale_to(3, 100) == [StartWorkers(2)]
    assert sm.settings.min_slots == sm.settings.max_slots == 6
    assert sm.scale_to(3, 100) == []                              # the coming ones count
    for i in range(8):                                            # requests beyond it start nothing
        assert not any(isinstance(a, StartWorkers) for a in sm.request_slot(request(i)))


def test_scaling_down_releases_idle_workers_first_then_the_least_busy_and_tells_their_jobs() -> None:
    sm, _ = manager(slots_per_worker=2, max_slots=100)
    for rid, reg in ((TE_A, "reg-a"), (TE_B, "reg-b"), (TE_C, "reg-c")):
        join(sm, registration(rid), reg)
    for i in range(2):                                            # spread: one slot on each of two
        sm.request_slot(request(i))
    busy = {rid: sum(s.state != SlotState.FREE for s in te.slots) for rid, te in sm.task_executors.items()}
    assert sorted(busy.values()) == [0, 1, 1]
    idle = next(rid for rid, n in busy.items() if n == 0)
    actions = sm.scale_to(1, 100)
    lost = [a for a in actions if isinstance(a, TaskExecutorLost)]
    assert len(lost) == 2 and lost[0].resource_id == idle and not lost[0].allocations
    assert lost[1].allocations                                    # its job learns it lost the slot
    assert len(sm.task_executors) == 1 and not any(isinstance(a, StartWorkers) for a in actions)
    assert "scaled to 1 TaskExecutors" in lost[0].reason


def test_scaling_beyond_the_configured_max_is_refused() -> None:
    sm, _ = manager(slots_per_worker=2, max_slots=4)
    with pytest.raises(ValueError, match="allows 2"):
        sm.scale_to(3, 4)
    assert sm.settings.min_slots == 0


def test_slots_for_job_counts_free_slots_and_the_jobs_own_on_reported_workers_and_those_coming() -> None:
    sm, _ = manager(slots_per_worker=2)
    join(sm, registration(TE_A), "reg-a")
    sm.request_slot(request(0))
    sm.request_slot(request(1, job=OTHER_JOB))
    assert sm.slots_for_job(JOB) == (1, 0) and sm.slots_for_job(OTHER_JOB) == (1, 0)
    assert sm.request_slot(request(2)) == [StartWorkers(1)]      # none free: a worker is started
    assert sm.slots_for_job(JOB) == (1, 2)
    sm.register(registration(TE_B), "reg-b")                      # registered, no slot report yet:
    assert sm.slots_for_job(JOB) == (1, 0)                        # its slots are not counted yet


def test_a_worker_started_before_a_scale_down_is_released_when_it_registers() -> None:
    sm, _ = manager(slots_per_worker=2, max_slots=100)
    join(sm, registration(TE_A), "reg-a")
    assert sm.scale_to(2, 100) == [StartWorkers(1)]
    assert sm.scale_to(1, 100) == []                              # the coming one is not waited for
    assert sm.register(registration(TE_B), "reg-b") == [ReleaseWorker(TE_B, "the cluster was scaled to 1 "
                                                                             "TaskExecutors")]
    assert list(sm.task_executors) == [TE_A] and sm.pending_slots == 0


# ---- workers of slot processes (taskmanager.slot-processes) ----------------------------------

def slot_process(worker: str, index: int) -> TaskExecutorRegistration:
    """Slot process ``index`` of ``worker``: a TaskExecutor of one slot naming its worker."""
    rid = ResourceID(f"{worker}-s{index}")
    return TaskExecutorRegistration(rid, f"{rid}:6000", f"{rid}:7000", 1, SLOT, container_id=worker)


def test_a_worker_of_slot_processes_counts_as_coming_until_its_last_slot_registers() -> None:
    sm, _ = manager(slots_per_worker=2)
    r1, r2, r3 = request(1), request(2), request(3)
    assert sm.request_slot(r1) == [StartWorkers(1)]
    assert sm.request_slot(r2) == []  # the coming worker has room for both
    assert allocations(join(sm, slot_process("w1", 0), "reg-0")) == [AllocateSlot(ResourceID("w1-s0"), 0, r1)]
    assert sm.pending_slots == 1
    assert sm.request_slot(r3) == [StartWorkers(1)]  # one slot of w1 still coming, for r2: r3 needs another
    assert allocations(join(sm, slot_process("w1", 1), "reg-1")) == [AllocateSlot(ResourceID("w1-s1"), 0, r2)]
    assert sm.pending_slots == 2 and sm.total_slots() == 2


def test_a_worker_that_ends_takes_each_of_its_slot_processes_with_it() -> None:
    sm, _ = manager(slots_per_worker=2)
    join(sm, slot_process("w1", 0), "reg-0")
    join(sm, slot_process("w1", 1), "reg-1")
    join(sm, registration(TE_A), "reg-a")
    sm.request_slot(request(1))
    actions = sm.worker_terminated(ResourceID("w1"), "process killed by signal SIGKILL")
    lost = {a.resource_id for a in actions if isinstance(a, TaskExecutorLost)}
    assert lost == {ResourceID("w1-s0"), ResourceID("w1-s1")}
    assert set(sm.task_executors) == {TE_A} and sm.pending_slots == 0  # all its slots had come: none is waited for


def test_a_worker_that_ends_half_registered_is_replaced() -> None:
    sm, _ = manager(slots_per_worker=2)
    r1, r2 = request(1), request(2)
    sm.request_slot(r1)
    sm.request_slot(r2)
    join(sm, slot_process("w1", 0), "reg-0")
    assert sm.pending_slots == 1
    actions = sm.worker_terminated(ResourceID("w1"), "exited with code 1")
    assert [a.resource_id for a in actions if isinstance(a, TaskExecutorLost)] == [ResourceID("w1-s0")]
    # its slot process's slot and the one that never came are both asked for again
    assert [a for a in actions if isinstance(a, StartWorkers)] == [StartWorkers(1)]
    assert sm.pending_slots == 2


def test_scaling_down_releases_whole_workers_of_slot_processes_idle_first() -> None:
    sm, _ = manager(slots_per_worker=2)
    for w in ("w1", "w2"):
        join(sm, slot_process(w, 0), f"reg-{w}-0")
        join(sm, slot_process(w, 1), f"reg-{w}-1")
    assert allocations(sm.request_slot(request(1)))  # one slot of one worker busy
    busy_worker = next(te.registration.worker_id for te in sm.task_executors.values()
                       if any(s.state != SlotState.FREE for s in te.slots))
    actions = sm.scale_to(1, configured_max_slots=8)  # one worker's worth: 2 slots
    lost = {a.resource_id for a in actions if isinstance(a, TaskExecutorLost)}
    idle_worker = "w2" if busy_worker == "w1" else "w1"
    assert lost == {ResourceID(f"{idle_worker}-s0"), ResourceID(f"{idle_worker}-s1")}  # not one of each
    assert sm.total_slots() == 2 and sm.pending_slots == 0
    assert sm.scale_to(2, configured_max_slots=8) == [StartWorkers(1)]
