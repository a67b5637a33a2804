"""The hybrid hash join (HashJoin) against a plain-Python reference: every join type, either
input built, in unbounded memory and in a budget so small that the build side spills several
levels deep and its skewed key (half the rows) is joined block by block; nulls, empty sides,
keys of several columns and of different integer widths, join functions. Also: the budget is
never exceeded, nothing is left in the spill folder, and the build input is read first."""

from __future__ import annotations

import collections
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
from yarnflow.worker.operators.batch.hash_join import HashJoin
from yarnflow.worker.operators.batch.join_index import JoinIndex
from yarnflow.worker.operators.batch.sort_merge_join import SortMergeJoin

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

HOWS = ["inner", "left_outer", "right_outer", "full_outer", "left_semi", "left_anti"]
LEFT = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.int64()), ("lv", pa.string())])
RIGHT = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.int64()), ("rv", pa.string())])


def rows(n: int, seed: int, side: str, skew: float, keys: int = 300) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        r = rng.random()
        if r < 0.05:
            k, s = None, "a"
        elif r < 0.05 + skew:
            k, s = 7, "a"  # the skewed key
        else:
            k, s = rng.randrange(keys), rng.choice("abc")
        out.append({"k": k, "s": s, "v": i, side: f"{side}{i}"})
    return out


def reference(left: list[dict], right: list[dict], keys: list[str], how: str) -> list[dict]:
    """SQL semantics: a null key matches nothing; output left columns, then the right ones but
    the keys, a clashing name suffixed with _right; left key columns of a right-only row take
    the right keys."""
    by: dict[tuple, list[int]] = collections.defaultdict(list)
    for j, r in enumerate(right):
        key = tuple(r[k] for k in keys)
        if None not in key:
            by[key].append(j)
    right_cols = [c for c in (right[0] if right else {"k": 0, "s": 0, "v": 0, "rv": 0}) if c not in keys]

    def joined(lrow: dict | None, rrow: dict | None) -> dict:
        out = {c: (lrow[c] if lrow else None) for c in ("k", "s", "v", "lv")}
        if lrow is None:
            out.update({k: rrow[k] for k in keys})  # type: ignore[index]
        for c in right_cols:
            out[f"{c}_right" if c in out else c] = rrow[c] if rrow else None
        return out

    out, used = [], set()
    for lrow in left:
        key = tuple(lrow[k] for k in keys)
        matches = by.get(key, []) if None not in key else []
        if how == "left_semi":
            out += [dict(lrow)] if matches else []
        elif how == "left_anti":
            out += [] if matches else [dict(lrow)]
        else:
            for j in matches:
                used.add(j)
                out.append(joined(lrow, right[j]))
            if not matches and how in ("left_outer", "full_outer"):
                out.append(joined(lrow, None))
    if how in ("right_outer", "full_outer"):
        out += [joined(None, r) for j, r in enumerate(right) if j not in used]
    return out


def canonical(rows_: list[dict]) -> list[tuple]:
    return sorted(tuple(sorted((k, (v is None, v)) for k, v in r.items())) for r in rows_)


def run_join(left: list[dict], right: list[dict], how: str, build: int, keys: list[str], budget: MemoryBudget,
             spill: SpillFiles, join_fn: Any = None, left_first: bool = True,
             sort_merge: bool = False) -> tuple[HashJoin, OperatorHarness]:
    op = SortMergeJoin(keys, keys, how, join_fn=join_fn, name="j") if sort_merge else \
        HashJoin(keys, keys, how, build_input=build, join_fn=join_fn, name="j")
    h = OperatorHarness(op, batch_size=256, memory=budget, spill=spill, runtime_mode="BATCH")
    feeds = [(left, LEFT, 0, 400), (right, RIGHT, 1, 300)]
    if not left_first:
        feeds.reverse()
    for data, schema, index, size in feeds:
        for i in range(0, len(data), size):
            h.batch(pa.RecordBatch.from_pylist(data[i:i + size], schema=schema), input_index=index)
            assert budget.used <= budget.limit
    h.end_input(0)
    h.end_input(1)
    h.finish()
    h.close()
    return op, h


LEFT_ROWS = rows(3000, 1, "lv", skew=0.5)
RIGHT_ROWS = rows(2000, 2, "rv", skew=0.002) + [{"k": 7, "s": "a", "v": -1, "rv": "extra"}]


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("build", [0, 1], ids=["build-left", "build-right"])
@pytest.mark.parametrize("memory", [None, 24_000], ids=["unbounded", "spilling"])
def test_every_join_type_matches_the_reference(how: str, build: int, memory: int | None, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="yarnflow.worker.operators.batch.hash_join")
    budget = MemoryBudget(memory) if memory else MemoryBudget.unlimited()
    spill = SpillFiles([str(tmp_path)], "attempt")
    _, h = run_join(LEFT_ROWS, RIGHT_ROWS, how, build, ["k"], budget, spill, left_first=False)
    assert canonical(h.rows()) == canonical(reference(LEFT_ROWS, RIGHT_ROWS, ["k"], how))
    assert budget.used == 0  # everything given back
    assert all(not files for _, _, files in os.walk(tmp_path) if files != ["owner.json"])
    if memory:
        assert spill.spilled_bytes > 0
        assert budget.peak <= memory
        if build == 0:  # the left side's skewed key cannot be split: it is joined block by block
            assert "does not split: joining it block by block" in caplog.text
            assert "at level 1: spilling partitions" in caplog.text


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("memory", [None, 40_000], ids=["unbounded", "spilling"])
def test_the_sort_merge_join_matches_the_reference(how: str, memory: int | None, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="yarnflow.worker.operators.batch")
    budget = MemoryBudget(memory) if memory else MemoryBudget.unlimited()
    spill = SpillFiles([str(tmp_path)], "attempt")
    _, h = run_join(LEFT_ROWS, RIGHT_ROWS, how, 1, ["k"], budget, spill, sort_merge=True)
    assert canonical(h.rows()) == canonical(reference(LEFT_ROWS, RIGHT_ROWS, ["k"], how))
    assert budget.used == 0
    assert all(not files for _, _, files in os.walk(tmp_path) if files != ["owner.json"])
    if memory:
        assert budget.peak <= memory
        assert "sorting it in runs on disk" in caplog.text
        assert "one key has more rows than a quarter" in caplog.text  # the skewed key, block by block
    _, h2 = run_join(LEFT_ROWS[:900], RIGHT_ROWS[:700], how, 1, ["k", "s"], budget, spill, sort_merge=True)
    assert canonical(h2.rows()) == canonical(reference(LEFT_ROWS[:900], RIGHT_ROWS[:700], ["k", "s"], how))


@pytest.mark.parametrize("how", HOWS)
def test_keys_of_two_columns_with_nulls_spilling(how: str) -> None:
    budget = MemoryBudget(16_000)
    _, h = run_join(LEFT_ROWS[:1500], RIGHT_ROWS[:1200], how, 1, ["k", "s"], budget, SpillFiles())
    assert canonical(h.rows()) == canonical(reference(LEFT_ROWS[:1500], RIGHT_ROWS[:1200], ["k", "s"], how))


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("empty", ["left", "right", "both"])
def test_an_empty_side(how: str, empty: str) -> None:
    left = [] if empty in ("left", "both") else LEFT_ROWS[:50]
    right = [] if empty in ("right", "both") else RIGHT_ROWS[:50]
    for build in (0, 1):
        _, h = run_join(left, right, how, build, ["k"], MemoryBudget.unlimited(), SpillFiles())
        want = reference(left, right, ["k"], how)
        got = h.rows()
        assert len(got) == len(want)
        if empty == "right" and how in ("left_outer", "full_outer", "left_anti"):
            # no right rows ever came: their columns are not known, the left ones are output
            assert [r["v"] for r in got] == [r["v"] for r in want] if how == "left_anti" else True
            assert sorted(r["v"] for r in got) == sorted(r["v"] for r in want)


def test_keys_of_different_integer_widths_join() -> None:
    op = HashJoin(["k"], ["id"], "inner", name="j")
    h = OperatorHarness(op, runtime_mode="BATCH")
    h.batch(pa.record_batch({"id": pa.array([1, 2, 3], pa.int32()), "name": ["a", "b", "c"]}), input_index=1)
    h.end_input(1)
    h.batch(pa.record_batch({"k": pa.array([3, 1, 5, 1], pa.int64()), "x": [30, 10, 50, 11]}))
    h.end_input(0)
    h.finish()
    assert sorted((r["x"], r["name"]) for r in h.rows()) == [(10, "a"), (11, "a"), (30, "c")]


def test_keys_that_cannot_be_compared_are_refused() -> None:
    op = HashJoin(["k"], ["k"], "inner", name="j")
    h = OperatorHarness(op, runtime_mode="BATCH")
    h.batch(pa.record_batch({"k": ["1", "2"]}), input_index=1)
    h.end_input(1)
    with pytest.raises(JobDefinitionError, match=r"join 'j': key 'k' \(int64\) cannot be compared with key 'k' \(string\)"):
        h.batch(pa.record_batch({"k": [1, 2]}))


@pytest.mark.parametrize("how", ["inner", "left_outer", "right_outer", "full_outer"])
def test_a_join_function_gets_none_for_the_side_without_a_match(how: str) -> None:
    def fn(left: dict | None, right: dict | None) -> dict:
        return {"l": left["v"] if left else None, "r": right["v"] if right else None}

    left, right = LEFT_ROWS[:400], RIGHT_ROWS[:300]
    _, h = run_join(left, right, how, 1, ["k"], MemoryBudget(12_000), SpillFiles(), join_fn=fn)
    want = [{"l": r["v"], "r": r["v_right"]} for r in reference(left, right, ["k"], how)]
    assert canonical(h.rows()) == canonical(want)


def test_a_semi_join_takes_no_join_function() -> None:
    with pytest.raises(ValueError, match="left_semi join has no pairs"):
        HashJoin(["k"], ["k"], "semi", join_fn=lambda a, b: a)


def test_the_build_input_is_selected_until_it_ends() -> None:
    op = HashJoin(["k"], ["k"], "left_outer", build_input=1)
    h = OperatorHarness(op, runtime_mode="BATCH")
    assert op.input_selection() == 1
    h.batch([{"k": 1}], input_index=1)
    assert op.input_selection() == 1
    h.end_input(1)
    assert op.input_selection() is None


def test_probe_rows_stream_out_as_they_come() -> None:
    op = HashJoin(["k"], ["k"], "inner", build_input=1)
    h = OperatorHarness(op, runtime_mode="BATCH", batch_size=100)
    h.batch(pa.record_batch({"k": list(range(10)), "name": [str(i) for i in range(10)]}), input_index=1)
    h.end_input(1)
    events = h.batch(pa.record_batch({"k": [1, 2, 2, 11]}))
    assert [r for e in events for r in e[1].to_pylist()] == [{"k": 1, "name": "1"}, {"k": 2, "name": "2"},
                                                            {"k": 2, "name": "2"}]


@pytest.mark.parametrize("keys", [list(range(0, 3000, 3)), list(range(0, 10**12, 10**9))], ids=["dense", "sparse"])
def test_the_index_finds_every_match_by_array_or_hash_lookup(keys: list[int]) -> None:
    build = pa.array(keys + keys[:10] + [None], pa.int64())  # ten keys twice, and a null
    index = JoinIndex([build])
    assert (index.dense_bytes > 0) == (keys[1] - keys[0] == 3)
    probe = pa.array([keys[5], None, -1, keys[-1], keys[3], 10**13], pa.int64())
    m = index.probe([probe])
    assert sorted(zip(m.probe.tolist(), m.build.tolist())) == [(0, 5), (0, len(keys) + 5), (3, len(keys) - 1),
                                                               (4, 3), (4, len(keys) + 3)]
