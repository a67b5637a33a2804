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
services' states (``TIMERS_KEY``) and the max parallelism.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import fsspec
import pyarrow as pa
from rocksdict import AccessType, Options, Rdict

from yarnflow.common.errors import YarnflowError
from yarnflow.common.state_format import KEYED_STATE_SCHEMA, MAX_PARALLELISM_KEY, TIMERS_SCHEMA, decode, dumps

__all__ = ["KINDS_KEY", "MANIFEST_SCHEMA", "NATIVE_TABLE", "TIMERS_KEY", "CorruptStateFileError", "canonical_tables",
           "db_options", "download", "kg_prefix", "native_to_canonical", "open_read_only", "scan", "sha256_of",
           "snapshots"]


class CorruptStateFileError(YarnflowError, ValueError):
    """A file of a native snapshot is missing, unreadable or not what its checksum says."""


#: the table (state file) of a native snapshot: its manifest
NATIVE_TABLE = "rocksdb"
#: schema metadata of a manifest: the states' kinds, the timer services' states
KINDS_KEY = b"yarnflow.rocksdb.kinds"
TIMERS_KEY = b"yarnflow.rocksdb.timers"
_WRITE_BUFFER = 16 << 20


def kg_prefix(kg: int) -> bytes:
    return kg.to_bytes(2, "big")


def db_options() -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_write_buffer_size(_WRITE_BUFFER)
    opts.set_max_write_buffer_number(2)
    opts.set_max_open_files(256)
    return opts


def open_read_only(path: str) -> Rdict:
    return Rdict(path, db_options(), access_type=AccessType.read_only())


def scan(cf: Rdict, key_group_range: range) -> Iterator[tuple[int, bytes, bytes]]:
    """(key group, entry bytes, value bytes) of ``cf`` in ``key_group_range``: one range scan."""
    it = cf.iter()
    it.seek(kg_prefix(key_group_range.start))
    stop = kg_prefix(key_group_range.stop) if key_group_range.stop < 1 << 16 else None
    while it.valid():
        key = it.key()
        if stop is not None and key >= stop:
            break
        yield int.from_bytes(key[:2], "big"), key[2:], it.value()
        it.next()



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


def download(manifest: pa.Table, into: str) -> None:
    """Fetch the files of one snapshot's manifest rows into ``into``, checking each SST."""
    os.makedirs(into, exist_ok=True)
    for row in manifest.to_pylist():
        local = os.path.join(into, row["file"])
        if row["path"] is None:
            with open(local, "wb") as fh:
                fh.write(row["data"] or b"")
            continue
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


def canonical_tables(db: Rdict, metadata: dict[bytes, bytes], key_group_range: range) -> dict[str, pa.Table]:
    """The heap backend's ``keyed_state`` and ``timers`` tables of the entries of ``db`` (a
    snapshot's database; ``metadata`` from ``schema_metadata``) in ``key_group_range``."""
    kinds: dict[str, str] = json.loads(metadata[KINDS_KEY])
    timer_names: dict[str, list[str]] = json.loads(metadata[TIMERS_KEY])
    state_cols: dict[str, list[Any]] = {name: [] for name in KEYED_STATE_SCHEMA.names}
    timer_cols: dict[str, list[Any]] = {name: [] for name in TIMERS_SCHEMA.names}
    present = set(Rdict.list_cf(db.path(), db_options()))
    for name in sorted(kinds):
        if name not in present:
            continue
        kind = kinds[name]
        for kg, raw_entry, raw_value in scan(db.get_column_family(name), key_group_range):
            entry, value = decode(raw_entry), decode(raw_value)
            if kind == "timer":
                service, domain = timer_names[name]
                key, namespace, ts = entry
                for col, v in zip(TIMERS_SCHEMA.names, (kg, service, domain, ts, dumps(key),
                                                        None if namespace is None else dumps(namespace), value)):
                    timer_cols[col].append(v)
            else:
                key, namespace = entry
                for col, v in zip(KEYED_STATE_SCHEMA.names, (kg, name, kind, dumps(key),
                                                             None if namespace is None else dumps(namespace),
                                                             dumps(value))):
                    state_cols[col].append(v)
    meta = {MAX_PARALLELISM_KEY: metadata[MAX_PARALLELISM_KEY]}
    out = {}
    if state_cols["key_group"]:
        out["keyed_state"] = pa.table(state_cols, schema=KEYED_STATE_SCHEMA).replace_schema_metadata(meta)
    if timer_cols["key_group"]:
        out["timers"] = pa.table(timer_cols, schema=TIMERS_SCHEMA).replace_schema_metadata(meta)
    return out


def native_to_canonical(manifest: pa.Table, work_dir: str | None = None) -> dict[str, pa.Table]:
    """The canonical ``keyed_state`` / ``timers`` tables of the native snapshot(s) ``manifest``
    (what a savepoint holds); raises CorruptStateFileError when a file is missing or corrupt."""
    meta = manifest.schema.metadata or {}
    out: dict[str, list[pa.Table]] = {}
    with tempfile.TemporaryDirectory(prefix="yarnflow-rocksdb-", dir=work_dir) as tmp:
        for i, part in enumerate(snapshots(manifest)):
            folder = os.path.join(tmp, f"snapshot-{i}")
            download(part, folder)
            start, stop = part.column("kg_start")[0].as_py(), part.column("kg_stop")[0].as_py()
            db = open_read_only(folder)
            try:
                for name, table in canonical_tables(db, meta, range(start, stop)).items():
                    out.setdefault(name, []).append(table)
            finally:
                db.close()
    return {name: pa.concat_tables(tables) for name, tables in out.items()}
