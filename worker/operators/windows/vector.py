"""Tumbling and sliding windows with built-in aggregates, vectorised.

Each batch is grouped by (keys, window start) into partial aggregates: Arrow tables of internal
key columns ``__k<i>`` and partial columns ``__p<j>`` (a mean is kept as a sum and a count). The
partials of each window start are kept in the keyed state backend as ``NamespacedTables``
(``__window_partials__``: the window start is the namespace, "flagged" means the window has
fired) and combined again when the window fires. There are no per-key timers: a window fires for
all its keys at once, when the watermark (or the processing time) passes its end, so the window
starts held are the timers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from yarnflow.worker.operators.windows.common import MIN_TS, WINDOW_END, WINDOW_START, clamp, runs
from yarnflow.worker.state.heap import HeapKeyedStateBackend

if TYPE_CHECKING:
    from yarnflow.worker.operators.windows.aggregate import WindowAggregateOperator

_COMPACT_PARTIALS = 32


class VectorWindows:
    def __init__(self, op: WindowAggregateOperator, backend: HeapKeyedStateBackend) -> None:
        assert op._builtin is not None
        self.op = op
        self.aggs = op._builtin
        a = op.assigner
        self.size, self.slide, self.offset = a.size_ms, a.slide_ms, a.offset_ms  # type: ignore[attr-defined]
        self.per_row = max(1, -(-self.size // self.slide))
        self.event_time = a.is_event_time
        self.knames, self.vnames, self.pnames = self.aggs.knames, self.aggs.vnames, self.aggs.pnames
        self.wins = backend.namespaced_tables("__window_partials__", self.knames)

    def set_input_schema(self, schema: pa.Schema) -> None:
        pass

    def restored(self) -> None:
        """After a restore each window holds one table of many partials (several rows per key):
        combine them, as every other path expects one row per key in a single partial."""
        for start in self.wins.namespaces():
            self.wins.replace(start, [self._combine(self.wins.get(start), force=True)])

    # -- adding ---------------------------------------------------------------------------------
    def add(self, batch: pa.RecordBatch, ts: np.ndarray, wm: int | None) -> None:
        op, size, slide = self.op, self.size, self.slide
        last = ts - np.mod(ts - self.offset, slide)
        threshold = None  # windows starting at or before it are past their allowed lateness
        if wm is not None:
            threshold = wm - size + 1 - op.allowed_lateness_ms
            late = last <= clamp(threshold) if threshold >= MIN_TS else np.zeros(len(ts), dtype=bool)
            if slide > size:  # a record in no window is late when its own time is (as Flink)
                no_window = last + size <= ts
                late = np.where(no_window, ts <= clamp(wm - op.allowed_lateness_ms), late)
            if late.any():
                op._late(batch.filter(pa.array(late)))
                keep = ~late
                batch, ts, last = batch.filter(pa.array(keep)), ts[keep], last[keep]
                if not batch.num_rows:
                    return
        arrays = [batch.column(k) for k in op.keys] + [batch.column(c) for c in self.aggs.columns]
        names = self.knames + self.vnames + ["__ws"]
        pieces = []
        for j in range(self.per_row):
            starts = last - j * slide if j else last
            mask = None
            if j or slide > size:
                mask = starts > ts - size
                if threshold is not None and threshold >= MIN_TS:
                    mask &= starts > clamp(threshold)
            if mask is None:
                pieces.append(pa.Table.from_arrays([*arrays, pa.array(starts)], names=names))
            elif mask.any():
                m = pa.array(mask)
                pieces.append(pa.Table.from_arrays([*(pc.filter(x, m) for x in arrays), pa.array(starts[mask])],
                                                   names=names))
        if not pieces:
            return
        table = pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)
        grouped = self.aggs.group(table, self.knames + ["__ws"], self.aggs.vspecs, op.name)
        order, groups = runs(np.asarray(grouped.column("__ws").to_numpy(), dtype=np.int64))
        partial = grouped.drop_columns(["__ws"])
        if order is not None:
            partial = partial.take(pa.array(order))
        for start, a, b in groups:
            part = partial if order is None else partial.slice(a, b - a)
            self.wins.add(start, part)
            if wm is not None and start + size - 1 <= wm:  # allowed lateness: fire again at once
                self._refire(start, part)
            elif self.wins.count(start) > _COMPACT_PARTIALS:
                self.wins.replace(start, [self._combine(self.wins.get(start))])

    def _combine(self, partials: list[pa.Table], force: bool = False) -> pa.Table:
        if len(partials) == 1 and not force:
            return partials[0]
        specs = list(zip(self.pnames, self.aggs.combine, strict=True))
        return self.aggs.group(pa.concat_tables(partials), self.knames, specs, self.op.name)

    def _refire(self, start: int, new: pa.Table) -> None:
        """The full result of the keys in ``new`` for a window the watermark already passed."""
        combined = self._combine(self.wins.get(start))
        self.wins.replace(start, [combined])
        if len(self.knames) == 1:
            k = self.knames[0]
            mask = pc.is_in(combined.column(k), value_set=new.column(k).combine_chunks(), skip_nulls=False)
        else:
            touched = set(zip(*(new.column(k).to_pylist() for k in self.knames), strict=True))
            keys = zip(*(combined.column(k).to_pylist() for k in self.knames), strict=True)
            mask = pa.array([key in touched for key in keys], type=pa.bool_())
        self._emit(start, combined.filter(mask))
        self.wins.flag(start)

    # -- firing ---------------------------------------------------------------------------------
    def _fire_time(self, start: int) -> int:
        return start + self.size - 1 if self.event_time else start + self.size

    def advance(self, time: int) -> None:
        lateness = self.op.allowed_lateness_ms
        for start in self.wins.namespaces():
            fire_at = self._fire_time(start)
            if fire_at > time:
                break
            if not self.wins.is_flagged(start):
                combined = self._combine(self.wins.get(start))
                self.wins.replace(start, [combined])
                self._emit(start, combined)
                self.wins.flag(start)
            if fire_at + lateness <= time:
                self.wins.drop(start)

    def fire_all(self) -> None:
        for start in self.wins.namespaces():
            if not self.wins.is_flagged(start):
                self._emit(start, self._combine(self.wins.get(start)))
        self.wins.clear()

    def clear(self) -> None:
        self.wins.clear()

    def _emit(self, start: int, table: pa.Table) -> None:
        n = table.num_rows
        if not n:
            return
        cols = [table.column(k) for k in self.knames]
        cols += [pa.array(np.full(n, start, dtype=np.int64)), pa.array(np.full(n, start + self.size, dtype=np.int64))]
        for fn, i, j in self.aggs.final:
            if fn == "mean":
                cols.append(pc.divide(pc.cast(table.column(self.pnames[i]), pa.float64()),
                                      pc.cast(table.column(self.pnames[j]), pa.float64())))
            else:
                cols.append(table.column(self.pnames[i]))
        out = pa.Table.from_arrays(cols, names=self.op.keys + [WINDOW_START, WINDOW_END] + self.aggs.names)
        self.op._emit_table(out)
