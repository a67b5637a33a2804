"""The keyed state backend's snapshots: copy-on-write (the task freezes, the writer's thread
serialises), isolation of a snapshot from every later change, folding of frozen layers, timers,
and the columnar states (AggregateTable, NamespacedTables) against plain-Python references."""

from __future__ import annotations

import datetime as dt
import random
import threading
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from yarnflow.common.api.state import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from yarnflow.worker.key_assignment import key_group_range, key_groups
from yarnflow.worker.state.errors import StateRestoreError
from yarnflow.worker.state.heap import ABSENT, HeapKeyedStateBackend
from yarnflow.worker.state.tables import materialize

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

MAX_PAR = 32


def kg(key: str) -> int:
    return int(key_groups(pa.table({"k": [key]}), ["k"], MAX_PAR)[0])


def backend(owned: range = range(MAX_PAR)) -> HeapKeyedStateBackend:
    return HeapKeyedStateBackend(MAX_PAR, owned)


def contents(b: HeapKeyedStateBackend, name: str) -> dict[Any, Any]:
    return {key[0]: value for _, key, value in b.entries(name)}


def restored(tables: dict[str, pa.Table], owned: range = range(MAX_PAR)) -> HeapKeyedStateBackend:
    b = backend(owned)
    b.restore(tables)
    return b


class CountsPickles:
    """A state value that counts how often it is serialised."""

    pickled = 0

    def __init__(self, n: int) -> None:
        self.n = n

    def __reduce__(self) -> tuple[Any, ...]:
        type(self).pickled += 1
        return CountsPickles, (self.n,)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CountsPickles) and other.n == self.n


def test_taking_a_snapshot_serialises_nothing_on_the_task_thread() -> None:
    b = backend()
    v = b.get_state(ValueStateDescriptor("v"))
    for i in range(200):
        b.set_current_key((f"k{i}",), kg(f"k{i}"))
        v.update(CountsPickles(i))
    CountsPickles.pickled = 0
    snapshot = b.snapshot()
    assert CountsPickles.pickled == 0  # only a freeze
    tables: dict[str, pa.Table] = {}
    writer = threading.Thread(target=lambda: tables.update(materialize(snapshot)))
    writer.start()
    writer.join(10)
    assert CountsPickles.pickled == 200
    assert contents(restored(tables), "v") == {f"k{i}": CountsPickles(i) for i in range(200)}


def test_a_snapshot_is_the_state_when_it_was_taken_whatever_changes_before_it_is_made() -> None:
    b = backend()
    value = b.get_state(ValueStateDescriptor("value", default=[]))
    items = b.get_state(ListStateDescriptor("items"))
    entries = b.get_state(MapStateDescriptor("entries"))
    keys = [f"k{i}" for i in range(50)]
    for i, key in enumerate(keys):
        b.set_current_key((key,), kg(key))
        value.value().append(i)  # changed in place, as a user may
        items.add(i)
        entries.put("i", i)
    before = {name: contents(b, name) for name in ("value", "items", "entries")}
    snapshot = b.snapshot()
    for i, key in enumerate(keys):  # every sort of change, in place and not
        b.set_current_key((key,), kg(key))
        if i % 3 == 0:
            value.clear()
            items.clear()
            entries.clear()
        else:
            value.value().append(-i)
            items.add(-i)
            entries.put("j", -i)
            entries.remove("i")
    after = {name: contents(b, name) for name in ("value", "items", "entries")}
    b.set_current_key(("new",), kg("new"))
    items.add(99)
    tables = materialize(snapshot)
    assert {name: contents(restored(tables), name) for name in before} == before
    assert after["items"]["k1"] == [1, -1] and "k0" not in after["items"] and after["entries"]["k1"] == {"j": -1}
    # the live state is the changed one, also after the writer folded the frozen layers in
    assert {name: contents(b, name) for name in before} == {**after, "items": {**after["items"], "new": [99]}}


def test_frozen_layers_fold_back_and_are_dropped_at_the_next_snapshot() -> None:
    b = backend()
    v = b.get_state(ValueStateDescriptor("v"))
    model: dict[str, int] = {}
    rnd = random.Random(3)
    pending = []
    for round_ in range(12):
        for _ in range(40):
            key = f"k{rnd.randrange(30)}"
            b.set_current_key((key,), kg(key))
            if rnd.random() < 0.2:
                v.clear()
                model.pop(key, None)
            else:
                v.update(round_)
                model[key] = round_
        pending.append((b.snapshot(), dict(model)))
        if round_ % 3 == 2:  # several snapshots in flight, then all made in order
            for snapshot, expected in pending:
                assert contents(restored(materialize(snapshot)), "v") == expected
            pending.clear()
        assert contents(b, "v") == model
    assert len(b._layers) <= 1 + 3 + 1  # the oldest, those of snapshots not yet made, the live one
    for snapshot, _ in pending:
        materialize(snapshot)
    for _ in range(3):  # once made, a snapshot's layers are dropped: the oldest, the frozen one, the live one
        materialize(b.snapshot())
        assert len(b._layers) == 3


def test_timers_restore_in_their_order_and_to_their_key_groups() -> None:
    b = backend()
    timers = b.timer_service("t")
    for i, key in enumerate(["a", "b", "c", "d", "e", "f"]):
        b.set_current_key((key,), kg(key))
        timers.register("EVENT_TIME", 10, namespace=None)
        timers.register("EVENT_TIME", 5 + i % 2, namespace=(0, 10))
        timers.register("PROCESSING_TIME", 100 + i)
    b.set_current_key(("c",), kg("c"))
    timers.delete("EVENT_TIME", 10)
    tables = materialize(b.snapshot())

    def fired(x: HeapKeyedStateBackend) -> list[tuple[Any, ...]]:
        service = x.timer_service("t")
        out = []
        while (timer := service.pop_next("EVENT_TIME", 50)) is not None:
            out.append(timer)
        return out

    assert fired(restored(tables)) == fired(b)
    halves = [fired(restored(tables, key_group_range(MAX_PAR, 2, i))) for i in (0, 1)]
    assert sorted(halves[0] + halves[1], key=repr) == sorted(fired(restored(tables)), key=repr)
    assert all(t[1] in key_group_range(MAX_PAR, 2, 0) for t in halves[0])


def test_internal_state_copies_a_frozen_value_before_it_is_changed() -> None:
    b = backend()
    acc = b.internal_state("acc")
    b.set_current_key(("a",), kg("a"))
    acc.put([1], namespace=(0, 10))
    snapshot = b.snapshot()
    held = acc.get_for_update((0, 10))
    held.append(2)
    assert acc.get((0, 10)) == [1, 2]
    assert acc.get_for_update((5, 6)) is ABSENT
    assert contents_ns(restored(materialize(snapshot)), "acc") == {(("a",), (0, 10)): [1]}


def contents_ns(b: HeapKeyedStateBackend, name: str) -> dict[Any, Any]:
    return {(key, ns): v for _, key, ns, v in b.namespaced_entries(name)}


# -- columnar: AggregateTable ----------------------------------------------------------------------

def upsert_reference(model: dict[Any, list[Any]], rows: list[dict[str, Any]], funcs: list[tuple[str, str]]) -> None:
    for row in rows:
        current = model.get(row["k"])
        if current is None:
            model[row["k"]] = [row[n] for n, _ in funcs]
            continue
        for i, (name, fn) in enumerate(funcs):
            a, b = current[i], row[name]
            if a is None:
                current[i] = b
            elif b is not None:
                current[i] = a + b if fn == "sum" else min(a, b) if fn == "min" else max(a, b)


def random_value(rnd: random.Random, t: pa.DataType) -> Any:
    """A random value of Arrow type ``t`` (one in five None)."""
    if rnd.random() < 0.2:
        return None
    n = rnd.randint(-50, 50)
    if pa.types.is_string(t):
        return f"v{n:+03d}"
    if pa.types.is_timestamp(t):
        return dt.datetime(2024, 1, 1) + dt.timedelta(microseconds=n * 1001)
    if pa.types.is_date32(t):
        return dt.date(2024, 1, 1) + dt.timedelta(days=n)
    if pa.types.is_boolean(t):
        return n > 0
    if pa.types.is_decimal(t):
        return Decimal(n) / 4
    return float(n) / 4 if pa.types.is_floating(t) else n


@pytest.mark.parametrize("types", [
    {"k": pa.int64(), "s": pa.int64(), "lo": pa.float64(), "hi": pa.int32()},
    {"k": pa.string(), "s": pa.float64(), "lo": pa.string(), "hi": pa.timestamp("us")},
    {"k": pa.int32(), "s": pa.decimal128(10, 2), "lo": pa.date32(), "hi": pa.bool_()},
])
def test_aggregate_table_upserts_like_a_dict_of_rows_with_nulls_and_types(types: dict[str, pa.DataType]) -> None:
    funcs = [("s", "sum"), ("lo", "min"), ("hi", "max")]
    rnd = random.Random(len(str(types)))

    def value(t: pa.DataType) -> Any:
        return random_value(rnd, t)

    b = backend()
    table = b.aggregate_table("aggs", ["k"], funcs)
    schema = pa.schema([(name, t) for name, t in types.items()])
    model: dict[Any, list[Any]] = {}
    for batch in range(12):
        keys = rnd.sample(range(40), 15)
        rows = [{"k": (f"key{k}" if pa.types.is_string(types["k"]) else k),
                 **{n: value(types[n]) for n, _ in funcs}} for k in keys]
        out = table.upsert(pa.Table.from_pylist(rows, schema=schema))
        upsert_reference(model, rows, funcs)
        assert out.schema == schema
        assert {r["k"]: [r[n] for n, _ in funcs] for r in out.to_pylist()} == {r["k"]: model[r["k"]] for r in rows}
        if batch == 5:
            snapshot, at_snapshot = b.snapshot(), {k: list(v) for k, v in model.items()}
    tables = materialize(snapshot)
    again = backend()
    again_table = again.aggregate_table("aggs", ["k"], funcs)
    again.restore(tables)
    assert {r["k"]: [r[n] for n, _ in funcs] for r in again_table.rows().to_pylist()} == at_snapshot
    assert tables["aggs"].column("key_group").to_pylist() == \
        key_groups(tables["aggs"], ["k"], MAX_PAR).tolist()


def test_aggregate_table_rescales_by_key_group_and_refuses_a_key_twice() -> None:
    b = backend()
    table = b.aggregate_table("aggs", ["k", "j"], [("n", "sum")])
    table.upsert(pa.table({"k": [f"k{i}" for i in range(100)], "j": list(range(100)), "n": [1] * 100}))
    tables = materialize(b.snapshot())
    total = 0
    for index in range(3):
        part = backend(key_group_range(MAX_PAR, 3, index))
        mine = part.aggregate_table("aggs", ["k", "j"], [("n", "sum")])
        part.restore(tables)
        rows = mine.rows()
        total += rows.num_rows
        assert all(g in key_group_range(MAX_PAR, 3, index) for g in key_groups(rows, ["k", "j"], MAX_PAR))
    assert total == 100
    twice = backend()
    twice.aggregate_table("aggs", ["k", "j"], [("n", "sum")])
    twice.restore(tables)
    with pytest.raises(StateRestoreError, match="restored twice"):
        twice._columnar["aggs"].restore(tables["aggs"])


def test_aggregate_table_snapshot_is_a_copy_of_the_values() -> None:
    b = backend()
    table = b.aggregate_table("aggs", ["k"], [("n", "sum")])
    table.upsert(pa.table({"k": ["a", "b"], "n": [1, 2]}))
    snapshot = b.snapshot()
    table.upsert(pa.table({"k": ["a", "c"], "n": [10, 20]}))
    assert sorted(materialize(snapshot)["aggs"].drop_columns(["key_group"]).to_pylist(), key=str) == \
        [{"k": "a", "n": 1}, {"k": "b", "n": 2}]


def test_aggregate_table_snapshots_copy_each_chunk_once_whoever_comes_first() -> None:
    # 300,000 keys: five copy-on-write chunks; the task changes some of them (and adds rows)
    # between two snapshots and while the writer makes the first one
    n = 300_000
    b = backend()
    table = b.aggregate_table("aggs", ["k"], [("n", "sum"), ("m", "max")])
    table.upsert(pa.table({"k": list(range(n)), "n": [1] * n, "m": [0] * n}))
    first = b.snapshot()
    touched = list(range(0, n, 7)) + list(range(70_000, 140_000))
    table.upsert(pa.table({"k": touched + [n, n + 1], "n": [5] * (len(touched) + 2), "m": [9] * (len(touched) + 2)}))
    second = b.snapshot()
    made: dict[str, pa.Table] = {}
    writer = threading.Thread(target=lambda: made.update(materialize(first)))
    writer.start()
    table.upsert(pa.table({"k": list(range(0, n, 3)), "n": [100] * len(range(0, n, 3)), "m": [50] * len(range(0, n, 3))}))
    writer.join(30)
    expected_first = pa.table({"k": list(range(n)), "n": [1] * n, "m": [0] * n})
    assert made["aggs"].drop_columns(["key_group"]).sort_by("k").equals(expected_first)
    again = materialize(second)["aggs"].drop_columns(["key_group"]).sort_by("k").to_pydict()
    bumped = set(touched)
    assert again["n"] == [6 if k in bumped else 1 for k in range(n)] + [5, 5]
    assert again["m"] == [9 if k in bumped else 0 for k in range(n)] + [9, 9]
    assert table._frozen == []  # made snapshots let go of their frozen rows


# -- columnar: NamespacedTables --------------------------------------------------------------------

def test_namespaced_tables_keep_their_flags_and_split_by_key_group() -> None:
    b = backend()
    wins = b.namespaced_tables("wins", ["k"])
    wins.add(0, pa.table({"k": ["a", "b"], "v": [1, 2]}))
    wins.add(0, pa.table({"k": ["a"], "v": [3]}))
    wins.add(10, pa.table({"k": ["c"], "v": [4]}))
    wins.flag(0)
    snapshot = b.snapshot()
    wins.drop(0)  # the live state goes on; the snapshot does not see it
    tables = materialize(snapshot)
    rows: list[tuple[int, bool, str, int]] = []
    for index in (0, 1):
        part = backend(key_group_range(MAX_PAR, 2, index))
        mine = part.namespaced_tables("wins", ["k"])
        part.restore(tables)
        for ns in mine.namespaces():
            for t in mine.get(ns):
                rows += [(ns, mine.is_flagged(ns), r["k"], r["v"]) for r in t.to_pylist()]
    assert sorted(rows) == [(0, True, "a", 1), (0, True, "a", 3), (0, True, "b", 2), (10, False, "c", 4)]
