"""Keys -> key groups -> subtasks, as in Flink (KeyGroupRangeAssignment), vectorised.

A key's hash is stable across processes and runs (never Python's salted ``hash``): strings are
dictionary-encoded first so each distinct value is hashed once.

The hash is pandas' ``hash_array`` (checkpoints store key groups, so it must not change), made
without importing pandas: importing it costs every TaskExecutor, AppMaster and client about
50 MB of memory. Numbers are mixed here with numpy exactly as pandas does; strings and other
objects go through pandas' compiled SipHash (``pandas._libs.hashing``), loaded on its own.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from yarnflow.common.errors import JobDefinitionError
from yarnflow.common.keygroups import key_group_range

__all__ = ["hash_keys", "key_group_range", "key_groups", "operator_index_for_key_groups"]

_HASH_KEY = "0123456789123456"  # pandas' default hash key


@functools.cache
def _hash_object_array() -> Callable[[np.ndarray, str, str], np.ndarray]:
    """pandas' ``hash_object_array`` (SipHash-2-4 of each object's UTF-8 bytes), without
    importing the pandas package (its ``__init__`` loads all of pandas)."""
    spec = importlib.util.find_spec("pandas")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        for path in glob.glob(os.path.join(folder, "_libs", "hashing.*")):
            try:
                ext = importlib.util.spec_from_file_location("pandas._libs.hashing", path)
                if ext is None or ext.loader is None:
                    continue
                module = importlib.util.module_from_spec(ext)
                ext.loader.exec_module(module)
                return module.hash_object_array  # type: ignore[no-any-return]
            except ImportError:
                continue
    from pandas._libs.hashing import hash_object_array  # a layout this does not know: the plain import

    return hash_object_array  # type: ignore[no-any-return]


def hash_array(vals: np.ndarray, categorize: bool = True) -> np.ndarray:
    """``pandas.util.hash_array(vals, categorize=...)`` for 1-d numpy arrays of numbers, booleans,
    datetimes or objects. ``categorize`` only changes how nulls of an object array hash, and
    callers here replace those; it is kept so calls read like pandas'."""
    del categorize
    dtype = vals.dtype
    if dtype.kind == "b":
        out = vals.astype("u8")
    elif issubclass(dtype.type, (np.datetime64, np.timedelta64)):
        out = vals.view("i8").astype("u8", copy=False)
    elif issubclass(dtype.type, np.number) and dtype.itemsize <= 8:
        out = vals.view(f"u{dtype.itemsize}").astype("u8")
    else:
        hash_objects: Any = _hash_object_array()
        try:
            out = hash_objects(vals, _HASH_KEY, "utf8")
        except TypeError:  # mixed types
            out = hash_objects(vals.astype(str).astype(object), _HASH_KEY, "utf8")
    out ^= out >> np.uint64(30)
    out *= np.uint64(0xBF58476D1CE4E5B9)
    out ^= out >> np.uint64(27)
    out *= np.uint64(0x94D049BB133111EB)
    out ^= out >> np.uint64(31)
    return out


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
