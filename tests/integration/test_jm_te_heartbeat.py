"""The JobMaster <-> TaskExecutor heartbeat against a real TaskExecutor and a hand-written
JobMaster double, over real Thrift (issue 7, points 2 and 3): a final task update lost in
transit reaches the JobMaster with a later heartbeat; a slot the JobMaster stops listing is
freed; a JobMaster that no longer knows the job, or is unreachable for heartbeat.timeout,
loses the job's slots on the TaskExecutor."""

from __future__ import annotations

import time

import pytest

from tests.harness import wait_until
from tests.remote_doubles import te_with_doubles
from yarnflow.common.states import ExecutionState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_a_lost_final_update_is_delivered_by_a_later_heartbeat() -> None:
    with te_with_doubles() as bed:
        bed.jm.drop_updates = True
        alloc = bed.allocate(0)
        tdd = bed.tdd(alloc)
        bed.te_gateway.submit_task(bed.jm.token, tdd)
        wait_until(lambda: ExecutionState.FAILED in bed.jm.reported_states(tdd.execution_attempt_id), 15,
                   lambda: f"no heartbeat reported the lost FAILED update: {bed.jm.heartbeats[-3:]}")
        assert bed.jm.updates == []  # every direct update was lost
        [failed] = [u for hb in bed.jm.heartbeats for u in hb.executions
                    if u.execution_attempt_id == tdd.execution_attempt_id and u.state == ExecutionState.FAILED][:1]
        assert failed.error is not None and failed.error.error_class  # with its cause
        # acknowledged by that heartbeat: later heartbeats no longer carry it
        seen = len(bed.jm.heartbeats)
        wait_until(lambda: len(bed.jm.heartbeats) >= seen + 3, 10, "heartbeats stopped")
        assert all(u.execution_attempt_id != tdd.execution_attempt_id for hb in bed.jm.heartbeats[seen:]
                   for u in hb.executions)


def test_heartbeats_report_the_jobs_slots_and_stop_for_a_delivered_update() -> None:
    with te_with_doubles() as bed:
        alloc = bed.allocate(0)
        wait_until(lambda: any(alloc in hb.allocation_ids for hb in bed.jm.heartbeats), 10,
                   "no heartbeat listed the job's slot")
        assert all(str(hb.resource_id) == str(bed.rm.registration.resource_id)  # type: ignore[union-attr]
                   for hb in bed.jm.heartbeats)
        tdd = bed.tdd(alloc)
        bed.te_gateway.submit_task(bed.jm.token, tdd)
        wait_until(lambda: any(u.state == ExecutionState.FAILED for u in bed.jm.updates), 15,
                   "the direct FAILED update did not arrive")
        seen = len(bed.jm.heartbeats)
        wait_until(lambda: len(bed.jm.heartbeats) >= seen + 4, 10, "heartbeats stopped")
        # delivered directly, so acknowledged: heartbeats sent since no longer carry the task
        assert all(u.execution_attempt_id != tdd.execution_attempt_id for hb in bed.jm.heartbeats[seen + 2:]
                   for u in hb.executions)
        assert str(alloc) in bed.rm.held_allocations()  # the slot stays: the JobMaster still lists it


def test_a_slot_the_job_master_stops_listing_is_freed() -> None:
    with te_with_doubles() as bed:
        keep, drop = bed.allocate(0), bed.allocate(1)
        bed.jm.listed = {keep}
        wait_until(lambda: str(drop) not in bed.rm.held_allocations(), 10,
                   "the slot missing from the JobMaster's report was not freed")
        assert str(keep) in bed.rm.held_allocations()
        with pytest.raises(Exception):  # noqa: B017 - gone: a task for it is refused
            bed.te_gateway.submit_task(bed.jm.token, bed.tdd(drop))


def test_a_job_master_that_does_not_know_the_job_loses_its_slots() -> None:
    with te_with_doubles() as bed:
        other = bed.add_job()
        a1, a2 = bed.allocate(0), bed.allocate(1, other)
        bed.jm.answer = "not_found"
        wait_until(lambda: str(a1) not in bed.rm.held_allocations(), 10,
                   "the slot of a job its JobMaster does not know was not freed")
        assert str(a2) in bed.rm.held_allocations()  # another job's slot is not touched


def test_a_job_master_that_refuses_the_token_loses_its_slots() -> None:
    with te_with_doubles() as bed:
        alloc = bed.allocate(0)
        bed.jm.answer = "fencing"
        wait_until(lambda: str(alloc) not in bed.rm.held_allocations(), 10,
                   "the slot of a JobMaster that refuses the token was not freed")


def test_the_slots_of_an_unreachable_job_master_are_freed_after_the_heartbeat_timeout() -> None:
    with te_with_doubles(heartbeat__timeout="1500 ms") as bed:
        idle, busy = bed.allocate(0), bed.allocate(1)
        bed.te_gateway.submit_task(bed.jm.token, bed.tdd(busy))
        wait_until(lambda: len(bed.jm.heartbeats) >= 2, 10, "no heartbeats")
        bed.jm_server.stop()  # the JobMaster goes away; the ResourceManager stays
        gone = time.monotonic()
        wait_until(lambda: not ({str(idle), str(busy)} & bed.rm.held_allocations()), 15,
                   "the slots of an unreachable JobMaster were not freed")
        assert time.monotonic() - gone >= 1.0  # not before heartbeat.timeout (1.5 s after the last answer)
