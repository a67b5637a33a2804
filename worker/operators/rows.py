"""Rows (Python dicts) that operators emit, turned into record batches: the one row-batching
helper of per-row transforms, keyed process functions and windows.

The first row's columns are the stream's columns (a later row may lack some: null there) and
the first batch without an all-null column fixes their types; a row with a column the first row
did not have, or a value of another type, raises SchemaMismatchError naming the operator. A
row that is not a dict becomes ``{"value": row}``. ``head`` and ``tail`` are fields typed up front
that frame the other columns (a window's key and window columns); with ``complete`` the schema is
``head + tail`` from the start.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from yarnflow.common.errors import YarnflowError

__all__ = ["RowBuffer", "SchemaMismatchError"]


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
