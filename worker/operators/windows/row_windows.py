"""Windows per key, folded row by row: any assigner (session windows merge) and any aggregation
(built-in aggregates, a user's AggregateFunction, a reduce function).

Everything lives in the keyed state backend, as Flink's WindowOperator keeps it:

- ``__window_contents__``: per (key, window) the accumulator and whether it holds rows not yet in
  an emitted result ("dirty"), as ``[accumulator, dirty]``; the window ``(start, end)`` is the
  namespace;
- ``__sessions__``: per key, the session windows it has open (a tuple; Flink's MergingWindowSet);
- timers (service ``__window_timers__``) per (key, window): one when the window fires (its end - 1
  in event time, its end in processing time) and, with allowed lateness, one when its state is
  dropped. Merging sessions moves the timers to the merged window.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from yarnflow.common.api.functions import EVENT_TIME, PROCESSING_TIME
from yarnflow.worker.operators.rows import RowBuffer
from yarnflow.worker.operators.windows.common import WINDOW_END, WINDOW_START, BuiltinAggs, Reduce, UserAggregate
from yarnflow.worker.key_assignment import key_groups
from yarnflow.worker.state.heap import ABSENT, HeapKeyedStateBackend

if TYPE_CHECKING:
    from yarnflow.worker.operators.windows.aggregate import WindowAggregateOperator

Window = tuple[int, int]


class RowWindows:
    def __init__(self, op: WindowAggregateOperator, backend: HeapKeyedStateBackend) -> None:
        self.op = op
        self.backend = backend
        self.assigner = op.assigner
        self.event_time = op.assigner.is_event_time
        self.domain = EVENT_TIME if self.event_time else PROCESSING_TIME
        self.lateness = op.allowed_lateness_ms
        self.agg: BuiltinAggs | UserAggregate | Reduce
        if op._builtin is not None:
            self.agg = op._builtin
        elif op.aggregate_function is not None:
            self.agg = UserAggregate(op, op.aggregate_function)
        else:
            assert op.reduce_fn is not None
            self.agg = Reduce(op, op.reduce_fn, op.keys)
        self.contents = backend.internal_state("__window_contents__")
        self.sessions = backend.internal_state("__sessions__")
        self.timers = backend.timer_service("__window_timers__")
        self._out: RowBuffer | None = None

    def set_input_schema(self, schema: pa.Schema) -> None:
        op = self.op
        windows = [pa.field(WINDOW_START, pa.int64()), pa.field(WINDOW_END, pa.int64())]
        keys = [schema.field(k) for k in op.keys]
        if op._builtin is not None:
            self._out = RowBuffer(op.name, "window results", keys + windows + op._builtin.result_fields(schema, op.name),
                                  complete=True)
        elif op.reduce_fn is not None:
            rest = [f for f in schema if f.name not in (WINDOW_START, WINDOW_END)]
            self._out = RowBuffer(op.name, "window results", rest + windows, complete=True)
        else:
            self._out = RowBuffer(op.name, "window results", keys + windows)

    def restored(self) -> None:
        pass

    # -- adding ---------------------------------------------------------------------------------
    def add(self, batch: pa.RecordBatch, ts: np.ndarray, wm: int | None) -> None:
        keys = self.op.keys
        groups = key_groups(batch, keys, self.op.ctx.max_parallelism).tolist()
        due: dict[tuple[tuple[Any, ...], int, Window], None] = {}
        late: list[int] = []
        times = ts.tolist()
        merging = self.assigner.is_merging
        rows = enumerate(batch.to_pylist())
        for lo, hi in self.op.row_slices(batch.num_rows):  # the aggregate's add is user code: a cancel stops it
            for i, row in itertools.islice(rows, hi - lo):
                key = tuple(row[k] for k in keys)
                self.backend.set_current_key(key, groups[i])
                accepted = (self._add_session(key, groups[i], row, times[i], wm, due) if merging
                            else self._add_windows(key, groups[i], row, times[i], wm, due))
                if not accepted:
                    late.append(i)
        if late:
            self.op._late(batch.take(pa.array(late, type=pa.int64())))
        for key, kg, win in sorted(due, key=lambda d: (d[2][1], d[2][0])):
            self.backend.set_current_key(key, kg)
            slot = self.contents.get_for_update(win)
            if slot is not ABSENT and slot[1]:
                self._result(key, win, slot)
        self._flush()

    def _fire_time(self, win: Window) -> int:
        return win[1] - 1 if self.event_time else win[1]

    def _is_late(self, win: Window, wm: int | None) -> bool:
        return wm is not None and win[1] - 1 + self.lateness <= wm

    def _new_window(self, win: Window, acc: Any) -> list[Any]:
        slot = [acc, False]
        self.contents.put(slot, win)
        fire_at = self._fire_time(win)
        self.timers.register(self.domain, fire_at, win)
        if self.lateness:
            self.timers.register(self.domain, fire_at + self.lateness, win)
        return slot

    def _forget_window(self, win: Window) -> None:
        """Drop the current key's window ``win``: its contents and timers."""
        self.contents.delete(win)
        fire_at = self._fire_time(win)
        self.timers.delete(self.domain, fire_at, win)
        if self.lateness:
            self.timers.delete(self.domain, fire_at + self.lateness, win)

    def _add_windows(self, key: tuple[Any, ...], kg: int, row: dict[str, Any], t: int, wm: int | None,
                     due: dict[Any, None]) -> bool:
        windows = self.assigner.assign_windows(t)
        accepted = False
        for win in windows:
            if self._is_late(win, wm):
                continue
            accepted = True
            slot = self.contents.get_for_update(win)
            if slot is ABSENT:
                slot = self._new_window(win, self.agg.create())
            slot[0] = self.agg.add(slot[0], row)
            slot[1] = True
            if wm is not None and win[1] - 1 <= wm:
                due[(key, kg, win)] = None
        if accepted:
            return True
        return not windows and (wm is None or t + self.lateness > wm)  # in no window: late only if t is

    def _add_session(self, key: tuple[Any, ...], kg: int, row: dict[str, Any], t: int, wm: int | None,
                     due: dict[Any, None]) -> bool:
        start, end = self.assigner.session_window(t, row)
        sessions: tuple[Window, ...] = self.sessions.get(None, ())
        overlapping = sorted(w for w in sessions if w[0] <= end and w[1] >= start)
        if not overlapping:
            if self._is_late((start, end), wm):
                return False
            win = (start, end)
            slot = self._new_window(win, self.agg.create())
            self.sessions.put((*sessions, win))
        else:
            win = (min(start, overlapping[0][0]), max(end, max(w[1] for w in overlapping)))
            if len(overlapping) == 1 and overlapping[0] == win:
                slot = self.contents.get_for_update(win)
            else:
                acc = self.contents.get_for_update(overlapping[0])[0]
                for other in overlapping[1:]:
                    acc = self.agg.merge(acc, self.contents.get(other)[0])
                for old in overlapping:
                    self._forget_window(old)
                slot = self._new_window(win, acc)
                self.sessions.put((*(w for w in sessions if w not in overlapping), win))
        slot[0] = self.agg.add(slot[0], row)
        slot[1] = True
        if wm is not None and win[1] - 1 <= wm:
            due[(key, kg, win)] = None
        return True

    # -- firing ---------------------------------------------------------------------------------
    def advance(self, time: int) -> None:
        while (timer := self.timers.pop_next(self.domain, time)) is not None:
            ts, kg, key, win = timer
            self.backend.set_current_key(key, kg)
            slot = self.contents.get_for_update(win)
            if slot is ABSENT:
                continue
            fire_at = self._fire_time(win)
            if ts == fire_at and slot[1]:
                self._result(key, win, slot)
            if ts == fire_at + self.lateness:  # without allowed lateness: the same timer
                self._drop(win)
        self._flush()

    def _drop(self, win: Window) -> None:
        self.contents.delete(win)
        if self.assigner.is_merging:
            left = tuple(w for w in self.sessions.get(None, ()) if w != win)
            if left:
                self.sessions.put(left)
            else:
                self.sessions.delete()

    def fire_all(self) -> None:
        """Every window with rows not yet in a result fires (the end of the input), in the order
        of their fire times; then the state is empty."""
        pending = []
        for n, (kg, key, win, _) in enumerate(self.backend.namespaced_entries(self.contents.name)):
            pending.append((self._fire_time(win), win[0], n, kg, key, win))
        for *_, kg, key, win in sorted(pending, key=lambda p: p[:3]):
            self.backend.set_current_key(key, kg)
            slot = self.contents.get_for_update(win)
            if slot is not ABSENT and slot[1]:
                self._result(key, win, slot)
            self._forget_window(win)
            if self.assigner.is_merging:
                self.sessions.delete()
        self._flush()

    def _result(self, key: tuple[Any, ...], win: Window, slot: list[Any]) -> None:
        op, agg = self.op, self.agg
        slot[1] = False
        if isinstance(agg, Reduce):
            row = {k: v for k, v in slot[0].items() if k not in (WINDOW_START, WINDOW_END)}
            row[WINDOW_START], row[WINDOW_END] = win
        else:
            row = dict(zip(op.keys, key, strict=True))
            row[WINDOW_START], row[WINDOW_END] = win
            if isinstance(agg, BuiltinAggs):
                row.update(zip(agg.names, agg.result(slot[0]), strict=True))
            else:
                for column, value in agg.result(slot[0]).items():
                    row.setdefault(column, value)
        if self._out is None:  # restored and firing before any new input: types from the rows
            self._out = RowBuffer(op.name, "window results")
        self._out.add(row)

    def _flush(self) -> None:
        if self._out is not None and self._out.rows:
            for batch in self._out.drain(self.op.ctx.batch_size):
                self.op.output.collect(batch)
