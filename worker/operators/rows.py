"""Rows (Python dicts) that operators emit, turned into record batches: the one row-batching
helper of per-row transforms, keyed process functions and windows.

The first row's columns are the stream's columns (a later row may lack some: null there) and
the first batch without an all-null column fixes their types; a row with a column the first row
did not have, or a value of another type, raises SchemaMismatchError naming the operator. A
row that is not a dict becomes ``{"value": row}``. ``head`` and ``tail`` are fields typed up front
that frame the other columns (a window's key and window columns); with ``complete`` the schema is
``head + tail`` from the start.

The per-row hot path (``row_dicts`` to make rows, ``RowBuffer.to_batch`` once the schema is
fixed) works a column at a time: a batch's columns become Python lists in C, one list
comprehension (made once per column list) builds the dicts, and output columns are read back
with ``operator.itemgetter`` and converted with the fixed types. A batch that does not fit that
mould (a missing or extra column, a dict subclass, a value of another type) goes through the
general path, which decides exactly as before and raises the same errors. ``gc_paused`` keeps
the cyclic garbage collector out of a batch's loop: rows are acyclic dicts, and a batch of 65,536
of them would otherwise trigger ~200 collections.
"""

from __future__ import annotations

import functools
import gc
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

from yarnflow.common.errors import YarnflowError

__all__ = ["RowBuffer", "SchemaMismatchError", "column_lists", "gc_paused", "row_dicts"]

_MAX_GENERATED_COLUMNS = 64


@functools.lru_cache(maxsize=256)
def _row_maker(names: tuple[str, ...]) -> Callable[..., list[dict[str, Any]]]:
    """``make(*columns)``: one dict per row, keys in column order (as ``to_pylist``: a name
    that appears twice keeps its last column)."""
    if len(names) > _MAX_GENERATED_COLUMNS:
        return lambda *columns: [dict(zip(names, values)) for values in zip(*columns)]
    args = ", ".join(f"c{i}" for i in range(len(names)))
    items = ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names))  # repr(str) is a str literal
    targets = ", ".join(f"v{i}" for i in range(len(names)))
    loop = "v0 in c0" if len(names) == 1 else f"{targets} in zip({args})"
    namespace: dict[str, Any] = {}
    exec(f"def make({args}):\n    return [{{{items}}} for {loop}]\n", namespace)  # noqa: S102 - names are repr()'d
    return namespace["make"]  # type: ignore[no-any-return]


def column_lists(batch: pa.RecordBatch) -> list[list[Any]]:
    """Each column of ``batch`` as a Python list (what ``row_dicts`` is made from)."""
    return [column.to_pylist() for column in batch.columns]


def row_dicts(batch: pa.RecordBatch, columns: list[list[Any]] | None = None) -> list[dict[str, Any]]:
    """``batch.to_pylist()``: the same dicts, made a column at a time (from ``columns``, the
    batch's ``column_lists``, when the caller has them already)."""
    if batch.num_columns == 0:
        return [{} for _ in range(batch.num_rows)]
    return _row_maker(tuple(batch.schema.names))(*(column_lists(batch) if columns is None else columns))


@contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic cyclic garbage collection inside (when it was on: nested uses are fine)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class SchemaMismatchError(YarnflowError, TypeError):
    """An operator produced (or received) a batch that does not fit the stream's schema."""


class RowBuffer:
    def __init__(self, op_name: str, what: str = "output", head: Sequence[pa.Field] = (),
                 tail: Sequence[pa.Field] = (), complete: bool = False) -> None:
        self.op_name = op_name
        self.what = what
        self.head, self.tail = list(head), list(tail)
        self.schema: pa.Schema | None = pa.schema(self.head + self.tail) if complete else None
        self.rows: list[dict[str, Any]] = []

    def add(self, row: Any) -> None:
        self.rows.append(row if isinstance(row, dict) else {"value": row})

    def extend(self, rows: Iterable[Any]) -> None:
        for row in rows:
            self.add(row)

    def drain(self, batch_size: int) -> list[pa.RecordBatch]:
        """The buffered rows as batches of at most ``batch_size`` rows; the buffer is emptied."""
        rows, self.rows = self.rows, []
        step = max(1, batch_size)
        return [self.to_batch(rows[i:i + step]) for i in range(0, len(rows), step)]

    def to_batch(self, rows: list[dict[str, Any]]) -> pa.RecordBatch:
        """``rows`` (dicts) as one batch of this stream's schema (fixing it if not yet fixed)."""
        if self.schema is not None:
            batch = self._columnar(rows, self.schema)
            if batch is not None:
                return batch
        try:
            if self.schema is not None:
                batch = pa.RecordBatch.from_pylist(rows, schema=self.schema)
                extra = {n for row in rows for n in row} - set(self.schema.names)  # from_pylist drops them
                if extra:
                    raise SchemaMismatchError(f"new columns {sorted(extra)}")
                return batch
            fixed = {f.name for f in self.head + self.tail}
            names = [n for n in rows[0] if n not in fixed]  # a later row may lack some (null), not add
            extra = {n for row in rows for n in row} - fixed - set(names)
            if extra:
                raise SchemaMismatchError(f"new columns {sorted(extra)} (the first row has {names})")
            arrays = [pa.array([row.get(f.name) for row in rows], type=f.type) for f in self.head]
            arrays += [pa.array([row.get(n) for row in rows]) for n in names]
            arrays += [pa.array([row.get(f.name) for row in rows], type=f.type) for f in self.tail]
            batch = pa.RecordBatch.from_arrays(arrays, names=[f.name for f in self.head] + names
                                               + [f.name for f in self.tail])
            if not any(pa.types.is_null(f.type) for f in batch.schema):
                self.schema = batch.schema  # else the types are not known yet: a later batch decides
            return batch
        except (pa.ArrowInvalid, pa.ArrowTypeError, SchemaMismatchError) as exc:
            raise SchemaMismatchError(
                f"operator '{self.op_name}' emitted rows on its {self.what} that do not match the schema "
                f"fixed by its first rows ({self.schema}): {exc}") from None

    def adopt(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """``batch``, made without rows (a lifted function), if it fits this stream's schema (fixing
        it if not yet fixed); None if not (the rows then decide, with the usual errors)."""
        if self.schema is None:
            if self.head or self.tail or any(pa.types.is_null(f.type) for f in batch.schema):
                return None
            self.schema = batch.schema
            return batch
        return batch if batch.schema.equals(self.schema) else None

    def _columnar(self, rows: list[dict[str, Any]], schema: pa.Schema) -> pa.RecordBatch | None:
        """The fast path of ``to_batch``: rows that are plain dicts with exactly the schema's
        columns, values of its types; None for anything else (the general path decides)."""
        if not rows or set(map(type, rows)) != {dict} or sum(map(len, rows)) != len(rows) * len(schema):
            return None
        try:  # every row has every column (itemgetter raises KeyError) and, by length, no other
            arrays = [pa.array(list(map(operator.itemgetter(field.name), rows)), type=field.type)
                      for field in schema]
        except Exception:  # noqa: BLE001 - a missing column or a value of another type: the general path
            return None
        return pa.RecordBatch.from_arrays(arrays, schema=schema)
