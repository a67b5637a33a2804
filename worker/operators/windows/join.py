"""The window join: an inner join of two keyed streams per event-time window."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from yarnflow.common.api.windows import SlidingEventTimeWindows, TumblingEventTimeWindows, WindowAssigner
from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.operators.base import Output, RuntimeContext, TwoInputOperator
from yarnflow.worker.operators.keyed import check_columns, keyed_backend
from yarnflow.worker.operators.rows import RowBuffer
from yarnflow.worker.operators.timestamps import event_times_ms
from yarnflow.worker.operators.windows.common import MIN_TS, WINDOW_END, WINDOW_START, runs
from yarnflow.worker.elements import Watermark
from yarnflow.worker.state.tables import Snapshot

__all__ = ["WindowJoinOperator"]


class WindowJoinOperator(TwoInputOperator):
    """Inner join of two keyed streams per event-time window (tumbling or sliding): input 0 is
    the left side, input 1 the right. When the combined watermark reaches ``end - 1`` of a
    window, it emits the join of the window's rows on ``left_keys`` = ``right_keys``:

    - by default pyarrow's ``Table.join`` (inner; the right key columns are dropped, other right
      columns named like a left column get the suffix "_right"), plus ``window_start`` and
      ``window_end``;
    - with ``join_fn(left_row, right_row) -> dict``, the rows it returns (a scalar goes in column
      'value', None emits nothing), plus the window columns.

    Rows whose windows have all fired already are late: dropped and counted in
    ``late_records_dropped``.

    State: each side's rows per window start, as ``NamespacedTables`` of the keyed state backend
    (``__join_left__`` and ``__join_right__``; each row's key group comes from its side's keys)."""

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
        self._schemas: list[pa.Schema | None] = [None, None]
        self._out: RowBuffer | None = None

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        self._backend = keyed_backend(ctx)
        self._sides = (self._backend.namespaced_tables("__join_left__", self.keys[0]),
                       self._backend.namespaced_tables("__join_right__", self.keys[1]))

    def snapshot_state(self, checkpoint_id: int) -> Snapshot:
        return self._backend.snapshot()

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        self._backend.restore(state)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if batch.num_rows == 0:
            return
        side = 1 if input_index else 0
        if self._schemas[side] is None or not batch.schema.equals(self._schemas[side]):
            check_columns(batch.schema, self.keys[side], self.name)
            self._schemas[side] = batch.schema
        ts = event_times_ms(batch, self.time_columns[side], self.name)
        size, slide = self.assigner.size_ms, self.assigner.slide_ms  # type: ignore[attr-defined]
        last = ts - np.mod(ts - self.assigner.offset_ms, slide)  # type: ignore[attr-defined]
        wm = self.current_watermark
        placed = np.zeros(len(ts), dtype=bool)
        for j in range(max(1, -(-size // slide))):
            starts = last - j * slide
            ok = starts > ts - size
            if wm > MIN_TS:
                ok &= starts + (size - 1) > wm
            if not ok.any():
                continue
            placed |= ok
            rows = np.flatnonzero(ok)
            order, groups = runs(starts[rows])
            picked = pa.Table.from_batches([batch.take(pa.array(rows if order is None else rows[order]))])
            for start, a, b in groups:
                self._sides[side].add(start, picked.slice(a, b - a))
        if wm > MIN_TS:
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
        for side in self._sides:
            side.clear()

    def _fire(self, watermark: int | None) -> None:
        size = self.assigner.size_ms  # type: ignore[attr-defined]
        left, right = self._sides
        for start in sorted(set(left.namespaces()) | set(right.namespaces())):
            if watermark is not None and start + size - 1 > watermark:
                break
            lt, rt = left.get(start), right.get(start)
            left.drop(start)
            right.drop(start)
            if lt and rt:
                self._join(start, start + size, lt, rt)

    def _join(self, start: int, end: int, left: list[pa.Table], right: list[pa.Table]) -> None:
        lt = pa.concat_tables(left, promote_options="permissive")
        rt = pa.concat_tables(right, promote_options="permissive")
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
            self._out = RowBuffer(self.name, "join results",
                                  tail=[pa.field(WINDOW_START, pa.int64()), pa.field(WINDOW_END, pa.int64())])
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
