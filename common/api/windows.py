"""Window assigners (times are int64 milliseconds; window starts follow Flink's
``TimeWindow.getWindowStartWithOffset``, also for negative timestamps):

    TumblingEventTimeWindows.of(size_ms, offset_ms=0)        [start, start + size)
    SlidingEventTimeWindows.of(size_ms, slide_ms, offset_ms=0)
    EventTimeSessionWindows.with_gap(gap_ms)                  [t, t + gap), merged per key
    TumblingProcessingTimeWindows / SlidingProcessingTimeWindows / ProcessingTimeSessionWindows

They only say which windows a record belongs to; the TaskExecutor's window operators
(``yarnflow.worker.operators.windows``) keep, fire and merge the windows.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable

__all__ = [
    "EventTimeSessionWindows",
    "ProcessingTimeSessionWindows",
    "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "WindowAssigner",
    "milliseconds",
    "window_start_with_offset",
]


def window_start_with_offset(timestamp: int, offset_ms: int, size_ms: int) -> int:
    """The start of the window of ``size_ms``, aligned to ``offset_ms``, that holds ``timestamp``
    (Flink's TimeWindow.getWindowStartWithOffset; right for negative timestamps too)."""
    return timestamp - (timestamp - offset_ms) % size_ms


def milliseconds(value: Any, what: str) -> int:
    """``value`` as an int of milliseconds; raises ValueError naming ``what`` for anything but an
    integer (a bool or a float is refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{what} must be an integer number of milliseconds, got {value!r}")
    return int(value)


class WindowAssigner:
    """Which windows ``[start, end)`` a record at ``timestamp`` (ms) belongs to."""

    is_event_time = True
    #: session windows: a key's windows merge when they overlap or touch
    is_merging = False

    def assign_windows(self, timestamp: int) -> list[tuple[int, int]]:
        raise NotImplementedError

    def session_window(self, timestamp: int, row: dict[str, Any]) -> tuple[int, int]:
        """A merging assigner's window for a row (before merging)."""
        return self.assign_windows(timestamp)[0]

    def _params(self) -> dict[str, int]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._params() == self._params()

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(self._params().items())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v}' for k, v in self._params().items())})"


class _SlidingAssigner(WindowAssigner):
    """Windows of ``size_ms`` starting every ``slide_ms`` (tumbling: slide == size)."""

    def __init__(self, size_ms: int, slide_ms: int, offset_ms: int) -> None:
        self.size_ms = size_ms
        self.slide_ms = slide_ms
        self.offset_ms = offset_ms

    def assign_windows(self, timestamp: int) -> list[tuple[int, int]]:
        start = window_start_with_offset(timestamp, self.offset_ms, self.slide_ms)
        windows = []
        while start > timestamp - self.size_ms:
            windows.append((start, start + self.size_ms))
            start -= self.slide_ms
        return windows


class _TumblingAssigner(_SlidingAssigner):
    def __init__(self, size_ms: int, offset_ms: int = 0) -> None:
        size, offset = milliseconds(size_ms, "window size"), milliseconds(offset_ms, "window offset")
        if size <= 0:
            raise ValueError(f"window size must be positive, got {size} ms")
        if abs(offset) >= size:
            raise ValueError(f"window offset must satisfy abs(offset) < size, got offset {offset} ms "
                             f"for size {size} ms")
        super().__init__(size, size, offset)

    @classmethod
    def of(cls, size_ms: int, offset_ms: int = 0) -> Any:
        return cls(size_ms, offset_ms)

    def _params(self) -> dict[str, int]:
        return {"size_ms": self.size_ms, "offset_ms": self.offset_ms}


class _SlidingWindows(_SlidingAssigner):
    def __init__(self, size_ms: int, slide_ms: int, offset_ms: int = 0) -> None:
        size, slide = milliseconds(size_ms, "window size"), milliseconds(slide_ms, "window slide")
        offset = milliseconds(offset_ms, "window offset")
        if size <= 0:
            raise ValueError(f"window size must be positive, got {size} ms")
        if slide <= 0:
            raise ValueError(f"window slide must be positive, got {slide} ms")
        if abs(offset) >= slide:
            raise ValueError(f"window offset must satisfy abs(offset) < slide, got offset {offset} ms "
                             f"for slide {slide} ms")
        super().__init__(size, slide, offset)

    @classmethod
    def of(cls, size_ms: int, slide_ms: int, offset_ms: int = 0) -> Any:
        return cls(size_ms, slide_ms, offset_ms)

    def _params(self) -> dict[str, int]:
        return {"size_ms": self.size_ms, "slide_ms": self.slide_ms, "offset_ms": self.offset_ms}


class _SessionAssigner(WindowAssigner):
    is_merging = True

    def __init__(self, gap_ms: int, gap_of: Callable[[dict[str, Any]], int] | None = None) -> None:
        if gap_of is None:
            gap = milliseconds(gap_ms, "session gap")
            if gap <= 0:
                raise ValueError(f"session gap must be positive, got {gap} ms")
        elif not callable(gap_of):
            raise ValueError(f"a dynamic session gap needs a function of the row, got {gap_of!r}")
        self.gap_ms = gap_ms if gap_of is None else 0
        #: with_dynamic_gap: each row's own gap (ms), from the row
        self.gap_of = gap_of

    @classmethod
    def with_gap(cls, gap_ms: int) -> Any:
        return cls(gap_ms)

    @classmethod
    def with_dynamic_gap(cls, gap_of: Callable[[dict[str, Any]], int]) -> Any:
        """Each row's session gap from ``gap_of(row)`` (ms, positive): a row extends its key's
        session by its own gap (Flink's SessionWindowTimeGapExtractor)."""
        return cls(0, gap_of)

    def assign_windows(self, timestamp: int) -> list[tuple[int, int]]:
        return [(timestamp, timestamp + self.gap_ms)]

    def session_window(self, timestamp: int, row: dict[str, Any]) -> tuple[int, int]:
        """The session window a row at ``timestamp`` opens (before merging)."""
        if self.gap_of is None:
            return timestamp, timestamp + self.gap_ms
        gap = self.gap_of(row)
        if isinstance(gap, bool) or not isinstance(gap, numbers.Integral) or gap <= 0:
            raise ValueError(f"the dynamic session gap must be a positive int of milliseconds, got {gap!r}")
        return timestamp, timestamp + int(gap)

    def _params(self) -> dict[str, int]:
        return {"gap_ms": self.gap_ms} if self.gap_of is None else {"dynamic_gap": id(self.gap_of)}


class TumblingEventTimeWindows(_TumblingAssigner):
    """``TumblingEventTimeWindows.of(size_ms, offset_ms=0)``: windows ``[start, start + size)``."""

    is_event_time = True


class SlidingEventTimeWindows(_SlidingWindows):
    """``SlidingEventTimeWindows.of(size_ms, slide_ms, offset_ms=0)``: a record is in every
    window of ``size_ms`` that holds it, one starting every ``slide_ms``."""

    is_event_time = True


class EventTimeSessionWindows(_SessionAssigner):
    """``EventTimeSessionWindows.with_gap(gap_ms)``: a key's records less than (or exactly)
    ``gap_ms`` apart share a session."""

    is_event_time = True


class TumblingProcessingTimeWindows(_TumblingAssigner):
    """Tumbling windows over the processing time at which records arrive."""

    is_event_time = False


class SlidingProcessingTimeWindows(_SlidingWindows):
    """Sliding windows over the processing time at which records arrive."""

    is_event_time = False


class ProcessingTimeSessionWindows(_SessionAssigner):
    """Session windows over the processing time at which records arrive."""

    is_event_time = False
