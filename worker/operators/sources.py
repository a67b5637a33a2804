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


class GeneratorSource(SourceOperator):
    """Rows made by ``fn(start, n)`` for the global sequence numbers ``[start, start + n)``
    (a RecordBatch, a Table or a dict of columns), in chunks of the batch size dealt round-robin
    to the subtasks; ``count=None`` is unbounded; ``rate_per_s`` limits rows/s over all subtasks."""

    kind = "generator_source"

    def __init__(self, fn: Callable[[int, int], Any], count: int | None = None, rate_per_s: float | None = None,
                 name: str | None = None, uid: str | None = None) -> None:
        super().__init__(name or "generator", uid)
        if count is not None and count < 0:
            raise ValueError("count cannot be negative")
        if rate_per_s is not None and rate_per_s <= 0:
            raise ValueError("rate_per_s must be positive")
        self.fn = fn
        self.count = count
        self.rate_per_s = rate_per_s
        self.bounded = count is not None

    def run(self, cancelled: Callable[[], bool]) -> None:
        import time

        from yarnflow.worker.operators.transforms import to_batches

        p, i, size = self.ctx.parallelism, self.ctx.subtask_index, self.ctx.batch_size
        if self.rate_per_s is not None:
            size = max(1, min(size, int(self.rate_per_s / p / 10) or 1))  # ~10 batches/s per subtask
        my_rate = self.rate_per_s / p if self.rate_per_s else None
        started = time.monotonic()
        emitted = 0
        chunk = i
        while not cancelled():
            start = chunk * size
            if self.count is not None and start >= self.count:
                return
            n = size if self.count is None else min(size, self.count - start)
            value = self.call_user(self.fn, start, n)
            if isinstance(value, dict):
                value = pa.table(value)
            for batch in to_batches(value, self.name):
                if batch.num_rows:
                    self.output.collect(batch)
            emitted += n
            chunk += p
            if my_rate:
                ahead = emitted / my_rate - (time.monotonic() - started)
                while ahead > 0 and not cancelled():
                    time.sleep(min(ahead, 0.05))
                    ahead = emitted / my_rate - (time.monotonic() - started)


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
        elif fs.isdir(stripped):  # also skip what lies under hidden folders (_temporary/, .git/)
            root = stripped.rstrip("/")
            found = [f for f in fs.find(stripped)
                     if not any(part.startswith(("_", ".")) for part in f[len(root):].split("/")[1:-1])]
        elif fs.exists(stripped):
            found = [stripped]
        else:
            raise SourceReadError(f"input path {p} does not exist")
        files.extend(f for f in found
                     if not posixpath.basename(f).startswith(("_", ".")) and not fs.isdir(f))
    return fs, sorted(set(files))


class FileSource(SourceOperator):
    """Files as splits (Parquet: one split per row group), handed out by the JobMaster as
    source subtasks ask for work; without a split provider (unit tests), subtask i of p reads
    every p-th split."""

    kind = "file_source"
    dynamic_splits = True

    def __init__(self, path: str | list[str], fmt: str, name: str | None = None, uid: str | None = None,
                 options: dict[str, Any] | None = None) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown file format {fmt!r}: expected one of {', '.join(FORMATS)}")
        super().__init__(name or f"{fmt}_source", uid)
        self.path = path
        self.fmt = fmt
        self.options = options or {}

    def enumerate_splits(self) -> list[tuple[str, Any]]:
        fs, files = expand_paths(self.path)
        splits: list[tuple[str, Any]] = []
        for file in files:
            if self.fmt == "parquet":
                try:
                    with fs.open(file, "rb") as fh:
                        groups = pq.ParquetFile(fh).metadata.num_row_groups
                except (pa.ArrowException, OSError) as exc:
                    raise SourceReadError(f"cannot read parquet file {fs.unstrip_protocol(file)}: "
                                          f"{type(exc).__name__}: {exc}") from exc
                splits += [(f"{file}#{g}", (file, g)) for g in range(groups)]
            else:
                splits.append((file, (file, None)))
        return splits

    def run(self, cancelled: Callable[[], bool]) -> None:
        fs, _ = fsspec.core.url_to_fs(self.path if isinstance(self.path, str) else self.path[0])
        provider = self.ctx.split_provider
        if provider is None:
            mine = self.enumerate_splits()[self.ctx.subtask_index::self.ctx.parallelism]
            provider = iter(payload for _, payload in mine).__next__
        count = 0
        while True:
            try:
                split = provider()
            except StopIteration:
                split = None
            if split is None or cancelled():
                break
            count += 1
            file, group = split
            try:
                for batch in self._read(fs, file, group):
                    if cancelled():
                        return
                    if batch.num_rows:
                        self.output.collect(batch)
            except (pa.ArrowInvalid, pa.ArrowException, UnicodeDecodeError, OSError, ValueError) as exc:
                if isinstance(exc, SourceReadError):
                    raise
                raise SourceReadError(f"cannot read {self.fmt} file {fs.unstrip_protocol(file)}: "
                                      f"{type(exc).__name__}: {exc}") from exc
        log.info("%s (%d/%d) read %d splits", self.name, self.ctx.subtask_index + 1, self.ctx.parallelism, count)

    def _read(self, fs: Any, file: str, group: int | None = None) -> Iterator[pa.RecordBatch]:
        size = self.ctx.batch_size
        if self.fmt == "parquet":
            with fs.open(file, "rb") as fh:
                pf = pq.ParquetFile(fh)
                groups = [group] if group is not None else None
                yield from pf.iter_batches(batch_size=size, row_groups=groups, columns=self.options.get("columns"))
        elif self.fmt == "csv":
            with fs.open(file, "rb") as fh:
                reader = pacsv.open_csv(fh, read_options=pacsv.ReadOptions(block_size=1 << 22))
                yield from reader
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
