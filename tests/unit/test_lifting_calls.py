"""String methods and builtins in lifted per-row functions (worker/operators/lifting_calls.py):
the lifted path gives exactly the batches and errors of calling the function row by row, on
batches where Arrow and Python agree (lifted) and on those where they could differ (non-ASCII
text, Python-only whitespace, nulls, short splits, numbers Arrow parses differently), which go
per row."""

from __future__ import annotations

from typing import Any, Callable

import pyarrow as pa
import pytest

from tests.harness import OperatorHarness
from tests.unit.test_lifting import OFF, _run, _same_with_nans
from yarnflow.worker.operators.lifting import lift
from yarnflow.worker.operators.transforms import RowFilter, RowMap

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

SEP = ","
PREFIX = "ab"
START = 1

TEXT = pa.record_batch({  # ASCII, no nulls: everything below lifts
    "s": ["  Ab,c d ", "x", "ab,,ab", "\tQ\n", "a b c"],
    "num": ["12", "-3", "0", "007", "-0"],
    "f": ["1.5", "-2e3", "inf", "0", "7"],
    "n": [1, -2, 0, 7, 2 ** 40],
    "x": [0.5, -1.75, 3.0, -0.0, 1e10],
})
ODD = [
    pa.record_batch({"s": ["ß", "é ", "\u00a0a", "x", "Ab"], "num": ["1", "2", "3", "4", "5"],
                     "f": ["1", "2", "3", "4", "5"], "n": [1, 2, 3, 4, 5], "x": [1.0, 2.0, 3.0, 4.0, 5.0]}),  # non-ASCII
    pa.record_batch({"s": ["a\x1cb", " \x1f", "c", "d", "e"], "num": [" 1", "+2", "1_0", "٣", "x"],
                     "f": [" 1.5", "1_0.5", "nan", "Infinity", "-inf"], "n": [2 ** 53 + 1, -1, 0, 1, 2],
                     "x": [float("nan"), float("inf"), 1e300, -1e300, 2.5]}),   # Python-only whitespace, odd numbers
    pa.record_batch({"s": ["a", None, "c", "", " "], "num": ["1", None, "3", "4", "5"],
                     "f": [None, "1", "2", "3", "4"], "n": [1, None, 3, 4, 5], "x": [1.0, 2.0, None, 4.0, 5.0]}),  # nulls
    pa.record_batch({"s": ["", "   ", "a", "b c", "d"], "num": ["99999999999999999999", "1", "2", "3", "4"],
                     "f": ["1", "2", "3", "4", "5"], "n": [-(2 ** 63), 1, 2, 3, 4], "x": [1.0, 2.0, 3.0, 4.0, 5.0]}),  # empty parts, overflow
]

def _if_statements(r: dict[str, Any]) -> dict[str, Any]:
    if r["n"] > 0:
        return {"sign": "+", "v": r["n"]}
    if r["n"] is None:
        return {"sign": "?", "v": 0}
    return {"sign": "-", "v": -r["n"]}


MAPS_LIFTED: list[Callable[[dict[str, Any]], Any]] = [  # run as Arrow compute on TEXT
    lambda r: {"word": r["s"].strip(), "count": 1},
    lambda r: {"l": r["s"].lstrip(), "r": r["s"].rstrip(), "c": r["s"].strip(" ,")},
    lambda r: {"lo": r["s"].lower(), "up": r["s"].upper(), "both": r["s"].strip().lower()},
    lambda r: {"a": r["s"].startswith("ab"), "b": r["s"].endswith(PREFIX), "c": r["s"].startswith(PREFIX)},
    lambda r: {"rep": r["s"].replace("ab", "Z"), "sep": r["s"].replace(SEP, ";")},
    lambda r: {"in": "b" in r["s"], "not_in": SEP not in r["s"]},
    lambda r: {"first": r["s"].split()[0], "last_sep": r["s"].split(SEP)[0]},
    lambda r: {"len": len(r["s"]), "len2": len(r["s"].strip())},
    lambda r: {"i": int(r["num"]), "fi": int(r["x"]), "ii": int(r["n"])},
    lambda r: {"f": float(r["f"]), "fn": float(r["n"]), "ff": float(r["x"])},
    lambda r: {"s": str(r["n"]), "ss": str(r["s"]), "a": abs(r["n"]), "ax": abs(r["x"])},
    lambda r: {"k": r["s"].strip().lower(), "n": int(r["num"]) * 2 + len(r["s"])},
    lambda r: {"mn": min(r["n"], 3), "mx": max(r["x"], 0.0), "ms": min(r["s"], "b"), "m2": max(0, r["n"])},
    lambda r: {"r": round(r["x"]), "ri": round(r["n"]), "rx": round(r["x"] * 2.5)},
    lambda r: {"w": r["s"].strip() if r["n"] > 0 else "neg", "big": r["x"] if r["x"] > 1 else -r["x"]},
    lambda r: {"k": ("a" if r["s"].startswith("a") else "b") if len(r["s"]) > 1 else "c"},
    _if_statements,
    lambda r: r["n"] if r["n"] is not None else 0,
    lambda r: {"both": r["n"] > 0 and r["x"] > 0, "either": r["n"] > 0 or r["s"] == "x",
               "mixed": r["n"] > 0 and r["x"] > 0 or r["s"].startswith("a")},
    lambda r: {"a": r["s"][1:3], "b": r["s"][:2], "c": r["s"][-2:], "d": r["s"][2:-1], "e": r["s"][-9:9],
               "f": r["s"][START:], "g": r["s"][:], "h": r["s"].strip()[0:1]},
    lambda r: {"n": not r["s"].endswith("d "), "nn": not (r["n"] > 0 and not r["x"] < 0)},
]
MAPS_PER_ROW: list[Callable[[dict[str, Any]], Any]] = [  # lifted, but handed to the row path on TEXT
    lambda r: {"second": r["s"].split()[1]},            # "x" has one part: IndexError per row
    lambda r: {"e": r["s"].replace("", "-")},           # an empty pattern inserts everywhere
    lambda r: {"f": str(r["x"]), "b": str(r["n"] > 0)},  # Python writes 1.0 and True
    lambda r: {"w": r["n"].strip()},                     # AttributeError per row
    lambda r: {"w": len(r["n"])},                        # TypeError per row
    lambda r: {"m": min(r["n"], 0.5)},                   # int or float per row
    lambda r: {"c": 1 if r["n"] > 0 else 2.5},           # an int or a float per row
    lambda r: {"c": 1 if r["n"] > 0 else True},          # equal values of two types
    lambda r: {"c": r["s"] if r["s"] else "empty"},      # truthiness of a string: per row
    lambda r: {"c": r["s"] and r["num"]},                # and of strings gives a string: per row
    lambda r: {"d": 10 / r["n"] if r["n"] != 0 else 0.0},  # the branch not taken divides by zero
    lambda r: {"s": r["s"][::2]},                        # a step: per row
    lambda r: {"n": not r["s"]},                         # not of a string is its truthiness
    lambda r: {"s": r["n"][1:]},                         # TypeError per row
]
FILTERS: list[Callable[[dict[str, Any]], Any]] = [
    lambda r: r["n"] > 0 and not r["s"].startswith("a") or r["x"] < 0,
    lambda r: r["s"].startswith("a"),
    lambda r: "," in r["s"],
    lambda r: len(r["s"].strip()) > 1,
    lambda r: r["s"].strip().lower() == "ab,c d",
    lambda r: not r["s"].endswith("7"),
    lambda r: r["s"][:2] == "ab",
]
MAPS = MAPS_LIFTED + MAPS_PER_ROW


@pytest.mark.parametrize("batch", [TEXT, *ODD], ids=["ascii", "non-ascii", "python-only", "nulls", "empty-parts"])
@pytest.mark.parametrize("fn", MAPS + FILTERS, ids=lambda fn: "")
def test_lifted_calls_give_the_same_batches_and_errors_as_per_row(fn: Callable[[dict[str, Any]], Any],
                                                                 batch: pa.RecordBatch) -> None:
    kind = RowMap if fn in MAPS else RowFilter
    lifted = _run(lambda: kind(fn, name="op"), [TEXT, batch], None)
    per_row = _run(lambda: kind(fn, name="op"), [TEXT, batch], OFF)
    assert lifted[0] == per_row[0]
    assert len(lifted[1]) == len(per_row[1])
    for got, want in zip(lifted[1], per_row[1]):
        assert got.schema == want.schema
        assert got.to_pylist() == want.to_pylist() or _same_with_nans(got, want)


@pytest.mark.parametrize("fn", MAPS, ids=lambda fn: "")
def test_calls_lift_and_run_without_per_row_calls_where_arrow_and_python_agree(
        fn: Callable[[dict[str, Any]], Any]) -> None:
    lifted = lift(fn, "map")
    assert lifted is not None
    assert (lifted.map_batch(TEXT) is not None) == (fn in MAPS_LIFTED)


def test_the_realistic_word_count_map_runs_as_arrow_compute() -> None:
    calls: list[int] = []
    op = RowMap(lambda r: {"word": r["word"].strip(), "count": 1}, name="m")
    h = OperatorHarness(op)
    real = op.fn
    op.fn = lambda row: calls.append(1) or real(row)
    h.batch(pa.record_batch({"word": [" a", "b ", "c"]}))
    assert calls == [] and h.rows() == [{"word": w, "count": 1} for w in "abc"]


def len_shadowed(r: dict[str, Any]) -> Any:
    return {"n": len(r["s"])}


def test_a_module_that_defines_its_own_builtin_name_stays_per_row() -> None:
    len_shadowed.__globals__["len"] = lambda s: 42
    try:
        assert lift(len_shadowed, "map") is None
    finally:
        del len_shadowed.__globals__["len"]
    lifted = lift(len_shadowed, "map")
    assert lifted is not None
    len_shadowed.__globals__["len"] = lambda s: 42  # defined after the function was lifted
    try:
        assert lifted.map_batch(TEXT) is None
    finally:
        del len_shadowed.__globals__["len"]


@pytest.mark.parametrize("fn", [
    lambda r: {"t": r["s"].title()}, lambda r: {"p": r["s"].split()}, lambda r: {"p": r["s"].split()[-1]},
    lambda r: {"i": int(r["num"], 16)}, lambda r: {"r": round(r["x"], 1)}, lambda r: {"s": r["s"].strip(chars="a")},
    lambda r: {"m": min(r["n"], 1, 2)},
    lambda r: {"j": ",".join(r["s"])},
], ids=lambda fn: "")
def test_calls_it_does_not_know_stay_per_row(fn: Callable[[dict[str, Any]], Any]) -> None:
    lifted = lift(fn, "map")
    assert lifted is None or lifted.map_batch(TEXT) is None


def test_an_operator_says_whether_it_ran_vectorised_or_per_row_and_why() -> None:
    op = RowMap(lambda r: {"w": r["s"].strip()}, name="m")
    h = OperatorHarness(op)
    h.batch(TEXT)
    assert op.execution_path() == "vectorised (Arrow compute)"
    h.batch(ODD[0])
    assert op.execution_path() == ("vectorised, 1 of 2 batches per row (the last because of non-ASCII text "
                                   "(Python's and Arrow's Unicode rules differ))")
    titled = RowMap(lambda r: {"w": r["s"].title()}, name="t")
    OperatorHarness(titled).batch(TEXT)
    assert titled.execution_path() == "per row (it calls .title())"
    off = RowFilter(lambda r: r["s"].startswith("a"), name="f")
    OperatorHarness(off, config=OFF).batch(TEXT)
    assert off.execution_path() == "per row (python.row-functions.vectorize is false)"
    looped = RowMap(lambda r: {"w": [c for c in r["s"]]}, name="b")
    OperatorHarness(looped).batch(TEXT)
    assert looped.execution_path().startswith("per row (it uses ")


def test_yarnflow_info_shows_each_operators_path_once_or_per_subtask_when_they_differ() -> None:
    from yarnflow.cli_views import operator_paths
    from yarnflow.common.messages import TaskMetrics

    lifted, fell_back = "vectorised (Arrow compute)", "vectorised, 1 of 3 batches per row (the last because of x)"
    same = [TaskMetrics(operator_paths=["", lifted, ""]), TaskMetrics(operator_paths=["", lifted, ""])]
    assert operator_paths("src -> m -> sink", same) == [f"m: {lifted}"]
    differ = [TaskMetrics(operator_paths=["", lifted, ""]), TaskMetrics(operator_paths=["", fell_back, ""])]
    assert operator_paths("src -> m -> sink", differ) == [f"m (subtask 0): {lifted}", f"m (subtask 1): {fell_back}"]
    assert operator_paths("src -> sink", [TaskMetrics()]) == []  # nothing reported (an older TaskExecutor)
