"""The native batch join: a hash join of two bounded inputs, each hash-partitioned on its join
keys, so every subtask joins its own key groups (``a.join(b).where(...).equal_to(...)`` without
a window, in BATCH jobs).

Both inputs are buffered as Arrow batches until both ended; then Arrow's hash join (Acero)
joins them in one vectorised call and the result is emitted in batches of ``ctx.batch_size``.
Output columns: the left input's, then the right input's without its join keys; a right column
whose name the left already has gets the suffix ``_right``. ``left outer``: left rows without a
match get nulls in the right columns. With a ``join_fn`` each joined pair is handed to it as two
row dicts (the right one None for an unmatched left row) and its dicts are the output."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from yarnflow.worker.operators.base import TwoInputOperator

_MATCHED = "__yarnflow_matched"
JOIN_TYPES = {"inner": "inner", "left": "left outer", "left_outer": "left outer", "left outer": "left outer"}


class BatchHashJoin(TwoInputOperator):
    kind = "join"
    batch_only = True

    def __init__(self, left_keys: list[str], right_keys: list[str], how: str = "inner",
                 join_fn: Callable[[dict[str, Any], dict[str, Any] | None], dict[str, Any]] | None = None,
                 name: str | None = None, uid: str | None = None) -> None:
        super().__init__(name, uid)
        if how not in JOIN_TYPES:
            raise ValueError(f"join type {how!r}: use one of inner, left_outer")
        self.left_keys, self.right_keys = list(left_keys), list(right_keys)
        self.how = JOIN_TYPES[how]
        self.join_fn = join_fn
        self._batches: tuple[list[pa.RecordBatch], list[pa.RecordBatch]] = ([], [])

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if batch.num_rows:
            self._batches[input_index].append(batch)

    def finish(self) -> None:
        left, right = self._batches
        self._batches = ([], [])
        if not left:
            return  # inner and left outer joins of nothing on the left are empty
        lt = pa.Table.from_batches(left)
        if not right and self.how == "inner":
            return
        for k in self.left_keys:
            if k not in lt.column_names:
                raise KeyError(f"join '{self.name}': the left input has no column {k!r} (it has {lt.column_names})")
        if right:
            rt = pa.Table.from_batches(right)
            for k in self.right_keys:
                if k not in rt.column_names:
                    raise KeyError(f"join '{self.name}': the right input has no column {k!r} "
                                   f"(it has {rt.column_names})")
            rt = rt.rename_columns([c if c in self.right_keys or c not in lt.column_names else f"{c}_right"
                                    for c in rt.column_names])
            if self.join_fn is not None:  # tells a match from a right row of nulls
                rt = rt.append_column(_MATCHED, pa.array([True] * rt.num_rows, pa.bool_()))
            joined = lt.join(rt, self.left_keys, self.right_keys, join_type=self.how, use_threads=False,
                             coalesce_keys=True)
            rest = [c for c in rt.column_names if c not in self.right_keys]
            joined = joined.select(lt.column_names + rest)
        else:  # left outer join with an empty right side: no right columns are known
            joined = lt
            rest = []
        if self.join_fn is not None:
            self._apply(joined, lt.column_names, [c for c in rest if c != _MATCHED])
            return
        for batch in joined.combine_chunks().to_batches(max_chunksize=self.ctx.batch_size):
            if batch.num_rows:
                self.output.collect(batch)

    def _apply(self, joined: pa.Table, left_cols: list[str], right_cols: list[str]) -> None:
        assert self.join_fn is not None
        columns = joined.to_pydict()
        n = joined.num_rows
        out: list[dict[str, Any]] = []
        matched_rows = columns.get(_MATCHED) or [False] * n
        for lo, hi in self.row_slices(n):  # the join function is user code: a cancel stops it between slices
            for i in range(lo, hi):
                lrow = {c: columns[c][i] for c in left_cols}
                rrow = {c.removesuffix("_right") if c.endswith("_right") and c.removesuffix("_right") in lrow else c:
                        columns[c][i] for c in right_cols}
                for lk, rk in zip(self.left_keys, self.right_keys):
                    rrow[rk] = lrow[lk]
                out.append(self.call_user(self.join_fn, lrow, rrow if matched_rows[i] else None))
                if len(out) >= self.ctx.batch_size:
                    self.output.collect(pa.RecordBatch.from_pylist(out))
                    out = []
        if out:
            self.output.collect(pa.RecordBatch.from_pylist(out))
