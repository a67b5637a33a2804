"""What the window operators share: window columns, run grouping, aggregate naming and the
accumulators (built-in aggregates, a user's AggregateFunction, a reduce function)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from yarnflow.common.api.functions import AggregateFunction
from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.operators.base import Operator

WINDOW_START = "window_start"
WINDOW_END = "window_end"
AGG_FUNCS = ("sum", "min", "max", "count", "mean")
MIN_TS = -(2**63)
MAX_TS = 2**63 - 1
_COMBINE = {"sum": "sum", "min": "min", "max": "max", "count": "sum"}


def clamp(value: int) -> int:
    return max(MIN_TS, min(MAX_TS, value))


def runs(values: np.ndarray) -> tuple[np.ndarray | None, list[tuple[int, int, int]]]:
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


def agg_names(keys: Sequence[str], aggs: Sequence[tuple[str, str]]) -> list[str]:
    """KeyedAggregate's naming: the column's own name, "count" for a count, ``<col>_<fn>`` where
    two aggregates, or an aggregate and a key or window column, would share a name."""
    taken = set(keys) | {WINDOW_START, WINDOW_END}
    plain = ["count" if fn == "count" else col for col, fn in aggs]
    return [n if plain.count(n) == 1 and n not in taken else f"{col}_{fn}"
            for n, (col, fn) in zip(plain, aggs, strict=True)]


class BuiltinAggs:
    """sum / min / max / count / mean of columns, as partial aggregates (a mean is a sum and a
    count) that combine, and the final columns made from them."""

    def __init__(self, keys: Sequence[str], aggs: Sequence[tuple[str, str]]) -> None:
        self.keys = list(keys)
        self.aggs = list(aggs)
        self.names = agg_names(keys, aggs)
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


class UserAggregate:
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


class Reduce:
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
