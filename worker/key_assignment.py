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
import threading
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
        return _by_dictionary(arr, _distinct_hashes(arr.dictionary))
    elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
            or pa.types.is_large_binary(t):
        if len(arr) > 64:  # hash each distinct value once (the values seen before not again)
            return _STRING_HASHES.hash(arr)
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
    return _with_nulls(arr, out)


def _with_nulls(arr: pa.Array, out: np.ndarray) -> np.ndarray:
    if arr.null_count:
        out = np.where(arr.is_null().to_numpy(zero_copy_only=False), np.uint64(0x9E3779B97F4A7C15), out)
    return out


def _distinct_hashes(dictionary: pa.Array) -> np.ndarray:
    """The hashes of a dictionary's values (distinct, no nulls)."""
    t = dictionary.type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return hash_array(dictionary.to_numpy(zero_copy_only=False).astype(object), categorize=False)
    return _hash_array(dictionary)


def _by_dictionary(arr: pa.DictionaryArray, dict_hash: np.ndarray) -> np.ndarray:
    """Each row's hash from its dictionary value's (``dict_hash``); nulls hashed as nulls."""
    if not len(arr.dictionary):  # all null: no values to index
        return _with_nulls(arr, np.zeros(len(arr), dtype=np.uint64))
    indices = arr.indices.fill_null(0) if arr.indices.null_count else arr.indices
    return _with_nulls(arr, dict_hash[indices.to_numpy(zero_copy_only=False)])


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


def own_key_groups(batch: pa.RecordBatch, key_columns: Sequence[str], max_parallelism: int, parallelism: int,
                   subtask_index: int) -> pa.RecordBatch:
    """The rows of ``batch`` whose key groups subtask ``subtask_index`` of ``parallelism`` owns."""
    owner = operator_index_for_key_groups(key_groups(batch, key_columns, max_parallelism), max_parallelism,
                                          parallelism)
    mine = owner == subtask_index
    if mine.all():
        return batch
    return batch.filter(pa.array(mine))


class _StringHashCache(threading.local):
    """The hashes of the strings a thread has hashed before, so that a batch of keys from a
    known vocabulary (most keyed streams: words, the ids of active users, ...) costs an Arrow
    ``index_in`` and a numpy ``take``, both without the GIL, instead of turning each distinct
    value into a Python string and hashing it under the GIL, which the slots of one
    TaskExecutor (threads of one process) wait for each other on. Per thread and per type, up to
    ``LIMIT`` values and ``LIMIT_BYTES`` of them each; when most values of batch after batch are new (unique ids), it stops
    looking and hashes as before. The hashes are the same either way."""

    LIMIT = 1 << 16
    LIMIT_BYTES = 4 << 20
    GIVE_UP_AFTER = 8  # batches in a row with more new values than known ones

    def __init__(self) -> None:
        self._known: dict[pa.DataType, tuple[pa.Array, np.ndarray]] = {}
        self._misses = 0

    def hash(self, arr: pa.Array) -> np.ndarray:
        if self._misses >= self.GIVE_UP_AFTER:
            encoded = pc.dictionary_encode(arr)
            return _by_dictionary(encoded, _distinct_hashes(encoded.dictionary))
        known = self._known.get(arr.type)
        if known is None:
            return self._learn(arr, None)
        values, hashes = known
        index = pc.index_in(arr, value_set=values)
        if not index.null_count:  # every value seen before
            self._misses = 0
            return hashes[index.to_numpy(zero_copy_only=False)]
        new = index.is_null().to_numpy(zero_copy_only=False)
        out = np.empty(len(arr), dtype=np.uint64)
        out[~new] = hashes[index.drop_null().to_numpy(zero_copy_only=False)]
        fresh = arr.filter(pa.array(new))
        out[new] = self._learn(fresh, known)
        self._misses = self._misses + 1 if 2 * len(fresh) > len(arr) else 0
        return out

    def _learn(self, arr: pa.Array, known: tuple[pa.Array, np.ndarray] | None) -> np.ndarray:
        """The hashes of ``arr``; its distinct values are remembered while there is room."""
        encoded = pc.dictionary_encode(arr)
        dictionary = encoded.dictionary
        dict_hash = _distinct_hashes(dictionary)
        held, held_bytes = (0, 0) if known is None else (len(known[0]), known[0].nbytes)
        if len(dictionary) and held + len(dictionary) <= self.LIMIT \
                and held_bytes + dictionary.nbytes <= self.LIMIT_BYTES:
            self._known[arr.type] = (dictionary, dict_hash) if known is None else (
                pa.concat_arrays([known[0], dictionary]), np.concatenate([known[1], dict_hash]))
        return _by_dictionary(encoded, dict_hash)


_STRING_HASHES = _StringHashCache()
