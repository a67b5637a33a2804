"""Task-local recovery's store (worker/state/local_recovery.py, issue 51): the copies of a
subtask's snapshots on its TaskExecutor, kept for the checkpoints not yet superseded, verified
when a restore reads them, and the restore's reads counted by where they came from."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from yarnflow.common.messages import OperatorStateFile, TaskRestore
from yarnflow.worker.runtime.checkpoints import SnapshotWriter, read_task_state
from yarnflow.worker.state.local_recovery import ReadStats, TaskLocalState, local_copy, reading_from, release_job

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def _file(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_copies_are_kept_per_checkpoint_and_go_when_a_later_one_completes_or_theirs_is_aborted(tmp_path: Path):
    state = TaskLocalState.of(str(tmp_path), "job", "v", 0)
    state.keep(1, "file:///chk-1/a", _file(tmp_path / "a1", b"one"))
    state.keep(2, "file:///chk-2/a", _file(tmp_path / "a2", b"two"))
    state.keep(2, "file:///chk-2/b", _file(tmp_path / "b2", b"one"), link=True)  # same content: one copy
    state.keep(3, "file:///chk-3/a", _file(tmp_path / "a3", b"three"))
    assert state.checkpoints() == [1, 2, 3]
    assert Path(state.copy_of(2, "file:///chk-2/b") or "").read_bytes() == b"one"
    assert state.copy_of(2, "file:///chk-1/a") is None  # another checkpoint's file
    state.confirmed(2)
    assert state.checkpoints() == [2, 3] and state.copy_of(1, "file:///chk-1/a") is None
    assert Path(state.copy_of(2, "file:///chk-2/b") or "").read_bytes() == b"one"  # still wanted by 2
    state.aborted(3)
    assert state.checkpoints() == [2]
    assert len(os.listdir(Path(state.folder) / "files")) == 2  # "one" and "two": "three" went with 3
    again = TaskLocalState(state.folder)  # a new process finds the index
    assert again.checkpoints() == [2]
    release_job(str(tmp_path), "job")
    assert not (tmp_path / "yarnflow-local-state" / "job").exists()


def test_a_corrupt_or_missing_copy_is_not_used(tmp_path: Path):
    state = TaskLocalState.of(str(tmp_path), "job2", "v", 1)
    state.keep(5, "file:///chk-5/a", _file(tmp_path / "a", b"state"))
    copy = state.copy_of(5, "file:///chk-5/a")
    assert copy is not None
    Path(copy).write_bytes(b"STATE")  # same size, other content
    assert state.copy_of(5, "file:///chk-5/a") is None
    os.remove(copy)
    assert state.copy_of(5, "file:///chk-5/a") is None


class _Responder:
    def __init__(self) -> None:
        self.acks: dict[int, list[OperatorStateFile]] = {}

    def acknowledge(self, checkpoint_id: int, snapshot) -> None:  # type: ignore[no-untyped-def]
        self.acks[checkpoint_id] = snapshot.files

    def decline(self, checkpoint_id: int, reason: str) -> None:
        raise AssertionError(reason)


def test_a_restore_reads_the_copies_written_with_the_snapshot_and_the_storage_for_a_corrupt_one(tmp_path: Path):
    state = TaskLocalState.of(str(tmp_path / "te"), "job3", "v", 0)
    responder = _Responder()
    writer = SnapshotWriter((tmp_path / "chk").as_uri(), "v", 0, 0, responder, "task", state)
    table = pa.table({"key_group": [1, 2, 3], "v": [10, 20, 30]})
    writer.submit(4, [{"values": table}], 0, 0)
    writer.close(wait=True)
    files = responder.acks[4]
    restore = TaskRestore(4, files)
    stats = ReadStats()
    with reading_from(state, 4, stats):
        [tables] = read_task_state(restore, 1)
    assert tables["values"].equals(table)
    assert (stats.local_files, stats.remote_files) == (1, 0)
    # the copy is corrupt: read from the checkpoint storage instead, and counted so
    with reading_from(state, 4, stats):
        copy = local_copy(files[0].path)
    assert copy is not None
    with ipc.new_file(copy, table.schema) as w:
        w.write_table(pa.table({"key_group": [9, 9, 9], "v": [0, 0, 0]}))
    stats = ReadStats()
    with reading_from(state, 4, stats):
        [tables] = read_task_state(restore, 1)
    assert tables["values"].equals(table)
    assert (stats.local_files, stats.remote_files) == (0, 1)
    # without local recovery: every file from the storage
    stats = ReadStats()
    with reading_from(None, 4, stats):
        read_task_state(restore, 1)
    assert (stats.local_files, stats.remote_files) == (0, 1)
