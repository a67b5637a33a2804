"""Bounded sources: an in-memory collection and files (Parquet, CSV, JSON lines, text) on any
fsspec filesystem. Subtask i of p reads every p-th split (file or slice)."""

from __future__ import annotations

import io
import logging
import posixpath
from typing import Any, Callable, Iterator

import fsspec
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from yarnflow.common.errors import YarnflowError
from yarnflow.worker.operators.base import SourceOperator

log = logging.getLogger(__name__)

FORMATS = ("parquet", "csv", "json", "text")


class SourceReadError(YarnflowError, IOError):
    """An input file could not be read; the message names the file."""


class CollectionSource(SourceOperator):
    kind = "collection_source"

    def __init__(self, table: pa.Table, name: str | None = None, uid: str | None = None) -> None:
        super().__init__(name or "collection", uid)
        self.table = table

    def run(self, cancelled: Callable[[], bool]) -> None:
        n, p, i = self.table.num_rows, self.ctx.parallelism, self.ctx.subtask_index
        start, end = n * i // p, n * (i + 1) // p
        part = self.table.slice(start, end - start)
        for batch in part.to_batches(max_chunksize=self.ctx.batch_size):
            if cancelled():
                return
            if batch.num_rows:
                self.output.collect(batch)


def expand_paths(path: str | list[str]) -> tuple[Any, list[str]]:
    """The filesystem and the sorted data files under ``path`` (a file, folder or glob).
    Hidden files and names starting with '_' or '.' are skipped, as Spark and Flink do."""
    paths = [path] if isinstance(path, str) else list(path)
    fs, _ = fsspec.core.url_to_fs(paths[0])
    files: list[str] = []
    for p in paths:
        _, stripped = fsspec.core.url_to_fs(p)
        if any(ch in stripped for ch in "*?["):
            found = fs.glob(stripped)
        elif fs.isdir(stripped):
            found = fs.find(stripped)
        elif fs.exists(stripped):
            found = [stripped]
        else:
            raise SourceReadError(f"input path {p} does not exist")
        files.extend(f for f in found
                     if not posixpath.basename(f).startswith(("_", ".")) and not fs.isdir(f))
    return fs, sorted(set(files))


class FileSource(SourceOperator):
    kind = "file_source"

    def __init__(self, path: str | list[str], fmt: str, name: str | None = None, uid: str | None = None,
                 options: dict[str, Any] | None = None) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown file format {fmt!r}: expected one of {', '.join(FORMATS)}")
        super().__init__(name or f"{fmt}_source", uid)
        self.path = path
        self.fmt = fmt
        self.options = options or {}

    def run(self, cancelled: Callable[[], bool]) -> None:
        fs, files = expand_paths(self.path)
        mine = files[self.ctx.subtask_index::self.ctx.parallelism]
        log.info("%s (%d/%d) reads %d of %d files", self.name, self.ctx.subtask_index + 1,
                 self.ctx.parallelism, len(mine), len(files))
        for file in mine:
            try:
                for batch in self._read(fs, file):
                    if cancelled():
                        return
                    if batch.num_rows:
                        self.output.collect(batch)
            except (pa.ArrowInvalid, pa.ArrowException, UnicodeDecodeError, OSError, ValueError) as exc:
                if isinstance(exc, SourceReadError):
                    raise
                raise SourceReadError(f"cannot read {self.fmt} file {fs.unstrip_protocol(file)}: "
                                      f"{type(exc).__name__}: {exc}") from exc

    def _read(self, fs: Any, file: str) -> Iterator[pa.RecordBatch]:
        size = self.ctx.batch_size
        if self.fmt == "parquet":
            with fs.open(file, "rb") as fh:
                pf = pq.ParquetFile(fh)
                yield from pf.iter_batches(batch_size=size, columns=self.options.get("columns"))
        elif self.fmt == "csv":
            with fs.open(file, "rb") as fh:
                reader = pacsv.open_csv(fh, read_options=pacsv.ReadOptions(block_size=1 << 22))
                for batch in reader:
                    yield batch
        elif self.fmt == "json":
            with fs.open(file, "rb") as fh:
                table = pajson.read_json(io.BytesIO(fh.read()))
            yield from table.to_batches(max_chunksize=size)
        else:  # text: one row per line, column 'line'
            with fs.open(file, "rt", encoding=self.options.get("encoding", "utf-8")) as fh:
                lines: list[str] = []
                for line in fh:
                    lines.append(line.rstrip("\r\n"))
                    if len(lines) >= size:
                        yield pa.record_batch({"line": pa.array(lines, pa.string())})
                        lines = []
                if lines:
                    yield pa.record_batch({"line": pa.array(lines, pa.string())})
