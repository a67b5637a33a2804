"""The working parts of ``HashJoin`` (hash_join.py): one run of the join at one level of
partitioning (``JoinRun``), a side's rows in managed memory or spilled by partition (``Side``),
and the emitter of joined rows (``Emitter``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from yarnflow.worker.memory.manager import MemoryBudget
from yarnflow.worker.memory.spill import SpillFile, SpillFiles, SpillWriter
from yarnflow.worker.operators.batch.join_index import JoinIndex, JoinLayout, Matches
from yarnflow.worker.operators.batch.tables import FANOUT, cast_keys, concat, partition_ids, split_by_partition

if TYPE_CHECKING:
    from yarnflow.worker.operators.batch.hash_join import HashJoin

log = logging.getLogger("yarnflow.worker.operators.batch.hash_join")  # the join's lines, one logger

#: index memory per build row (positions and codes, numpy int64), on top of the rows' own bytes
INDEX_BYTES_PER_ROW = 24
#: levels of re-partitioning before a partition that will not shrink is joined block by block
MAX_LEVEL = 6


class Emitter:
    """Turns matched positions into output batches of at most ``batch_size`` rows (through the
    layout, or through the user's join function)."""

    def __init__(self, layout: JoinLayout, build_is_left: bool, batch_size: int,
                 emit: Callable[[pa.RecordBatch], None], join_fn: Callable[..., Any] | None,
                 call_rows: Callable[[Callable[..., Any], list[Any], list[Any]], list[dict[str, Any]]]) -> None:
        self.layout = layout
        self.build_is_left = build_is_left
        self.batch_size = batch_size
        self._emit = emit
        self._join_fn = join_fn
        self._call_rows = call_rows

    def pairs(self, probe: pa.Table | pa.RecordBatch | None, probe_idx: np.ndarray | None,
              build: pa.Table | pa.RecordBatch | None, build_idx: np.ndarray | None) -> None:
        """Emit rows made of ``probe[probe_idx]`` and ``build[build_idx]`` (-1 or None: no row)."""
        n = len(probe_idx) if probe_idx is not None else len(build_idx)  # type: ignore[arg-type]
        for lo in range(0, n, self.batch_size):
            pi = None if probe_idx is None else probe_idx[lo:lo + self.batch_size]
            bi = None if build_idx is None else build_idx[lo:lo + self.batch_size]
            if self.build_is_left:
                left, li, right, ri = build, bi, probe, pi
            else:
                left, li, right, ri = probe, pi, build, bi
            if self._join_fn is None:
                out = self.layout.assemble(left, li, right, ri)
            else:
                rows = self._call_rows(self._join_fn, rows_at(left, li), rows_at(right, ri))
                if not rows:
                    continue
                out = pa.RecordBatch.from_pylist(rows)
            if out.num_rows:
                self._emit(out)


def rows_at(table: pa.Table | pa.RecordBatch | None, idx: np.ndarray | None) -> list[Any]:
    """Row dicts of ``table`` at ``idx`` (None where the index is -1 or the side is missing)."""
    if idx is None:
        return []
    if table is None:
        return [None] * len(idx)
    present = idx >= 0
    taken = table.take(pa.array(np.where(present, idx, 0))).to_pylist() if len(idx) else []
    return [r if ok else None for r, ok in zip(taken, present.tolist())]


class Side:
    """Rows of one side of one join run: in memory (reserved in the budget) until they do not
    fit, then split into ``FANOUT`` partitions, of which the largest are spilled until the rest
    fits. ``keys`` are the side's key columns, ``types`` what they are compared as."""

    def __init__(self, run: JoinRun, keys: list[str], name: str) -> None:
        self._run = run
        self.keys = keys
        self.name = name
        self.batches: list[pa.RecordBatch | pa.Table] = []  # not partitioned: everything
        self.parts: list[list[pa.Table]] | None = None  # partitioned: the in-memory rows of each
        self.part_bytes = [0] * FANOUT
        self.writers: dict[int, SpillWriter] = {}
        self.rows = 0
        self.held = 0  # bytes reserved

    def _reserve(self, nbytes: int) -> bool:
        if self._run.budget.try_reserve(nbytes):
            self.held += nbytes
            return True
        return False

    def release(self) -> None:
        self._run.budget.release(self.held)
        self.held = 0

    def add(self, data: pa.RecordBatch | pa.Table) -> None:
        self.rows += data.num_rows
        cost = data.nbytes + INDEX_BYTES_PER_ROW * data.num_rows
        if self.parts is None:
            if self._reserve(cost):
                self.batches.append(data)
                return
            self._partition()
        assert self.parts is not None
        for p, rows in split_by_partition(data, self._run.partitions_of(data, self.keys)):
            self._add_part(p, rows)

    def _partition(self) -> None:
        """Memory ran out: split what is held into partitions and spill the largest."""
        log.info("%s: %s side does not fit in %.1f MB of managed memory at level %d: spilling partitions",
                 self._run.op_name, self.name, self._run.budget.limit / 2**20, self._run.level)
        held, self.batches = self.batches, []
        self.parts = [[] for _ in range(FANOUT)]
        self.release()
        for data in held:
            for p, rows in split_by_partition(data, self._run.partitions_of(data, self.keys)):
                self._add_part(p, rows)

    def _add_part(self, p: int, rows: pa.Table) -> None:
        assert self.parts is not None
        if p in self.writers:
            self.writers[p].write(rows)
            return
        cost = rows.nbytes + INDEX_BYTES_PER_ROW * rows.num_rows
        while not self._reserve(cost):
            if not self._spill_largest(also=p):
                self._writer(p).write(rows)
                return
            if p in self.writers:
                self.writers[p].write(rows)
                return
        self.parts[p].append(rows)
        self.part_bytes[p] += cost

    def _writer(self, p: int) -> SpillWriter:
        w = self.writers.get(p)
        if w is None:
            w = self.writers[p] = self._run.spill.writer(f"{self._run.op_name}-{self.name}-L{self._run.level}-p{p}")
        return w

    def _spill_largest(self, also: int) -> bool:
        """Spill the in-memory partition holding the most (``also`` counts the rows about to be
        added to it); False when none is left in memory."""
        assert self.parts is not None
        candidates = [p for p in range(FANOUT) if p not in self.writers and (self.parts[p] or p == also)]
        if not candidates:
            return False
        p = max(candidates, key=lambda q: self.part_bytes[q] + (1 if q == also else 0))
        w = self._writer(p)
        for rows in self.parts[p]:
            w.write(rows)
        self.parts[p] = []
        self._run.budget.release(self.part_bytes[p])
        self.held -= self.part_bytes[p]
        self.part_bytes[p] = 0
        return True

    @property
    def spilled(self) -> bool:
        return bool(self.writers)

    def in_memory(self) -> pa.Table | None:
        """The rows held in memory, as one table (the non-spilled partitions when partitioned)."""
        if self.parts is None:
            return concat(self.batches)
        return concat([t for p, ts in enumerate(self.parts) if p not in self.writers for t in ts])

    def spilled_partitions(self) -> set[int]:
        return set(self.writers)

    def close_spills(self) -> dict[int, SpillFile]:
        files = {p: w.close() for p, w in self.writers.items()}
        self.writers = {}
        return files


class JoinRun:
    """One hash join of a build side and a probe side (the operator's, or one spilled partition
    pair at ``level`` > 0): build, then probe, then the spilled partitions recursively."""

    def __init__(self, op: HashJoin, level: int) -> None:
        self.op = op
        self.op_name = op.name
        self.level = level
        self.budget: MemoryBudget = op.ctx.memory
        self.spill: SpillFiles = op.ctx.spill
        self.build = Side(self, op.build_keys, "build")
        self.types: list[pa.DataType] | None = None
        self.index: JoinIndex | None = None
        self.table: pa.Table | None = None  # the in-memory build rows the index is over
        self._build_matched: np.ndarray | None = None
        self._chunk: list[pa.RecordBatch | pa.Table] = []
        self._chunk_rows = 0
        self._chunk_held = 0
        self._probe_spills: dict[int, SpillWriter] = {}
        self._spilled_build: set[int] = set()
        self._index_held = 0  # the index's array lookup, reserved beside the build rows

    # -- keys ------------------------------------------------------------------------------
    def key_types(self, probe_schema: pa.Schema | None) -> list[pa.DataType]:
        """What the keys are compared as (known once both sides' schemas are; the build side's
        own types while the probe side's is not)."""
        if self.types is None:
            build_schema = self.op.build_schema
            if probe_schema is None or build_schema is None:
                return self.op.own_key_types(build_schema, probe_schema)
            self.types = self.op.compared_types(build_schema, probe_schema)
        return self.types

    def partitions_of(self, data: pa.RecordBatch | pa.Table, keys: list[str]) -> np.ndarray:
        return partition_ids(cast_keys(data, keys, self.key_types(self.op.probe_schema)), self.level)

    # -- build -----------------------------------------------------------------------------
    def add_build(self, data: pa.RecordBatch | pa.Table) -> None:
        if data.num_rows:
            self.build.add(data)

    def end_build(self) -> None:
        """The build side is complete: index the rows held in memory."""
        table = self.build.in_memory()
        self._spilled_build = self.build.spilled_partitions()
        if table is None:
            return
        if table.column(0).num_chunks > 1 and self.budget.try_reserve(table.nbytes):
            combined = table.combine_chunks()  # one chunk per column: takes are cheaper
            self.budget.release(table.nbytes)
            table = combined
        self.table = table
        keys = cast_keys(table, self.op.build_keys, self.key_types(self.op.probe_schema))
        self.index = JoinIndex(keys, dense_bytes=self.budget.available)
        if self.index.dense_bytes and not self.budget.try_reserve(self.index.dense_bytes):
            self.index = JoinIndex(keys, dense_bytes=0)  # the slot's other tasks took the room meanwhile
        self._index_held = self.index.dense_bytes
        if self.op.build_outer or self.op.build_semi_anti:
            self._build_matched = np.zeros(table.num_rows, dtype=bool)

    # -- probe -----------------------------------------------------------------------------
    def add_probe(self, data: pa.RecordBatch | pa.Table) -> None:
        if not data.num_rows:
            return
        if self._spilled_build:
            parts = self.partitions_of(data, self.op.probe_keys)
            keep = []
            for p, rows in split_by_partition(data, parts):
                if p in self._spilled_build:
                    self._probe_writer(p).write(rows)
                else:
                    keep.append(rows)
            data = concat(keep)  # type: ignore[assignment]
            if data is None:
                return
        # probe a batch as it comes, but gather small ones while a hash lookup's cost per call
        # (hashing the distinct keys) would outweigh its cost per row
        wanted = 4 * self.index.probe_rows if self.index is not None else 0
        if not self._chunk and data.num_rows >= wanted:
            self.probe_table(data if isinstance(data, pa.Table) else pa.Table.from_batches([data]))
            return  # a whole chunk at once: probed without holding it
        if not self.budget.try_reserve(data.nbytes):  # no room to gather a bigger chunk: probe what is there
            self._probe_chunk()
            self.probe_table(data if isinstance(data, pa.Table) else pa.Table.from_batches([data]))
            return
        self._chunk_held += data.nbytes
        self._chunk.append(data)
        self._chunk_rows += data.num_rows
        if self._chunk_rows >= wanted:
            self._probe_chunk()

    def _probe_writer(self, p: int) -> SpillWriter:
        w = self._probe_spills.get(p)
        if w is None:
            w = self._probe_spills[p] = self.spill.writer(f"{self.op_name}-probe-L{self.level}-p{p}")
        return w

    def _probe_chunk(self) -> None:
        chunk = concat(self._chunk)
        self._chunk, self._chunk_rows = [], 0
        if chunk is not None:
            self.probe_table(chunk.combine_chunks() if chunk.column(0).num_chunks > 1 else chunk)
        self.budget.release(self._chunk_held)
        self._chunk_held = 0

    def probe_table(self, chunk: pa.Table) -> np.ndarray | None:
        """Join one chunk of probe rows with the in-memory build rows and emit the result; returns
        the chunk's per-row matched flags when the caller keeps them (nested loop)."""
        op = self.op
        if self.index is None:
            matches = Matches(np.zeros(0, np.int64), np.zeros(0, np.int64))
        else:
            matches = self.index.probe(cast_keys(chunk, op.probe_keys, self.key_types(chunk.schema)))
        if self._build_matched is not None and len(matches):
            self._build_matched[matches.build] = True
        return op.emit_probe_result(chunk, self.table, matches)

    def finish(self) -> None:
        """The probe side has ended: flush, emit the build side's unmatched (or matched, for a
        semi join with the left side built) rows, then join the spilled partitions."""
        self._probe_chunk()
        self._emit_build_leftovers()
        self.release()
        build_files = self.build.close_spills()
        probe_files = {p: w.close() for p, w in self._probe_spills.items()}
        self._probe_spills = {}
        for p in sorted(build_files):  # probe rows went to spill files only for spilled build partitions
            self.op.join_partition(build_files[p], probe_files.get(p), self.level + 1)

    def _emit_build_leftovers(self) -> None:
        op = self.op
        if self._build_matched is None or self.table is None:
            return
        wanted = self._build_matched if op.how == "left_semi" else ~self._build_matched
        rows = np.flatnonzero(wanted)
        if len(rows):
            op.layout_emitter().pairs(None, None, self.table, rows)
        self._build_matched = None

    def release(self) -> None:
        self.build.release()
        self.budget.release(self._index_held)
        self._index_held = 0
        self.table = None
        self.index = None
        self.budget.release(self._chunk_held)
        self._chunk_held = 0

    def abort(self) -> None:
        self.release()
        for f in self.build.close_spills().values():
            f.delete()
        for w in self._probe_spills.values():
            w.abort()
        self._probe_spills = {}
