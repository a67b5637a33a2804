"""Windows and window joins at checkpoints: a snapshot taken between any two steps of a random
stream (and made only after the operator went on, as the runtime's writer thread makes it),
written and read back as Arrow IPC, restores a fresh operator that, fed the rest of the stream,
emits exactly what the uninterrupted operator emits from that point on: no window lost, none
fired twice, late data and allowed lateness decided the same way. Restored into two subtasks,
each keeps only its key groups and together they emit the same."""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pytest

from tests.harness import OperatorHarness
from tests.unit.test_operator_checkpoints import through_ipc
from tests.unit.test_windows import (
    LEFT,
    RIGHT,
    SCHEMA,
    SPECS,
    SumCount,
    event_stream,
    join_stream,
    normalise,
    pair_fn,
    reduce_max_value,
)
from yarnflow.common.api.windows import SlidingEventTimeWindows, TumblingEventTimeWindows
from yarnflow.worker.operators.base import Operator
from yarnflow.worker.operators.windows import WindowAggregateOperator, WindowJoinOperator
from yarnflow.worker.elements import MAX_WATERMARK
from yarnflow.worker.key_assignment import key_group_range, key_groups
from yarnflow.worker.state.rocksdb_files import NativeSnapshot

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

MIN_WM = -(2**63)
Step = tuple[str, Any]  # ("batch", rows) | ("wm", ts) | ("tick", now) | ("finish", None)


def event_steps(seed: int, **kw: Any) -> list[Step]:
    steps: list[Step] = []
    for rows, wm in event_stream(seed, n=500, **kw):
        steps += [("batch", rows), ("wm", wm)]
    return steps + [("wm", MAX_WATERMARK.timestamp), ("finish", None)]


def processing_steps(seed: int) -> list[Step]:
    rnd = random.Random(seed)
    steps: list[Step] = []
    now = 0
    for i in range(80):
        now += rnd.choice([0, 1, 2, 3, 5, 8, 13])
        if rnd.random() < 0.3:
            steps.append(("tick", now))
        else:
            steps.append(("batch", (now, [{"key": rnd.randrange(4), "value": rnd.randint(-8, 20) / 4, "ts": None,
                                           "tag": f"{i}.{j}"} for j in range(rnd.randint(1, 20))])))
    return steps + [("finish", None)]


def feed(h: OperatorHarness, steps: list[Step], keep: Callable[[dict[str, Any]], bool] = lambda r: True) -> None:
    for kind, arg in steps:
        if kind == "batch":
            now, rows = arg if isinstance(arg, tuple) else (None, arg)
            rows = [r for r in rows if keep(r)]
            if rows:
                h.batch(rows, now=now)
            else:
                h.steps.append([])
        elif kind == "wm":
            h.watermark(arg)
        elif kind == "tick":
            h.tick(arg)
        else:
            h.finish()


def last_watermark(steps: list[Step]) -> int:
    return max([arg for kind, arg in steps if kind == "wm"], default=MIN_WM)


def written(snapshot: Any, native: Path | None) -> dict[str, pa.Table]:
    """The tables of ``snapshot`` as a restarted task reads them: Arrow IPC files; with
    ``native`` (a folder), a RocksDB backend's snapshot is written in its native format there
    (the manifest and SST files of a checkpoint), else as its canonical tables (a savepoint's)."""
    if native is not None:
        assert isinstance(snapshot, NativeSnapshot), f"not a RocksDB backend's native snapshot: {snapshot!r}"
        try:
            tables, _ = snapshot.write_native(None, str(native / uuid.uuid4().hex))
        finally:
            snapshot.release()
        return through_ipc(tables)
    return through_ipc(snapshot)


def check_restores_exactly(make: Callable[[], Operator], steps: list[Step], points: list[int],
                           parallelism: int = 1, context: dict[str, Any] | None = None,
                           native: Path | None = None) -> None:
    """For each point: snapshot after ``steps[:at]`` (made after one more step ran), restore
    into ``parallelism`` subtasks, feed each the rest (its own keys only), compare with an
    uninterrupted run. ``context``: fields of the operators' RuntimeContext (the state backend's
    configuration); ``native``: see ``written``."""
    context = context or {}
    full = OperatorHarness(make(), schema=SCHEMA, **context)
    feed(full, steps)
    for at in points:
        first = OperatorHarness(make(), schema=SCHEMA, **context)
        feed(first, steps[:at])
        snapshot = first.op.snapshot_state(at)
        feed(first, steps[at:at + 1])  # the operator goes on before the snapshot is made
        state = written(snapshot, native)
        expected = normalise(full.steps[at:])
        got: list[list[Any]] = [[] for _ in expected]
        for index in range(parallelism):
            mine = key_group_range(128, parallelism, index)

            def keep(row: dict[str, Any], mine: range = mine) -> bool:
                kg = key_groups(pa.table({"key": [row["key"]]}, schema=pa.schema([SCHEMA.field("key")])), ["key"], 128)
                return parallelism == 1 or int(kg[0]) in mine

            op = make()
            restored = OperatorHarness(op, open=False, schema=SCHEMA, now=first.now if at else 0,
                                       subtask_index=index, parallelism=parallelism, **context)
            op.initialize_state(state)
            op.open()
            wm = last_watermark(steps[:at])
            if wm > MIN_WM:  # the inputs' watermark comes again after a restore
                assert normalise([restored.watermark(wm)])[0][0] == []  # nothing fires twice
            restored.steps.clear()
            feed(restored, steps[at:], keep)
            for i, step in enumerate(normalise(restored.steps)):
                got[i].append(step)
        merged = [(sorted((r for part in parts for r in part[0]), key=repr), parts[0][1], parts[0][2])
                  for parts in got]
        assert [(sorted(e[0], key=repr), e[1], e[2]) for e in expected] == merged, f"restored after step {at}"


EVENT_POINTS = [1, 2, 5, 8, 13, 21, 34]


@pytest.mark.parametrize("name", ["tumbling", "sliding", "sliding_gaps", "session"])
@pytest.mark.parametrize("lateness", [0, 45])
def test_builtin_aggregate_windows_restore_exactly(name: str, lateness: int) -> None:
    _, assigner = SPECS[name]

    def make() -> WindowAggregateOperator:
        return WindowAggregateOperator(["key"], assigner(True), "ts", aggs=[("value", "sum"), ("value", "mean"),
                                                                            ("key", "count")],
                                       allowed_lateness_ms=lateness, late_tag="late")

    check_restores_exactly(make, event_steps(len(name) + lateness, bound=10, late_every=7), EVENT_POINTS)


@pytest.mark.parametrize("name", ["tumbling", "session"])
def test_aggregate_function_and_reduce_windows_restore_exactly(name: str) -> None:
    _, assigner = SPECS[name]
    steps = event_steps(3 * len(name), bound=15, late_every=11, nulls=True)
    check_restores_exactly(lambda: WindowAggregateOperator(["key"], assigner(True), "ts",
                                                           aggregate_function=SumCount(), allowed_lateness_ms=30),
                           steps, EVENT_POINTS)
    check_restores_exactly(lambda: WindowAggregateOperator(["key"], assigner(True), "ts", reduce_fn=reduce_max_value),
                           [s for s in steps], EVENT_POINTS)


@pytest.mark.parametrize("name", ["tumbling", "sliding", "session"])
def test_processing_time_windows_restore_exactly(name: str) -> None:
    _, assigner = SPECS[name]
    check_restores_exactly(lambda: WindowAggregateOperator(["key"], assigner(False), None, aggs=[("value", "sum")]),
                           processing_steps(len(name)), [1, 3, 10, 30, 60])


@pytest.mark.parametrize("name", ["tumbling", "session"])
def test_windows_restored_into_two_subtasks_split_by_key_group(name: str) -> None:
    _, assigner = SPECS[name]
    steps = event_steps(7, bound=10, late_every=9)
    check_restores_exactly(lambda: WindowAggregateOperator(["key"], assigner(True), "ts", aggs=[("value", "sum")],
                                                           allowed_lateness_ms=20),
                           steps, [5, 21], parallelism=2)


def test_a_restored_window_operator_fires_with_the_types_of_its_first_results() -> None:
    # restored and fired by a watermark before any new row arrives: the results keep their types
    schema = pa.schema([("key", pa.int32()), ("value", pa.float32()), ("ts", pa.int64()), ("tag", pa.string())])

    def make() -> WindowAggregateOperator:
        return WindowAggregateOperator(["key"], SPECS["session"][1](True), "ts", aggs=[("value", "max")])

    first = OperatorHarness(make(), schema=schema)
    first.batch([{"key": 1, "value": 2.5, "ts": 10, "tag": "a"}])
    state = through_ipc(first.op.snapshot_state(1))
    op = make()
    restored = OperatorHarness(op, open=False, schema=schema)
    op.initialize_state(state)
    op.open()
    restored.watermark(1000)
    assert restored.rows() == [{"key": 1, "window_start": 10, "window_end": 16, "value": 2.5}]
    assert restored.batches[0].schema.field("key").type == pa.int32()
    assert restored.batches[0].schema.field("value").type == pa.float32()


@pytest.mark.parametrize("assigner", [TumblingEventTimeWindows.of(20), SlidingEventTimeWindows.of(30, 10)])
@pytest.mark.parametrize("join_fn", [None, pair_fn])
def test_window_join_restores_exactly(assigner: Any, join_fn: Any) -> None:
    check_join_restores_exactly(assigner, join_fn)


def check_join_restores_exactly(assigner: Any, join_fn: Any, context: dict[str, Any] | None = None,
                                native: Path | None = None) -> None:
    """A window join snapshotted at several points and restored (see ``check_restores_exactly``)
    emits what the uninterrupted one does from there on."""
    stream = join_stream(11)
    context = context or {}

    def run(h: OperatorHarness, part: list[tuple[int, list[dict[str, Any]], int]]) -> None:
        for side, rows, wm in part:
            h.batch(pa.RecordBatch.from_pylist(rows, schema=RIGHT if side else LEFT), input_index=side)
            h.watermark(wm, input_index=side)

    def end(h: OperatorHarness) -> None:
        h.end_input(0)
        h.end_input(1)
        h.finish()

    def make() -> WindowJoinOperator:
        return WindowJoinOperator(["k"], ["id"], assigner, "ts", "ts", join_fn=join_fn)

    full = OperatorHarness(make(), **context)
    run(full, stream)
    end(full)
    for at in (3, 17, 40):
        first = OperatorHarness(make(), **context)
        run(first, stream[:at])
        before = len(first.rows())
        snapshot = first.op.snapshot_state(1)
        run(first, stream[at:at + 2])
        op = make()
        restored = OperatorHarness(op, open=False, **context)
        op.initialize_state(written(snapshot, native))
        op.open()
        for side in (0, 1):  # the inputs' watermarks come again
            wms = [wm for s, _, wm in stream[:at] if s == side]
            if wms:
                restored.watermark(max(wms), input_index=side)
        run(restored, stream[at:])
        end(restored)
        expected = full.rows()[before:]
        assert sorted(map(repr, restored.rows())) == sorted(map(repr, expected)), at
