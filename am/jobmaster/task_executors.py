"""The TaskExecutors one job uses, as its JobMaster sees them: where each one is, when it last
heartbeated to this JobMaster, which ones are lost to the job, and which of the job's tasks a
TaskExecutor's reports have left out. Bookkeeping for ``JobMasterCore``: no I/O, no clock of
its own (times are passed in)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from yarnflow.am.jobmaster.execution_graph import Execution
from yarnflow.common.messages import SlotOffer
from yarnflow.common.ids import ExecutionAttemptID, ResourceID
from yarnflow.common.states import ExecutionState

__all__ = ["JobTaskExecutors"]

_REPORTED_STATES = (ExecutionState.INITIALIZING, ExecutionState.RUNNING)  # a task in these runs there


class JobTaskExecutors:
    """``address``: the RPC address of every TaskExecutor the job used (deployed to or took
    slots from). ``lost``: the ones lost to the job (it takes nothing from them again and
    sends them nothing)."""

    def __init__(self) -> None:
        self.address: dict[ResourceID, str] = {}
        self.lost: set[ResourceID] = set()
        #: lost because a call to it failed (it may reach us while we cannot reach it)
        self.unreachable: set[ResourceID] = set()
        #: the ResourceManager registration each TaskExecutor's accepted offers came with
        self._registration: dict[ResourceID, str] = {}
        self._last_seen: dict[ResourceID, int] = {}
        self._missing_once: set[ExecutionAttemptID] = set()

    def used(self, resource_id: ResourceID, rpc_address: str) -> None:
        """The job deploys a task to ``resource_id``."""
        self.address[resource_id] = rpc_address

    def offered_slots(self, resource_id: ResourceID, rpc_address: str, now: int) -> None:
        """The job took slots of ``resource_id``: its heartbeats are awaited from ``now``."""
        self.address[resource_id] = rpc_address
        self._last_seen.setdefault(resource_id, now)

    def heard_from(self, resource_id: ResourceID, now: int) -> None:
        self._last_seen[resource_id] = now

    def reachable(self, resource_id: ResourceID | None) -> bool:
        """A TaskExecutor the job may still talk to (known and not lost)."""
        return resource_id is not None and resource_id not in self.lost

    def mark_lost(self, resource_id: ResourceID, unreachable: bool = False) -> bool:
        """False when it was lost already. ``unreachable``: a call to it failed (not only its
        heartbeats: a one-way partition may let it reach the job while the job cannot reach it)."""
        if unreachable:
            self.unreachable.add(resource_id)
        if resource_id in self.lost:
            return False
        self.lost.add(resource_id)
        return True

    def registration(self, resource_id: ResourceID, offers: Iterable[SlotOffer]) -> None:
        """Remember the registration the offers of ``resource_id`` came with."""
        for offer in offers:
            if offer.registration_id:
                self._registration[resource_id] = offer.registration_id

    def registered_again(self, resource_id: ResourceID, registration_id: str) -> bool:
        """An offer of a lost TaskExecutor made under a later registration than the one the job
        knew (an offer without one, from an older TaskExecutor, never is)."""
        return bool(registration_id) and registration_id != self._registration.get(resource_id, "")

    def came_back(self, resource_id: ResourceID) -> None:
        """A lost TaskExecutor registered again (with nothing of the job left): usable again,
        its heartbeats awaited afresh."""
        self.lost.discard(resource_id)
        self.unreachable.discard(resource_id)
        self._last_seen.pop(resource_id, None)

    def silent(self, holding: Iterable[ResourceID], now: int, timeout_ms: int) -> list[tuple[ResourceID, int]]:
        """(TaskExecutor, ms since its last heartbeat) of each of ``holding`` (the ones with the
        job's slots or tasks) not lost yet and silent for longer than ``timeout_ms``. One never
        heard from counts from ``now``."""
        overdue = []
        for rid in sorted(set(holding) - self.lost):
            last = self._last_seen.setdefault(rid, now)
            if now - last > timeout_ms:
                overdue.append((rid, now - last))
        return overdue

    def missing_twice(self, resource_id: ResourceID, executions: Iterable[Execution],
                      reported: set[ExecutionAttemptID]) -> Iterator[Execution]:
        """Of ``executions`` (the job's current ones), those that run on ``resource_id`` as far
        as the job knows (initializing or running: a deployment may still be on its way) and that
        this report (``reported``) and the one before both left out. A generator: the caller may
        fail each one before the next is looked at (a failure that cancels others changes their
        state, and a canceling task is not missing)."""
        for ex in executions:
            if ex.slot is None or ex.slot.resource_id != resource_id or ex.attempt_id in reported:
                self._missing_once.discard(ex.attempt_id)
                continue
            if ex.state not in _REPORTED_STATES:
                continue
            if ex.attempt_id not in self._missing_once:
                self._missing_once.add(ex.attempt_id)
                continue
            self._missing_once.discard(ex.attempt_id)
            yield ex

    def reachable_addresses(self) -> dict[ResourceID, str]:
        """The address of every TaskExecutor the job used and has not lost."""
        return {rid: address for rid, address in self.address.items() if rid not in self.lost}
