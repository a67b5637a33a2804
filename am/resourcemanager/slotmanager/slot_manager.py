"""SlotManager: a pure core (events in, actions out; no I/O, no threads, time injected).

It tracks registered TaskExecutors and their slots, matches pending slot requests to free
slots (spreading them over TaskExecutors, like Flink's evenly-spread-out-slots), asks for new
TaskExecutors when requests cannot be met (up to ``max_slots``) and keeps at least
``min_slots``, and declares a TaskExecutor lost when its heartbeats stop.

A TaskExecutor's slots are handed out only once its first slot report (heartbeat) has come,
as in Flink: the TaskExecutor sends it as soon as it has the registration's answer, with the
ResourceManager's fencing token. A slot request sent at registration could reach the
TaskExecutor before that answer, be refused as fenced, and go to another TaskExecutor.

Slot states (as the SlotManager sees them)::

    FREE --request matched--> PENDING --TaskExecutor confirms (slot report)--> ALLOCATED
      ^                          |                                                |
      +---- allocation failed ---+------------ freed (slot report / free) --------+
"""

from __future__ import annotations

import enum
import logging
import math
import dataclasses
from dataclasses import dataclass, field
from typing import Union

from yarnflow.common.clock import Clock
from yarnflow.common.ids import AllocationID, JobID, ResourceID
from yarnflow.common.messages import MemoryStatus, ResourceProfile, SlotReport, TaskExecutorRegistration

log = logging.getLogger(__name__)


class SlotState(enum.Enum):
    FREE = "FREE"
    PENDING = "PENDING"
    ALLOCATED = "ALLOCATED"


@dataclass(frozen=True)
class SlotRequest:
    job_id: JobID
    allocation_id: AllocationID
    profile: ResourceProfile
    jobmaster_address: str
    jobmaster_token: str


@dataclass
class SlotInfo:
    index: int
    profile: ResourceProfile
    state: SlotState = SlotState.FREE
    allocation_id: AllocationID | None = None
    job_id: JobID | None = None
    pending_since_ms: int = 0


@dataclass
class RegisteredTaskExecutor:
    registration: TaskExecutorRegistration
    registration_id: str
    slots: list[SlotInfo]
    last_heartbeat_ms: int
    idle_since_ms: int
    reported: bool = False  # its first slot report came: its slots may be handed out
    memory: MemoryStatus | None = None  # what its memory watchdog measured last

    @property
    def resource_id(self) -> ResourceID:
        return self.registration.resource_id

    def free_slots(self) -> list[SlotInfo]:
        return [s for s in self.slots if s.state == SlotState.FREE]

    def allocations(self) -> list[tuple[JobID, AllocationID]]:
        return [(s.job_id, s.allocation_id) for s in self.slots
                if s.state != SlotState.FREE and s.job_id is not None and s.allocation_id is not None]


# ---- actions -------------------------------------------------------------------------------

@dataclass(frozen=True)
class AllocateSlot:
    """Ask TaskExecutor ``resource_id`` to give slot ``slot_index`` to ``request``."""

    resource_id: ResourceID
    slot_index: int
    request: SlotRequest


@dataclass(frozen=True)
class TaskExecutorLost:
    resource_id: ResourceID
    reason: str
    allocations: tuple[tuple[JobID, AllocationID], ...]
    stop_worker: bool = True  # False when the same process registered again: keep it running
    #: > 0: stop the worker only if it has not registered again after this long (a TaskExecutor
    #: silent past the heartbeat timeout may be cut off by the network: on heal it comes back,
    #: as in Flink, which keeps it; one that stays away exits by itself within its
    #: taskmanager.registration.timeout, or is stopped then)
    stop_after_ms: int = 0


@dataclass(frozen=True)
class StartWorkers:
    count: int


@dataclass(frozen=True)
class ReleaseWorker:
    resource_id: ResourceID
    reason: str


@dataclass(frozen=True)
class AllocationFailed:
    """A request cannot be met at all (e.g. no slot profile could ever fit it)."""

    request: SlotRequest
    reason: str


Action = Union[AllocateSlot, TaskExecutorLost, StartWorkers, ReleaseWorker, AllocationFailed]


@dataclass
class SlotManagerSettings:
    slots_per_worker: int
    min_slots: int = 0
    max_slots: int = 1024
    heartbeat_timeout_ms: int = 10_000
    pending_allocation_timeout_ms: int = 10_000
    idle_timeout_ms: int | None = None  # release idle TaskExecutors above min_slots after this
    #: the slot of a TaskExecutor the driver would start; None: unknown (never refuse a request)
    worker_slot_profile: ResourceProfile | None = None
    #: how long a TaskExecutor silent past the heartbeat timeout may come back before its worker
    #: is stopped (0: at once); the TaskExecutors' taskmanager.registration.timeout
    silent_worker_grace_ms: int = 0


@dataclass
class SlotManager:
    clock: Clock
    settings: SlotManagerSettings
    task_executors: dict[ResourceID, RegisteredTaskExecutor] = field(default_factory=dict)
    pending: dict[AllocationID, SlotRequest] = field(default_factory=dict)
    #: slots of the workers started and not registered yet (a worker registers as one
    #: TaskExecutor of all its slots, or with taskmanager.slot-processes as one per slot)
    pending_slots: int = 0
    #: slots registered so far per worker (``TaskExecutorRegistration.worker_id``)
    worker_slots: dict[ResourceID, int] = field(default_factory=dict)
    #: until then (monotonic ms) no worker is started: the previous leader's TaskExecutors are
    #: expected to register (Flink's resourcemanager.previous-worker.recovery.timeout)
    recovering_until_ms: int = 0
    #: the TaskExecutors the cluster was scaled to (``scale_to``); None: never scaled
    scaled_to: int | None = None

    def recover_previous_workers(self, timeout_ms: int) -> None:
        """A new leader: start no workers for ``timeout_ms`` (min slots or slot requests), so
        the TaskExecutors of the previous leader can register first."""
        if timeout_ms > 0:
            self.recovering_until_ms = self.clock.monotonic_ms() + timeout_ms

    # -- TaskExecutors ----------------------------------------------------------------------
    def register(self, registration: TaskExecutorRegistration, registration_id: str) -> list[Action]:
        now = self.clock.monotonic_ms()
        old = self.task_executors.get(registration.resource_id)
        actions: list[Action] = []
        if old is not None:  # re-registration (e.g. after a lost heartbeat): start afresh
            # not unregister(): its resource check would ask for a worker to replace this very one
            del self.task_executors[registration.resource_id]
            actions.append(TaskExecutorLost(registration.resource_id, "re-registered", tuple(old.allocations()),
                                            stop_worker=False))
        else:
            self.pending_slots = max(0, self.pending_slots - registration.num_slots)
            worker = registration.worker_id
            self.worker_slots[worker] = self.worker_slots.get(worker, 0) + registration.num_slots
        slots = [SlotInfo(i, registration.slot_profile) for i in range(registration.num_slots)]
        self.task_executors[registration.resource_id] = RegisteredTaskExecutor(
            registration, registration_id, slots, now, now)
        log.info("TaskExecutor %s registered with %d slots", registration.resource_id, registration.num_slots)
        if old is None and self.scaled_to is not None and \
                self.total_slots() > self.scaled_to * max(1, self.settings.slots_per_worker):
            # started before the cluster was scaled down: not wanted any more
            del self.task_executors[registration.resource_id]
            return actions + [ReleaseWorker(registration.resource_id,
                                            f"the cluster was scaled to {self.scaled_to} TaskExecutors")]
        return actions + self._check_resources()  # its slots count as coming; handed out after its first report

    def by_registration(self, registration_id: str) -> RegisteredTaskExecutor | None:
        for te in self.task_executors.values():
            if te.registration_id == registration_id:
                return te
        return None

    def heartbeat(self, registration_id: str, report: SlotReport) -> list[Action] | None:
        """None when the registration is unknown (the TaskExecutor must register again)."""
        te = self.by_registration(registration_id)
        if te is None:
            return None
        now = self.clock.monotonic_ms()
        te.last_heartbeat_ms = now
        te.reported = True
        te.memory = report.memory or te.memory
        for status in report.slots:
            if not 0 <= status.slot_index < len(te.slots):
                continue
            slot = te.slots[status.slot_index]
            if status.allocation_id is None:
                if slot.state == SlotState.ALLOCATED or (
                        slot.state == SlotState.PENDING
                        and now - slot.pending_since_ms > self.settings.pending_allocation_timeout_ms):
                    self._free(slot)
            elif slot.allocation_id != status.allocation_id or slot.state != SlotState.ALLOCATED:
                if slot.state == SlotState.FREE or slot.allocation_id == status.allocation_id:
                    self.pending.pop(status.allocation_id, None)
                    slot.state, slot.allocation_id, slot.job_id = SlotState.ALLOCATED, status.allocation_id, status.job_id
        if any(s.state != SlotState.FREE for s in te.slots) or report.blocking_partitions:
            te.idle_since_ms = now  # slots in use, or results kept for consumers: not idle
        return self._match_pending()

    def unregister(self, resource_id: ResourceID, reason: str) -> list[Action]:
        te = self.task_executors.pop(resource_id, None)
        if te is None:
            return []
        log.info("TaskExecutor %s removed: %s", resource_id, reason)
        return [TaskExecutorLost(resource_id, reason, tuple(te.allocations()))] + self._check_resources()

    def worker_start_failed(self) -> list[Action]:
        self.pending_slots = max(0, self.pending_slots - max(1, self.settings.slots_per_worker))
        return self._check_resources()

    def worker_terminated(self, worker_id: ResourceID, reason: str) -> list[Action]:
        """A worker the driver started ended: each TaskExecutor it ran is lost, and the slots it
        had not registered yet are no longer coming."""
        actions: list[Action] = []
        for rid, te in list(self.task_executors.items()):
            if te.registration.worker_id == worker_id:
                actions += self.unregister(rid, reason)
        missing = max(1, self.settings.slots_per_worker) - self.worker_slots.pop(worker_id, 0)
        if missing > 0:
            self.pending_slots = max(0, self.pending_slots - missing)
        return actions + self._check_resources()

    def check_timeouts(self) -> list[Action]:
        now = self.clock.monotonic_ms()
        actions: list[Action] = []
        if self.recovering_until_ms and now >= self.recovering_until_ms:
            self.recovering_until_ms = 0
            actions += self._match_pending()  # what the previous workers did not cover
        for rid, te in list(self.task_executors.items()):
            silent = now - te.last_heartbeat_ms
            if silent > self.settings.heartbeat_timeout_ms:
                lost = self.unregister(rid, f"no heartbeat for {silent} ms (heartbeat.timeout "
                                            f"{self.settings.heartbeat_timeout_ms} ms)")
                actions += [dataclasses.replace(a, stop_after_ms=self.settings.silent_worker_grace_ms)
                            if isinstance(a, TaskExecutorLost) and self.settings.silent_worker_grace_ms else a
                            for a in lost]
        idle = self.settings.idle_timeout_ms
        if idle is not None:
            for rid, te in list(self.task_executors.items()):
                busy = any(s.state != SlotState.FREE for s in te.slots)
                if busy or now - te.idle_since_ms < idle:
                    continue
                if self.total_slots() - len(te.slots) < self.settings.min_slots or self.pending:
                    continue
                self.task_executors.pop(rid)
                actions.append(ReleaseWorker(rid, f"idle for {now - te.idle_since_ms} ms"))
        return actions

    # -- slot requests ----------------------------------------------------------------------
    def request_slot(self, request: SlotRequest) -> list[Action]:
        if request.allocation_id in self.pending or self._slot_of(request.allocation_id) is not None:
            log.debug("duplicate slot request %s ignored", request.allocation_id)
            return []
        worker = self.settings.worker_slot_profile
        if worker is not None and not request.profile.fits_in(worker) and not any(
                request.profile.fits_in(s.profile) for te in self.task_executors.values() for s in te.slots):
            return [AllocationFailed(request, f"no slot can offer {request.profile.cpu_cores:g} cores and "
                                              f"{request.profile.memory_mb} MB: a TaskExecutor slot has "
                                              f"{worker.cpu_cores:g} cores and {worker.memory_mb} MB")]
        self.pending[request.allocation_id] = request
        return self._match_pending()

    def cancel_request(self, allocation_id: AllocationID) -> None:
        self.pending.pop(allocation_id, None)

    def allocation_failed(self, resource_id: ResourceID, slot_index: int, allocation_id: AllocationID,
                          request: SlotRequest) -> list[Action]:
        """The TaskExecutor refused or could not be reached: free the slot, retry elsewhere."""
        te = self.task_executors.get(resource_id)
        if te is not None and 0 <= slot_index < len(te.slots) and te.slots[slot_index].allocation_id == allocation_id:
            self._free(te.slots[slot_index])
        self.pending[allocation_id] = request
        return self._match_pending(exclude=resource_id)

    def free_allocation(self, allocation_id: AllocationID) -> list[Action]:
        self.pending.pop(allocation_id, None)
        slot = self._slot_of(allocation_id)
        if slot is not None:
            self._free(slot[1])
            if not any(s.state != SlotState.FREE for s in slot[0].slots):
                slot[0].idle_since_ms = self.clock.monotonic_ms()  # idle from now, as in Flink
        return self._match_pending()

    def ensure_min_resources(self) -> list[Action]:
        return self._check_resources()

    def scale_to(self, workers: int, configured_max_slots: int) -> list[Action]:
        """The cluster is to have ``workers`` TaskExecutors (``yarnflow session scale``): it keeps
        exactly their slots (min and max), starts what is missing and releases the rest, idle
        ones first, then those running the fewest tasks (whose jobs lose them: the adaptive
        scheduler runs them on at fewer); a worker started before and registering after is
        released as it registers. Raises ValueError above ``configured_max_slots``."""
        spw = max(1, self.settings.slots_per_worker)
        if workers < 0 or workers * spw > configured_max_slots:
            raise ValueError(f"{workers} TaskExecutors of {spw} slots: the cluster allows "
                             f"{configured_max_slots // spw} (slotmanager.number-of-slots.max {configured_max_slots})")
        self.settings.min_slots = self.settings.max_slots = workers * spw
        self.scaled_to = workers
        surplus = self.total_slots() + self.pending_slots - workers * spw
        self.pending_slots -= min(max(surplus, 0), self.pending_slots)  # started, not yet here: not waited for
        actions: list[Action] = []
        by_worker: dict[ResourceID, list[RegisteredTaskExecutor]] = {}  # (slot processes go with their worker)
        for te in self.task_executors.values():
            by_worker.setdefault(te.registration.worker_id, []).append(te)
        by_load = sorted(by_worker.values(), key=lambda tes: (
            sum(s.state != SlotState.FREE for te in tes for s in te.slots), min(te.registration_id for te in tes)))
        for tes in by_load:
            if self.total_slots() <= workers * spw:
                break
            for te in tes:
                actions += self.unregister(te.resource_id, f"released: the cluster was scaled to {workers} TaskExecutors")
        return actions + self._check_resources()

    # -- queries ----------------------------------------------------------------------------
    def total_slots(self) -> int:
        return sum(len(te.slots) for te in self.task_executors.values())

    def free_slot_count(self) -> int:
        return sum(len(te.free_slots()) for te in self.task_executors.values())

    def slots_for_job(self, job_id: JobID) -> tuple[int, int]:
        """(the slots ``job_id`` could run in now: the free ones and its own, on TaskExecutors
        that reported; the slots of the workers being started): what the adaptive scheduler
        sizes a job by."""
        usable = sum(1 for te in self.task_executors.values() if te.reported for s in te.slots
                     if s.state == SlotState.FREE or s.job_id == job_id)
        return usable, self.pending_slots

    # -- internals --------------------------------------------------------------------------
    def _slot_of(self, allocation_id: AllocationID) -> tuple[RegisteredTaskExecutor, SlotInfo] | None:
        for te in self.task_executors.values():
            for s in te.slots:
                if s.allocation_id == allocation_id:
                    return te, s
        return None

    @staticmethod
    def _free(slot: SlotInfo) -> None:
        slot.state, slot.allocation_id, slot.job_id = SlotState.FREE, None, None

    def _match_pending(self, exclude: ResourceID | None = None) -> list[Action]:
        actions: list[Action] = []
        now = self.clock.monotonic_ms()
        for allocation_id, request in list(self.pending.items()):
            candidates = [te for te in self.task_executors.values()
                          if te.reported and te.resource_id != exclude
                          and any(request.profile.fits_in(s.profile) for s in te.free_slots())]
            if not candidates:
                continue
            te = max(candidates, key=lambda t: (len(t.free_slots()), -len(t.slots)))  # spread out
            slot = next(s for s in te.free_slots() if request.profile.fits_in(s.profile))
            slot.state, slot.allocation_id, slot.job_id = SlotState.PENDING, allocation_id, request.job_id
            slot.pending_since_ms = now
            te.idle_since_ms = now
            del self.pending[allocation_id]
            actions.append(AllocateSlot(te.resource_id, slot.index, request))
        return actions + self._check_resources()

    def _check_resources(self) -> list[Action]:
        if self.recovering_until_ms and self.clock.monotonic_ms() < self.recovering_until_ms:
            return []
        spw = max(1, self.settings.slots_per_worker)
        registered = self.total_slots()
        coming = self.pending_slots
        want = max(self.settings.min_slots - registered - coming,
                   len(self.pending) - self.free_slot_count() - coming)
        room = self.settings.max_slots - registered - coming
        want = min(want, room)
        if want <= 0:
            return []
        count = math.ceil(want / spw)
        self.pending_slots += count * spw
        return [StartWorkers(count)]
