"""The aggregate table of a vectorised keyed operator on the RocksDB state backend.

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
from a native snapshot the backend copies or adopts the family and calls ``adopt_types``.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from rocksdict import Checkpoint, Rdict, WriteBatch

from yarnflow.common.rocksdb_columnar import (
    TYPES_KEY,
    aggregate_batches,
    from_storage,
    read_types,
    to_storage,
    types_entry,
)
from yarnflow.common.rocksdb_snapshot import open_read_only, scan
from yarnflow.common.state_format import decode, encode
from yarnflow.worker.runtime.keygroups import key_groups
from yarnflow.worker.state.columnar import _FUNCS, _Values
from yarnflow.worker.state.errors import StateRestoreError
from yarnflow.worker.state.tables import require_columns

if TYPE_CHECKING:
    from yarnflow.worker.state.rocksdb import RocksDBKeyedStateBackend

__all__ = ["RocksDBAggregateTable"]

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
        self._snapshots = 0
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

    def adopt_types(self, source: Rdict | None = None) -> None:
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
        batches = list(aggregate_batches(cf, self._backend.key_group_range))
        if not batches or not sum(b.num_rows for b in batches):
            return pa.table({"key_group": pa.array([], pa.int32())})
        return pa.Table.from_batches(batches)

    # ---- snapshots and restore

    def snapshot_builder(self) -> tuple[Callable[[], pa.Table], Callable[[], None]]:
        """A RocksDB checkpoint of the database now (the rows written later are not in it);
        returns the function that makes the snapshot table from it and the one that removes it."""
        self._snapshots += 1
        folder = os.path.join(self._backend.local_dir, f"{self.name}-snapshot-{self._snapshots}-{uuid.uuid4().hex[:6]}")
        Checkpoint(self._backend.db).create_checkpoint(folder)

        def discard() -> None:
            shutil.rmtree(folder, ignore_errors=True)

        def build() -> pa.Table:
            db = open_read_only(folder)
            try:
                return self._table(db.get_column_family(self.name))
            finally:
                db.close()
                discard()

        return build, discard

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


def _multi_get(cf: Rdict, dbkeys: list[bytes]) -> list[bytes | None]:
    """The stored values of ``dbkeys`` (None where absent): one multi-get."""
    return cf.get(dbkeys) if dbkeys else []  # type: ignore[arg-type,return-value]


def _stored_column(rows: list[Any], j: int, t: pa.DataType) -> pa.Array:
    """Column ``j`` of the decoded value tuples ``rows`` (None: no row), as an array of ``t``."""
    return from_storage([r[j] if r is not None else None for r in rows], t)
