"""Per-row map/filter functions read as column expressions (worker/operators/lifting.py): the
lifted path must give exactly the batches (values and types) and exactly the errors of calling
the function row by row, on every batch, including the ones it hands back to the row path."""

from __future__ import annotations

import decimal
import math
from typing import Any, Callable

import pyarrow as pa
import pytest

from yarnflow.worker.operators.base import UserFunctionError
from yarnflow.worker.operators.lifting import lift
from yarnflow.worker.operators.rows import SchemaMismatchError
from yarnflow.worker.operators.transforms import RowFilter, RowMap

from tests.harness import OperatorHarness

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

OFF = {"python.row-functions.vectorize": "false"}
THRESHOLD = 2
SCALE = 0.5
MUTABLE = [1]

CLEAN = pa.record_batch({
    "word": ["a", "bb", "é", "", "zz"], "n": [1, -2, 0, 7, 2 ** 40], "x": [0.5, -1.0, math.nan, 3.25, 1e300],
    "flag": [True, False, True, False, True], "d": pa.array([0, 1, 2, 3, 19000], pa.date32()),
    "b": [b"x", b"", b"\x00", b"yy", b"z"],
})
DIRTY = [
    pa.record_batch({"word": ["a", None, "c"], "n": [1, None, 3], "x": [1.0, 2.0, None],
                     "flag": [None, True, False], "d": pa.array([None, 1, 2], pa.date32()), "b": [None, b"", b"a"]}),
    pa.record_batch({"word": ["a", "b"], "n": [2 ** 62, 2 ** 63 - 1], "x": [1.0, 2.0], "flag": [True, True],
                     "d": pa.array([1, 2], pa.date32()), "b": [b"", b""]}),                         # overflow on n * 2, n + 1
    pa.record_batch({"word": ["a", "b"], "n": [2 ** 53 + 1, 3], "x": [2.0 ** 53, 0.0], "flag": [True, False],
                     "d": pa.array([1, 2], pa.date32()), "b": [b"", b""]}),                         # beyond 2**53
    pa.record_batch({"word": ["a", "b"], "n": pa.array([1, 2], pa.int32()), "x": pa.array([1.0, 2.0], pa.float32()),
                     "flag": [True, False], "d": pa.array([1, 2], pa.date32()), "b": [b"", b""]}),  # other types
    pa.record_batch({"word": ["q"], "n": [0], "x": [0.0], "flag": [False], "d": pa.array([5], pa.date32()),
                     "b": [b"q"]}),                                                                 # zero divisors
    pa.record_batch({"word": ["a", "b"], "n": pa.array([decimal.Decimal("1.50"), decimal.Decimal("-2.25")]),
                     "x": pa.array([1, 2], pa.timestamp("ms")), "flag": [True, True], "d": pa.array([1, 2], pa.date32()),
                     "b": [b"", b""]}),                                                              # decimals
    pa.record_batch({"word": pa.array(["a", "b"], pa.large_string()), "n": [5, 6], "x": [1.0, 2.0],
                     "flag": [True, True], "d": pa.array([1, 2], pa.date32()), "b": [b"", b""]}),
]


def _lambda_with_local(r: dict[str, Any]) -> dict[str, Any]:
    w = r["word"]
    doubled = r["n"] * 2
    return {"w": w, "doubled": doubled, "w": w + "!"}  # noqa: F601 - a repeated key, as Python keeps it


MAPS_LIFTED: list[Callable[[dict[str, Any]], Any]] = [  # run as Arrow compute on CLEAN
    lambda row: {"word": row["word"], "count": 1},
    lambda r: {"n": r["n"], "x": r["x"], "flag": r["flag"], "d": r["d"], "b": r["b"]},
    lambda r: {"sum": r["n"] + 1, "mixed": r["n"] + r["x"], "prod": r["n"] * 2, "neg": -r["n"]},
    lambda r: {"gt": r["n"] > THRESHOLD, "le": r["x"] <= r["n"], "eq": r["word"] == "a", "ne": r["flag"] != True},  # noqa: E712
    lambda r: {"missing": r["word"] is None, "present": r["n"] is not None},
    lambda r: r["word"] + "-" + r["word"],
    lambda r: r["n"] - 3,
    lambda r: {"inc": r["n"] + 1},
    lambda r: {"lt": r["x"] < r["n"], "ge": r["n"] >= r["x"]},
    lambda r: {"k": "const", "f": 1.5, "t": True},
    _lambda_with_local,
]
MAPS_PER_ROW: list[Callable[[dict[str, Any]], Any]] = [  # handed to the row path on CLEAN
    lambda r: {"ratio": r["n"] / THRESHOLD, "div": r["x"] / r["n"], "scaled": r["x"] * SCALE},  # n == 0
    lambda r: {"same": r["n"] == "1"},
    lambda r: {"bool_int": r["flag"] == 1},
    lambda r: {"bad": r["word"] + r["n"]},       # TypeError per row, for every batch
    lambda r: {"nope": r["missing"]},            # KeyError per row
    lambda r: {"none": None, "n": r["n"]},       # a None column
]
MAPS = MAPS_LIFTED + MAPS_PER_ROW + [lambda r: {"mut": MUTABLE}]  # a list: not liftable at all
FILTERS: list[Callable[[dict[str, Any]], Any]] = [
    lambda r: r["n"] > 1,
    lambda r: r["x"] < r["n"] * SCALE,
    lambda r: r["word"] >= "b",
    lambda r: r["flag"],
    lambda r: r["word"] is not None,
    lambda r: r["n"],                            # truthiness of a number: per row
    lambda r: r["n"] / r["x"] > 0,
]


def _run(make: Callable[[], Any], batches: list[pa.RecordBatch], config: dict[str, str] | None) -> tuple[Any, Any]:
    h = OperatorHarness(make(), config=config or {})
    try:
        for batch in batches:
            h.batch(batch)
    except Exception as exc:  # noqa: BLE001 - compared below
        cause = exc.__cause__
        return ("error", type(exc), str(exc), type(cause), str(cause)), h.batches
    return "ok", h.batches


@pytest.mark.parametrize("batch", [CLEAN, *DIRTY], ids=["clean", "nulls", "overflow", "beyond-2**53", "int32",
                                                          "zero", "decimal", "large_string"])
@pytest.mark.parametrize("fn", MAPS + FILTERS, ids=lambda fn: "")
@pytest.mark.parametrize("first", [True, False], ids=["after-clean", "first"])
def test_lifted_and_per_row_give_the_same_batches_and_errors(fn: Callable[[dict[str, Any]], Any],
                                                           batch: pa.RecordBatch, first: bool):
    kind = RowMap if fn in MAPS else RowFilter
    batches = [CLEAN, batch] if first else [batch, CLEAN]
    lifted = _run(lambda: kind(fn, name="op"), batches, None)
    per_row = _run(lambda: kind(fn, name="op"), batches, OFF)
    assert lifted[0] == per_row[0]
    assert len(lifted[1]) == len(per_row[1])
    for got, want in zip(lifted[1], per_row[1]):
        assert got.schema == want.schema
        assert got.to_pylist() == want.to_pylist() or _same_with_nans(got, want)


def _same_with_nans(got: pa.RecordBatch, want: pa.RecordBatch) -> bool:
    def norm(v: Any) -> Any:
        return "NaN" if isinstance(v, float) and math.isnan(v) else v
    return [{k: norm(v) for k, v in r.items()} for r in got.to_pylist()] == \
           [{k: norm(v) for k, v in r.items()} for r in want.to_pylist()]


@pytest.mark.parametrize("fn", MAPS_LIFTED + MAPS_PER_ROW, ids=lambda fn: "")
def test_simple_maps_are_lifted_and_run_without_calls_on_clean_batches(fn: Callable[[dict[str, Any]], Any]):
    lifted = lift(fn, "map")
    assert lifted is not None
    assert (lifted.map_batch(CLEAN) is not None) == (fn in MAPS_LIFTED)


def test_the_readme_map_never_calls_the_function_per_row_on_clean_batches():
    calls: list[int] = []
    op = RowMap(lambda row: {"word": row["word"], "count": 1}, name="m")
    h = OperatorHarness(op)
    real = op.fn
    op.fn = lambda row: calls.append(1) or real(row)  # what the row path would call
    h.batch(CLEAN)
    h.batch(CLEAN)
    assert calls == []
    assert h.rows() == [{"word": w, "count": 1} for w in CLEAN["word"].to_pylist()] * 2
    assert h.batches[0].schema == pa.schema([("word", pa.string()), ("count", pa.int64())])


def _calls(r: dict[str, Any]) -> Any:
    return {"w": r["word"].title()}  # a method lifting_calls.py does not know


def _branches(r: dict[str, Any]) -> Any:
    for _ in range(2):  # a loop (conditional expressions lift: tests/unit/test_lifting_calls.py)
        pass
    return {"w": r["word"]}


def _ands(r: dict[str, Any]) -> Any:
    return r["flag"] ^ True  # (and / or / not lift: tests/unit/test_lifting_calls.py)


def _side_effect(r: dict[str, Any]) -> Any:
    MUTABLE.append(r["n"])
    return r


class _Callable:
    def __call__(self, r: dict[str, Any]) -> Any:
        return {"w": r["word"]}


@pytest.mark.parametrize("fn", [
    _calls, _branches, _ands, _side_effect, _Callable(), len, lambda r: r, lambda r: {"w": r.get("word")},
    lambda r: {"w": r["word"][0]}, lambda r: {"w": repr(r["n"])}, lambda r, k=1: {"w": k},
    lambda r: {r["word"]: 1}, lambda r: (r["n"], r["x"]), lambda r: {"w": r["n"] // 2},
    lambda r: {"w": r["n"] % 2}, lambda r: {"w": r["n"] ** 2},
])
def test_anything_else_stays_per_row(fn: Callable[..., Any]):
    assert lift(fn, "map") is None
    assert lift(fn, "filter") is None


def test_flat_map_and_other_kinds_are_not_lifted():
    assert lift(lambda r: {"w": r["word"]}, "flat_map") is None
    assert lift(lambda r: {"w": r["word"]}, "filter") is None  # a dict's truth value: per row


def test_globals_are_read_again_for_each_batch():
    global THRESHOLD
    h = OperatorHarness(RowFilter(lambda r: r["n"] > THRESHOLD))
    try:
        h.batch(CLEAN)
        THRESHOLD = 6
        h.batch(CLEAN)
    finally:
        THRESHOLD = 2
    assert [r["n"] for r in h.rows()] == [7, 2 ** 40, 7, 2 ** 40]


def test_a_closure_variable_that_changes_type_goes_per_row():
    limit: Any = 1
    h = OperatorHarness(RowMap(lambda r: {"over": r["n"] > limit}, name="m"))
    h.batch(CLEAN)
    limit = "text"
    with pytest.raises(UserFunctionError, match="operator 'm' raised TypeError"):
        h.batch(CLEAN)


def test_an_error_after_lifted_batches_is_the_per_row_error_naming_the_row():
    h = OperatorHarness(RowMap(lambda r: {"q": r["x"] / r["n"]}, name="div"))
    h.batch(CLEAN.slice(0, 2))  # lifted: no zero divisor
    with pytest.raises(UserFunctionError, match="operator 'div' raised ZeroDivisionError") as info:
        h.batch(CLEAN)  # n == 0 in the third row
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert len(h.batches) == 1


def test_a_lifted_batch_that_does_not_fit_the_fixed_schema_is_the_per_row_schema_error():
    h = OperatorHarness(RowMap(lambda r: {"v": r["n"]}, name="m"))
    h.batch(CLEAN)
    other = pa.record_batch({"n": ["text"]})
    with pytest.raises(SchemaMismatchError, match="operator 'm' emitted rows on its output"):
        h.batch(other)


def test_vectorize_off_calls_the_function_per_row():
    op = RowMap(lambda r: {"w": r["word"]})
    OperatorHarness(op, config=OFF)
    assert op._lift is None
    op2 = RowMap(lambda r: {"w": r["word"]})
    OperatorHarness(op2)
    assert op2._lift is not None
