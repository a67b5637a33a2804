"""The TaskExecutor's slot table: states, idempotence by allocation id, refusals."""

from __future__ import annotations

import pytest

from yarnflow.common.errors import NotFoundError, RefusedError
from yarnflow.common.ids import AllocationID, ExecutionAttemptID, JobID
from yarnflow.common.messages import ResourceProfile
from yarnflow.worker.taskexecutor.slot_table import SlotState, SlotTable

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

JOB = JobID("job-a")
A1, A2 = AllocationID("alloc-1"), AllocationID("alloc-2")


def table() -> SlotTable:
    return SlotTable(2, ResourceProfile(1.0, 512))


def test_allocate_activate_run_free_cycle():
    t = table()
    assert t.allocate(0, JOB, A1, "jm:1", "tok")
    slot = t.get(A1)
    assert slot is not None and slot.state == SlotState.ALLOCATED and slot.job_id == JOB
    t.mark_active(A1)
    assert slot.state == SlotState.ACTIVE
    task = ExecutionAttemptID("t1")
    t.add_task(A1, task)
    assert t.free(A1) is slot and slot.state == SlotState.RELEASING  # a task still runs in it
    assert t.remove_task(task) is slot
    assert slot.state == SlotState.FREE and t.get(A1) is None


def test_allocate_is_idempotent_and_refuses_a_taken_slot():
    t = table()
    assert t.allocate(0, JOB, A1, "jm:1", "tok")
    assert not t.allocate(0, JOB, A1, "jm:1", "tok")  # same allocation: nothing changes
    with pytest.raises(RefusedError, match="slot 0 is ALLOCATED"):
        t.allocate(0, JOB, A2, "jm:1", "tok")
    with pytest.raises(NotFoundError, match="no slot 5"):
        t.allocate(5, JOB, A2, "jm:1", "tok")


def test_tasks_only_in_active_slots():
    t = table()
    t.allocate(1, JOB, A1, "jm:1", "tok")
    with pytest.raises(RefusedError, match="not ACTIVE"):
        t.add_task(A1, ExecutionAttemptID("t1"))
    with pytest.raises(NotFoundError):
        t.add_task(A2, ExecutionAttemptID("t1"))


def test_free_without_tasks_is_immediate_and_unknown_free_is_none():
    t = table()
    t.allocate(1, JOB, A1, "jm:1", "tok")
    assert t.free(A1).state == SlotState.FREE
    assert t.free(A1) is None


def test_report_names_allocations():
    t = table()
    t.allocate(1, JOB, A1, "jm:1", "tok")
    report = t.report()
    assert [s.slot_index for s in report.slots] == [0, 1]
    assert report.slots[0].allocation_id is None
    assert report.slots[1].allocation_id == A1 and report.slots[1].job_id == JOB
    assert t.jobs() == {JOB}
