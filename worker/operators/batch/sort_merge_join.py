"""The sort-merge join of two bounded inputs (``with_hint("sort_merge")``): both inputs, each
hash-partitioned on its keys, are sorted by key (``ExternalSorter``: in managed memory, sorted
runs spilled to disk, each input in half the budget), then merged a range of keys at a time.

A round looks at a block of each side's sorted rows. The smaller of the two blocks' last keys is
the *bound*: every key below it has all its rows, on both sides, in the blocks at hand (each
side's later rows are at least its block's last key), so those rows are joined as a whole, with
the hash join's kernel, outer, semi and anti rows included; the rows from the bound on wait for
the next block of the side whose last key the bound was. A key whose rows fill more than a
quarter of the budget while more keep coming (a skewed key) is written to spill files, both
sides, and joined block by block as the hash join joins a partition that will not split.

Output: as the hash join's, in key order within each subtask.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from yarnflow.worker.memory.spill import SpillWriter
from yarnflow.worker.operators.base import Output, RuntimeContext
from yarnflow.worker.operators.batch.hash_join import HashJoin
from yarnflow.worker.operators.batch.sort import ExternalSorter
from yarnflow.worker.operators.batch.tables import cast_keys, concat

log = logging.getLogger(__name__)

__all__ = ["SortMergeJoin"]

_TAG = "__yarnflow_bound"


class _Side:
    """One input's sorted rows, read a block at a time; ``rows``: what is at hand, not yet joined."""

    def __init__(self, sorter: ExternalSorter | None, keys: list[str], block_rows: int) -> None:
        self._batches = sorter.sorted(block_rows) if sorter is not None else iter(())
        self.keys = keys
        self.rows: pa.Table | None = None
        self.done = False

    def more(self) -> bool:
        """Read the next block onto ``rows``; False when the input is exhausted."""
        batch = next(self._batches, None)
        if batch is None:
            self.done = True
            return False
        self.rows = concat([t for t in (self.rows, pa.Table.from_batches([batch])) if t is not None])
        return True

    def take(self, n: int) -> pa.Table | None:
        """The first ``n`` rows at hand, removed."""
        if self.rows is None or not n:
            return None
        head, self.rows = self.rows.slice(0, n), self.rows.slice(n)
        return head


class SortMergeJoin(HashJoin):
    """A sort-merge join (see the module docstring); the right input is the "build" side of each
    range's hash join."""

    kind = "sort_merge_join"

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs["build_input"] = 1
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        self._sorters: dict[int, ExternalSorter] = {}

    def input_selection(self) -> int | None:
        return None  # both inputs are sorted as they come

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if not batch.num_rows:
            return
        keys = self.left_keys if input_index == 0 else self.right_keys
        if input_index == self.build_input and self.build_schema is None:
            self._check(batch.schema, keys, "right")
            self.build_schema = batch.schema
        elif input_index != self.build_input and self.probe_schema is None:
            self._check(batch.schema, keys, "left")
            self.probe_schema = batch.schema
        sorter = self._sorters.get(input_index)
        if sorter is None:
            sorter = self._sorters[input_index] = ExternalSorter([(k, "ascending") for k in keys], self.ctx.memory,
                                                                 self.ctx.spill, f"{self.name}-{input_index}")
        sorter.add(batch)

    def end_input(self, input_index: int = 0) -> None:
        super(HashJoin, self).end_input(input_index)  # watermarks only: nothing is built

    def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        if self.probe_schema is None and self.build_schema is None:
            return
        if self.probe_schema is not None and self.build_schema is not None:
            self.compared_types(self.build_schema, self.probe_schema)  # comparable keys, or a clear error
        self.layout_emitter()
        left = _Side(self._sorters.get(0), self.left_keys, self.ctx.batch_size)
        right = _Side(self._sorters.get(1), self.right_keys, self.ctx.batch_size)
        left.more()
        right.more()
        while True:
            if left.done and right.done:
                self.join_chunk(left.take(_rows(left)), right.take(_rows(right)))
                return
            if (left.rows is None or not left.rows.num_rows) and not left.done:
                left.more()
                continue
            if (right.rows is None or not right.rows.num_rows) and not right.done:
                right.more()
                continue
            self._round(left, right)

    def _round(self, left: _Side, right: _Side) -> None:
        """Join the keys below the bound; read on the side the bound came from."""
        live = [s for s in (left, right) if not s.done and s.rows is not None and s.rows.num_rows]
        bound_side, bound = self._bound(live)
        cut_left = self._below(left, bound)
        cut_right = self._below(right, bound)
        if cut_left or cut_right:
            self.join_chunk(left.take(cut_left), right.take(cut_right))
        held = sum(s.rows.nbytes for s in (left, right) if s.rows is not None)
        if held > self.ctx.memory.limit // 4 and not (cut_left or cut_right):
            self._large_key(left, right, bound)
            return
        bound_side.more()

    def _types(self) -> list[pa.DataType]:
        if self.probe_schema is not None and self.build_schema is not None:
            return self.compared_types(self.build_schema, self.probe_schema)
        return self.own_key_types(self.build_schema, self.probe_schema)

    def _keys(self, side: _Side, table: pa.Table) -> pa.Table:
        names = [str(i) for i in range(len(side.keys))]
        return pa.table(cast_keys(table, side.keys, self._types()), names=names)

    def _bound(self, live: list[_Side]) -> tuple[_Side, pa.Table]:
        """The side whose block ends with the smallest key, and that key (one row)."""
        lasts = [self._keys(s, s.rows.slice(s.rows.num_rows - 1)) for s in live]  # type: ignore[union-attr]
        if len(lasts) == 1:
            return live[0], lasts[0]
        both = concat(lasts)
        assert both is not None
        first = int(pc.sort_indices(both, sort_keys=[(c, "ascending") for c in both.column_names])[0].as_py())
        return live[first], both.slice(first, 1)

    def _below(self, side: _Side, bound: pa.Table, or_equal: bool = False) -> int:
        """How many of ``side``'s rows at hand (sorted) have a key below ``bound`` (or equal to it)."""
        if side.rows is None or not side.rows.num_rows:
            return 0
        keys = self._keys(side, side.rows)
        # the bound sorts before the rows of its own key, or after them
        tagged = concat([bound.append_column(_TAG, pa.array([2 if or_equal else 0], pa.int8())),
                         keys.append_column(_TAG, pa.array(np.ones(keys.num_rows, np.int8)))])
        assert tagged is not None
        order = pc.sort_indices(tagged, sort_keys=[(c, "ascending") for c in keys.column_names] + [(_TAG, "ascending")])
        return int(np.flatnonzero(order.to_numpy() == 0)[0])

    def _large_key(self, left: _Side, right: _Side, bound: pa.Table) -> None:
        """The rows at hand are all of one key, and it goes on: write that key's rows, both
        sides, to spill files and join them block by block."""
        log.info("%s: one key has more rows than a quarter of %.1f MB of managed memory: joining it block by block",
                 self.name, self.ctx.memory.limit / 2**20)
        writers = {0: self.ctx.spill.writer(f"{self.name}-large-key-left"),
                   1: self.ctx.spill.writer(f"{self.name}-large-key-right")}
        try:
            for index, side in ((0, left), (1, right)):
                self._drain_key(side, bound, writers[index])
            probe, build = writers[0].close(), writers[1].close()
        except BaseException:
            for w in writers.values():
                w.abort()
            raise
        self.join_partition(build, probe if probe.num_rows else None, level=1 << 10)  # straight to block by block

    def _drain_key(self, side: _Side, bound: pa.Table, writer: SpillWriter) -> None:
        """Move ``side``'s rows of key ``bound`` to ``writer``, reading on until the key changes."""
        while True:
            chunk = side.take(self._below(side, bound, or_equal=True))
            if chunk is not None:
                writer.write(chunk)
            if side.rows is not None and side.rows.num_rows:
                return  # a later key is at hand: this one has ended
            if not side.more():
                return

    def close(self) -> None:
        super().close()
        for sorter in self._sorters.values():
            sorter.abort()
        self._sorters = {}


def _rows(side: _Side) -> int:
    return side.rows.num_rows if side.rows is not None else 0
