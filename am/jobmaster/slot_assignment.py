"""Slot assignment to slot sharing groups (a pure core; time passed in, no I/O).

Subtask i of every vertex of one slot sharing group shares one slot; two subtasks of one
vertex never do. Which subtasks share depends on the runtime mode:

- STREAMING: a shared slot is keyed ``(sharing group, i)`` across the whole job, as in Flink,
  so a job needs, per sharing group, as many slots as the group's highest parallelism, even
  when it has several independent pipelines (regions). A shared slot stays in use while any
  region using it runs.
- BATCH: regions run one after the other, so a shared slot is keyed ``(region, group, i)``
  and freed when its region finishes; the next region reuses it from the SlotPool.

A shared slot's resource profile is the sum of its members' profiles. Slots come from the
SlotPool (an IDLE slot the profile fits in, the subtask's previous slot first) or, failing
that, from a new request to the ResourceManager; the caller sends the ``requests`` returned.
Every request's age is kept so the caller can time it out per request
(``slot.request.timeout``, measured from when that request was made).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from yarnflow.am.jobmaster.execution_graph import LogicalSlot
from yarnflow.am.jobmaster.slotpool.slot_pool import PoolSlotState, SlotPool
from yarnflow.am.scheduler.regions import PipelinedRegion, SubtaskId
from yarnflow.common.ids import AllocationID, ResourceID
from yarnflow.common.messages import JobGraph, ResourceProfile

log = logging.getLogger(__name__)

GroupKey = Hashable


@dataclass(frozen=True)
class NewRequest:
    """Ask the ResourceManager for ``allocation_id`` with ``profile``."""

    allocation_id: AllocationID
    profile: ResourceProfile


class SlotAssignment:
    def __init__(self, job_graph: JobGraph, regions: list[PipelinedRegion], streaming: bool,
                 pool: SlotPool | None = None) -> None:
        self.pool = pool or SlotPool()
        self._job_graph = job_graph
        self.streaming = streaming
        self.region_groups: dict[int, list[tuple[GroupKey, list[SubtaskId]]]] = {}
        members: dict[GroupKey, list[SubtaskId]] = {}
        for region in regions:
            by_key: dict[GroupKey, list[SubtaskId]] = {}
            for s in sorted(region.subtasks):
                group = job_graph.vertex(s.vertex_id).slot_sharing_group
                key: GroupKey = (group, s.index) if streaming else (region.region_id, group, s.index)
                by_key.setdefault(key, []).append(s)
                members.setdefault(key, []).append(s)
            self.region_groups[region.region_id] = sorted(by_key.items(), key=lambda kv: str(kv[0]))
        self._profiles = {key: self._sum_profile(ms) for key, ms in members.items()}
        self.group_slots: dict[GroupKey, AllocationID] = {}
        self._users: dict[GroupKey, set[int]] = {}         # group -> regions holding it
        self._requested_at: dict[AllocationID, int] = {}   # pending allocation -> request time
        self._previous: dict[SubtaskId, AllocationID] = {}

    def _sum_profile(self, members: Iterable[SubtaskId]) -> ResourceProfile:
        cpu = mem = 0.0
        for s in members:
            res = self._job_graph.vertex(s.vertex_id).resources
            cpu, mem = cpu + res.cpu_cores, mem + res.memory_mb
        return ResourceProfile(cpu, int(mem))

    def profile(self, key: GroupKey) -> ResourceProfile:
        return self._profiles[key]

    def groups_of(self, region_id: int) -> list[tuple[GroupKey, list[SubtaskId]]]:
        return self.region_groups[region_id]

    # -- asking ---------------------------------------------------------------------------------
    def acquire_for_region(self, region: PipelinedRegion, now_ms: int) -> list[NewRequest]:
        """Give each sharing group of ``region`` a slot (shared, pooled, or newly requested)."""
        requests = []
        for key, members in self.region_groups[region.region_id]:
            self._users.setdefault(key, set()).add(region.region_id)
            if key in self.group_slots:
                continue
            preferred = next((self._previous[s] for s in members if s in self._previous), None)
            request = self._acquire(key, now_ms, preferred)
            if request is not None:
                requests.append(request)
        return requests

    def _acquire(self, key: GroupKey, now_ms: int, preferred: AllocationID | None = None) -> NewRequest | None:
        profile = self._profiles[key]
        allocation_id, ready = self.pool.acquire(key, preferred, profile=profile)
        self.group_slots[key] = allocation_id
        if ready:
            return None
        self._requested_at[allocation_id] = now_ms
        return NewRequest(allocation_id, profile)

    def reacquire_missing(self, region: PipelinedRegion, now_ms: int) -> list[NewRequest]:
        """Groups of a scheduled region whose slot vanished (TaskExecutor lost) ask again."""
        requests = []
        for key, _ in self.region_groups[region.region_id]:
            if key not in self.group_slots and self._users.get(key):
                request = self._acquire(key, now_ms)
                if request is not None:
                    requests.append(request)
        return requests

    def adopt(self, region_id: int, key: GroupKey, slot: LogicalSlot, profile: ResourceProfile | None) -> None:
        """A new leader's JobMaster takes over the group's slot from the earlier leader's (its
        tasks run on): the group holds it for ``region_id``, as if acquired."""
        self._users.setdefault(key, set()).add(region_id)
        if self.group_slots.get(key) == slot.allocation_id:
            return
        self.pool.adopt(slot.allocation_id, key, slot.resource_id, slot.rpc_address, slot.data_address, profile)
        self.group_slots[key] = slot.allocation_id

    def slot_of(self, key: GroupKey) -> LogicalSlot | None:
        allocation_id = self.group_slots.get(key)
        slot = self.pool.slots.get(allocation_id) if allocation_id else None
        if slot is None or slot.state != PoolSlotState.IN_USE or slot.resource_id is None:
            return None
        return LogicalSlot(slot.allocation_id, slot.resource_id, slot.rpc_address, slot.data_address)

    def requested_at(self, allocation_id: AllocationID) -> int | None:
        """When the still-pending request for ``allocation_id`` was made; None if not pending."""
        slot = self.pool.slots.get(allocation_id)
        if slot is None or slot.state != PoolSlotState.PENDING:
            self._requested_at.pop(allocation_id, None)
            return None
        return self._requested_at.get(allocation_id)

    def renew_request(self, allocation_id: AllocationID, now_ms: int) -> bool:
        """Start the age of a still-pending request again; False when it is no longer pending."""
        if self.requested_at(allocation_id) is None:
            return False
        self._requested_at[allocation_id] = now_ms
        return True

    def pending_requests(self) -> list[tuple[AllocationID, ResourceProfile]]:
        """Every request still waiting for the ResourceManager (to repeat to a new leader)."""
        by_alloc = {a: k for k, a in self.group_slots.items()}
        out = []
        for slot in self.pool.in_state(PoolSlotState.PENDING):
            key = by_alloc.get(slot.allocation_id)
            out.append((slot.allocation_id, self._profiles[key] if key is not None else ResourceProfile()))
        return out

    def regions_of(self, allocation_id: AllocationID) -> set[int]:
        """The regions using the sharing group that holds ``allocation_id``."""
        key = self.pool.owner_of(allocation_id)
        return set(self._users.get(key, ())) if key is not None else set()

    def could_be_served_by_held_slot(self, allocation_id: AllocationID) -> bool:
        """Whether some slot the job holds (in use by another group) would fit this request
        once freed: then the request waits on the job's own progress, not on the cluster."""
        key = self.pool.owner_of(allocation_id)
        if key is None:
            return False
        need = self._profiles[key]
        return any(s.state == PoolSlotState.IN_USE and s.owner != key and s.fits(need)
                   for s in self.pool.slots.values())

    # -- giving back ----------------------------------------------------------------------------
    def release_region(self, region: PipelinedRegion, now_ms: int,
                       remember_slots_of: Iterable[tuple[SubtaskId, AllocationID]] = ()) -> list[AllocationID]:
        """``region`` no longer needs its groups: a group no other region uses goes back to
        the pool (IDLE). Returns the pending allocations whose RM request must be cancelled."""
        for s, allocation_id in remember_slots_of:
            self._previous[s] = allocation_id
        cancelled = []
        for key, _ in self.region_groups[region.region_id]:
            users = self._users.get(key)
            if users is not None:
                users.discard(region.region_id)
                if users:
                    continue
            held = self.group_slots.pop(key, None)
            if held is not None and self.pool.release(held, now_ms):
                self._requested_at.pop(held, None)
                cancelled.append(held)
        return cancelled

    def hand_idle_slots_to_waiting_groups(self) -> tuple[list[AllocationID], set[int]]:
        """A group still waiting for the RM takes an IDLE slot it fits in instead, so slots
        freed by finished regions are reused at once. Returns the RM requests to cancel and
        the regions that got a slot."""
        idle = self.pool.idle_count()
        if not idle:
            return [], set()
        waiting = []
        for s in self.pool.pending():  # oldest first; stop when there are no more idle slots
            if s.owner is not None and self.group_slots.get(s.owner) == s.allocation_id:
                waiting.append((s.owner, s.allocation_id))
                if len(waiting) == idle:
                    break
        cancelled: list[AllocationID] = []
        moved: set[int] = set()
        for key, pending in waiting:
            taken = self.pool.take_idle(key, self._profiles[key])
            if taken is None:
                continue
            self.pool.release(pending, 0)
            self._requested_at.pop(pending, None)
            cancelled.append(pending)
            self.group_slots[key] = taken
            moved |= self._users.get(key, set())
        return cancelled, moved

    def task_executor_lost(self, resource_id: ResourceID) -> set[GroupKey]:
        """Its slots are gone from the pool; returns the groups that lost their slot."""
        lost = {s.allocation_id for s in self.pool.lost(resource_id)}
        gone = {key for key, a in self.group_slots.items() if a in lost}
        for key in gone:
            del self.group_slots[key]
        for s, a in list(self._previous.items()):
            if a in lost:
                del self._previous[s]
        return gone

    def slots_on(self, resource_id: ResourceID) -> list[AllocationID]:
        """The slots the job holds on a TaskExecutor (Flink's allocated-slot report)."""
        return [s.allocation_id for s in self.pool.slots.values()
                if s.resource_id == resource_id and s.state != PoolSlotState.PENDING]
