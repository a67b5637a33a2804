"""Keyed state (key-group scoped, rescalable) and the keyed process / aggregate operators,
driven directly through the shared OperatorHarness (a manual clock and a recording output)."""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from typing import Any

import pyarrow as pa
import pytest

from yarnflow.common.errors import JobDefinitionError, YarnflowError
from yarnflow.worker.operators.base import RuntimeContext, UserFunctionError
from yarnflow.common.api import (
    EVENT_TIME,
    PROCESSING_TIME,
    AggregateFunction,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptorError,
    ValueStateDescriptor,
)
from yarnflow.worker.operators.process import (
    KeyedAggregateFunctionOperator,
    KeyedProcessOperator,
    MissingEventTimeError,
)
from yarnflow.worker.state.errors import KeyGroupOutOfRangeError, NoCurrentKeyError, StateRestoreError
from yarnflow.worker.state.heap import HeapKeyedStateBackend
from yarnflow.worker.state.tables import materialize
from yarnflow.worker.operators.transforms import SchemaMismatchError
from yarnflow.worker.elements import MAX_WATERMARK
from yarnflow.worker.key_assignment import key_group_range, key_groups

from tests.harness import OperatorHarness

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

MAX_PAR = 128
START_MS = 1_000  # the processing time each harness starts at


def batch(**columns: list[Any]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(columns)


def kg_of(*key: Any) -> int:
    """The key group of a one-row key, as the operators compute it."""
    names = [f"k{i}" for i in range(len(key))]
    return int(key_groups(pa.table({n: [v] for n, v in zip(names, key, strict=True)}), names, MAX_PAR)[0])


def backend_with(key: Any = "a") -> HeapKeyedStateBackend:
    b = HeapKeyedStateBackend(MAX_PAR, range(MAX_PAR))
    b.set_current_key((key,), kg_of(key))
    return b


# --------------------------------------------------------------------------- state kinds


def test_value_state_default_update_clear_and_isolation_between_keys() -> None:
    b = backend_with("a")
    count = b.get_state(ValueStateDescriptor("count", default=0))
    assert count.value() == 0
    count.update(5)
    assert count.value() == 5
    b.set_current_key(("b",), kg_of("b"))
    assert count.value() == 0
    count.update(1)
    b.set_current_key(("a",), kg_of("a"))
    assert count.value() == 5
    count.clear()
    assert count.value() == 0
    b.set_current_key(("b",), kg_of("b"))
    assert count.value() == 1


def test_value_state_mutable_default_is_not_shared_between_keys() -> None:
    b = backend_with("a")
    seen = b.get_state(ValueStateDescriptor("seen", default=[]))
    seen.value().append(1)  # mutating the default must not leak
    assert seen.value() == []
    b.set_current_key(("b",), kg_of("b"))
    assert seen.value() == []


def test_list_state() -> None:
    b = backend_with("a")
    items = b.get_state(ListStateDescriptor("items"))
    assert items.get() == []
    items.add(1)
    items.add_all([2, 3])
    items.add_all([])
    assert items.get() == [1, 2, 3]
    items.get().append(99)  # a copy
    assert items.get() == [1, 2, 3]
    b.set_current_key(("b",), kg_of("b"))
    assert items.get() == []
    items.add_all(["x"])
    b.set_current_key(("a",), kg_of("a"))
    items.update([7])
    assert items.get() == [7]
    items.update([])
    assert items.get() == []
    items.add(4)
    items.clear()
    assert items.get() == []
    b.set_current_key(("b",), kg_of("b"))
    assert items.get() == ["x"]


def test_map_state() -> None:
    b = backend_with("a")
    m = b.get_state(MapStateDescriptor("m"))
    assert m.is_empty() and m.keys() == [] and m.get("x") is None and m.get("x", 0) == 0
    m.put("x", 1)
    m.put_all({"y": 2, "z": 3})
    assert m.contains("x") and not m.contains("w")
    assert m.get("y") == 2
    assert sorted(m.keys()) == ["x", "y", "z"]
    assert sorted(m.values()) == [1, 2, 3]
    assert sorted(m.items()) == [("x", 1), ("y", 2), ("z", 3)]
    m.remove("y")
    m.remove("absent")
    assert sorted(m.keys()) == ["x", "z"]
    b.set_current_key(("b",), kg_of("b"))
    assert m.is_empty()
    m.put("only-b", True)
    b.set_current_key(("a",), kg_of("a"))
    m.remove("x")
    m.remove("z")
    assert m.is_empty()
    m.put("q", 1)
    m.clear()
    assert m.is_empty()
    b.set_current_key(("b",), kg_of("b"))
    assert m.items() == [("only-b", True)]


def test_reducing_state() -> None:
    b = backend_with("a")
    total = b.get_state(ReducingStateDescriptor("total", lambda x, y: x + y))
    assert total.get() is None
    for v in (1, 2, 3):
        total.add(v)
    assert total.get() == 6
    b.set_current_key(("b",), kg_of("b"))
    assert total.get() is None
    total.add(10)
    b.set_current_key(("a",), kg_of("a"))
    total.clear()
    assert total.get() is None
    b.set_current_key(("b",), kg_of("b"))
    assert total.get() == 10


def test_reducing_state_needs_a_function() -> None:
    with pytest.raises(StateDescriptorError, match="reduce_fn"):
        ReducingStateDescriptor("r")


def test_same_name_with_another_kind_is_an_error() -> None:
    b = backend_with("a")
    b.get_state(ValueStateDescriptor("s"))
    b.get_state(ValueStateDescriptor("s", default=1))  # same kind: fine
    with pytest.raises(StateDescriptorError, match="'s' is already registered as a ValueState.*ListState"):
        b.get_state(ListStateDescriptor("s"))


def test_state_without_current_key_and_key_group_out_of_range() -> None:
    b = HeapKeyedStateBackend(MAX_PAR, range(0, 64))
    v = b.get_state(ValueStateDescriptor("v"))
    with pytest.raises(NoCurrentKeyError):
        v.value()
    with pytest.raises(KeyGroupOutOfRangeError, match="key group 100"):
        b.set_current_key(("x",), 100)


# --------------------------------------------------------------------------- snapshot / rescale


def _filled_backend(n: int = 500) -> tuple[HeapKeyedStateBackend, dict[Any, tuple[int, list[int]]]]:
    b = HeapKeyedStateBackend(MAX_PAR, range(MAX_PAR))
    keys = [f"user-{i}" for i in range(n)]
    groups = key_groups(pa.table({"k": keys}), ["k"], MAX_PAR).tolist()
    value = b.get_state(ValueStateDescriptor("v"))
    items = b.get_state(ListStateDescriptor("l"))
    expected = {}
    for i, (key, kg) in enumerate(zip(keys, groups, strict=True)):
        b.set_current_key((key,), kg)
        value.update(i)
        items.add_all([i, i + 1])
        expected[key] = (i, [i, i + 1])
    return b, expected


def _contents(b: HeapKeyedStateBackend) -> dict[Any, tuple[int, list[int]]]:
    lists = {key[0]: v for _, key, v in b.entries("l")}
    return {key[0]: (v, lists[key[0]]) for _, key, v in b.entries("v")}


def test_snapshot_split_into_two_ranges_loses_and_duplicates_nothing() -> None:
    original, expected = _filled_backend()
    data = materialize(original.snapshot())
    halves = []
    for index in (0, 1):
        owned = key_group_range(MAX_PAR, 2, index)
        b = HeapKeyedStateBackend(MAX_PAR, owned)
        b.restore(data)
        assert all(kg in owned for kg in b.key_groups_with_state())
        halves.append(_contents(b))
    assert halves[0] and halves[1]
    assert not set(halves[0]) & set(halves[1])
    assert {**halves[0], **halves[1]} == expected
    # the restored state is usable through new state objects
    b = HeapKeyedStateBackend(MAX_PAR, range(MAX_PAR))
    b.restore(data)
    b.set_current_key(("user-7",), kg_of("user-7"))
    assert b.get_state(ValueStateDescriptor("v")).value() == 7
    assert b.get_state(ListStateDescriptor("l")).get() == [7, 8]


def test_scale_in_merges_snapshots_and_refuses_an_entry_twice() -> None:
    original, expected = _filled_backend()
    parts = []
    for i in range(3):  # three old subtasks, each with its own range
        old = HeapKeyedStateBackend(MAX_PAR, key_group_range(MAX_PAR, 3, i))
        old.restore(materialize(original.snapshot()))
        parts.append(materialize(old.snapshot()))
    merged = HeapKeyedStateBackend(MAX_PAR, range(MAX_PAR))
    for part in parts:
        merged.restore(part)
    assert _contents(merged) == expected
    with pytest.raises(StateRestoreError, match="restored twice"):
        merged.restore(parts[0])


def test_restore_checks_max_parallelism_kind_and_format() -> None:
    original, _ = _filled_backend(10)
    with pytest.raises(StateRestoreError, match="max parallelism 128, this operator has 64"):
        HeapKeyedStateBackend(64, range(64)).restore(materialize(original.snapshot()))
    other = HeapKeyedStateBackend(MAX_PAR, range(MAX_PAR))
    other.get_state(MapStateDescriptor("v"))
    with pytest.raises(StateRestoreError, match="ValueState in the snapshot but a MapState"):
        other.restore(materialize(original.snapshot()))
    with pytest.raises(StateRestoreError, match="no column"):
        HeapKeyedStateBackend(MAX_PAR, range(MAX_PAR)).restore({"keyed_state": pa.table({"garbage": [1]})})
    with pytest.raises(StateRestoreError, match="that this operator does not have"):
        HeapKeyedStateBackend(MAX_PAR, range(MAX_PAR)).restore({"elsewhere": pa.table({"key_group": [1]})})
    fresh = HeapKeyedStateBackend(MAX_PAR, range(MAX_PAR))
    fresh.restore(materialize(original.snapshot()))
    with pytest.raises(StateDescriptorError):  # the kind travels with the snapshot
        fresh.get_state(ListStateDescriptor("v"))


# --------------------------------------------------------------------------- process function


class ThresholdCount(KeyedProcessFunction):
    """Counts rows per user; emits (and restarts) when the count reaches the threshold."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold

    def open(self, ctx: RuntimeContext) -> None:
        self.count = self.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        n = self.count.value() + 1
        if n >= self.threshold:
            out.collect({"user": ctx.current_key, "count": n, "last": row["item"]})
            self.count.clear()
        else:
            self.count.update(n)


def test_running_count_with_value_state_emits_at_threshold() -> None:
    op = KeyedProcessOperator(["user"], ThresholdCount(3), name="threshold")
    h = OperatorHarness(op, now=START_MS)
    h.batch(batch(user=["a", "b", "a"], item=[1, 2, 3]))
    assert h.rows() == []
    h.batch(batch(user=["a", "b", "b", "a", "a", "a"], item=[4, 5, 6, 7, 8, 9]))
    assert h.rows() == [{"user": "a", "count": 3, "last": 4},
                        {"user": "b", "count": 3, "last": 6},
                        {"user": "a", "count": 3, "last": 9}]
    assert len([e for e in h.events if e[0] == "data"]) == 1  # one batch per input batch
    h.batch(batch(user=["a"], item=[10]))
    h.finish()
    assert len(h.rows()) == 3


class SessionTimeout(KeyedProcessFunction):
    """A session per user ends ``gap`` ms after its last event (event time)."""

    def __init__(self, gap: int) -> None:
        self.gap = gap

    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        start = ctx.get_state(ValueStateDescriptor("start"))
        last = ctx.get_state(ValueStateDescriptor("last"))
        count = ctx.get_state(ValueStateDescriptor("count", default=0))
        timers = ctx.timer_service()
        if last.value() is not None:
            timers.delete_event_time_timer(last.value() + self.gap)
        if start.value() is None:
            start.update(ctx.timestamp)
        last.update(max(ctx.timestamp, last.value() or ctx.timestamp))
        count.update(count.value() + 1)
        timers.register_event_time_timer(last.value() + self.gap)

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        assert ctx.time_domain == EVENT_TIME
        assert ctx.timer_service().current_watermark() >= timestamp
        start = ctx.get_state(ValueStateDescriptor("start"))
        last = ctx.get_state(ValueStateDescriptor("last"))
        count = ctx.get_state(ValueStateDescriptor("count", default=0))
        out.collect({"user": ctx.current_key, "start": start.value(), "end": last.value(),
                     "events": count.value(), "fired": timestamp})
        for s in (start, last, count):
            s.clear()


def test_session_timeout_with_event_time_timers() -> None:
    op = KeyedProcessOperator(["user"], SessionTimeout(gap=100), time_column="ts", name="sessions")
    h = OperatorHarness(op, now=START_MS)
    h.batch(batch(user=["a", "b", "a"], ts=[1_000, 1_010, 1_050]))
    h.watermark(1_100)  # a's timer is at 1_150, b's at 1_110
    assert h.trace() == [("wm", 1_100)]
    h.batch(batch(user=["a", "b"], ts=[1_120, 1_105]))  # both sessions extended
    h.watermark(1_210)
    assert h.trace()[1:] == [
        {"user": "b", "start": 1_010, "end": 1_105, "events": 2, "fired": 1_205},
        ("wm", 1_210),
    ]
    h.batch(batch(user=["b"], ts=[1_500]))
    h.watermark(MAX_WATERMARK)  # the end of a bounded input
    h.finish()
    assert h.trace()[3:] == [
        {"user": "a", "start": 1_000, "end": 1_120, "events": 3, "fired": 1_220},
        {"user": "b", "start": 1_500, "end": 1_500, "events": 1, "fired": 1_600},
        ("wm", MAX_WATERMARK.timestamp),
    ]
    assert op.pending_timers == {EVENT_TIME: 0, PROCESSING_TIME: 0}


class TimerScript(KeyedProcessFunction):
    """Registers / deletes the timers named in each row; records every firing."""

    def __init__(self) -> None:
        self.fired: list[tuple[Any, int, str]] = []

    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        timers = ctx.timer_service()
        for ts in row.get("event") or []:
            timers.register_event_time_timer(ts)
        for ts in row.get("proc") or []:
            timers.register_processing_time_timer(ts)
        for ts in row.get("del_event") or []:
            timers.delete_event_time_timer(ts)
        for ts in row.get("del_proc") or []:
            timers.delete_processing_time_timer(ts)

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        self.fired.append((ctx.current_key, timestamp, ctx.time_domain))
        out.collect({"key": ctx.current_key, "ts": timestamp, "domain": ctx.time_domain})
        if ctx.current_key == "chain" and timestamp < 30:  # re-registers below the watermark
            ctx.timer_service().register_event_time_timer(timestamp + 10)
        if ctx.current_key == "again" and ctx.time_domain == PROCESSING_TIME:
            ctx.timer_service().register_processing_time_timer(ctx.timer_service().current_processing_time())


def _script(**columns: list[Any]) -> pa.RecordBatch:
    n = len(columns["k"])
    cols: dict[str, Any] = {"k": pa.array(columns["k"], pa.string())}
    for name in ("event", "proc", "del_event", "del_proc"):
        cols[name] = pa.array(columns.get(name, [None] * n), pa.list_(pa.int64()))
    return pa.RecordBatch.from_pydict(cols)


def test_event_time_timers_fire_in_order_once_and_only_when_the_watermark_passes() -> None:
    fn = TimerScript()
    op = KeyedProcessOperator(["k"], fn)
    h = OperatorHarness(op, now=START_MS)
    h.batch(_script(k=["a", "b", "a", "c"],
                    event=[[30, 10], [20, 10], [10, 50], [40]],  # a@10 registered twice
                    del_event=[None, None, None, [40, 999]]))   # c@40 deleted, 999 unknown
    h.watermark(9)
    assert fn.fired == []
    h.watermark(20)
    assert fn.fired == [("a", 10, EVENT_TIME), ("b", 10, EVENT_TIME), ("b", 20, EVENT_TIME)]
    h.watermark(20)  # not an advance: nothing, not forwarded twice
    h.watermark(45)
    assert fn.fired[3:] == [("a", 30, EVENT_TIME)]
    assert op.pending_timers[EVENT_TIME] == 1  # a@50
    assert h.watermarks() == [9, 20, 45]
    # outputs of the fired timers precede the watermark that fired them
    trace = h.trace()
    assert trace.index(("wm", 20)) == 4 and trace.index(("wm", 45)) == 6
    assert trace[5] == {"key": "a", "ts": 30, "domain": EVENT_TIME}


def test_timer_registered_below_the_watermark_during_firing_fires_in_the_same_advance() -> None:
    fn = TimerScript()
    op = KeyedProcessOperator(["k"], fn)
    h = OperatorHarness(op, now=START_MS)
    h.batch(_script(k=["chain", "z"], event=[[10], [25]]))
    h.watermark(100)
    assert fn.fired == [("chain", 10, EVENT_TIME), ("chain", 20, EVENT_TIME), ("z", 25, EVENT_TIME),
                        ("chain", 30, EVENT_TIME)]


def test_finish_fires_event_timers_only_up_to_the_watermark_and_leaves_processing_timers() -> None:
    fn = TimerScript()
    op = KeyedProcessOperator(["k"], fn)
    h = OperatorHarness(op, now=START_MS)
    h.watermark(100)
    h.batch(_script(k=["late", "future"], event=[[50], [500]], proc=[None, [1]]))
    assert fn.fired == []  # a timer at or below the current watermark waits for the next one
    h.finish()
    assert fn.fired == [("late", 50, EVENT_TIME)]
    assert h.rows() == [{"key": "late", "ts": 50, "domain": EVENT_TIME}]
    assert op.pending_timers == {EVENT_TIME: 1, PROCESSING_TIME: 1}


def test_processing_time_timers() -> None:
    fn = TimerScript()
    op = KeyedProcessOperator(["k"], fn)
    assert op.processing_time_interval_ms == 50
    h = OperatorHarness(op, now=START_MS)
    h.batch(_script(k=["a", "b", "a", "c"],
                    proc=[[1_200, 1_100], [1_100], [1_100], [1_300]],
                    del_proc=[None, None, None, [1_300]]))
    h.tick()
    assert fn.fired == []
    h.advance(150)
    assert fn.fired == [("a", 1_100, PROCESSING_TIME), ("b", 1_100, PROCESSING_TIME)]
    assert h.rows() == [{"key": "a", "ts": 1_100, "domain": PROCESSING_TIME},
                        {"key": "b", "ts": 1_100, "domain": PROCESSING_TIME}]
    h.watermark(MAX_WATERMARK)  # event time does not fire processing-time timers
    assert len(fn.fired) == 2
    h.advance(1_000)
    assert fn.fired[2:] == [("a", 1_200, PROCESSING_TIME)]
    assert op.pending_timers[PROCESSING_TIME] == 0


def test_processing_timer_registered_while_firing_waits_for_the_next_call() -> None:
    fn = TimerScript()
    op = KeyedProcessOperator(["k"], fn)
    h = OperatorHarness(op, now=START_MS)
    h.batch(_script(k=["again"], proc=[[1_000]]))
    h.tick()
    assert fn.fired == [("again", 1_000, PROCESSING_TIME)]
    h.tick()
    assert len(fn.fired) == 2


class Everything(KeyedProcessFunction):
    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        if row["v"] < 0:
            ctx.output("negative", {"k": row["k"], "v": row["v"]})
            return
        out.collect(row["v"] * 10)
        ctx.output("keys", {"key": repr(ctx.current_key), "ts": ctx.timestamp,
                            "domain": ctx.time_domain})


def test_side_outputs_scalar_rows_and_context() -> None:
    op = KeyedProcessOperator(["k"], Everything())
    h = OperatorHarness(op, now=START_MS)
    h.batch(batch(k=["a", "b", "a"], v=[1, -2, 3]))
    assert h.rows() == [{"value": 10}, {"value": 30}]
    assert h.side_rows("negative") == [{"k": "b", "v": -2}]
    assert h.side_rows("keys") == [{"key": "'a'", "ts": None, "domain": None}] * 2
    assert [e[0] for e in h.events] == ["data", "side", "side"]


def test_multi_column_key_and_timestamp_column() -> None:
    op = KeyedProcessOperator(["k", "n"], Everything(), time_column="t")
    h = OperatorHarness(op, now=START_MS)
    t0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    times = pa.array([t0, t0 + dt.timedelta(milliseconds=1_500)], pa.timestamp("us", tz="UTC"))
    h.batch(pa.RecordBatch.from_pydict({"k": ["a", "a"], "n": [1, 2], "v": [1, 2], "t": times}))
    ms = int(t0.timestamp() * 1000)
    assert h.side_rows("keys") == [{"key": "('a', 1)", "ts": ms, "domain": None},
                                   {"key": "('a', 2)", "ts": ms + 1_500, "domain": None}]


def test_state_is_isolated_between_keys_in_the_operator() -> None:
    class Sum(KeyedProcessFunction):
        def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
            total = ctx.get_state(ReducingStateDescriptor("sum", lambda a, b: a + b))
            total.add(row["v"])
            out.collect({"k": ctx.current_key, "sum": total.get()})

    op = KeyedProcessOperator(["k"], Sum())
    h = OperatorHarness(op, now=START_MS)
    h.batch(batch(k=["a", "b", "a", "c", "b"], v=[1, 10, 2, 100, 20]))
    assert [r["sum"] for r in h.rows()] == [1, 10, 3, 100, 30]


# --------------------------------------------------------------------------- errors


def test_missing_key_or_time_column_names_operator_and_column() -> None:
    op = KeyedProcessOperator(["user"], ThresholdCount(2), name="counter")
    h = OperatorHarness(op, now=START_MS)
    with pytest.raises(JobDefinitionError, match="operator 'counter'.*'user'"):
        h.batch(batch(name=["a"]))
    op = KeyedProcessOperator(["user"], ThresholdCount(2), time_column="ts", name="timed")
    h = OperatorHarness(op, now=START_MS)
    with pytest.raises(JobDefinitionError, match="operator 'timed'.*'ts'"):
        h.batch(batch(user=["a"]))


def test_null_or_bad_event_time_is_an_error() -> None:
    op = KeyedProcessOperator(["user"], ThresholdCount(2), time_column="ts", name="timed")
    h = OperatorHarness(op, now=START_MS)
    with pytest.raises(MissingEventTimeError, match="operator 'timed'.*'ts'") as info:
        h.batch(pa.RecordBatch.from_pydict({"user": ["a", "b"], "ts": pa.array([1, None], pa.int64())}))
    assert isinstance(info.value, YarnflowError)
    with pytest.raises(JobDefinitionError, match="'ts' has type string"):
        h.batch(batch(user=["a"], ts=["noon"]))


def test_user_errors_name_the_operator() -> None:
    class Boom(KeyedProcessFunction):
        def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
            raise KeyError("nope")

    op = KeyedProcessOperator(["k"], Boom(), name="boomer")
    h = OperatorHarness(op, now=START_MS)
    with pytest.raises(UserFunctionError, match="operator 'boomer'.*KeyError") as info:
        h.batch(batch(k=["a"]))
    assert isinstance(info.value.__cause__, KeyError)


def test_state_kind_clash_inside_the_function_is_reported() -> None:
    class Clash(KeyedProcessFunction):
        def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
            ctx.get_state(ValueStateDescriptor("s")).update(1)
            ctx.get_state(MapStateDescriptor("s"))

    op = KeyedProcessOperator(["k"], Clash(), name="clash")
    h = OperatorHarness(op, now=START_MS)
    with pytest.raises(UserFunctionError, match="operator 'clash'.*already registered as a ValueState") as info:
        h.batch(batch(k=["a"]))
    assert isinstance(info.value.__cause__, StateDescriptorError)


def test_output_schema_mismatch_names_the_operator() -> None:
    class Shifty(KeyedProcessFunction):
        def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
            out.collect({"x": row["x"]})

    op = KeyedProcessOperator(["k"], Shifty(), name="shifty")
    h = OperatorHarness(op, now=START_MS)
    h.batch(batch(k=["a"], x=[1]))
    with pytest.raises(SchemaMismatchError, match="operator 'shifty'"):
        h.batch(batch(k=["a"], x=["text"]))

    class Widening(KeyedProcessFunction):
        def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
            out.collect(row)

    op = KeyedProcessOperator(["k"], Widening(), name="widening")
    h = OperatorHarness(op, now=START_MS)
    h.batch(batch(k=["a"]))
    with pytest.raises(SchemaMismatchError, match="operator 'widening'.*new columns \\['y'\\]"):
        h.batch(batch(k=["a"], y=[1]))


def test_bad_definitions() -> None:
    with pytest.raises(JobDefinitionError, match="KeyedProcessFunction instance"):
        KeyedProcessOperator(["k"], ThresholdCount)  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="key column"):
        KeyedProcessOperator([], ThresholdCount(1))
    with pytest.raises(JobDefinitionError, match="AggregateFunction instance"):
        KeyedAggregateFunctionOperator(["k"], object())  # type: ignore[arg-type]


# --------------------------------------------------------------------------- operator rescaling


def test_operator_state_and_timers_split_on_rescale() -> None:
    class Remember(KeyedProcessFunction):
        def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
            ctx.get_state(ValueStateDescriptor("v")).update(row["v"])
            ctx.timer_service().register_event_time_timer(row["v"])

        def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
            out.collect({"k": ctx.current_key, "v": ctx.get_state(ValueStateDescriptor("v")).value()})

    keys = [f"k{i}" for i in range(200)]
    old = KeyedProcessOperator(["k"], Remember())
    h = OperatorHarness(old, now=START_MS)
    h.batch(batch(k=keys, v=list(range(200))))
    data = materialize(old.snapshot_state(1))
    fired: list[dict[str, Any]] = []
    for index in (0, 1):
        new = KeyedProcessOperator(["k"], Remember())
        h = OperatorHarness(new, now=START_MS, open=False, parallelism=2, subtask_index=index)
        new.initialize_state(data)
        new.open()
        h.watermark(MAX_WATERMARK)
        rows = h.rows()
        assert rows and all(kg_of(r["k"]) in key_group_range(MAX_PAR, 2, index) for r in rows)
        fired.extend(rows)
    assert sorted(fired, key=lambda r: r["v"]) == [{"k": k, "v": v} for v, k in enumerate(keys)]


# --------------------------------------------------------------------------- AggregateFunction operator


class Average(AggregateFunction[list]):
    def create_accumulator(self) -> list:
        return [0, 0]

    def add(self, row: dict[str, Any], acc: list) -> list:
        acc[0] += row["v"]
        acc[1] += 1
        return acc

    def get_result(self, acc: list) -> dict[str, Any]:
        return {"avg": acc[0] / acc[1], "n": acc[1]}


def _reference(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    sums: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        s = sums[(r["g"], r["h"])]
        s[0] += r["v"]
        s[1] += 1
    return {k: {"g": k[0], "h": k[1], "avg": s / n, "n": n} for k, (s, n) in sums.items()}


def _agg_input() -> list[pa.RecordBatch]:
    batches = []
    for b in range(4):
        rows = [{"g": f"g{(i * 7 + b) % 5}", "h": i % 2, "v": i * b} for i in range(30)]
        batches.append(pa.RecordBatch.from_pylist(rows))
    return batches


def test_aggregate_function_operator_batch_mode() -> None:
    op = KeyedAggregateFunctionOperator(["g", "h"], Average(), name="avg")
    h = OperatorHarness(op, now=START_MS, runtime_mode="BATCH", batch_size=4)
    inputs = _agg_input()
    for b in inputs:
        h.batch(b)
    assert h.events == []
    h.watermark(MAX_WATERMARK)
    h.finish()
    rows = h.rows()
    assert all(b.num_rows <= 4 for e in h.events if e[0] == "data" for b in [e[1]])
    expected = _reference([r for b in inputs for r in b.to_pylist()])
    assert len(rows) == len(expected)
    assert {(r["g"], r["h"]): r for r in rows} == expected


def test_aggregate_function_operator_streaming_mode() -> None:
    op = KeyedAggregateFunctionOperator(["g", "h"], Average(), name="avg")
    h = OperatorHarness(op, now=START_MS)
    seen: list[dict[str, Any]] = []
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for b in _agg_input():
        before = len(h.events)
        h.batch(b)
        seen.extend(b.to_pylist())
        emitted = [r for e in h.events[before:] for r in e[1].to_pylist()]
        touched = {(r["g"], r["h"]) for r in b.to_pylist()}
        assert len(emitted) == len(touched) and {(r["g"], r["h"]) for r in emitted} == touched
        expected = _reference(seen)
        for r in emitted:
            assert r == expected[(r["g"], r["h"])]
            latest[(r["g"], r["h"])] = r
    before = len(h.events)
    h.finish()
    assert len(h.events) == before  # streaming emits nothing more at the end
    assert latest == _reference(seen)


def test_aggregate_function_scalar_result_and_key_column_kept() -> None:
    class Count(AggregateFunction[int]):
        def create_accumulator(self) -> int:
            return 0

        def add(self, row: dict[str, Any], acc: int) -> int:
            return acc + 1

        def get_result(self, acc: int) -> int:
            return acc

    class Tagged(Count):
        def get_result(self, acc: int) -> dict[str, Any]:
            return {"k": "overwritten?", "count": acc}

    op = KeyedAggregateFunctionOperator(["k"], Count())
    h = OperatorHarness(op, now=START_MS, runtime_mode="BATCH")
    h.batch(batch(k=["a", "b", "a"]))
    h.finish()
    assert Counter(tuple(r.items()) for r in h.rows()) == Counter(
        [(("k", "a"), ("value", 2)), (("k", "b"), ("value", 1))])
    op = KeyedAggregateFunctionOperator(["k"], Tagged())
    h = OperatorHarness(op, now=START_MS)
    h.batch(batch(k=["a"]))
    assert h.rows() == [{"k": "a", "count": 1}]


def test_aggregate_function_errors_and_rescaled_accumulators() -> None:
    class Broken(Average):
        def add(self, row: dict[str, Any], acc: list) -> list:
            raise ValueError("bad row")

    op = KeyedAggregateFunctionOperator(["g"], Broken(), name="broken")
    h = OperatorHarness(op, now=START_MS)
    with pytest.raises(UserFunctionError, match="operator 'broken'.*bad row"):
        h.batch(batch(g=["x"], v=[1]))
    with pytest.raises(JobDefinitionError, match="operator 'broken'.*'g'"):
        h.batch(batch(v=[1]))

    old = KeyedAggregateFunctionOperator(["g"], Average())
    h = OperatorHarness(old, now=START_MS, runtime_mode="BATCH")
    groups = [f"g{i}" for i in range(50)]
    h.batch(batch(g=groups, v=list(range(50))))
    data = materialize(old.snapshot_state(1))
    rows: list[dict[str, Any]] = []
    for index in (0, 1):
        new = KeyedAggregateFunctionOperator(["g"], Average())
        h = OperatorHarness(new, now=START_MS, open=False, runtime_mode="BATCH", parallelism=2, subtask_index=index)
        new.initialize_state(data)
        new.open()
        mine = [g for g in groups if kg_of(g) in key_group_range(MAX_PAR, 2, index)]
        h.batch(batch(g=mine, v=[100] * len(mine)))
        h.finish()
        rows.extend(h.rows())
    assert sorted(rows, key=lambda r: int(r["g"][1:])) == [
        {"g": g, "avg": (i + 100) / 2, "n": 2} for i, g in enumerate(groups)]
