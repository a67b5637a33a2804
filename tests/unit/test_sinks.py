"""File sinks commit exactly once: an attempt's files stay hidden until its subtask finishes,
a failed or killed attempt's files never become visible, a new attempt deletes what earlier
attempts of its subtask left, and ``pyarrow.dataset`` sees only committed files."""

from __future__ import annotations

import os

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
