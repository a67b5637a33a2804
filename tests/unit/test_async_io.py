"""Async I/O (``worker/operators/async_io.py``) through the OperatorHarness: calls overlap up to
the capacity, ordered mode keeps input order and unordered mode does not wait for slow calls,
timeouts go to the function's handler, a watermark follows the results of the rows before it,
and the rows of calls in flight at a checkpoint are called again after a restore, so each row's
result comes out once."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from tests.harness import OperatorHarness
from yarnflow.common.api import AsyncFunction
from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.operators.async_io import AsyncWaitOperator
from yarnflow.worker.operators.base import UserFunctionError

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class Slow(AsyncFunction):
    """Answers row i after delays[i] seconds; counts the calls in flight."""

    def __init__(self, delays: dict[int, float]) -> None:
        self.delays = delays
        self.in_flight = self.most = 0
        self.lock = threading.Lock()
        self.calls: list[int] = []

    async def async_invoke(self, row: dict[str, Any]) -> Any:
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self.calls.append(row["i"])
        try:
            await asyncio.sleep(self.delays.get(row["i"], 0.01))
            return {"i": row["i"], "doubled": row["i"] * 2}
        finally:
            with self.lock:
                self.in_flight -= 1

    async def timeout(self, row: dict[str, Any]) -> Any:
        return {"i": row["i"], "doubled": -1}


def out_rows(h: OperatorHarness) -> list[dict[str, Any]]:
    return [r for e in h.out.events if e[0] == "data" for r in e[1].to_pylist()]


def finish(h: OperatorHarness) -> None:
    h.finish()
    h.close()


def test_ordered_calls_overlap_up_to_the_capacity_and_keep_input_order() -> None:
    # every call blocks for 50-150 ms, so the 5 allowed are in flight together even on a busy
    # machine (with calls of 0 s they may not overlap at all there; no wall-clock bound either)
    fn = Slow({i: 0.05 + 0.05 * (i % 3) for i in range(20)})
    h = OperatorHarness(AsyncWaitOperator(fn, timeout_ms=5000, capacity=5))
    h.batch([{"i": i} for i in range(20)])
    finish(h)
    assert [r["i"] for r in out_rows(h)] == list(range(20))
    assert fn.most == 5  # they overlapped, never more than the capacity


def test_unordered_results_come_as_calls_complete() -> None:
    fn = Slow({0: 0.5, 1: 0.01, 2: 0.01})
    op = AsyncWaitOperator(fn, timeout_ms=5000, capacity=10, ordered=False)
    h = OperatorHarness(op)
    h.batch([{"i": 0}, {"i": 1}, {"i": 2}])
    time.sleep(0.1)
    h.tick(1)  # the task's timer: finished calls go out without new input
    assert sorted(r["i"] for r in out_rows(h)) == [1, 2]
    finish(h)
    assert [r["i"] for r in out_rows(h)][-1] == 0


def test_a_watermark_follows_the_results_of_the_rows_before_it() -> None:
    h = OperatorHarness(AsyncWaitOperator(Slow({0: 0.2}), timeout_ms=5000, ordered=False))
    h.batch([{"i": 0}, {"i": 1}])
    h.watermark(100)
    kinds = [e[0] for e in h.out.events]
    assert kinds[-1] == "wm" and sum(len(e[1]) for e in h.out.events if e[0] == "data") == 2
    finish(h)


def test_a_slow_call_gets_the_timeout_handlers_result_or_fails_the_task() -> None:
    h = OperatorHarness(AsyncWaitOperator(Slow({1: 5.0}), timeout_ms=100))
    h.batch([{"i": 0}, {"i": 1}, {"i": 2}])
    finish(h)
    assert out_rows(h) == [{"i": 0, "doubled": 0}, {"i": 1, "doubled": -1}, {"i": 2, "doubled": 4}]

    async def lookup(row: dict[str, Any]) -> Any:
        await asyncio.sleep(5)

    h = OperatorHarness(AsyncWaitOperator(lookup, timeout_ms=50))
    with pytest.raises(UserFunctionError, match="took longer than 50 ms"):
        h.batch([{"i": 0}])
        h.finish()
    h.close()


def test_what_a_call_returns_and_what_is_refused() -> None:
    async def many(row: dict[str, Any]) -> Any:
        return [{"x": row["i"]}] * row["i"] if row["i"] else None

    h = OperatorHarness(AsyncWaitOperator(many, timeout_ms=1000))
    h.batch([{"i": 0}, {"i": 2}, {"i": 1}])
    finish(h)
    assert out_rows(h) == [{"x": 2}, {"x": 2}, {"x": 1}]
    with pytest.raises(JobDefinitionError, match="async def"):
        AsyncWaitOperator(lambda row: row, timeout_ms=10)
    with pytest.raises(JobDefinitionError, match="capacity at least 1"):
        AsyncWaitOperator(many, timeout_ms=10, capacity=0)


def test_calls_in_flight_at_a_checkpoint_are_made_again_after_a_restore() -> None:
    fn = Slow({i: 0.3 for i in range(5, 10)})
    op = AsyncWaitOperator(fn, timeout_ms=5000, capacity=20)
    h = OperatorHarness(op)
    h.batch([{"i": i} for i in range(10)])
    time.sleep(0.1)
    op.prepare_snapshot_pre_barrier(1)
    emitted = [r["i"] for r in out_rows(h)]
    snapshot = op.snapshot_state(1)
    assert emitted == [0, 1, 2, 3, 4]  # done before the barrier: in the checkpoint's output
    h.close()  # the task fails: calls in flight are lost with it

    fn2 = Slow({})
    again = AsyncWaitOperator(fn2, timeout_ms=5000)
    h2 = OperatorHarness(again, open=False)
    again.initialize_state(snapshot)
    again.open()
    h2.batch([{"i": 10}])
    finish(h2)
    assert fn2.calls[:5] == [5, 6, 7, 8, 9]  # the restored calls first
    assert emitted + [r["i"] for r in out_rows(h2)] == list(range(11))
