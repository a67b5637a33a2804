"""The native snapshot format of the RocksDB state backend, shared by the TaskExecutor (which
writes and restores it, ``worker/state/rocksdb.py`` and ``rocksdb_files.py``) and the AppMaster
(which turns it into a savepoint's canonical tables, ``native_to_canonical``).

A native snapshot is a RocksDB checkpoint of the backend's database: one column family per
state, each entry keyed by its key group (2 bytes, big-endian, ``kg_prefix``) and the entry in
the ``state_format.encode`` format. Its state file (table ``NATIVE_TABLE``, an Arrow IPC file like
every state file) is a manifest with one row per file of the checkpoint: ``file`` (its name in
the database folder), ``path`` (the URL of its copy; null for the small files), ``size``,
``sha256`` (of the content), ``data`` (the content of the small files: CURRENT, MANIFEST,
OPTIONS), ``snapshot`` (an id: one restore may read several) and ``kg_start``/``kg_stop`` (the
key groups it holds). Its schema metadata records the states' kinds (``KINDS_KEY``), the timer
services' states (``TIMERS_KEY``), the columnar states of vectorised operators, each a column
family of its own (``rocksdb_columnar.COLUMNAR_KEY``), and the max parallelism.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable

import fsspec
import pyarrow as pa

from yarnflow.common.errors import YarnflowError
from yarnflow.common.rocksdb_columnar import AGGREGATE_KIND, NAMESPACED_KIND, columnar_batches, columnar_states
from yarnflow.common.rocksdb_db import db_options, kg_prefix, open_read_only, scan
from yarnflow.common.state_format import KEYED_STATE_SCHEMA, MAX_PARALLELISM_KEY, TIMERS_SCHEMA, decode, dumps

if TYPE_CHECKING:  # rocksdict is loaded only where a RocksDB snapshot is read or written
    from rocksdict import Rdict

__all__ = ["KINDS_KEY", "MANIFEST_SCHEMA", "NATIVE_TABLE", "TIMERS_KEY", "CorruptStateFileError", "canonical_batches",
           "canonical_tables",
           "db_options", "download", "kg_prefix", "native_to_canonical", "open_read_only", "scan", "sha256_of",
           "snapshots"]


class CorruptStateFileError(YarnflowError, ValueError):
    """A file of a native snapshot is missing, unreadable or not what its checksum says."""


#: the table (state file) of a native snapshot: its manifest
NATIVE_TABLE = "rocksdb"
#: schema metadata of a manifest: the states' kinds, the timer services' states
KINDS_KEY = b"yarnflow.rocksdb.kinds"
TIMERS_KEY = b"yarnflow.rocksdb.timers"
MANIFEST_SCHEMA = pa.schema([("file", pa.string()), ("path", pa.string()), ("size", pa.int64()),
                             ("sha256", pa.string()), ("data", pa.binary()), ("snapshot", pa.string()),
                             ("kg_start", pa.int32()), ("kg_stop", pa.int32())])
_CHUNK = 1 << 22


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def download(manifest: pa.Table, into: str, local_copy: Callable[[str], str | None] | None = None,
             on_read: Callable[[int, bool], None] | None = None) -> None:
    """Fetch the files of one snapshot's manifest rows into ``into``, checking each SST.
    ``local_copy(url)``: a verified copy on this host to link instead (task-local recovery);
    ``on_read(size, local)`` counts each file fetched."""
    os.makedirs(into, exist_ok=True)
    for row in manifest.to_pylist():
        local = os.path.join(into, row["file"])
        if row["path"] is None:
            with open(local, "wb") as fh:
                fh.write(row["data"] or b"")
            continue
        copy = local_copy(row["path"]) if local_copy is not None else None
        if copy is not None:  # (verified against its sha256 when it was looked up)
            try:
                os.link(copy, local)
            except OSError:
                shutil.copyfile(copy, local)
            if on_read is not None:
                on_read(int(row["size"] or 0), True)
            continue
        if on_read is not None:
            on_read(int(row["size"] or 0), False)
        try:
            fs, path = fsspec.core.url_to_fs(row["path"])
            fs.get_file(path, local)
        except Exception as exc:  # noqa: BLE001 - any failure names the file
            raise CorruptStateFileError(f"cannot read the RocksDB state file {row['path']}: "
                                    f"{type(exc).__name__}: {exc}") from exc
        if row["sha256"] and sha256_of(local) != row["sha256"]:
            raise CorruptStateFileError(f"the RocksDB state file {row['path']} is corrupt (its content does not "
                                    f"match the checksum recorded at the checkpoint)")


def snapshots(manifest: pa.Table) -> list[pa.Table]:
    missing = [c for c in MANIFEST_SCHEMA.names if c not in manifest.column_names]
    if missing:
        raise CorruptStateFileError(f"the RocksDB snapshot's manifest has no column(s) {missing}")
    ids = manifest.column("snapshot").to_pylist()
    return [manifest.filter(pa.array([i == sid for i in ids])) for sid in dict.fromkeys(ids)]


def canonical_batches(db: Rdict, metadata: dict[bytes, bytes], key_group_range: range,
                      batch_rows: int = 65_536) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The rows of the heap backend's ``keyed_state`` and ``timers`` tables for the entries of
    ``db`` (a snapshot's database; ``metadata`` from the manifest) in ``key_group_range``, and
    the tables of its columnar states (named as the states, see ``rocksdb_columnar``), as
    (table name, record batch of at most ``batch_rows`` rows): a large state is never in memory
    as a whole. The batches' schemas carry the max parallelism."""
    kinds: dict[str, str] = json.loads(metadata[KINDS_KEY])
    timer_names: dict[str, list[str]] = json.loads(metadata[TIMERS_KEY])
    meta = {MAX_PARALLELISM_KEY: metadata[MAX_PARALLELISM_KEY]}
    schemas = {"keyed_state": KEYED_STATE_SCHEMA.with_metadata(meta), "timers": TIMERS_SCHEMA.with_metadata(meta)}
    present = set(db.list_cf(db.path(), db_options()))
    for name in sorted(kinds):
        if name not in present:
            continue
        kind = kinds[name]
        table = "timers" if kind == "timer" else "keyed_state"
        cols: list[list[Any]] = [[] for _ in schemas[table].names]
        for kg, raw_entry, raw_value in scan(db.get_column_family(name), key_group_range):
            entry, value = decode(raw_entry), decode(raw_value)
            if kind == "timer":
                service, domain = timer_names[name]
                key, namespace, ts = entry
                row: tuple[Any, ...] = (kg, service, domain, ts, dumps(key), None if namespace is None else dumps(namespace), value)
            else:
                key, namespace = entry
                row = (kg, name, kind, dumps(key), None if namespace is None else dumps(namespace), dumps(value))
            for col, v in zip(cols, row):
                col.append(v)
            if len(cols[0]) >= batch_rows:
                yield table, pa.record_batch(cols, schema=schemas[table])
                cols = [[] for _ in schemas[table].names]
        if cols[0]:
            yield table, pa.record_batch(cols, schema=schemas[table])
    yield from _columnar_batches(db, metadata, key_group_range, present, batch_rows)


def _columnar_batches(db: Rdict, metadata: dict[bytes, bytes], key_group_range: range, present: set[str],
                       batch_rows: int) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The canonical tables of the columnar states in ``db`` (see ``rocksdb_columnar``)."""

    for name, kind in sorted(columnar_states(metadata).items()):
        if kind not in (AGGREGATE_KIND, NAMESPACED_KIND):
            raise CorruptStateFileError(f"the RocksDB snapshot has columnar state {name!r} of unknown kind {kind!r}")
        if name in present:
            for batch in columnar_batches(kind, db.get_column_family(name), key_group_range, metadata, batch_rows):
                yield name, batch


def canonical_tables(db: Rdict, metadata: dict[bytes, bytes], key_group_range: range) -> dict[str, pa.Table]:
    """``canonical_batches`` as tables."""
    batches: dict[str, list[pa.RecordBatch]] = {}
    for name, batch in canonical_batches(db, metadata, key_group_range):
        batches.setdefault(name, []).append(batch)
    return {name: pa.Table.from_batches(parts) for name, parts in batches.items()}


def native_to_canonical(manifest: pa.Table, work_dir: str | None = None) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The canonical ``keyed_state`` / ``timers`` / aggregate rows of the native snapshot(s) ``manifest``
    (what a savepoint holds), batch by batch (see ``canonical_batches``); its files are fetched
    into a temporary folder, removed when the iteration ends. Raises CorruptStateFileError when
    a file is missing or corrupt."""
    meta = manifest.schema.metadata or {}
    with tempfile.TemporaryDirectory(prefix="yarnflow-rocksdb-", dir=work_dir) as tmp:
        for i, part in enumerate(snapshots(manifest)):
            folder = os.path.join(tmp, f"snapshot-{i}")
            download(part, folder)
            start, stop = part.column("kg_start")[0].as_py(), part.column("kg_stop")[0].as_py()
            db = open_read_only(folder)
            try:
                yield from canonical_batches(db, meta, range(start, stop))
            finally:
                db.close()
