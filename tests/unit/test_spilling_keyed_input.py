"""Keyed operators of BATCH jobs behind a SpillingKeyedInput: with a budget too small for their
input they run once per spilled partition of keys, and give exactly what they give on the
whole input at once: a reduce that depends on the order of each key's rows, an
AggregateFunction, a KeyedProcessFunction with event-time timers and keyed state, event-time
windows. The budget holds, the spill files go, the user function's close is called."""

from __future__ import annotations

import copy
import logging
import random
from typing import Any

import pyarrow as pa
import pytest

from tests.harness import OperatorHarness
from yarnflow.common.api.functions import AggregateFunction, KeyedProcessFunction
from yarnflow.common.api.state import ValueStateDescriptor
from yarnflow.worker.memory.manager import MemoryBudget
from yarnflow.worker.memory.spill import SpillFiles
from yarnflow.worker.operators.base import Operator
from yarnflow.worker.operators.batch.keyed_input import SpillingKeyedInput, wants_spilling_input
from yarnflow.worker.operators.keyed import KeyedAggregate, KeyedReduce
from yarnflow.worker.operators.process import KeyedAggregateFunctionOperator, KeyedProcessOperator
from yarnflow.worker.operators.windows import WindowAggregateOperator, WindowJoinOperator
from yarnflow.worker.elements import MAX_WATERMARK
from yarnflow.windows import TumblingEventTimeWindows, TumblingProcessingTimeWindows

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


def batches(n: int = 6000, keys: int = 700, seed: int = 9) -> list[pa.RecordBatch]:
    rng = random.Random(seed)
    rows = [{"k": f"key{rng.randrange(keys)}", "v": i, "ts": 1000 + i * 3} for i in range(n)]
    return [pa.RecordBatch.from_pylist(rows[i:i + 300]) for i in range(0, n, 300)]


class Sum(AggregateFunction[list]):
    def create_accumulator(self) -> list:
        return [0, 0]

    def add(self, row: dict, acc: list) -> list:
        return [acc[0] + row["v"], acc[1] + 1]

    def get_result(self, acc: list) -> dict:
        return {"total": acc[0], "n": acc[1]}


class FirstAndTimer(KeyedProcessFunction):
    closed = 0

    def process_element(self, row: dict, ctx: Any, out: Any) -> None:
        first = ctx.get_state(ValueStateDescriptor("first"))
        if first.value() is None:
            first.update(row["v"])
            ctx.timer_service().register_event_time_timer(row["ts"] + 10_000)

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        out.collect({"k": ctx.current_key[0], "first": ctx.get_state(ValueStateDescriptor("first")).value(),
                     "at": timestamp})

    def close(self) -> None:
        FirstAndTimer.closed += 1


OPERATORS = {
    # the order of a key's rows matters: the joined values come out as they came in
    "reduce": lambda: KeyedReduce(["k"], lambda a, r: {"k": r["k"], "v": a["v"] * 7 + r["v"], "ts": r["ts"]},
                                  name="r"),
    "aggregate": lambda: KeyedAggregateFunctionOperator(["k"], Sum(), name="a"),
    "process": lambda: KeyedProcessOperator(["k"], FirstAndTimer(), time_column="ts", name="p"),
    "window": lambda: WindowAggregateOperator(["k"], TumblingEventTimeWindows.of(2000), "ts",
                                              aggs=[("v", "sum"), ("v", "count")], name="w"),
}


def run(op: Operator, data: list[pa.RecordBatch], **context: Any) -> OperatorHarness:
    h = OperatorHarness(op, runtime_mode="BATCH", **context)
    for b in data:
        h.batch(b)
    h.watermark(MAX_WATERMARK)
    h.end_input()
    h.finish()
    h.close()
    return h


def canonical(rows: list[dict]) -> list[tuple]:
    return sorted(tuple(sorted(r.items())) for r in rows)


@pytest.mark.parametrize("kind", list(OPERATORS))
def test_a_spilled_keyed_operator_gives_what_it_gives_on_the_whole_input(kind: str, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="yarnflow.worker.operators.batch.keyed_input")
    data = batches()
    plain = run(OPERATORS[kind](), data)
    budget = MemoryBudget(20_000)
    spill = SpillFiles([str(tmp_path)], "attempt")
    wrapped = run(SpillingKeyedInput(OPERATORS[kind]()), data, memory=budget, spill=spill)
    assert "spilling it by key hash" in caplog.text
    assert canonical(wrapped.rows()) == canonical(plain.rows())
    assert wrapped.rows()  # something to compare
    assert budget.used == 0 and budget.peak <= 20_000 and spill.spilled_bytes > 0
    assert [f for f in (tmp_path / "attempt").iterdir() if f.name != "owner.json"] == []


def test_an_input_that_fits_runs_once_in_order() -> None:
    data = batches(900, 50)
    FirstAndTimer.closed = 0
    wrapped = run(SpillingKeyedInput(OPERATORS["process"]()), data, memory=MemoryBudget(10 << 20))
    plain = run(OPERATORS["process"](), data)
    assert wrapped.rows() == plain.rows()  # same order too: one run over the input as it came
    assert FirstAndTimer.closed == 2  # once each


def test_the_wrapper_takes_the_operators_name_and_keeps_its_pristine_copy_apart() -> None:
    inner = OPERATORS["reduce"]()
    inner.uid, inner.user_uid = "my-reduce", True  # type: ignore[attr-defined]
    wrapper = SpillingKeyedInput(inner)
    assert (wrapper.name, wrapper.uid, wrapper.keys_of, getattr(wrapper, "user_uid", False)) == \
        ("r", "my-reduce", {0: ["k"]}, True)
    copy.deepcopy(wrapper)  # it travels in the job artifact


def test_a_spilled_window_join_gives_what_it_gives_on_both_whole_inputs(caplog) -> None:
    caplog.set_level(logging.INFO, logger="yarnflow.worker.operators.batch.keyed_input")
    left, right = batches(3000, 300, 1), batches(2000, 300, 2)
    right = [b.rename_columns(["key", "w", "t"]) for b in right]

    def join() -> WindowJoinOperator:
        return WindowJoinOperator(["k"], ["key"], TumblingEventTimeWindows.of(3000), "ts", "t", name="wj")

    def feed(op: Operator, **context: Any) -> OperatorHarness:
        h = OperatorHarness(op, runtime_mode="BATCH", **context)
        for a, b in zip(left, right):
            h.batch(a, input_index=0)
            h.batch(b, input_index=1)
        for i in (0, 1):
            h.watermark(MAX_WATERMARK, input_index=i)
            h.end_input(i)
        h.finish()
        h.close()
        return h

    plain = feed(join())
    budget = MemoryBudget(15_000)
    wrapped = feed(SpillingKeyedInput(join()), memory=budget)
    assert "spilling it by key hash" in caplog.text
    assert canonical(wrapped.rows()) == canonical(plain.rows()) and plain.rows()
    assert budget.used == 0 and budget.peak <= 15_000


def test_which_operators_hold_their_input() -> None:
    assert all(wants_spilling_input(make()) for make in OPERATORS.values())
    assert not wants_spilling_input(KeyedAggregate(["k"], [("v", "sum")]))  # spills on its own
    assert not wants_spilling_input(WindowAggregateOperator(["k"], TumblingProcessingTimeWindows.of(1000), None,
                                                            aggs=[("v", "sum")]))
