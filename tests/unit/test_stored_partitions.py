"""BLOCKING_PERSISTENT result partitions: written to the job's storage dir a subpartition file
at a time (hidden until the subpartition ends), read back by any consumer from the storage dir,
kept when the producing TaskExecutor stops, deleted when released."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from yarnflow.common.ids import ResultPartitionID
from yarnflow.worker.elements import END_OF_PARTITION, EndOfPartition
from yarnflow.worker.network.partition import (
    PartitionReleasedError,
    ResultPartitionManager,
    read_stored,
    stored_partition_url,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def test_a_stored_partition_is_read_from_storage_and_outlives_its_taskexecutor(tmp_path) -> None:
    manager = ResultPartitionManager(str(tmp_path / "te"))
    pid = ResultPartitionID("job.attempt.0")
    url = stored_partition_url(f"file://{tmp_path}/storage", pid)
    partition = manager.create_stored(pid, 2, url)
    folder = tmp_path / "storage" / "partitions" / pid
    partition.subpartitions[0].add(pa.record_batch({"x": [1, 2]}))
    assert os.listdir(folder) == ["_0.arrow.tmp"]  # hidden until the subpartition ends
    partition.subpartitions[0].add(pa.record_batch({"x": [3]}))
    partition.subpartitions[0].add(END_OF_PARTITION)
    partition.subpartitions[1].add(END_OF_PARTITION)  # nothing for subpartition 1
    assert partition.finished.is_set() and sorted(os.listdir(folder)) == ["0.arrow"]
    elements = list(read_stored(url, 0))
    assert [r["x"] for b in elements[:-1] for r in b.to_pylist()] == [1, 2, 3]
    assert isinstance(elements[-1], EndOfPartition)
    assert len(list(read_stored(url, 1))) == 1  # just its end
    manager.close()  # the TaskExecutor stops: a consumer may still need the files
    assert sorted(os.listdir(folder)) == ["0.arrow"]
    other = ResultPartitionManager(str(tmp_path / "te2"))
    other.create_stored(pid, 2, url).release()  # released by the JobMaster (or a failed attempt)
    assert not folder.exists()
    with pytest.raises(PartitionReleasedError):
        list(read_stored(url, 0))
