"""The pure parts of Flink's REST shapes (issue 32): checkpoint entries of each kind, the
restore a job last made, state counts keyed as Flink keys them, secrets hidden in configuration
listings, Flink's metric names and its subtask ranges."""

from __future__ import annotations

import pytest

from yarnflow.am.rest import views
from yarnflow.am.rest.job_api import key_values
from yarnflow.am.rest.metrics_api import job_metrics, subtask_range, task_metrics
from yarnflow.am.rest.api_error import ApiError
from yarnflow.common.messages import (
    CheckpointCounts,
    CheckpointInfo,
    ErrorInfo,
    FailureEntry,
    JobStatusInfo,
    TaskMetrics,
)
from yarnflow.common.states import ExecutionState, JobStatus

pytestmark = pytest.mark.timeout(30)


def _info(checkpoints: list[CheckpointInfo], failures: tuple[FailureEntry, ...] = ()) -> JobStatusInfo:
    return JobStatusInfo("a" * 32, "job", JobStatus.RUNNING, 1000, checkpoints=checkpoints,
                         failure_history=list(failures), checkpoint_counts=CheckpointCounts(completed=2, failed=1))


def test_checkpoint_entries_carry_the_fields_of_their_kind() -> None:
    done = views.checkpoint_entry(CheckpointInfo(3, "COMPLETED", 5000, 40, 1024, num_subtasks=4, num_acknowledged=4,
                                                 external_path="file:///cp/chk-3", discarded=True))
    assert (done["status"], done["external_path"], done["discarded"]) == ("COMPLETED", "file:///cp/chk-3", True)
    assert done["num_subtasks"] == done["num_acknowledged_subtasks"] == 4 and done["latest_ack_timestamp"] == 5040
    failed = views.checkpoint_entry(CheckpointInfo(4, "ABORTED", 6000, 10, failure="expired"))
    assert failed["status"] == "FAILED" and failed["failure_message"] == "expired" and "external_path" not in failed
    pending = views.checkpoint_entry(CheckpointInfo(5, "PENDING", 7000, num_subtasks=4, num_acknowledged=1))
    assert pending["className"] == ".PendingCheckpointStatistics" and pending["num_acknowledged_subtasks"] == 1
    savepoint = views.checkpoint_entry(CheckpointInfo(6, "COMPLETED", 8000, 5, is_savepoint=True))
    assert savepoint["is_savepoint"] and savepoint["checkpoint_type"] == "SAVEPOINT"


def test_latest_savepoint_completed_and_restored_are_told_apart() -> None:
    cps = [CheckpointInfo(1, "COMPLETED", 1, 1, external_path="/c/chk-1"),
           CheckpointInfo(2, "COMPLETED", 2, 1, is_savepoint=True, external_path="/sp/savepoint-x"),
           CheckpointInfo(3, "ABORTED", 3, 1, failure="declined")]
    boom = ErrorInfo("RuntimeError", "boom")
    stats = views.checkpoints(_info(cps, (FailureEntry(10, "t", boom, 2, 0), FailureEntry(20, "t", boom, 2, 2))))
    latest = stats["latest"]
    assert latest["completed"]["id"] == 1 and latest["savepoint"]["id"] == 2 and latest["failed"]["id"] == 3
    assert latest["restored"] == {"id": 2, "restore_timestamp": 20, "is_savepoint": True,
                                  "external_path": "/sp/savepoint-x"}
    assert stats["counts"]["restored"] == 1  # the failure that restarted without a checkpoint is not one
    assert views.checkpoints(_info(cps))["latest"]["restored"] is None


def test_state_counts_are_keyed_as_flink_keys_them() -> None:
    states = [(ExecutionState.RUNNING, 2), (ExecutionState.FAILED, 1)]
    upper, lower = views.task_counts(states, upper=True), views.task_counts(states)
    assert upper["RUNNING"] == 2 and upper["FAILED"] == 1 and upper["RECONCILING"] == 0
    assert lower["running"] == 2 and "RUNNING" not in lower and lower["reconciling"] == 0


def test_configuration_listings_hide_secrets() -> None:
    listed = {e["key"]: e["value"] for e in key_values({"spark.ssl.keyPassword": "hunter2", "a.api-key": "k",
                                                        "x.secret.y": "s", "parallelism.default": "2"})}
    assert listed == {"spark.ssl.keyPassword": "******", "a.api-key": "******", "x.secret.y": "******",
                      "parallelism.default": "2"}


def test_metrics_under_flinks_names() -> None:
    metrics = TaskMetrics(records_in=5, records_out=7, backpressured_ms_per_second=700.0,
                          operator_paths=["", "vectorised"], operator_records_in=[5, 6], operator_records_out=[6, 7])
    m = task_metrics(metrics, operators=["parse", "map"])
    assert (m["numRecordsIn"], m["numRecordsOut"], m["isBackPressured"]) == (5.0, 7.0, 1.0)
    # per operator, by its name (not by how it ran: an empty path made ids like "0..numRecordsIn")
    assert (m["parse.numRecordsIn"], m["map.numRecordsIn"], m["map.numRecordsOut"]) == (5.0, 6.0, 7.0)
    unnamed = task_metrics(metrics)
    assert (unnamed["operator-0.numRecordsIn"], unnamed["operator-1.numRecordsOut"]) == (5.0, 7.0)
    assert not any(".." in k or k.startswith(".") for k in (*m, *unnamed))
    job = job_metrics(_info([CheckpointInfo(1, "COMPLETED", 1, 33, 2048)]))
    assert (job["lastCheckpointDuration"], job["lastCheckpointSize"], job["numberOfCompletedCheckpoints"]) == \
        (33.0, 2048.0, 2.0)
    assert job_metrics(_info([]))["lastCheckpointDuration"] == -1.0


@pytest.mark.parametrize("raw, expected", [("", None), ("1,3,5-7", {1, 3, 5, 6, 7}), ("4", {4}), ("5-3", set())])
def test_subtask_ranges(raw: str, expected: set[int] | None) -> None:
    assert subtask_range(raw) == expected


@pytest.mark.parametrize("raw", ["a", "1,,2", "1-", "-3", "1;2"])
def test_a_malformed_subtask_range_is_the_callers_error(raw: str) -> None:
    with pytest.raises(ApiError) as refused:
        subtask_range(raw)
    assert refused.value.status == 400
