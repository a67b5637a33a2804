"""A cancelled task stops inside a batch when its per-row user function is slow: the per-row
operators (map, filter, flat_map, keyed reduce, keyed process function) hand the function a
slice of rows at a time (``Operator.row_slices``), sized to the function's pace, and check for
cancellation between slices. A fast function still gets whole batches."""

from __future__ import annotations

import time
from typing import Any, Callable

import pyarrow as pa
import pytest

from yarnflow.common.api.functions import AggregateFunction, KeyedProcessFunction
from yarnflow.common.api.windows import TumblingEventTimeWindows
from yarnflow.worker.operators import base
from yarnflow.worker.operators.base import Operator, TaskCancelledError
from yarnflow.worker.operators.batch.hash_join import HashJoin
from yarnflow.worker.operators.keyed import KeyedReduce
from yarnflow.worker.operators.process import KeyedAggregateFunctionOperator, KeyedProcessOperator
from yarnflow.worker.operators.windows.aggregate import WindowAggregateOperator
from yarnflow.worker.operators.transforms import RowFilter, RowFlatMap, RowMap

from tests.harness import OperatorHarness

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

ROWS = 2_000
SLOW_S = 0.002  # per call: a whole batch would take 4 s


class Calls:
    """Counts calls to a user function; slow ones sleep; cancels the task after ``cancel_after``."""

    def __init__(self, slow: bool, cancel_after: int | None = None) -> None:
        self.n = 0
        self.slow = slow
        self.cancel_after = cancel_after

    def tick(self) -> None:
        self.n += 1
        if self.slow:
            time.sleep(SLOW_S)

    def cancelled(self) -> bool:
        return self.cancel_after is not None and self.n >= self.cancel_after


class Echo(KeyedProcessFunction):
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        self.calls.tick()
        out.collect(row)


class Total(AggregateFunction):
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    def create_accumulator(self) -> int:
        return 0

    def add(self, row: dict[str, Any], acc: int) -> int:
        self.calls.tick()
        return acc + row["v"]

    def get_result(self, acc: int) -> dict[str, Any]:
        return {"v": acc}

    def merge(self, a: int, b: int) -> int:
        return a + b


def operators(calls: Calls) -> dict[str, Callable[[], Operator]]:
    def fn(row: dict[str, Any]) -> Any:
        calls.tick()
        return row

    def keep(row: dict[str, Any]) -> bool:
        calls.tick()
        return row["v"] >= 0

    def many(row: dict[str, Any]) -> list[dict[str, Any]]:
        calls.tick()
        return [row]

    def add(acc: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        calls.tick()
        return {"k": acc["k"], "v": acc["v"] + row["v"]}

    return {
        "map": lambda: RowMap(fn),
        "filter": lambda: RowFilter(keep),
        "flat_map": lambda: RowFlatMap(many),
        "reduce (keys grouped)": lambda: KeyedReduce(["k"], add),
        "reduce (two key columns)": lambda: KeyedReduce(["k", "k2"], add),
        "process (keys grouped)": lambda: KeyedProcessOperator(["k"], Echo(calls)),
        "process (float keys)": lambda: KeyedProcessOperator(["f"], Echo(calls)),
        "aggregate function": lambda: KeyedAggregateFunctionOperator(["k"], Total(calls)),
        "window with an aggregate function": lambda: WindowAggregateOperator(
            ["k"], TumblingEventTimeWindows.of(10**9), "ts", aggregate_function=Total(calls)),
    }


KEYS = 50  # 40 rows each, spread over the batch: a reduce calls its function for all rows but a key's first


def batch() -> pa.RecordBatch:
    keys = [i % KEYS for i in range(ROWS)]
    return pa.record_batch({"k": keys, "k2": keys, "f": [float(k) for k in keys], "v": list(range(ROWS)),
                            "ts": pa.array(list(range(ROWS)), pa.int64())})


KINDS = list(operators(Calls(False)))


@pytest.mark.parametrize("kind", KINDS)
def test_a_cancelled_task_stops_within_a_slice_of_a_slow_functions_batch(kind: str) -> None:
    calls = Calls(slow=True, cancel_after=10)
    op = operators(calls)[kind]()
    OperatorHarness(op, runtime_mode="STREAMING", cancelled=calls.cancelled,
                    config={"python.row-functions.vectorize": "false"})
    began = time.monotonic()
    with pytest.raises(TaskCancelledError):
        op.process_batch(batch())
    # the first slice (64 rows) is the most it runs before it knows the function's pace
    assert 10 <= calls.n <= 64
    calls.n = 0
    with pytest.raises(TaskCancelledError):  # now slices of ~50 ms (25 calls; up to twice that where
        op.process_batch(batch())            # rows without a call made the pace look faster)
    assert 10 <= calls.n <= 10 + 60
    assert time.monotonic() - began < 2.0    # the whole batch would have taken 4 s, each time


@pytest.mark.parametrize("kind", KINDS)
def test_an_uncancelled_slow_function_still_sees_every_row_once(kind: str) -> None:
    calls = Calls(slow=False)
    op = operators(calls)[kind]()
    h = OperatorHarness(op, runtime_mode="STREAMING", cancelled=lambda: False,
                        config={"python.row-functions.vectorize": "false"})
    op._slice_rows = 7  # many slices, one row at the edges of each
    h.batch(batch())
    expected = ROWS - KEYS if kind.startswith("reduce") else ROWS  # a reduce: not for a key's first row
    assert calls.n == expected
    totals = {k: sum(range(k, ROWS, KEYS)) for k in range(KEYS)}
    if kind.startswith("window"):
        h.finish()  # the input ends: the window fires
    if kind.startswith(("reduce", "aggregate", "window")):
        assert {r["k"]: r["v"] for r in h.rows()} == totals  # (upserts: each key's last row)
    else:
        assert sorted(r["v"] for r in h.rows()) == list(range(ROWS))


def test_a_fast_function_gets_whole_batches_once_its_pace_is_known() -> None:
    calls = Calls(slow=False)
    op = RowMap(lambda row: (calls.tick(), row)[1])
    OperatorHarness(op, runtime_mode="STREAMING", config={"python.row-functions.vectorize": "false"})
    op.process_batch(batch())
    assert op._slice_rows >= ROWS  # after the first batch: one slice per batch
    assert base.ROW_SLICE_SECONDS * 1000 >= 10


def test_a_cancelled_batch_join_stops_within_a_slice_of_its_slow_join_function() -> None:
    """A batch join calls its join function on every joined row: here, as the build side ends
    (the harness gave the probe rows first)."""
    calls = Calls(slow=True, cancel_after=10)

    def join_fn(left: dict[str, Any], right: dict[str, Any] | None) -> dict[str, Any]:
        calls.tick()
        return {"k": left["k"], "v": left["v"] + (right["w"] if right else 0)}

    op = HashJoin(["k"], ["k"], "left_outer", join_fn=join_fn)
    h = OperatorHarness(op, runtime_mode="BATCH", cancelled=calls.cancelled)
    h.batch(batch(), input_index=0)
    h.batch(pa.record_batch({"k": list(range(0, KEYS, 2)), "w": [1] * (KEYS // 2)}), input_index=1)
    h.end_input(0)
    with pytest.raises(TaskCancelledError):
        h.end_input(1)
        op.finish()
    assert 10 <= calls.n <= 64


def test_a_batch_join_with_unmatched_rows_and_small_slices_calls_its_function_once_a_row() -> None:
    seen: list[tuple[int, bool]] = []

    def join_fn(left: dict[str, Any], right: dict[str, Any] | None) -> dict[str, Any]:
        seen.append((left["v"], right is not None))
        return {"v": left["v"]}

    op = HashJoin(["k"], ["k"], "left_outer", join_fn=join_fn)
    h = OperatorHarness(op, runtime_mode="BATCH")
    op._slice_rows = 7
    h.batch(batch(), input_index=0)
    h.batch(pa.record_batch({"k": list(range(0, KEYS, 2)), "w": [1] * (KEYS // 2)}), input_index=1)
    h.end_input(0)
    h.end_input(1)
    h.finish()
    assert sorted(seen) == [(v, v % KEYS % 2 == 0) for v in range(ROWS)]
    assert sorted(r["v"] for r in h.rows()) == list(range(ROWS))
