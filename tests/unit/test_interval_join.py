"""The interval join (``worker/operators/interval_join.py``) through the OperatorHarness: pairs
found whichever side arrives first, bounds inclusive or exclusive, rows removed once the
watermark passed their last possible partner, late rows to side outputs, and the result of
random out-of-order streams equal to a brute-force join; its state survives a snapshot."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.harness import OperatorHarness
from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.operators.co_process import CoProcessOperator
from yarnflow.common.api import ProcessJoinFunction
from yarnflow.worker.operators.interval_join import IntervalJoinFunction, interval_function
from yarnflow.worker.state.tables import materialize

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def joiner(fn: IntervalJoinFunction) -> tuple[CoProcessOperator, OperatorHarness]:
    op = CoProcessOperator(fn, (["k"], ["k"]), time_columns=("ts", "ts"), name="interval join")
    return op, OperatorHarness(op)


def data(events: list[Any]) -> list[dict[str, Any]]:
    return [r for e in events if e[0] == "data" for r in e[1].to_pylist()]


def test_pairs_are_found_whichever_side_comes_first_within_inclusive_bounds() -> None:
    op, h = joiner(IntervalJoinFunction(-2, 3, lambda a, b: {"a": a["id"], "b": b["id"]}))
    h.batch([{"k": "x", "ts": 10, "id": "a10"}, {"k": "y", "ts": 10, "id": "a10y"}])
    got = data(h.batch([{"k": "x", "ts": t, "id": f"b{t}"} for t in (7, 8, 10, 13, 14)], input_index=1))
    assert got == [{"a": "a10", "b": "b8"}, {"a": "a10", "b": "b10"}, {"a": "a10", "b": "b13"}]
    # a later left row meets the right rows already there
    assert data(h.batch([{"k": "x", "ts": 11, "id": "a11"}])) == [
        {"a": "a11", "b": "b10"}, {"a": "a11", "b": "b13"}, {"a": "a11", "b": "b14"}]


def test_exclusive_bounds_and_the_default_joined_row() -> None:
    op, h = joiner(interval_function(-2, 3, True, True, None, (None, None)))
    h.batch([{"k": "x", "ts": 10, "v": 1}])
    got = data(h.batch([{"k": "x", "ts": t, "v": t} for t in (8, 9, 12, 13)], input_index=1))
    assert got == [{"k": "x", "ts": 10, "v": 1, "k_right": "x", "ts_right": 9, "v_right": 9},
                   {"k": "x", "ts": 10, "v": 1, "k_right": "x", "ts_right": 12, "v_right": 12}]


def test_rows_leave_the_state_once_no_partner_can_come_and_late_rows_go_aside() -> None:
    op, h = joiner(IntervalJoinFunction(0, 5, lambda a, b: {"a": a["ts"], "b": b["ts"]}, ("late-a", "late-b")))
    h.batch([{"k": "x", "ts": 10}])
    h.batch([{"k": "x", "ts": 12}], input_index=1)
    h.watermark(14)
    h.watermark(14, input_index=1)
    assert op.pending_timers["EVENT_TIME"] == 1  # the left row (until 15) stays; the right one (until 12) is gone
    assert data(h.batch([{"k": "x", "ts": 15}], input_index=1)) == [{"a": 10, "b": 15}]
    late = h.batch([{"k": "x", "ts": 14}], input_index=1)  # at the watermark: late
    assert [(e[1], e[2].to_pylist()) for e in late if e[0] == "side"] == [("late-b", [{"k": "x", "ts": 14}])]
    h.watermark(100)
    h.watermark(100, input_index=1)
    tables = materialize(op.snapshot_state(1))
    assert all(t.num_rows == 0 for name, t in tables.items() if name in ("keyed_state", "timers")), tables
    assert op.pending_timers["EVENT_TIME"] == 0  # nothing of the key is left


def test_a_process_join_function_sees_both_timestamps() -> None:
    class Fn(ProcessJoinFunction):
        def process_element(self, left: Any, right: Any, ctx: Any, out: Any) -> None:
            out.collect({"l": ctx.left_timestamp, "r": ctx.right_timestamp, "t": ctx.timestamp, "key": ctx.current_key})

    op, h = joiner(IntervalJoinFunction(-10, 10, Fn()))
    h.batch([{"k": "x", "ts": 5}], input_index=1)
    assert data(h.batch([{"k": "x", "ts": 3}])) == [{"l": 3, "r": 5, "t": 5, "key": "x"}]
    with pytest.raises(JobDefinitionError, match="lower bound .* is above the upper bound"):
        IntervalJoinFunction(3, 2)


def test_random_out_of_order_streams_join_as_a_brute_force_join_does_across_a_restore() -> None:
    rng = random.Random(5)
    lower, upper, bound = -7, 4, 20

    def stream(n: int, tag: str) -> list[dict[str, Any]]:
        rows = [{"k": rng.randrange(4), "ts": i + rng.randrange(bound), "id": f"{tag}{i}"} for i in range(n)]
        return rows

    left, right = stream(300, "l"), stream(300, "r")
    expected = sorted((a["id"], b["id"]) for a in left for b in right
                      if a["k"] == b["k"] and a["ts"] + lower <= b["ts"] <= a["ts"] + upper)
    fn = lambda a, b: {"a": a["id"], "b": b["id"]}  # noqa: E731
    op, h = joiner(IntervalJoinFunction(lower, upper, fn))
    got: list[tuple[str, str]] = []
    seen = [-1, -1]
    for start in range(0, 300, 25):
        if start == 150:  # a failure: the state goes to a new operator
            snapshot = materialize(op.snapshot_state(1))
            op = CoProcessOperator(IntervalJoinFunction(lower, upper, fn), (["k"], ["k"]), time_columns=("ts", "ts"))
            h = OperatorHarness(op, open=False)
            op.initialize_state(snapshot)
            op.open()
            h.watermark(seen[0] - bound)
            h.watermark(seen[1] - bound, input_index=1)
        for side, rows in enumerate((left, right)):
            chunk = rows[start:start + 25]
            got += [(r["a"], r["b"]) for r in data(h.batch(chunk, input_index=side))]
            seen[side] = max(seen[side], max(r["ts"] for r in chunk))
            # watermarks as bounded out-of-orderness makes them: nothing is late
            got += [(r["a"], r["b"]) for r in data(h.watermark(seen[side] - bound, input_index=side))]
    assert sorted(got) == expected and len(expected) > 200
