"""File sinks commit exactly once: an attempt's files stay hidden until its subtask finishes,
a failed or killed attempt's files never become visible, a new attempt deletes what earlier
attempts of its subtask left, and ``pyarrow.dataset`` sees only committed files."""

from __future__ import annotations

from typing import Any

import os
import random

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as pads
import pytest

from tests.harness import OperatorHarness
from yarnflow.common.collect import list_collected, read_collected
from yarnflow.worker.operators.sinks import CollectSink, CsvSink, ParquetSink


def rows(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"i": list(range(start, start + n))})


def visible(folder) -> list[str]:
    return sorted(f for f in os.listdir(folder) if not f.startswith((".", "_")))


def dataset_rows(folder, fmt: str = "parquet") -> list[int]:
    table = pads.dataset(str(folder), format=fmt).to_table()
    return sorted(table["i"].to_pylist()) if table.num_rows else []


def sink(folder, subtask: int = 0, attempt: int = 0, roll: int | None = None, cls=ParquetSink):
    return OperatorHarness(cls(str(folder), roll_size_bytes=roll), subtask_index=subtask, parallelism=4,
                           attempt_number=attempt).op


def test_attempt_files_are_hidden_and_name_the_attempt(tmp_path):
    s = sink(tmp_path, subtask=2, attempt=3)
    s.process_batch(rows(0, 5))
    [staged] = os.listdir(tmp_path)
    assert staged.startswith(".part-00002-") and "attempt3" in staged
    assert visible(tmp_path) == []
    assert pads.dataset(str(tmp_path), format="parquet").to_table().num_rows == 0  # readers skip it
    s.finish()
    assert os.listdir(tmp_path) == ["part-00002.parquet"]


def test_a_failed_attempt_never_becomes_visible_and_its_retry_commits_once(tmp_path):
    first = sink(tmp_path, attempt=0, roll=1)
    for k in range(3):
        first.process_batch(rows(10 * k, 10))
    first.close()  # failed: never finished
    assert os.listdir(tmp_path) == []
    retry = sink(tmp_path, attempt=1, roll=1)
    for k in range(3):
        retry.process_batch(rows(10 * k, 10))
    retry.finish()
    retry.close()
    assert visible(tmp_path) == ["part-00000-0.parquet", "part-00000-1.parquet", "part-00000-2.parquet"]
    assert sorted(os.listdir(tmp_path)) == visible(tmp_path)
    assert dataset_rows(tmp_path) == list(range(30))


def test_a_killed_attempt_leftovers_are_deleted_by_the_next_attempt_of_its_subtask_only(tmp_path):
    killed = sink(tmp_path, subtask=1, attempt=0, roll=1)
    killed.process_batch(rows(0, 10))
    killed.process_batch(rows(10, 10))  # the process dies here: no close(), staged parts stay
    other = sink(tmp_path, subtask=0, attempt=0)
    other.process_batch(rows(100, 1))  # another subtask's attempt, still running
    assert len(os.listdir(tmp_path)) == 3 and visible(tmp_path) == []
    assert dataset_rows(tmp_path) == []

    retry = sink(tmp_path, subtask=1, attempt=1)  # open() cleans subtask 1's hidden files
    left = sorted(os.listdir(tmp_path))
    assert len(left) == 1 and left[0].startswith(".part-00000-")  # subtask 0's file is not touched
    retry.process_batch(rows(0, 20))
    retry.finish()
    other.finish()
    assert visible(tmp_path) == ["part-00000.parquet", "part-00001.parquet"]
    assert dataset_rows(tmp_path) == [*range(20), 100]


def test_a_subtask_committing_again_replaces_its_files_and_drops_parts_it_no_longer_has(tmp_path):
    first = sink(tmp_path, subtask=0, attempt=0, roll=1)
    for k in range(3):
        first.process_batch(rows(10 * k, 10))
    first.finish()
    neighbour = sink(tmp_path, subtask=1, attempt=0, roll=1)
    neighbour.process_batch(rows(500, 2))
    neighbour.finish()
    assert len(visible(tmp_path)) == 4
    # restarted after it had finished (e.g. full failover); this time its input comes in 2 parts
    again = sink(tmp_path, subtask=0, attempt=1, roll=1)
    again.process_batch(rows(0, 15))
    again.process_batch(rows(15, 15))
    again.finish()
    assert visible(tmp_path) == ["part-00000-0.parquet", "part-00000-1.parquet", "part-00001-0.parquet"]
    assert dataset_rows(tmp_path) == [*range(30), 500, 501]


def test_a_stale_attempt_cannot_commit_after_a_newer_one_cleaned_up(tmp_path):
    stale = sink(tmp_path, attempt=0)
    stale.process_batch(rows(0, 3))
    newer = sink(tmp_path, attempt=1)  # deletes the stale attempt's staged file
    newer.process_batch(rows(0, 4))
    newer.finish()
    with pytest.raises(FileNotFoundError):
        stale.finish()
    assert dataset_rows(tmp_path) == [0, 1, 2, 3]


def test_csv_sink_commits_the_same_way(tmp_path):
    s = sink(tmp_path, attempt=2, roll=1, cls=CsvSink)
    s.process_batch(rows(0, 3))
    s.process_batch(rows(3, 3))
    assert visible(tmp_path) == []
    s.finish()
    assert visible(tmp_path) == ["part-00000-0.csv", "part-00000-1.csv"]
    assert sorted(os.listdir(tmp_path)) == visible(tmp_path)
    assert pacsv.read_csv(tmp_path / "part-00000-1.csv")["i"].to_pylist() == [3, 4, 5]
    assert dataset_rows(tmp_path, "csv") == list(range(6))


def test_collect_protocol_lists_and_reads_only_committed_files(tmp_path):
    store = str(tmp_path / "job")
    done = OperatorHarness(CollectSink("c-1"), subtask_index=0, parallelism=2, job_storage_dir=store).op
    running = OperatorHarness(CollectSink("c-1"), subtask_index=1, parallelism=2, job_storage_dir=store).op
    done.process_batch(rows(0, 3))
    running.process_batch(rows(3, 3))
    done.finish()
    [files] = list_collected(store).values()
    assert [os.path.basename(f) for f in files] == ["part-00000.arrow"]
    assert read_collected(store, "c-1")["i"].to_pylist() == [0, 1, 2]
    assert list_collected(str(tmp_path / "nothing")) == {}
    assert read_collected(store, "missing") is None


# -- with checkpoints: two-phase commit ------------------------------------------------------------

def ckpt_sink(folder, attempt: int = 0, subtask: int = 0, roll: int | None = None, cls=ParquetSink,
              restore: dict[str, pa.Table] | None = None, **ctx):
    """A sink of a job with checkpoints; ``restore``: the state it restores (as the runtime
    does: after setup, before open)."""
    op = cls(str(folder), roll_size_bytes=roll) if cls is not CollectSink else cls("c-1")
    OperatorHarness(op, subtask_index=subtask, parallelism=4, attempt_number=attempt, checkpointing=True,
                    open=False, **ctx)
    if restore is not None:
        op.initialize_state(ipc_copy(restore))
    op.open()
    return op


def ipc_copy(state: dict[str, pa.Table]) -> dict[str, pa.Table]:
    out = {}
    for name, table in state.items():
        buf = pa.BufferOutputStream()
        with pa.ipc.new_file(buf, table.schema) as w:
            w.write_table(table)
        out[name] = pa.ipc.open_file(pa.BufferReader(buf.getvalue())).read_all()
    return out


def end(sink: Any, checkpoint_id: int) -> None:
    """End of input with checkpoints, as the task runs it: finish, then the final checkpoint
    (taken after the end of input) completes."""
    sink.finish()
    sink.snapshot_state(checkpoint_id)
    sink.notify_checkpoint_complete(checkpoint_id)


def test_parts_are_committed_only_when_their_checkpoint_completes(tmp_path):
    s = ckpt_sink(tmp_path)
    s.process_batch(rows(0, 5))
    state = s.snapshot_state(1)
    assert state["pending"].schema == pa.schema([("checkpoint_id", pa.int64()), ("part", pa.int64()),
                                                 ("staged", pa.string()), ("final", pa.string())])
    assert state["pending"].select(["checkpoint_id", "part", "final"]).to_pylist() == [
        {"checkpoint_id": 1, "part": 0, "final": "part-00000-0.parquet"}]
    # the folder: a restore into a sink that writes elsewhere commits the pending parts where they are
    assert state["counter"].to_pylist() == [{"next_part": 1, "folder": tmp_path.as_uri(), "subtask": 0}]
    s.process_batch(rows(5, 5))  # after the barrier: in the next part
    assert visible(tmp_path) == [] and dataset_rows(tmp_path) == []
    s.notify_checkpoint_complete(1)
    assert visible(tmp_path) == ["part-00000-0.parquet"]
    assert dataset_rows(tmp_path) == list(range(5))
    s.snapshot_state(2)
    s.process_batch(rows(10, 5))
    s.finish()  # end of input: nothing more is committed until the final checkpoint completes
    assert visible(tmp_path) == ["part-00000-0.parquet"]
    s.snapshot_state(3)
    s.notify_checkpoint_complete(3)  # the final checkpoint: also commits 2, never notified
    assert visible(tmp_path) == ["part-00000-0.parquet", "part-00000-1.parquet", "part-00000-2.parquet"]
    assert sorted(os.listdir(tmp_path)) == visible(tmp_path)
    assert dataset_rows(tmp_path) == list(range(15))


def test_a_subtask_that_ended_commits_nothing_a_restore_would_write_again(tmp_path):
    # FLIP-147: rows after the last checkpoint stay hidden at the end of input; a failure
    # elsewhere before the final checkpoint completes restores checkpoint 1 and replays them once
    first = ckpt_sink(tmp_path, attempt=0)
    first.process_batch(rows(0, 3))
    chk1 = ipc_copy(first.snapshot_state(1))
    first.notify_checkpoint_complete(1)
    first.process_batch(rows(3, 3))
    first.finish()
    assert first.needs_final_checkpoint
    assert dataset_rows(tmp_path) == [0, 1, 2]
    first.close()  # its task is cancelled by the failover, still waiting for the final checkpoint
    retry = ckpt_sink(tmp_path, attempt=1, restore=chk1)
    retry.process_batch(rows(3, 3))
    end(retry, 2)
    assert dataset_rows(tmp_path) == list(range(6))
    assert sorted(os.listdir(tmp_path)) == visible(tmp_path)


def test_an_attempt_of_a_deposed_leader_cannot_delete_the_files_of_the_next_leaders_attempt(tmp_path):
    # a new leader numbers attempts from 0 again; the old leader's attempt 0 of the same subtask
    # may still be closing (cancelled by its TaskExecutor) while the new attempt 0 writes
    old = ckpt_sink(tmp_path, attempt=0, attempt_id="aaaaaaaaaaaaaaaaaaaa")
    old.process_batch(rows(0, 3))
    chk1 = ipc_copy(old.snapshot_state(1))
    old.notify_checkpoint_complete(1)
    old.process_batch(rows(3, 3))  # after the checkpoint: never committed
    new = ckpt_sink(tmp_path, attempt=0, attempt_id="bbbbbbbbbbbbbbbbbbbb", restore=chk1)
    new.process_batch(rows(3, 3))
    new.snapshot_state(2)
    old.close()  # the zombie cleans up what it wrote after its checkpoint, and nothing else
    new.notify_checkpoint_complete(2)
    end(new, 3)
    assert dataset_rows(tmp_path) == list(range(6))
    assert sorted(os.listdir(tmp_path)) == visible(tmp_path)


def test_an_aborted_checkpoint_parts_are_committed_by_the_next_completed_one(tmp_path):
    s = ckpt_sink(tmp_path)
    s.process_batch(rows(0, 3))
    s.snapshot_state(1)
    s.notify_checkpoint_aborted(1)
    s.process_batch(rows(3, 3))
    s.snapshot_state(2)
    assert visible(tmp_path) == []
    s.notify_checkpoint_complete(2)
    assert visible(tmp_path) == ["part-00000-0.parquet", "part-00000-1.parquet"]
    assert dataset_rows(tmp_path) == list(range(6))


def test_a_failed_attempt_rows_after_its_checkpoint_are_never_visible_and_restore_commits_the_pending(tmp_path):
    first = ckpt_sink(tmp_path, attempt=0, roll=1)
    first.process_batch(rows(0, 4))
    first.process_batch(rows(4, 4))  # rolled: two parts before the barrier
    state = first.snapshot_state(1)  # checkpoint 1 completes, but the notification is lost
    first.process_batch(rows(8, 4))  # after the barrier: lost with the attempt
    first.close()  # failed
    assert visible(tmp_path) == [] and dataset_rows(tmp_path) == []
    assert len(os.listdir(tmp_path)) == 2  # the pending parts stay, hidden

    retry = ckpt_sink(tmp_path, attempt=1, roll=1, restore=state)
    assert visible(tmp_path) == ["part-00000-0.parquet", "part-00000-1.parquet"]
    retry.process_batch(rows(8, 4))  # the source replays from the checkpoint
    end(retry, 2)
    assert dataset_rows(tmp_path) == list(range(12))
    assert sorted(os.listdir(tmp_path)) == visible(tmp_path)


def test_restore_deletes_parts_committed_after_the_checkpoint_and_other_hidden_files(tmp_path):
    first = ckpt_sink(tmp_path, attempt=0)
    first.process_batch(rows(0, 3))
    chk1 = first.snapshot_state(1)
    first.notify_checkpoint_complete(1)
    first.process_batch(rows(3, 3))
    first.snapshot_state(2)
    first.notify_checkpoint_complete(2)
    first.process_batch(rows(6, 3))
    end(first, 3)  # finished; then a failure elsewhere restores checkpoint 1 (2's and 3's state unreadable)
    neighbour = ckpt_sink(tmp_path, subtask=1)
    neighbour.process_batch(rows(100, 2))
    neighbour.snapshot_state(1)  # pending, hidden: not this subtask's to delete
    killed = ckpt_sink(tmp_path, attempt=1, restore=chk1)
    killed.process_batch(rows(3, 1))  # killed: its in-progress part stays behind
    assert visible(tmp_path) == ["part-00000-0.parquet"]  # parts 1 and 2 came after checkpoint 1

    retry = ckpt_sink(tmp_path, attempt=2, restore=chk1)
    assert sorted(os.listdir(tmp_path))[0].startswith(".part-00001-")  # only the neighbour's is left
    assert len(os.listdir(tmp_path)) == 2
    retry.process_batch(rows(3, 6))
    end(retry, 4)
    assert dataset_rows(tmp_path) == list(range(9))


def test_a_new_attempt_without_state_deletes_its_subtask_parts(tmp_path):
    first = ckpt_sink(tmp_path, attempt=0)
    first.process_batch(rows(0, 3))
    end(first, 1)
    again = ckpt_sink(tmp_path, attempt=1)  # restarted from nothing: it writes everything again
    assert visible(tmp_path) == []
    again.process_batch(rows(0, 3))
    end(again, 2)
    assert dataset_rows(tmp_path) == [0, 1, 2]


def test_rows_held_for_their_types_at_a_barrier_are_in_the_state(tmp_path):
    s = ckpt_sink(tmp_path)
    s.process_batch(pa.record_batch({"i": [1, 2], "x": pa.nulls(2)}))  # type of x not known yet
    state = s.snapshot_state(1)
    assert state["held"].num_rows == 2 and state["pending"].num_rows == 0
    s.close()
    retry = ckpt_sink(tmp_path, attempt=1, restore=state)
    retry.process_batch(pa.record_batch({"i": [3], "x": ["a"]}))
    end(retry, 2)
    table = pads.dataset(str(tmp_path), format="parquet").to_table()
    assert sorted(table["i"].to_pylist()) == [1, 2, 3] and table.schema.field("x").type == pa.string()


def test_collect_sink_with_checkpoints_shows_only_committed_rows(tmp_path):
    store = str(tmp_path / "job")
    s = ckpt_sink(tmp_path, cls=CollectSink, job_storage_dir=store)
    s.process_batch(rows(0, 3))
    state = s.snapshot_state(1)
    s.process_batch(rows(3, 3))
    assert read_collected(store, "c-1") is None
    s.close()  # failed before the notification
    retry = ckpt_sink(tmp_path, cls=CollectSink, attempt=1, job_storage_dir=store, restore=state)
    assert read_collected(store, "c-1")["i"].to_pylist() == [0, 1, 2]
    for k in range(11):  # parts 1..11: read back in part order, not name order
        retry.process_batch(rows(3 + k, 1))
        retry.snapshot_state(2 + k)
    retry.notify_checkpoint_complete(12)
    end(retry, 13)
    assert read_collected(store, "c-1")["i"].to_pylist() == list(range(14))
    [files] = list_collected(store).values()
    assert [os.path.basename(f) for f in files][-3:] == ["part-00000-9.arrow", "part-00000-10.arrow",
                                                         "part-00000-11.arrow"]


@pytest.mark.parametrize("seed", range(8))
def test_random_failures_snapshots_and_notifications_give_every_row_exactly_once(seed, tmp_path):
    """A replayable input through the sink with random checkpoints (some aborted, some whose
    notification is lost) and failures that restore the latest completed checkpoint."""
    rng = random.Random(seed)
    n_batches = 40
    completed: dict[int, tuple[dict[str, pa.Table], int]] = {}  # id -> (sink state, input position)
    next_id, attempt = 1, 0
    s = ckpt_sink(tmp_path, roll=rng.choice([None, 64]))
    position = 0
    while position < n_batches:
        roll = rng.random()
        if roll < 0.6:
            s.process_batch(rows(position * 5, 5))
            position += 1
        elif roll < 0.85:
            state = ipc_copy(s.snapshot_state(next_id))
            fate = rng.random()
            if fate < 0.6:  # completed (the JobMaster restores it from now on) ...
                completed[next_id] = (state, position)
                if fate < 0.45:  # ... and the notification arrived
                    s.notify_checkpoint_complete(next_id)
            else:
                s.notify_checkpoint_aborted(next_id)
            next_id += 1
        else:  # the attempt fails (or is killed without close)
            if rng.random() < 0.5:
                s.close()
            attempt += 1
            if completed:
                latest = max(completed)
                state, position = completed[latest]
                s = ckpt_sink(tmp_path, attempt=attempt, roll=64, restore=state)
            else:
                position = 0
                s = ckpt_sink(tmp_path, attempt=attempt, roll=64)
            assert len(dataset_rows(tmp_path)) == len(set(dataset_rows(tmp_path)))
    end(s, next_id)
    assert dataset_rows(tmp_path) == list(range(n_batches * 5))
    assert sorted(os.listdir(tmp_path)) == visible(tmp_path)


def test_a_rescaled_restore_takes_over_other_subtasks_parts_exactly_once(tmp_path):
    """3 -> 1: the one new subtask restores the state of all three old ones (concatenated, as the
    runtime reads it): their pending parts are committed under their own names, their parts
    committed after the checkpoint are deleted, and writing on gives every row once."""
    def sink(subtask, parallelism, attempt=0):
        op = ParquetSink(str(tmp_path))
        OperatorHarness(op, subtask_index=subtask, parallelism=parallelism, attempt_number=attempt,
                        checkpointing=True, open=False)
        return op

    states = []
    for i in range(3):
        old = sink(i, 3)
        old.open()
        old.process_batch(rows(100 * i, 4))
        states.append(old.snapshot_state(1))  # the savepoint
        old.process_batch(rows(100 * i + 4, 4))
        old.snapshot_state(2)
        if i < 2:  # subtask 2 never heard checkpoint 1 complete: its part 0 is still pending
            old.notify_checkpoint_complete(2)  # commits parts 0 and 1 (1: written after the savepoint)
    assert visible(tmp_path) == ["part-00000-0.parquet", "part-00000-1.parquet",
                                 "part-00001-0.parquet", "part-00001-1.parquet"]
    merged = {name: pa.concat_tables([st[name] for st in states]) for name in states[0]}
    new = sink(0, 1, attempt=1)
    new.initialize_state(ipc_copy(merged))
    new.open()
    assert visible(tmp_path) == ["part-00000-0.parquet", "part-00001-0.parquet", "part-00002-0.parquet"]
    for i in range(3):
        new.process_batch(rows(100 * i + 4, 4))
    end(new, 3)
    assert dataset_rows(tmp_path) == sorted(100 * i + r for i in range(3) for r in range(8))
    assert "part-00000-1.parquet" in visible(tmp_path)  # its own counter went on from the savepoint
