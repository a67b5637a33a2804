"""Columnar keyed state for vectorised operators, part of the keyed state backend.

``AggregateTable``: one row of aggregate values per key (a STREAMING ``key_by().sum()``). The
key of each row is in a dict (key -> row number); the values are numpy columns with a validity
mask, updated a batch at a time: a batch's partial aggregates (one row per key it touched) are
combined with the stored ones by vectorised numpy operations, and only the lookup of each
touched key is a Python step. The key columns and key groups only ever grow by appending, so a
snapshot just keeps them. The value columns change in place, so a snapshot freezes them copy-on-
write, by chunks of 65,536 rows: before the task changes a chunk it copies it for every snapshot
not yet made, and the writer's thread copies the chunks the task did not touch as it makes the
table. The task pauses O(1) to take a snapshot and then copies only what it writes. Snapshot
table: ``key_group`` (int32), the key columns, then one column per aggregate, typed as the
output.

``NamespacedTables``: immutable Arrow tables per namespace (an int, such as a window start) and
a flag per namespace (a window that has fired). A snapshot keeps the lists of tables (O(number of
namespaces)); the snapshot table, made on the writer's thread, is the tables' rows with
``key_group`` (int32, from the key columns), ``namespace`` (int64) and ``flagged`` (bool) first.

Both keep only rows of the key groups they are given on restore (the backend filters them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from yarnflow.worker.key_assignment import key_groups
from yarnflow.worker.state.errors import StateRestoreError
from yarnflow.worker.state.tables import require_columns

__all__ = ["AggregateState", "AggregateTable", "NamespacedState", "NamespacedTables", "restore_namespaced"]

_FUNCS = ("sum", "min", "max")
_CHUNK_BITS = 16  # copy-on-write granularity of the value columns: 65,536 rows


def _temporal_view(t: pa.DataType) -> pa.DataType | None:
    if pa.types.is_temporal(t):
        return pa.int32() if t.bit_width == 32 else pa.int64()
    return None


class _Values:
    """One aggregate column: numpy values and validity, growing by doubling."""

    def __init__(self, func: str, arrow_type: pa.DataType) -> None:
        self.func = func
        self.set_type(arrow_type, 0)

    def set_type(self, arrow_type: pa.DataType, capacity: int) -> None:
        self.type = arrow_type
        self.view = _temporal_view(arrow_type)
        plain = pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) or pa.types.is_boolean(arrow_type)
        if self.view is not None:
            self.dtype: Any = self.view.to_pandas_dtype()
        elif plain:
            self.dtype = arrow_type.to_pandas_dtype()
        else:
            self.dtype = object
        self.values = np.empty(capacity, dtype=self.dtype) if self.dtype is not object else np.full(capacity, None)
        self.valid = np.zeros(capacity, dtype=bool)

    def grow(self, capacity: int) -> None:
        if capacity > len(self.values):
            size = max(capacity, 2 * len(self.values), 1024)
            values = np.empty(size, dtype=self.dtype) if self.dtype is not object else np.full(size, None)
            values[:len(self.values)] = self.values
            valid = np.zeros(size, dtype=bool)
            valid[:len(self.valid)] = self.valid
            self.values, self.valid = values, valid

    def numpy(self, arr: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
        """``arr`` (cast to this column's type) as (values, validity)."""
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if not arr.type.equals(self.type):
            arr = arr.cast(self.type)
        valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        if self.dtype is object:
            return np.array(arr.to_pylist() + [None], dtype=object)[:-1], valid
        if self.view is not None:
            arr = arr.cast(self.view)
        filler = False if pa.types.is_boolean(arr.type) else 0
        values = arr.fill_null(filler).to_numpy(zero_copy_only=False) if arr.null_count else arr.to_numpy(zero_copy_only=False)
        return np.asarray(values, dtype=self.dtype), valid

    def arrow(self, values: np.ndarray, valid: np.ndarray) -> pa.Array:
        if self.dtype is object:
            return pa.array([v if ok else None for v, ok in zip(values.tolist(), valid.tolist())], type=self.type)
        mask = ~valid if not valid.all() else None
        if self.view is not None:
            return pa.array(values, type=self.view, mask=mask).cast(self.type)
        return pa.array(values, type=self.type, mask=mask)

    def combine(self, old: np.ndarray, new: np.ndarray) -> np.ndarray:
        if self.dtype is object:
            if self.func == "sum":
                return np.array([a + b for a, b in zip(old, new)] + [None], dtype=object)[:-1]
            pick = min if self.func == "min" else max
            return np.array([pick(a, b) for a, b in zip(old, new)] + [None], dtype=object)[:-1]
        if self.func == "sum":
            return old + new
        return np.minimum(old, new) if self.func == "min" else np.maximum(old, new)


class _FrozenValues:
    """A snapshot's view of the value columns as they were (see the module docstring): each chunk
    is copied once, by the task before it writes to it (``save``) or by the writer (``arrays``)."""

    def __init__(self, columns: list[_Values | None], n: int) -> None:
        self.n = n
        self._arrays = [(c.values, c.valid) if c is not None else None for c in columns]
        self._pending = set(range((n + (1 << _CHUNK_BITS) - 1) >> _CHUNK_BITS))
        self._copies: dict[int, list[tuple[np.ndarray, np.ndarray] | None]] = {}
        self._lock = threading.Lock()

    def _copy(self, chunk: int) -> list[tuple[np.ndarray, np.ndarray] | None]:
        part = slice(chunk << _CHUNK_BITS, min((chunk + 1) << _CHUNK_BITS, self.n))
        return [(a[0][part].copy(), a[1][part].copy()) if a is not None else None for a in self._arrays]

    def save(self, chunks: Iterable[int]) -> None:
        """Task thread, before it changes rows in ``chunks``."""
        with self._lock:
            for chunk in chunks:
                if chunk in self._pending:
                    self._pending.discard(chunk)
                    self._copies[chunk] = self._copy(chunk)

    @property
    def open(self) -> bool:
        return bool(self._pending)

    def arrays(self) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """Writer thread: the columns as they were, chunk by chunk."""
        parts = []
        for chunk in range((self.n + (1 << _CHUNK_BITS) - 1) >> _CHUNK_BITS):
            with self._lock:
                if chunk in self._pending:
                    self._pending.discard(chunk)
                    part = self._copy(chunk)
                else:
                    part = self._copies.pop(chunk)
            parts.append(part)
        out: list[tuple[np.ndarray, np.ndarray] | None] = []
        for j, a in enumerate(self._arrays):
            if a is None:
                out.append(None)
            else:
                chunks = [p[j] for p in parts]
                out.append((np.concatenate([c[0] for c in chunks]) if chunks else a[0][:0],  # type: ignore[index]
                            np.concatenate([c[1] for c in chunks]) if chunks else a[1][:0]))  # type: ignore[index]
        return out

    def close(self) -> None:
        with self._lock:
            self._pending.clear()
            self._copies.clear()


class AggregateState(Protocol):
    """What a vectorised keyed aggregation needs of its state: this module's ``AggregateTable``
    (in memory) or ``rocksdb_columnar.RocksDBAggregateTable`` (in RocksDB)."""

    name: str
    keys: list[str]
    value_names: list[str]

    def __len__(self) -> int: ...

    def upsert(self, partial: pa.Table) -> pa.Table: ...

    def snapshot_builder(self) -> tuple[Callable[[], pa.Table], Callable[[], None]]: ...

    def restore(self, table: pa.Table) -> None: ...

    def rows(self) -> pa.Table: ...


class NamespacedState(Protocol):
    """What the vectorised windows need of their state: this module's ``NamespacedTables`` (in
    memory) or ``rocksdb_columnar.RocksDBNamespacedTables`` (in RocksDB)."""

    name: str
    key_columns: list[str]

    def __len__(self) -> int: ...

    def __contains__(self, namespace: int) -> bool: ...

    def namespaces(self) -> list[int]: ...

    def get(self, namespace: int) -> list[pa.Table]: ...

    def count(self, namespace: int) -> int: ...

    def add(self, namespace: int, table: pa.Table) -> None: ...

    def replace(self, namespace: int, tables: list[pa.Table]) -> None: ...

    def drop(self, namespace: int) -> None: ...

    def flag(self, namespace: int) -> None: ...

    def is_flagged(self, namespace: int) -> bool: ...

    def clear(self) -> None: ...

    def snapshot_builder(self) -> tuple[Callable[[], pa.Table], Callable[[], None]]: ...

    def restore(self, table: pa.Table) -> None: ...


def restore_namespaced(state: NamespacedState, table: pa.Table) -> None:
    """Add the rows of ``table`` (a ``NamespacedTables`` snapshot table limited to the subtask's
    key groups) to ``state``, either backend's."""
    require_columns(table, state.name, ["namespace", "flagged", *state.key_columns])
    if not table.num_rows:
        return
    namespaces = np.asarray(table.column("namespace").to_numpy(), dtype=np.int64)
    flagged = np.asarray(table.column("flagged").to_numpy(zero_copy_only=False), dtype=bool)
    rows = table.drop_columns([c for c in ("key_group", "namespace", "flagged") if c in table.column_names])
    for ns in np.unique(namespaces).tolist():
        mask = namespaces == ns
        state.add(int(ns), rows.filter(pa.array(mask)))
        if flagged[mask].any():
            state.flag(int(ns))


class AggregateTable:
    """One row of aggregates per key (see the module docstring). ``values`` names the aggregate
    columns, each with its combining function (sum, min or max)."""

    def __init__(self, name: str, keys: list[str], values: list[tuple[str, str]], max_parallelism: int) -> None:
        for _, func in values:
            if func not in _FUNCS:
                raise ValueError(f"aggregate function {func!r} is not one of {_FUNCS}")
        self.name = name
        self.keys = list(keys)
        self.value_names = [n for n, _ in values]
        self._funcs = [f for _, f in values]
        self._max_parallelism = max_parallelism
        self._index: dict[Any, int] = {}
        self._key_chunks: list[list[pa.Array]] = [[] for _ in self.keys]
        self._key_types: list[pa.DataType | None] = [None for _ in self.keys]
        self._kg = np.zeros(0, dtype=np.int32)
        self._columns: list[_Values | None] = [None for _ in values]
        self._n = 0
        self._frozen: list[_FrozenValues] = []  # snapshots not yet made

    def __len__(self) -> int:
        return self._n

    def _lookup_keys(self, key_columns: list[pa.Array]) -> list[Any]:
        if len(key_columns) == 1:
            return key_columns[0].to_pylist()  # type: ignore[no-any-return]
        return list(zip(*(c.to_pylist() for c in key_columns)))

    def _append_keys(self, key_columns: list[pa.Array], key_group: np.ndarray) -> None:
        m = len(key_group)
        for i, col in enumerate(key_columns):
            if self._key_types[i] is None:
                self._key_types[i] = col.type
            elif not col.type.equals(self._key_types[i]):
                col = col.cast(self._key_types[i])
            self._key_chunks[i].append(col)
        need = self._n + m
        if need > len(self._kg):
            grown = np.zeros(max(need, 2 * len(self._kg), 1024), dtype=np.int32)
            grown[:self._n] = self._kg[:self._n]
            self._kg = grown
        self._kg[self._n:need] = key_group
        for col in self._columns:
            if col is not None:
                col.grow(need)
        self._n = need

    def _column(self, j: int, arrow_type: pa.DataType) -> _Values:
        col = self._columns[j]
        if col is None:
            col = self._columns[j] = _Values(self._funcs[j], arrow_type)
            col.grow(len(self._kg))
        elif pa.types.is_null(col.type) and not pa.types.is_null(arrow_type):
            col.set_type(arrow_type, 0)  # every row so far is null: take the first real type
            col.grow(len(self._kg))
        return col

    def upsert(self, partial: pa.Table) -> pa.Table:
        """Combine ``partial`` (the key columns, then one column per aggregate; one row per key)
        into the stored rows; returns the updated rows of those keys, with the stored types."""
        nk = len(self.keys)
        key_columns = [partial.column(i).combine_chunks() for i in range(nk)]
        lookup = self._index.get
        found = [lookup(k, -1) for k in self._lookup_keys(key_columns)]
        ids = np.asarray(found, dtype=np.int64)
        fresh = ids < 0
        if fresh.any():
            positions = np.flatnonzero(fresh)
            start = self._n
            ids[positions] = np.arange(start, start + len(positions))
            take = pa.array(positions)
            new_keys = [c.take(take) for c in key_columns]
            table = pa.Table.from_arrays(new_keys, names=self.keys)
            groups = key_groups(table, self.keys, self._max_parallelism).astype(np.int32)
            keys_py = self._lookup_keys(new_keys)
            self._index.update(zip(keys_py, range(start, start + len(positions))))
            self._append_keys(new_keys, groups)
        old = ~fresh
        if self._frozen and old.any():
            chunks = np.unique(ids[old] >> _CHUNK_BITS).tolist()
            for frozen in tuple(self._frozen):
                frozen.save(chunks)
        out = []
        for j in range(len(self._funcs)):
            arr = partial.column(nk + j)
            col = self._column(j, arr.type)
            values, valid = col.numpy(arr)
            if old.any():
                at = ids[old]
                was, was_valid, now, now_valid = col.values[at], col.valid[at], values[old], valid[old]
                both = was_valid & now_valid
                merged = np.where(was_valid, was, now)
                if both.any():
                    merged[both] = col.combine(was[both], now[both])
                col.values[at] = merged
                col.valid[at] = was_valid | now_valid
            if fresh.any():
                col.values[ids[fresh]] = values[fresh]
                col.valid[ids[fresh]] = valid[fresh]
            out.append(col.arrow(col.values[ids], col.valid[ids]))
        return pa.Table.from_arrays(key_columns + out, names=self.keys + self.value_names)

    def snapshot_builder(self) -> tuple[Callable[[], pa.Table], Callable[[], None]]:
        """Freezes the rows now (O(1)); returns the function that makes the snapshot table from
        them (on the writer's thread) and the one that forgets them if it is never made."""
        n = self._n
        key_group = self._kg[:n]  # rows below n never change
        chunks = [list(c) for c in self._key_chunks]
        key_types = list(self._key_types)
        columns = list(self._columns)
        frozen = _FrozenValues(columns, n)
        self._frozen.append(frozen)

        def discard() -> None:
            frozen.close()
            if frozen in self._frozen:
                self._frozen.remove(frozen)

        def build() -> pa.Table:
            try:
                values = frozen.arrays()
            finally:
                discard()
            if not n:
                return pa.table({"key_group": pa.array([], pa.int32())})
            arrays: list[Any] = [pa.array(key_group, pa.int32())]
            arrays += [pa.chunked_array(c, type=t) for c, t in zip(chunks, key_types)]
            arrays += [pa.nulls(n) if col is None or v is None else col.arrow(v[0], v[1])
                       for col, v in zip(columns, values)]
            return pa.table(arrays, names=["key_group", *self.keys, *self.value_names])

        return build, discard

    def restore(self, table: pa.Table) -> None:
        """Add the rows of ``table`` (a snapshot table, already limited to this subtask's key
        groups). Raises StateRestoreError when a column is missing or a key is restored twice."""
        require_columns(table, self.name, [*self.keys, *self.value_names])
        if not table.num_rows:
            return
        key_columns = [table.column(k).combine_chunks() for k in self.keys]
        keys_py = self._lookup_keys(key_columns)
        start = self._n
        for i, key in enumerate(keys_py):
            if key in self._index or self._index.setdefault(key, start + i) != start + i:
                raise StateRestoreError(f"state {self.name!r}: key {key!r} restored twice")
        groups = np.asarray(table.column("key_group").to_numpy(), dtype=np.int32)
        self._append_keys(key_columns, groups)
        for j, name in enumerate(self.value_names):
            arr = table.column(name)
            col = self._column(j, arr.type)
            values, valid = col.numpy(arr)
            col.values[start:self._n] = values
            col.valid[start:self._n] = valid

    def rows(self) -> pa.Table:
        """Every stored row (key columns and aggregates), for tests and BATCH output."""
        return self.snapshot_builder()[0]().drop_columns(["key_group"]) if self._n else pa.table({})


class NamespacedTables:
    """Immutable Arrow tables per namespace, and a flag per namespace (see the module docstring)."""

    def __init__(self, name: str, key_columns: list[str], max_parallelism: int) -> None:
        self.name = name
        self.key_columns = list(key_columns)
        self._max_parallelism = max_parallelism
        self._tables: dict[int, list[pa.Table]] = {}
        self._flagged: set[int] = set()

    def __len__(self) -> int:
        return len(self._tables)

    def __contains__(self, namespace: int) -> bool:
        return namespace in self._tables

    def namespaces(self) -> list[int]:
        return sorted(self._tables)

    def get(self, namespace: int) -> list[pa.Table]:
        return self._tables.get(namespace, [])

    def count(self, namespace: int) -> int:
        """How many tables ``namespace`` holds (``len(get(namespace))``)."""
        return len(self._tables.get(namespace, []))

    def add(self, namespace: int, table: pa.Table) -> None:
        self._tables.setdefault(namespace, []).append(table)

    def replace(self, namespace: int, tables: list[pa.Table]) -> None:
        self._tables[namespace] = list(tables)

    def drop(self, namespace: int) -> None:
        self._tables.pop(namespace, None)
        self._flagged.discard(namespace)

    def flag(self, namespace: int) -> None:
        self._flagged.add(namespace)

    def is_flagged(self, namespace: int) -> bool:
        return namespace in self._flagged

    def clear(self) -> None:
        self._tables.clear()
        self._flagged.clear()

    def snapshot_builder(self) -> tuple[Callable[[], pa.Table], Callable[[], None]]:
        """The lists of (immutable) tables now; returns the function that makes the snapshot
        table (on the writer's thread) and a no-op (nothing to forget)."""
        view = {ns: tuple(t for t in tables if t.num_rows) for ns, tables in self._tables.items()}
        flagged = set(self._flagged)

        def build() -> pa.Table:
            parts = []
            for ns in sorted(view):
                if not view[ns]:
                    continue
                t = pa.concat_tables(view[ns], promote_options="permissive")
                n = t.num_rows
                groups = key_groups(t, self.key_columns, self._max_parallelism).astype(np.int32)
                t = t.add_column(0, "flagged", pa.array(np.full(n, ns in flagged)))
                t = t.add_column(0, "namespace", pa.array(np.full(n, ns, dtype=np.int64)))
                parts.append(t.add_column(0, "key_group", pa.array(groups, pa.int32())))
            if not parts:
                return pa.table({"key_group": pa.array([], pa.int32())})
            return pa.concat_tables(parts, promote_options="permissive")

        return build, lambda: None

    def restore(self, table: pa.Table) -> None:
        """Add the rows of ``table`` (a snapshot table limited to this subtask's key groups)."""
        restore_namespaced(self, table)
