"""BATCH jobs: a keyed operator's input held in managed memory, split by key hash into spill
files when it does not fit, and the operator run on one partition of keys at a time.

A keyed ``reduce``, ``aggregate`` (AggregateFunction), ``process`` (KeyedProcessFunction),
event-time window or window join keeps state per key; with every key of a large input in memory at once, its
TaskExecutor would outgrow its container. In a BATCH job nothing is emitted before the input
ends, so its input can wait: ``SpillingKeyedInput`` holds the input batches in its budget and
hands them to the operator when the input has ended, in their order (the common case: they
fit). When they do not fit, every held and later batch is split into ``FANOUT`` partitions by
the hash of its keys and written to spill files; at the end each partition is read back and run
through a fresh copy of the operator (its own keyed state, timers, ``open`` and ``close``), one
partition after the other, so only one partition's keys are in memory at once. A key's rows all
land in one partition, in their input order, so each key sees exactly what it would have seen
(per-key order is all a keyed operator may rely on; the order between keys changes; a window
join gets a partition's left rows, then its right rows: its windows fire at the end of input,
when both are in). A partition still larger than the budget is split again with the next bits
of the hash.

Between the batches it replays, the wrapper gives the operator its processing-time callbacks
as the task would. Processing-time windows are not wrapped: they assign rows to windows by the
time they are processed, which waiting would change.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterable

import pyarrow as pa

from yarnflow.worker.memory.spill import SpillFile, SpillWriter
from yarnflow.worker.operators.base import Operator, Output, RuntimeContext
from yarnflow.worker.operators.batch.tables import FANOUT, partition_ids, split_by_partition
from yarnflow.worker.elements import MAX_WATERMARK, Watermark
from yarnflow.worker.state.tables import Snapshot

log = logging.getLogger(__name__)

__all__ = ["SpillingKeyedInput", "wants_spilling_input"]

_MAX_LEVEL = 8


def wants_spilling_input(op: Operator) -> bool:
    """Whether ``op`` is a keyed operator whose input a BATCH job holds in managed memory."""
    from yarnflow.worker.operators.keyed import KeyedReduce
    from yarnflow.worker.operators.process import KeyedAggregateFunctionOperator, KeyedProcessOperator
    from yarnflow.worker.operators.windows import WindowAggregateOperator, WindowJoinOperator

    if isinstance(op, WindowAggregateOperator):
        return op.assigner.is_event_time
    return isinstance(op, (KeyedReduce, KeyedAggregateFunctionOperator, KeyedProcessOperator, WindowJoinOperator))


class SpillingKeyedInput(Operator):
    """Wraps keyed operator ``inner`` (see the module docstring); takes its name and uid."""

    kind = "spilling_keyed_input"
    uses_managed_memory = True

    def __init__(self, inner: Operator) -> None:
        super().__init__(inner.name, inner.uid)
        self.inner = inner
        keys = inner.keys  # type: ignore[attr-defined]
        #: each input's key columns (a window join's two inputs have their own)
        self.keys_of: dict[int, list[str]] = ({i: list(k) for i, k in enumerate(keys)} if isinstance(keys, tuple)
                                              else {0: list(keys)})
        if getattr(inner, "user_uid", False):
            self.user_uid = True

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        self._pristine = copy.deepcopy(self.inner)  # for a fresh copy per spilled partition
        self.inner.setup(ctx, output)
        self._held: list[tuple[int, pa.RecordBatch]] = []
        self._held_bytes = 0
        self._writers: dict[int, list[SpillWriter]] | None = None
        self._watermark: Watermark | None = None
        self._restored = False
        self._inner_closed = False

    def open(self) -> None:
        self.inner.open()

    # -- input ---------------------------------------------------------------------------------
    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if not batch.num_rows:
            return
        if self._writers is None and (self.ctx.memory.try_reserve(batch.nbytes) or self._restored):
            self._held.append((input_index, batch))
            self._held_bytes += batch.nbytes if not self._restored else 0
            return
        if self._writers is None:
            log.info("%s: its input does not fit in %.1f MB of managed memory: spilling it by key hash, the "
                     "operator then runs once per partition", self.name, self.ctx.memory.limit / 2**20)
            self._writers = self._new_writers(0)
            held, self._held = self._held, []
            self.ctx.memory.release(self._held_bytes)
            self._held_bytes = 0
            for i, b in held:
                self._spill(i, b, self._writers, 0)
        self._spill(input_index, batch, self._writers, 0)

    def _new_writers(self, level: int) -> dict[int, list[SpillWriter]]:
        return {i: [self.ctx.spill.writer(f"{self.name}-input{i}-L{level}-p{p}") for p in range(FANOUT)]
                for i in self.keys_of}

    def _spill(self, input_index: int, batch: pa.RecordBatch, writers: dict[int, list[SpillWriter]],
               level: int) -> None:
        keys = [batch.column(k) for k in self.keys_of[input_index]]
        for p, rows in split_by_partition(batch, partition_ids(keys, level)):
            writers[input_index][p].write(rows)

    def process_watermark(self, watermark: Watermark, input_index: int = 0) -> None:
        # a bounded input's only watermark is the last (blocking exchanges keep none): given
        # to the operator after the rows, when they are replayed
        if self._watermark is None or watermark.timestamp > self._watermark.timestamp:
            self._watermark = watermark

    # -- the end -------------------------------------------------------------------------------
    def finish(self) -> None:
        if self._writers is None:
            held, self._held = self._held, []
            try:
                self._run(self.inner, held)
            finally:
                self.ctx.memory.release(self._held_bytes)
                self._held_bytes = 0
            return
        files = {i: [w.close() for w in ws] for i, ws in self._writers.items()}
        self._writers = None
        self._close_inner()  # the copies run the partitions
        try:
            for p in range(FANOUT):
                self._partition({i: fs[p] for i, fs in files.items()}, 1)
        finally:
            for fs in files.values():
                for f in fs:
                    f.delete()

    def _partition(self, files: dict[int, SpillFile], level: int) -> None:
        """One partition (a spill file per input): through a fresh copy of the operator when it
        fits, else split again with the next bits of the hash."""
        size = sum(f.nbytes for f in files.values())
        if not size:
            return
        if self.ctx.memory.fits(size, margin=1.0) or level >= _MAX_LEVEL:
            op = copy.deepcopy(self._pristine)
            op.setup(self.ctx, self.output)
            op.open()
            try:  # a partition's inputs one after the other: at the end of input, order between them is moot
                self._run(op, ((i, b) for i, f in sorted(files.items()) for b in f.read()))
            finally:
                op.close()
            return
        writers = self._new_writers(level)
        try:
            for i, f in files.items():
                for batch in f.read():
                    self._spill(i, batch, writers, level)
                f.delete()
            subs = {i: [w.close() for w in ws] for i, ws in writers.items()}
            for p in range(FANOUT):
                self._partition({i: fs[p] for i, fs in subs.items()}, level + 1)
                for fs in subs.values():
                    fs[p].delete()
        finally:
            for ws in writers.values():
                for w in ws:
                    w.abort()

    def _run(self, op: Operator, batches: Iterable[tuple[int, pa.RecordBatch]]) -> None:
        """``batches`` (input, batch) through ``op`` in order, then the end of its inputs."""
        interval = (op.processing_time_interval_ms or 0) / 1000.0
        due = time.monotonic() + interval
        for input_index, batch in batches:
            op.process_batch(batch, input_index)
            if interval and time.monotonic() >= due:
                op.on_processing_time(op.ctx.clock())
                due = time.monotonic() + interval
        for i in sorted(self.keys_of):
            op.process_watermark(self._watermark or MAX_WATERMARK, i)
        for i in sorted(self.keys_of):
            op.end_input(i)
        op.finish()

    def _close_inner(self) -> None:
        if not self._inner_closed:
            self._inner_closed = True
            self.inner.close()

    def close(self) -> None:
        self._close_inner()
        if self._writers is not None:
            for ws in self._writers.values():
                for w in ws:
                    w.abort()
            self._writers = None
        self.ctx.memory.release(self._held_bytes)
        self._held, self._held_bytes = [], 0

    # -- checkpoints (BATCH jobs take none; a savepoint of one before any input) ----------------
    def snapshot_state(self, checkpoint_id: int) -> Snapshot:
        if self._held or self._writers is not None:
            raise RuntimeError(f"{self.name}: a BATCH operator holding its input cannot be snapshotted")
        return self.inner.snapshot_state(checkpoint_id)

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        """A restored operator (a savepoint of a BATCH job) holds its state for every key: its
        input is then held whole, never split (the state could not follow the partitions)."""
        self.inner.initialize_state(state)
        self._restored = bool(state)
