"""Injectable time. Cores take a ``Clock``; shells schedule through a ``TimerService``.

``ManualClock`` lets tests move time by hand; nothing in a core calls ``time.sleep``."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Callable, Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def monotonic_ms(self) -> int: ...


class SystemClock:
    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def monotonic_ms(self) -> int:
        return int(time.monotonic() * 1000)


class ManualClock:
    """A clock that moves only when ``advance`` is called."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def monotonic_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> None:
        if ms < 0:
            raise ValueError("time only moves forward")
        self._now += ms


class TimerHandle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualTimerService:
    """Timers fired by ``advance``, in due order; for tests of shells that take a timer service."""

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.clock = clock or ManualClock()
        self._heap: list[tuple[int, int, TimerHandle, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()

    def schedule(self, delay_ms: int, fn: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle()
        with self._lock:
            heapq.heappush(self._heap, (self.clock.now_ms() + max(0, delay_ms), next(self._seq), handle, fn))
        return handle

    def advance(self, ms: int) -> None:
        target = self.clock.now_ms() + ms
        while True:
            with self._lock:
                if not self._heap or self._heap[0][0] > target:
                    break
                due, _, handle, fn = heapq.heappop(self._heap)
            self.clock.advance(max(0, due - self.clock.now_ms()))
            if not handle.cancelled:
                fn()
        self.clock.advance(target - self.clock.now_ms())
