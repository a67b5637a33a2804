"""The RocksDB keyed state backend (Flink's EmbeddedRocksDBStateBackend), on rocksdict.

``state.backend.type: rocksdb`` (see ``worker/operators/keyed.py: keyed_backend``). The same
interface as ``HeapKeyedStateBackend`` (it is a subclass: registration and the current key are
the heap's), so operators run unchanged on either; the per-key entries (value, list, map,
reducing and internal states, and timers) and the columnar states of the vectorised operators
live on disk:

- one RocksDB column family per state; the RocksDB key of an entry is its key group (2 bytes,
  big-endian) followed by the entry (``(key, namespace)``, or ``(key, namespace, timestamp)``
  for a timer) in the compact binary format of ``common/state_format.py``; the value is encoded so too
  (pickle only for types it does not know). The entries of a key-group range are therefore one
  contiguous scan, which is how a restore at another parallelism takes its part.
- the columnar states (``aggregate_table``: a STREAMING ``key_by().sum()``; ``namespaced_tables``:
  the vectorised windows and window joins) take a column family each too, with entries keyed
  by key group the same way (see ``rocksdb_columnar.py`` and ``common/rocksdb_columnar.py``);
  only small indexes of them stay in memory.
- reads decode a fresh object per call. A mutable value handed out to be changed in place (a
  list being appended to, a dict, a user's object) is kept in a small write-back cache and
  written when the current key changes, at a snapshot, or before a scan: a change made in place
  while its key is current is the state's, as on the heap backend.
- the working files are under ``local_dir`` (one folder per backend, under a folder per task
  attempt, see ``localdir.py``), removed when the task ends. The write-ahead log is off: state
  survives through checkpoints, not through the local files.

Snapshots (``snapshot()``): the task flushes its write-back cache and creates a RocksDB
checkpoint (hard links to the immutable SST files plus a few small files, ``Checkpoint``): that
is the consistent view, taken in the time of a memtable flush, while the task goes on writing.
The rest happens on the snapshot writer's thread, see ``rocksdb_files.NativeSnapshot``: the
native format (the SST files, uploaded once into the checkpoint's shared folder and referenced
from then on when checkpoints are incremental) or the canonical Arrow tables of the heap backend
(``build()``; what savepoints hold). The checkpoint covers the columnar states' families
too, so they are in the native format (and its incremental uploads) like the rest; the
manifest names them in its metadata, and their canonical tables are made from the files.

``restore(tables)`` takes canonical tables (a savepoint's, from either backend) or a native
snapshot (``rocksdb`` table: a checkpoint's): one native snapshot of exactly this key-group range
becomes the database as it is; otherwise the rows of this backend's key groups are copied in, a
range scan per snapshot.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from rocksdict import Checkpoint, Rdict, WriteBatch, WriteOptions

from yarnflow.common.rocksdb_columnar import AGGREGATE_KIND, COLUMNAR_KEY, NAMESPACED_KIND
from yarnflow.common.rocksdb_snapshot import (
    KINDS_KEY,
    NATIVE_TABLE,
    TIMERS_KEY,
    db_options,
    kg_prefix,
    scan,
)
from yarnflow.common.state_format import KEYED_STATE_SCHEMA, MAX_PARALLELISM_KEY, TIMERS_SCHEMA, decode, encode
from yarnflow.worker.state.columnar import AggregateState, NamespacedState
from yarnflow.worker.state.errors import StateRestoreError
from yarnflow.worker.state.heap import IMMUTABLE, RESERVED_TABLES, HeapKeyedStateBackend
from yarnflow.worker.state.objects import ABSENT, STATE_CLASSES, InternalState
from yarnflow.worker.state.rocksdb_columnar import RocksDBAggregateTable, RocksDBNamespacedTables
from yarnflow.worker.state.tables import loads, owned_rows, require_columns

__all__ = ["RocksDBKeyedStateBackend"]


class RocksDBKeyedStateBackend(HeapKeyedStateBackend):
    """Keyed state for the key groups ``key_group_range`` of ``max_parallelism``, on disk under
    ``local_dir`` (see the module docstring). ``incremental``: checkpoints reference the SST
    files earlier ones uploaded. ``memory``: the slot's shared ``RocksDBMemory`` (see
    ``worker/memory/rocksdb_memory.py``), None for RocksDB's own unbounded caches. Call ``close()`` when done (the task's end does)."""

    entries_in_layers = False  # per-key entries are in the database
    state_classes = STATE_CLASSES
    internal_state_class = InternalState

    def __init__(self, max_parallelism: int, key_group_range: range, local_dir: str,
                 incremental: bool = False, memory: Any = None) -> None:
        super().__init__(max_parallelism, key_group_range)
        self.local_dir = local_dir
        self.incremental = incremental
        #: the slot's shared ``RocksDBMemory`` (block cache, write buffer manager), or None
        self.memory = memory
        os.makedirs(local_dir, exist_ok=True)
        self._db_path = os.path.join(local_dir, "db")
        self._db: Rdict | None = None
        self._cfs: dict[str, Rdict] = {}
        self._cache: dict[tuple[str, bytes], Any] = {}   # write-back: (state, db key) -> live value
        self._cache_key: tuple[Any, ...] | None = None
        self._last_entry: Any = None
        self._last_kg = -1
        self._last_dbkey = b""
        self._snapshots = 0
        #: SST file name -> (URL, size, sha256) of the copy a checkpoint of this database uploaded
        self.uploaded: dict[str, tuple[str, int, str]] = {}
        self._open()

    def _open(self) -> None:
        self._db = Rdict(self._db_path, db_options(self.memory))
        wo = WriteOptions()
        wo.disable_wal = True  # type: ignore[method-assign,assignment]  # a property; the stub says method
        self._db.set_write_options(wo)
        self._cfs = {}

    @property
    def db(self) -> Rdict:
        if self._db is None:
            raise StateRestoreError("the RocksDB state backend is closed")
        return self._db

    def _cf(self, name: str) -> Rdict:
        cf = self._cfs.get(name)
        if cf is None:
            try:
                cf = self.db.get_column_family(name)
            except Exception:  # noqa: BLE001 - rocksdict raises a plain exception for a missing family
                cf = self.db.create_column_family(name, db_options(self.memory))
            self._cfs[name] = cf
        return cf

    def column_family(self, name: str) -> Rdict:
        """The column family of state ``name`` (created when missing)."""
        return self._cf(name)

    def aggregate_table(self, name: str, keys: list[str], values: list[tuple[str, str]]) -> AggregateState:
        """A columnar state in RocksDB: one row of aggregates per key, in a column family of its
        own (see ``rocksdb_columnar.RocksDBAggregateTable``)."""
        self._register(name, AGGREGATE_KIND)
        table = self._columnar[name] = RocksDBAggregateTable(self, name, keys, values)
        return table

    def namespaced_tables(self, name: str, key_columns: list[str]) -> NamespacedState:
        """A columnar state in RocksDB: Arrow tables per namespace, in a column family of its own
        (see ``rocksdb_columnar.RocksDBNamespacedTables``)."""
        self._register(name, NAMESPACED_KIND)
        tables = self._columnar[name] = RocksDBNamespacedTables(self, name, key_columns)
        return tables

    def on_disk_columnar(self) -> dict[str, RocksDBAggregateTable | RocksDBNamespacedTables]:
        """The columnar states kept in the database (their families are in its checkpoints)."""
        return {n: t for n, t in self._columnar.items() if isinstance(t, (RocksDBAggregateTable, RocksDBNamespacedTables))}

    def close(self) -> None:
        """Close the database and remove its working files."""
        self._cache.clear()
        self._close_db()
        shutil.rmtree(self.local_dir, ignore_errors=True)

    def _close_db(self) -> None:
        for cf in self._cfs.values():
            cf.close()
        self._cfs = {}
        if self._db is not None:
            self._db.close()
            self._db = None
        gc.collect()  # rocksdict releases the database's lock when the last handle goes

    # ---- current key and the write-back cache

    def set_current_key(self, key: tuple[Any, ...], key_group: int) -> None:
        super().set_current_key(key, key_group)
        if self._cache and self._key != self._cache_key:
            self.flush()
        self._cache_key = self._key

    def flush(self) -> None:
        """Write the values changed in place (the write-back cache) to the database."""
        if not self._cache:
            return
        batch = WriteBatch(raw_mode=True)
        for (name, dbkey), value in self._cache.items():
            batch.put(dbkey, encode(value), self.db.get_column_family_handle(name))
        self._cache.clear()
        self.db.write(batch)

    # ---- entries

    def _dbkey(self, kg: int, entry: Any) -> bytes:
        """The RocksDB key of ``entry`` in key group ``kg`` (the last one is remembered: a read
        and a write of the same entry follow each other)."""
        if entry == self._last_entry and kg == self._last_kg:
            return self._last_dbkey
        dbkey = kg_prefix(kg) + encode(entry)
        self._last_entry, self._last_kg, self._last_dbkey = entry, kg, dbkey
        return dbkey

    def lookup(self, name: str, kg: int, entry: Any, missing: Any = None) -> Any:
        dbkey = self._dbkey(kg, entry)
        if self._cache:
            value = self._cache.get((name, dbkey), ABSENT)
            if value is not ABSENT:
                return value
        data = self._cf(name).get(dbkey)
        return missing if data is None else decode(data)

    def put(self, name: str, kg: int, entry: Any, value: Any) -> None:
        dbkey = self._dbkey(kg, entry)
        if isinstance(value, IMMUTABLE):
            self._cache.pop((name, dbkey), None)
            self._cf(name)[dbkey] = encode(value)
        else:  # the caller may go on changing it in place while the key is current
            self._cf(name)  # the family exists before the cache is flushed into it
            self._cache[(name, dbkey)] = value

    def remove(self, name: str, kg: int, entry: Any) -> None:
        dbkey = self._dbkey(kg, entry)
        self._cache.pop((name, dbkey), None)
        self._cf(name).delete(dbkey)

    def for_update(self, name: str, kg: int, entry: Any, copy_fn: Any) -> Any:
        dbkey = self._dbkey(kg, entry)
        value = self._cache.get((name, dbkey), ABSENT)
        if value is not ABSENT:
            return value
        data = self._cf(name).get(dbkey)
        if data is None:
            return ABSENT
        value = decode(data)
        if not isinstance(value, IMMUTABLE):
            self._cache[(name, dbkey)] = value
        return value

    def raw_entries(self, name: str) -> Iterator[tuple[int, Any, Any]]:
        """(key group, entry, value) of every entry of state ``name``, by key group; read from
        the database as it is now (an iterator pins its view), so changing state meanwhile is fine."""
        self.flush()
        if name not in self._kinds:
            return
        for kg, entry, value in scan(self._cf(name), self.key_group_range):
            yield kg, decode(entry), decode(value)

    def key_groups_with_state(self) -> list[int]:
        self.flush()
        groups: set[int] = set()
        for name in self._kinds:
            if name in self._columnar:
                continue
            it = self._cf(name).iter()
            it.seek(kg_prefix(self.key_group_range.start))
            while it.valid():
                kg = int.from_bytes(it.key()[:2], "big")
                if kg >= self.key_group_range.stop:
                    break
                groups.add(kg)
                if kg + 1 >= 1 << 16:
                    break
                it.seek(kg_prefix(kg + 1))
        return sorted(groups)

    # ---- snapshots

    def snapshot(self) -> Any:
        """A RocksDB checkpoint of every state now (the columnar ones' families too), as a
        ``NativeSnapshot`` (see the module docstring)."""
        from yarnflow.worker.state.rocksdb_files import NativeSnapshot

        self.flush()
        self._snapshots += 1
        folder = os.path.join(self.local_dir, f"snapshot-{self._snapshots}")
        shutil.rmtree(folder, ignore_errors=True)
        Checkpoint(self.db).create_checkpoint(folder)
        return NativeSnapshot(self, folder, self.schema_metadata())

    def schema_metadata(self) -> dict[bytes, bytes]:
        """What a snapshot records about the states: their kinds, the timer services, the
        columnar states in the database."""
        kinds = {n: k for n, k in self._kinds.items() if n not in self._columnar}
        return {MAX_PARALLELISM_KEY: str(self.max_parallelism).encode(),
                KINDS_KEY: json.dumps(kinds, sort_keys=True).encode(),
                TIMERS_KEY: json.dumps(self._timer_names, sort_keys=True).encode(),
                COLUMNAR_KEY: json.dumps({n: self._kinds[n] for n in self.on_disk_columnar()}, sort_keys=True).encode()}

    # ---- restore

    def restore(self, tables: dict[str, pa.Table]) -> None:
        """Add the state of ``tables`` (canonical tables, or a native snapshot) in this backend's
        key groups; see the module docstring. Raises StateRestoreError as the heap backend does,
        and naming the file when a native snapshot's file is missing or corrupt."""
        self.check_restorable(tables, {*RESERVED_TABLES, NATIVE_TABLE})
        if NATIVE_TABLE in tables:
            from yarnflow.worker.state.rocksdb_files import restore_native

            restore_native(self, tables[NATIVE_TABLE])
        if "keyed_state" in tables:
            self._restore_rows(tables["keyed_state"])
        if "timers" in tables:
            self._restore_timer_rows(tables["timers"])
        self.restore_columnar(tables)
        self._rebuild_timers()

    def adopt(self, kinds: dict[str, str], timer_names: dict[str, list[str]]) -> None:
        """Register the states of a restored native snapshot (``schema_metadata``)."""
        for name, kind in kinds.items():
            known = self._kinds.setdefault(name, kind)
            if known != kind:
                raise StateRestoreError(f"state {name!r} is a {kind} in the snapshot but a {known} here")
        for service, _domain in timer_names.values():
            self.timer_service(service)

    def replace_db(self, path: str) -> None:
        """Make the database at ``path`` (a restored checkpoint) this backend's."""
        self._close_db()
        shutil.rmtree(self._db_path, ignore_errors=True)
        os.replace(path, self._db_path)
        self._open()

    def copy_range(self, source: Rdict) -> None:
        """Copy the entries of this backend's key groups from ``source`` (an open database)."""
        for name in Rdict.list_cf(source.path(), db_options()):
            if name == "default":
                continue
            cf, own = source.get_column_family(name), self._cf(name)
            batch, n = WriteBatch(raw_mode=True), 0
            handle = self.db.get_column_family_handle(name)
            for kg, entry, value in scan(cf, self.key_group_range):
                key = kg_prefix(kg) + entry
                if own.get(key) is not None:
                    raise StateRestoreError(f"state {name!r}: entry {decode(entry)!r} (key group {kg}) restored twice")
                batch.put(key, value, handle)
                n += 1
                if n % 10000 == 0:
                    self.db.write(batch)
                    batch = WriteBatch(raw_mode=True)
            self.db.write(batch)

    def _restore_rows(self, table: pa.Table) -> None:
        require_columns(table, "keyed_state", KEYED_STATE_SCHEMA.names)
        table = owned_rows(table, self.key_group_range)
        for batch in table.to_batches(max_chunksize=10000):
            cols = [batch.column(c).to_pylist() for c in KEYED_STATE_SCHEMA.names]
            for kg, name, kind, key, namespace, value in zip(*cols):
                if kind not in STATE_CLASSES and kind != "internal":
                    raise StateRestoreError(f"state {name!r} has unknown kind {kind!r} in the snapshot")
                self.adopt({name: kind}, {})
                entry = (loads(key), None if namespace is None else loads(namespace))
                self._put_new(name, kg, entry, loads(value))

    def _restore_timer_rows(self, table: pa.Table) -> None:
        require_columns(table, "timers", TIMERS_SCHEMA.names)
        table = owned_rows(table, self.key_group_range)
        cols = [table.column(c).to_pylist() for c in TIMERS_SCHEMA.names]
        for kg, service, domain, ts, key, namespace, seq in zip(*cols):
            name = self.timer_service(service).state_name(domain)
            entry = (loads(key), None if namespace is None else loads(namespace), ts)
            self._put_new(name, kg, entry, seq)

    def _put_new(self, name: str, kg: int, entry: Any, value: Any) -> None:
        dbkey = self._dbkey(kg, entry)
        cf = self._cf(name)
        if cf.get(dbkey) is not None:
            raise StateRestoreError(f"state {name!r} of {entry!r} (key group {kg}) restored twice")
        cf[dbkey] = encode(value)

    def _rebuild_timers(self) -> None:
        for service in self._timer_services.values():
            service.rebuild()


def new_backend_dir(base: str, name: str) -> str:
    return os.path.join(base, f"{name}-{uuid.uuid4().hex[:8]}")
