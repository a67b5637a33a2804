"""The TaskExecutor's slot table: a pure core (no I/O, no threads).

Slot states::

    FREE --allocate--> ALLOCATED --offer accepted--> ACTIVE --free--> RELEASING --last task gone--> FREE
      ^                   |                            |                                            |
      +-------free--------+-----------free (no tasks)--+--------------------------------------------+

An allocation is keyed by its AllocationID: allocating the same id twice is a no-op; asking
for a slot held by another allocation is refused.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from yarnflow.common.errors import NotFoundError, RefusedError
from yarnflow.common.ids import AllocationID, ExecutionAttemptID, JobID
from yarnflow.common.lifecycle import Lifecycle
from yarnflow.common.messages import ResourceProfile, SlotReport, SlotStatus


class SlotState(enum.Enum):
    FREE = "FREE"
    ALLOCATED = "ALLOCATED"
    ACTIVE = "ACTIVE"
    RELEASING = "RELEASING"


SLOT_TRANSITIONS: dict[SlotState, frozenset[SlotState]] = {
    SlotState.FREE: frozenset({SlotState.ALLOCATED}),
    SlotState.ALLOCATED: frozenset({SlotState.ACTIVE, SlotState.FREE}),
    SlotState.ACTIVE: frozenset({SlotState.RELEASING, SlotState.FREE}),
    SlotState.RELEASING: frozenset({SlotState.FREE}),
}


@dataclass
class TaskSlot:
    index: int
    profile: ResourceProfile
    allocation_id: AllocationID | None = None
    job_id: JobID | None = None
    jobmaster_address: str = ""
    jobmaster_token: str = ""
    tasks: set[ExecutionAttemptID] = field(default_factory=set)
    life: Lifecycle[SlotState] = field(init=False)

    def __post_init__(self) -> None:
        self.life = Lifecycle(f"slot {self.index}", SLOT_TRANSITIONS, SlotState.FREE)

    @property
    def state(self) -> SlotState:
        return self.life.state

    def clear(self) -> None:
        self.life.move(SlotState.FREE)
        self.allocation_id = self.job_id = None
        self.jobmaster_address = self.jobmaster_token = ""
        self.tasks.clear()


class SlotTable:
    def __init__(self, num_slots: int, profile: ResourceProfile) -> None:
        self.slots = [TaskSlot(i, profile) for i in range(num_slots)]
        self._by_alloc: dict[str, TaskSlot] = {}

    def allocate(self, index: int, job_id: JobID, allocation_id: AllocationID,
                 jobmaster_address: str, jobmaster_token: str) -> bool:
        """Reserve slot ``index``; True if newly allocated, False if it already was (same id)."""
        if not 0 <= index < len(self.slots):
            raise NotFoundError(f"no slot {index}: this TaskExecutor has {len(self.slots)} slots")
        slot = self.slots[index]
        if slot.allocation_id == allocation_id:
            return False
        if slot.state != SlotState.FREE:
            raise RefusedError(f"slot {index} is {slot.state.value} for allocation {slot.allocation_id}")
        slot.life.move(SlotState.ALLOCATED)
        slot.allocation_id, slot.job_id = allocation_id, job_id
        slot.jobmaster_address, slot.jobmaster_token = jobmaster_address, jobmaster_token
        self._by_alloc[allocation_id] = slot
        return True

    def get(self, allocation_id: str) -> TaskSlot | None:
        return self._by_alloc.get(allocation_id)

    def mark_active(self, allocation_id: str) -> None:
        slot = self._require(allocation_id)
        if slot.state == SlotState.ALLOCATED:
            slot.life.move(SlotState.ACTIVE)

    def add_task(self, allocation_id: str, attempt_id: ExecutionAttemptID) -> TaskSlot:
        slot = self._require(allocation_id)
        if slot.state != SlotState.ACTIVE:
            raise RefusedError(f"slot for allocation {allocation_id} is {slot.state.value}, not ACTIVE")
        slot.tasks.add(attempt_id)
        return slot

    def remove_task(self, attempt_id: ExecutionAttemptID) -> TaskSlot | None:
        """Forget a finished task; returns its slot if that became FREE as a result."""
        for slot in self.slots:
            if attempt_id in slot.tasks:
                slot.tasks.discard(attempt_id)
                if slot.state == SlotState.RELEASING and not slot.tasks:
                    self._release(slot)
                    return slot
                return None
        return None

    def free(self, allocation_id: str) -> TaskSlot | None:
        """Free the allocation's slot (RELEASING while tasks still run); None if unknown."""
        slot = self._by_alloc.get(allocation_id)
        if slot is None:
            return None
        if slot.tasks:
            if slot.state != SlotState.RELEASING:
                slot.life.move(SlotState.RELEASING)
        else:
            self._release(slot)
        return slot

    def _release(self, slot: TaskSlot) -> None:
        if slot.allocation_id is not None:
            self._by_alloc.pop(slot.allocation_id, None)
        slot.clear()

    def _require(self, allocation_id: str) -> TaskSlot:
        slot = self._by_alloc.get(allocation_id)
        if slot is None:
            raise NotFoundError(f"unknown allocation {allocation_id}")
        return slot

    def jobs(self) -> set[JobID]:
        return {s.job_id for s in self.slots if s.job_id is not None}

    def report(self) -> SlotReport:
        return SlotReport([SlotStatus(s.index, s.profile, s.allocation_id, s.job_id)
                           if s.state != SlotState.FREE else SlotStatus(s.index, s.profile)
                           for s in self.slots])
