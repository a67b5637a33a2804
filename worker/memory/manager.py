"""Managed memory: the working memory batch operators take from a fixed budget per slot
(Flink's MemoryManager and its managed-memory fractions).

A TaskExecutor has ``taskmanager.memory.managed.size`` bytes of managed memory (when unset:
``taskmanager.memory.managed.fraction`` of ``taskmanager.memory.process.size``), split evenly
between its slots. Each operator that needs working memory (joins, aggregations, sorts) gets a
``MemoryBudget``: its fraction of its slot's bytes, the fraction set when the job was compiled
(the operators that may run at once in one slot share it). An operator reserves bytes before it
keeps data and releases them when it lets go; a reservation that would pass its budget, or what
is left of its slot, is refused and the operator spills to disk instead. So the working memory
of a slot's operators never exceeds the slot's share, however large the input.

The budget counts what operators hold (Arrow buffers, by ``nbytes``, and estimates for Python
objects); it does not allocate. Short-lived temporaries of one vectorised call (an Arrow join or
group-by of data the operator holds) come on top, which is why operators plan with a margin
(see ``MemoryBudget.fits``).

    manager = MemoryManager(total_bytes=256 << 20, num_slots=2)
    budget = manager.budget(slot=0, fraction=0.5, owner="attempt-1")   # 64 MB
    if budget.try_reserve(batch.nbytes): keep(batch)
    else: spill(batch)
    ...
    manager.release_owner("attempt-1")   # the task ended: whatever it still holds goes back

Shared resources (Flink's ``getSharedMemoryResourceForManagedMemory``): memory that the tasks of
one slot use together, RocksDB's block cache and write buffers. The first task to ask for
``kind`` in a slot reserves its bytes from the slot and makes it; the others get the same one;
it goes back to the slot when the last of them ended.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Generic, TypeVar

from yarnflow.common.errors import YarnflowError

log = logging.getLogger(__name__)

__all__ = ["MemoryBudget", "MemoryManager", "MemoryReservationError", "UNLIMITED", "managed_memory_bytes"]

R = TypeVar("R")

#: the limit of a budget that is not bounded (operators run outside a TaskExecutor, tests)
UNLIMITED = 1 << 62


class MemoryReservationError(YarnflowError):
    """An operator needed more managed memory than its budget allows, and could not spill to
    make room (one row group, one key's rows too large for the budget). Give the TaskExecutors
    more managed memory (``taskmanager.memory.managed.size``) or fewer slots."""


class _SlotPool:
    """One slot's managed memory: what its budgets hold together never passes ``capacity``."""

    __slots__ = ("capacity", "used")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0


class MemoryBudget:
    """One operator's share of its slot's managed memory.

    ``try_reserve`` and ``release`` are called from the operator's task thread; the slot's pool is
    shared with the other tasks of the slot, so the pool is updated under the manager's lock."""

    def __init__(self, limit: int, *, pool: _SlotPool | None = None, lock: threading.Lock | None = None,
                 owner: str = "", name: str = "") -> None:
        if limit < 0:
            raise ValueError("a memory budget cannot be negative")
        self.limit = limit
        self.owner = owner
        self.name = name
        self.used = 0
        #: the most this budget ever held at once
        self.peak = 0
        self._pool = pool
        self._lock = lock or threading.Lock()

    @classmethod
    def unlimited(cls) -> MemoryBudget:
        return cls(UNLIMITED)

    @property
    def bounded(self) -> bool:
        return self.limit < UNLIMITED

    @property
    def available(self) -> int:
        """Bytes that can still be reserved (the budget's rest, or less when the slot is short)."""
        with self._lock:
            rest = self.limit - self.used
            if self._pool is not None:
                rest = min(rest, self._pool.capacity - self._pool.used)
            return max(0, rest)

    def fits(self, nbytes: int, margin: float = 1.0) -> bool:
        """Whether ``nbytes`` of data, with ``margin`` times as much again for the temporaries of
        working on it, fit in the whole budget (held or not)."""
        return nbytes * (1.0 + margin) <= self.limit

    def try_reserve(self, nbytes: int) -> bool:
        """Reserve ``nbytes``; False (nothing reserved) when the budget or the slot has no room."""
        if nbytes <= 0:
            return True
        with self._lock:
            if self.used + nbytes > self.limit:
                return False
            if self._pool is not None:
                if self._pool.used + nbytes > self._pool.capacity:
                    return False
                self._pool.used += nbytes
            self.used += nbytes
            if self.used > self.peak:
                self.peak = self.used
            return True

    def reserve(self, nbytes: int, what: str = "") -> None:
        """Reserve ``nbytes`` or raise ``MemoryReservationError`` naming ``what`` needed them."""
        if not self.try_reserve(nbytes):
            raise MemoryReservationError(
                f"{self.name or 'an operator'} needs {nbytes / 2**20:.1f} MB of managed memory"
                f"{' for ' + what if what else ''}, but its budget has {self.available / 2**20:.1f} MB of "
                f"{self.limit / 2**20:.1f} MB left; raise taskmanager.memory.managed.size (or .fraction) or "
                "use fewer slots per TaskExecutor")

    def release(self, nbytes: int) -> None:
        if nbytes <= 0:
            return
        with self._lock:
            nbytes = min(nbytes, self.used)
            self.used -= nbytes
            if self._pool is not None:
                self._pool.used -= nbytes

    def release_all(self) -> None:
        self.release(self.used)

    def __repr__(self) -> str:
        limit = "unlimited" if not self.bounded else f"{self.limit / 2**20:.1f} MB"
        return f"MemoryBudget({self.name or self.owner!r}, {self.used / 2**20:.1f} MB of {limit})"


def managed_memory_bytes(config: Any) -> int:
    """A TaskExecutor's managed memory as ``config`` (a Configuration) sets it."""
    from yarnflow.common.config import Options

    size = int(config[Options.MANAGED_MEMORY_SIZE])
    if size > 0:
        return size
    return int(config[Options.TM_MEMORY] * config[Options.MANAGED_MEMORY_FRACTION])


class _Shared(Generic[R]):
    """A resource the tasks ``owners`` of one slot share, holding ``nbytes`` of its managed memory."""

    __slots__ = ("nbytes", "owners", "resource")

    def __init__(self, resource: R, nbytes: int) -> None:
        self.resource = resource
        self.nbytes = nbytes
        self.owners: set[str] = set()


class MemoryManager:
    """A TaskExecutor's managed memory, ``total_bytes`` split evenly between ``num_slots`` slots."""

    def __init__(self, total_bytes: int, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError("a TaskExecutor has at least one slot")
        self.total_bytes = max(0, int(total_bytes))
        self.num_slots = num_slots
        self.slot_bytes = self.total_bytes // num_slots
        self._lock = threading.Lock()
        self._pools = [_SlotPool(self.slot_bytes) for _ in range(num_slots)]
        self._budgets: dict[str, list[MemoryBudget]] = {}
        self._shared: dict[tuple[int, str], _Shared[Any]] = {}

    def budget(self, slot: int, fraction: float, owner: str, name: str = "") -> MemoryBudget:
        """A budget of ``fraction`` of slot ``slot``'s bytes for an operator of task ``owner``."""
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"no slot {slot}: this TaskExecutor has {self.num_slots}")
        fraction = min(1.0, max(0.0, fraction))
        budget = MemoryBudget(int(self.slot_bytes * fraction), pool=self._pools[slot], lock=self._lock,
                              owner=owner, name=name)
        with self._lock:
            self._budgets.setdefault(owner, []).append(budget)
        return budget

    def shared(self, slot: int, kind: str, owner: str, make: Callable[[int], R], nbytes: int = 0) -> R:
        """The resource ``kind`` of slot ``slot`` that its tasks share, made by ``make(bytes)``
        for the first task ``owner`` that asks: ``nbytes`` (0: all the slot's managed memory not
        reserved yet) are reserved from the slot until the last task holding it ended."""
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"no slot {slot}: this TaskExecutor has {self.num_slots}")
        with self._lock:
            shared = self._shared.get((slot, kind))
            if shared is None:
                pool = self._pools[slot]
                free = max(0, pool.capacity - pool.used)
                size = min(nbytes or free, free)
                if size < (nbytes or pool.capacity):
                    log.warning("slot %d has %.1f MB of managed memory left for %s (wanted %.1f MB)", slot,
                                size / 2**20, kind, (nbytes or pool.capacity) / 2**20)
                shared = _Shared(make(size), size)  # quick: it allocates nothing yet
                pool.used += size
                self._shared[(slot, kind)] = shared
            shared.owners.add(owner)
            return shared.resource  # type: ignore[no-any-return]

    def shared_resources(self, kind: str) -> list[Any]:
        """The shared resources ``kind`` that slots hold now."""
        with self._lock:
            return [s.resource for (_, k), s in self._shared.items() if k == kind]

    def shared_bytes(self, kind: str) -> int:
        """Bytes the shared resources ``kind`` of all slots hold."""
        with self._lock:
            return sum(s.nbytes for (_, k), s in self._shared.items() if k == kind)

    def release_owner(self, owner: str) -> int:
        """The task ``owner`` ended: release what its budgets still hold; returns those bytes
        (an operator that released everything itself leaves 0). A shared resource it was the
        last to hold goes back to its slot."""
        with self._lock:
            budgets = self._budgets.pop(owner, [])
            for key, shared in list(self._shared.items()):
                shared.owners.discard(owner)
                if not shared.owners:
                    del self._shared[key]
                    self._pools[key[0]].used -= shared.nbytes
        leaked = 0
        for b in budgets:
            leaked += b.used
            b.release_all()
        if leaked:
            log.debug("task %s ended holding %d bytes of managed memory: released", owner, leaked)
        return leaked

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(p.used for p in self._pools)

    def owner_usage(self, owner: str) -> tuple[int, int, int]:
        """``(budget, used, peak)`` bytes over the budgets of task ``owner``."""
        with self._lock:
            budgets = list(self._budgets.get(owner, ()))
        return (sum(b.limit for b in budgets), sum(b.used for b in budgets), sum(b.peak for b in budgets))

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {"total": self.total_bytes, "slot": self.slot_bytes,
                    "used": [p.used for p in self._pools]}
