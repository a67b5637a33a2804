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
from yarnflow.worker.memory.spill import SpillFile, SpillWriter
from yarnflow.worker.operators.base import Output, RuntimeContext, TwoInputOperator
from yarnflow.worker.operators.batch.hash_join_run import INDEX_BYTES_PER_ROW, MAX_LEVEL, Emitter, JoinRun
from yarnflow.worker.operators.batch.join_index import JOIN_TYPES, JoinIndex, JoinLayout, Matches
from yarnflow.worker.operators.batch.tables import (
    cast_keys,
    common_key_types,
    concat,
)

log = logging.getLogger(__name__)

__all__ = ["HashJoin", "JOIN_TYPES"]

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
        self._run: JoinRun | None = None
        self.emitter: Emitter | None = None  # type: ignore[assignment]

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

    def _current(self) -> JoinRun:
        if self._run is None:
            self._run = JoinRun(self, 0)
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

    def layout_emitter(self) -> Emitter:
        if self.emitter is None:
            left = self.build_schema if self.build_is_left else self.probe_schema
            right = self.probe_schema if self.build_is_left else self.build_schema
            if left is None:  # no left rows at all: only right/full outer joins output anything
                left = pa.schema([pa.field(k, t) for k, t in zip(self.left_keys, self._current().key_types(right))])
            self.emitter = Emitter(JoinLayout(left, right, self.left_keys, self.right_keys, self.how),
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
            if level > MAX_LEVEL or (level > 1 and self._one_key(build)):
                self._nested_loop(build, probe)
                return
            run = JoinRun(self, level)
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
            held = block.nbytes + INDEX_BYTES_PER_ROW * block.num_rows
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
