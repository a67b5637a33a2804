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

from yarnflow.common.api.watermarks import MIN_WATERMARK, WatermarkOutput, WatermarkStrategy
from yarnflow.common.errors import SourceReadError
from yarnflow.worker.elements import Watermark
from yarnflow.worker.operators.base import Output, RuntimeContext, SourceOperator
from yarnflow.worker.operators.timestamps import event_times_ms
from yarnflow.worker.state.tables import dumps, loads, not_redistributable, require_columns, single_row
from yarnflow.worker.state.errors import StateRestoreError

log = logging.getLogger(__name__)

FORMATS = ("parquet", "csv", "json", "text")
#: Parquet rows take about this many times their file's size in memory (dictionary and run-length
#: encoding, compression): a size estimate for the compiler
PARQUET_EXPANSION = 3


class CollectionSource(SourceOperator):
    """Subtask i of p emits the i-th of p contiguous slices of ``table``.

    State (table ``position``): ``emitted`` (int64), the rows of its slice already emitted; a
    restored subtask goes on from there."""

    kind = "collection_source"

    def __init__(self, table: pa.Table, name: str | None = None, uid: str | None = None) -> None:
        super().__init__(name or "collection", uid)
        self.table = table
        self._emitted = 0

    def estimated_bytes(self) -> int | None:
        return int(self.table.nbytes)

    def run(self, cancelled: Callable[[], bool]) -> None:
        n, p, i = self.table.num_rows, self.ctx.parallelism, self.ctx.subtask_index
        start, end = n * i // p, n * (i + 1) // p
        part = self.table.slice(start + self._emitted, max(0, end - start - self._emitted))
        for batch in part.to_batches(max_chunksize=self.ctx.batch_size):
            if cancelled():  # a checkpoint taken here holds what was emitted so far
                return
            if batch.num_rows:
                self.output.collect(batch)
                self._emitted += batch.num_rows

    def snapshot_state(self, checkpoint_id: int) -> dict[str, pa.Table]:
        # a slice of the collection per subtask: another parallelism slices it differently
        return {"position": not_redistributable(pa.table({"emitted": pa.array([self._emitted], pa.int64())}))}

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        row = single_row(state, "position", ["emitted"])
        self._emitted = int(row["emitted"]) if row is not None else 0


class GeneratorSource(SourceOperator):
    """Rows made by ``fn(start, n)`` for the global sequence numbers ``[start, start + n)``
    (a RecordBatch, a Table or a dict of columns), in chunks of the batch size dealt round-robin
    to the subtasks; ``count=None`` is unbounded; ``rate_per_s`` limits rows/s over all subtasks.

    State (table ``position``): ``next_index`` (int64), the first sequence number of this
    subtask's next chunk, and ``chunk_size`` (int64); a restored subtask goes on from there with
    the same chunk size."""

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
        self._size = 0  # rows per chunk, fixed at the first run (or by the restored state)
        self._chunk = -1  # this subtask's next chunk; -1: its first (the subtask index)

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        if self._chunk < 0:
            self._chunk = ctx.subtask_index

    def _chunk_size(self) -> int:
        size = self.ctx.batch_size
        if self.rate_per_s is not None:
            size = max(1, min(size, int(self.rate_per_s / self.ctx.parallelism / 10) or 1))  # ~10 batches/s
        return size

    def run(self, cancelled: Callable[[], bool]) -> None:
        import time

        from yarnflow.worker.operators.transforms import to_batches

        p, size = self.ctx.parallelism, self._size or self._chunk_size()
        self._size = size
        my_rate = self.rate_per_s / p if self.rate_per_s else None
        started = time.monotonic()
        emitted = 0
        while not cancelled():  # a checkpoint taken here holds the chunks emitted so far
            start = self._chunk * size
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
            self._chunk += p
            if my_rate:
                ahead = emitted / my_rate - (time.monotonic() - started)
                while ahead > 0 and not cancelled():
                    self.pause(min(ahead, 0.05))
                    ahead = emitted / my_rate - (time.monotonic() - started)

    def snapshot_state(self, checkpoint_id: int) -> dict[str, pa.Table]:
        size = self._size or self._chunk_size()
        # chunks dealt round-robin by parallelism: another parallelism deals them differently
        return {"position": not_redistributable(pa.table({"next_index": pa.array([self._chunk * size], pa.int64()),
                                                          "chunk_size": pa.array([size], pa.int64())}))}

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        row = single_row(state, "position", ["next_index", "chunk_size"])
        if row is None:
            return
        size, next_index = int(row["chunk_size"]), int(row["next_index"])
        if size <= 0 or next_index % size:
            raise StateRestoreError(f"source '{self.name}': restored position {next_index} is not at a "
                                    f"chunk boundary of size {size}")
        self._size, self._chunk = size, next_index // size


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


class _HeldSplit:
    """A split a file source holds, how many of its rows it emitted, and (with a watermark
    strategy) its own watermark and generator."""

    __slots__ = ("split_id", "payload", "offset", "payload_bytes", "watermark", "generator", "active_at")

    def __init__(self, split_id: str, payload: Any, offset: int = 0, payload_bytes: bytes | None = None,
                 watermark: int = MIN_WATERMARK) -> None:
        self.split_id = split_id
        self.payload = payload
        self.offset = offset
        self.payload_bytes = payload_bytes if payload_bytes is not None else dumps(payload)
        self.watermark = watermark
        self.generator: Any = None
        self.active_at: int | None = None  # processing time of its latest rows (None: not yet counted)


class _SplitOutput(WatermarkOutput):
    """Where a split's generator emits: the split's own watermark (it only rises)."""

    def __init__(self, split: _HeldSplit) -> None:
        self.split = split

    def emit_watermark(self, timestamp: int) -> None:
        self.split.watermark = max(self.split.watermark, int(timestamp))

    def mark_idle(self) -> None:
        pass  # (a split being read is not idle; the source's watermark is the minimum of its splits')


class FileSource(SourceOperator):
    """Files as splits (Parquet: one split per row group), handed out by the JobMaster as
    source subtasks ask for work; without a split provider (unit tests), subtask i of p reads
    every p-th split.

    With a watermark strategy (FLIP-27's per-split watermarks): each split has its own generator
    and watermark, and the source emits the minimum of the watermarks of the splits it holds (the
    one being read and those restored but not started yet), so a subtask holding several splits
    (after a restore at a smaller parallelism) neither holds back nor drops the rows of any. With
    the strategy's idleness (FLIP-27's per-split idleness), a held split that gave no rows for
    that long no longer holds the watermark back: progress over completeness, as in Flink (its
    rows may then come late).

    State (table ``splits``, one row per split held, the one being read first): ``split_id``
    (string), ``payload`` (binary: the pickled split payload), ``offset`` (int64: rows of the
    split already emitted) and ``watermark`` (int64: its watermark so far). A restored subtask reads those splits first, from their offsets,
    before it asks for new ones. Without a split provider, table ``static_splits`` (``taken``,
    int64) counts the splits taken from the static list."""

    kind = "file_source"
    dynamic_splits = True

    def __init__(self, path: str | list[str], fmt: str, name: str | None = None, uid: str | None = None,
                 options: dict[str, Any] | None = None, watermarks: WatermarkStrategy | None = None) -> None:
        if watermarks is not None and not watermarks.timestamp_column:
            raise ValueError("the source's watermark strategy needs a timestamp column: "
                             "strategy.with_timestamp_column('ts')")
        self.watermarks = watermarks
        self._emitted = MIN_WATERMARK
        if fmt not in FORMATS:
            raise ValueError(f"unknown file format {fmt!r}: expected one of {', '.join(FORMATS)}")
        super().__init__(name or f"{fmt}_source", uid)
        self.path = path
        self.fmt = fmt
        self.options = options or {}
        #: splits this subtask holds: the one being read first, then those not started
        self._splits: list[_HeldSplit] = []
        self._static_taken = 0

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

    def estimated_bytes(self) -> int | None:
        """The files' sizes (Parquet's times ``PARQUET_EXPANSION``: its columns are encoded and
        compressed); None when they cannot be listed from here."""
        try:
            fs, files = expand_paths(self.path)
            total = sum(int(fs.size(f) or 0) for f in files)
        except Exception:  # noqa: BLE001 - no estimate then: the compiler does without
            log.debug("cannot estimate the size of %s", self.path, exc_info=True)
            return None
        return total * PARQUET_EXPANSION if self.fmt == "parquet" else total

    @staticmethod
    def split_id(payload: Any) -> str:
        """The id ``enumerate_splits`` gives the split ``payload``."""
        file, group = payload
        return file if group is None else f"{file}#{group}"

    def run(self, cancelled: Callable[[], bool]) -> None:
        fs, _ = fsspec.core.url_to_fs(self.path if isinstance(self.path, str) else self.path[0])
        provider = self.ctx.split_provider
        if provider is None:
            mine = self.enumerate_splits()[self.ctx.subtask_index::self.ctx.parallelism]
            static = iter(payload for _, payload in mine[self._static_taken:])

            def provider() -> Any:
                payload = next(static, None)
                if payload is not None:
                    self._static_taken += 1
                return payload
        count = 0
        while True:
            if not self._splits:  # restored splits first, then new ones
                try:
                    payload = provider()
                except StopIteration:
                    payload = None
                if payload is None:
                    break
                # held (so in every later snapshot) before anything can take a checkpoint
                self._splits.append(_HeldSplit(self.split_id(payload), payload))
                if cancelled():
                    break
            split = self._splits[0]
            count += 1
            file, group = split.payload
            try:
                for batch in self._read(fs, file, group, skip=split.offset):
                    if cancelled():  # a checkpoint taken here holds the offsets emitted so far
                        return
                    if batch.num_rows:
                        self.output.collect(batch)
                        split.offset += batch.num_rows
                        if self.watermarks is not None:
                            self._watermark(split, batch)
            except (pa.ArrowInvalid, pa.ArrowException, UnicodeDecodeError, OSError, ValueError) as exc:
                if isinstance(exc, SourceReadError):
                    raise
                raise SourceReadError(f"cannot read {self.fmt} file {fs.unstrip_protocol(file)}: "
                                      f"{type(exc).__name__}: {exc}") from exc
            self._splits.pop(0)  # read to its end: no longer in the state
            if self.watermarks is not None:
                self._emit_min()
        log.info("%s (%d/%d) read %d splits", self.name, self.ctx.subtask_index + 1, self.ctx.parallelism, count)

    def _watermark(self, split: _HeldSplit, batch: pa.RecordBatch) -> None:
        """Feed the split's generator the batch's event times; emit the source's new watermark."""
        assert self.watermarks is not None
        if split.generator is None:
            split.generator = self.watermarks.create_generator()
        split.active_at = self.ctx.clock()
        ts = event_times_ms(batch, self.watermarks.timestamp_column, self.name)
        out = _SplitOutput(split)
        on_batch = getattr(split.generator, "on_batch", None)
        if on_batch is not None:
            self.call_user(on_batch, ts, out)
        else:
            for row, t in zip(batch.to_pylist(), ts.tolist()):
                self.call_user(split.generator.on_event, row, t, out)
        self.call_user(split.generator.on_periodic_emit, out)
        self._emit_min()

    def _emit_min(self) -> None:
        """The minimum of the held splits' watermarks (those not idle), when it rose (none held:
        unchanged)."""
        assert self.watermarks is not None
        idleness, now = self.watermarks.idleness_ms, self.ctx.clock()
        live = self._splits
        if idleness and self._splits:
            for s in self._splits:
                if s.active_at is None:
                    s.active_at = now  # (idle from when the subtask first held it)
            live = [self._splits[0]] + [s for s in self._splits[1:] if now - (s.active_at or now) < idleness]
        if live:
            low = min(s.watermark for s in live)
            if low > self._emitted:
                self._emitted = low
                self.output.emit_watermark(Watermark(low))

    def snapshot_state(self, checkpoint_id: int) -> dict[str, pa.Table]:
        splits = pa.table({
            "split_id": pa.array([s.split_id for s in self._splits], pa.string()),
            "payload": pa.array([s.payload_bytes for s in self._splits], pa.binary()),
            "offset": pa.array([s.offset for s in self._splits], pa.int64()),
            "watermark": pa.array([s.watermark for s in self._splits], pa.int64()),
        })
        state = {"splits": splits}
        if self.ctx.split_provider is None:  # splits dealt statically (no JobMaster): how many taken
            state["static_splits"] = pa.table({"taken": pa.array([self._static_taken], pa.int64())})
        return state

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        table = state.get("splits")
        self._splits = []
        if table is not None:
            require_columns(table, "splits", ["split_id", "payload", "offset"])
            for row in table.to_pylist():
                payload = loads(row["payload"])
                self._splits.append(_HeldSplit(row["split_id"], payload, int(row["offset"]), row["payload"],
                                               int(row.get("watermark") or MIN_WATERMARK)))
        # restored at a smaller parallelism, a subtask holds the splits of several old ones: it
        # reads them in split order (files named in time order then keep event time in order)
        self._splits.sort(key=lambda s: s.split_id)
        row = single_row(state, "static_splits", ["taken"])
        self._static_taken = int(row["taken"]) if row is not None else 0
        if self._splits:
            log.info("%s (%d/%d) resumes %d splits: %s", self.name, self.ctx.subtask_index + 1,
                     self.ctx.parallelism, len(self._splits),
                     ", ".join(f"{s.split_id} at row {s.offset}" for s in self._splits))

    def _read(self, fs: Any, file: str, group: int | None = None, skip: int = 0) -> Iterator[pa.RecordBatch]:
        """The split's batches, without its first ``skip`` rows."""
        for batch in self._read_all(fs, file, group):
            if skip >= batch.num_rows:
                skip -= batch.num_rows
                continue
            yield batch.slice(skip) if skip else batch
            skip = 0

    def _read_all(self, fs: Any, file: str, group: int | None) -> Iterator[pa.RecordBatch]:
        size = self.ctx.batch_size
        if self.fmt == "parquet":
            with fs.open(file, "rb") as fh:
                pf = pq.ParquetFile(fh)
                groups = [group] if group is not None else None
                yield from pf.iter_batches(batch_size=size, row_groups=groups, columns=self.options.get("columns"))
        elif self.fmt == "csv":
            with fs.open(file, "rb") as fh:
                reader = pacsv.open_csv(fh, read_options=pacsv.ReadOptions(block_size=1 << 22))
                for block in reader:  # batches of the batch size: the finer, the closer a checkpoint
                    yield from pa.Table.from_batches([block]).to_batches(max_chunksize=size)
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
