"""Two-input operators (``worker/operators/co_process.py``) and operator state
(``worker/state/operator_state.py``), driven through the OperatorHarness: keyed state and timers
shared by both inputs, broadcast state writable only from the broadcast side, list / union /
broadcast state snapshotted and restored (also at another parallelism), CheckpointedFunction's
hooks, and the errors a user gets for a misuse."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from tests.harness import OperatorHarness
from yarnflow.common.api import (
    BroadcastProcessFunction,
    CheckpointedFunction,
    CoProcessFunction,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    StateDescriptorError,
    StateError,
    ValueStateDescriptor,
)
from yarnflow.common.errors import JobDefinitionError
from yarnflow.common.keygroups import REDISTRIBUTE_KEY
from yarnflow.worker.operators.base import UserFunctionError
from yarnflow.worker.operators.co_process import CoFlatMapAdapter, CoMapAdapter, CoProcessOperator
from yarnflow.worker.state.operator_state import OperatorStateStore
from yarnflow.worker.state.tables import materialize

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

RULES = MapStateDescriptor("rules")
COUNT = ValueStateDescriptor("count", default=0)


def rows(events: list[Any]) -> list[dict[str, Any]]:
    """The data rows of a step's events."""
    return [r for e in events if e[0] == "data" for r in e[1].to_pylist()]


def test_co_map_and_co_flat_map_run_each_inputs_function() -> None:
    h = OperatorHarness(CoProcessOperator(CoMapAdapter(lambda r: {"x": r["a"]}, lambda r: {"x": -r["b"]})))
    assert rows(h.batch([{"a": 1}, {"a": 2}])) == [{"x": 1}, {"x": 2}]
    assert rows(h.batch([{"b": 5}], input_index=1)) == [{"x": -5}]
    flat = OperatorHarness(CoProcessOperator(CoFlatMapAdapter(lambda r: [r] * r["a"], lambda r: [])))
    assert rows(flat.batch([{"a": 2}, {"a": 0}])) == [{"a": 2}, {"a": 2}]
    assert rows(flat.batch([{"b": 1}], input_index=1)) == []


class Totals(KeyedCoProcessFunction):
    """Adds input 1's amounts per key, subtracts input 2's; reports a key's total 10 ms (event
    time) after its first row."""

    def process_element1(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        self.add(row["amount"], ctx)

    def process_element2(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        self.add(-row["amount"], ctx)

    def add(self, amount: int, ctx: Any) -> None:
        total = ctx.get_state(COUNT)
        if total.value() == 0:
            ctx.timer_service().register_event_time_timer(ctx.timestamp + 10)
        total.update(total.value() + amount)

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        out.collect({"key": ctx.current_key, "total": self.get_state(COUNT).value(), "at": timestamp,
                     "domain": ctx.time_domain})


def test_keyed_co_process_shares_state_and_timers_of_a_key_between_inputs() -> None:
    op = CoProcessOperator(Totals(), (["k"], ["key"]), time_columns=("ts", "ts"))
    h = OperatorHarness(op)
    h.batch([{"k": "a", "amount": 5, "ts": 1}, {"k": "b", "amount": 1, "ts": 2}])
    h.batch([{"key": "a", "amount": 2, "ts": 3}], input_index=1)
    assert h.watermark(100) == []  # input 2's watermark still holds it back
    fired = rows(h.watermark(100, input_index=1))
    assert fired == [{"key": "a", "total": 3, "at": 11, "domain": "EVENT_TIME"},
                     {"key": "b", "total": 1, "at": 12, "domain": "EVENT_TIME"}]
    assert op.pending_timers == {"EVENT_TIME": 0, "PROCESSING_TIME": 0}

    # restored elsewhere: the keys' totals and pending timers go with the snapshot
    h.batch([{"k": "c", "amount": 7, "ts": 200}])
    snapshot = materialize(op.snapshot_state(1))
    again = CoProcessOperator(Totals(), (["k"], ["key"]), time_columns=("ts", "ts"))
    h2 = OperatorHarness(again, open=False)
    again.initialize_state(snapshot)
    again.open()
    assert again.pending_timers["EVENT_TIME"] == 1
    h2.watermark(1000)
    assert rows(h2.watermark(1000, input_index=1)) == [{"key": "c", "total": 7, "at": 210, "domain": "EVENT_TIME"}]


def test_a_key_column_missing_from_an_input_is_named() -> None:
    h = OperatorHarness(CoProcessOperator(Totals(), (["k"], ["key"])))
    with pytest.raises(JobDefinitionError, match="input 2 has no column 'key'"):
        h.batch([{"k": "a", "amount": 1}], input_index=1)
    with pytest.raises(JobDefinitionError, match="key both connected streams"):
        CoProcessOperator(Totals(), (["k"], None))


class Rules(KeyedBroadcastProcessFunction):
    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        seen = ctx.get_state(COUNT)
        seen.update(seen.value() + 1)
        if row["v"] >= ctx.get_broadcast_state(RULES).get("min", 0):
            out.collect({"k": row["k"], "v": row["v"], "seen": seen.value()})

    def process_broadcast_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        ctx.get_broadcast_state(RULES).put("min", row["min"])
        ctx.apply_to_keyed_state(COUNT, lambda key, state: ctx.output("resets", {"reset": key, "was": state.value()}))
        ctx.apply_to_keyed_state(COUNT, lambda key, state: state.clear())


def test_broadcast_rows_change_the_rules_and_reach_every_keys_state() -> None:
    op = CoProcessOperator(Rules(), (["k"], None), broadcast=(RULES,))
    h = OperatorHarness(op)
    assert rows(h.batch([{"k": "a", "v": 1}, {"k": "b", "v": 9}])) == [
        {"k": "a", "v": 1, "seen": 1}, {"k": "b", "v": 9, "seen": 1}]
    resets = h.batch([{"min": 5}], input_index=1)
    assert sorted((r["reset"], r["was"]) for e in resets if e[0] == "side" and e[1] == "resets"
                  for r in e[2].to_pylist()) == [("a", 1), ("b", 1)]
    assert rows(h.batch([{"k": "a", "v": 1}, {"k": "a", "v": 7}])) == [{"k": "a", "v": 7, "seen": 2}]

    snapshot = materialize(op.snapshot_state(3))
    table = snapshot["operator.broadcast.rules"]
    assert table.schema.metadata[REDISTRIBUTE_KEY] == b"broadcast"
    again = CoProcessOperator(Rules(), (["k"], None), broadcast=(RULES,))
    h2 = OperatorHarness(again, open=False)
    again.initialize_state(snapshot)
    again.open()
    assert rows(h2.batch([{"k": "a", "v": 4}, {"k": "a", "v": 5}])) == [{"k": "a", "v": 5, "seen": 4}]


def test_broadcast_state_is_read_only_on_the_other_side_and_must_be_declared() -> None:
    class Writes(BroadcastProcessFunction):
        def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
            ctx.get_broadcast_state(RULES).put("x", 1)

        def process_broadcast_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
            ctx.get_broadcast_state(MapStateDescriptor("other"))

    h = OperatorHarness(CoProcessOperator(Writes(), broadcast=(RULES,)))
    with pytest.raises(UserFunctionError, match="read-only in process_element"):
        h.batch([{"v": 1}])
    with pytest.raises(UserFunctionError, match="was not given to broadcast"):
        h.batch([{"v": 1}], input_index=1)

    class Timers(BroadcastProcessFunction):
        def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
            ctx.timer_service().register_event_time_timer(5)

        def process_broadcast_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
            ctx.apply_to_keyed_state(COUNT, lambda k, s: None)

    h = OperatorHarness(CoProcessOperator(Timers(), broadcast=(RULES,)))
    with pytest.raises(UserFunctionError, match="timers need keyed streams"):
        h.batch([{"v": 1}])
    with pytest.raises(UserFunctionError, match="apply_to_keyed_state is for"):
        h.batch([{"v": 1}], input_index=1)
    with pytest.raises(JobDefinitionError, match="needs a function with process_element"):
        CoProcessOperator(Totals(), broadcast=(RULES,))
    with pytest.raises(JobDefinitionError, match="MapStateDescriptor"):
        CoProcessOperator(Timers(), broadcast=(ListStateDescriptor("x"),))


class Buffering(CoProcessFunction, CheckpointedFunction):
    """Holds input 1's rows until input 2 says flush; what it holds is its list state."""

    HELD = ListStateDescriptor("held")

    def __init__(self) -> None:
        self.held: list[Any] = []
        self.restored = False

    def initialize_state(self, ctx: Any) -> None:
        self.state = ctx.get_operator_state_store().get_list_state(self.HELD)
        self.restored = ctx.is_restored()
        self.held = self.state.get()

    def snapshot_state(self, ctx: Any) -> None:
        self.state.update(self.held)

    def process_element1(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        self.held.append(row["v"])

    def process_element2(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        for v in self.held:
            out.collect({"v": v})
        self.held = []


def test_a_checkpointed_function_keeps_its_list_state_across_a_restore() -> None:
    fn = Buffering()
    op = CoProcessOperator(fn)
    h = OperatorHarness(op)
    assert fn.restored is False
    h.batch([{"v": 1}, {"v": 2}])
    snapshot = materialize(op.snapshot_state(1))
    assert snapshot["operator.split.held"].schema.metadata[REDISTRIBUTE_KEY] == b"split"
    h.batch([{"v": 3}])  # after the checkpoint: not in it

    fn2 = Buffering()
    again = CoProcessOperator(fn2)
    h2 = OperatorHarness(again, open=False)
    again.initialize_state(snapshot)
    again.open()
    assert fn2.restored is True
    assert rows(h2.batch([{"go": 1}], input_index=1)) == [{"v": 1}, {"v": 2}]


def _snapshots(parallelism: int, items: dict[int, list[int]]) -> list[dict[str, pa.Table]]:
    out = []
    for i in range(parallelism):
        store = OperatorStateStore(i, parallelism, "op")
        store.get_list_state(ListStateDescriptor("offsets")).update(items[i])
        store.get_union_list_state(ListStateDescriptor("seen")).update([f"s{i}"])
        store.get_broadcast_state(RULES).put("rule", i)
        out.append(store.snapshot())
    return out


def _restored(parallelism: int, index: int, parts: list[dict[str, pa.Table]]) -> OperatorStateStore:
    """A store restored from ``parts`` (the old subtasks' tables it gets, in subtask order,
    concatenated as the task's restore does)."""
    names = {n for p in parts for n in p}
    tables = {}
    for n in names:
        found = [p[n] for p in parts if n in p]
        tables[n] = pa.concat_tables(found).replace_schema_metadata(found[0].schema.metadata)
    store = OperatorStateStore(index, parallelism, "op")
    assert store.restore({**tables, "keyed_state": pa.table({"x": [1]})}) == {"keyed_state": tables.get("keyed_state")
                                                                             or pa.table({"x": [1]})}
    return store


def test_list_state_splits_evenly_and_union_state_goes_whole_on_a_rescale() -> None:
    old = _snapshots(2, {0: [0, 1, 2, 3], 1: [4, 5]})
    # 2 -> 3: every new subtask reads both old ones' files (savepoints.py deals them so)
    new = [_restored(3, i, old) for i in range(3)]
    lists = [s.get_list_state(ListStateDescriptor("offsets")).get() for s in new]
    assert sorted(v for part in lists for v in part) == [0, 1, 2, 3, 4, 5]
    assert [len(part) for part in lists] == [2, 2, 2]
    assert all(s.get_union_list_state(ListStateDescriptor("seen")).get() == ["s0", "s1"] for s in new)
    # the same parallelism: a subtask restores its own list
    same = _restored(2, 1, [old[1]])
    assert same.get_list_state(ListStateDescriptor("offsets")).get() == [4, 5]
    assert same.get_broadcast_state(RULES).get("rule") == 1


def test_one_operator_state_name_cannot_be_two_kinds() -> None:
    store = OperatorStateStore(0, 1, "op")
    store.get_list_state(ListStateDescriptor("x"))
    with pytest.raises(StateDescriptorError, match="already a split state"):
        store.get_union_list_state(ListStateDescriptor("x"))
    with pytest.raises(StateDescriptorError, match="MapStateDescriptor"):
        store.get_broadcast_state(ListStateDescriptor("y"))  # type: ignore[arg-type]
    with pytest.raises(StateError):
        raise StateError("(the base of the state errors users catch)")
