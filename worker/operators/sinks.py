"""Sinks: Parquet files on any fsspec filesystem, and collect (results handed to the client,
which prints them for ``print()``).

Files are written under hidden staging names and renamed when the subtask finishes (or, with
checkpoints, when the checkpoint that covers them completes), so a failed, cancelled or killed
attempt never leaves rows behind under a final name (see ``_StagedFileSink``)."""

from __future__ import annotations

import logging
import posixpath
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from yarnflow.common import collect
from yarnflow.worker.operators.base import Operator
from yarnflow.worker.state.errors import StateRestoreError
from yarnflow.worker.state.tables import require_columns
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
    (``.part-<subtask>-<n>-attempt<id><ext>.inprogress``, <id> from the attempt's unique id; skipped by pyarrow.dataset, Spark and
    our own sources) and renames them all to their final names only when the subtask finishes;
    a failed or cancelled attempt deletes its parts, and a new attempt first deletes whatever
    hidden parts earlier attempts of its subtask left (a killed process cleans nothing). A
    subtask that commits again (it was restarted after finishing) replaces its files and deletes
    its earlier parts that this attempt did not write.

    With checkpoints (``ctx.checkpointing``) it is two-phase, as Flink's FileSink: final names
    are always ``part-<subtask>-<n><ext>``, ``n`` counting on over checkpoints and attempts.
    ``snapshot_state(c)`` closes the part being written and records the closed parts as pending
    for ``c``; ``notify_checkpoint_complete(c)`` renames the pending parts of checkpoints
    ``<= c`` to their final names; an aborted checkpoint's parts stay pending for the next
    completed one. ``finish`` (end of input) only closes the last part: the task then waits for
    a final checkpoint (Flink's FLIP-147), whose completion commits it, so a subtask that ends
    commits nothing a restore from an earlier checkpoint would write again. A failed attempt deletes only
    the parts after its last checkpoint: pending ones may belong to a completed checkpoint whose
    notification it never got. A restored attempt (``initialize_state``) commits the pending
    parts of the restored state, deletes every other hidden part of its subtask, and deletes the
    committed parts numbered at or above the restored part counter (written after that
    checkpoint by an attempt that then finished). A new attempt with no restored state deletes
    every part of its subtask. State: table ``pending`` (``checkpoint_id`` int64, ``part``
    int64, ``staged`` and ``final`` strings: file names in the sink's folder), table
    ``counter`` (one row: ``next_part`` int64, ``folder``, ``subtask`` int32) and, when rows wait at the barrier for their
    column types to be known, table ``held`` (those rows). Restored at another parallelism, a
    subtask may take over the state of other old subtasks (old ``i`` goes to new ``i % p``): it
    commits their pending parts under their recorded final names and deletes their committed
    parts numbered at or above their counters, as it does for its own."""

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
        self._staged: list[str] = []  # closed parts waiting for the subtask to finish (or a checkpoint)
        #: with checkpoints: checkpoint id -> the (part, staged path) it closed, not yet committed
        self._pending: dict[int, list[tuple[int, str]]] = {}
        self._restored = False
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

    def _init_fs(self) -> None:
        if self._fs is None:
            self._fs, self._dir = fsspec.core.url_to_fs(self._directory())
            self._fs.makedirs(self._dir, exist_ok=True)

    def open(self) -> None:
        self._init_fs()
        self._delete_leftovers()
        if self.ctx.checkpointing and not self._restored:
            self._delete_committed_from(0)  # parts of an attempt whose checkpoints are all gone

    def _part_number(self, basename: str, subtask: int | None = None) -> int | None:
        """The part number of a committed file of a subtask (None for ``part-<subtask><ext>``)."""
        rest = basename[len(self._subtask_prefix(subtask)):len(basename) - len(self.extension)]
        return int(rest[1:]) if rest else None

    def _delete_committed_from(self, first_part: int, subtask: int | None = None) -> None:
        """Delete the committed parts of this subtask (or of ``subtask``, whose state this one
        took over) numbered ``first_part`` or more (and an unnumbered one)."""
        for f in self._fs.ls(self._dir, detail=False):
            name = posixpath.basename(f)
            if self._is_own_final(name, subtask):
                number = self._part_number(name, subtask)
                if number is None or number >= first_part:
                    log.info("%s (%d/%d): deleting %s, written after the checkpoint this attempt restored",
                             self.name, self.ctx.subtask_index + 1, self.ctx.parallelism, f)
                    self._fs.rm(f)

    def _subtask_prefix(self, subtask: int | None = None) -> str:
        return f"part-{self.ctx.subtask_index if subtask is None else subtask:05d}"

    def _is_own_stage(self, basename: str) -> bool:
        """A staging file of any attempt of this subtask."""
        return basename.startswith(f".{self._subtask_prefix()}-") and "-attempt" in basename \
            and basename.endswith(".inprogress")

    def _is_own_final(self, basename: str, subtask: int | None = None) -> bool:
        """A committed file of this subtask (or of ``subtask``): ``part-<subtask><ext>`` or
        ``part-<subtask>-<n><ext>``."""
        prefix = self._subtask_prefix(subtask)
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
        suffix = f"-{part}" if self.roll_size_bytes or self.ctx.checkpointing else ""
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
            self._stage = self._stage_name(self._part)
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

    def _stage_name(self, part: int) -> str:
        # the attempt's unique id where known: attempt numbers start again under a new leader,
        # while a deposed leader's attempt may still be closing its files
        attempt = self.ctx.attempt_id[:16] if self.ctx.attempt_id else str(self.ctx.attempt_number)
        return posixpath.join(self._dir, f".{self._subtask_prefix()}-{part}-attempt{attempt}"
                                         f"{self.extension}.inprogress")

    def _part_of(self, stage: str) -> int:
        """The part number in the staged name ``stage`` (as ``_stage_name`` made it)."""
        return int(posixpath.basename(stage)[len(self._subtask_prefix()) + 2:].split("-", 1)[0])

    # -- checkpoints (two-phase commit) ------------------------------------------------------

    def snapshot_state(self, checkpoint_id: int) -> dict[str, pa.Table]:
        if not self.ctx.checkpointing:
            return {}
        if self._writer is not None:
            self._close_part()
        if self._staged:
            self._pending.setdefault(checkpoint_id, []).extend((self._part_of(s), s) for s in self._staged)
            self._staged = []
        pending = [(cid, part, stage) for cid in sorted(self._pending) for part, stage in self._pending[cid]]
        state = {
            "pending": pa.table({
                "checkpoint_id": pa.array([cid for cid, _, _ in pending], pa.int64()),
                "part": pa.array([part for _, part, _ in pending], pa.int64()),
                "staged": pa.array([posixpath.basename(stage) for _, _, stage in pending], pa.string()),
                "final": pa.array([posixpath.basename(self._final_name(part)) for _, part, _ in pending],
                                  pa.string()),
            }),
            "counter": pa.table({"next_part": pa.array([self._part], pa.int64()),
                                 "folder": pa.array([self._folder_url()], pa.string()),
                                 "subtask": pa.array([self.ctx.subtask_index], pa.int32())}),
        }
        if self._held:  # rows before the barrier whose column types are not known yet
            state["held"] = pa.Table.from_batches(self._held).combine_chunks() \
                if len({b.schema for b in self._held}) == 1 \
                else pa.concat_tables([pa.Table.from_batches([b]) for b in self._held], promote_options="default")
        return state

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        done = sorted(cid for cid in self._pending if cid <= checkpoint_id)
        if not done:
            return
        parts = [entry for cid in done for entry in self._pending[cid]]
        self._commit_parts(parts)
        for cid in done:
            del self._pending[cid]
        log.info("%s (%d/%d): checkpoint %d complete, committed %d files", self.name, self.ctx.subtask_index + 1,
                 self.ctx.parallelism, checkpoint_id, len(parts))

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Its pending parts wait for the next completed checkpoint, which covers them too."""

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        self._restored = True
        self._init_fs()
        counters = self._counters(state.get("counter"))
        own = counters.pop(self.ctx.subtask_index, None)
        self._part = int(own["next_part"]) if own is not None else 0
        pending = state.get("pending")
        folders = {str(c.get("folder") or "") for c in [own, *counters.values()] if c is not None}
        folder = next(iter(folders)) if len(folders) == 1 else ""
        parts: list[tuple[int, str]] = []
        if pending is not None and folder and folder != self._folder_url():
            # restored from a savepoint by a job whose sink writes elsewhere now: the rows the
            # savepoint covers are committed where they were written, as Flink's FileSink does
            self._commit_by_name(folder, pending, f"the restored state was written to {folder}, this sink "
                                                  f"writes to {self._folder_url()}")
            pending = None
        if pending is not None:
            require_columns(pending, "pending", ["part", "staged"])
            adopted = self._adopted_rows(pending)
            if adopted.num_rows:  # rescaled: another subtask's parts, committed under its names
                self._commit_by_name(self._folder_url(), adopted, "restored at another parallelism, this subtask "
                                                                  "took over the state of another")
            mine = pending.filter(pc.invert(self._adopted_mask(pending)))
            parts = [(int(part), posixpath.join(self._dir, staged))
                     for part, staged in zip(mine.column("part").to_pylist(), mine.column("staged").to_pylist())]
        # the restored checkpoint completed: what it left pending is committed now
        self._commit_parts(parts, missing_ok=True)
        self._delete_committed_from(self._part)
        for subtask, counter in counters.items():  # taken over: parts written after the checkpoint go too
            self._delete_committed_from(int(counter["next_part"]), subtask)
        held = state.get("held")
        if held is not None and held.num_rows:
            self._held = held.to_batches()
            self._held_bytes = sum(b.nbytes for b in self._held)
        if parts:
            log.info("%s (%d/%d): restored checkpoint %d, committed its %d pending files", self.name,
                     self.ctx.subtask_index + 1, self.ctx.parallelism, self.ctx.restored_checkpoint_id, len(parts))

    def _counters(self, table: pa.Table | None) -> dict[int, dict[str, Any]]:
        """The restored part counters by the subtask that wrote them (several when this subtask
        took over the state of others on a rescaled restore)."""
        if table is None:
            return {}
        require_columns(table, "counter", ["next_part"])
        rows = table.to_pylist()
        if "subtask" not in table.column_names:
            if len(rows) != 1:
                raise StateRestoreError(f"the restored state 'counter' has {len(rows)} rows, expected one")
            return {self.ctx.subtask_index: rows[0]}
        return {int(row["subtask"]): row for row in rows}

    def _adopted_mask(self, pending: pa.Table) -> pa.ChunkedArray:
        """Rows of ``pending`` whose final name is another subtask's."""
        if "final" not in pending.column_names:
            return pa.chunked_array([pa.array([False] * pending.num_rows, pa.bool_())])
        return pc.invert(pc.starts_with(pending.column("final"), f"{self._subtask_prefix()}-"))

    def _adopted_rows(self, pending: pa.Table) -> pa.Table:
        return pending.filter(self._adopted_mask(pending))

    def _folder_url(self) -> str:
        return str(self._fs.unstrip_protocol(self._dir)).rstrip("/")

    def _commit_by_name(self, folder: str, pending: pa.Table, why: str) -> None:
        """Commit the pending parts of ``pending`` in ``folder`` under their recorded final names."""
        require_columns(pending, "pending", ["staged", "final"])
        fs, root = fsspec.core.url_to_fs(folder)
        done = 0
        for staged, final in zip(pending.column("staged").to_pylist(), pending.column("final").to_pylist()):
            src, dst = posixpath.join(root, staged), posixpath.join(root, final)
            if fs.exists(src):
                if fs.exists(dst):
                    fs.rm(dst)
                fs.mv(src, dst)
                done += 1
            elif not fs.exists(dst):
                raise FileNotFoundError(f"sink '{self.name}': staged part {src} is gone and {dst} does not exist: "
                                        "rows of a completed checkpoint are lost")
        log.warning("%s (%d/%d): %s: committed its %d pending files in %s", self.name, self.ctx.subtask_index + 1,
                    self.ctx.parallelism, why, done, folder)

    def _commit_parts(self, parts: list[tuple[int, str]], missing_ok: bool = False) -> None:
        """Rename each staged part to its final name. A staged file that is gone is an error
        unless ``missing_ok`` and its final name exists (an earlier attempt committed it)."""
        for part, stage in parts:
            final = self._final_name(part)
            if not self._fs.exists(stage):
                if missing_ok and self._fs.exists(final):
                    continue
                raise FileNotFoundError(f"sink '{self.name}': staged part {stage} is gone and {final} does "
                                        f"not exist: rows of a completed checkpoint are lost")
            if self._fs.exists(final):
                self._fs.rm(final)
            self._fs.mv(stage, final)
            self.committed.append(final)

    def _commit(self) -> None:
        """Give every staged part its final name, then delete this subtask's committed files
        from an earlier attempt that this one did not replace."""
        for stage in self._staged:
            if not self._fs.exists(stage):
                raise FileNotFoundError(f"sink '{self.name}': staged part {stage} is gone (deleted by a newer "
                                        f"attempt of subtask {self.ctx.subtask_index}?): not committing")
        for stage in self._staged:
            final = self._final_name(self._part_of(stage))
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
        if self.ctx.checkpointing:  # end of input: the final checkpoint commits the last parts
            return
        self._commit()
        if self.committed:
            log.info("%s (%d/%d) committed %d rows in %d files under %s", self.name, self.ctx.subtask_index + 1,
                     self.ctx.parallelism, self.rows, len(self.committed), self._dir)

    @property
    def needs_final_checkpoint(self) -> bool:
        return self.ctx.checkpointing

    def close(self) -> None:
        """Not finished (failed or cancelled): drop the parts of this attempt after its last
        checkpoint (pending ones stay: a restored attempt commits or deletes them)."""
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


class _LineWriter:
    """Writes a batch's first column as lines of UTF-8 text."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh

    def write_batch(self, batch: pa.RecordBatch) -> None:
        lines = batch.column(0).to_pylist()
        self._fh.write(("\n".join("" if v is None else str(v) for v in lines) + "\n").encode())

    def close(self) -> None:
        pass


class TextSink(_StagedFileSink):
    """Text files, one line per row (its one column: ``sink_to_text``), committed as the other
    file sinks are (two-phase, exactly once)."""

    kind = "text_sink"
    extension = ""

    def __init__(self, path: str, name: str | None = None, roll_size_bytes: int | None = None,
                 suffix: str = "") -> None:
        super().__init__(path, name, roll_size_bytes=roll_size_bytes)
        self.extension = suffix

    def _new_writer(self, fh: Any, schema: pa.Schema) -> Any:
        if len(schema) != 1:
            raise SchemaMismatchError(f"sink '{self.name}' writes one column as lines; its rows have {schema.names}")
        return _LineWriter(fh)


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
