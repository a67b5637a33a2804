"""The hybrid hash join of two bounded inputs (``a.join(b).where(...).equal_to(...)`` without a
window, BATCH jobs): the build side is read completely first, then the probe side streams
through it, batch by batch, and the output is emitted as it is produced.

Build first (Flink's ``InputSelectable``): the task asks ``input_selection`` which input to read
next, and reads only the build input's channels until they end; the probe input waits in its
blocking partitions. The build side is either the right input (the default) or the left one,
as the compiler chose (the smaller by the sources' statistics, or a hint); with a broadcast
join every subtask builds the whole small side and probes its own share of the big one.

Memory: build rows are kept in the operator's managed-memory budget. When they do not fit, the
build side is split into ``FANOUT`` partitions by hash; partitions are written to spill files,
largest first, until the rest fits (hybrid hash join). Probe rows of a partition kept in memory
join at once; those of a spilled partition are written to that partition's probe file. When the
probe side has ended, each spilled partition is joined the same way, one after another, with
the next bits of the hash (recursively); a partition that does not get smaller when split (one
key with most of the rows) is joined block by block instead: as many build rows as fit, each
block against the whole probe file (block nested loop), so no key is too large to join.

Join types: inner, left / right / full outer, left semi and left anti. Output columns: the left
input's, then the right input's without its join keys (a name the left has too gets the suffix
``_right``); semi and anti joins output left rows only. With a ``join_fn`` each joined pair is
handed to it as two row dicts (None for a side without a match) and its dicts are the output.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.memory.manager import MemoryBudget
from yarnflow.worker.memory.spill import SpillFile, SpillFiles, SpillWriter
from yarnflow.worker.operators.base import Output, RuntimeContext, TwoInputOperator
from yarnflow.worker.operators.batch.join_index import JOIN_TYPES, JoinIndex, JoinLayout, Matches
from yarnflow.worker.operators.batch.tables import (
    FANOUT,
    cast_keys,
    common_key_types,
    concat,
    partition_ids,
    split_by_partition,
)

log = logging.getLogger(__name__)

__all__ = ["HashJoin", "JOIN_TYPES"]

#: index memory per build row (positions and codes, numpy int64), on top of the rows' own bytes
_INDEX_BYTES_PER_ROW = 24
#: levels of re-partitioning before a partition that will not shrink is joined block by block
_MAX_LEVEL = 6


class _Emitter:
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
                rows = self._call_rows(self._join_fn, _rows(left, li), _rows(right, ri))
                if not rows:
                    continue
                out = pa.RecordBatch.from_pylist(rows)
            if out.num_rows:
                self._emit(out)


def _rows(table: pa.Table | pa.RecordBatch | None, idx: np.ndarray | None) -> list[Any]:
    """Row dicts of ``table`` at ``idx`` (None where the index is -1 or the side is missing)."""
    if idx is None:
        return []
    if table is None:
        return [None] * len(idx)
    present = idx >= 0
    taken = table.take(pa.array(np.where(present, idx, 0))).to_pylist() if len(idx) else []
    return [r if ok else None for r, ok in zip(taken, present.tolist())]


class _Side:
    """Rows of one side of one join run: in memory (reserved in the budget) until they do not
    fit, then split into ``FANOUT`` partitions, of which the largest are spilled until the rest
    fits. ``keys`` are the side's key columns, ``types`` what they are compared as."""

    def __init__(self, run: _JoinRun, keys: list[str], name: str) -> None:
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
        cost = data.nbytes + _INDEX_BYTES_PER_ROW * data.num_rows
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
        cost = rows.nbytes + _INDEX_BYTES_PER_ROW * rows.num_rows
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


class _JoinRun:
    """One hash join of a build side and a probe side (the operator's, or one spilled partition
    pair at ``level`` > 0): build, then probe, then the spilled partitions recursively."""

    def __init__(self, op: HashJoin, level: int) -> None:
        self.op = op
        self.op_name = op.name
        self.level = level
        self.budget: MemoryBudget = op.ctx.memory
        self.spill: SpillFiles = op.ctx.spill
        self.build = _Side(self, op.build_keys, "build")
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


class HashJoin(TwoInputOperator):
    """A hybrid hash join; ``build_input`` (0: left, 1: right) is read first and held."""

    kind = "join"
    batch_only = True
    uses_managed_memory = True

    def __init__(self, left_keys: list[str], right_keys: list[str], how: str = "inner",
                 join_fn: Callable[[dict[str, Any] | None, dict[str, Any] | None], dict[str, Any]] | None = None,
                 build_input: int = 1, name: str | None = None, uid: str | None = None) -> None:
        super().__init__(name, uid)
        if how not in JOIN_TYPES:
            raise ValueError(f"join type {how!r}: use one of inner, left_outer, right_outer, full_outer, "
                             "left_semi, left_anti")
        if not left_keys or len(left_keys) != len(right_keys):
            raise ValueError("a join needs as many left keys as right keys, at least one")
        self.left_keys, self.right_keys = list(left_keys), list(right_keys)
        self.how = JOIN_TYPES[how]
        if join_fn is not None and self.how in ("left_semi", "left_anti"):
            raise ValueError(f"a {self.how} join has no pairs to hand to a join function")
        if build_input not in (0, 1):
            raise ValueError("build_input is 0 (the left input) or 1 (the right input)")
        self.join_fn = join_fn
        self.build_input = build_input

    # -- which side is which -----------------------------------------------------------------
    @property
    def build_is_left(self) -> bool:
        return self.build_input == 0

    @property
    def build_keys(self) -> list[str]:
        return self.left_keys if self.build_is_left else self.right_keys

    @property
    def probe_keys(self) -> list[str]:
        return self.right_keys if self.build_is_left else self.left_keys

    @property
    def build_outer(self) -> bool:
        """Unmatched build rows are output too."""
        return self.how == "full_outer" or self.how == ("left_outer" if self.build_is_left else "right_outer")

    @property
    def probe_outer(self) -> bool:
        return self.how == "full_outer" or self.how == ("right_outer" if self.build_is_left else "left_outer")

    @property
    def build_semi_anti(self) -> bool:
        """A semi or anti join whose output rows (the left ones) are the build rows."""
        return self.build_is_left and self.how in ("left_semi", "left_anti")

    def compared_types(self, build_schema: pa.Schema, probe_schema: pa.Schema) -> list[pa.DataType]:
        """What each pair of key columns is compared as (see ``common_key_types``)."""
        if self.build_is_left:
            return common_key_types(build_schema, probe_schema, self.build_keys, self.probe_keys,
                                    f"join '{self.name}'")
        return common_key_types(probe_schema, build_schema, self.probe_keys, self.build_keys, f"join '{self.name}'")

    def own_key_types(self, build_schema: pa.Schema | None, probe_schema: pa.Schema | None) -> list[pa.DataType]:
        """The key types of whichever side's schema is known (the other side has no rows)."""
        if build_schema is not None:
            return [build_schema.field(k).type for k in self.build_keys]
        assert probe_schema is not None
        return [probe_schema.field(k).type for k in self.probe_keys]

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        self.build_schema: pa.Schema | None = None
        self.probe_schema: pa.Schema | None = None
        self._build_ended = False
        self._finished = False
        self._early: SpillWriter | None = None  # probe rows that came before the build side ended
        self._run: _JoinRun | None = None
        self.emitter: _Emitter | None = None  # type: ignore[assignment]

    def input_selection(self) -> int | None:
        """The input the task should read next: the build side until it has ended."""
        return None if self._build_ended else self.build_input

    # -- input -------------------------------------------------------------------------------
    def _check(self, schema: pa.Schema, keys: list[str], side: str) -> None:
        missing = [k for k in keys if schema.get_field_index(k) < 0]
        if missing:
            raise JobDefinitionError(f"join '{self.name}': the {side} input has no column {missing[0]!r} "
                                     f"(it has {schema.names})")

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if not batch.num_rows:
            return
        side = "left" if input_index == 0 else "right"
        if input_index == self.build_input:
            if self.build_schema is None:
                self._check(batch.schema, self.build_keys, side)
                self.build_schema = batch.schema
                if self.probe_schema is not None:
                    self._current().key_types(self.probe_schema)  # comparable keys, or a clear error now
            if self._build_ended:
                raise RuntimeError(f"join '{self.name}': build rows after the build input ended")
            self._current().add_build(batch)
            return
        if self.probe_schema is None:
            self._check(batch.schema, self.probe_keys, side)
            self.probe_schema = batch.schema
            if self.build_schema is not None:
                self._current().key_types(self.probe_schema)
        if not self._build_ended:  # no input selection (a test harness): keep them for later
            if self._early is None:
                self._early = self.ctx.spill.writer(f"{self.name}-early-probe")
            self._early.write(batch)
            return
        self._probe(batch)

    def _current(self) -> _JoinRun:
        if self._run is None:
            self._run = _JoinRun(self, 0)
        return self._run

    def end_input(self, input_index: int = 0) -> None:
        super().end_input(input_index)
        if input_index == self.build_input:
            self._end_build()

    def _end_build(self) -> None:
        if self._build_ended:
            return
        self._build_ended = True
        run = self._current()
        run.end_build()
        if self._early is not None:
            early, self._early = self._early.close(), None
            try:
                for batch in early.read():
                    self._probe(batch)
            finally:
                early.delete()

    def layout_emitter(self) -> _Emitter:
        if self.emitter is None:
            left = self.build_schema if self.build_is_left else self.probe_schema
            right = self.probe_schema if self.build_is_left else self.build_schema
            if left is None:  # no left rows at all: only right/full outer joins output anything
                left = pa.schema([pa.field(k, t) for k, t in zip(self.left_keys, self._current().key_types(right))])
            self.emitter = _Emitter(JoinLayout(left, right, self.left_keys, self.right_keys, self.how),
                                    self.build_is_left, self.ctx.batch_size, self.output.collect, self.join_fn,
                                    self._call_rows)
        return self.emitter

    def _probe(self, batch: pa.RecordBatch | pa.Table) -> None:
        self.layout_emitter()
        assert self._run is not None
        self._run.add_probe(batch)

    def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._end_build()
        if self.probe_schema is None and self.build_schema is None:
            self._run = None
            return  # no rows on either side
        self.layout_emitter()
        assert self._run is not None
        run, self._run = self._run, None
        run.finish()

    def close(self) -> None:
        if self._run is not None:
            self._run.abort()
            self._run = None
        if self._early is not None:
            self._early.abort()
            self._early = None

    # -- output ------------------------------------------------------------------------------
    def emit_probe_result(self, chunk: pa.Table, build: pa.Table | None, m: Matches,
                          keep_flags: bool = False) -> np.ndarray | None:
        """Emit what one probed chunk gives: the pairs, and the probe rows the join type keeps
        without a match (or, for a semi / anti join, with or without one). With ``keep_flags``
        the caller gathers the per-row matched flags itself (nested loop) and gets them back;
        probe rows are then emitted only for pairs."""
        emitter = self.layout_emitter()
        how = self.how
        probe_output = how in ("left_semi", "left_anti") and not self.build_is_left
        if keep_flags or self.probe_outer or probe_output:
            matched = np.zeros(chunk.num_rows, dtype=bool)
            matched[m.probe] = True
        else:
            matched = None
        if keep_flags:
            if len(m) and not probe_output and not self.build_semi_anti:
                emitter.pairs(chunk, m.probe, build, m.build)
            return matched
        if probe_output:
            assert matched is not None
            rows = np.flatnonzero(matched if how == "left_semi" else ~matched)
            if len(rows):
                emitter.pairs(chunk, rows, None, None)
            return None
        if self.build_semi_anti:
            return None  # the build rows' flags decide, at the end
        if matched is not None:  # probe-side outer: pairs and unmatched rows, in probe-row order
            missing = np.flatnonzero(~matched)
            if len(missing):
                probe_idx = np.concatenate((m.probe, missing))
                build_idx = np.concatenate((m.build, np.full(len(missing), -1, np.int64)))
                order = np.argsort(probe_idx, kind="stable")
                emitter.pairs(chunk, probe_idx[order], build, build_idx[order])
                return None
        if len(m):
            emitter.pairs(chunk, m.probe, build, m.build)
        return None

    def join_chunk(self, probe: pa.Table | None, build: pa.Table | None) -> None:
        """Join in-memory ``probe`` and ``build`` rows that no other rows share keys with (a
        sort-merge join's range of keys): pairs, and the unmatched (or, for semi / anti joins,
        matched) rows of either side that the join type outputs."""
        if probe is not None and probe.num_rows:
            matches = Matches(np.zeros(0, np.int64), np.zeros(0, np.int64))
            if build is not None and build.num_rows:
                types = self.compared_types(build.schema, probe.schema)
                index = JoinIndex(cast_keys(build, self.build_keys, types), dense_bytes=0)
                matches = index.probe(cast_keys(probe, self.probe_keys, types))
            self.emit_probe_result(probe, build, matches)
        else:
            matches = Matches(np.zeros(0, np.int64), np.zeros(0, np.int64))
        if build is not None and build.num_rows and (self.build_outer or self.build_semi_anti):
            matched = np.zeros(build.num_rows, dtype=bool)
            matched[matches.build] = True
            rows = np.flatnonzero(matched if self.how == "left_semi" else ~matched)
            if len(rows):
                self.layout_emitter().pairs(None, None, build, rows)

    def emit_unmatched_probe(self, chunk: pa.Table, matched: np.ndarray) -> None:
        """After a nested loop: the probe rows its flags say the join type outputs."""
        how = self.how
        if how == "left_semi" and not self.build_is_left:
            rows = np.flatnonzero(matched)
        elif (how == "left_anti" and not self.build_is_left) or self.probe_outer:
            rows = np.flatnonzero(~matched)
        else:
            return
        if not len(rows):
            return
        if self.probe_outer:
            self.layout_emitter().pairs(chunk, rows, None, np.full(len(rows), -1, np.int64))
        else:
            self.layout_emitter().pairs(chunk, rows, None, None)

    def _call_rows(self, fn: Callable[..., Any], lrows: list[Any], rrows: list[Any]) -> list[dict[str, Any]]:
        n = max(len(lrows), len(rrows))
        lrows = lrows or [None] * n
        rrows = rrows or [None] * n
        out: list[dict[str, Any]] = []
        for lo, hi in self.row_slices(n):  # the join function is user code: a cancel stops it between slices
            for lrow, rrow in zip(lrows[lo:hi], rrows[lo:hi]):
                out.append(self.call_user(fn, lrow, rrow))
        return out

    # -- spilled partitions --------------------------------------------------------------------
    def join_partition(self, build: SpillFile, probe: SpillFile | None, level: int) -> None:
        """Join one spilled partition pair: as a join run of its own one level down, or, when
        splitting it again would not help, block by block."""
        try:
            if level > _MAX_LEVEL or (level > 1 and self._one_key(build)):
                self._nested_loop(build, probe)
                return
            run = _JoinRun(self, level)
            try:
                for batch in build.read():
                    run.add_build(batch)
                build.delete()
                run.end_build()
                if probe is not None:
                    for batch in probe.read():
                        run.add_probe(batch)
                    probe.delete()
                run.finish()
            except BaseException:
                run.abort()
                raise
        finally:
            build.delete()
            if probe is not None:
                probe.delete()

    def _one_key(self, build: SpillFile) -> bool:
        """Whether a spilled build partition holds a single key (no split can shrink it)."""
        first: Any = None
        for batch in build.read():
            keys = pa.table(cast_keys(batch, self.build_keys, [batch.schema.field(k).type for k in self.build_keys]),
                            names=[str(i) for i in range(len(self.build_keys))])
            distinct = keys.group_by(keys.column_names).aggregate([])
            if distinct.num_rows > 1:
                return False
            row = distinct.to_pylist()[0]
            if first is None:
                first = row
            elif row != first:
                return False
        return True

    def _nested_loop(self, build: SpillFile, probe: SpillFile | None) -> None:
        """Join a partition that splitting cannot shrink: the build rows a block at a time (as
        many as half the budget holds), each block against every probe row; the probe rows' and
        the block's matched flags decide the outer / semi / anti rows at the end."""
        budget = self.ctx.memory
        block_bytes = max(1, budget.limit // 3)
        log.info("%s: a spilled partition of %d build rows (%.1f MB) does not split: joining it block by block",
                 self.name, build.num_rows, build.nbytes / 2**20)
        probe_matched = np.zeros(probe.num_rows if probe is not None else 0, dtype=bool)
        for block in _blocks(build.read(), block_bytes):
            held = block.nbytes + _INDEX_BYTES_PER_ROW * block.num_rows
            budget.reserve(held, "one block of a nested-loop join")
            try:
                block_matched = np.zeros(block.num_rows, dtype=bool)
                index: JoinIndex | None = None
                offset = 0
                for chunk in (probe.read() if probe is not None else ()):
                    table = pa.Table.from_batches([chunk])
                    types = self.compared_types(block.schema, table.schema)
                    if index is None:
                        index = JoinIndex(cast_keys(block, self.build_keys, types), dense_bytes=0)
                    m = index.probe(cast_keys(table, self.probe_keys, types))
                    block_matched[m.build] = True
                    flags = self.emit_probe_result(table, block, m, keep_flags=True)
                    assert flags is not None
                    probe_matched[offset:offset + table.num_rows] |= flags
                    offset += table.num_rows
                if self.build_outer or self.build_semi_anti:
                    rows = np.flatnonzero(block_matched if self.how == "left_semi" else ~block_matched)
                    if len(rows):
                        self.layout_emitter().pairs(None, None, block, rows)
            finally:
                budget.release(held)
        if probe is not None and (self.probe_outer or (self.how in ("left_semi", "left_anti")
                                                       and not self.build_is_left)):
            offset = 0
            for chunk in probe.read():
                table = pa.Table.from_batches([chunk])
                self.emit_unmatched_probe(table, probe_matched[offset:offset + table.num_rows])
                offset += table.num_rows


def _blocks(batches: Iterator[pa.RecordBatch], block_bytes: int) -> Iterator[pa.Table]:
    """``batches`` gathered into tables of at most about ``block_bytes`` each (a batch larger
    than that is cut into slices)."""
    held: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        step = max(1, int(batch.num_rows * block_bytes / batch.nbytes)) if batch.nbytes > block_bytes else batch.num_rows
        for start in range(0, batch.num_rows, max(1, step)):
            piece = batch.slice(start, step)
            if held and size + piece.nbytes > block_bytes:
                yield _combined(held)
                held, size = [], 0
            held.append(piece)
            size += piece.nbytes
    if held:
        yield _combined(held)


def _combined(batches: list[pa.RecordBatch]) -> pa.Table:
    table = concat(batches)
    assert table is not None
    return table.combine_chunks()


def check_how(how: str) -> str:
    """The canonical name of join type ``how``; JobDefinitionError for an unknown one."""
    try:
        return JOIN_TYPES[how]
    except KeyError:
        raise JobDefinitionError(f"join type {how!r}: use one of inner, left_outer, right_outer, full_outer, "
                                 "left_semi (semi), left_anti (anti)") from None
