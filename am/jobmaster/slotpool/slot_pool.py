"""The JobMaster's SlotPool: a pure core (no I/O; time passed in).

It holds the slots the ResourceManager gave this job. A slot is IN_USE by one execution slot
sharing group, or IDLE (kept for ``slot.idle.timeout`` so a restarted task can go back to the
same slot, as Flink's SlotPool does), or PENDING (asked for, not yet offered).

    PENDING --offer accepted--> IN_USE --release--> IDLE --reuse--> IN_USE
                                             IDLE --idle timeout--> (returned to the RM)

An IDLE slot is reused only by an owner whose resource profile fits in the slot's (the
profile the TaskExecutor offered it with), so a restarted or later task never lands in a slot
too small for it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Hashable, Iterator

from yarnflow.common.ids import AllocationID, ResourceID
from yarnflow.common.lifecycle import Lifecycle
from yarnflow.common.messages import ResourceProfile


class PoolSlotState(enum.Enum):
    PENDING = "PENDING"
    IN_USE = "IN_USE"
    IDLE = "IDLE"


#: (a slot leaves the pool by being removed: cancelled while PENDING, expired while IDLE, or
#: with its TaskExecutor)
POOL_SLOT_TRANSITIONS: dict[PoolSlotState, frozenset[PoolSlotState]] = {
    PoolSlotState.PENDING: frozenset({PoolSlotState.IN_USE}),
    PoolSlotState.IN_USE: frozenset({PoolSlotState.IDLE}),
    PoolSlotState.IDLE: frozenset({PoolSlotState.IN_USE}),
}


@dataclass
class PooledSlot:
    allocation_id: AllocationID
    state: PoolSlotState
    owner: Hashable | None = None           # the sharing group using it
    resource_id: ResourceID | None = None
    rpc_address: str = ""
    data_address: str = ""
    idle_since_ms: int = 0
    profile: ResourceProfile | None = None  # as offered; None: not known (fits anything)
    life: Lifecycle[PoolSlotState] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.life = Lifecycle(f"pooled slot {self.allocation_id}", POOL_SLOT_TRANSITIONS, self.state)

    def move(self, target: PoolSlotState) -> None:
        """Every state change goes through the table."""
        self.life.move(target)
        self.state = target

    def fits(self, need: ResourceProfile | None) -> bool:
        return need is None or self.profile is None or need.fits_in(self.profile)


class SlotPool:
    def __init__(self) -> None:
        self.slots: dict[AllocationID, PooledSlot] = {}
        self._idle: dict[AllocationID, None] = {}  # IDLE slots, oldest first (an ordered set)
        self._pending: dict[AllocationID, None] = {}  # PENDING slots (an ordered set)

    # -- asking -----------------------------------------------------------------------------
    def acquire(self, owner: Hashable, preferred: AllocationID | None = None, *,
                profile: ResourceProfile | None = None) -> tuple[AllocationID, bool]:
        """A slot for ``owner``: an IDLE one that ``profile`` fits in (``preferred`` first),
        marked IN_USE and returned with True; or a new PENDING allocation the caller must
        request from the RM, with False."""
        chosen_id = self.take_idle(owner, profile, preferred)
        if chosen_id is not None:
            return chosen_id, True
        allocation_id = AllocationID.generate()
        self.slots[allocation_id] = PooledSlot(allocation_id, PoolSlotState.PENDING, owner)
        self._pending[allocation_id] = None
        return allocation_id, False

    def take_idle(self, owner: Hashable, profile: ResourceProfile | None = None,
                  preferred: AllocationID | None = None) -> AllocationID | None:
        """An IDLE slot that ``profile`` fits in (``preferred`` first), now IN_USE by
        ``owner``; None when there is none."""
        chosen_id = preferred if preferred in self._idle and self.slots[preferred].fits(profile) else None
        if chosen_id is None:
            chosen_id = next((a for a in self._idle if self.slots[a].fits(profile)), None)
        if chosen_id is None:
            return None
        del self._idle[chosen_id]
        chosen = self.slots[chosen_id]
        chosen.move(PoolSlotState.IN_USE)
        chosen.owner = owner
        return chosen_id

    def adopt(self, allocation_id: AllocationID, owner: Hashable, resource_id: ResourceID, rpc_address: str,
              data_address: str, profile: ResourceProfile | None = None) -> None:
        """A slot an earlier leader's JobMaster of the job held, whose tasks this one takes over:
        IN_USE by ``owner`` at once (no request, no offer)."""
        if allocation_id in self.slots:
            raise ValueError(f"allocation {allocation_id} is in the pool already")
        self.slots[allocation_id] = PooledSlot(allocation_id, PoolSlotState.IN_USE, owner, resource_id, rpc_address,
                                               data_address, profile=profile)

    def offer(self, allocation_id: AllocationID, resource_id: ResourceID, rpc_address: str,
              data_address: str, profile: ResourceProfile | None = None) -> bool:
        """A TaskExecutor offers a slot; accepted when we asked for this allocation."""
        slot = self.slots.get(allocation_id)
        if slot is None:
            return False
        if slot.state == PoolSlotState.PENDING:
            slot.move(PoolSlotState.IN_USE)
            self._pending.pop(allocation_id, None)
            slot.resource_id, slot.rpc_address, slot.data_address = resource_id, rpc_address, data_address
            slot.profile = profile if profile is not None and profile != ResourceProfile() else None
        return slot.resource_id == resource_id

    def is_pending(self, allocation_id: AllocationID) -> bool:
        """Whether this allocation was asked for and no slot came for it yet."""
        return allocation_id in self._pending

    def pending_count(self) -> int:
        """How many allocations wait for the RM (kept up to date, O(1))."""
        return len(self._pending)

    def pending(self) -> Iterator[PooledSlot]:
        """The PENDING slots, oldest first (lazily: stop early when you have enough)."""
        return (self.slots[a] for a in self._pending)  # do not change the pool while iterating

    def idle_count(self) -> int:
        return len(self._idle)

    def owner_of(self, allocation_id: AllocationID) -> Hashable | None:
        slot = self.slots.get(allocation_id)
        return slot.owner if slot else None

    # -- giving back ------------------------------------------------------------------------
    def release(self, allocation_id: AllocationID, now_ms: int) -> bool:
        """The owner is done with the slot: keep it IDLE (a PENDING one is cancelled: True
        tells the caller to cancel its RM request)."""
        slot = self.slots.get(allocation_id)
        if slot is None:
            return False
        if slot.state == PoolSlotState.PENDING:
            del self.slots[allocation_id]
            self._pending.pop(allocation_id, None)
            return True
        if slot.state != PoolSlotState.IDLE:  # (released again: it stays IDLE, idle from now)
            slot.move(PoolSlotState.IDLE)
        slot.owner, slot.idle_since_ms = None, now_ms
        self._idle[allocation_id] = None
        return False

    def expired(self, now_ms: int, idle_timeout_ms: int) -> list[PooledSlot]:
        """IDLE slots past the timeout, removed from the pool: return them to the RM."""
        gone = [self.slots[a] for a in self._idle if now_ms - self.slots[a].idle_since_ms >= idle_timeout_ms]
        for s in gone:
            self.remove(s.allocation_id)
        return gone

    def lost(self, resource_id: ResourceID) -> list[PooledSlot]:
        """Slots of a TaskExecutor that is gone, removed from the pool."""
        gone = [s for s in self.slots.values() if s.resource_id == resource_id]
        for s in gone:
            self.remove(s.allocation_id)
        return gone

    def remove(self, allocation_id: AllocationID) -> PooledSlot | None:
        self._idle.pop(allocation_id, None)
        slot = self.slots.pop(allocation_id, None)
        self._pending.pop(allocation_id, None)
        return slot

    def all(self) -> list[PooledSlot]:
        return list(self.slots.values())

    def in_state(self, state: PoolSlotState) -> list[PooledSlot]:
        if state == PoolSlotState.IDLE:
            return [self.slots[a] for a in self._idle]
        if state == PoolSlotState.PENDING:
            return list(self.pending())
        return [s for s in self.slots.values() if s.state == state]
