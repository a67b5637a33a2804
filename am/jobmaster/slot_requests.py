"""One job's slot requests to the ResourceManager, for ``JobMasterCore``: asking for a slot,
the request's timeout, asking again for every open request when the ResourceManager changes,
and giving slots back (idle ones periodically, all of them when the job ends). Which subtasks
share which slot is ``SlotAssignment``'s business; this part only talks to the
ResourceManager and the TaskExecutors, through the core's actions.

Timeouts, each measured from its own start:
- ``slot.request.timeout``: a request not met in time fails a subtask waiting for it (through
  the restart strategy: the core's ``on_timeout``) and is renewed, unless a slot the job
  already holds could serve it once freed: it then waits on the job's own progress (like
  Flink's PhysicalSlotRequestBulkChecker);
- ``slot.idle.timeout``: a slot the job holds but has not used for that long goes back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from yarnflow.am.checkpoint.coordinator import TimerService
from yarnflow.am.jobmaster.actions import Action, FreeSlot, RequestSlot, ReturnAllocation
from yarnflow.am.jobmaster.slot_assignment import NewRequest, SlotAssignment
from yarnflow.am.jobmaster.task_executors import JobTaskExecutors
from yarnflow.am.resourcemanager.slotmanager.slot_manager import SlotRequest
from yarnflow.common.clock import Clock
from yarnflow.common.config import Configuration, Options
from yarnflow.common.ids import AllocationID, JobID, ResourceID
from yarnflow.common.messages import ErrorInfo
from yarnflow.common.states import JobStatus

__all__ = ["SlotRequests"]

log = logging.getLogger(__name__)


class SlotRequests:
    """``emit``: hands an action to the core's outbox. ``status``: the job's status now.
    ``on_timeout(allocation_id, error)``: a request timed out (the core fails a subtask waiting
    for it)."""

    def __init__(self, job_id: JobID, address: str, fencing_token: str, config: Configuration,
                 slots: SlotAssignment, task_executors: JobTaskExecutors, clock: Clock, timers: TimerService,
                 emit: Callable[[Action], None], status: Callable[[], JobStatus],
                 on_timeout: Callable[[AllocationID, ErrorInfo], None]) -> None:
        self.job_id = job_id
        self._address = address
        self._fencing_token = fencing_token
        self._timeout: int = config[Options.SLOT_REQUEST_TIMEOUT]
        self._idle_timeout: int = config[Options.SLOT_IDLE_TIMEOUT]
        self._slots = slots
        self._task_executors = task_executors
        self._clock = clock
        self._timers = timers
        self._emit = emit
        self._status = status
        self._on_timeout = on_timeout

    def start(self) -> None:
        """Start looking for idle slots (until the job ends)."""
        self._timers.schedule(self._idle_check_period(), self._check_idle_slots)

    def request(self, request: NewRequest) -> None:
        self._emit(RequestSlot(SlotRequest(self.job_id, request.allocation_id, request.profile, self._address,
                                           self._fencing_token)))
        allocation_id = request.allocation_id
        self._timers.schedule(self._timeout, lambda: self._timed_out(allocation_id))

    def ask_again(self) -> None:
        """A new ResourceManager leader knows nothing of this job's requests: repeat them."""
        pending = self._slots.pending_requests()
        log.info("job %s: the ResourceManager changed; asking again for %d slots", self.job_id, len(pending))
        for allocation_id, profile in pending:
            self._emit(RequestSlot(SlotRequest(self.job_id, allocation_id, profile, self._address,
                                               self._fencing_token)))

    def give_back(self, allocation_id: AllocationID, resource_id: ResourceID | None, rpc_address: str,
                  why: str) -> None:
        """Return the allocation to the ResourceManager and free the slot on its TaskExecutor
        (unless that one is lost to the job)."""
        self._emit(ReturnAllocation(allocation_id))
        if resource_id is not None and self._task_executors.reachable(resource_id):
            self._emit(FreeSlot(allocation_id, resource_id, rpc_address, f"job {self.job_id}: {why}"))

    def _now(self) -> int:
        return self._clock.monotonic_ms()

    def _timed_out(self, allocation_id: AllocationID) -> None:
        since = self._slots.requested_at(allocation_id)
        if since is None or self._status() != JobStatus.RUNNING:
            return  # met, cancelled, or the job is no longer running
        age = self._now() - since
        if age < self._timeout:
            self._timers.schedule(self._timeout - age, lambda: self._timed_out(allocation_id))
            return
        if self._slots.could_be_served_by_held_slot(allocation_id):
            log.debug("job %s: slot request %s waits on slots the job holds", self.job_id, allocation_id)
            self._rearm(allocation_id)
            return
        profile = self._slots.profile(self._slots.pool.owner_of(allocation_id))
        error = ErrorInfo("NoResourceAvailableError",
                          f"a slot ({profile.cpu_cores:g} cores, {profile.memory_mb} MB) did not come within "
                          f"slot.request.timeout ({self._timeout} ms)")
        log.warning("job %s: slot request %s timed out after %d ms", self.job_id, allocation_id, age)
        self._on_timeout(allocation_id, error)
        self._rearm(allocation_id)

    def _rearm(self, allocation_id: AllocationID) -> None:
        if self._slots.renew_request(allocation_id, self._now()):
            self._timers.schedule(self._timeout, lambda: self._timed_out(allocation_id))

    def _idle_check_period(self) -> int:
        return max(1000, min(self._idle_timeout, 10_000))

    def _check_idle_slots(self) -> None:
        if self._status().is_globally_terminal:
            return
        for slot in self._slots.pool.expired(self._now(), self._idle_timeout):
            self.give_back(slot.allocation_id, slot.resource_id, slot.rpc_address, "idle")
        self._timers.schedule(self._idle_check_period(), self._check_idle_slots)
