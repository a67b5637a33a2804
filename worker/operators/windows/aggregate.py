"""The keyed window aggregation, as Flink's WindowOperator.

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

Its state (window contents, which windows fired, timers) is in the operator's keyed state
backend, so it is checkpointed, restored and rescaled by key group: see ``vector.py`` and
``row_windows.py``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from yarnflow.common.api.functions import AggregateFunction
from yarnflow.common.api.windows import WindowAssigner, milliseconds
from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.operators.base import Operator, Output, RuntimeContext
from yarnflow.worker.operators.keyed import check_columns, keyed_backend
from yarnflow.worker.operators.timestamps import event_times_ms
from yarnflow.worker.operators.windows.common import AGG_FUNCS, MIN_TS, BuiltinAggs
from yarnflow.worker.operators.windows.row_windows import RowWindows
from yarnflow.worker.operators.windows.vector import VectorWindows
from yarnflow.worker.elements import Watermark
from yarnflow.worker.state.heap import HeapKeyedStateBackend
from yarnflow.worker.state.tables import Snapshot

__all__ = ["WindowAggregateOperator"]


class WindowAggregateOperator(Operator):
    """Keyed windows with built-in aggregates, an AggregateFunction or a reduce function (see the
    module docstring). ``late_records_dropped`` counts late records dropped for want of a
    ``late_tag``; ``late_records_side_output`` those sent to it (metrics, not state)."""

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
        self.current_watermark = MIN_TS
        self._builtin: BuiltinAggs | None = None
        if self.aggs is not None:
            if not self.aggs:
                raise JobDefinitionError(f"operator '{self.name}' needs at least one aggregate")
            for _, fn in self.aggs:
                if fn not in AGG_FUNCS:
                    raise JobDefinitionError(f"operator '{self.name}': unknown aggregate {fn!r}; "
                                             f"expected one of {AGG_FUNCS}")
            self._builtin = BuiltinAggs(self.keys, self.aggs)
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
        self._schema: pa.Schema | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        self._backend = keyed_backend(ctx)
        self._engine: VectorWindows | RowWindows = (VectorWindows(self, self._backend) if self._vectorised
                                                     else RowWindows(self, self._backend))

    @property
    def state_backend(self) -> HeapKeyedStateBackend:
        return self._backend

    def snapshot_state(self, checkpoint_id: int) -> Snapshot:
        """The keyed state backend's snapshot, and the input's schema (table ``input_schema``,
        no rows) so a restored operator types its results as before even if it fires before
        any new input."""
        snapshot = self._backend.snapshot()
        return snapshot.with_tables({"input_schema": self._schema.empty_table()}) if self._schema else snapshot

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        state = dict(state)
        schema = state.pop("input_schema", None)
        self._backend.restore(state)
        self._engine.restored()
        if schema is not None:
            self._engine_for(schema.schema)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if batch.num_rows == 0:
            return
        engine = self._engine_for(batch.schema)
        if self.time_column is not None:
            ts = event_times_ms(batch, self.time_column, self.name)
            wm = self.current_watermark
            engine.add(batch, ts, wm if wm > MIN_TS else None)
        else:
            now = self.ctx.clock()
            engine.advance(now)
            engine.add(batch, np.full(batch.num_rows, now, dtype=np.int64), None)

    def process_watermark(self, watermark: Watermark, input_index: int = 0) -> None:
        if watermark.timestamp > self.current_watermark:
            self.current_watermark = watermark.timestamp
            if self.time_column is not None:
                self._engine.advance(watermark.timestamp)
        self.output.emit_watermark(watermark)

    def on_processing_time(self, now_ms: int) -> None:
        if self.time_column is None:
            self._engine.advance(now_ms)

    def finish(self) -> None:
        self._engine.fire_all()

    # -- shared --------------------------------------------------------------------------------
    def _engine_for(self, schema: pa.Schema) -> VectorWindows | RowWindows:
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
