"""Time a task spends waiting (for room in its outputs: back-pressure; for input: idle),
readable while a wait is still going on.

A counter that grows only when a wait ends shows nothing of a wait that lasts a minute until
the minute is over: a source blocked behind a slow consumer read "back-pressure ok (0 ms/s)"
and "busy 1000 ms/s" for as long as it was blocked. ``ns`` adds the wait in progress, so a
metrics sample taken mid-wait sees it.

One thread (the task's) calls ``begin``/``end``; any thread reads ``ns``. The reader takes the
finished total before the start of the current wait and ``end`` clears the start before adding
to the total, so a read that races with ``end`` can miss the ending wait for that one sample
(it is in the next) but never counts it twice: successive reads never go down."""

from __future__ import annotations

import time

__all__ = ["WaitClock"]


class WaitClock:
    __slots__ = ("_done_ns", "_since")

    def __init__(self) -> None:
        self._done_ns = 0
        self._since: int | None = None

    def begin(self) -> None:
        self._since = time.perf_counter_ns()

    def end(self) -> None:
        since, self._since = self._since, None
        if since is not None:
            self._done_ns += time.perf_counter_ns() - since

    def add(self, ns: int) -> None:
        """A wait timed by the caller."""
        self._done_ns += ns

    @property
    def ns(self) -> int:
        """Nanoseconds waited so far, the wait in progress included."""
        done, since = self._done_ns, self._since
        return done + (time.perf_counter_ns() - since if since is not None else 0)
