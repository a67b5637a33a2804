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
from typing import Any, Callable, Iterable

import pyarrow as pa

from yarnflow.common.config import Options
from yarnflow.worker.operators.base import Operator
from yarnflow.worker.operators.lifting import LiftedFunction, lift_with_reason
from yarnflow.worker.operators.rows import RowBuffer, SchemaMismatchError, gc_paused, row_dicts

__all__ = ["MapBatches", "RowFilter", "RowFlatMap", "RowMap", "SchemaMismatchError", "to_batches"]

log = logging.getLogger(__name__)


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


class MapBatches(Operator):
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


def _lifted(op: Operator, fn: Callable[..., Any]) -> tuple[LiftedFunction | None, str]:
    """``fn`` lifted to column expressions, or None and why it runs per row."""
    option = Options.PYTHON_VECTORIZE
    if not option.convert(op.ctx.config.get(option.key) or "true"):
        return None, f"{option.key} is false"
    lifted, why = lift_with_reason(fn, op.kind)
    if lifted is not None:
        log.info("%s '%s': its function %s runs as Arrow compute on whole batches (%s: false to call "
                 "it per row)", op.kind, op.name, getattr(fn, "__qualname__", fn), option.key)
    else:
        log.info("%s '%s': its function %s runs per row: %s", op.kind, op.name, getattr(fn, "__qualname__", fn), why)
    return lifted, why


def _path(lifted: LiftedFunction | None, why: str) -> str:
    return lifted.describe() if lifted is not None else f"per row ({why})"


class _RowOperator(Operator):
    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        super().__init__(name)
        self.fn = fn
        self._rows = RowBuffer(self.name)

    def _emit_rows(self, rows: list[Any]) -> None:
        if rows:
            if set(map(type, rows)) != {dict}:
                rows = [r if isinstance(r, dict) else {"value": r} for r in rows]
            self.output.collect(self._rows.to_batch(rows))


class RowMap(_RowOperator):
    kind = "map"
    _lift: LiftedFunction | None = None
    _why = "not opened yet"

    def open(self) -> None:
        super().open()
        self._lift, self._why = _lifted(self, self.fn)

    def execution_path(self) -> str:
        return _path(self._lift, self._why)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if self._lift is not None:
            out = self._lift.map_batch(batch)
            if out is not None:
                out = self._rows.adopt(out)
            if out is not None:
                self.output.collect(out)
                return
        with gc_paused():
            self._emit_rows(apply_rows(self, self.fn, row_dicts(batch)))


def _truth_values(results: list[Any]) -> list[bool]:
    return list(map(bool, results))


class RowFilter(Operator):
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
        return _path(self._lift, self._why)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        lifted_mask = self._lift.filter_mask(batch) if self._lift is not None else None
        if lifted_mask is not None:
            out = batch.filter(lifted_mask)
        else:
            with gc_paused():
                # a result without a truth value raises as it is, before a later row's error would
                mask = _truth_values(apply_rows(self, self.fn, row_dicts(batch), on_error=_truth_values))
            out = batch.filter(pa.array(mask, pa.bool_()))
        if out.num_rows:
            self.output.collect(out)


class RowFlatMap(_RowOperator):
    kind = "flat_map"

    def execution_path(self) -> str:
        return "per row (flat_map functions are not vectorised)"

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        fn = self.fn
        rows: list[Any] = []
        extend = rows.extend
        with gc_paused():
            inputs = row_dicts(batch)
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
