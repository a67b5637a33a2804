"""The files of a RocksDB backend's snapshot: uploading them, restoring from them, and making
the canonical Arrow tables out of them.

A native snapshot is the backend's RocksDB checkpoint. Its state file (table ``rocksdb``, an
Arrow IPC file like every state file) lists the checkpoint's files, one row each: ``file`` (its
name in the database folder), ``path`` (the URL of its copy; null for the small files), ``size``,
``sha256`` (of the content) and ``data`` (the content of the small files: CURRENT, MANIFEST,
OPTIONS, an empty log); plus ``snapshot`` (an id: one restore may read several) and
``kg_start``/``kg_stop`` (the key groups it holds). Its schema metadata records the states'
kinds, the columnar states in the database and the max parallelism.

SST files are immutable, and are uploaded as they are:

- incremental checkpoints (``execution.checkpointing.incremental``): into the job's shared
  folder ``<checkpoint dir>/shared/<sha256>.sst``, once: a later checkpoint of the same
  database references the copy an earlier one made. The task reports each shared file it
  references with its state files (name ``SHARED_FILE``), so the JobMaster knows which retained
  checkpoints use it (``am/checkpoint/shared.py``) and deletes it with the last of them;
- otherwise into the checkpoint's own folder, every time.

A restore downloads the files, checks each SST against its sha256 (a corrupt or missing copy
raises StateRestoreError naming it: the JobMaster then falls back to an older checkpoint) and
opens the database.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from typing import TYPE_CHECKING, Any, Callable

import fsspec
import pyarrow as pa

from yarnflow.common.messages import SHARED_STATE_FILE
from yarnflow.common.rocksdb_columnar import columnar_states
from yarnflow.common.rocksdb_snapshot import (
    KINDS_KEY,
    MANIFEST_SCHEMA,
    NATIVE_TABLE,
    TIMERS_KEY,
    CorruptStateFileError,
    canonical_tables,
    db_options,
    download,
    open_read_only,
    sha256_of,
    snapshots,
)
from yarnflow.worker.state.errors import StateRestoreError
from yarnflow.worker.state.local_recovery import local_copy, record_read
from yarnflow.worker.state.tables import AsyncSnapshot

if TYPE_CHECKING:
    from yarnflow.worker.state.rocksdb import RocksDBKeyedStateBackend

__all__ = ["NATIVE_TABLE", "SHARED_FILE", "NativeSnapshot", "restore_native"]

#: the name under which a task reports a shared file its checkpoint references
SHARED_FILE = SHARED_STATE_FILE


def _upload(local: str, url: str) -> None:
    """Copy ``local`` to ``url``, under a temporary name first: a copy that exists is whole."""
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.inprogress"
    fs.put_file(local, tmp)
    fs.mv(tmp, path)


class NativeSnapshot(AsyncSnapshot):
    """A RocksDB backend's snapshot: its checkpoint folder (removed on release), which holds
    every state, the columnar ones too. ``build()`` makes the canonical tables; ``write_native``
    uploads the files (see the module docstring)."""

    def __init__(self, backend: RocksDBKeyedStateBackend, folder: str, metadata: dict[bytes, bytes]) -> None:
        super().__init__(self._canonical, self._discard)
        self.backend = backend
        self.folder = folder
        self.metadata = metadata
        self.incremental = backend.incremental
        self.extra: dict[str, pa.Table] = {}  # an operator's own small tables, written as they are

    def with_tables(self, tables: dict[str, pa.Table]) -> NativeSnapshot:
        """This snapshot plus ``tables`` (already made), still native: its checkpoint's files
        are uploaded and the tables written beside the manifest."""
        self.extra = {**self.extra, **tables}
        return self

    def _canonical(self) -> dict[str, pa.Table]:
        db = open_read_only(self.folder)
        try:
            return {**self.extra, **canonical_tables(db, self.metadata, self.backend.key_group_range)}
        finally:
            db.close()

    def _discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def write_native(self, shared_dir: str | None, private_dir: str,
                     keep: Callable[[str, str, str], None] | None = None
                     ) -> tuple[dict[str, pa.Table], list[tuple[str, int]]]:
        """Upload the checkpoint's SST files (to ``shared_dir`` when incremental and given, once
        per file; else to ``private_dir``); returns the tables to write (the manifest, and those
        of ``with_tables``) and the (URL, size) of each shared file the manifest references.
        ``keep(url, local file, sha256)``: task-local recovery keeps each SST's copy."""
        rows: dict[str, list[Any]] = {name: [] for name in MANIFEST_SCHEMA.names}
        shared: list[tuple[str, int]] = []
        snapshot_id = uuid.uuid4().hex
        uploaded = self.backend.uploaded
        use_shared = self.incremental and shared_dir is not None
        for name in sorted(os.listdir(self.folder)):
            local = os.path.join(self.folder, name)
            size = os.path.getsize(local)
            url: str | None = None
            data: bytes | None = None
            digest = ""
            if name.endswith(".sst"):
                known = uploaded.get(name) if use_shared else None
                if known is not None:
                    url, size, digest = known
                else:
                    digest = sha256_of(local)
                    url = (f"{shared_dir.rstrip('/')}/{digest}.sst" if use_shared and shared_dir
                           else f"{private_dir.rstrip('/')}/rocksdb-{name}")
                    _upload(local, url)
                    if use_shared:
                        uploaded[name] = (url, size, digest)
                if use_shared:
                    shared.append((url, size))
                if keep is not None:
                    keep(url, local, digest)
            else:
                with open(local, "rb") as fh:
                    data = fh.read()
            for col, value in zip(MANIFEST_SCHEMA.names, (name, url, size, digest, data, snapshot_id,
                                                          self.backend.key_group_range.start,
                                                          self.backend.key_group_range.stop)):
                rows[col].append(value)
        manifest = pa.table(rows, schema=MANIFEST_SCHEMA).replace_schema_metadata(self.metadata)
        return {**self.extra, NATIVE_TABLE: manifest}, shared


def restore_native(backend: RocksDBKeyedStateBackend, manifest: pa.Table) -> None:
    """Restore ``backend`` from the native snapshots listed in ``manifest`` (see ``RocksDBKeyedStateBackend``)."""
    meta = manifest.schema.metadata or {}
    if KINDS_KEY not in meta:
        raise StateRestoreError("the RocksDB snapshot has no record of its states: not a snapshot of this backend")
    try:
        parts = snapshots(manifest)
    except CorruptStateFileError as exc:
        raise StateRestoreError(str(exc)) from None
    backend.adopt(json.loads(meta[KINDS_KEY]), json.loads(meta[TIMERS_KEY]))
    columnar = backend.on_disk_columnar()
    unknown = sorted(set(columnar_states(meta)) - set(columnar))
    if unknown:
        raise StateRestoreError(f"the snapshot has state {unknown} that this operator does not have "
                                f"(it has {sorted(columnar) or 'no columnar state'})")
    own = backend.key_group_range
    for i, part in enumerate(parts):
        folder = os.path.join(backend.local_dir, f"restore-{i}")
        try:
            download(part, folder, local_copy, record_read)
        except CorruptStateFileError as exc:
            raise StateRestoreError(str(exc)) from None
        start, stop = part.column("kg_start")[0].as_py(), part.column("kg_stop")[0].as_py()
        if len(parts) == 1 and (start, stop) == (own.start, own.stop) and not backend.key_groups_with_state():
            backend.replace_db(folder)
            for table in columnar.values():
                table.adopt()
            # the downloaded SSTs are the shared copies: the next checkpoint references them
            for row in part.to_pylist():
                if row["path"] is not None and row["path"].endswith(f"/{row['sha256']}.sst"):
                    backend.uploaded[row["file"]] = (row["path"], row["size"], row["sha256"])
            continue
        source = open_read_only(folder)
        try:
            backend.copy_range(source)
            present = set(source.list_cf(folder, db_options()))
            for name, table in columnar.items():
                if name in present:
                    table.adopt(source)
        finally:
            source.close()
            shutil.rmtree(folder, ignore_errors=True)
