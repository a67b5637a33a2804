"""The per-row hot path (worker/operators/rows.py, transforms.py, keyed.py, process.py): rows made
a column at a time are the rows ``to_pylist`` makes, the columnar output path builds the batches
``from_pylist`` builds, and every error a user function causes is the error the operators
raised row by row: for the right row, naming the operator, with the original chained."""

from __future__ import annotations

import collections
import datetime
import decimal
import gc
from typing import Any

import pyarrow as pa
import pytest

from yarnflow.common.api.functions import KeyedProcessFunction
from yarnflow.common.api.state import ValueStateDescriptor
from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.operators.base import UserFunctionError
from yarnflow.worker.operators.keyed import KeyedReduce
from yarnflow.worker.operators.process import KeyedProcessOperator
from yarnflow.worker.operators.rows import RowBuffer, SchemaMismatchError, gc_paused, row_dicts
from yarnflow.worker.operators.transforms import RowFilter, RowFlatMap, RowMap

from tests.harness import OperatorHarness

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

BATCHES = [pa.record_batch({"word": [f"w{b}{i}" for i in range(5)], "n": list(range(b * 5, b * 5 + 5))})
           for b in range(3)]


# -- rows in, batches out ----------------------------------------------------------------------

@pytest.mark.parametrize("batch", [
    BATCHES[0],
    pa.record_batch({"s": ["a", None], "l": [[1, 2], None], "m": pa.array([[("k", 1)], None], pa.map_(pa.string(), pa.int64())),
                     "d": [datetime.date(2024, 1, 2), None], "dec": [decimal.Decimal("1.5"), None],
                     "st": [{"x": 1}, None]}),
    pa.record_batch([pa.array([1, 2]), pa.array(["a", "b"])], names=["dup", "dup"]),   # a name twice
    pa.record_batch({f"c{i}": [i, i + 1] for i in range(100)}),                        # past the generated sizes
    pa.record_batch({"weird 'name'\n\"x\"": [1, 2], "def": [3, 4]}),                   # names that are not identifiers
    BATCHES[0].slice(2, 2),
    BATCHES[0].slice(0, 0),
])
def test_rows_are_what_to_pylist_makes(batch: pa.RecordBatch):
    assert row_dicts(batch) == batch.to_pylist()


def test_rows_of_a_batch_without_columns():
    batch = pa.RecordBatch.from_pydict({}).slice(0, 0)
    assert row_dicts(batch) == batch.to_pylist()
    three = pa.Table.from_batches([BATCHES[0].slice(0, 3)]).select([]).to_batches()[0]
    assert row_dicts(three) == [{}, {}, {}]


@pytest.mark.parametrize("rows", [
    [{"a": 1, "b": "x"}, {"a": 2, "b": None}],
    [{"b": "x", "a": 1}],                                                 # another key order
    [{"a": 1}, {"a": 2, "b": "y"}],                                       # a missing column: null
    [collections.defaultdict(int, {"a": 1, "b": "x"}), {"a": 2}],        # a dict subclass
    [collections.OrderedDict(a=1, b="q")],
    [{"a": 1.0, "b": "x"}],                                               # an int column takes 1.0
])
def test_batches_from_rows_are_what_from_pylist_makes_once_the_schema_is_fixed(rows: list[dict[str, Any]]):
    buffer = RowBuffer("op")
    buffer.to_batch([{"a": 0, "b": "first"}])
    assert buffer.to_batch(rows) == pa.RecordBatch.from_pylist(rows, schema=buffer.schema)


@pytest.mark.parametrize("rows, error", [
    ([{"a": 1, "c": 3}], r"new columns \['c'\]"),                           # one missing, one new
    ([{"a": 1, "b": "x", "c": 3}], r"new columns \['c'\]"),
    ([{"a": "not a number", "b": "x"}], "operator 'op' emitted rows"),
])
def test_rows_that_do_not_fit_the_fixed_schema_raise_as_before(rows: list[dict[str, Any]], error: str):
    buffer = RowBuffer("op")
    buffer.to_batch([{"a": 0, "b": "first"}])
    with pytest.raises(SchemaMismatchError, match=error):
        buffer.to_batch(rows)


def test_gc_is_paused_inside_and_restored_after_also_when_nested_or_raising():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError), gc_paused():
        raise KeyError("x")
    assert gc.isenabled()


# -- user function errors: the right row, the operator's name, the original chained -------------

def _fail_on(word: str, result: Any) -> Any:
    def fn(row: dict[str, Any]) -> Any:
        if row["word"] == word:
            raise ValueError(f"bad row {row['word']}")
        return result(row)

    return fn


@pytest.mark.parametrize("make", [
    lambda fn: RowMap(fn, name="op"),
    lambda fn: RowFilter(fn, name="op"),
    lambda fn: RowFlatMap(lambda r: [fn(r)], name="op"),
])
def test_an_error_in_the_third_row_of_the_second_batch_names_that_row_and_the_operator(make):
    calls: list[str] = []

    def record(row: dict[str, Any]) -> Any:
        calls.append(row["word"])
        return {"word": row["word"]}

    h = OperatorHarness(make(_fail_on("w12", record)))
    h.batch(BATCHES[0])
    with pytest.raises(UserFunctionError, match="in operator 'op' raised ValueError: bad row w12") as info:
        h.batch(BATCHES[1])
    assert isinstance(info.value.__cause__, ValueError)
    assert calls == [f"w0{i}" for i in range(5)] + ["w10", "w11"]  # nothing after the failing row
    assert len(h.batches) == 1  # the failed batch emitted nothing


@pytest.mark.parametrize("make", [
    lambda fn: RowMap(fn, name="op"), lambda fn: RowFilter(fn, name="op"), lambda fn: RowFlatMap(fn, name="op")])
def test_a_user_function_raising_stop_iteration_is_an_error_not_the_end_of_the_batch(make):
    def fn(row: dict[str, Any]) -> Any:
        if row["n"] == 2:
            raise StopIteration("from next() on an empty iterator")
        return [row] if isinstance(op, RowFlatMap) else row

    op = make(fn)
    h = OperatorHarness(op)
    with pytest.raises(UserFunctionError, match="operator 'op' raised StopIteration: from next"):
        h.batch(BATCHES[0])
    assert h.batches == []


def test_map_returning_none_and_scalars_puts_them_in_column_value():
    h = OperatorHarness(RowMap(lambda r: None if r["n"] % 2 else r["n"]))
    h.batch(BATCHES[0])
    h.batch(BATCHES[1])
    assert [r["value"] for r in h.rows()] == [0, None, 2, None, 4, None, 6, None, 8, None]


def test_map_whose_rows_change_their_columns_between_batches_names_the_operator():
    h = OperatorHarness(RowMap(lambda r: {"word": r["word"]} if r["n"] < 5 else {"other": r["n"]}, name="shifty"))
    h.batch(BATCHES[0])
    with pytest.raises(SchemaMismatchError, match=r"operator 'shifty'.*new columns \['other'\]"):
        h.batch(BATCHES[1])


def test_map_whose_value_types_change_between_batches_names_the_operator():
    h = OperatorHarness(RowMap(lambda r: {"v": r["n"] if r["n"] < 5 else r["word"]}, name="shifty"))
    h.batch(BATCHES[0])
    with pytest.raises(SchemaMismatchError, match="operator 'shifty' emitted rows on its output"):
        h.batch(BATCHES[1])


class _NoTruth:
    def __bool__(self) -> bool:
        raise ValueError("the truth value is ambiguous")


def test_filter_result_without_a_truth_value_raises_its_own_error_before_a_later_rows_error():
    def fn(row: dict[str, Any]) -> Any:
        if row["n"] == 1:
            return _NoTruth()
        if row["n"] == 3:
            raise KeyError("later")
        return True

    h = OperatorHarness(RowFilter(fn, name="f"))
    with pytest.raises(ValueError, match="ambiguous"):
        h.batch(BATCHES[0])


def test_filter_keeps_rows_by_truth_value_of_any_result():
    h = OperatorHarness(RowFilter(lambda r: [None, 0, "x", [], [1]][r["n"]]))
    h.batch(BATCHES[0])
    assert [r["n"] for r in h.rows()] == [2, 4]


def test_flat_map_calls_and_drains_each_rows_result_in_turn():
    """A generator made for one row is read before the function is called on the next row."""
    seen: list[int] = []

    def fn(row: dict[str, Any]) -> Any:
        seen.append(row["n"])
        return ({"n": row["n"], "seen": len(seen)} for _ in range(1))

    h = OperatorHarness(RowFlatMap(fn))
    h.batch(BATCHES[0])
    assert [r["seen"] for r in h.rows()] == [1, 2, 3, 4, 5]


# -- keyed paths --------------------------------------------------------------------------------

KEYED = pa.record_batch({"k": ["a", "b", "a", "c", "a", "b"], "v": [1, 2, 3, 4, 5, 6]})


@pytest.mark.parametrize("mode", ["STREAMING", "BATCH"])
def test_reduce_sees_each_keys_rows_in_order_and_the_key_stays(mode: str):
    calls: list[tuple[int, int]] = []

    def fn(acc: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        calls.append((acc["v"], row["v"]))
        return {"k": "changed", "v": acc["v"] * 10 + row["v"]}

    h = OperatorHarness(KeyedReduce(["k"], fn, name="r"), runtime_mode=mode)
    h.batch(KEYED)
    h.batch(KEYED.slice(0, 2))
    h.finish()
    assert calls == [(1, 3), (13, 5), (2, 6), (135, 1), (26, 2)]  # the order of the rows
    final = {r["k"]: r["v"] for r in h.rows()}
    assert final == {"a": 1351, "b": 262, "c": 4}
    if mode == "STREAMING":  # after each batch, the keys it touched, in the order first touched
        assert [r["k"] for r in h.batches[0].to_pylist()] == ["a", "b", "c"]


def test_reduce_error_in_a_later_row_and_a_non_dict_result_name_the_operator():
    h = OperatorHarness(KeyedReduce(["k"], lambda a, r: 1 / (r["v"] - 5), name="r"))
    with pytest.raises(JobDefinitionError, match="reduce function in operator 'r' must return a dict row"):
        h.batch(KEYED)

    def fn(acc: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        if row["v"] == 5:
            raise ZeroDivisionError("row five")
        return dict(acc, v=acc["v"] + row["v"])

    h2 = OperatorHarness(KeyedReduce(["k"], fn, name="r2"))
    with pytest.raises(UserFunctionError, match="operator 'r2' raised ZeroDivisionError: row five"):
        h2.batch(KEYED)


class _Numbering(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.seen = ValueStateDescriptor("seen", 0)

    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        state = ctx.get_state(self.seen)
        if row["v"] == 99:
            raise RuntimeError(f"row of key {ctx.current_key}")
        state.update(state.value() + 1)
        out.collect({"k": ctx.current_key, "seq": state.value(), "v": row["v"]})


def test_keyed_process_function_state_per_key_and_errors_naming_the_operator():
    h = OperatorHarness(KeyedProcessOperator(["k"], _Numbering(), name="num"))
    h.batch(KEYED)
    assert h.rows() == [{"k": "a", "seq": 1, "v": 1}, {"k": "b", "seq": 1, "v": 2}, {"k": "a", "seq": 2, "v": 3},
                        {"k": "c", "seq": 1, "v": 4}, {"k": "a", "seq": 3, "v": 5}, {"k": "b", "seq": 2, "v": 6}]
    with pytest.raises(UserFunctionError, match="operator 'num' raised RuntimeError: row of key b"):
        h.batch(pa.record_batch({"k": ["a", "b"], "v": [7, 99]}))
