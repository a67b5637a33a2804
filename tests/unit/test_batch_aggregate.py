"""Keyed aggregation of bounded inputs in a managed-memory budget (HashAggregation under
KeyedAggregate in BATCH mode) and the local pre-aggregation before its exchange
(LocalKeyedAggregate): exact results against a plain-Python reference, in unbounded memory and
spilling several levels deep, with nulls in keys and values; the budget is never exceeded and
nothing is left in the spill folder."""

from __future__ import annotations

import logging
import os
import random
from typing import Any

import pyarrow as pa
import pytest

from tests.harness import OperatorHarness
from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.memory.manager import MemoryBudget
from yarnflow.worker.memory.spill import SpillFiles
from yarnflow.worker.operators.batch.aggregate import LocalKeyedAggregate
from yarnflow.worker.operators.keyed import KeyedAggregate

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

AGGS = [("v", "sum"), ("v", "min"), ("w", "max"), ("k", "count")]
SCHEMA = pa.schema([("k", pa.int64()), ("g", pa.string()), ("v", pa.int64()), ("w", pa.float64())])


def data(n: int, keys: int, seed: int) -> list[pa.RecordBatch]:
    rng = random.Random(seed)
    rows = [{"k": rng.randrange(keys) if rng.random() > 0.02 else None, "g": rng.choice("xy"),
             "v": rng.randrange(-50, 100) if rng.random() > 0.05 else None, "w": rng.random()} for _ in range(n)]
    return [pa.RecordBatch.from_pylist(rows[i:i + 500], schema=SCHEMA) for i in range(0, n, 500)]


def reference(batches: list[pa.RecordBatch], keys: list[str]) -> dict[tuple, dict[str, Any]]:
    out: dict[tuple, dict[str, Any]] = {}
    for r in (r for b in batches for r in b.to_pylist()):
        key = tuple(r[k] for k in keys)
        acc = out.setdefault(key, {"v_sum": None, "v_min": None, "w": None, "count": 0})
        if r["v"] is not None:
            acc["v_sum"] = r["v"] + (acc["v_sum"] or 0)
            acc["v_min"] = r["v"] if acc["v_min"] is None else min(acc["v_min"], r["v"])
        acc["w"] = r["w"] if acc["w"] is None else max(acc["w"], r["w"])
        acc["count"] += 1
    return out


def result(rows: list[dict[str, Any]], keys: list[str]) -> dict[tuple, dict[str, Any]]:
    got = {tuple(r[k] for k in keys): {c: v for c, v in r.items() if c not in keys} for r in rows}
    assert len(got) == len(rows), "a key came twice"
    return got


@pytest.mark.parametrize("keys", [["k"], ["k", "g"]])
@pytest.mark.parametrize("memory", [None, 12_000], ids=["unbounded", "spilling"])
def test_batch_keyed_aggregate_is_exact(keys: list[str], memory: int | None, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="yarnflow.worker.operators.batch.aggregate")
    batches = data(20_000, 4000, 1)
    budget = MemoryBudget(memory) if memory else MemoryBudget.unlimited()
    spill = SpillFiles([str(tmp_path)], "attempt")
    h = OperatorHarness(KeyedAggregate(keys, AGGS, name="agg"), runtime_mode="BATCH", batch_size=700,
                        memory=budget, spill=spill)
    for b in batches:
        h.batch(b)
        assert budget.used <= budget.limit
    h.end_input()
    assert h.rows() == []  # nothing before the end
    h.finish()
    h.close()
    assert all(b.num_rows <= 700 for b in h.out.batches)
    assert result(h.rows(), keys) == reference(batches, keys)
    assert budget.used == 0
    assert all(files in ([], ["owner.json"]) for _, _, files in os.walk(tmp_path))
    if memory:
        assert budget.peak <= memory
        assert spill.spilled_bytes > 0
        assert "at level 1: spilling partitions" in caplog.text  # partitions split again


def test_pre_aggregated_partials_from_several_subtasks_combine_exactly(caplog) -> None:
    caplog.set_level(logging.INFO, logger="yarnflow.worker.operators.batch.aggregate")
    batches = [data(6000, 50, seed) for seed in (2, 3)]  # keys repeat: pre-aggregation pays
    locals_ = [OperatorHarness(LocalKeyedAggregate(["k"], AGGS, of="agg"), runtime_mode="BATCH",
                               memory=MemoryBudget(40_000)) for _ in batches]
    for h, part in zip(locals_, batches):
        for b in part:
            h.batch(b)
        h.finish()
    emitted = [b for h in locals_ for b in h.out.batches]
    assert sum(b.num_rows for b in emitted) < 0.2 * 12_000
    final = KeyedAggregate(["k"], AGGS, name="agg")
    final.partial_input = True
    h = OperatorHarness(final, runtime_mode="BATCH", memory=MemoryBudget(4_000))
    for b in emitted:
        h.batch(b)
    h.finish()
    assert result(h.rows(), ["k"]) == reference(batches[0] + batches[1], ["k"])
    assert "barely repeat" not in caplog.text


def test_pre_aggregation_steps_aside_when_keys_do_not_repeat(caplog) -> None:
    caplog.set_level(logging.INFO, logger="yarnflow.worker.operators.batch.aggregate")
    batches = data(6000, 10**9, 4)
    h = OperatorHarness(LocalKeyedAggregate(["k"], AGGS, name="agg (local)", of="agg"), runtime_mode="BATCH",
                        memory=MemoryBudget(60_000))
    for b in batches:
        h.batch(b)
    h.finish()
    assert "barely repeat, rows go on without it" in caplog.text
    assert combined(h.out.batches) == reference(batches, ["k"])


def test_a_missing_column_is_named_by_the_aggregation() -> None:
    h = OperatorHarness(LocalKeyedAggregate(["nope"], [("v", "sum")], name="sum(v) (local)", of="sum(v)"),
                        runtime_mode="BATCH")
    with pytest.raises(JobDefinitionError, match=r"operator 'sum\(v\)': key column 'nope' does not exist; the input "
                                                 r"has columns \['k', 'g', 'v', 'w'\]"):
        h.batch(data(10, 5, 5)[0])


def test_a_spilled_batch_aggregation_cannot_be_snapshotted() -> None:
    h = OperatorHarness(KeyedAggregate(["k"], AGGS, name="agg"), runtime_mode="BATCH", memory=MemoryBudget(20_000))
    for b in data(5000, 5000, 6):
        h.batch(b)
    with pytest.raises(RuntimeError, match="spilled to disk"):
        h.op.snapshot_state(1)
    h.close()


def test_streaming_pre_aggregation_holds_a_mini_batch_and_never_across_a_watermark_or_barrier() -> None:
    """STREAMING (Flink's mini-batch local aggregation): batches are held and combined together,
    flushed on the buffer-timeout timer, before a watermark and before a checkpoint barrier, so
    the operator snapshots nothing and loses nothing; the partials combine to the exact result."""
    batches = data(6000, 50, 6)
    h = OperatorHarness(LocalKeyedAggregate(["k"], AGGS, name="agg (local)", of="agg"), runtime_mode="STREAMING",
                        config={"execution.buffer-timeout": "50 ms"})
    op = h.op
    assert op.processing_time_interval_ms == 50
    for b in batches[:3]:
        assert h.batch(b) == []  # held
    assert len(h.tick(h.now + 50)) == 1  # the timer: one combined batch of partials
    h.batch(batches[3])
    events = h.watermark(1000)
    assert [e[0] for e in events] == ["data", "wm"]  # what was held goes first
    h.batch(batches[4])
    op.prepare_snapshot_pre_barrier(1)
    assert op.snapshot_state(1) == {} and h.out.batches[-1].num_rows  # flushed before the barrier
    for b in batches[5:]:
        h.batch(b)
    h.finish()
    partial_rows = sum(b.num_rows for b in h.out.batches)
    assert partial_rows < sum(b.num_rows for b in batches) / 5
    assert combined(h.out.batches) == reference(batches, ["k"])


def combined(partials: list[pa.RecordBatch]) -> Any:
    """The final aggregation of pre-aggregated partials (the keyed side of the exchange)."""
    final = KeyedAggregate(["k"], AGGS, name="agg")
    final.partial_input = True
    h = OperatorHarness(final, runtime_mode="BATCH")
    for b in partials:
        h.batch(b)
    h.finish()
    return result(h.rows(), ["k"])
