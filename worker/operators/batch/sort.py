"""Sorting bounded inputs in managed memory: the external sort, the sort operator behind
``sort_by`` / ``order_by``, and its top-N shortcut.

``ExternalSorter`` holds rows in its budget; when they reach half of it (sorting takes a copy)
it sorts them (``pyarrow.compute.sort_indices``, stable) and writes them to a spill file, a
*sorted run*. At the end the runs are merged a block at a time: the rows of every run's current
block are sorted together, and those up to the smallest of the blocks' last keys go out (every
later row of every run is at least that key); the run whose block that was reads its next
block. More runs than ``MAX_FAN_IN`` (or than half the budget holds stored pieces of) are first
merged into fewer, longer runs. Nothing is ever
held beyond the budget, whatever the input's size.

``SortOperator`` sorts its whole input (a global sort runs at parallelism 1, behind a local
top-N per upstream subtask when it has a ``limit``). With a ``limit`` small enough for its
budget it keeps only the best ``limit`` rows seen so far (top-N), never sorting more.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.memory.manager import MemoryBudget
from yarnflow.worker.memory.spill import SEGMENT_BYTES, SpillFile, SpillFiles
from yarnflow.worker.operators.base import Operator, Output, RuntimeContext
from yarnflow.worker.operators.batch.tables import concat, slices

log = logging.getLogger(__name__)

__all__ = ["ExternalSorter", "SortOperator", "sort_keys"]

#: sorted runs merged at once; more are first merged into fewer
MAX_FAN_IN = 32
_RUN = "__yarnflow_run"
_POS = "__yarnflow_pos"


def sort_keys(columns: Sequence[str], ascending: bool | Sequence[bool] = True) -> list[tuple[str, str]]:
    """``(column, "ascending" | "descending")`` pairs, as ``pyarrow.compute.sort_indices`` takes them."""
    if not columns or not all(isinstance(c, str) and c for c in columns):
        raise JobDefinitionError("sort_by needs one or more column names")
    orders = [ascending] * len(columns) if isinstance(ascending, bool) else list(ascending)
    if len(orders) != len(columns) or not all(isinstance(a, bool) for a in orders):
        raise JobDefinitionError("sort_by: ascending is True / False, or one of them per column")
    return [(c, "ascending" if a else "descending") for c, a in zip(columns, orders)]


def _sorted(table: pa.Table, keys: list[tuple[str, str]]) -> pa.Table:
    return table.take(pc.sort_indices(table, sort_keys=keys))


class ExternalSorter:
    """Rows sorted by ``keys`` in ``budget``, with sorted runs spilled (see the module docstring)."""

    def __init__(self, keys: list[tuple[str, str]], budget: MemoryBudget, spill: SpillFiles, name: str) -> None:
        self.keys = keys
        self.budget = budget
        self.spill = spill
        self.name = name
        self._held: list[pa.RecordBatch | pa.Table] = []
        self._held_bytes = 0
        self._runs: list[SpillFile] = []
        self.rows = 0

    def _check(self, schema: pa.Schema) -> None:
        missing = [c for c, _ in self.keys if schema.get_field_index(c) < 0]
        if missing:
            raise JobDefinitionError(f"operator '{self.name}': sort column {missing[0]!r} does not exist; the input "
                                     f"has columns {schema.names}")

    def add(self, data: pa.RecordBatch | pa.Table) -> None:
        if not data.num_rows:
            return
        if not self.rows:
            self._check(data.schema)
        self.rows += data.num_rows
        if self._held_bytes + data.nbytes > self.budget.limit // 2 or not self.budget.try_reserve(data.nbytes):
            self._spill_run()
            if not self.budget.try_reserve(data.nbytes):  # larger than the budget alone: a run of its own
                self._write_run(data if isinstance(data, pa.Table) else pa.Table.from_batches([data]))
                return
        self._held.append(data)
        self._held_bytes += data.nbytes

    def _spill_run(self) -> None:
        table = concat(self._held)
        self._held = []
        if table is not None:
            self._write_run(table)
        self.budget.release(self._held_bytes)
        self._held_bytes = 0

    def _write_run(self, table: pa.Table) -> None:
        if not self._runs:
            log.info("%s: input does not fit in %.1f MB of managed memory: sorting it in runs on disk",
                     self.name, self.budget.limit / 2**20)
        self._runs.append(self.spill.write(f"{self.name}-run", _sorted(table, self.keys)))

    @property
    def spilled(self) -> bool:
        return bool(self._runs)

    def sorted(self, batch_size: int) -> Iterator[pa.RecordBatch]:
        """Every row, sorted, in batches of at most ``batch_size`` rows (call once, at the end)."""
        if not self._runs:
            table = concat(self._held)
            self._held = []
            try:
                if table is not None:
                    yield from slices(_sorted(table, self.keys), batch_size)
            finally:
                self.budget.release(self._held_bytes)
                self._held_bytes = 0
            return
        self._spill_run()
        runs, self._runs = self._runs, []
        try:
            # a run being merged holds one stored piece of itself (about SEGMENT_BYTES): at most
            # as many runs at once as half the budget holds pieces, and MAX_FAN_IN
            fan_in = max(2, min(MAX_FAN_IN, self.budget.limit // (2 * SEGMENT_BYTES)))
            while len(runs) > fan_in:  # merge passes until one merge takes them all
                merged = []
                for i in range(0, len(runs), fan_in):
                    group = runs[i:i + fan_in]
                    merged.append(self.spill.write(f"{self.name}-run", self._merge(group, batch_size)))
                    for f in group:
                        f.delete()
                runs = merged
            yield from self._merge(runs, batch_size)
        finally:
            for f in runs:
                f.delete()

    def _merge(self, runs: list[SpillFile], batch_size: int) -> Iterator[pa.RecordBatch]:
        """The rows of sorted ``runs``, sorted, a round at a time (see the module docstring)."""
        block_bytes = max(1, self.budget.limit // (3 * max(1, len(runs))))
        readers = [_RunReader(f, block_bytes) for f in runs]
        held = 0
        try:
            live = [r for r in readers if r.fill()]
            while len(live) > 1:
                held = sum(r.block.nbytes for r in live)  # type: ignore[union-attr]
                self.budget.try_reserve(held)
                yield from slices(self._round(live), batch_size)
                self.budget.release(held)
                held = 0
                live = [r for r in live if r.fill()]
            if live:  # one run left: the rest of it as it is
                last = live[0]
                assert last.block is not None
                yield from slices(last.block, batch_size)
                for batch in last.rest():
                    yield from slices(batch, batch_size)
        finally:
            self.budget.release(held)

    def _round(self, live: list[_RunReader]) -> pa.Table:
        """Sort the blocks' rows together; take those up to the smallest last key."""
        names = [c for c, _ in self.keys]
        tagged = []
        for i, r in enumerate(live):
            block = r.block
            assert block is not None
            n = block.num_rows
            tagged.append(block.append_column(_RUN, pa.array(np.full(n, i, np.int32)))
                          .append_column(_POS, pa.array(np.arange(n, dtype=np.int64))))
        combined = concat(tagged)
        assert combined is not None
        lasts = concat([r.block.select(names).slice(r.block.num_rows - 1) for r in live])  # type: ignore[union-attr]
        assert lasts is not None
        lasts = lasts.append_column(_RUN, pa.array(np.arange(len(live), dtype=np.int32)))
        bound = int(pc.sort_indices(lasts, sort_keys=self.keys + [(_RUN, "ascending")])[0].as_py())
        order = pc.sort_indices(combined, sort_keys=self.keys + [(_RUN, "ascending"), (_POS, "ascending")]).to_numpy()
        runs = combined.column(_RUN).to_numpy()[order]
        positions = combined.column(_POS).to_numpy()[order]
        last_of_bound = live[bound].block.num_rows - 1  # type: ignore[union-attr]
        cut = int(np.flatnonzero((runs == bound) & (positions == last_of_bound))[0]) + 1
        taken = np.bincount(runs[:cut], minlength=len(live))
        for i, r in enumerate(live):
            r.consume(int(taken[i]))
        return combined.take(pa.array(order[:cut])).drop_columns([_RUN, _POS])

    def abort(self) -> None:
        self._held = []
        self.budget.release(self._held_bytes)
        self._held_bytes = 0
        for f in self._runs:
            f.delete()
        self._runs = []


class _RunReader:
    """One sorted run, a block of about ``block_bytes`` at a time."""

    def __init__(self, run: SpillFile, block_bytes: int) -> None:
        self._batches = run.read()
        self._block_bytes = block_bytes
        self.block: pa.Table | None = None
        self._pending: pa.RecordBatch | None = None

    def fill(self) -> bool:
        """Top the block at hand up to about ``block_bytes`` (when less than half is left: a
        round then outputs a good share of every run, not the few rows a run had left); False
        when the run is exhausted."""
        if self.block is not None and self.block.nbytes >= self._block_bytes // 2:
            return True
        parts: list[pa.RecordBatch] = []
        size = 0
        if self.block is not None and self.block.num_rows:
            parts.extend(self.block.to_batches())
            size = self.block.nbytes
        while size < self._block_bytes:
            batch = self._pending if self._pending is not None else next(self._batches, None)
            self._pending = None
            if batch is None:
                break
            if batch.nbytes + size > self._block_bytes:
                if parts:
                    self._pending = batch
                    break
                # a batch larger than a block: its first block's worth, the rest waits
                rows = max(1, int(batch.num_rows * self._block_bytes / max(1, batch.nbytes)))
                if rows < batch.num_rows:
                    batch, self._pending = batch.slice(0, rows), batch.slice(rows)
            parts.append(batch)
            size += batch.nbytes
        table = concat(parts)
        self.block = table.combine_chunks() if table is not None else None
        return self.block is not None

    def consume(self, rows: int) -> None:
        assert self.block is not None
        self.block = self.block.slice(rows)

    def rest(self) -> Iterator[pa.RecordBatch]:
        if self._pending is not None:
            yield self._pending
            self._pending = None
        yield from self._batches


class SortOperator(Operator):
    """``sort_by(columns, ascending, limit)``: the input's rows, sorted, emitted at its end (with a
    ``limit``, only the first ``limit``). ``local``: a pre-sort before the exchange to the
    global sort, which keeps only the ``limit`` best rows of its own subtask."""

    kind = "sort"
    batch_only = True
    uses_managed_memory = True

    def __init__(self, keys: list[tuple[str, str]], limit: int | None = None, name: str | None = None,
                 local: bool = False) -> None:
        super().__init__(name)
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise JobDefinitionError(f"sort '{self.name}': limit must be a whole number of rows, not {limit!r}")
        self.keys = keys
        self.limit = limit
        self.local = local

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        self._sorter: ExternalSorter | None = None
        self._top: list[pa.Table] = []
        self._top_rows = 0
        self._top_bytes = 0

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if not batch.num_rows:
            return
        if self.limit is not None and self._sorter is None:
            if self._keep_top(batch):
                return
            log.info("%s: the best %d rows do not fit in %.1f MB of managed memory: sorting everything",
                     self.name, self.limit, self.ctx.memory.limit / 2**20)
            self._sorter = self._new_sorter()
            for table in self._top:
                self._sorter.add(table)
            self.ctx.memory.release(self._top_bytes)
            self._top, self._top_rows, self._top_bytes = [], 0, 0
        if self._sorter is None:
            self._sorter = self._new_sorter()
        self._sorter.add(batch)

    def _new_sorter(self) -> ExternalSorter:
        return ExternalSorter(self.keys, self.ctx.memory, self.ctx.spill, self.name)

    def _keep_top(self, batch: pa.RecordBatch) -> bool:
        """Top-N: hold the batch; past twice the limit, keep only the best ``limit`` rows.
        False when even that does not fit in the budget."""
        assert self.limit is not None
        if not self._top_rows:
            ExternalSorter(self.keys, self.ctx.memory, self.ctx.spill, self.name)._check(batch.schema)
        if not self.ctx.memory.try_reserve(batch.nbytes):
            self._compact_top()
            if not self.ctx.memory.try_reserve(batch.nbytes):
                return False
        self._top.append(pa.Table.from_batches([batch]))
        self._top_rows += batch.num_rows
        self._top_bytes += batch.nbytes
        if self._top_rows >= 2 * max(self.limit, self.ctx.batch_size):
            self._compact_top()
        return True

    def _compact_top(self) -> None:
        assert self.limit is not None
        table = concat(self._top)
        if table is None:
            return
        best = _sorted(table, self.keys).slice(0, self.limit) if self.limit < table.num_rows else table
        best = best.combine_chunks()
        self.ctx.memory.release(self._top_bytes)
        self.ctx.memory.try_reserve(best.nbytes)
        self._top, self._top_rows, self._top_bytes = [best], best.num_rows, best.nbytes

    def finish(self) -> None:
        if self._sorter is None:
            table = concat(self._top)
            self._top = []
            if table is not None:
                rows = _sorted(table, self.keys)
                if self.limit is not None:
                    rows = rows.slice(0, self.limit)
                for batch in slices(rows, self.ctx.batch_size):
                    self.output.collect(batch)
            self.ctx.memory.release(self._top_bytes)
            self._top_bytes = 0
            return
        left = self.limit
        for batch in self._sorter.sorted(self.ctx.batch_size):
            if left is not None:
                if left <= 0:
                    break
                batch = batch.slice(0, left)
                left -= batch.num_rows
            self.output.collect(batch)

    def close(self) -> None:
        if self._sorter is not None:
            self._sorter.abort()
        self.ctx.memory.release(self._top_bytes)
        self._top, self._top_bytes = [], 0
