"""The vectorised windows' state on the RocksDB backend (issue 12): open windows' contents are a
column family of the database (``RocksDBNamespacedTables``), in the native checkpoint; window
operators and window joins on rocksdb restore exactly from their checkpoints (native) and from
canonical tables (savepoints), also split into two subtasks by key group; the tables behave as
the in-memory ones and round-trip heap <-> rocksdb."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.harness import OperatorHarness
from tests.unit.test_window_checkpoints import (
    EVENT_POINTS,
    check_join_restores_exactly,
    check_restores_exactly,
    event_steps,
    feed,
)
from tests.unit.test_windows import SCHEMA, SPECS, pair_fn
from yarnflow.common.api.windows import SlidingEventTimeWindows, TumblingEventTimeWindows
from yarnflow.common.rocksdb_columnar import TYPES_KEY, columnar_states
from yarnflow.common.rocksdb_snapshot import native_to_canonical
from yarnflow.worker.operators.windows import WindowAggregateOperator
from yarnflow.worker.key_assignment import key_group_range
from yarnflow.worker.state.heap import HeapKeyedStateBackend
from yarnflow.worker.state.localdir import release_attempt
from yarnflow.worker.state.rocksdb import RocksDBKeyedStateBackend
from yarnflow.worker.state.rocksdb_columnar import RocksDBNamespacedTables
from yarnflow.worker.state.rocksdb_files import NativeSnapshot
from yarnflow.worker.state.tables import materialize

pytestmark = [pytest.mark.unit, pytest.mark.timeout(180)]

MAX_PAR = 128


@pytest.fixture
def rocksdb(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """RuntimeContext fields that give the operators RocksDB backends under ``tmp_path``."""
    config = {"state.backend.type": "rocksdb", "state.backend.rocksdb.localdir": str(tmp_path / "local"),
              "execution.checkpointing.incremental": "true"}
    yield {"config": config, "attempt_id": "windows"}
    release_attempt(config, "windows")


def rows_of(tables: list[pa.Table]) -> Counter[str]:
    return Counter(repr(r) for t in tables for r in t.to_pylist())


def canonical_rows(table: pa.Table) -> Counter[str]:
    return Counter(repr(sorted(r.items())) for r in table.to_pylist())


def drive(tables: Any, seed: int) -> None:
    """The same random additions, replacements, flags and drops, as the window operators do."""
    rnd = random.Random(seed)
    for step in range(300):
        ns = rnd.randrange(6) * 10
        op = rnd.randrange(10)
        if op < 6:
            n = rnd.randint(0, 30)
            tables.add(ns, pa.table({"k": pa.array([f"k{rnd.randrange(50)}" for _ in range(n)], pa.string()),
                                     "v": pa.array([rnd.randint(0, 9) if rnd.random() < 0.9 else None
                                                    for _ in range(n)], pa.int64())}))
        elif op == 6 and ns in tables:
            parts = tables.get(ns)
            tables.replace(ns, [pa.concat_tables(parts)] if parts else [])
        elif op == 7:
            tables.flag(ns)
        elif op == 8:
            tables.drop(ns)
        elif step == 150:
            tables.clear()


def test_namespaced_tables_behave_as_the_in_memory_ones(tmp_path: Path) -> None:
    rdb = RocksDBKeyedStateBackend(MAX_PAR, range(MAX_PAR), str(tmp_path / "b"), True)
    mem = HeapKeyedStateBackend(MAX_PAR, range(MAX_PAR))
    on_disk, in_memory = (b.namespaced_tables("wins", ["k"]) for b in (rdb, mem))
    assert isinstance(on_disk, RocksDBNamespacedTables)
    drive(on_disk, seed=1)
    drive(in_memory, seed=1)
    assert on_disk.namespaces() == in_memory.namespaces() and len(on_disk) == len(in_memory) > 2
    for ns in in_memory.namespaces():
        assert on_disk.count(ns) == in_memory.count(ns) == len(on_disk.get(ns))
        assert on_disk.is_flagged(ns) == in_memory.is_flagged(ns)
        assert rows_of(on_disk.get(ns)) == rows_of(in_memory.get(ns))
    got, expected = materialize(rdb.snapshot())["wins"], materialize(mem.snapshot())["wins"]
    assert got.schema == expected.schema
    assert canonical_rows(got) == canonical_rows(expected) and got.num_rows > 20
    rdb.close()


def test_open_windows_are_in_the_native_checkpoint_and_restore_split_by_key_group(tmp_path: Path) -> None:
    rdb = RocksDBKeyedStateBackend(MAX_PAR, range(MAX_PAR), str(tmp_path / "b"), True)
    wins = rdb.namespaced_tables("wins", ["k"])
    drive(wins, seed=2)
    snap = rdb.snapshot()
    wins.clear()  # after the snapshot: not in it
    tables, _ = snap.write_native(None, str(tmp_path / "chk-1"))
    snap.release()
    assert set(tables) == {"rocksdb"}  # the windows are in the SST files, no Arrow table of their own
    manifest = tables["rocksdb"]
    assert columnar_states(manifest.schema.metadata) == {"wins": "namespaced_tables"}
    canonical = pa.Table.from_batches([b for name, b in native_to_canonical(manifest) if name == "wins"])
    assert canonical.num_rows > 20
    seen: Counter[str] = Counter()
    for index in range(2):
        owned = key_group_range(MAX_PAR, 2, index)
        part = RocksDBKeyedStateBackend(MAX_PAR, owned, str(tmp_path / f"p{index}"), True)
        mine = part.namespaced_tables("wins", ["k"])
        part.restore({"rocksdb": manifest})
        for row in canonical.to_pylist():
            if row["key_group"] in owned:
                assert row["namespace"] in mine and mine.is_flagged(row["namespace"]) == row["flagged"]
        back = materialize(part.snapshot())["wins"]
        assert all(g in owned for g in back.column("key_group").to_pylist())
        seen += canonical_rows(back)
        assert part.column_family("wins").get(TYPES_KEY) is not None
        part.close()
    assert seen == canonical_rows(canonical)
    rdb.close()


def test_namespaced_tables_go_from_heap_to_rocksdb_and_back(tmp_path: Path) -> None:
    mem = HeapKeyedStateBackend(MAX_PAR, range(MAX_PAR))
    drive(mem.namespaced_tables("wins", ["k"]), seed=3)
    from_heap = materialize(mem.snapshot())
    rdb = RocksDBKeyedStateBackend(MAX_PAR, range(MAX_PAR), str(tmp_path / "b"), True)
    rdb.namespaced_tables("wins", ["k"])
    rdb.restore(from_heap)
    back = materialize(rdb.snapshot())
    again = HeapKeyedStateBackend(MAX_PAR, range(MAX_PAR))
    again.namespaced_tables("wins", ["k"])
    again.restore(back)
    assert back["wins"].schema == from_heap["wins"].schema
    assert canonical_rows(materialize(again.snapshot())["wins"]) == canonical_rows(from_heap["wins"])
    rdb.close()


@pytest.mark.parametrize("native", [True, False], ids=["checkpoint", "savepoint"])
@pytest.mark.parametrize("name", ["tumbling", "sliding", "session"])
def test_windows_on_rocksdb_restore_exactly(name: str, native: bool, rocksdb: dict[str, Any], tmp_path: Path) -> None:
    _, assigner = SPECS[name]

    def make() -> WindowAggregateOperator:
        return WindowAggregateOperator(["key"], assigner(True), "ts", aggs=[("value", "sum"), ("value", "mean"),
                                                                            ("key", "count")],
                                       allowed_lateness_ms=45, late_tag="late")

    check_restores_exactly(make, event_steps(len(name), bound=10, late_every=7), EVENT_POINTS[::2],
                           context=rocksdb, native=tmp_path if native else None)


def test_windows_on_rocksdb_restore_into_two_subtasks(rocksdb: dict[str, Any], tmp_path: Path) -> None:
    _, assigner = SPECS["sliding"]
    check_restores_exactly(lambda: WindowAggregateOperator(["key"], assigner(True), "ts", aggs=[("value", "sum")],
                                                           allowed_lateness_ms=20),
                           event_steps(7, bound=10, late_every=9), [5, 21], parallelism=2,
                           context=rocksdb, native=tmp_path)


@pytest.mark.parametrize("join_fn", [None, pair_fn])
@pytest.mark.parametrize("assigner", [TumblingEventTimeWindows.of(20), SlidingEventTimeWindows.of(30, 10)])
def test_window_joins_on_rocksdb_restore_exactly(assigner: Any, join_fn: Any, rocksdb: dict[str, Any],
                                                 tmp_path: Path) -> None:
    check_join_restores_exactly(assigner, join_fn, context=rocksdb, native=tmp_path)


def test_a_vectorised_window_keeps_its_open_windows_in_rocksdb(rocksdb: dict[str, Any], tmp_path: Path) -> None:
    op = WindowAggregateOperator(["key"], SPECS["tumbling"][1](True), "ts", aggs=[("value", "sum")])
    h = OperatorHarness(op, schema=SCHEMA, **rocksdb)
    feed(h, event_steps(5, bound=10)[:20])
    wins = op._backend._columnar["__window_partials__"]
    assert isinstance(wins, RocksDBNamespacedTables) and len(wins)
    snap = op.snapshot_state(1)
    assert isinstance(snap, NativeSnapshot)  # also with the operator's own table (its input's schema)
    tables, _ = snap.write_native(None, str(tmp_path / "chk-1"))
    assert set(tables) == {"rocksdb", "input_schema"}
    assert columnar_states(tables["rocksdb"].schema.metadata) == {"__window_partials__": "namespaced_tables"}
    canonical = dict(native_to_canonical(tables["rocksdb"]))
    assert canonical["__window_partials__"].num_rows  # the open windows, from the checkpoint's files
    assert canonical_rows(materialize(snap)["__window_partials__"])  # its canonical form too
