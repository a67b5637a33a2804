"""The JobMaster's reference counts of the shared checkpoint folder (incremental checkpoints):
a shared file is deleted with the last retained checkpoint that references it, and the counts
are rebuilt from ``_metadata`` by a JobMaster that recovers the job."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_job_master_checkpoints import CkptDriver
from yarnflow.am.checkpoint.coordinator import StandaloneCheckpointIDCounter
from tests.unit.test_job_master_core import pipeline
from yarnflow.am.jobmaster.actions import DeployTask, DiscardCheckpointFiles, WriteCheckpointMetadata
from yarnflow.common.messages import SHARED_STATE_FILE, OperatorStateFile, TaskStateSnapshot

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

SHARED = "file:///tmp/ckpt/job/shared"


def checkpoint(d: CkptDriver, deploys: list[DeployTask], checkpoint_id: int, shared: list[str]) -> None:
    d.advance(1_000)
    for x in deploys:
        files = [OperatorStateFile(0, "rocksdb", f"file:///tmp/ckpt/job/chk-{checkpoint_id}/{x.attempt_id}", 10)]
        files += [OperatorStateFile(0, SHARED_STATE_FILE, f"{SHARED}/{name}.sst", 100) for name in shared]
        d.core.acknowledge_checkpoint(x.attempt_id, checkpoint_id, TaskStateSnapshot(files, 3))
        d.drain()
    d.core.checkpoint_metadata_written(checkpoint_id)
    d.drain()


def deleted(d: CkptDriver) -> dict[int, set[str]]:
    return {a.checkpoint_id: {p.rsplit("/", 1)[-1] for p in a.shared_files} for a in d.of(DiscardCheckpointFiles)}


def test_a_shared_file_goes_with_the_last_retained_checkpoint_that_references_it() -> None:
    d = CkptDriver(pipeline(1), **{"execution.checkpointing.num-retained": "2"})
    deploys = d.running()
    checkpoint(d, deploys, 1, ["a", "b"])
    checkpoint(d, deploys, 2, ["b", "c"])
    assert deleted(d) == {}
    checkpoint(d, deploys, 3, ["c", "d"])   # 1 is subsumed: "a" only it referenced
    assert deleted(d) == {1: {"a.sst"}}
    checkpoint(d, deploys, 4, ["c", "e"])   # 2 goes: "b" is no one's now, "c" is still 3's and 4's
    assert deleted(d) == {1: {"a.sst"}, 2: {"b.sst"}}
    assert d.core.checkpoints is not None and d.core.checkpoints.shared.references(f"{SHARED}/c.sst") == 2


def test_a_recovering_job_master_rebuilds_the_counts_from_the_metadata() -> None:
    old = CkptDriver(pipeline(1), **{"execution.checkpointing.num-retained": "2"})
    deploys = old.running()
    checkpoint(old, deploys, 1, ["a", "b"])
    checkpoint(old, deploys, 2, ["b", "c"])
    metadata: dict[int, Any] = {w.checkpoint_id: w.metadata for w in old.of(WriteCheckpointMetadata)}
    assert any(f["name"] == SHARED_STATE_FILE for st in metadata[2]["subtasks"].values() for f in st["files"])

    new = CkptDriver(pipeline(1), **{"execution.checkpointing.num-retained": "2"})
    assert new.core.checkpoints is not None
    for checkpoint_id in (1, 2):
        new.core.checkpoints.recover(checkpoint_id, metadata[checkpoint_id])
    new.core.checkpoints.coordinator._ids = StandaloneCheckpointIDCounter(3)  # ZooKeeper's, in HA
    assert new.core.checkpoints.shared.references(f"{SHARED}/b.sst") == 2
    deploys = new.running()
    checkpoint(new, deploys, 3, ["c"])
    assert deleted(new) == {1: {"a.sst"}}   # "b" is still checkpoint 2's
    checkpoint(new, deploys, 4, ["c"])
    assert deleted(new) == {1: {"a.sst"}, 2: {"b.sst"}}


def test_every_subtask_restores_every_subtasks_union_list_state() -> None:
    """Flink's union-list state: on a restore (here after a failure, at the same parallelism)
    each subtask gets every subtask's list; its other state stays its own."""
    from yarnflow.common.keygroups import SPLIT, UNION, operator_table

    d = CkptDriver(pipeline(2))
    deploys = d.running()
    d.advance(1_000)
    for x in deploys:
        files = [OperatorStateFile(0, name, f"file:///tmp/ckpt/job/chk-1/{x.attempt_id}-{name}", 10)
                 for name in (operator_table(UNION, "seen"), operator_table(SPLIT, "offsets"))]
        d.core.acknowledge_checkpoint(x.attempt_id, 1, TaskStateSnapshot(files, 3))
        d.drain()
    d.core.checkpoint_metadata_written(1)
    d.drain()
    assert d.core.checkpoints is not None
    subtasks = sorted(d.core.checkpoints._states[1])
    assert len(subtasks) == 4  # src and sink, 2 subtasks each
    for sid in subtasks:
        restore = d.core.checkpoints.restore_for(1, sid)
        names = sorted((f.name, f.path.rsplit("/", 1)[-1].split("-")[0]) for f in restore.files)
        unions = [n for n in names if n[0] == operator_table(UNION, "seen")]
        splits = [n for n in names if n[0] == operator_table(SPLIT, "offsets")]
        assert len(unions) == 2 and len(splits) == 1, names  # both subtasks of its vertex; its own split list
    assert operator_table(SPLIT, "a/b:c") == "operator.split.x" + b"a/b:c".hex()
    assert operator_table(SPLIT, "ok_name-1") == "operator.split.ok_name-1"
