"""Stateless transformations: per batch (the fast path) and per row (the convenient path).

Per-row functions take a row as a dict of column -> value. ``map`` returns a dict (or a
scalar, put in column 'value'), ``filter`` a truth value, ``flat_map`` an iterable of such.
The first output batch fixes the operator's output schema; a later row that does not fit it
is an error naming the operator. A ``map`` or ``filter`` function simple enough to read as column
expressions (``lifting``) runs as Arrow compute on whole batches instead, unless the job sets
``python.row-functions.vectorize: false``.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow as pa

from yarnflow.common.api.co_functions import CheckpointedFunction
from yarnflow.common.config import Options
from yarnflow.worker.operators.base import Operator
from yarnflow.worker.operators.checkpointed import FunctionState
from yarnflow.worker.operators.lifting import LiftedFunction, lift_with_reason
from yarnflow.worker.operators.lifting_flat import LiftedFlatMap, lift_flat_map
from yarnflow.worker.operators.row_views import RowView, row_view
from yarnflow.worker.operators.rows import RowBuffer, SchemaMismatchError, gc_paused, row_dicts

__all__ = ["MapBatches", "RowFilter", "RowFlatMap", "RowMap", "SchemaMismatchError", "to_batches"]

log = logging.getLogger(__name__)

#: how often an operator whose batches go to its task's Python worker emits the answers that
#: have arrived meanwhile (they also come out with its next batch)
_EMIT_READY_MS = 20


def to_batches(value: Any, op_name: str) -> list[pa.RecordBatch]:
    if isinstance(value, pa.RecordBatch):
        return [value]
    if isinstance(value, pa.Table):
        return value.to_batches()
    pd = sys.modules.get("pandas")  # a DataFrame exists only once pandas is imported: never import it here
    if pd is not None and isinstance(value, pd.DataFrame):
        return pa.Table.from_pandas(value, preserve_index=False).to_batches()
    raise SchemaMismatchError(f"operator '{op_name}' must return a pyarrow RecordBatch or Table, "
                              f"got {type(value).__name__}")


class _UserFunction(Operator):
    """An operator running the user function ``fn``, whose operator state (a
    ``CheckpointedFunction``'s) it snapshots and restores (``checkpointed.py``)."""

    fn: Callable[..., Any]

    @property
    def stateful(self) -> bool:
        return isinstance(self.fn, CheckpointedFunction)

    def setup(self, ctx: Any, output: Any) -> None:
        super().setup(ctx, output)
        self._function_state = FunctionState(self, self.fn)

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        self._function_state.restore(state)

    def open(self) -> None:
        super().open()
        self._function_state.initialize()
        if callable(getattr(self.fn, "open", None)):  # (a class with open(ctx), as Flink's RichFunction)
            self.call_user(self.fn.open, self.ctx)  # type: ignore[attr-defined]

    def snapshot_state(self, checkpoint_id: int) -> dict[str, pa.Table]:
        return self._function_state.snapshot(checkpoint_id)


class MapBatches(_UserFunction):
    kind = "map_batches"

    def __init__(self, fn: Callable[[pa.RecordBatch], Any], name: str | None = None) -> None:
        super().__init__(name)
        self.fn = fn

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        for out in to_batches(self.call_user(self.fn, batch), self.name):
            if out.num_rows:
                self.output.collect(out)


def apply_rows(op: Operator, fn: Callable[[Any], Any], rows: list[dict[str, Any]],
               on_error: Callable[[list[Any]], object] | None = None) -> list[Any]:
    """``[fn(row) for row in rows]``, the loop in C (a slice of rows at a time: ``row_slices``);
    an error is raised as ``op.call_user`` raises it, for the first row that failed.
    ``on_error(results so far)`` runs first."""
    results: list[Any] = []
    for start, stop in op.row_slices(len(rows)):
        try:
            results.extend(map(fn, rows[start:stop]))
        except Exception as exc:
            if on_error is not None:
                on_error(results)
            raise op.user_error(fn, exc) from exc
        if len(results) < stop:  # fn raised StopIteration, which ends ``map`` as if the rows had
            if on_error is not None:  # run out: run that row again to raise its error
                on_error(results)
            op.call_user(fn, rows[len(results)])
            raise op.user_error(fn, StopIteration())
    return results


def _lifted(op: Operator, fn: Callable[..., Any]) -> tuple[Any, str]:
    """``fn`` lifted to column expressions (a ``LiftedFunction``, a ``LiftedFlatMap`` for a
    flat_map), or None and why it runs per row."""
    option = Options.PYTHON_VECTORIZE
    if not option.convert(op.ctx.config.get(option.key) or "true"):
        return None, f"{option.key} is false"
    lifted: Any
    lifted, why = lift_flat_map(fn) if op.kind == "flat_map" else lift_with_reason(fn, op.kind)
    if lifted is not None:
        log.info("%s '%s': its function %s runs as Arrow compute on whole batches (%s: false to call "
                 "it per row)", op.kind, op.name, getattr(fn, "__qualname__", fn), option.key)
    else:
        log.info("%s '%s': its function %s runs per row: %s", op.kind, op.name, getattr(fn, "__qualname__", fn), why)
    return lifted, why


def _path(lifted: LiftedFunction | LiftedFlatMap | None, why: str) -> str:
    return lifted.describe() if lifted is not None else f"per row ({why})"


def _per_row(op: Any, batch: pa.RecordBatch, here: Callable[[pa.RecordBatch], None]) -> None:
    """Run ``batch`` through ``op``'s per-row path: in the task's Python worker when it has
    one running (``worker/pyworker``), else ``here(batch)`` on the task thread, whose time
    counts towards starting that worker."""
    worker = op.ctx.python_worker
    if worker is None:
        here(batch)
        return
    if worker.ready():
        worker.submit(op, batch)
        return
    began = time.perf_counter()
    here(batch)
    worker.spent(time.perf_counter() - began)


class _Offloading(_UserFunction):
    """A per-row operator: its task may run its batches in its Python worker process
    (``worker/pyworker``), which answers later; what was sent comes out before a watermark,
    a checkpoint's barrier or the end of input goes on. Not one whose function keeps operator
    state (a CheckpointedFunction): that state is in the task's process."""

    row_schema: pa.Schema | None = None
    fn: Callable[..., Any]
    _view: RowView | None = None

    @property
    def runs_in_python_worker(self) -> bool:
        return not self.stateful

    def setup(self, ctx: Any, output: Any) -> None:
        super().setup(ctx, output)
        if ctx.python_worker is not None:
            self.processing_time_interval_ms = _EMIT_READY_MS

    def open(self) -> None:
        super().open()
        self._view = row_view(self.fn)

    def _inputs(self, batch: pa.RecordBatch) -> tuple[Callable[..., Any], list[Any]]:
        """The function to call per row and what to call it on: the fields themselves when it
        only reads fields (``row_views.py``), else a dict per row."""
        if self._view is not None:
            items = self._view.inputs(batch)
            if items is not None:
                return self._view.fn, items
        return self.fn, row_dicts(batch)

    def _in_worker(self) -> str:
        worker = getattr(self, "ctx", None) and self.ctx.python_worker
        return worker.describe(self) if worker is not None else ""

    def _flush(self) -> None:
        if self.ctx.python_worker is not None:
            self.ctx.python_worker.flush()

    def process_watermark(self, watermark: Any, input_index: int = 0) -> None:
        self._flush()
        super().process_watermark(watermark, input_index)

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        self._flush()

    def end_input(self, input_index: int = 0) -> None:
        self._flush()

    def finish(self) -> None:
        self._flush()

    def on_processing_time(self, now_ms: int) -> None:
        self.ctx.python_worker.emit_ready()


class _RowOperator(_Offloading):
    """A map or flat_map: its rows make batches of a schema the first rows fix (``RowBuffer``)."""

    _lift: LiftedFunction | LiftedFlatMap | None = None
    _why = "not opened yet"

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        super().__init__(name)
        self.fn = fn
        self._rows = RowBuffer(self.name)

    def open(self) -> None:
        super().open()
        self._lift, self._why = _lifted(self, self.fn)

    def execution_path(self) -> str:
        return _path(self._lift, self._why) + self._in_worker()

    def _lifted_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """``batch``'s output as Arrow compute made it, if the function lifts and the batch and
        its result fit (else None: the batch goes per row)."""
        out = self._lift.map_batch(batch) if self._lift is not None else None
        return self._rows.adopt(out) if out is not None else None

    @property
    def row_schema(self) -> pa.Schema | None:
        """The output schema its first rows fixed (None until then); its Python worker
        starts from it and hands back what it fixed."""
        return self._rows.schema

    @row_schema.setter
    def row_schema(self, schema: pa.Schema | None) -> None:
        self._rows.schema = schema

    def _emit_rows(self, rows: list[Any]) -> None:
        if rows:
            if set(map(type, rows)) != {dict}:
                rows = [r if isinstance(r, dict) else {"value": r} for r in rows]
            self.output.collect(self._rows.to_batch(rows))


class RowMap(_RowOperator):
    kind = "map"

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        out = self._lifted_batch(batch)
        if out is not None:
            self.output.collect(out)
            return
        _per_row(self, batch, self._map_rows)

    def _map_rows(self, batch: pa.RecordBatch) -> None:
        with gc_paused():
            self._emit_rows(apply_rows(self, *self._inputs(batch)))


def _truth_values(results: list[Any]) -> list[bool]:
    return list(map(bool, results))


class RowFilter(_Offloading):
    kind = "filter"
    _lift: LiftedFunction | None = None
    _why = "not opened yet"

    def __init__(self, fn: Callable[[dict[str, Any]], Any], name: str | None = None) -> None:
        super().__init__(name)
        self.fn = fn

    def open(self) -> None:
        super().open()
        self._lift, self._why = _lifted(self, self.fn)

    def execution_path(self) -> str:
        return _path(self._lift, self._why) + self._in_worker()

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        lifted_mask = self._lift.filter_mask(batch) if self._lift is not None else None
        if lifted_mask is None:
            _per_row(self, batch, self._filter_rows)
            return
        out = batch.filter(lifted_mask)
        if out.num_rows:
            self.output.collect(out)

    def _filter_rows(self, batch: pa.RecordBatch) -> None:
        with gc_paused():
            # a result without a truth value raises as it is, before a later row's error would
            mask = _truth_values(apply_rows(self, *self._inputs(batch), on_error=_truth_values))
        out = batch.filter(pa.array(mask, pa.bool_()))
        if out.num_rows:
            self.output.collect(out)


class RowFlatMap(_RowOperator):
    kind = "flat_map"

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        out = self._lifted_batch(batch)
        if out is not None:
            if out.num_rows:
                self.output.collect(out)
            return
        _per_row(self, batch, self._flat_map_rows)

    def _flat_map_rows(self, batch: pa.RecordBatch) -> None:
        rows: list[Any] = []
        extend = rows.extend
        with gc_paused():
            fn, inputs = self._inputs(batch)
            for start, stop in self.row_slices(len(inputs)):
                for row in inputs[start:stop]:
                    try:
                        produced: Iterable[Any] = fn(row)
                    except Exception as exc:
                        raise self.user_error(fn, exc) from exc
                    if produced is None:
                        continue
                    try:
                        extend(produced)
                    except TypeError:
                        raise SchemaMismatchError(f"flat_map function in operator '{self.name}' must return "
                                                  f"an iterable, got {type(produced).__name__}") from None
            self._emit_rows(rows)


class CustomPartition(Operator):
    """``partition_custom(partitioner, key_selector)``: passes its rows on as they are; the
    CUSTOM exchange after it (the writer of its chain) asks ``channels`` which consumer each row
    goes to, ``partitioner.partition(key_selector(row), n)`` (or ``partitioner(key, n)``), with
    ``n`` the consumers' parallelism as the job runs (after a rescale too), as in Flink."""

    kind = "partition_custom"

    def __init__(self, partitioner: Any, key_selector: Callable[[dict[str, Any]], Any],
                 name: str | None = None) -> None:
        super().__init__(name or "partition_custom")
        self.partitioner = partitioner
        self.key_selector = key_selector

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        self.output.collect(batch)

    def channels(self, batch: pa.RecordBatch, n: int) -> np.ndarray:
        partition = getattr(self.partitioner, "partition", self.partitioner)
        key = self.key_selector
        out = np.empty(batch.num_rows, dtype=np.int64)
        for i, row in enumerate(batch.to_pylist()):
            channel = self.call_user(partition, self.call_user(key, row), n)
            if isinstance(channel, bool) or not isinstance(channel, (int, np.integer)) or not 0 <= channel < n:
                raise self.user_error(partition, ValueError(
                    f"partition_custom's partitioner answered {channel!r} for {n} partitions: it must be an int "
                    f"in 0..{n - 1}"))
            out[i] = channel
        return out
