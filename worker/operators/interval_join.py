"""The interval join (Flink's IntervalJoinOperator), as a KeyedCoProcessFunction run by the
two-input operator (``co_process.py``): ``a.key_by(k).interval_join(b.key_by(k)).between(lo, hi)``
joins each row of ``a`` at event time ``ta`` with each row of ``b`` of the same key at ``tb`` with
``ta + lo <= tb <= ta + hi`` (either bound exclusive when asked).

Each side's rows wait in the key's MapState (event time -> rows) of the job's keyed state backend,
so they are checkpointed, restored and rescaled with it. A row of ``a`` at ``ta`` can meet rows of
``b`` up to ``ta + hi``: an event-time timer at ``ta + hi`` removes it once the watermark passed
that; a row of ``b`` at ``tb`` waits until ``tb - lo``. A row at or below the watermark when it
arrives is late (it could have missed rows already removed): it goes to the side output named for
its side when one was given, else it is dropped (``late_rows``).

Output: ``fn(left, right)`` per pair (a dict, or a scalar kept in column 'value'; None emits
nothing), or a ProcessJoinFunction's ``process_element(left, right, ctx, out)`` (``ctx`` has
``left_timestamp``, ``right_timestamp`` and ``timestamp``, the later of the two); without a
function, the left row's columns then the right's (a clashing name gets ``_right``)."""

from __future__ import annotations

from typing import Any, Callable

from yarnflow.common.api.co_functions import KeyedCoProcessFunction
from yarnflow.common.api.state import MapStateDescriptor
from yarnflow.common.errors import JobDefinitionError

__all__ = ["IntervalJoinFunction", "joined_row"]

_MIN_WATERMARK = -(2**63)
LEFT = MapStateDescriptor("interval-join-left")
RIGHT = MapStateDescriptor("interval-join-right")


def joined_row(left: dict[str, Any], right: dict[str, Any]) -> dict[str, Any]:
    """The left row's columns, then the right's; a right column named like a left one gets ``_right``."""
    row = dict(left)
    for name, value in right.items():
        row[f"{name}_right" if name in left else name] = value
    return row


class _JoinContext:
    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx
        self.left_timestamp = self.right_timestamp = self.timestamp = 0

    def output(self, tag: str, row: Any) -> None:
        self._ctx.output(tag, row)

    @property
    def current_key(self) -> Any:
        return self._ctx.current_key


class IntervalJoinFunction(KeyedCoProcessFunction):
    """The join itself (see the module doc); ``lower`` / ``upper`` in ms, inclusive here (the
    builder turns an exclusive bound into the inclusive one next to it)."""

    def __init__(self, lower: int, upper: int, fn: Any = None, late_tags: tuple[str | None, str | None] = (None, None)
                 ) -> None:
        if lower > upper:
            raise JobDefinitionError(f"interval join: the lower bound ({lower} ms) is above the upper bound "
                                     f"({upper} ms)")
        if fn is not None and not callable(fn) and not callable(getattr(fn, "process_element", None)):
            raise JobDefinitionError(f"interval join: process() takes a function (left, right) -> row or a "
                                     f"ProcessJoinFunction, got {fn!r}")
        self.lower, self.upper = lower, upper
        self.fn = fn
        self.late_tags = late_tags
        self.late_rows = 0

    def open(self, ctx: Any) -> None:
        if self.fn is not None and callable(getattr(self.fn, "open", None)):
            self.fn.open(ctx)

    def close(self) -> None:
        if self.fn is not None and callable(getattr(self.fn, "close", None)):
            self.fn.close()

    def process_element1(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        self._add(row, ctx, out, 0)

    def process_element2(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        self._add(row, ctx, out, 1)

    def _add(self, row: dict[str, Any], ctx: Any, out: Any, side: int) -> None:
        ts = ctx.timestamp
        watermark = ctx.timer_service().current_watermark()
        if watermark > _MIN_WATERMARK and ts <= watermark:
            tag = self.late_tags[side]
            if tag is not None:
                ctx.output(tag, row)
            self.late_rows += 1
            return
        mine, other = (self.get_state(LEFT), self.get_state(RIGHT)) if side == 0 else \
            (self.get_state(RIGHT), self.get_state(LEFT))
        bucket = mine.get(ts)
        mine.put(ts, [*bucket, row] if bucket else [row])
        lo, hi = (ts + self.lower, ts + self.upper) if side == 0 else (ts - self.upper, ts - self.lower)
        for other_ts, rows in sorted(other.items(), key=lambda item: item[0]):
            if lo <= other_ts <= hi:
                for other_row in rows:
                    if side == 0:
                        self._emit(row, other_row, ts, other_ts, ctx, out)
                    else:
                        self._emit(other_row, row, other_ts, ts, ctx, out)
        ctx.timer_service().register_event_time_timer(ts + self.upper if side == 0 else ts - self.lower)

    def _emit(self, left: dict[str, Any], right: dict[str, Any], left_ts: int, right_ts: int, ctx: Any,
              out: Any) -> None:
        fn = self.fn
        if fn is None:
            out.collect(joined_row(left, right))
        elif callable(getattr(fn, "process_element", None)):
            jc = _JoinContext(ctx)
            jc.left_timestamp, jc.right_timestamp, jc.timestamp = left_ts, right_ts, max(left_ts, right_ts)
            fn.process_element(left, right, jc, out)
        else:
            result = fn(left, right)
            if result is not None:
                out.collect(result)

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        for state, expires in ((self.get_state(LEFT), lambda t: t + self.upper),
                               (self.get_state(RIGHT), lambda t: t - self.lower)):
            for ts in [t for t in state.keys() if expires(t) <= timestamp]:
                state.remove(ts)


def interval_function(lower: int, upper: int, lower_exclusive: bool, upper_exclusive: bool, fn: Callable[..., Any] | Any,
                      late_tags: tuple[str | None, str | None]) -> IntervalJoinFunction:
    """The join function for bounds as the user gave them (an exclusive bound moves by 1 ms)."""
    return IntervalJoinFunction(lower + 1 if lower_exclusive else lower, upper - 1 if upper_exclusive else upper,
                                fn, late_tags)
