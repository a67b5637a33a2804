"""Sinks: Parquet files on any fsspec filesystem, and collect (results handed to the client,
which prints them for ``print()``).

Files are written under a staging name and renamed when the subtask finishes, so a failed or
cancelled attempt leaves no partial result behind under a final name."""

from __future__ import annotations

import logging
import posixpath
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

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
    """One file set per subtask: ``part-<subtask>-<n><ext>``, a new part after
    ``roll_size_bytes`` (by in-memory batch size). A part is written under a hidden staging
    name and renamed when it is complete (rolled, or the subtask finished)."""

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

    def _final_name(self) -> str:
        suffix = f"-{self._part}" if self.roll_size_bytes else ""
        return posixpath.join(self._dir, f"part-{self.ctx.subtask_index:05d}{suffix}{self.extension}")

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        # A column that has held only nulls so far has type null; its real type comes with the
        # first non-null value. Batches wait (up to a bound) until every type is known.
        if self._writer is None and (self._held or _has_null_columns(batch)):
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
            self._schema = batch.schema
            self._stage = posixpath.join(
                self._dir, f".part-{self.ctx.subtask_index:05d}-{self._part}-attempt{self.ctx.attempt_number}"
                           f"{self.extension}.inprogress")
            self._fh = self._fs.open(self._stage, "wb")
            self._writer = self._new_writer(self._fh, batch.schema)
        self._writer.write_batch(batch)
        self.rows += batch.num_rows
        self._part_bytes += batch.nbytes
        if self.roll_size_bytes and self._part_bytes >= self.roll_size_bytes:
            self._commit()

    def _new_writer(self, fh: Any, schema: pa.Schema) -> Any:
        raise NotImplementedError

    def _commit(self) -> None:
        self._writer.close()
        self._fh.close()
        self._writer = None
        final = self._final_name()
        if self._fs.exists(final):
            self._fs.rm(final)
        self._fs.mv(self._stage, final)
        self.committed.append(final)
        self._part += 1
        self._part_bytes = 0

    def finish(self) -> None:
        if self._held:
            self._release_held()
        if self._writer is not None:
            self._commit()
        if self.committed:
            log.info("%s (%d/%d) committed %d rows in %d files under %s", self.name, self.ctx.subtask_index + 1,
                     self.ctx.parallelism, self.rows, len(self.committed), self._dir)

    def close(self) -> None:
        if self._writer is not None:  # not finished: failed or cancelled; drop the staged file
            try:
                self._writer.close()
                self._fh.close()
                self._fs.rm(self._stage)
            except Exception:  # noqa: BLE001
                log.debug("could not remove %s", self._stage, exc_info=True)
            self._writer = None


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
    """Writes its input as Arrow IPC files under the job's storage dir, for the client."""

    kind = "collect_sink"
    extension = ".arrow"

    def __init__(self, uid: str, print_rows: bool = False, name: str | None = None) -> None:
        super().__init__("", name or ("print" if print_rows else "collect"), uid)
        self.print_rows = print_rows

    def _directory(self) -> str:
        return collect_dir(self.ctx.job_storage_dir, self.uid)

    def _new_writer(self, fh: Any, schema: pa.Schema) -> Any:
        return ipc.new_file(fh, schema)


def collect_dir(job_storage_dir: str, uid: str) -> str:
    return f"{job_storage_dir.rstrip('/')}/collect/{uid}"


def read_collected(job_storage_dir: str, uid: str) -> pa.Table | None:
    """The rows a collect sink wrote, or None when it wrote nothing."""
    fs, directory = fsspec.core.url_to_fs(collect_dir(job_storage_dir, uid))
    if not fs.exists(directory):
        return None
    tables = []
    for f in sorted(fs.ls(directory, detail=False)):
        if posixpath.basename(f).startswith("."):
            continue
        with fs.open(f, "rb") as fh:
            tables.append(ipc.open_file(pa.BufferReader(fh.read())).read_all())
    return pa.concat_tables(tables, promote_options="default") if tables else None
