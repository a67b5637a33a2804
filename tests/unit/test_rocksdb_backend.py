"""The RocksDB keyed state backend: every state kind and timers behave as on the heap backend,
range scans by key group, restore at another parallelism, snapshot isolation while the task
writes, native and incremental snapshots, corrupt files, the compact serialisation, and the
removal of the working files."""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from yarnflow.am.checkpoint.shared import SharedStateRegistry
from yarnflow.common.api import (
    EVENT_TIME,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from yarnflow.common.errors import JobDefinitionError
from yarnflow.common.messages import SHARED_STATE_FILE, OperatorStateFile
from yarnflow.common.rocksdb_columnar import columnar_states
from yarnflow.common.rocksdb_snapshot import CorruptStateFileError, native_to_canonical
from yarnflow.common.state_format import decode, encode
from yarnflow.worker.operators.keyed import KeyedReduce
from yarnflow.worker.operators.process import KeyedProcessOperator
from yarnflow.worker.elements import MAX_WATERMARK
from yarnflow.worker.key_assignment import key_group_range
from yarnflow.worker.state.errors import StateRestoreError
from yarnflow.worker.state.heap import ABSENT, HeapKeyedStateBackend
from yarnflow.worker.state.localdir import attempt_dir, new_rocksdb_backend, release_attempt, remove_orphans
from yarnflow.worker.state.rocksdb import RocksDBKeyedStateBackend
from yarnflow.worker.state.rocksdb_files import NativeSnapshot
from yarnflow.worker.state.tables import loads, materialize

from tests.harness import OperatorHarness

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

MAX_PAR = 128


def rocks(tmp_path: Path, owned: range = range(MAX_PAR), incremental: bool = True,
          name: str = "b") -> RocksDBKeyedStateBackend:
    return RocksDBKeyedStateBackend(MAX_PAR, owned, str(tmp_path / name), incremental)


def register(b: HeapKeyedStateBackend) -> dict[str, Any]:
    return {"v": b.get_state(ValueStateDescriptor("v", default=0)),
            "w": b.get_state(ValueStateDescriptor("w")),
            "l": b.get_state(ListStateDescriptor("l")),
            "m": b.get_state(MapStateDescriptor("m")),
            "r": b.get_state(ReducingStateDescriptor("r", lambda a, c: a + c)),
            "i": b.internal_state("i", list),
            "t": b.timer_service("t")}


def drive(b: HeapKeyedStateBackend, seed: int, steps: int = 3000, keys: int = 60) -> None:
    """The same random operations on every state kind and timers."""
    rnd = random.Random(seed)
    s = register(b)
    for _ in range(steps):
        k = rnd.randrange(keys)
        b.set_current_key((f"k{k}", k), k % MAX_PAR)
        op = rnd.randrange(12)
        if op == 0:
            s["v"].update(s["v"].value() + k)
        elif op == 1:
            s["l"].add(rnd.randrange(100))
        elif op == 2:
            s["l"].update([] if rnd.random() < 0.3 else [1, "x", None])
        elif op == 3:
            s["m"].put(rnd.randrange(5), {"n": k, "f": 1.5})
        elif op == 4:
            s["m"].remove(rnd.randrange(5))
        elif op == 5:
            s["r"].add(k)
        elif op == 6:
            acc = s["i"].get_for_update(namespace=k % 3)
            if acc is ABSENT:
                s["i"].put([k], namespace=k % 3)
            else:
                acc.append(k)  # changed in place: the state's
        elif op == 7:
            s["t"].register(EVENT_TIME, rnd.randrange(1000), namespace=None)
        elif op == 8:
            s["t"].delete(EVENT_TIME, rnd.randrange(1000), namespace=None)
        elif op == 9:
            s["v"].clear()
        elif op == 10:
            current = s["w"].value()
            if current is None:
                s["w"].update([k])
            else:
                current.append(k)  # changed in place while its key is current: the state's
        else:
            s["i"].delete(namespace=k % 3)


def canon(tables: dict[str, pa.Table]) -> dict[str, Counter[Any]]:
    """The tables' rows with the pickled cells decoded (order and pickle bytes do not matter)."""
    out: dict[str, Counter[Any]] = {}
    for name, table in tables.items():
        rows = Counter()
        for row in table.to_pylist():
            rows[tuple(sorted((c, repr(loads(v)) if isinstance(v, bytes) and c in ("key", "namespace", "value")
                               else repr(v)) for c, v in row.items()))] += 1
        out[name] = rows
    return out


def test_every_state_kind_and_timers_match_the_heap_backend(tmp_path: Path) -> None:
    heap, rdb = HeapKeyedStateBackend(MAX_PAR, range(MAX_PAR)), rocks(tmp_path)
    drive(heap, seed=7)
    drive(rdb, seed=7)
    expected = materialize(heap.snapshot())
    assert set(expected) == {"keyed_state", "timers"} and expected["keyed_state"].num_rows > 100
    assert canon(materialize(rdb.snapshot())) == canon(expected)
    # timers fire in the same order on both
    fired = [[t.pop_next(EVENT_TIME, 10_000) for _ in range(2000)] for t in (heap.timer_service("t"),
                                                                               rdb.timer_service("t"))]
    assert fired[0] == fired[1] and fired[0][0] is not None
    rdb.close()


def test_values_changed_in_place_are_kept_and_reads_are_fresh_objects(tmp_path: Path) -> None:
    b = rocks(tmp_path)
    v = b.get_state(ValueStateDescriptor("v", default=[]))
    m = b.get_state(MapStateDescriptor("m"))
    b.set_current_key(("a",), 1)
    v.value().append(1)          # the default, changed in place: not stored (as on the heap)
    v.update([1])
    v.value().append(2)          # a stored value changed in place while "a" is current
    m.put("x", 1)
    b.set_current_key(("b",), 2)
    got = v.value()
    got.append(99)
    b.set_current_key(("a",), 1)
    assert v.value() == [1, 2] and m.items() == [("x", 1)]
    b.set_current_key(("b",), 2)
    assert v.value() == []       # a default changed in place is not stored (as on the heap)
    b.close()


def test_range_scans_by_key_group_return_only_the_owned_groups_in_order(tmp_path: Path) -> None:
    b = rocks(tmp_path, owned=range(32, 96))
    v = b.get_state(ValueStateDescriptor("v"))
    for kg in (95, 32, 40, 40, 64):
        b.set_current_key((f"key{kg}", len(str(kg))), kg)
        v.update(kg)
    assert [kg for kg, _, _ in b.raw_entries("v")] == [32, 40, 64, 95]
    assert b.key_groups_with_state() == [32, 40, 64, 95]
    assert [(kg, key, val) for kg, key, val in b.entries("v")][0] == (32, ("key32", 2), 32)
    b.close()


def test_native_snapshot_restores_at_another_parallelism_without_loss_or_duplicates(tmp_path: Path) -> None:
    old = rocks(tmp_path, name="old")
    drive(old, seed=3, keys=400, steps=4000)
    expected = canon(materialize(old.snapshot()))
    snap = old.snapshot()
    assert isinstance(snap, NativeSnapshot)
    tables, _ = snap.write_native(str(tmp_path / "shared"), str(tmp_path / "private"))
    snap.release()
    # scale out to 3: each keeps its own key groups (range scans of the downloaded database)
    parts, backends = [], []
    for i in range(3):
        new = rocks(tmp_path, owned=key_group_range(MAX_PAR, 3, i), name=f"new{i}")
        register(new)
        new.restore(tables)
        assert all(kg in new.key_group_range for kg in new.key_groups_with_state())
        parts.append(new.snapshot())
        backends.append(new)
    pieces = [materialize(p) for p in parts]
    merged = {name: pa.concat_tables([p[name] for p in pieces if name in p]) for name in expected}
    assert canon(merged) == expected
    # and back in: three native snapshots (concatenated as read_task_state does) into one
    natives = []
    for i, new in enumerate(backends):
        natives.append(new.snapshot().write_native(str(tmp_path / "shared"), str(tmp_path / f"p{i}"))[0]["rocksdb"])
    one = rocks(tmp_path, name="one")
    register(one)
    one.restore({"rocksdb": pa.concat_tables(natives)})
    assert canon(materialize(one.snapshot())) == expected
    twice = rocks(tmp_path, name="twice")
    with pytest.raises(StateRestoreError, match="restored twice"):
        again = old.snapshot().write_native(str(tmp_path / "shared"), str(tmp_path / "again"))[0]["rocksdb"]
        twice.restore({"rocksdb": pa.concat_tables([tables["rocksdb"], again])})


def test_a_snapshot_is_the_state_when_it_was_taken_while_the_task_keeps_writing(tmp_path: Path) -> None:
    b = rocks(tmp_path)
    v = b.get_state(ValueStateDescriptor("v"))
    for i in range(1000):
        b.set_current_key((i,), i % MAX_PAR)
        v.update(i)
    snap = b.snapshot()
    for i in range(1000):
        b.set_current_key((i,), i % MAX_PAR)
        if i % 2:
            v.clear()
        else:
            v.update(-i)
    b.set_current_key((5000,), 7)
    v.update("new")
    tables = snap.build()
    snap.release()
    rows = {loads(r["key"]): loads(r["value"]) for r in tables["keyed_state"].to_pylist()}
    assert rows == {(i,): i for i in range(1000)}
    assert not os.path.exists(snap.folder)  # the RocksDB checkpoint is gone once written
    b.close()


def test_hashmap_state_restores_on_rocksdb_and_back_unchanged(tmp_path: Path) -> None:
    heap = HeapKeyedStateBackend(MAX_PAR, range(MAX_PAR))
    drive(heap, seed=11)
    tables = materialize(heap.snapshot())
    rdb = rocks(tmp_path)
    register(rdb)
    rdb.restore(tables)
    via_rocks = materialize(rdb.snapshot())
    back = HeapKeyedStateBackend(MAX_PAR, range(MAX_PAR))
    register(back)
    back.restore(via_rocks)
    assert canon(via_rocks) == canon(tables) == canon(materialize(back.snapshot()))
    rdb.close()


def test_incremental_snapshots_upload_only_new_sst_files(tmp_path: Path) -> None:
    b = rocks(tmp_path)
    v = b.get_state(ValueStateDescriptor("v"))
    shared = str(tmp_path / "shared")
    for round_ in range(3):
        for i in range(20_000):
            b.set_current_key((i,), i % MAX_PAR)
            v.update(i)
        b.snapshot().write_native(shared, str(tmp_path / f"full{round_}"))
    first_files = set(os.listdir(shared))
    snap = b.snapshot()
    _, refs1 = snap.write_native(shared, str(tmp_path / "c1"))
    snap.release()
    for i in range(0, 20_000, 100):  # 1% of the keys change
        b.set_current_key((i,), i % MAX_PAR)
        v.update(-i)
    snap = b.snapshot()
    tables, refs2 = snap.write_native(shared, str(tmp_path / "c2"))
    snap.release()
    new = set(os.listdir(shared)) - first_files
    reused = {u for u, _ in refs1} & {u for u, _ in refs2}
    assert reused and len(new) <= 2
    assert sum(s for u, s in refs2 if u not in reused) < 0.5 * sum(s for _, s in refs2)
    # a restore from the shared files sees the changes, and references the same copies
    r = rocks(tmp_path, name="r")
    r.restore(tables)
    r.set_current_key((100,), 100 % MAX_PAR)
    assert r.get_state(ValueStateDescriptor("v")).value() == -100
    _, refs3 = r.snapshot().write_native(shared, str(tmp_path / "c3"))
    assert {u for u, _ in refs3} == {u for u, _ in refs2}
    b.close()
    r.close()


def test_a_corrupt_or_missing_shared_file_fails_the_restore_naming_it(tmp_path: Path) -> None:
    b = rocks(tmp_path)
    drive(b, seed=5)
    tables, refs = b.snapshot().write_native(str(tmp_path / "shared"), str(tmp_path / "p"))
    victim = refs[0][0]
    data = bytearray(Path(victim).read_bytes())
    data[len(data) // 2] ^= 0xFF
    Path(victim).write_bytes(bytes(data))
    with pytest.raises(StateRestoreError, match=f"{victim}.*corrupt"):
        rocks(tmp_path, name="r").restore(tables)
    with pytest.raises(CorruptStateFileError, match="corrupt"):
        list(native_to_canonical(tables["rocksdb"]))
    os.remove(victim)
    with pytest.raises(StateRestoreError, match=victim):
        rocks(tmp_path, name="r2").restore(tables)
    b.close()


def test_restore_refuses_another_max_parallelism_and_foreign_state(tmp_path: Path) -> None:
    b = rocks(tmp_path)
    drive(b, seed=1, steps=200)
    tables, _ = b.snapshot().write_native(str(tmp_path / "s"), str(tmp_path / "p"))
    with pytest.raises(StateRestoreError, match="max parallelism 128"):
        RocksDBKeyedStateBackend(64, range(64), str(tmp_path / "x")).restore(tables)
    with pytest.raises(StateRestoreError, match="does not have"):
        rocks(tmp_path, name="y").restore({"elsewhere": pa.table({"key_group": [1]})})
    clash = rocks(tmp_path, name="z")
    clash.get_state(ListStateDescriptor("v"))
    with pytest.raises(StateRestoreError, match="'v'"):
        clash.restore(tables)
    b.close()


def test_serde_round_trips_known_types_compactly_and_refuses_garbage() -> None:
    values = [None, True, False, 0, -1, 2**63 - 1, 2**80, -(2**70), 1.5, float("inf"), "", "é\ud800", b"\x00",
              (1, "a", None), [1, [2, (3,)]], {"a": [1, {"b": 2.0}], 3: None}, frozenset({1})]
    for v in values:
        assert decode(encode(v)) == v and type(decode(encode(v))) is type(v)
    assert len(encode(("user-1", 42))) < 30  # no pickle framing for a plain key
    assert encode((1, "a")) == encode((1, "a"))
    with pytest.raises(ValueError, match="not an encoded"):
        decode(b"\x07\x00\x00\x00\x09ab")
    with pytest.raises(ValueError, match="left over"):
        decode(encode(1) + b"x")


class Count(KeyedProcessFunction):
    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        c = ctx.get_state(ValueStateDescriptor("c", default=0))
        c.update(c.value() + 1)
        ctx.timer_service().register_event_time_timer(row["t"])

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        out.collect({"k": ctx.current_key, "c": ctx.get_state(ValueStateDescriptor("c", default=0)).value()})


def test_operators_run_unchanged_on_rocksdb_and_the_working_files_go_with_the_task(tmp_path: Path) -> None:
    config = {"state.backend.type": "rocksdb", "state.backend.rocksdb.localdir": str(tmp_path / "local")}
    results = []
    for conf in ({}, config):
        op = KeyedProcessOperator(["k"], Count(), time_column="t")
        h = OperatorHarness(op, now=0, config=conf, attempt_id="attempt-1")
        assert isinstance(op.state_backend, RocksDBKeyedStateBackend) == bool(conf)
        h.batch(pa.RecordBatch.from_pydict({"k": ["a", "b", "a", "c"], "t": [5, 6, 7, 8]}))
        reduce = KeyedReduce(["k"], lambda acc, row: {**acc, "n": acc["n"] + row["n"]})
        hr = OperatorHarness(reduce, now=0, config=conf, attempt_id="attempt-1")
        hr.batch(pa.RecordBatch.from_pydict({"k": ["a", "a", "b"], "n": [1, 2, 3]}))
        h.watermark(MAX_WATERMARK)
        results.append((h.rows(), hr.rows()))
    assert results[0] == results[1]
    folder = attempt_dir(config, "attempt-1")
    assert len([f for f in os.scandir(folder) if f.is_dir()]) == 2  # one folder per backend, under the attempt's
    release_attempt(config, "attempt-1")
    assert not os.path.exists(folder)


def test_working_files_of_a_dead_taskexecutor_are_removed_by_the_next_process_that_uses_the_folder(
        tmp_path: Path) -> None:
    import subprocess
    import sys

    base = tmp_path / "shared"
    config = {"state.backend.rocksdb.localdir": str(base)}
    # a process that made a backend and died without releasing it (a SIGKILLed TaskExecutor)
    code = ("import os, signal; from yarnflow.worker.state.localdir import new_rocksdb_backend; "
            f"new_rocksdb_backend({config!r}, 'dead-attempt', 'op', 128, range(128), False); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    subprocess.run([sys.executable, "-c", code], timeout=60)
    dead = attempt_dir(config, "dead-attempt")
    assert os.path.isdir(dead), "the killed process left no working files: the test proves nothing"
    stray = base / "yarnflow-rocksdb" / "not-an-attempt"  # no owner file: not ours to remove
    stray.mkdir()
    live = new_rocksdb_backend(config, "live-attempt", "op", MAX_PAR, range(MAX_PAR), False)
    try:
        assert not os.path.exists(dead)
        assert stray.is_dir() and os.path.isdir(live.local_dir)
        assert remove_orphans(str(base / "yarnflow-rocksdb")) == []  # this process is alive: its folder stays
    finally:
        release_attempt(config, "live-attempt")


def test_working_files_are_removed_when_the_backend_is_released_after_a_failure(tmp_path: Path) -> None:
    config = {"state.backend.rocksdb.localdir": str(tmp_path)}
    b = new_rocksdb_backend(config, "att-2", "op/with:odd name", MAX_PAR, range(MAX_PAR), True)
    b.get_state(ValueStateDescriptor("v"))
    b.set_current_key(("a",), 0)
    b.get_state(ValueStateDescriptor("v")).update([1])  # unflushed in the write-back cache
    b.snapshot()  # a snapshot taken but never written (the task failed)
    assert os.listdir(attempt_dir(config, "att-2"))
    release_attempt(config, "att-2")
    assert not os.path.exists(attempt_dir(config, "att-2"))
    with pytest.raises(StateRestoreError, match="closed"):
        b.snapshot()


def test_a_bad_backend_setting_is_a_clear_error(tmp_path: Path) -> None:
    op = KeyedProcessOperator(["k"], Count(), time_column="t")
    with pytest.raises(JobDefinitionError, match="state backend.*hashmap, rocksdb"):
        OperatorHarness(op, config={"state.backend.type": "leveldb"})


def test_shared_files_are_deleted_only_when_no_retained_checkpoint_references_them() -> None:
    reg = SharedStateRegistry()

    def files(*names: str) -> list[OperatorStateFile]:
        return [OperatorStateFile(0, SHARED_STATE_FILE, f"/s/{n}.sst", 1) for n in names] + [
            OperatorStateFile(0, "rocksdb", "/chk/op0-rocksdb.arrow", 1)]

    reg.register(1, files("a", "b"))
    reg.register(2, files("b", "c"))
    reg.register(2, files("b", "c"))  # a second registration (recovery) counts once
    assert reg.references("/s/b.sst") == 2
    assert reg.unregister(1) == ("/s/a.sst",)
    reg.register(3, files("c", "d"))
    assert reg.unregister(2) == ("/s/b.sst",)
    assert reg.unregister(9) == ()
    assert reg.unregister(3) == ("/s/c.sst", "/s/d.sst") and len(reg) == 0


def test_the_table_of_a_vectorised_sum_is_in_the_native_snapshot(tmp_path: Path) -> None:
    from yarnflow.worker.operators.keyed import KeyedAggregate

    config = {"state.backend.type": "rocksdb", "state.backend.rocksdb.localdir": str(tmp_path),
              "execution.checkpointing.incremental": "true"}
    op = KeyedAggregate(["k"], [("n", "sum")])
    h = OperatorHarness(op, config=config, attempt_id="sum-1")
    h.batch(pa.RecordBatch.from_pydict({"k": ["a", "b", "a"], "n": [1, 2, 3]}))
    snap = op.snapshot_state(1)
    assert isinstance(snap, NativeSnapshot)
    tables, _ = snap.write_native(str(tmp_path / "shared"), str(tmp_path / "chk-1"))
    snap.release()
    # the sum's table is a column family of the database, in the checkpoint: no Arrow table of its own
    assert set(tables) == {"rocksdb"}
    assert columnar_states(tables["rocksdb"].schema.metadata) == {"aggregates": "aggregate_table"}
    h.batch(pa.RecordBatch.from_pydict({"k": ["a"], "n": [100]}))  # after the snapshot: not in it
    again = KeyedAggregate(["k"], [("n", "sum")])
    h2 = OperatorHarness(again, config=config, attempt_id="sum-2", open=False)
    again.initialize_state(tables)
    again.open()
    h2.batch(pa.RecordBatch.from_pydict({"k": ["a", "b"], "n": [10, 10]}))
    assert sorted(map(tuple, (r.values() for r in h2.rows()))) == [("a", 14), ("b", 12)]
    release_attempt(config, "sum-1")
    release_attempt(config, "sum-2")


def test_a_savepoint_of_a_rocksdb_checkpoint_holds_the_canonical_tables_written_in_batches(tmp_path: Path) -> None:
    from yarnflow.am.checkpoint.savepoints import read_savepoint, write_savepoint
    from yarnflow.common.rocksdb_snapshot import canonical_batches, open_read_only

    b = rocks(tmp_path)
    drive(b, seed=9, keys=300, steps=3000)
    expected = canon(materialize(b.snapshot()))
    snap = b.snapshot()
    db = open_read_only(snap.folder)
    batches = list(canonical_batches(db, snap.metadata, range(MAX_PAR), batch_rows=50))
    db.close()
    assert len(batches) > 4 and max(batch.num_rows for _, batch in batches) == 50
    tables, shared = snap.write_native(str(tmp_path / "shared"), str(tmp_path / "chk-3" / "v-0-0"))
    snap.release()
    (tmp_path / "chk-3" / "v-0-0").mkdir(parents=True, exist_ok=True)
    files = []
    for name, table in tables.items():
        path = tmp_path / "chk-3" / "v-0-0" / f"op0-{name}.arrow"
        with pa.OSFile(str(path), "wb") as fh, pa.ipc.new_file(fh, table.schema) as writer:
            writer.write_table(table)
        files.append({"operator_index": 0, "name": name, "path": str(path), "size_bytes": path.stat().st_size})
    files += [{"operator_index": 0, "name": SHARED_STATE_FILE, "path": url, "size_bytes": size} for url, size in shared]
    metadata = {"checkpoint_id": 3, "subtasks": {"v#0": {"finished": False, "files": files}},
                "vertices": {"v": {"name": "count", "parallelism": 1, "max_parallelism": MAX_PAR,
                                   "operator_uids": ["count"]}}}
    folder = write_savepoint(str(tmp_path / "savepoints"), "job123456", metadata).removeprefix("file://")
    saved = read_savepoint(folder)["operators"]["count"]["subtasks"]["0"]["files"]
    assert sorted(f["name"] for f in saved) == ["keyed_state", "timers"]
    assert all(f["redistribute"] == "keyed" for f in saved)
    got = {f["name"]: pa.ipc.open_file(os.path.join(folder, f["path"])).read_all() for f in saved}
    assert canon(got) == expected
    assert "shared" not in Path(folder, "_metadata").read_text()
    b.close()
