"""The columnar states of vectorised operators on the RocksDB state backend: the aggregate
table of a STREAMING ``key_by().sum()`` and the namespaced tables of the vectorised windows.

``RocksDBAggregateTable`` has the interface of the in-memory ``columnar.AggregateTable`` (one row
of aggregates per key: ``upsert``, ``snapshot_builder``, ``restore``, ``rows``, ``len``) but
keeps its rows in a column family of the backend's database (the format is in
``common/rocksdb_columnar.py``), so a STREAMING ``key_by().sum()`` may have more keys than fit
in memory. Only the batch being combined is in memory:

``upsert(partial)``: the batch's keys are encoded (key group first) and read with one multi-get;
the stored values and the batch's are combined column by column with the same vectorised numpy
code as the in-memory table (``columnar._Values``); the updated rows go back in one WriteBatch.

Snapshots: the backend's own RocksDB checkpoint covers this family with the others (and its
incremental checkpoints share its SST files), so ``snapshot()`` of the backend never calls
``snapshot_builder``; the backend records the state in the manifest's metadata instead
(``COLUMNAR_KEY``), and the canonical table is made from the checkpoint's files. The table's
own ``snapshot_builder`` makes a RocksDB checkpoint too, for callers that want this state
alone. Restores: from a canonical table (a savepoint's, of either backend) through ``restore``;
from a native snapshot the backend copies or adopts the family and calls ``adopt``.

``RocksDBNamespacedTables`` has the interface of ``columnar.NamespacedTables``, its rows in a
column family cut by key group; only an index of namespaces and the fired flags are in
memory (see the class).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from rocksdict import Checkpoint, Rdict, WriteBatch

from yarnflow.common.rocksdb_columnar import (
    TYPES_KEY,
    aggregate_batches,
    from_ipc,
    from_storage,
    namespaced_batches,
    namespaced_entry,
    read_namespaced,
    read_types,
    to_ipc,
    to_storage,
    types_entry,
)
from yarnflow.common.rocksdb_snapshot import open_read_only, scan
from yarnflow.common.state_format import decode, encode
from yarnflow.worker.key_assignment import key_groups
from yarnflow.worker.state.columnar import _FUNCS, _Values, restore_namespaced
from yarnflow.worker.state.errors import StateRestoreError
from yarnflow.worker.state.tables import require_columns

if TYPE_CHECKING:
    from yarnflow.worker.state.rocksdb import RocksDBKeyedStateBackend

__all__ = ["RocksDBAggregateTable", "RocksDBNamespacedTables"]

_RESTORE_ROWS = 65_536


class RocksDBAggregateTable:
    """One row of aggregates per key in the column family ``name`` of ``backend``'s database (see
    the module docstring). ``values`` names the aggregate columns, each with its combining
    function (sum, min or max)."""

    def __init__(self, backend: RocksDBKeyedStateBackend, name: str, keys: list[str],
                 values: list[tuple[str, str]]) -> None:
        for _, func in values:
            if func not in _FUNCS:
                raise ValueError(f"aggregate function {func!r} is not one of {_FUNCS}")
        self._backend = backend
        self.name = name
        self.keys = list(keys)
        self.value_names = [n for n, _ in values]
        self._funcs = [f for _, f in values]
        self._key_types: list[pa.DataType | None] = [None for _ in self.keys]
        self._helpers: list[_Values | None] = [None for _ in values]
        self._prefixes = [kg.to_bytes(2, "big") for kg in range(backend.max_parallelism)]
        self._n: int | None = 0  # None: not counted since a native restore
        backend.column_family(name)  # the family exists from the start: every checkpoint has it

    # ---- types

    @property
    def value_types(self) -> list[pa.DataType | None]:
        return [h.type if h is not None else None for h in self._helpers]

    def _learn(self, key_types: list[pa.DataType], value_types: list[pa.DataType]) -> bool:
        """Take the types of columns not known yet (or only ever null); True if any changed."""
        changed = False
        for i, t in enumerate(key_types):
            known = self._key_types[i]
            if known is None or (pa.types.is_null(known) and not pa.types.is_null(t)):
                self._key_types[i], changed = t, True
        for j, t in enumerate(value_types):
            helper = self._helpers[j]
            if helper is None or (pa.types.is_null(helper.type) and not pa.types.is_null(t)):
                self._helpers[j], changed = _Values(self._funcs[j], t), True
        return changed

    def _types_entry(self) -> bytes:
        return types_entry(self.keys, [t or pa.null() for t in self._key_types], self.value_names,
                           [t or pa.null() for t in self.value_types])

    def adopt(self, source: Rdict | None = None) -> None:
        """After the backend restored a native snapshot: take the types recorded in the family
        of ``source`` (a restored database the rows were copied from; None: this backend's own
        database, adopted whole), record them in this family, and count the rows again."""
        cf = self._backend.column_family(self.name) if source is None else source.get_column_family(self.name)
        found = read_types(cf)
        if found is not None:
            self._learn([f.type for f in found[0]], [f.type for f in found[1]])
            self._backend.column_family(self.name)[TYPES_KEY] = self._types_entry()
        self._n = None

    # ---- rows

    def __len__(self) -> int:
        if self._n is None:
            self._n = sum(1 for _ in scan(self._backend.column_family(self.name), self._backend.key_group_range))
        return self._n

    def _dbkeys(self, groups: np.ndarray, key_columns: list[pa.Array]) -> list[bytes]:
        """The RocksDB key of each row: key group, then the key tuple (columns cast to the stored types)."""
        cols = [c if t is None or c.type.equals(t) else c.cast(t) for c, t in zip(key_columns, self._key_types)]
        prefixes = self._prefixes
        return [prefixes[g] + encode(k) for g, k in zip(groups.tolist(), zip(*(to_storage(c) for c in cols)))]

    def _write(self, dbkeys: list[bytes], columns: list[pa.Array], types_changed: bool) -> None:
        backend = self._backend
        handle = backend.db.get_column_family_handle(self.name)
        batch = WriteBatch(raw_mode=True)
        for dbkey, row in zip(dbkeys, zip(*(to_storage(c) for c in columns))):
            batch.put(dbkey, encode(row), handle)
        if types_changed:
            batch.put(TYPES_KEY, self._types_entry(), handle)
        backend.db.write(batch)

    def upsert(self, partial: pa.Table) -> pa.Table:
        """Combine ``partial`` (the key columns, then one column per aggregate; one row per key)
        into the stored rows; returns the updated rows of those keys, with the stored types."""
        nk = len(self.keys)
        key_columns = [partial.column(i).combine_chunks() for i in range(nk)]
        changed = self._learn([c.type for c in key_columns], [partial.column(nk + j).type for j in range(len(self._funcs))])
        groups = key_groups(partial, self.keys, self._backend.max_parallelism)
        dbkeys = self._dbkeys(groups, key_columns)
        old = [decode(v) if v is not None else None for v in _multi_get(self._backend.column_family(self.name), dbkeys)]
        fresh = sum(v is None for v in old)
        out = []
        for j, helper in enumerate(self._helpers):
            assert helper is not None
            values, valid = helper.numpy(partial.column(nk + j))
            was, was_valid = helper.numpy(_stored_column(old, j, helper.type))
            merged = np.where(was_valid, was, values)
            both = was_valid & valid
            if both.any():
                merged[both] = helper.combine(was[both], values[both])
            out.append(helper.arrow(merged, was_valid | valid))
        if dbkeys or changed:
            self._write(dbkeys, out, changed)
        if self._n is not None:
            self._n += fresh
        return pa.Table.from_arrays(key_columns + out, names=self.keys + self.value_names)

    def rows(self) -> pa.Table:
        """Every stored row (key columns and aggregates) of the backend's key groups, for tests
        and BATCH output."""
        table = self._table(self._backend.column_family(self.name))
        return table.drop_columns(["key_group"]) if table.num_rows else pa.table({})

    def _table(self, cf: Rdict) -> pa.Table:
        return _whole(aggregate_batches(cf, self._backend.key_group_range))

    # ---- snapshots and restore

    def snapshot_builder(self) -> tuple[Callable[[], pa.Table], Callable[[], None]]:
        """A RocksDB checkpoint of the database now (the rows written later are not in it);
        returns the function that makes the snapshot table from it and the one that removes it."""
        return _checkpoint_builder(self._backend, self.name, self._table)

    def restore(self, table: pa.Table) -> None:
        """Add the rows of ``table`` (a snapshot table, already limited to this subtask's key
        groups). Raises StateRestoreError when a column is missing or a key is restored twice."""
        require_columns(table, self.name, ["key_group", *self.keys, *self.value_names])
        if not table.num_rows:
            return
        changed = self._learn([table.column(k).type for k in self.keys], [table.column(v).type for v in self.value_names])
        cf = self._backend.column_family(self.name)
        for batch in table.to_batches(max_chunksize=_RESTORE_ROWS):
            groups = np.asarray(batch.column("key_group").to_numpy(zero_copy_only=False), dtype=np.int64)
            dbkeys = self._dbkeys(groups, [batch.column(k) for k in self.keys])
            taken = [k for k, v in zip(dbkeys, _multi_get(cf, dbkeys)) if v is not None]
            if not taken and len(set(dbkeys)) != len(dbkeys):
                taken = [k for k, n in Counter(dbkeys).items() if n > 1]
            if taken:
                twice = taken[0]
                raise StateRestoreError(f"state {self.name!r}: key {decode(twice[2:])!r} restored twice")
            values = [batch.column(v) for v in self.value_names]
            values = [c if h is None or c.type.equals(h.type) else c.cast(h.type) for c, h in zip(values, self._helpers)]
            self._write(dbkeys, values, changed)
            changed = False
            if self._n is not None:
                self._n += batch.num_rows


def _checkpoint_builder(backend: RocksDBKeyedStateBackend, name: str,
                        make: Callable[[Rdict], pa.Table]) -> tuple[Callable[[], pa.Table], Callable[[], None]]:
    """A RocksDB checkpoint of ``backend``'s database now; returns the function that makes the
    snapshot table of the family ``name`` from it (``make``) and the one that removes it."""
    folder = os.path.join(backend.local_dir, f"{name}-snapshot-{uuid.uuid4().hex[:12]}")
    Checkpoint(backend.db).create_checkpoint(folder)

    def discard() -> None:
        shutil.rmtree(folder, ignore_errors=True)

    def build() -> pa.Table:
        db = open_read_only(folder)
        try:
            return make(db.get_column_family(name))
        finally:
            db.close()
            discard()

    return build, discard


def _whole(batches: Iterable[pa.RecordBatch]) -> pa.Table:
    """A snapshot table of ``batches`` (just a ``key_group`` column when there are no rows)."""
    parts = [b for b in batches if b.num_rows]
    return pa.Table.from_batches(parts) if parts else pa.table({"key_group": pa.array([], pa.int32())})


def _multi_get(cf: Rdict, dbkeys: list[bytes]) -> list[bytes | None]:
    """The stored values of ``dbkeys`` (None where absent): one multi-get."""
    return cf.get(dbkeys) if dbkeys else []  # type: ignore[arg-type,return-value]


def _stored_column(rows: list[Any], j: int, t: pa.DataType) -> pa.Array:
    """Column ``j`` of the decoded value tuples ``rows`` (None: no row), as an array of ``t``."""
    return from_storage([r[j] if r is not None else None for r in rows], t)


class RocksDBNamespacedTables:
    """Arrow tables per namespace (a window start), and a flag per namespace, in the column
    family ``name`` of ``backend``'s database (format: ``common/rocksdb_columnar.py``). In memory
    only an index: namespace -> addition -> the key groups of its pieces, and the flags. A
    table added is cut by key group, one entry per piece; ``get`` reads a namespace's pieces
    with one multi-get and gives one table per addition, as the in-memory ``NamespacedTables``
    (rows of an addition in key-group order). Empty tables are kept in memory (snapshots leave
    them out on both backends)."""

    def __init__(self, backend: RocksDBKeyedStateBackend, name: str, key_columns: list[str]) -> None:
        self._backend = backend
        self.name = name
        self.key_columns = list(key_columns)
        self._index: dict[int, dict[int, list[int]]] = {}
        self._empty: dict[tuple[int, int], pa.Table] = {}
        self._flagged: set[int] = set()
        self._schema: pa.Schema | None = None
        self._seq = 0
        self._prefixes = [kg.to_bytes(2, "big") for kg in range(backend.max_parallelism)]
        backend.column_family(name)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, namespace: int) -> bool:
        return namespace in self._index

    def namespaces(self) -> list[int]:
        return sorted(self._index)

    def count(self, namespace: int) -> int:
        return len(self._index.get(namespace, ()))

    def is_flagged(self, namespace: int) -> bool:
        return namespace in self._flagged

    def _key(self, kg: int, namespace: int, seq: int) -> bytes:
        return self._prefixes[kg] + encode((namespace, seq))

    def get(self, namespace: int) -> list[pa.Table]:
        additions = sorted(self._index.get(namespace, {}).items())
        keys = [self._key(kg, namespace, seq) for seq, groups in additions for kg in groups]
        blobs = iter(_multi_get(self._backend.column_family(self.name), keys))
        out = []
        for seq, groups in additions:
            if not groups:
                out.append(self._empty[(namespace, seq)])
                continue
            pieces = []
            for kg in groups:
                blob = next(blobs)
                if blob is None:
                    raise StateRestoreError(f"state {self.name!r}: the rows of window {namespace} in key group "
                                            f"{kg} are missing from the database")
                pieces.append(from_ipc(blob))
            out.append(pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces, promote_options="permissive"))
        return out

    def _write_meta(self, batch: WriteBatch) -> None:
        batch.put(TYPES_KEY, namespaced_entry(self._schema, self._flagged),
                  self._backend.db.get_column_family_handle(self.name))

    def add(self, namespace: int, table: pa.Table) -> None:
        seq, self._seq = self._seq, self._seq + 1
        additions = self._index.setdefault(namespace, {})
        if not table.num_rows:
            additions[seq] = []
            self._empty[(namespace, seq)] = table
            return
        groups = key_groups(table, self.key_columns, self._backend.max_parallelism)
        order = np.argsort(groups, kind="stable")
        groups = groups[order]
        if not (order[1:] > order[:-1]).all():
            table = table.take(pa.array(order))
        cuts = [0, *(np.flatnonzero(np.diff(groups)) + 1).tolist(), len(groups)]
        batch = WriteBatch(raw_mode=True)
        handle = self._backend.db.get_column_family_handle(self.name)
        kgs = []
        for a, b in zip(cuts, cuts[1:]):
            kg = int(groups[a])
            kgs.append(kg)
            batch.put(self._key(kg, namespace, seq), to_ipc(table.slice(a, b - a)), handle)
        additions[seq] = kgs
        if self._schema is None or not table.schema.equals(self._schema):
            schema = table.schema if self._schema is None else \
                pa.unify_schemas([self._schema, table.schema], promote_options="permissive")
            if self._schema is None or not schema.equals(self._schema):
                self._schema = schema
                self._write_meta(batch)
        self._backend.db.write(batch)

    def _delete_rows(self, namespace: int) -> None:
        additions = self._index.get(namespace)
        if not additions:
            return
        batch = WriteBatch(raw_mode=True)
        handle = self._backend.db.get_column_family_handle(self.name)
        for seq, groups in additions.items():
            self._empty.pop((namespace, seq), None)
            for kg in groups:
                batch.delete(self._key(kg, namespace, seq), handle)
        self._backend.db.write(batch)
        self._index[namespace] = {}

    def replace(self, namespace: int, tables: list[pa.Table]) -> None:
        self._delete_rows(namespace)
        self._index[namespace] = {}
        for table in tables:
            self.add(namespace, table)

    def _set_flags(self, flagged: set[int]) -> None:
        if flagged != self._flagged:
            self._flagged = flagged
            batch = WriteBatch(raw_mode=True)
            self._write_meta(batch)
            self._backend.db.write(batch)

    def drop(self, namespace: int) -> None:
        self._delete_rows(namespace)
        self._index.pop(namespace, None)
        self._set_flags(self._flagged - {namespace})

    def flag(self, namespace: int) -> None:
        self._set_flags(self._flagged | {namespace})

    def clear(self) -> None:
        for namespace in list(self._index):
            self._delete_rows(namespace)
        self._index.clear()
        self._set_flags(set())

    def _table(self, cf: Rdict) -> pa.Table:
        return _whole(namespaced_batches(cf, self._backend.key_group_range))

    def snapshot_builder(self) -> tuple[Callable[[], pa.Table], Callable[[], None]]:
        """As ``RocksDBAggregateTable.snapshot_builder``."""
        return _checkpoint_builder(self._backend, self.name, self._table)

    def restore(self, table: pa.Table) -> None:
        """Add the rows of ``table`` (a snapshot table limited to this subtask's key groups)."""
        restore_namespaced(self, table)

    def adopt(self, source: Rdict | None = None) -> None:
        """After the backend restored a native snapshot (see ``RocksDBAggregateTable.adopt``):
        take the schema and the flags recorded in ``source``'s family (those of namespaces
        with rows here), and index the pieces now in this family."""
        own = self._backend.column_family(self.name)
        found = read_namespaced(own if source is None else source.get_column_family(self.name))
        self._index.clear()
        self._empty.clear()
        for kg, key, _ in scan(own, self._backend.key_group_range):
            namespace, seq = decode(key)
            self._index.setdefault(namespace, {}).setdefault(seq, []).append(kg)
            self._seq = max(self._seq, seq + 1)
        if found is not None:
            schema, flagged = found
            if len(schema):
                self._schema = schema if self._schema is None else \
                    pa.unify_schemas([self._schema, schema], promote_options="permissive")
            self._flagged |= flagged
        self._flagged &= set(self._index)
        batch = WriteBatch(raw_mode=True)
        self._write_meta(batch)
        self._backend.db.write(batch)
