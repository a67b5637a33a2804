"""Keyed aggregation (sum, min, max, count) of bounded inputs in a managed-memory budget, and the
local pre-aggregation that runs before the keyed exchange.

Rows are first made *partial aggregates*: the key columns and one column per aggregate, typed as
the result (a row's own value for sum, min and max, 1 for a count). Partials of one key combine
(sum of sums, min of mins, sum of counts), so rows, compacted partials and partials from other
subtasks are all aggregated alike: one Arrow group-by (``Table.group_by``) over what is held.

``HashAggregation`` holds partials in its budget and compacts them (a group-by) when they fill
a third of it. When compacting does not bring them under a quarter of the budget (many distinct
keys), the compacted partials are split into ``FANOUT`` partitions by key hash and written to
spill files, and the budget is free again; at the end each partition is read back and aggregated
on its own (a partition still too large for the budget is split again with the next bits of the
hash). A key's partials always land in one partition, so each partition's result is final.

``LocalKeyedAggregate`` (chained before the hash exchange of a ``key_by().sum()``): compacts its
input in its budget and emits partials, so far fewer rows cross the exchange when keys repeat;
when compacting does not halve the rows (nearly every key distinct) it stops compacting and only
converts rows to partials. In STREAMING it is Flink's mini-batch local aggregation: it holds what
it holds in BATCH for at most ``execution.buffer-timeout``, and flushes before every watermark and
checkpoint barrier, so it has nothing to snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from yarnflow.common.config import Options
from yarnflow.common.config_types import parse_duration_ms
from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.memory.manager import MemoryBudget
from yarnflow.worker.memory.spill import SpillFile, SpillFiles, SpillWriter
from yarnflow.worker.operators.base import Operator, Output, RuntimeContext
from yarnflow.worker.operators.batch.tables import FANOUT, concat, partition_ids, slices, split_by_partition

log = logging.getLogger(__name__)

__all__ = ["AGG_FUNCS", "HashAggregation", "LocalKeyedAggregate", "PartialSchema", "output_names"]

AGG_FUNCS = ("sum", "min", "max", "count")
COMBINE = {"sum": "sum", "min": "min", "max": "max", "count": "sum"}
#: levels of re-partitioning before a partition is aggregated whatever its size
_MAX_LEVEL = 8
#: partials are compacted (or spilled) when they hold a third of the budget: a group-by needs
#: about twice its input again for its hash table and result
_HOLD = 3
#: a spilled partition is aggregated at once when it and twice as much again fit in the budget
_MARGIN = 2.0
#: the first compaction comes after this many rows (or a third of the budget, if sooner): a
#: cheap trial that tells whether the keys repeat enough for compacting to pay
_TRIAL_ROWS = 1 << 18
#: STREAMING: after this many batches in a row whose keys barely repeat, rows go on as they are


def output_names(keys: Sequence[str], aggs: Sequence[tuple[str, str]]) -> list[str]:
    """Output column per aggregate: the column's own name (``sum("count")`` stays "count"),
    "count" for a count, and ``<col>_<fn>`` where two aggregates, or an aggregate and a key,
    would share a name."""
    plain = ["count" if fn == "count" else col for col, fn in aggs]
    return [n if plain.count(n) == 1 and n not in keys else f"{col}_{fn}" for n, (col, fn) in zip(plain, aggs)]


class PartialSchema:
    """How input rows become partial aggregates, and how partials combine."""

    def __init__(self, keys: Sequence[str], aggs: Sequence[tuple[str, str]], op_name: str) -> None:
        for _, fn in aggs:
            if fn not in AGG_FUNCS:
                raise JobDefinitionError(f"unknown aggregate {fn!r}: expected one of {AGG_FUNCS}")
        self.keys = list(keys)
        self.aggs = list(aggs)
        self.names = output_names(keys, aggs)
        self.op_name = op_name
        self.schema: pa.Schema | None = None  # of the partials, known from the first rows

    def _learn(self, table: pa.Table) -> None:
        for what, columns in (("key column", self.keys), ("column", [c for c, _ in self.aggs])):
            missing = [c for c in columns if table.schema.get_field_index(c) < 0]
            if missing:
                raise JobDefinitionError(f"operator '{self.op_name}': {what} {missing[0]!r} does not exist; "
                                         f"the input has columns {table.schema.names}")
        specs = [(c, f, pc.CountOptions(mode="all")) if f == "count" else (c, f) for c, f in self.aggs]
        empty = table.slice(0, 0).group_by(self.keys, use_threads=False).aggregate(specs)
        fields = [pa.field(k, table.schema.field(k).type) for k in self.keys]
        fields += [pa.field(n, empty.schema.field(f"{c}_{f}").type) for n, (c, f) in zip(self.names, self.aggs)]
        self.schema = pa.schema(fields)

    def from_rows(self, data: pa.RecordBatch | pa.Table) -> pa.Table:
        """Input rows as partials: one per row (no group-by)."""
        table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
        if self.schema is None:
            self._learn(table)
        assert self.schema is not None
        cols: list[Any] = []
        for k, field in zip(self.keys, self.schema):
            cols.append(_as(table.column(k), field.type))
        for field, (col, fn) in zip(list(self.schema)[len(self.keys):], self.aggs):
            if fn == "count":  # counts rows, also those whose counted column is null
                cols.append(pa.array(np.ones(table.num_rows, dtype=np.int64)))
            else:
                cols.append(_as(table.column(col), field.type))
        return pa.Table.from_arrays(cols, schema=self.schema)

    def combine(self, table: pa.Table) -> pa.Table:
        """Partials of ``table`` combined: one row per key."""
        assert self.schema is not None
        specs = [(n, COMBINE[fn]) for n, (_, fn) in zip(self.names, self.aggs)]
        grouped = table.group_by(self.keys, use_threads=False).aggregate(specs)
        cols = [_as(grouped.column(k), f.type) for k, f in zip(self.keys, self.schema)]
        cols += [_as(grouped.column(f"{n}_{fn}"), f.type)
                 for (n, fn), f in zip(specs, list(self.schema)[len(self.keys):])]
        return pa.Table.from_arrays(cols, schema=self.schema)


def _as(col: Any, t: pa.DataType) -> Any:
    return col if col.type.equals(t) else col.cast(t)


class HashAggregation:
    """Partials of one subtask's keys, aggregated in ``budget`` and spilled by key hash when they
    do not fit (see the module docstring)."""

    def __init__(self, partials: PartialSchema, budget: MemoryBudget, spill: SpillFiles, name: str,
                 level: int = 0) -> None:
        self.partials = partials
        self.budget = budget
        self.spill = spill
        self.name = name
        self.level = level
        self._held: list[pa.Table] = []
        self._held_bytes = 0
        self._reserved = 0
        self._writers: list[SpillWriter] | None = None
        self._compacting = True
        self._tried = False  # the first compaction comes early, to learn whether keys repeat
        self._streaming_misses = 0
        self._held_rows = 0

    def _reserve(self, nbytes: int) -> bool:
        if self.budget.try_reserve(nbytes):
            self._reserved += nbytes
            return True
        return False

    def release(self) -> None:
        self.budget.release(self._reserved)
        self._reserved = 0

    def add_rows(self, data: pa.RecordBatch | pa.Table) -> None:
        if data.num_rows:
            self.add_partials(self.partials.from_rows(data))

    def add_partials(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        trial = not self._tried and self._held_rows >= _TRIAL_ROWS
        if trial or self._held_bytes + table.nbytes > self.budget.limit // _HOLD or not self._reserve(table.nbytes):
            self._tried = True
            if self._compacting:
                self._compact()
            else:
                self._spill_held()
            if not self._reserve(table.nbytes):
                self._spill_held()
                self._spill([table])
                return
        self._held.append(table)
        self._held_bytes += table.nbytes
        self._held_rows += table.num_rows

    def _compact(self) -> None:
        """Aggregate what is held; spill it when that leaves more than a quarter of the budget.
        When aggregating does not shrink the rows (nearly every key distinct), later rounds
        spill what is held as it is: the partitions are aggregated at the end anyway."""
        table = concat(self._held)
        self._held, self._held_bytes, self._held_rows = [], 0, 0
        self.release()
        if table is None:
            return
        combined = self.partials.combine(table)
        if combined.num_rows > 0.8 * table.num_rows:
            self._compacting = False
        del table
        if self._writers is None and combined.nbytes <= self.budget.limit // 4 and self._reserve(combined.nbytes):
            self._held, self._held_bytes, self._held_rows = [combined], combined.nbytes, combined.num_rows
            return
        self._spill([combined])

    def _spill_held(self) -> None:
        held, self._held, self._held_bytes, self._held_rows = self._held, [], 0, 0
        self.release()
        if held:
            self._spill(held)

    def _spill(self, tables: list[pa.Table]) -> None:
        if self._writers is None:
            log.info("%s: keys do not fit in %.1f MB of managed memory at level %d: spilling partitions",
                     self.name, self.budget.limit / 2**20, self.level)
            self._writers = [self.spill.writer(f"{self.name}-agg-L{self.level}-p{p}") for p in range(FANOUT)]
        for table in tables:
            keys = [table.column(k) for k in self.partials.keys]
            for p, rows in split_by_partition(table, partition_ids(keys, self.level)):
                self._writers[p].write(rows)

    def snapshot(self) -> pa.Table | None:
        """Every key's aggregates so far (a savepoint of a BATCH job), when nothing was spilled."""
        if self._writers is not None:
            raise RuntimeError(f"{self.name}: its keys were spilled to disk; a BATCH aggregation that spilled "
                               "cannot be snapshotted")
        self._compact()
        return concat(self._held)

    def results(self, batch_size: int) -> Iterator[pa.RecordBatch]:
        """Every key's final aggregates, in batches of at most ``batch_size`` rows (call once,
        after the last input)."""
        if self._writers is None:
            table = concat(self._held)
            self._held, self._held_bytes, self._held_rows = [], 0, 0
            result = self.partials.combine(table) if table is not None else None
            del table
            self.release()
            if result is not None:
                yield from slices(result, batch_size)
            return
        self._spill_held()
        files = [w.close() for w in self._writers]
        self._writers = None
        try:
            for f in files:
                yield from self._partition(f, batch_size)
                f.delete()
        finally:
            for f in files:
                f.delete()

    def _partition(self, f: SpillFile, batch_size: int) -> Iterator[pa.RecordBatch]:
        """One spilled partition's final aggregates: at once when it fits, else split again."""
        if not f.num_rows:
            return
        if self.budget.fits(f.nbytes, margin=_MARGIN) or self.level >= _MAX_LEVEL:
            self.budget.reserve(min(f.nbytes, self.budget.limit), "a spilled partition")
            try:
                table = f.read_all()
                result = self.partials.combine(table) if table is not None else None
                del table
            finally:
                self.budget.release(min(f.nbytes, self.budget.limit))
            if result is not None:
                yield from slices(result, batch_size)
            return
        child = HashAggregation(self.partials, self.budget, self.spill, self.name, self.level + 1)
        try:
            for batch in f.read():
                child.add_partials(pa.Table.from_batches([batch]))
            yield from child.results(batch_size)
        finally:
            child.abort()

    def abort(self) -> None:
        self._held, self._held_bytes, self._held_rows = [], 0, 0
        self.release()
        if self._writers is not None:
            for w in self._writers:
                w.abort()
            self._writers = None


class LocalKeyedAggregate(Operator):
    """Pre-aggregation before the keyed exchange of a BATCH ``key_by().sum()`` (and min, max,
    count): emits partials (see the module docstring)."""

    kind = "local_keyed_aggregate"
    uses_managed_memory = True

    def __init__(self, keys: Sequence[str], aggs: Sequence[tuple[str, str]], name: str | None = None,
                 of: str = "") -> None:
        """``of``: the name of the aggregation it pre-aggregates for (its errors name that one)."""
        super().__init__(name)
        self.keys = list(keys)
        self.aggs = list(aggs)
        self.of = of or self.name

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        self._partials = PartialSchema(self.keys, self.aggs, self.of)
        self._held: list[pa.Table] = []
        self._held_rows = 0
        self._held_bytes = 0
        self._passthrough = False
        self._tried = False  # the first compaction comes early, to learn whether keys repeat
        #: compact when this much is held: a third of the budget (the group-by needs about twice
        #: as much again), at most 8 MB: its output goes on at once, more held gains little
        self._limit = min(ctx.memory.limit // _HOLD, 8 << 20)
        if not ctx.is_batch:  # STREAMING: what is held goes on at least this often (a mini-batch)
            self.processing_time_interval_ms = max(1, parse_duration_ms(
                ctx.config.get(Options.BUFFER_TIMEOUT.key) or "100 ms"))

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if not batch.num_rows:
            return
        partial = self._partials.from_rows(batch)
        if self._passthrough:
            self._emit(partial)
            return
        if self._held and (self._held_bytes + partial.nbytes > self._limit
                           or (not self._tried and self._held_rows >= _TRIAL_ROWS)):
            self._tried = True
            self._flush()
        if self._passthrough or not self.ctx.memory.try_reserve(partial.nbytes):
            self._emit(partial)
            return
        self._held.append(partial)
        self._held_rows += partial.num_rows
        self._held_bytes += partial.nbytes

    def _flush(self, final: bool = False) -> None:
        table = concat(self._held)
        rows = self._held_rows
        self._held, self._held_rows, self._held_bytes = [], 0, 0
        if table is None:
            return
        combined = self._partials.combine(table)
        del table
        self.ctx.memory.release_all()
        if not final and combined.num_rows * 2 > rows:
            log.info("%s: pre-aggregating %d rows gave %d: the keys barely repeat, rows go on without it",
                     self.name, rows, combined.num_rows)
            self._passthrough = True
        self._emit(combined)

    def _emit(self, table: pa.Table) -> None:
        for batch in slices(table, self.ctx.batch_size):
            self.output.collect(batch)

    def finish(self) -> None:
        self._flush(final=True)

    # STREAMING (Flink's mini-batch local aggregation): partials are held for at most
    # ``execution.buffer-timeout`` and never across a watermark or a checkpoint barrier, so the
    # operator has no state of its own in any checkpoint
    def on_processing_time(self, now_ms: int) -> None:
        self._flush_mini_batch()

    def process_watermark(self, watermark: Any, input_index: int = 0) -> None:
        self._flush_mini_batch()
        super().process_watermark(watermark, input_index)

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        self._flush_mini_batch()

    def _flush_mini_batch(self) -> None:
        if self._held:  # (enough rows to tell whether keys repeat: it may stop pre-aggregating)
            self._flush(final=self._held_rows < _TRIAL_ROWS // 4)

    def close(self) -> None:
        self._held = []
        self.ctx.memory.release_all()
