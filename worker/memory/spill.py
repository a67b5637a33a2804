"""Spill files: where batch operators put what does not fit in their managed memory.

A task attempt's spill files live in ``<dir>/yarnflow-spill/<attempt id>/``, ``<dir>`` being
one of the TaskExecutor's ``io.tmp.dirs`` (comma-separated; a file goes to each in turn, so
several disks share the load; default: the TaskExecutor's work dir). Files are Arrow IPC
streams, written a batch at a time and read back a batch at a time. An operator deletes each
file once it has read it; the task removes its whole folder when it ends, whatever the outcome
(``SpillFiles.remove``); a TaskExecutor starting up, and each attempt that starts spilling,
removes the folders of attempts whose TaskExecutor died (``remove_orphan_spills``), as for
RocksDB working files.

``SpillFiles.spilled_bytes`` counts the bytes written (the task's ``spilledBytes`` metric).
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterator, Sequence

import pyarrow as pa

from yarnflow.worker import workdirs

log = logging.getLogger(__name__)

__all__ = ["SEGMENT_BYTES", "SpillFile", "SpillFiles", "SpillWriter", "remove_orphan_spills", "spill_roots"]

SPILL_FOLDER = "yarnflow-spill"
#: the largest batch a spill file holds: a larger write is stored in pieces, so a reader that
#: goes through a file a batch at a time holds about this much of it
SEGMENT_BYTES = 1 << 20


def concat(parts: Sequence[pa.RecordBatch | pa.Table]) -> pa.Table | None:
    """One table of ``parts`` (None when there are none); schemas that differ are unified as
    ``concat_tables(promote_options="permissive")`` does (a null-typed column of an early batch
    and the typed column of a later one, int32 and int64)."""
    tables = [p if isinstance(p, pa.Table) else pa.Table.from_batches([p]) for p in parts if p.num_rows]
    if not tables:
        return None
    if all(t.schema.equals(tables[0].schema) for t in tables[1:]):
        return pa.concat_tables(tables)
    return pa.concat_tables(tables, promote_options="permissive")


def spill_roots(tmp_dirs: str, default: str) -> list[str]:
    """The folders spill files go to: each of the comma-separated ``io.tmp.dirs``, else ``default``."""
    dirs = [d.strip() for d in (tmp_dirs or "").split(",") if d.strip()]
    return [os.path.join(d, SPILL_FOLDER) for d in (dirs or [default])]


def remove_orphan_spills(roots: Sequence[str]) -> list[str]:
    """Remove the spill folders of attempts whose TaskExecutor is gone (called at start-up)."""
    return [f for root in roots for f in workdirs.remove_orphans(root, "spill files")]


class SpillFile:
    """A closed spill file: its batches (one schema per segment: a batch of another schema
    starts a new segment), read back one at a time."""

    def __init__(self, owner: SpillFiles, paths: list[str], num_rows: int, nbytes: int) -> None:
        self._owner = owner
        self.paths = paths
        self.num_rows = num_rows
        #: the batches' size in memory (Arrow ``nbytes``), what reading all of it back would hold
        self.nbytes = nbytes

    def read(self) -> Iterator[pa.RecordBatch]:
        for path in self.paths:
            with pa.OSFile(path, "rb") as source:  # read, not mapped: mapped pages stay resident
                yield from pa.ipc.open_stream(source)

    def read_all(self) -> pa.Table | None:
        """Every batch as one table (None when the file has no rows)."""

        return concat(list(self.read()))

    def delete(self) -> None:
        for path in self.paths:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
        self.paths = []

    def __repr__(self) -> str:
        return f"SpillFile({self.num_rows} rows, {self.nbytes / 2**20:.1f} MB)"


class SpillWriter:
    """Writes batches to a new spill file; ``close`` returns the ``SpillFile``."""

    def __init__(self, owner: SpillFiles, prefix: str) -> None:
        self._owner = owner
        self._prefix = prefix
        self._paths: list[str] = []
        self._sink: pa.NativeFile | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._schema: pa.Schema | None = None
        self.num_rows = 0
        self.nbytes = 0

    def write(self, batch: pa.RecordBatch | pa.Table) -> None:
        if not batch.num_rows:
            return
        if self._writer is None or not batch.schema.equals(self._schema):
            self._close_segment()
            path = self._owner._new_path(self._prefix)
            self._sink = pa.OSFile(path, "wb")
            self._paths.append(path)
            self._schema = batch.schema
            self._writer = pa.ipc.new_stream(self._sink, batch.schema)
        if batch.nbytes > SEGMENT_BYTES:  # read back a piece at a time, never all of it at once
            table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
            self._writer.write_table(table, max_chunksize=max(1, int(batch.num_rows * SEGMENT_BYTES / batch.nbytes)))
        elif isinstance(batch, pa.Table):
            self._writer.write_table(batch)
        else:
            self._writer.write_batch(batch)
        self.num_rows += batch.num_rows
        self.nbytes += batch.nbytes
        self._owner._count(batch.nbytes)

    def _close_segment(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._sink is not None:
            self._sink.close()
        self._writer = self._sink = None

    def close(self) -> SpillFile:
        self._close_segment()
        return SpillFile(self._owner, self._paths, self.num_rows, self.nbytes)

    def abort(self) -> None:
        self.close().delete()


class SpillFiles:
    """One task attempt's spill folder(s). ``roots``: the ``yarnflow-spill`` folders to use (one
    per tmp dir); None: a private folder under the system temp dir, removed with this object
    (operators run outside a TaskExecutor)."""

    def __init__(self, roots: Sequence[str] | None = None, attempt_id: str = "") -> None:
        self._own = roots is None
        self._roots = list(roots) if roots else []
        self._attempt = attempt_id or f"local-{os.getpid()}-{id(self):x}"
        self._folders: list[str] = []
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._next_root = 0
        self.spilled_bytes = 0
        self.files_written = 0

    def _folder(self) -> str:
        """The next folder to write to (created and claimed on first use)."""
        with self._lock:
            if not self._folders:
                if self._own:
                    root = tempfile.mkdtemp(prefix="yarnflow-spill-")
                    self._folders = [root]
                    weakref.finalize(self, shutil.rmtree, root, True)
                else:
                    for root in self._roots:
                        folder = os.path.join(root, self._attempt)
                        if workdirs.claim(folder):  # a new attempt: clean up after dead ones first
                            workdirs.remove_orphans(root, "spill files")
                        self._folders.append(folder)
                    log.debug("spill folders of %s: %s", self._attempt, self._folders)
            folder = self._folders[self._next_root % len(self._folders)]
            self._next_root += 1
            return folder

    def _new_path(self, prefix: str) -> str:
        folder = self._folder()
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in prefix)[:40]
        return os.path.join(folder, f"{safe}-{next(self._seq)}.arrow")

    def _count(self, nbytes: int) -> None:
        with self._lock:
            self.spilled_bytes += nbytes

    def writer(self, prefix: str) -> SpillWriter:
        """A new spill file; ``prefix`` names it (the operator and what it holds)."""
        with self._lock:
            self.files_written += 1
        return SpillWriter(self, prefix)

    def write(self, prefix: str, batches: Sequence[pa.RecordBatch] | pa.Table) -> SpillFile:
        """Write ``batches`` (or a table) to a new spill file and close it."""
        w = self.writer(prefix)
        if isinstance(batches, pa.Table):
            w.write(batches)
        else:
            for b in batches:
                w.write(b)
        return w.close()

    @property
    def folders(self) -> list[str]:
        return list(self._folders)

    def remove(self) -> None:
        """Remove every spill file of the attempt (the task ended)."""
        with self._lock:
            folders, self._folders = self._folders, []
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        if folders and not self._own:
            log.info("removed the spill files of %s (%s spilled in all)", self._attempt,
                     f"{self.spilled_bytes / 2**20:.1f} MB")
