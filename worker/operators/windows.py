"""Windows, as Flink's WindowOperator: the keyed window aggregation and the window join.

The assigners (which windows a record belongs to) are user API, in
``yarnflow.common.api.windows``; these operators keep, fire and merge the windows.

``WindowAggregateOperator`` (``key_by(...).window(assigner).sum(...)`` and friends):

- Event time. A window ``[start, end)`` fires when the watermark reaches ``end - 1``; its
  results are emitted before that watermark is forwarded. With ``allowed_lateness_ms`` L the
  window's state is kept until the watermark reaches ``end - 1 + L``; a record that arrives in
  between updates the window, which fires again at once with the updated result of that key.
  A record all of whose windows are past ``end - 1 + L`` is late: it goes to the side output
  ``late_tag`` (with the input's columns) or, without a tag, is dropped and counted in
  ``late_records_dropped``. Session windows merge first (a late record that bridges into a
  live session is not late), as Flink's MergingWindowSet.
- Processing time. Records are assigned by ``ctx.clock()`` when they arrive; a window fires
  once the processing time reaches ``end`` (checked in ``on_processing_time`` and before each
  batch). Nothing is late.
- ``finish`` fires every window still pending, of both kinds (for event time a bounded input
  has sent MAX_WATERMARK first, so there is normally nothing left).

Output rows: the key columns, ``window_start``, ``window_end`` (int64 ms), then

- ``aggs`` (sum, min, max, count, mean): one column per aggregate, named like KeyedAggregate
  (the column's own name, "count" for a count, ``<col>_<fn>`` on a clash with another
  aggregate, a key or a window column);
- ``aggregate_function``: the columns of ``get_result`` (a scalar goes in column 'value'; a
  result column named like a key or window column is dropped);
- ``reduce_fn(acc_row, row) -> row``: the reduced row's columns (keys kept), then the window
  columns.

Tumbling and sliding windows with built-in aggregates are vectorised: each batch is grouped by
(keys, window start) into partial aggregates kept per window start, combined again when the
window fires (a mean is kept as sum and count). Sessions, aggregate functions and reduce
functions are folded row by row.

``WindowJoinOperator`` buffers both inputs per (tumbling or sliding, event-time) window and,
when the combined watermark fires a window, emits the inner join of its rows on the keys.

State is kept in memory only (no snapshot/restore yet).
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from yarnflow.common.errors import JobDefinitionError, YarnflowError
from yarnflow.worker.operators.base import Operator, TwoInputOperator
from yarnflow.common.api.functions import AggregateFunction
from yarnflow.common.api.windows import SlidingEventTimeWindows, TumblingEventTimeWindows, WindowAssigner, milliseconds
from yarnflow.worker.operators.keyed import check_columns
from yarnflow.worker.operators.timestamps import EventTimeError
from yarnflow.worker.operators.transforms import SchemaMismatchError
from yarnflow.worker.runtime.elements import Watermark

__all__ = [
    "CheckpointsNotSupportedError",
    "WindowAggregateOperator",
    "WindowJoinOperator",
]

WINDOW_START = "window_start"
WINDOW_END = "window_end"
AGG_FUNCS = ("sum", "min", "max", "count", "mean")
_MIN_TS = -(2**63)
_MAX_TS = 2**63 - 1
_COMBINE = {"sum": "sum", "min": "min", "max": "max", "count": "sum"}
_COMPACT_PARTIALS = 32
_MS_SCALE = {"s": (1000, 1), "ms": (1, 1), "us": (1, 1000), "ns": (1, 1_000_000)}  # (multiply, floor-divide)


# --------------------------------------------------------------------------- helpers


class CheckpointsNotSupportedError(YarnflowError):
    """A window operator was asked for a snapshot: its windows are not operator state yet, so
    the checkpoint is declined. Run such jobs without ``execution.checkpointing.interval``."""


class _NoCheckpoints(Operator):
    """Windows keep their own structures, not in the state backend: no snapshot of them yet."""

    def snapshot_state(self, checkpoint_id: int) -> dict[str, pa.Table]:
        if not self.ctx.checkpointing:
            return {}
        raise CheckpointsNotSupportedError(
            f"operator '{self.name}': windows do not support checkpoints yet (their state would be lost "
            f"on restore); checkpoint {checkpoint_id} is declined. Run this job without "
            f"execution.checkpointing.interval")

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        if state:
            raise CheckpointsNotSupportedError(f"operator '{self.name}': windows do not support checkpoints yet; "
                                               f"got state {sorted(state)} to restore")


def _event_times(batch: pa.RecordBatch, column: str, op_name: str) -> np.ndarray:
    """The event-time column as an int64 numpy array of ms since the epoch."""
    idx = batch.schema.get_field_index(column)
    if idx < 0:
        raise JobDefinitionError(f"operator '{op_name}': event-time column {column!r} does not exist; "
                                 f"the input has columns {batch.schema.names}")
    col = batch.column(idx)
    if col.null_count:
        row = pc.index(pc.is_null(col), True).as_py()
        raise EventTimeError(f"operator '{op_name}': null event time in column {column!r} "
                             f"(row {row} of a batch of {batch.num_rows}); every row needs a time")
    t = col.type
    if pa.types.is_integer(t):
        return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64)
    if pa.types.is_timestamp(t) or pa.types.is_date64(t):
        raw = np.asarray(col.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)
        mul, div = _MS_SCALE[getattr(t, "unit", "ms")]
        return raw * mul if div == 1 else raw // div
    if pa.types.is_date32(t):
        return np.asarray(col.cast(pa.int32()).to_numpy(zero_copy_only=False), dtype=np.int64) * 86_400_000
    raise JobDefinitionError(f"operator '{op_name}': event-time column {column!r} has type {t}; expected "
                             f"an integer (ms since the epoch), a timestamp or a date")


def _clamp(value: int) -> int:
    return max(_MIN_TS, min(_MAX_TS, value))


def _runs(values: np.ndarray) -> tuple[np.ndarray | None, list[tuple[int, int, int]]]:
    """Group equal values: ``(order, [(value, begin, end), ...])`` where rows ``order[begin:end]``
    (all rows when ``order`` is None) share ``value``, in ascending order of value."""
    if len(values) == 0:
        return None, []
    lo, hi = values.min(), values.max()
    if lo == hi:
        return None, [(int(lo), 0, len(values))]
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    cuts = [0, *(np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist(), len(values)]
    return order, [(int(ordered[a]), a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def _agg_names(keys: Sequence[str], aggs: Sequence[tuple[str, str]]) -> list[str]:
    """KeyedAggregate's naming: the column's own name, "count" for a count, ``<col>_<fn>`` where
    two aggregates, or an aggregate and a key or window column, would share a name."""
    taken = set(keys) | {WINDOW_START, WINDOW_END}
    plain = ["count" if fn == "count" else col for col, fn in aggs]
    return [n if plain.count(n) == 1 and n not in taken else f"{col}_{fn}"
            for n, (col, fn) in zip(plain, aggs, strict=True)]


class _Rows:
    """Output rows waiting to become batches. The ``head`` and ``tail`` fields are typed and
    frame the others, which take the types of the first batch that has no all-null column
    (``complete``: there are no others) and must keep them."""

    def __init__(self, op_name: str, head: Sequence[pa.Field], tail: Sequence[pa.Field] = (),
                 complete: bool = False) -> None:
        self.op_name = op_name
        self.head, self.tail = list(head), list(tail)
        self.schema: pa.Schema | None = pa.schema(self.head + self.tail) if complete else None
        self.rows: list[dict[str, Any]] = []

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def drain(self, batch_size: int) -> list[pa.RecordBatch]:
        rows, self.rows = self.rows, []
        step = max(1, batch_size)
        return [self._to_batch(rows[i:i + step]) for i in range(0, len(rows), step)]

    def _to_batch(self, rows: list[dict[str, Any]]) -> pa.RecordBatch:
        try:
            if self.schema is not None:
                extra = sorted({n for row in rows for n in row} - set(self.schema.names))
                if extra:
                    raise SchemaMismatchError(f"new columns {extra}")
                return pa.RecordBatch.from_pylist(rows, schema=self.schema)
            fixed = {f.name for f in self.head + self.tail}
            names = [n for n in dict.fromkeys(n for row in rows for n in row) if n not in fixed]
            arrays = [pa.array([row.get(f.name) for row in rows], type=f.type) for f in self.head]
            arrays += [pa.array([row.get(n) for row in rows]) for n in names]
            arrays += [pa.array([row.get(f.name) for row in rows], type=f.type) for f in self.tail]
            batch = pa.RecordBatch.from_arrays(
                arrays, names=[f.name for f in self.head] + names + [f.name for f in self.tail])
            if not any(pa.types.is_null(f.type) for f in batch.schema):
                self.schema = batch.schema
            return batch
        except (pa.ArrowInvalid, pa.ArrowTypeError, SchemaMismatchError) as exc:
            raise SchemaMismatchError(
                f"operator '{self.op_name}' produced window results that do not fit the schema of its "
                f"first results ({self.schema}): {exc}") from None


# --------------------------------------------------------------------------- accumulators


class _BuiltinAggs:
    """sum / min / max / count / mean of columns, as partial aggregates (a mean is a sum and a
    count) that combine, and the final columns made from them."""

    def __init__(self, keys: Sequence[str], aggs: Sequence[tuple[str, str]]) -> None:
        self.keys = list(keys)
        self.aggs = list(aggs)
        self.names = _agg_names(keys, aggs)
        self.columns = list(dict.fromkeys(col for col, _ in aggs))  # the input columns needed
        specs: list[tuple[str, str]] = []
        self.final: list[tuple[str, int, int]] = []  # (fn, partial index, count index for a mean)
        for col, fn in aggs:
            parts = [(col, "sum"), (col, "count")] if fn == "mean" else [(col, fn)]
            idx = []
            for p in parts:
                if p not in specs:
                    specs.append(p)
                idx.append(specs.index(p))
            self.final.append((fn, idx[0], idx[-1]))
        self.specs = specs
        self.combine = [_COMBINE[fn] for _, fn in specs]
        # vectorised: input columns as __v<i>, keys as __k<i>, partial aggregates as __p<j>
        self.knames = [f"__k{i}" for i in range(len(self.keys))]
        self.vnames = [f"__v{i}" for i in range(len(self.columns))]
        vname = dict(zip(self.columns, self.vnames, strict=True))
        self.vspecs = [(vname[col], fn) for col, fn in specs]
        self.pnames = [f"__p{i}" for i in range(len(specs))]

    def group(self, table: pa.Table, by: list[str], specs: list[tuple[str, str]], op_name: str) -> pa.Table:
        """``table`` grouped ``by`` its columns, with ``specs`` as the partial columns __p<j>."""
        try:
            grouped = table.group_by(by, use_threads=False).aggregate(specs)
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise JobDefinitionError(f"operator '{op_name}' cannot compute {self.aggs} on columns "
                                     f"{self.columns}: {exc}") from None
        cols = [grouped.column(k) for k in by] + [grouped.column(f"{c}_{f}") for c, f in specs]
        return pa.Table.from_arrays(cols, names=by + self.pnames)

    def result_fields(self, schema: pa.Schema, op_name: str) -> list[pa.Field]:
        """The types of the aggregate columns for an input of ``schema``."""
        empty = pa.Table.from_arrays([pa.array([], type=schema.field(c).type) for c in self.keys + self.columns],
                                     names=self.knames + self.vnames)
        grouped = self.group(empty, self.knames, self.vspecs, op_name)
        return [pa.field(name, pa.float64() if fn == "mean" else grouped.schema.field(self.pnames[i]).type)
                for name, (fn, i, _) in zip(self.names, self.final, strict=True)]

    # -- row by row (sessions) ---------------------------------------------------------------
    def create(self) -> list[Any]:
        return [0 if fn == "count" else None for _, fn in self.specs]

    def add(self, acc: list[Any], row: dict[str, Any]) -> list[Any]:
        for i, (col, fn) in enumerate(self.specs):
            v = row[col]
            if v is None:
                continue
            if fn == "count":
                acc[i] += 1
            else:
                acc[i] = v if acc[i] is None else _fold(fn, acc[i], v)
        return acc

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return [x if y is None else y if x is None else _fold(fn, x, y)
                for fn, x, y in zip(self.combine, a, b, strict=True)]

    def result(self, acc: list[Any]) -> list[Any]:
        out = []
        for fn, i, j in self.final:
            if fn == "mean":
                out.append(None if not acc[j] or acc[i] is None else acc[i] / acc[j])
            else:
                out.append(acc[i])
        return out


def _fold(fn: str, a: Any, b: Any) -> Any:
    if fn == "sum":
        return a + b
    if fn == "min":
        return b if b < a else a
    return b if b > a else a


class _UserAggregate:
    def __init__(self, op: Operator, fn: AggregateFunction[Any]) -> None:
        self.op, self.fn = op, fn

    def create(self) -> Any:
        return self.op.call_user(self.fn.create_accumulator)

    def add(self, acc: Any, row: dict[str, Any]) -> Any:
        return self.op.call_user(self.fn.add, row, acc)

    def merge(self, a: Any, b: Any) -> Any:
        return self.op.call_user(self.fn.merge, a, b)

    def result(self, acc: Any) -> dict[str, Any]:
        result = self.op.call_user(self.fn.get_result, acc)
        return result if isinstance(result, dict) else {"value": result}


class _Reduce:
    def __init__(self, op: Operator, fn: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]],
                 keys: Sequence[str]) -> None:
        self.op, self.fn, self.keys = op, fn, list(keys)

    def create(self) -> dict[str, Any] | None:
        return None

    def add(self, acc: dict[str, Any] | None, row: dict[str, Any]) -> dict[str, Any]:
        return dict(row) if acc is None else self.merge(acc, row)

    def merge(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        new = self.op.call_user(self.fn, dict(a), dict(b))
        if not isinstance(new, dict):
            raise JobDefinitionError(f"reduce function in operator '{self.op.name}' must return a dict row, "
                                     f"got {type(new).__name__}")
        for k in self.keys:  # the key stays what it was
            new[k] = a[k]
        return new


# --------------------------------------------------------------------------- the aggregation


class WindowAggregateOperator(_NoCheckpoints):
    """Keyed windows with built-in aggregates, an AggregateFunction or a reduce function (see the
    module docstring). ``late_records_dropped`` counts late records dropped for want of a
    ``late_tag``; ``late_records_side_output`` those sent to it."""

    kind = "window_aggregate"

    def __init__(self, keys: Sequence[str], assigner: WindowAssigner, time_column: str | None,
                 aggs: Sequence[tuple[str, str]] | None = None,
                 aggregate_function: AggregateFunction[Any] | None = None,
                 reduce_fn: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None,
                 allowed_lateness_ms: int = 0, late_tag: str | None = None, name: str | None = None) -> None:
        super().__init__(name)
        if isinstance(keys, str):
            keys = [keys]
        if not keys or not all(isinstance(k, str) for k in keys):
            raise JobDefinitionError(f"operator '{self.name}' needs at least one key column name, got {keys!r}")
        if not isinstance(assigner, WindowAssigner):
            raise JobDefinitionError(f"operator '{self.name}' needs a window assigner (e.g. "
                                     f"TumblingEventTimeWindows.of(1000)), got {assigner!r}")
        given = [n for n, v in (("aggs", aggs), ("aggregate_function", aggregate_function),
                                ("reduce_fn", reduce_fn)) if v is not None]
        if len(given) != 1:
            raise JobDefinitionError(f"operator '{self.name}' needs exactly one of aggs, aggregate_function "
                                     f"and reduce_fn; got {given or 'none'}")
        if assigner.is_event_time and not time_column:
            raise JobDefinitionError(f"operator '{self.name}': event-time windows need an event-time column")
        lateness = milliseconds(allowed_lateness_ms, "allowed lateness")
        if lateness < 0:
            raise JobDefinitionError(f"operator '{self.name}': allowed lateness cannot be negative ({lateness} ms)")
        self.keys = list(keys)
        self.assigner = assigner
        self.time_column = time_column if assigner.is_event_time else None
        self.allowed_lateness_ms = lateness if assigner.is_event_time else 0
        self.late_tag = late_tag
        self.aggs = [(c, f) for c, f in aggs] if aggs is not None else None
        self.aggregate_function = aggregate_function
        self.reduce_fn = reduce_fn
        self.late_records_dropped = 0
        self.late_records_side_output = 0
        self.current_watermark = _MIN_TS
        self._builtin: _BuiltinAggs | None = None
        if self.aggs is not None:
            if not self.aggs:
                raise JobDefinitionError(f"operator '{self.name}' needs at least one aggregate")
            for _, fn in self.aggs:
                if fn not in AGG_FUNCS:
                    raise JobDefinitionError(f"operator '{self.name}': unknown aggregate {fn!r}; "
                                             f"expected one of {AGG_FUNCS}")
            self._builtin = _BuiltinAggs(self.keys, self.aggs)
        elif aggregate_function is not None:
            if isinstance(aggregate_function, type) or not all(
                    callable(getattr(aggregate_function, m, None)) for m in ("create_accumulator", "add", "get_result")):
                raise JobDefinitionError(f"operator '{self.name}' needs an AggregateFunction instance, "
                                         f"got {aggregate_function!r}")
        elif not callable(reduce_fn):
            raise JobDefinitionError(f"operator '{self.name}': reduce_fn must be callable, got {reduce_fn!r}")
        if not assigner.is_event_time:
            span = assigner.gap_ms if assigner.is_merging else assigner.slide_ms  # type: ignore[attr-defined]
            self.processing_time_interval_ms = max(1, min(span, 100))
        self._vectorised = self._builtin is not None and not assigner.is_merging
        self._engine: _VectorWindows | _RowWindows | None = None
        self._schema: pa.Schema | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self) -> None:
        self._engine = _VectorWindows(self) if self._vectorised else _RowWindows(self)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if batch.num_rows == 0:
            return
        engine = self._engine_for(batch.schema)
        if self.time_column is not None:
            ts = _event_times(batch, self.time_column, self.name)
            wm = self.current_watermark
            engine.add(batch, ts, wm if wm > _MIN_TS else None)
        else:
            now = self.ctx.clock()
            engine.advance(now)
            engine.add(batch, np.full(batch.num_rows, now, dtype=np.int64), None)

    def process_watermark(self, watermark: Watermark, input_index: int = 0) -> None:
        if watermark.timestamp > self.current_watermark:
            self.current_watermark = watermark.timestamp
            if self.time_column is not None and self._engine is not None:
                self._engine.advance(watermark.timestamp)
        self.output.emit_watermark(watermark)

    def on_processing_time(self, now_ms: int) -> None:
        if self.time_column is None and self._engine is not None:
            self._engine.advance(now_ms)

    def finish(self) -> None:
        if self._engine is not None:
            self._engine.fire_all()

    def close(self) -> None:
        if self._engine is not None:
            self._engine.clear()

    # -- shared --------------------------------------------------------------------------------
    def _engine_for(self, schema: pa.Schema) -> _VectorWindows | _RowWindows:
        if self._engine is None:  # driven without open()
            self.open()
        assert self._engine is not None
        if self._schema is None or not schema.equals(self._schema):
            needed = list(self.keys)
            if self._builtin is not None:
                needed += [c for c in self._builtin.columns if c not in needed]
            check_columns(schema, needed, self.name)
            if self.time_column is not None:
                check_columns(schema, [self.time_column], self.name)
            if self._schema is None:
                self._engine.set_input_schema(schema)
            self._schema = schema
        return self._engine

    def _late(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        if self.late_tag:
            self.late_records_side_output += batch.num_rows
            self.output.collect_side(self.late_tag, batch)
        else:
            self.late_records_dropped += batch.num_rows

    def _emit_table(self, table: pa.Table) -> None:
        for batch in table.to_batches(max_chunksize=max(1, self.ctx.batch_size)):
            if batch.num_rows:
                self.output.collect(batch)


class _VecWindow:
    __slots__ = ("partials", "fired")

    def __init__(self) -> None:
        self.partials: list[pa.Table] = []
        self.fired = False


class _VectorWindows:
    """Tumbling / sliding windows with built-in aggregates: partial aggregates per window start,
    each a table of internal key columns ``__k<i>`` and partial columns ``__p<j>``."""

    def __init__(self, op: WindowAggregateOperator) -> None:
        assert op._builtin is not None
        self.op = op
        self.aggs = op._builtin
        a = op.assigner
        self.size, self.slide, self.offset = a.size_ms, a.slide_ms, a.offset_ms  # type: ignore[attr-defined]
        self.per_row = max(1, -(-self.size // self.slide))
        self.event_time = a.is_event_time
        self.knames, self.vnames, self.pnames = self.aggs.knames, self.aggs.vnames, self.aggs.pnames
        self.wins: dict[int, _VecWindow] = {}

    def set_input_schema(self, schema: pa.Schema) -> None:
        pass

    # -- adding ---------------------------------------------------------------------------------
    def add(self, batch: pa.RecordBatch, ts: np.ndarray, wm: int | None) -> None:
        op, size, slide = self.op, self.size, self.slide
        last = ts - np.mod(ts - self.offset, slide)
        threshold = None  # windows starting at or before it are past their allowed lateness
        if wm is not None:
            threshold = wm - size + 1 - op.allowed_lateness_ms
            late = last <= _clamp(threshold) if threshold >= _MIN_TS else np.zeros(len(ts), dtype=bool)
            if slide > size:  # a record in no window is late when its own time is (as Flink)
                no_window = last + size <= ts
                late = np.where(no_window, ts <= _clamp(wm - op.allowed_lateness_ms), late)
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
                if threshold is not None and threshold >= _MIN_TS:
                    mask &= starts > _clamp(threshold)
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
        order, runs = _runs(np.asarray(grouped.column("__ws").to_numpy(), dtype=np.int64))
        partial = grouped.drop_columns(["__ws"])
        if order is not None:
            partial = partial.take(pa.array(order))
        for start, a, b in runs:
            part = partial if order is None else partial.slice(a, b - a)
            win = self.wins.get(start)
            if win is None:
                win = self.wins[start] = _VecWindow()
            win.partials.append(part)
            if wm is not None and start + size - 1 <= wm:  # allowed lateness: fire again at once
                self._refire(start, win, part)
            elif len(win.partials) > _COMPACT_PARTIALS:
                win.partials = [self._combine(win.partials)]

    def _combine(self, partials: list[pa.Table]) -> pa.Table:
        if len(partials) == 1:
            return partials[0]
        specs = list(zip(self.pnames, self.aggs.combine, strict=True))
        return self.aggs.group(pa.concat_tables(partials), self.knames, specs, self.op.name)

    def _refire(self, start: int, win: _VecWindow, new: pa.Table) -> None:
        """The full result of the keys in ``new`` for a window the watermark already passed."""
        combined = self._combine(win.partials)
        win.partials = [combined]
        if len(self.knames) == 1:
            k = self.knames[0]
            mask = pc.is_in(combined.column(k), value_set=new.column(k).combine_chunks(), skip_nulls=False)
        else:
            touched = set(zip(*(new.column(k).to_pylist() for k in self.knames), strict=True))
            keys = zip(*(combined.column(k).to_pylist() for k in self.knames), strict=True)
            mask = pa.array([key in touched for key in keys], type=pa.bool_())
        self._emit(start, combined.filter(mask))
        win.fired = True

    # -- firing ---------------------------------------------------------------------------------
    def _fire_time(self, start: int) -> int:
        return start + self.size - 1 if self.event_time else start + self.size

    def advance(self, time: int) -> None:
        lateness = self.op.allowed_lateness_ms
        for start in sorted(self.wins):
            fire_at = self._fire_time(start)
            if fire_at > time:
                break
            win = self.wins[start]
            if not win.fired:
                win.partials = [self._combine(win.partials)]
                self._emit(start, win.partials[0])
                win.fired = True
            if fire_at + lateness <= time:
                del self.wins[start]

    def fire_all(self) -> None:
        for start in sorted(self.wins):
            win = self.wins[start]
            if not win.fired:
                self._emit(start, self._combine(win.partials))
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


class _Slot:
    __slots__ = ("acc", "dirty")

    def __init__(self, acc: Any) -> None:
        self.acc = acc
        self.dirty = False  # holds rows not yet in an emitted result


class _RowWindows:
    """Windows per key folded row by row: any assigner (sessions merge), any aggregation."""

    def __init__(self, op: WindowAggregateOperator) -> None:
        self.op = op
        self.assigner = op.assigner
        self.event_time = op.assigner.is_event_time
        self.lateness = op.allowed_lateness_ms
        self.agg: _BuiltinAggs | _UserAggregate | _Reduce
        if op._builtin is not None:
            self.agg = op._builtin
        elif op.aggregate_function is not None:
            self.agg = _UserAggregate(op, op.aggregate_function)
        else:
            assert op.reduce_fn is not None
            self.agg = _Reduce(op, op.reduce_fn, op.keys)
        self.state: dict[tuple[Any, ...], dict[tuple[int, int], _Slot]] = {}
        self._fires: list[tuple[int, int, tuple[Any, ...], tuple[int, int]]] = []
        self._cleanups: list[tuple[int, int, tuple[Any, ...], tuple[int, int]]] = []
        self._seq = itertools.count()
        self._out: _Rows | None = None

    def set_input_schema(self, schema: pa.Schema) -> None:
        op = self.op
        windows = [pa.field(WINDOW_START, pa.int64()), pa.field(WINDOW_END, pa.int64())]
        keys = [schema.field(k) for k in op.keys]
        if op._builtin is not None:
            self._out = _Rows(op.name, keys + windows + op._builtin.result_fields(schema, op.name), complete=True)
        elif op.reduce_fn is not None:
            rest = [f for f in schema if f.name not in (WINDOW_START, WINDOW_END)]
            self._out = _Rows(op.name, rest + windows, complete=True)
        else:
            self._out = _Rows(op.name, keys + windows)

    # -- adding ---------------------------------------------------------------------------------
    def add(self, batch: pa.RecordBatch, ts: np.ndarray, wm: int | None) -> None:
        keys = self.op.keys
        due: dict[tuple[tuple[Any, ...], tuple[int, int]], None] = {}
        late: list[int] = []
        times = ts.tolist()
        for i, row in enumerate(batch.to_pylist()):
            key = tuple(row[k] for k in keys)
            accepted = (self._add_session(key, row, times[i], wm, due) if self.assigner.is_merging
                        else self._add_windows(key, row, times[i], wm, due))
            if not accepted:
                late.append(i)
        if late:
            self.op._late(batch.take(pa.array(late, type=pa.int64())))
        for key, win in sorted(due, key=lambda kw: (kw[1][1], kw[1][0])):
            slot = self.state.get(key, {}).get(win)
            if slot is not None and slot.dirty:
                self._result(key, win, slot)
        self._flush()

    def _fire_time(self, win: tuple[int, int]) -> int:
        return win[1] - 1 if self.event_time else win[1]

    def _is_late(self, win: tuple[int, int], wm: int | None) -> bool:
        return wm is not None and win[1] - 1 + self.lateness <= wm

    def _new_slot(self, key: tuple[Any, ...], win: tuple[int, int], acc: Any) -> _Slot:
        slot = self.state.setdefault(key, {})[win] = _Slot(acc)
        fire_at = self._fire_time(win)
        heapq.heappush(self._fires, (fire_at, next(self._seq), key, win))
        if self.lateness:
            heapq.heappush(self._cleanups, (fire_at + self.lateness, next(self._seq), key, win))
        return slot

    def _add_windows(self, key: tuple[Any, ...], row: dict[str, Any], t: int, wm: int | None,
                     due: dict[Any, None]) -> bool:
        windows = self.assigner.assign_windows(t)
        accepted = False
        for win in windows:
            if self._is_late(win, wm):
                continue
            accepted = True
            slot = self.state.get(key, {}).get(win)
            if slot is None:
                slot = self._new_slot(key, win, self.agg.create())
            slot.acc = self.agg.add(slot.acc, row)
            slot.dirty = True
            if wm is not None and win[1] - 1 <= wm:
                due[(key, win)] = None
        if accepted:
            return True
        return not windows and (wm is None or t + self.lateness > wm)  # in no window: late only if t is

    def _add_session(self, key: tuple[Any, ...], row: dict[str, Any], t: int, wm: int | None,
                     due: dict[Any, None]) -> bool:
        start, end = self.assigner.assign_windows(t)[0]
        sessions = self.state.get(key)
        overlapping = sorted(w for w in sessions if w[0] <= end and w[1] >= start) if sessions else []
        if not overlapping:
            if self._is_late((start, end), wm):
                return False
            win = (start, end)
            slot = self._new_slot(key, win, self.agg.create())
        else:
            assert sessions is not None
            win = (min(start, overlapping[0][0]), max(end, max(w[1] for w in overlapping)))
            if len(overlapping) == 1 and overlapping[0] == win:
                slot = sessions[win]
            else:
                old = [sessions.pop(w) for w in overlapping]
                acc = old[0].acc
                for other in old[1:]:
                    acc = self.agg.merge(acc, other.acc)
                slot = self._new_slot(key, win, acc)
        slot.acc = self.agg.add(slot.acc, row)
        slot.dirty = True
        if wm is not None and win[1] - 1 <= wm:
            due[(key, win)] = None
        return True

    # -- firing ---------------------------------------------------------------------------------
    def advance(self, time: int) -> None:
        fires, cleanups = self._fires, self._cleanups
        while fires and fires[0][0] <= time:
            _, _, key, win = heapq.heappop(fires)
            slots = self.state.get(key)
            slot = slots.get(win) if slots else None
            if slot is None:
                continue  # merged away
            if slot.dirty:
                self._result(key, win, slot)
            if not self.lateness:
                self._drop(key, win)
        while cleanups and cleanups[0][0] <= time:
            _, _, key, win = heapq.heappop(cleanups)
            self._drop(key, win)
        self._flush()

    def _drop(self, key: tuple[Any, ...], win: tuple[int, int]) -> None:
        slots = self.state.get(key)
        if slots is not None and slots.pop(win, None) is not None and not slots:
            del self.state[key]

    def fire_all(self) -> None:
        pending = [(self._fire_time(win), win[0], n, key, win, slot)
                   for n, (key, slots) in enumerate(self.state.items()) for win, slot in slots.items() if slot.dirty]
        for *_, key, win, slot in sorted(pending, key=lambda p: p[:3]):
            self._result(key, win, slot)
        self._flush()
        self.clear()

    def clear(self) -> None:
        self.state.clear()
        self._fires.clear()
        self._cleanups.clear()

    def _result(self, key: tuple[Any, ...], win: tuple[int, int], slot: _Slot) -> None:
        op, agg = self.op, self.agg
        slot.dirty = False
        if isinstance(agg, _Reduce):
            row = {k: v for k, v in slot.acc.items() if k not in (WINDOW_START, WINDOW_END)}
            row[WINDOW_START], row[WINDOW_END] = win
        else:
            row = dict(zip(op.keys, key, strict=True))
            row[WINDOW_START], row[WINDOW_END] = win
            if isinstance(agg, _BuiltinAggs):
                row.update(zip(agg.names, agg.result(slot.acc), strict=True))
            else:
                for column, value in agg.result(slot.acc).items():
                    row.setdefault(column, value)
        assert self._out is not None
        self._out.add(row)

    def _flush(self) -> None:
        if self._out is not None and self._out.rows:
            for batch in self._out.drain(self.op.ctx.batch_size):
                self.op.output.collect(batch)


# --------------------------------------------------------------------------- the join


class WindowJoinOperator(TwoInputOperator, _NoCheckpoints):
    """Inner join of two keyed streams per event-time window (tumbling or sliding): input 0 is
    the left side, input 1 the right. When the combined watermark reaches ``end - 1`` of a
    window, it emits the join of the window's rows on ``left_keys`` = ``right_keys``:

    - by default pyarrow's ``Table.join`` (inner; the right key columns are dropped, other right
      columns named like a left column get the suffix "_right"), plus ``window_start`` and
      ``window_end``;
    - with ``join_fn(left_row, right_row) -> dict``, the rows it returns (a scalar goes in column
      'value', None emits nothing), plus the window columns.

    Rows whose windows have all fired already are late: dropped and counted in
    ``late_records_dropped``."""

    kind = "window_join"

    def __init__(self, left_keys: Sequence[str], right_keys: Sequence[str], assigner: WindowAssigner,
                 left_time_column: str, right_time_column: str,
                 join_fn: Callable[[dict[str, Any], dict[str, Any]], Any] | None = None,
                 name: str | None = None) -> None:
        super().__init__(name)
        left_keys = [left_keys] if isinstance(left_keys, str) else list(left_keys)
        right_keys = [right_keys] if isinstance(right_keys, str) else list(right_keys)
        if not left_keys or len(left_keys) != len(right_keys):
            raise JobDefinitionError(f"operator '{self.name}' needs the same (non-zero) number of left and right "
                                     f"keys, got {left_keys} and {right_keys}")
        if not isinstance(assigner, (TumblingEventTimeWindows, SlidingEventTimeWindows)):
            raise JobDefinitionError(f"operator '{self.name}': a window join takes tumbling or sliding event-time "
                                     f"windows, got {assigner!r}")
        if not left_time_column or not right_time_column:
            raise JobDefinitionError(f"operator '{self.name}' needs an event-time column on both inputs")
        if join_fn is not None and not callable(join_fn):
            raise JobDefinitionError(f"operator '{self.name}': join_fn must be callable, got {join_fn!r}")
        self.keys = (left_keys, right_keys)
        self.assigner = assigner
        self.time_columns = (left_time_column, right_time_column)
        self.join_fn = join_fn
        self.late_records_dropped = 0
        self._wins: dict[int, tuple[list[pa.RecordBatch], list[pa.RecordBatch]]] = {}
        self._schemas: list[pa.Schema | None] = [None, None]
        self._out: _Rows | None = None

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if batch.num_rows == 0:
            return
        side = 1 if input_index else 0
        if self._schemas[side] is None or not batch.schema.equals(self._schemas[side]):
            check_columns(batch.schema, self.keys[side], self.name)
            self._schemas[side] = batch.schema
        ts = _event_times(batch, self.time_columns[side], self.name)
        size, slide = self.assigner.size_ms, self.assigner.slide_ms  # type: ignore[attr-defined]
        last = ts - np.mod(ts - self.assigner.offset_ms, slide)  # type: ignore[attr-defined]
        wm = self.current_watermark
        placed = np.zeros(len(ts), dtype=bool)
        for j in range(max(1, -(-size // slide))):
            starts = last - j * slide
            ok = starts > ts - size
            if wm > _MIN_TS:
                ok &= starts + (size - 1) > wm
            if not ok.any():
                continue
            placed |= ok
            rows = np.flatnonzero(ok)
            order, runs = _runs(starts[rows])
            picked = batch.take(pa.array(rows if order is None else rows[order]))
            for start, a, b in runs:
                self._wins.setdefault(start, ([], []))[side].append(picked.slice(a, b - a))
        if wm > _MIN_TS:
            # late: every window of the row has fired (rows in no window at all when slide > size
            # are dropped silently unless their own time has passed)
            has_window = (last + size > ts) if slide > size else np.ones(len(ts), dtype=bool)
            self.late_records_dropped += int(np.count_nonzero(~placed & (has_window | (ts <= wm))))

    def on_watermark(self, timestamp: int) -> None:
        self._fire(timestamp)
        self.output.emit_watermark(Watermark(timestamp))

    def finish(self) -> None:
        self._fire(None)

    def close(self) -> None:
        self._wins.clear()

    def _fire(self, watermark: int | None) -> None:
        size = self.assigner.size_ms  # type: ignore[attr-defined]
        for start in sorted(self._wins):
            if watermark is not None and start + size - 1 > watermark:
                break
            left, right = self._wins.pop(start)
            if left and right:
                self._join(start, start + size, left, right)

    def _join(self, start: int, end: int, left: list[pa.RecordBatch], right: list[pa.RecordBatch]) -> None:
        lt, rt = pa.Table.from_batches(left), pa.Table.from_batches(right)
        if self.join_fn is None:
            joined = lt.join(rt, keys=self.keys[0], right_keys=self.keys[1], join_type="inner",
                             right_suffix="_right", use_threads=False)
            n = joined.num_rows
            if not n:
                return
            for name, value in ((WINDOW_START, start), (WINDOW_END, end)):
                arr = pa.array(np.full(n, value, dtype=np.int64))
                idx = joined.schema.get_field_index(name)
                joined = joined.set_column(idx, name, arr) if idx >= 0 else joined.append_column(name, arr)
            for batch in joined.to_batches(max_chunksize=max(1, self.ctx.batch_size)):
                if batch.num_rows:
                    self.output.collect(batch)
            return
        lkeys, rkeys = self.keys
        index: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for row in rt.to_pylist():
            key = tuple(row[k] for k in rkeys)
            if None not in key:
                index.setdefault(key, []).append(row)
        if self._out is None:
            self._out = _Rows(self.name, [], [pa.field(WINDOW_START, pa.int64()), pa.field(WINDOW_END, pa.int64())])
        out = self._out
        for lrow in lt.to_pylist():
            for rrow in index.get(tuple(lrow[k] for k in lkeys), ()):
                result = self.call_user(self.join_fn, dict(lrow), dict(rrow))
                if result is None:
                    continue
                row = dict(result) if isinstance(result, dict) else {"value": result}
                row[WINDOW_START], row[WINDOW_END] = start, end
                out.add(row)
        if out.rows:
            for batch in out.drain(self.ctx.batch_size):
                self.output.collect(batch)
