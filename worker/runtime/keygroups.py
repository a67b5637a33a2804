"""Keys -> key groups -> subtasks, as in Flink (KeyGroupRangeAssignment), vectorised.

A key's hash is stable across processes and runs (never Python's salted ``hash``): strings are
dictionary-encoded first so each distinct value is hashed once.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pandas.util import hash_array

from yarnflow.common.errors import JobDefinitionError
from yarnflow.common.keygroups import key_group_range

__all__ = ["hash_keys", "key_group_range", "key_groups", "operator_index_for_key_groups"]


def _hash_array(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_dictionary(t):
        codes = arr.indices.to_numpy(zero_copy_only=False)
        dictionary = arr.dictionary
        dict_hash = hash_array(dictionary.to_numpy(zero_copy_only=False).astype(object), categorize=False) \
            if (pa.types.is_string(dictionary.type) or pa.types.is_large_string(dictionary.type)
                or pa.types.is_binary(dictionary.type)) else _hash_array(dictionary)
        out = dict_hash[np.nan_to_num(codes, nan=0).astype(np.int64)] if len(dictionary) \
            else np.zeros(len(arr), dtype=np.uint64)  # all null: no values to index
    elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
            or pa.types.is_large_binary(t):
        if len(arr) > 64:  # hash each distinct value once
            return _hash_array(pc.dictionary_encode(arr))
        out = hash_array(arr.fill_null("").to_numpy(zero_copy_only=False).astype(object), categorize=False)
    elif pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) \
            or pa.types.is_temporal(t):
        values = arr
        if pa.types.is_temporal(t):  # its integer representation (cast refuses date32, time32)
            values = values.view(pa.int32() if t.bit_width == 32 else pa.int64()).cast(pa.int64())
        if values.null_count:
            values = values.fill_null(False if pa.types.is_boolean(t) else 0)
        out = hash_array(values.to_numpy(zero_copy_only=False))
    else:
        out = hash_array(np.asarray(arr.to_pylist(), dtype=object))
    if arr.null_count:
        out = np.where(arr.is_null().to_numpy(zero_copy_only=False), np.uint64(0x9E3779B97F4A7C15), out)
    return out


def hash_keys(batch: pa.RecordBatch | pa.Table, key_columns: Sequence[str]) -> np.ndarray:
    """A uint64 hash per row of the key columns."""
    h: np.ndarray | None = None
    for name in key_columns:
        idx = batch.schema.get_field_index(name)
        if idx < 0:
            raise JobDefinitionError(
                f"key column {name!r} does not exist; the stream has columns {batch.schema.names}")
        col_hash = _hash_array(batch.column(idx))
        h = col_hash if h is None else (h * np.uint64(31)) ^ col_hash
    assert h is not None
    return h


def key_groups(batch: pa.RecordBatch | pa.Table, key_columns: Sequence[str], max_parallelism: int) -> np.ndarray:
    return (hash_keys(batch, key_columns) % np.uint64(max_parallelism)).astype(np.int64)


def operator_index_for_key_groups(kg: np.ndarray, max_parallelism: int, parallelism: int) -> np.ndarray:
    """Flink's computeOperatorIndexForKeyGroup: contiguous key-group ranges per subtask."""
    return (kg * parallelism) // max_parallelism
