"""The external sort (SortOperator behind ``sort_by`` / ``order_by``) against Python's sort: one
and several columns, either direction, nulls last, in unbounded memory and spilling enough
sorted runs to need a merge pass; the top-N shortcut; and the plan around it (a sort at
parallelism 1 behind a local top-N, what follows it at parallelism 1)."""

from __future__ import annotations

import functools
import logging
import random
from typing import Any

import pytest

import yarnflow
from tests.harness import OperatorHarness
from yarnflow import executors
from yarnflow.common.errors import JobDefinitionError
from yarnflow.compiler import compile_job
from yarnflow.worker.memory.manager import MemoryBudget
from yarnflow.worker.memory.spill import SpillFiles
from yarnflow.worker.operators.batch import sort as sort_module
from yarnflow.worker.operators.batch.sort import SortOperator, sort_keys

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

RNG = random.Random(3)
ROWS = [{"a": RNG.choice([None, *range(60)]), "b": RNG.random(), "s": RNG.choice(["x", "y", "z", None])}
        for _ in range(20_000)]


def python_order(columns: list[str], ascending: list[bool]) -> Any:
    def cmp(x: dict, y: dict) -> int:
        for c, up in zip(columns, ascending):
            vx, vy = x[c], y[c]
            if vx == vy:
                continue
            if vx is None or vy is None:  # nulls last, either direction
                return 1 if vx is None else -1
            return (-1 if vx < vy else 1) * (1 if up else -1)
        return 0
    return functools.cmp_to_key(cmp)


def keys_of(rows: list[dict], columns: list[str]) -> list[tuple]:
    return [tuple(r[c] for c in columns) for r in rows]


@pytest.mark.parametrize("columns, ascending", [(["a"], [True]), (["a", "b"], [False, True]), (["s", "a"], [True, False])])
@pytest.mark.parametrize("limit", [None, 10, 6000])
@pytest.mark.parametrize("memory", [None, 40_000], ids=["unbounded", "spilling"])
def test_sorted_as_python_sorts(columns: list[str], ascending: list[bool], limit: int | None, memory: int | None,
                                monkeypatch, caplog) -> None:
    caplog.set_level(logging.INFO, logger="yarnflow.worker.operators.batch.sort")
    monkeypatch.setattr(sort_module, "MAX_FAN_IN", 4)  # a merge pass before the last merge
    budget = MemoryBudget(memory) if memory else MemoryBudget.unlimited()
    spill = SpillFiles()
    op = SortOperator(sort_keys(columns, ascending), limit=limit, name="sort")
    h = OperatorHarness(op, runtime_mode="BATCH", memory=budget, spill=spill, batch_size=333)
    for i in range(0, len(ROWS), 500):
        h.batch(ROWS[i:i + 500])
        assert budget.used <= budget.limit
    h.finish()
    h.close()
    want = sorted(ROWS, key=python_order(columns, ascending))[:limit]
    got = h.rows()
    assert keys_of(got, columns) == keys_of(want, columns)
    if limit is None:
        assert sorted(map(repr, got)) == sorted(map(repr, want))  # every row, once
    else:  # rows that tie at the limit may be others than Python's: each is an input row, once
        assert len(set(map(repr, got))) == len(got) and set(map(repr, got)) <= set(map(repr, ROWS))
    assert all(b.num_rows <= 333 for b in h.out.batches)
    assert budget.used == 0
    if memory and (limit is None or limit == 6000):
        assert spill.spilled_bytes > 0 and "sorting it in runs on disk" in caplog.text
    if memory and limit == 10:
        assert spill.spilled_bytes == 0  # the best ten rows fit: never sorted more


def test_sort_arguments_are_checked() -> None:
    with pytest.raises(JobDefinitionError, match="one or more column names"):
        sort_keys([])
    with pytest.raises(JobDefinitionError, match="one of them per column"):
        sort_keys(["a", "b"], [True])
    with pytest.raises(JobDefinitionError, match="limit must be a whole number"):
        SortOperator(sort_keys(["a"]), limit=-1)
    h = OperatorHarness(SortOperator(sort_keys(["nope"]), name="sort"), runtime_mode="BATCH")
    with pytest.raises(JobDefinitionError, match="sort column 'nope' does not exist"):
        h.batch([{"a": 1}])


def test_a_sort_runs_at_parallelism_one_behind_a_local_top_n_and_what_follows_keeps_its_order() -> None:
    executors.set_context(executors.ClusterContext("", {}, progress=False))
    try:
        env = yarnflow.StreamExecutionEnvironment(parallelism=3, runtime_mode="BATCH")
        (env.from_collection(ROWS, name="rows").map(lambda r: r, name="m")
         .order_by("a", ascending=False, limit=5, name="top").map(lambda r: r, name="after").collect())
        job = compile_job(env, "top")
    finally:
        executors.set_context(None)
    by_ops = {tuple(v.operator_names): v for v in job.job_graph.vertices}
    assert by_ops[("rows", "m", "top (local top 5)")].parallelism == 3
    assert by_ops[("top", "after", "collect")].parallelism == 1


def test_the_merge_holds_a_few_blocks_not_the_runs() -> None:
    """Runs are stored in pieces of about 1 MB, so merging 20 MB of runs in a 2 MB budget holds
    a few blocks at a time (before, each run was one batch, read back whole)."""
    import numpy as np
    import pyarrow as pa

    from yarnflow.worker.operators.batch.sort import ExternalSorter

    sorter = ExternalSorter([("k", "ascending")], MemoryBudget(2 << 20), SpillFiles(), "sort")
    rng = np.random.default_rng(1)
    for _ in range(40):  # 40 x 0.5 MB
        sorter.add(pa.record_batch({"k": pa.array(rng.integers(0, 10**9, 32_768)),
                                    "v": pa.array(rng.random(32_768))}))
    baseline = pa.total_allocated_bytes()
    held, last, rows = 0, -1, 0
    for batch in sorter.sorted(65_536):
        held = max(held, pa.total_allocated_bytes() - baseline)
        keys = batch.column("k").to_numpy()
        assert keys[0] >= last and (np.diff(keys) >= 0).all()
        last, rows = keys[-1], rows + batch.num_rows
    assert rows == 40 * 32_768
    assert held < 8 << 20, f"the merge held {held / 2**20:.1f} MB of Arrow memory"
