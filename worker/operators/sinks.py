"""Sinks: Parquet files on any fsspec filesystem, and collect (results handed to the client,
which prints them for ``print()``).

Files are written under hidden staging names and renamed when the subtask finishes, so a
failed, cancelled or killed attempt never leaves rows behind under a final name (see
``_StagedFileSink``)."""

from __future__ import annotations

import logging
import posixpath
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from yarnflow.common import collect
from yarnflow.worker.operators.base import Operator
from yarnflow.worker.operators.transforms import SchemaMismatchError

log = logging.getLogger(__name__)


_HOLD_BYTES = 16 << 20


def _has_null_columns(batch: pa.RecordBatch) -> bool:
    return any(pa.types.is_null(f.type) for f in batch.schema)


def _fit(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch | None:
    """``batch`` in ``schema`` when they differ only by columns of type null (all nulls),
    which take the other side's type; None when they really differ."""
    if batch.schema.names != schema.names:
        return None
    columns = []
    for col, f_new, f_old in zip(batch.columns, batch.schema, schema):
        if f_new.type.equals(f_old.type):
            columns.append(col)
        elif pa.types.is_null(f_new.type):
            columns.append(pa.nulls(len(col), f_old.type))
        else:
            return None
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class _StagedFileSink(Operator):
    """One file set per subtask: ``part-<subtask><ext>``, or ``part-<subtask>-<n><ext>`` with a
    new part after ``roll_size_bytes`` (by in-memory batch size). The names are the same in
    every attempt of a subtask.

    Exactly once: an attempt writes its parts under hidden names
    (``.part-<subtask>-<n>-attempt<a><ext>.inprogress``, skipped by pyarrow.dataset, Spark and
    our own sources) and renames them all to their final names only when the subtask finishes;
    a failed or cancelled attempt deletes its parts, and a new attempt first deletes whatever
    hidden parts earlier attempts of its subtask left (a killed process cleans nothing). A
    subtask that commits again (it was restarted after finishing) replaces its files and deletes
    its earlier parts that this attempt did not write."""

    extension = ""

    def __init__(self, path: str, name: str | None = None, uid: str | None = None,
                 roll_size_bytes: int | None = None) -> None:
        super().__init__(name, uid)
        if roll_size_bytes is not None and roll_size_bytes <= 0:
            raise ValueError("roll_size_bytes must be positive")
        self.path = path
        self.roll_size_bytes = roll_size_bytes
        self._fs: Any = None
        self._dir = ""
        self._stage = ""
        self._staged: list[str] = []  # closed parts waiting for the subtask to finish
        self._fh: Any = None
        self._writer: Any = None
        self._schema: pa.Schema | None = None
        self._part = 0
        self._part_bytes = 0
        self._held: list[pa.RecordBatch] = []
        self._held_bytes = 0
        self.rows = 0
        self.committed: list[str] = []

    def _directory(self) -> str:
        return self.path

    def open(self) -> None:
        self._fs, self._dir = fsspec.core.url_to_fs(self._directory())
        self._fs.makedirs(self._dir, exist_ok=True)
        self._delete_leftovers()

    def _subtask_prefix(self) -> str:
        return f"part-{self.ctx.subtask_index:05d}"

    def _is_own_stage(self, basename: str) -> bool:
        """A staging file of any attempt of this subtask."""
        return basename.startswith(f".{self._subtask_prefix()}-") and "-attempt" in basename \
            and basename.endswith(".inprogress")

    def _is_own_final(self, basename: str) -> bool:
        """A committed file of this subtask: ``part-<subtask><ext>`` or ``part-<subtask>-<n><ext>``."""
        prefix = self._subtask_prefix()
        if not basename.endswith(self.extension) or not basename.startswith(prefix):
            return False
        rest = basename[len(prefix):len(basename) - len(self.extension)]
        return rest == "" or (rest.startswith("-") and rest[1:].isdigit())

    def _delete_leftovers(self) -> None:
        for f in self._fs.ls(self._dir, detail=False):
            if self._is_own_stage(posixpath.basename(f)):
                log.info("%s (%d/%d): deleting %s left by an earlier attempt", self.name,
                         self.ctx.subtask_index + 1, self.ctx.parallelism, f)
                self._fs.rm(f)

    def _final_name(self, part: int) -> str:
        suffix = f"-{part}" if self.roll_size_bytes else ""
        return posixpath.join(self._dir, f"{self._subtask_prefix()}{suffix}{self.extension}")

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        # A column that has held only nulls so far has type null; its real type comes with the
        # first non-null value. Batches wait (up to a bound) until every type is known.
        if self._writer is None and self._schema is None and (self._held or _has_null_columns(batch)):
            self._held.append(batch)
            self._held_bytes += batch.nbytes
            if not _has_null_columns(batch) or self._held_bytes >= _HOLD_BYTES:
                self._release_held()
            return
        if self._schema is not None and not batch.schema.equals(self._schema):
            refined = _fit(batch, self._schema)
            if refined is None:
                raise SchemaMismatchError(f"sink '{self.name}': batch schema {batch.schema} does not match "
                                          f"the first batch's {self._schema}")
            batch = refined
        self._write(batch)

    def _release_held(self) -> None:
        held, self._held, self._held_bytes = self._held, [], 0
        target = held[-1].schema
        for b in held:
            if not _has_null_columns(b):
                target = b.schema
        for b in held:
            fitted = _fit(b, target)
            if fitted is None:
                raise SchemaMismatchError(f"sink '{self.name}': batch schema {b.schema} does not match {target}")
            self._write(fitted)

    def _write(self, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            if self._schema is None:
                self._schema = batch.schema
            self._stage = posixpath.join(
                self._dir, f".{self._subtask_prefix()}-{self._part}-attempt{self.ctx.attempt_number}"
                           f"{self.extension}.inprogress")
            self._fh = self._fs.open(self._stage, "wb")
            self._writer = self._new_writer(self._fh, self._schema)
        self._writer.write_batch(batch)
        self.rows += batch.num_rows
        self._part_bytes += batch.nbytes
        if self.roll_size_bytes and self._part_bytes >= self.roll_size_bytes:
            self._close_part()

    def _new_writer(self, fh: Any, schema: pa.Schema) -> Any:
        raise NotImplementedError

    def _close_part(self) -> None:
        """The current part is complete; it stays hidden until the subtask finishes."""
        self._writer.close()
        self._fh.close()
        self._writer = None
        self._staged.append(self._stage)
        self._part += 1
        self._part_bytes = 0

    def _commit(self) -> None:
        """Give every staged part its final name, then delete this subtask's committed files
        from an earlier attempt that this one did not replace."""
        for stage in self._staged:
            if not self._fs.exists(stage):
                raise FileNotFoundError(f"sink '{self.name}': staged part {stage} is gone (deleted by a newer "
                                        f"attempt of subtask {self.ctx.subtask_index}?): not committing")
        for part, stage in enumerate(self._staged):
            final = self._final_name(part)
            if self._fs.exists(final):
                self._fs.rm(final)
            self._fs.mv(stage, final)
            self.committed.append(final)
        self._staged = []
        mine = {posixpath.basename(f) for f in self.committed}
        for f in self._fs.ls(self._dir, detail=False):
            name = posixpath.basename(f)
            if self._is_own_final(name) and name not in mine:
                log.info("%s (%d/%d): deleting %s committed by an earlier attempt", self.name,
                         self.ctx.subtask_index + 1, self.ctx.parallelism, f)
                self._fs.rm(f)

    def finish(self) -> None:
        if self._held:
            self._release_held()
        if self._writer is not None:
            self._close_part()
        self._commit()
        if self.committed:
            log.info("%s (%d/%d) committed %d rows in %d files under %s", self.name, self.ctx.subtask_index + 1,
                     self.ctx.parallelism, self.rows, len(self.committed), self._dir)

    def close(self) -> None:
        """Not finished (failed or cancelled): drop every staged part of this attempt."""
        if self._writer is not None:
            try:
                self._writer.close()
                self._fh.close()
            except Exception:  # noqa: BLE001
                log.debug("could not close %s", self._stage, exc_info=True)
            self._writer = None
            self._staged.append(self._stage)
        for stage in self._staged:
            try:
                self._fs.rm(stage)
            except Exception:  # noqa: BLE001
                log.debug("could not remove %s", stage, exc_info=True)
        self._staged = []


class ParquetSink(_StagedFileSink):
    kind = "parquet_sink"
    extension = ".parquet"

    def _new_writer(self, fh: Any, schema: pa.Schema) -> Any:
        return pq.ParquetWriter(fh, schema)


class CsvSink(_StagedFileSink):
    kind = "csv_sink"
    extension = ".csv"

    def _new_writer(self, fh: Any, schema: pa.Schema) -> Any:
        return pacsv.CSVWriter(fh, schema)


class CollectSink(_StagedFileSink):
    """Writes its input in the collect format (``yarnflow.common.collect``) under the job's
    storage dir, for the client."""

    kind = "collect_sink"
    extension = collect.EXTENSION

    def __init__(self, uid: str, print_rows: bool = False, name: str | None = None) -> None:
        super().__init__("", name or ("print" if print_rows else "collect"), uid)
        self.print_rows = print_rows

    def _directory(self) -> str:
        return collect.collect_dir(self.ctx.job_storage_dir, self.uid)

    def _new_writer(self, fh: Any, schema: pa.Schema) -> Any:
        return collect.open_writer(fh, schema)


# kept for callers of the old names; the protocol lives in yarnflow.common.collect
collect_dir = collect.collect_dir
read_collected = collect.read_collected
