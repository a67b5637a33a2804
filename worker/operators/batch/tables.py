"""Small Arrow helpers the batch operators share: concatenating batches whose schemas differ
only in nullability or integer width, common key types for two join inputs, and hash
partitioning of rows into spill partitions."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.key_assignment import hash_keys
from yarnflow.worker.memory.spill import concat

__all__ = ["common_key_types", "concat", "cast_keys", "partition_ids", "split_by_partition", "slices"]

#: how many spill partitions a level of a hybrid hash join or a spilling aggregation splits into
FANOUT = 32
_FANOUT_BITS = 5


def slices(table: pa.Table | pa.RecordBatch, size: int) -> Iterator[pa.RecordBatch]:
    """``table``'s rows as record batches of at most ``size`` rows (zero-copy where they can be)."""
    if isinstance(table, pa.RecordBatch):
        for start in range(0, table.num_rows, size):
            yield table.slice(start, size)
        return
    for batch in table.to_batches(max_chunksize=size):
        if batch.num_rows:
            yield batch


def _plain(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def common_key_types(left: pa.Schema, right: pa.Schema, left_keys: Sequence[str], right_keys: Sequence[str],
                     what: str) -> list[pa.DataType]:
    """The type each pair of key columns is compared as: the same type when both have it,
    else the wider (integers of any width as int64, integers and floats as float64, string and
    large_string as large_string, dictionaries as their values). Raises JobDefinitionError for
    keys that cannot be compared (a string and a number)."""
    out = []
    for lk, rk in zip(left_keys, right_keys):
        a, b = _plain(left.field(lk).type), _plain(right.field(rk).type)
        if a.equals(b):
            out.append(a)
        elif pa.types.is_null(a) or pa.types.is_null(b):
            out.append(b if pa.types.is_null(a) else a)
        elif pa.types.is_integer(a) and pa.types.is_integer(b):
            out.append(pa.int64())
        elif (pa.types.is_integer(a) or pa.types.is_floating(a)) and (pa.types.is_integer(b) or pa.types.is_floating(b)):
            out.append(pa.float64())
        elif {str(a), str(b)} <= {"string", "large_string"}:
            out.append(pa.large_string())
        elif {str(a), str(b)} <= {"binary", "large_binary"}:
            out.append(pa.large_binary())
        else:
            raise JobDefinitionError(f"{what}: key {lk!r} ({a}) cannot be compared with key {rk!r} ({b})")
    return out


def cast_keys(data: pa.RecordBatch | pa.Table, keys: Sequence[str], types: Sequence[pa.DataType]
              ) -> list[pa.Array | pa.ChunkedArray]:
    """``data``'s key columns as ``types`` (decoded from dictionaries; unchanged where they match)."""
    cols = []
    for k, t in zip(keys, types):
        col = data.column(k)
        if not col.type.equals(t):
            if pa.types.is_dictionary(col.type):
                col = col.cast(col.type.value_type)
            if not col.type.equals(t):
                col = col.cast(t)
        cols.append(col)
    return cols


def partition_ids(key_columns: Sequence[pa.Array | pa.ChunkedArray], level: int) -> np.ndarray:
    """Each row's spill partition (0 .. FANOUT-1) at recursion ``level``: ``_FANOUT_BITS`` bits
    of the keys' 64-bit hash, from the top down, so every level splits a partition anew (the
    exchange before the operator used the hash's low bits: a subtask's keys still spread
    evenly here)."""
    names = [str(i) for i in range(len(key_columns))]
    h = hash_keys(pa.table(list(key_columns), names=names), names)
    shift = 64 - _FANOUT_BITS * (level % (64 // _FANOUT_BITS) + 1)
    return ((h >> np.uint64(shift)) & np.uint64(FANOUT - 1)).astype(np.int64)


def split_by_partition(data: pa.RecordBatch | pa.Table, parts: np.ndarray) -> Iterable[tuple[int, pa.Table]]:
    """``(partition, rows)`` for each partition with rows, rows in their order."""
    table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
    counts = np.bincount(parts, minlength=FANOUT)
    if (counts == len(parts)).any():  # every row in one partition
        yield int(np.argmax(counts)), table
        return
    order = np.argsort(parts, kind="stable")
    ordered = table.take(pa.array(order))
    offset = 0
    for p, c in enumerate(counts.tolist()):
        if c:
            yield p, ordered.slice(offset, c)
        offset += c
