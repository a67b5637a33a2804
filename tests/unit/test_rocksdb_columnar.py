"""The aggregate table of a vectorised keyed sum on the RocksDB backend (issue 12): it upserts
exactly as the in-memory table does (same rows, same Arrow types, nulls, temporal, decimal,
string and multi-column keys), it lives in the database (its column family is in the native
checkpoint, not a table of its own), snapshots are isolated from later updates, it restores at
another key-group range from a native snapshot, it converts to the canonical table of the heap
backend (savepoints) and restores from it, and back."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import pyarrow as pa
import pytest

from yarnflow.common.rocksdb_columnar import TYPES_KEY, columnar_states
from yarnflow.common.rocksdb_snapshot import native_to_canonical
from yarnflow.common.state_format import decode, encode
from yarnflow.worker.key_assignment import key_group_range, key_groups
from yarnflow.worker.state.errors import StateRestoreError
from yarnflow.worker.state.heap import HeapKeyedStateBackend
from yarnflow.worker.state.rocksdb import RocksDBKeyedStateBackend
from yarnflow.worker.state.rocksdb_columnar import RocksDBAggregateTable
from yarnflow.worker.state.tables import materialize

from tests.unit.test_state_backend import random_value

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

MAX_PAR = 128
FUNCS = [("s", "sum"), ("lo", "min"), ("hi", "max")]


def rocks(tmp_path: Path, owned: range = range(MAX_PAR), name: str = "b") -> RocksDBKeyedStateBackend:
    return RocksDBKeyedStateBackend(MAX_PAR, owned, str(tmp_path / name), incremental=True)


def heap(owned: range = range(MAX_PAR)) -> HeapKeyedStateBackend:
    return HeapKeyedStateBackend(MAX_PAR, owned)


def ordered(table: pa.Table, keys: list[str]) -> pa.Table:
    return table.sort_by([(k, "ascending") for k in keys])


def batches(types: dict[str, pa.DataType], seed: int, n: int = 12, keys: int = 40) -> list[pa.Table]:
    """Partial aggregates (one row per key) of random values, about one in five null."""
    rnd = random.Random(seed)
    schema = pa.schema(list(types.items()))
    out = []
    for _ in range(n):
        rows = []
        for k in rnd.sample(range(keys), 15):
            key = {"k": f"key{k}" if pa.types.is_string(types["k"]) else k, "j": k % 3}
            rows.append({**key, **{name: random_value(rnd, types[name]) for name, _ in FUNCS}})
        out.append(pa.Table.from_pylist(rows, schema=schema))
    return out


TYPES = [
    {"k": pa.int64(), "j": pa.int32(), "s": pa.int64(), "lo": pa.float64(), "hi": pa.int32()},
    {"k": pa.string(), "j": pa.int64(), "s": pa.float64(), "lo": pa.string(), "hi": pa.timestamp("us")},
    {"k": pa.int32(), "j": pa.int8(), "s": pa.decimal128(10, 2), "lo": pa.date32(), "hi": pa.bool_()},
]


@pytest.mark.parametrize("types", TYPES)
def test_upserts_give_the_rows_and_types_of_the_in_memory_table(tmp_path: Path, types: dict[str, pa.DataType]) -> None:
    rdb, mem = rocks(tmp_path), heap()
    on_disk = rdb.aggregate_table("aggs", ["k", "j"], FUNCS)
    in_memory = mem.aggregate_table("aggs", ["k", "j"], FUNCS)
    assert isinstance(on_disk, RocksDBAggregateTable)
    for partial in batches(types, seed=len(str(types))):
        got, expected = on_disk.upsert(partial), in_memory.upsert(partial)
        assert got.schema == expected.schema
        assert got.equals(expected)
    assert len(on_disk) == len(in_memory) > 30
    assert ordered(on_disk.rows(), ["k", "j"]).equals(ordered(in_memory.rows(), ["k", "j"]))
    # canonical tables: the same rows and column types as the heap backend's
    got_tables, expected_tables = materialize(rdb.snapshot()), materialize(mem.snapshot())
    assert set(got_tables) == set(expected_tables) == {"aggs"}
    assert got_tables["aggs"].schema == expected_tables["aggs"].schema
    assert ordered(got_tables["aggs"], ["k", "j"]).equals(ordered(expected_tables["aggs"], ["k", "j"]))
    rdb.close()


def test_a_column_only_ever_null_takes_the_type_of_its_first_value(tmp_path: Path) -> None:
    rdb, mem = rocks(tmp_path), heap()
    tables = [b.aggregate_table("aggs", ["k"], [("n", "sum"), ("t", "max")]) for b in (rdb, mem)]
    partials = [pa.table({"k": ["a", "b"], "n": pa.nulls(2), "t": pa.nulls(2)}),
                pa.table({"k": ["a", None], "n": [5, 6], "t": pa.array([None, dt.datetime(2024, 5, 1)], pa.timestamp("ms"))}),
                pa.table({"k": ["a", "c"], "n": pa.nulls(2), "t": pa.array([dt.datetime(2020, 1, 1), None], pa.timestamp("ms"))})]
    for partial in partials:
        got, expected = (t.upsert(partial) for t in tables)
        assert got.equals(expected), (got, expected)
    assert ordered(tables[0].rows(), ["k"]).to_pylist() == [
        {"k": "a", "n": 5, "t": dt.datetime(2020, 1, 1)}, {"k": "b", "n": None, "t": None},
        {"k": "c", "n": None, "t": None}, {"k": None, "n": 6, "t": dt.datetime(2024, 5, 1)}]
    assert materialize(rdb.snapshot())["aggs"].schema == materialize(mem.snapshot())["aggs"].schema
    rdb.close()


def test_the_table_is_a_column_family_of_the_database_in_its_checkpoint(tmp_path: Path) -> None:
    rdb = rocks(tmp_path)
    table = rdb.aggregate_table("aggs", ["k"], [("n", "sum")])
    table.upsert(pa.table({"k": [f"k{i}" for i in range(1000)], "n": list(range(1000))}))
    assert len(table) == 1000
    snap = rdb.snapshot()
    tables, shared = snap.write_native(str(tmp_path / "shared"), str(tmp_path / "chk-1"))
    snap.release()
    assert set(tables) == {"rocksdb"}  # no Arrow table of the aggregate: it is in the SST files
    assert columnar_states(tables["rocksdb"].schema.metadata) == {"aggs": "aggregate_table"}
    assert shared and all(Path(url).exists() for url, _ in shared)
    cf = rdb.db.get_column_family("aggs")
    entries = dict(cf.items())
    assert len(entries) == 1001 and TYPES_KEY in entries  # every row, and the Arrow types
    # an entry: key group (2 bytes) + the compact key tuple -> the compact value tuple, no pickle
    dbkey = key_groups(pa.table({"k": ["k7"]}), ["k"], MAX_PAR)[0].item().to_bytes(2, "big") + encode(("k7",))
    assert decode(entries[dbkey]) == (7,)
    rdb.close()


def test_a_snapshot_does_not_see_later_updates(tmp_path: Path) -> None:
    rdb = rocks(tmp_path)
    table = rdb.aggregate_table("aggs", ["k"], [("n", "sum"), ("m", "max")])
    table.upsert(pa.table({"k": list(range(500)), "n": [1] * 500, "m": [0] * 500}))
    snap, own = rdb.snapshot(), table.snapshot_builder()
    table.upsert(pa.table({"k": list(range(0, 600, 2)), "n": [10] * 300, "m": [7] * 300}))
    expected = pa.table({"k": list(range(500)), "n": [1] * 500, "m": [0] * 500})
    assert ordered(materialize(snap)["aggs"], ["k"]).drop_columns(["key_group"]).equals(expected)
    build, _ = own
    assert ordered(build(), ["k"]).drop_columns(["key_group"]).equals(expected)
    assert ordered(table.rows(), ["k"]).to_pydict()["n"] == [11 if k % 2 == 0 else 1 for k in range(500)] + [10] * 50
    assert not list(Path(rdb.local_dir).glob("aggs-snapshot-*"))  # the table's own checkpoint is removed
    rdb.close()


def test_a_native_snapshot_restores_whole_or_split_by_key_group(tmp_path: Path) -> None:
    rdb = rocks(tmp_path)
    table = rdb.aggregate_table("aggs", ["k", "j"], [("n", "sum"), ("d", "min")])
    partial = pa.table({"k": [f"k{i}" for i in range(300)], "j": list(range(300)), "n": [2] * 300,
                        "d": pa.array([dt.date(2024, 1, 1 + i % 28) for i in range(300)], pa.date32())})
    table.upsert(partial)
    snap = rdb.snapshot()
    manifest = snap.write_native(str(tmp_path / "shared"), str(tmp_path / "chk-1"))[0]["rocksdb"]
    snap.release()
    rdb.close()
    whole = rocks(tmp_path, name="whole")
    again = whole.aggregate_table("aggs", ["k", "j"], [("n", "sum"), ("d", "min")])
    whole.restore({"rocksdb": manifest})
    assert len(again) == 300
    out = again.upsert(pa.table({"k": ["k1", "new"], "j": [1, 5], "n": [5, 5],
                                 "d": pa.array([dt.date(2020, 1, 1), None], pa.date32())}))
    assert out.to_pylist() == [{"k": "k1", "j": 1, "n": 7, "d": dt.date(2020, 1, 1)},
                               {"k": "new", "j": 5, "n": 5, "d": None}]
    whole.close()
    seen = 0
    for index in range(3):
        owned = key_group_range(MAX_PAR, 3, index)
        part = rocks(tmp_path, owned, name=f"part{index}")
        mine = part.aggregate_table("aggs", ["k", "j"], [("n", "sum"), ("d", "min")])
        part.restore({"rocksdb": manifest})
        rows = mine.rows()
        assert len(mine) == rows.num_rows
        assert all(g in owned for g in key_groups(rows, ["k", "j"], MAX_PAR))
        assert rows.schema == partial.schema and rows.column("n").to_pylist() == [2] * rows.num_rows
        seen += rows.num_rows
        part.close()
    assert seen == 300


def test_canonical_tables_go_from_heap_to_rocksdb_and_back(tmp_path: Path) -> None:
    types = TYPES[1]
    mem = heap()
    first = mem.aggregate_table("aggs", ["k", "j"], FUNCS)
    for partial in batches(types, seed=3):
        first.upsert(partial)
    from_heap = materialize(mem.snapshot())
    rdb = rocks(tmp_path, key_group_range(MAX_PAR, 2, 1))  # at another key-group range
    on_disk = rdb.aggregate_table("aggs", ["k", "j"], FUNCS)
    rdb.restore(from_heap)
    kept = from_heap["aggs"].filter(pa.compute.greater_equal(from_heap["aggs"].column("key_group"), 64))
    assert 0 < len(on_disk) == kept.num_rows < from_heap["aggs"].num_rows
    back = materialize(rdb.snapshot())["aggs"]
    assert back.schema == kept.schema
    assert ordered(back, ["k", "j"]).equals(ordered(kept, ["k", "j"]))
    mem2 = heap(key_group_range(MAX_PAR, 2, 1))
    in_memory = mem2.aggregate_table("aggs", ["k", "j"], FUNCS)
    mem2.restore({"aggs": back})
    partial = batches(types, seed=4, n=1)[0]
    assert on_disk.upsert(partial.filter(owned_mask(partial))).equals(in_memory.upsert(partial.filter(owned_mask(partial))))
    with pytest.raises(StateRestoreError, match="restored twice"):
        on_disk.restore(back)
    rdb.close()


def owned_mask(partial: pa.Table) -> pa.Array:
    return pa.array(key_groups(partial, ["k", "j"], MAX_PAR) >= 64)


def test_a_savepoint_conversion_gives_the_canonical_table_in_batches(tmp_path: Path) -> None:
    rdb, mem = rocks(tmp_path), heap()
    tables = [b.aggregate_table("aggs", ["k", "j"], FUNCS) for b in (rdb, mem)]
    for partial in batches(TYPES[2], seed=5, keys=400):
        for t in tables:
            t.upsert(partial)
    snap = rdb.snapshot()
    manifest = snap.write_native(str(tmp_path / "shared"), str(tmp_path / "chk-1"))[0]["rocksdb"]
    snap.release()
    converted = list(native_to_canonical(manifest))
    assert {name for name, _ in converted} == {"aggs"}
    got = pa.Table.from_batches([b for _, b in converted])
    expected = materialize(mem.snapshot())["aggs"]
    assert got.schema == expected.schema  # with the max parallelism in the metadata
    assert ordered(got, ["k", "j"]).equals(ordered(expected, ["k", "j"]))
    rdb.close()


def test_a_native_snapshot_with_an_aggregate_this_operator_lacks_is_refused(tmp_path: Path) -> None:
    rdb = rocks(tmp_path)
    rdb.aggregate_table("aggs", ["k"], [("n", "sum")]).upsert(pa.table({"k": [1], "n": [1]}))
    snap = rdb.snapshot()
    manifest = snap.write_native(None, str(tmp_path / "chk-1"))[0]["rocksdb"]
    snap.release()
    rdb.close()
    other = rocks(tmp_path, name="other")
    other.aggregate_table("totals", ["k"], [("n", "sum")])
    with pytest.raises(StateRestoreError, match=r"state \['aggs'\] that this operator does not have"):
        other.restore({"rocksdb": manifest})
    other.close()
