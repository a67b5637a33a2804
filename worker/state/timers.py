"""Timers per (key, namespace, timestamp), kept in the keyed state backend (Flink's
InternalTimerService). One service serves keyed process functions (namespace None) and window
operators (the window as namespace) alike.

A timer is an entry of the backend (state ``<service>:<domain>``, kind ``timer``) whose value is
its registration number: registering an existing timer does nothing, deleting a missing one does
nothing, and timers are checkpointed, restored and rescaled with the rest of the keyed state. A
heap per time domain orders them by (timestamp, registration); it is an index rebuilt from the
entries on restore, and deleted timers are skipped when they come up.

Register and delete act on the backend's current key. ``pop_next`` / ``due`` hand back
``(timestamp, key group, key, namespace)``; the caller sets that key current before running the
timer's callback.
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING, Any

from yarnflow.common.api.functions import EVENT_TIME, PROCESSING_TIME

if TYPE_CHECKING:
    from yarnflow.worker.state.heap import HeapKeyedStateBackend

__all__ = ["DOMAINS", "InternalTimerService", "Timer"]

DOMAINS = (EVENT_TIME, PROCESSING_TIME)
Timer = tuple[int, int, Any, Any]  # (timestamp, key group, key, namespace)
_GONE = object()


class InternalTimerService:
    def __init__(self, backend: HeapKeyedStateBackend, name: str) -> None:
        self._backend = backend
        self.name = name
        self._names = {domain: f"{name}:{domain}" for domain in DOMAINS}
        for domain, state in self._names.items():
            backend._register_timers(state, name, domain)
        self._heaps: dict[str, list[tuple[int, int, int, Any, Any]]] = {domain: [] for domain in DOMAINS}
        self._seq = itertools.count()
        self.rebuild()

    def state_name(self, domain: str) -> str:
        return self._names[domain]

    def rebuild(self) -> None:
        """Rebuild the heaps from the backend's timer entries (after a restore)."""
        top = -1
        for domain, state in self._names.items():
            heap = [(ts, seq, kg, key, ns) for kg, key, ns, ts, seq in self._entries(state)]
            heapq.heapify(heap)
            self._heaps[domain] = heap
            top = max([top, *(entry[1] for entry in heap)])
        self._seq = itertools.count(top + 1)

    def _entries(self, state: str) -> list[tuple[int, Any, Any, int, int]]:
        return [(kg, key, ns, ts, seq) for kg, (key, ns, ts), seq in self._backend.raw_entries(state)]

    # -- the current key's timers ------------------------------------------------------------------
    def register(self, domain: str, timestamp: int, namespace: Any = None) -> None:
        b = self._backend
        key, kg = b._require_key(), b._key_group
        assert kg is not None
        entry = (key, namespace, timestamp)
        state = self._names[domain]
        if b.lookup(state, kg, entry, _GONE) is not _GONE:
            return
        seq = next(self._seq)
        b.put(state, kg, entry, seq)
        heapq.heappush(self._heaps[domain], (timestamp, seq, kg, key, namespace))

    def delete(self, domain: str, timestamp: int, namespace: Any = None) -> None:
        b = self._backend
        key, kg = b._require_key(), b._key_group
        assert kg is not None
        b.remove(self._names[domain], kg, (key, namespace, timestamp))  # its heap entry is skipped later

    # -- firing --------------------------------------------------------------------------------------
    def _live(self, domain: str, ts: int, seq: int, kg: int, key: Any, ns: Any) -> bool:
        return self._backend.lookup(self._names[domain], kg, (key, ns, ts), _GONE) == seq

    def pop_next(self, domain: str, limit: int) -> Timer | None:
        """Remove and return the earliest live timer at or before ``limit`` (timers registered
        meanwhile at or before ``limit`` come up too)."""
        heap = self._heaps[domain]
        while heap and heap[0][0] <= limit:
            ts, seq, kg, key, ns = heapq.heappop(heap)
            if self._live(domain, ts, seq, kg, key, ns):
                self._backend.remove(self._names[domain], kg, (key, ns, ts))
                return ts, kg, key, ns
        return None

    def due(self, domain: str, limit: int) -> list[Timer]:
        """The live timers at or before ``limit``, in order, still registered: the caller fires
        each one ``take`` still finds (so a delete by an earlier callback wins, and timers
        registered by the callbacks wait for the next call)."""
        heap = self._heaps[domain]
        out: list[Timer] = []
        while heap and heap[0][0] <= limit:
            ts, seq, kg, key, ns = heapq.heappop(heap)
            if self._live(domain, ts, seq, kg, key, ns):
                out.append((ts, kg, key, ns))
        return out

    def take(self, domain: str, timer: Timer) -> bool:
        """Remove ``timer`` (from ``due``) if it is still registered; True when it was."""
        ts, kg, key, ns = timer
        state = self._names[domain]
        if self._backend.lookup(state, kg, (key, ns, ts), _GONE) is _GONE:
            return False
        self._backend.remove(state, kg, (key, ns, ts))
        return True

    def count(self, domain: str) -> int:
        """How many timers of ``domain`` are registered."""
        return sum(1 for _ in self._backend.raw_entries(self._names[domain]))
