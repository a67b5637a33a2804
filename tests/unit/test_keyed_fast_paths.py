"""The keyed operators' batch-at-a-time paths (keyed.py ``DistinctKeys``, ``KeyedReduce``'s fold
by key, ``KeyedProcessOperator``'s key records and the heap backend's ``LayeredValueState``):
for every key type they group (strings, integers, booleans, timestamps, nulls) they give exactly
what the row-by-row path gives (keys of several columns, floats), across batches, snapshots and
restores, and a batch that is not partitioned by the operator's keys still fails as before."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import pyarrow as pa
import pytest

from yarnflow.common.api.functions import KeyedProcessFunction
from yarnflow.common.api.state import ValueStateDescriptor
from yarnflow.worker.operators.keyed import DistinctKeys, KeyedReduce
from yarnflow.worker.operators.process import KeyedProcessOperator
from yarnflow.worker.elements import MAX_WATERMARK
from yarnflow.worker.key_assignment import key_groups
from yarnflow.worker.state.errors import KeyGroupOutOfRangeError
from yarnflow.worker.state.tables import materialize

from tests.harness import OperatorHarness

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
KEY_VALUES: dict[str, tuple[pa.DataType, list[Any]]] = {
    "string": (pa.string(), ["a", "b", "c", "dd", None]),
    "int": (pa.int64(), [1, 2, 3, -7, None]),
    "bool": (pa.bool_(), [True, False, None]),
    "timestamp": (pa.timestamp("us", tz="UTC"), [T0, T0 + dt.timedelta(seconds=1), None]),
    "float (row by row)": (pa.float64(), [0.5, 1.5, 2.5, None]),
}


def batches(key_type: pa.DataType, values: list[Any], n_batches: int = 6, rows: int = 200,
            seed: int = 7) -> list[pa.RecordBatch]:
    rng = random.Random(seed)
    out, v = [], 0
    for _ in range(n_batches):
        keys = [rng.choice(values) for _ in range(rows)]
        out.append(pa.record_batch({"k": pa.array(keys, key_type), "v": list(range(v, v + rows))}))
        v += rows
    return out


class Numbering(KeyedProcessFunction):
    """Numbers each key's rows in ValueState and emits (key, seq, v) per row."""

    def open(self, ctx: Any) -> None:
        self.seq = self.get_state(ValueStateDescriptor("seq", 0))

    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        n = self.seq.value() + 1
        self.seq.update(n)
        out.collect({"k": ctx.current_key, "seq": n, "v": row["v"]})


def numbered(all_batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    """What Numbering emits, computed in plain Python: in input order."""
    seen: dict[Any, int] = {}
    out = []
    for b in all_batches:
        for row in b.to_pylist():
            seen[row["k"]] = seen.get(row["k"], 0) + 1
            out.append({"k": row["k"], "seq": seen[row["k"]], "v": row["v"]})
    return out


@pytest.mark.parametrize("kind", list(KEY_VALUES))
def test_distinct_keys_give_each_row_its_key_and_key_group(kind: str) -> None:
    key_type, values = KEY_VALUES[kind]
    b = batches(key_type, values, n_batches=1)[0]
    distinct = DistinctKeys.of(b, ["k"], 128)
    if pa.types.is_floating(key_type):  # Python's -0.0 == 0.0 and NaN != NaN: not grouped by Arrow
        assert distinct is None
        return
    assert distinct is not None
    index = distinct.indices.to_pylist()
    assert [distinct.values[i] for i in index] == b.column("k").to_pylist()
    assert [distinct.groups[i] for i in index] == key_groups(b, ["k"], 128).tolist()
    assert len(set(distinct.values)) == len(distinct.values)  # each key once, in order of first sight
    assert distinct.values == list(dict.fromkeys(b.column("k").to_pylist()))
    assert DistinctKeys.of(b.append_column("k2", b.column("v")), ["k", "k2"], 128) is None


@pytest.mark.parametrize("kind", list(KEY_VALUES))
def test_keyed_process_state_per_key_in_input_order_across_a_snapshot_and_a_restore(kind: str) -> None:
    key_type, values = KEY_VALUES[kind]
    data = batches(key_type, values)
    h = OperatorHarness(KeyedProcessOperator(["k"], Numbering()))
    for b in data[:3]:
        h.batch(b)
    snapshot = h.op.snapshot_state(1)
    for b in data[3:]:  # written after the snapshot: must not reach it
        h.batch(b)
    assert h.rows() == numbered(data)  # per key in order, and the rows in the order they came

    tables = materialize(snapshot)
    again = OperatorHarness(KeyedProcessOperator(["k"], Numbering()), open=False)
    again.op.initialize_state(tables)
    again.op.open()
    for b in data[3:]:
        again.batch(b)
    assert again.rows() == numbered(data)[3 * 200:]


def test_keyed_process_fast_path_passes_event_time_and_keeps_timers() -> None:
    class Timed(KeyedProcessFunction):
        def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
            out.collect({"k": ctx.current_key, "ts": ctx.timestamp})
            ctx.timer_service().register_event_time_timer(ctx.timestamp + 1_000)

        def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
            out.collect({"k": ctx.current_key, "ts": -timestamp})

    h = OperatorHarness(KeyedProcessOperator(["k"], Timed(), time_column="t"))
    h.batch(pa.record_batch({"k": ["a", "b", "a"], "t": pa.array([5, 7, 9], pa.int64())}))
    assert h.rows() == [{"k": "a", "ts": 5}, {"k": "b", "ts": 7}, {"k": "a", "ts": 9}]
    h.take()
    h.watermark(MAX_WATERMARK)
    assert sorted(h.rows(), key=lambda r: r["ts"]) == [
        {"k": "a", "ts": -1_009}, {"k": "b", "ts": -1_007}, {"k": "a", "ts": -1_005}]


@pytest.mark.parametrize("make", [
    lambda: KeyedProcessOperator(["k"], Numbering()),
    lambda: KeyedReduce(["k"], lambda a, r: {"k": a["k"], "v": a["v"] + r["v"]}),
], ids=["process", "reduce"])
def test_a_batch_not_partitioned_by_the_key_fails_naming_the_key_group(make: Any) -> None:
    keys = [f"key{i}" for i in range(64)]
    groups = key_groups(pa.table({"k": keys}), ["k"], 128).tolist()
    assert any(g >= 64 for g in groups) and any(g < 64 for g in groups)
    h = OperatorHarness(make(), subtask_index=0, parallelism=2)  # owns key groups 0..63
    with pytest.raises(KeyGroupOutOfRangeError, match="not partitioned by this operator's keys"):
        h.batch(pa.record_batch({"k": keys, "v": list(range(64))}))


def add(acc: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    return {"k": "ignored", "v": (acc["v"] * 3 + row["v"]) % 1_000_003}  # order matters: a fold, not a sum


def folded(all_batches: list[pa.RecordBatch]) -> dict[Any, int]:
    acc: dict[Any, int] = {}
    for b in all_batches:
        for row in b.to_pylist():
            acc[row["k"]] = row["v"] if row["k"] not in acc else (acc[row["k"]] * 3 + row["v"]) % 1_000_003
    return acc


@pytest.mark.parametrize("mode", ["STREAMING", "BATCH"])
@pytest.mark.parametrize("kind", list(KEY_VALUES))
def test_keyed_reduce_folds_each_keys_rows_in_order_across_a_snapshot_and_a_restore(kind: str, mode: str) -> None:
    key_type, values = KEY_VALUES[kind]
    data = batches(key_type, values)
    h = OperatorHarness(KeyedReduce(["k"], add), runtime_mode=mode)
    for i, b in enumerate(data):
        events = h.batch(b)
        if mode == "STREAMING":  # after each batch: the keys it touched, in the order first touched
            [out] = [e[1] for e in events if e[0] == "data"]
            assert out.column("k").to_pylist() == list(dict.fromkeys(b.column("k").to_pylist()))
            assert dict(zip(out.column("k").to_pylist(), out.column("v").to_pylist())) == \
                {k: v for k, v in folded(data[:i + 1]).items() if k in set(b.column("k").to_pylist())}
        if i == 2:
            snapshot = h.op.snapshot_state(1)
    h.finish()
    final = {r["k"]: r["v"] for r in h.rows()} if mode == "BATCH" else None
    if final is not None:
        assert final == folded(data)

    again = OperatorHarness(KeyedReduce(["k"], add), runtime_mode="STREAMING", open=False)
    again.op.initialize_state(materialize(snapshot))
    again.op.open()
    for b in data[3:]:
        again.batch(b)
    latest = {r["k"]: r["v"] for r in again.rows()}
    expected = folded(data)
    assert latest == {k: expected[k] for k in latest} and set(latest) == {r["k"] for b in data[3:] for r in b.to_pylist()}


def test_keyed_reduce_keeps_the_key_and_checks_every_step() -> None:
    """Each step of a fold sees the key the row has, whatever the function returned before,
    and a step that returns no dict fails as the row-by-row path does."""
    seen: list[Any] = []

    def fn(acc: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        seen.append(acc["k"])
        return {"k": "changed", "v": acc["v"] + row["v"]}

    h = OperatorHarness(KeyedReduce(["k"], fn), runtime_mode="BATCH")
    h.batch(pa.record_batch({"k": ["a", "a", "a", "b", "b"], "v": [1, 2, 3, 4, 5]}))
    h.finish()
    assert seen == ["a", "a", "b"] and sorted((r["k"], r["v"]) for r in h.rows()) == [("a", 6), ("b", 9)]


def add_in_place(acc: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    acc["v"] = (acc["v"] * 3 + row["v"]) % 1_000_003  # the usual style: the accumulator changed in place
    return acc


def test_a_reduce_changing_its_accumulator_in_place_leaves_a_taken_snapshot_as_it_was() -> None:
    """The snapshot's layer is frozen while later batches change the same keys' rows in place:
    they must change copies (the state's copy-on-write), or the restored state would count
    the later rows twice."""
    data = batches(pa.string(), ["a", "b", "c", "dd"])
    h = OperatorHarness(KeyedReduce(["k"], add_in_place), runtime_mode="STREAMING")
    for b in data[:3]:
        h.batch(b)
    snapshot = h.op.snapshot_state(1)
    for b in data[3:]:
        h.batch(b)
    assert {r["k"]: r["v"] for r in h.rows()} == folded(data)

    again = OperatorHarness(KeyedReduce(["k"], add_in_place), runtime_mode="STREAMING", open=False)
    again.op.initialize_state(materialize(snapshot))
    again.op.open()
    for b in data[3:]:
        again.batch(b)
    assert {r["k"]: r["v"] for r in again.rows()} == folded(data)


def test_keyed_reduce_with_more_distinct_keys_in_a_batch_than_a_16_bit_sort_holds() -> None:
    rows = 140_000
    keys = [f"k{i % 70_000}" for i in range(rows)]  # 70,000 keys, two rows each, far apart
    b = pa.record_batch({"k": keys, "v": list(range(rows))})
    h = OperatorHarness(KeyedReduce(["k"], add), runtime_mode="BATCH", batch_size=rows)
    h.batch(b)
    h.finish()
    assert {r["k"]: r["v"] for r in h.rows()} == folded([b])


def test_streaming_reduce_upserts_read_rows_as_from_pylist_does() -> None:
    """A column the function's row lacks is null in the upsert, a column the schema does not
    have is dropped, and a value of another type fails the batch as Arrow's conversion does."""
    def drop_and_add(acc: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        return {"k": acc["k"], "extra": 1} if row["v"] == 2 else {"k": acc["k"], "v": acc["v"] + row["v"]}

    h = OperatorHarness(KeyedReduce(["k"], drop_and_add), runtime_mode="STREAMING")
    [out] = [e[1] for e in h.batch(pa.record_batch({"k": ["a", "a", "b", "b"], "v": [1, 2, 3, 4]})) if e[0] == "data"]
    assert out.schema.names == ["k", "v"] and out.to_pylist() == [{"k": "a", "v": None}, {"k": "b", "v": 7}]

    bad = OperatorHarness(KeyedReduce(["k"], lambda acc, row: {"k": acc["k"], "v": "seven"}), runtime_mode="STREAMING")
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        bad.batch(pa.record_batch({"k": ["a", "a"], "v": [1, 2]}))


def test_key_records_are_kept_per_key_across_batches_and_bounded() -> None:
    """The same key gets the same tuples in every batch (the state's dicts then find its entry
    by identity); past ``limit`` keys the records start again instead of growing."""
    from yarnflow.worker.operators.keyed import KeyRecords

    def distinct(values: list[str]) -> DistinctKeys:
        d = DistinctKeys.of(pa.record_batch({"k": values}), ["k"], 128)
        assert d is not None
        return d

    records = KeyRecords(limit=3)
    first = records.of(distinct(["a", "b", "a"]))
    assert [r[3] for r in first] == ["a", "b"] and [r[0] for r in first] == [("a",), ("b",)]
    assert all(r[1] == (r[0], None) and r[1][0] is r[0] for r in first)
    again = records.of(distinct(["b", "a"]))
    assert again[0] is first[1] and again[1] is first[0]
    records.of(distinct(["c", "d"]))                 # 4 keys known: over the limit
    after = records.of(distinct(["a", "e"]))         # starts again: correct, not the old objects
    assert [r[3] for r in after] == ["a", "e"] and after[0] is not first[0]
    assert len(records._known) == 2
