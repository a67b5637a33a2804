"""Managed memory and spill files: a slot's budgets never hold more than the slot has, a task's
leftovers go back when it ends, spill files keep batches of changing schemas in order and are
removed with their task, and the spill folders of a dead TaskExecutor are removed by the next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pyarrow as pa
import pytest

from yarnflow.common.config import Configuration
from yarnflow.worker.memory.manager import MemoryBudget, MemoryManager, MemoryReservationError, managed_memory_bytes
from yarnflow.worker.memory.spill import SpillFiles, remove_orphan_spills, spill_roots

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def test_budgets_of_one_slot_share_its_bytes_and_a_task_gives_back_what_it_holds() -> None:
    manager = MemoryManager(total_bytes=4000, num_slots=2)  # 2000 a slot
    a = manager.budget(0, 0.75, "task-a")
    b = manager.budget(0, 0.75, "task-b")  # the fractions over-commit: the slot still caps
    other = manager.budget(1, 1.0, "task-c")
    assert (a.limit, b.limit, other.limit) == (1500, 1500, 2000)
    assert a.try_reserve(1500)
    assert not a.try_reserve(1)  # its own limit
    assert b.try_reserve(500)
    assert not b.try_reserve(1)  # the slot's: 2000 held
    assert b.available == 0
    assert other.try_reserve(2000)  # another slot is not touched
    assert manager.owner_usage("task-a") == (1500, 1500, 1500)
    assert manager.release_owner("task-a") == 1500  # the task ended holding it
    assert b.try_reserve(1000)
    a.release(10)  # a released budget cannot go below nothing
    assert manager.used_bytes == 1500 + 2000


def test_reserve_names_what_needed_the_memory() -> None:
    budget = MemoryBudget(1 << 20, name="join 'j'")
    with pytest.raises(MemoryReservationError, match=r"join 'j' needs 2.0 MB of managed memory for a block, but its "
                                                     r"budget has 1.0 MB of 1.0 MB left"):
        budget.reserve(2 << 20, "a block")


def test_reservations_from_many_threads_never_pass_the_slot() -> None:
    manager = MemoryManager(total_bytes=10_000, num_slots=1)
    budgets = [manager.budget(0, 1.0, f"t{i}") for i in range(4)]
    granted = []

    def grab(b: MemoryBudget) -> None:
        granted.append(sum(100 for _ in range(100) if b.try_reserve(100)))

    threads = [threading.Thread(target=grab, args=(b,)) for b in budgets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(granted) == 10_000 == manager.used_bytes


def test_managed_memory_is_the_size_or_a_fraction_of_the_process() -> None:
    assert managed_memory_bytes(Configuration.load({"taskmanager.memory.process.size": "1 gb"})) == 256 << 20
    assert managed_memory_bytes(Configuration.load({"taskmanager.memory.managed.size": "100 mb"})) == 100 << 20
    assert managed_memory_bytes(Configuration.load({"taskmanager.memory.managed.fraction": "0.5",
                                                    "taskmanager.memory.process.size": "2 gb"})) == 1 << 30


def test_a_spill_file_keeps_batches_of_changing_schemas_in_order(tmp_path) -> None:
    spill = SpillFiles(spill_roots(f"{tmp_path}/a, {tmp_path}/b", "unused"), "attempt-1")
    w = spill.writer("op-part")
    w.write(pa.record_batch({"x": pa.array([None, None], pa.null())}))
    w.write(pa.record_batch({"x": [1, 2]}))
    w.write(pa.record_batch({"x": [3]}))
    f = w.close()
    assert f.num_rows == 5 and len(f.paths) == 2  # a segment per schema
    assert [r["x"] for b in f.read() for r in b.to_pylist()] == [None, None, 1, 2, 3]
    assert f.read_all().column("x").to_pylist() == [None, None, 1, 2, 3]
    second = spill.write("other", [pa.record_batch({"y": [1]})])
    # files go to each tmp dir in turn, each in a folder of the attempt's
    assert {os.path.dirname(p) for p in f.paths + second.paths} == {
        f"{tmp_path}/a/yarnflow-spill/attempt-1", f"{tmp_path}/b/yarnflow-spill/attempt-1"}
    assert spill.spilled_bytes > 0
    f.delete()
    assert all(not os.path.exists(p) for p in f.paths)
    spill.remove()
    assert os.listdir(f"{tmp_path}/a/yarnflow-spill") == [] and os.listdir(f"{tmp_path}/b/yarnflow-spill") == []


def test_a_large_write_is_stored_in_pieces_read_back_one_at_a_time() -> None:
    import numpy as np

    from yarnflow.worker.memory.spill import SEGMENT_BYTES

    table = pa.table({"x": pa.array(np.arange(1_000_000)), "y": pa.array(np.arange(1_000_000) * 2.0)})  # 16 MB
    f = SpillFiles().write("big", table)
    pieces = list(f.read())
    assert len(pieces) >= 16 and max(b.nbytes for b in pieces) <= SEGMENT_BYTES
    assert pa.Table.from_batches(pieces).equals(table)


def test_spill_folders_of_a_dead_taskexecutor_are_removed(tmp_path) -> None:
    root = tmp_path / "yarnflow-spill"
    alive = SpillFiles([str(root)], "alive-attempt")
    alive.write("x", [pa.record_batch({"x": [1]})])
    dead = root / "dead-attempt"
    dead.mkdir()
    (dead / "op-0.arrow").write_bytes(b"spilled")
    proc = subprocess.run([sys.executable, "-c", "import os, psutil; print(os.getpid(), psutil.Process().create_time())"],
                          capture_output=True, text=True, check=True)
    pid, started = proc.stdout.split()
    (dead / "owner.json").write_text(json.dumps({"pid": int(pid), "started": float(started)}))
    (root / "not-ours").mkdir()  # no owner file: left alone
    assert remove_orphan_spills([str(root)]) == [str(dead)]
    assert sorted(os.listdir(root)) == ["alive-attempt", "not-ours"]
    alive.remove()
