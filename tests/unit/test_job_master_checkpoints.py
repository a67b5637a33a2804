"""Checkpoints in the JobMaster core: triggers at the right tasks, metadata after every
acknowledgement, notifications, restore of restarted subtasks from the latest readable
checkpoint (falling back when one cannot be read), finished tasks left out (FLIP-147)."""

from __future__ import annotations

import pytest

from tests.unit.test_job_master_core import JOB, Driver, pipeline, vertex
from yarnflow.am.jobmaster.actions import (
    CancelTask,
    DeployTask,
    DiscardCheckpointFiles,
    NotifyTaskCheckpoint,
    TriggerTaskCheckpoint,
    WriteCheckpointMetadata,
)
from yarnflow.common.ids import JobVertexID
from yarnflow.common.messages import (
    ErrorInfo,
    JobEdge,
    JobGraph,
    JobVertex,
    OperatorStateFile,
    TaskExecutionStateUpdate,
    TaskStateSnapshot,
)
from yarnflow.common.states import ExchangeMode, ExecutionState, JobStatus, Partitioner

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

S = ExecutionState
CKPT = {"execution.checkpointing.interval": "1 s", "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": "5", "restart-strategy.fixed-delay.delay": "0 ms"}


class CkptDriver(Driver):
    def __init__(self, job_graph: JobGraph, **extra: str) -> None:
        super().__init__(job_graph)
        from yarnflow.am.jobmaster.job_master_core import JobMasterCore
        from yarnflow.common.config import Configuration
        self.config = Configuration.load({"slot.request.timeout": "10 s", "heartbeat.timeout": "10 min",
                                          **CKPT, **extra})
        self.core = JobMasterCore(job_graph, self.config, "127.0.0.1:1", "jm-token", "file:///tmp/job",
                                  self.clock, self.timers, checkpoint_dir="file:///tmp/ckpt/job")

    def running(self) -> list[DeployTask]:
        self.start()
        deploys = self.of(DeployTask, self.offer_all())
        self.run_all(deploys)
        return deploys

    def ack(self, deploy: DeployTask, checkpoint_id: int) -> bool:
        files = [OperatorStateFile(0, "state", f"file:///tmp/ckpt/job/chk-{checkpoint_id}/{deploy.attempt_id}", 10)]
        ok = self.core.acknowledge_checkpoint(deploy.attempt_id, checkpoint_id, TaskStateSnapshot(files, 3))
        self.drain()
        return ok

    def complete(self, checkpoint_id: int, deploys: list[DeployTask]) -> None:
        for d in deploys:
            self.ack(d, checkpoint_id)
        self.core.checkpoint_metadata_written(checkpoint_id)
        self.drain()


def test_checkpoint_triggers_at_sources_then_writes_metadata_then_notifies_every_task() -> None:
    d = CkptDriver(pipeline(2))
    deploys = d.running()
    triggers = d.of(TriggerTaskCheckpoint, d.advance(1_000))
    sources = {x.attempt_id for x in deploys if x.tdd.task_name == "src"}
    assert {t.attempt_id for t in triggers} == sources and all(t.checkpoint_id == 1 for t in triggers)
    assert all(x.tdd.checkpoint_dir == "file:///tmp/ckpt/job" for x in deploys)
    for x in deploys[:-1]:
        d.ack(x, 1)
    assert not d.of(WriteCheckpointMetadata)                       # not before the last acknowledgement
    d.ack(deploys[-1], 1)
    (write,) = d.of(WriteCheckpointMetadata)
    assert write.checkpoint_id == 1 and len(write.metadata["subtasks"]) == 4  # type: ignore[arg-type]
    # each vertex's operator uids and parallelism: what a restore into another JobGraph maps by
    assert write.metadata["vertices"] == {  # type: ignore[comparison-overlap]
        str(v.vertex_id): {"name": v.name, "parallelism": v.parallelism, "max_parallelism": v.max_parallelism,
                           "operator_uids": list(v.operator_uids)} for v in d.core.job_graph.vertices}
    assert not d.of(NotifyTaskCheckpoint)                           # not before _metadata exists
    d.core.checkpoint_metadata_written(1)
    notified = d.of(NotifyTaskCheckpoint, d.drain())
    assert {n.attempt_id for n in notified} == {x.attempt_id for x in deploys} and all(n.completed for n in notified)
    info = d.core.status_info()
    assert info.latest_completed_checkpoint_id == 1
    assert info.checkpoints[0].status == "COMPLETED" and info.checkpoints[0].size_bytes == 40


def test_no_checkpoint_while_a_task_is_not_running_yet() -> None:
    d = CkptDriver(pipeline(2))
    d.start()
    assert not d.of(TriggerTaskCheckpoint, d.advance(3_000))       # slots never came


def test_restarted_subtasks_restore_the_latest_completed_checkpoint() -> None:
    d = CkptDriver(pipeline(1))
    deploys = d.running()
    d.advance(1_000)
    d.complete(1, deploys)
    d.advance(1_000)
    d.complete(2, deploys)
    d.report(deploys[0], S.FAILED, ErrorInfo("ValueError", "boom"))
    d.report(deploys[1], S.CANCELED)
    d.advance(0)
    redeployed = [x for x in d.of(DeployTask) if x.attempt_id not in {y.attempt_id for y in deploys}]
    assert len(redeployed) == 2
    for x in redeployed:
        assert x.tdd.restore is not None and x.tdd.restore.checkpoint_id == 2
        assert [f.path.rsplit("/", 2)[-2] for f in x.tdd.restore.files] == ["chk-2"]
    assert d.core.status_info().failure_history[-1].restored_checkpoint_id == 2
    assert {a.checkpoint_id for a in d.of(DiscardCheckpointFiles)} == {1}  # one retained


def test_an_unreadable_latest_checkpoint_falls_back_to_the_previous_one() -> None:
    d = CkptDriver(pipeline(1), **{"execution.checkpointing.num-retained": "2"})
    deploys = d.running()
    d.advance(1_000)
    d.complete(1, deploys)
    d.advance(1_000)
    d.complete(2, deploys)
    d.report(deploys[0], S.FAILED, ErrorInfo("ValueError", "boom"))
    d.report(deploys[1], S.CANCELED)
    d.advance(0)
    first_try = [x for x in d.of(DeployTask) if x.tdd.restore is not None]
    assert {x.tdd.restore.checkpoint_id for x in first_try} == {2}  # type: ignore[union-attr]
    d.core.deploy_failed(first_try[0].attempt_id, ErrorInfo("CheckpointNotReadableError", "chk-2 file corrupt"))
    d.drain()
    for x in first_try[1:]:
        if d.execution(x).state == S.CANCELING:
            d.report(x, S.CANCELED)
    d.advance(0)
    second_try = [x for x in d.of(DeployTask) if x.tdd.restore is not None and x not in first_try]
    assert second_try and {x.tdd.restore.checkpoint_id for x in second_try} == {1}  # type: ignore[union-attr]
    infos = {c.checkpoint_id: c for c in d.core.status_info().checkpoints}
    assert infos[2].failure == "unreadable at restore"
    assert any(e.error.error_class == "CheckpointNotReadableError" for e in d.core.status_info().failure_history)


def test_the_job_fails_when_no_retained_checkpoint_can_be_read() -> None:
    d = CkptDriver(pipeline(1))
    deploys = d.running()
    d.advance(1_000)
    d.complete(1, deploys)
    d.report(deploys[0], S.FAILED, ErrorInfo("ValueError", "boom"))
    d.report(deploys[1], S.CANCELED)
    d.advance(0)
    restored = [x for x in d.of(DeployTask) if x.tdd.restore is not None]
    d.core.deploy_failed(restored[0].attempt_id, ErrorInfo("CheckpointNotReadableError", "gone"))
    d.drain()
    for x in restored[1:]:
        if d.execution(x).state == S.CANCELING:
            d.report(x, S.CANCELED)
    d.advance(0)
    assert d.core.status == JobStatus.FAILED
    assert d.core.failure_cause is not None and d.core.failure_cause.error_class == "CheckpointRestoreError"


@pytest.mark.parametrize("restarts", ["none", "fixed-delay"])
def test_a_decline_aborts_and_too_many_failed_checkpoints_fail_the_declining_task_over(restarts: str) -> None:
    """As Flink's CheckpointFailureManager: past the tolerable failed checkpoints the task that
    declined fails, and its region restarts as the restart strategy allows (none: the job fails)."""
    d = CkptDriver(pipeline(1), **{"execution.checkpointing.tolerable-failed-checkpoints": "1",
                                   "restart-strategy.type": restarts, "restart-strategy.fixed-delay.delay": "0 ms"})
    deploys = d.running()
    d.advance(1_000)
    d.core.decline_checkpoint(deploys[0].attempt_id, 1, "disk full")
    aborted = d.of(NotifyTaskCheckpoint, d.drain())
    assert aborted and not any(n.completed for n in aborted)
    assert d.core.status == JobStatus.RUNNING
    d.advance(1_000)
    d.core.decline_checkpoint(deploys[0].attempt_id, 2, "disk full")
    out = d.drain()
    assert deploys[0].attempt_id in {c.attempt_id for c in d.of(CancelTask, out)}  # (it runs on: stopped)
    [failure] = d.core.failures.history()
    assert failure.error.error_class == "CheckpointFailureError" and "2 checkpoints failed in a row" in \
        failure.error.message
    if restarts == "none":
        assert d.core.status in (JobStatus.FAILING, JobStatus.FAILED)
        assert d.core.failure_cause is not None and d.core.failure_cause.error_class == "CheckpointFailureError"
    else:
        assert d.core.status in (JobStatus.RUNNING, JobStatus.RESTARTING)
        assert d.core.failure_cause is None


def _src_to_sink(name: str) -> tuple[CkptDriver, JobVertex, DeployTask, DeployTask]:
    """A running src (1) --hash--> sink (1) STREAMING job: its driver, the source vertex and the
    two deployments."""
    src, sink = vertex("src", 1, source=True), vertex("sink", 1)
    jg = JobGraph(JOB, name, [src, sink], [JobEdge(src.vertex_id, sink.vertex_id, Partitioner.HASH,
                                                   ExchangeMode.PIPELINED, ["k"])],
                  artifact_uri="file:///job.zip", runtime_mode="STREAMING")
    d = CkptDriver(jg)
    deploys = d.running()
    source = next(x for x in deploys if x.tdd.task_name == "src")
    consumer = next(x for x in deploys if x.tdd.task_name == "sink")
    return d, src, source, consumer


def test_finished_sources_are_left_out_and_their_consumers_are_triggered_directly() -> None:
    d, src, source, consumer = _src_to_sink("f147")
    d.actions.clear()
    d.report(source, S.FINISHED)
    (trigger,) = d.of(TriggerTaskCheckpoint)  # at once: its input ends, no need to wait for the interval
    assert trigger.attempt_id == consumer.attempt_id                 # its upstream has finished
    d.ack(consumer, 1)
    (write,) = d.of(WriteCheckpointMetadata)
    subtasks = write.metadata["subtasks"]
    assert subtasks[f"{src.vertex_id}#0"]["finished"] is True  # type: ignore[index]
    d.core.checkpoint_metadata_written(1)
    d.drain()
    d.report(consumer, S.FAILED, ErrorInfo("ValueError", "boom"))
    d.advance(0)
    restored = {x.tdd.task_name: x.tdd.restore for x in d.of(DeployTask) if x.tdd.restore is not None}
    assert restored["src"] is not None and restored["src"].finished
    assert restored["sink"] is not None and not restored["sink"].finished


def test_acknowledgements_of_old_attempts_do_not_count() -> None:
    d = CkptDriver(pipeline(1))
    deploys = d.running()
    d.advance(1_000)
    d.report(deploys[0], S.FAILED, ErrorInfo("ValueError", "boom"))
    d.report(deploys[1], S.CANCELED)
    d.advance(0)
    assert not d.ack(deploys[0], 1)
    assert d.core.task_state_changed(TaskExecutionStateUpdate(JOB, deploys[0].attempt_id, S.RUNNING)) is False
    assert JobVertexID("v-src") in d.core.graph.vertices


def test_a_task_finishing_during_a_checkpoint_counts_as_finished_in_it() -> None:
    d, src, source, consumer = _src_to_sink("finishing")
    d.advance(1_000)                      # checkpoint 1 triggered at the source ...
    d.actions.clear()
    d.report(source, S.FINISHED)          # ... which ends before taking its snapshot
    # no barrier of 1 will come from the source: the consumer, whose inputs all ended, is
    # triggered directly (it takes the snapshot once it has drained its input)
    assert [(t.attempt_id, t.checkpoint_id) for t in d.of(TriggerTaskCheckpoint)] == [(consumer.attempt_id, 1)]
    d.ack(consumer, 1)
    (write,) = d.of(WriteCheckpointMetadata)
    assert write.metadata["subtasks"][f"{src.vertex_id}#0"] == {"finished": True, "files": []}  # type: ignore[index]


def test_a_final_checkpoint_wanted_while_another_is_pending_starts_when_that_one_ends() -> None:
    """The source takes checkpoint 1's barrier, then its input ends; its consumer may take that
    barrier before its own input ends, so checkpoint 1 need not be the final checkpoint its
    two-phase sink waits for. As soon as 1 completes a new one starts, instead of the bounded
    job waiting up to an interval (1 s here) to end."""
    d, src, source, consumer = _src_to_sink("final")
    d.advance(1_000)                      # checkpoint 1 at the source
    d.ack(source, 1)
    d.report(source, S.FINISHED)          # its input ends while 1 is pending: no second one yet
    d.ack(consumer, 1)
    d.actions.clear()
    d.core.checkpoint_metadata_written(1)
    d.drain()
    triggers = d.of(TriggerTaskCheckpoint)  # at once, the clock has not moved
    assert [(t.attempt_id, t.checkpoint_id) for t in triggers] == [(consumer.attempt_id, 2)]
    d.ack(consumer, 2)
    d.actions.clear()
    d.core.checkpoint_metadata_written(2)
    d.drain()
    assert not d.of(TriggerTaskCheckpoint)  # once: the next comes at the interval, as usual


def test_a_subtask_restored_as_finished_is_not_asked_for_snapshots() -> None:
    d, src, source, consumer = _src_to_sink("drained")
    d.report(source, S.FINISHED)
    d.advance(1_000)
    d.ack(consumer, 1)
    d.core.checkpoint_metadata_written(1)
    d.drain()
    d.report(consumer, S.FAILED, ErrorInfo("ValueError", "boom"))
    d.advance(0)
    redeployed = [x for x in d.of(DeployTask) if x.tdd.restore is not None]
    d.run_all(redeployed)                 # the restored source runs only to drain
    triggers = d.of(TriggerTaskCheckpoint, d.advance(1_000))
    assert [t.attempt_id for t in triggers] == [x.attempt_id for x in redeployed if x.tdd.task_name == "sink"]


def test_a_task_that_cannot_read_its_state_makes_the_next_restart_use_an_older_checkpoint() -> None:
    d = CkptDriver(pipeline(1), **{"execution.checkpointing.num-retained": "2"})
    deploys = d.running()
    for n in (1, 2):
        d.advance(1_000)
        d.complete(n, deploys)
    d.report(deploys[0], S.FAILED, ErrorInfo("ValueError", "boom"))
    d.report(deploys[1], S.CANCELED)
    d.advance(0)
    restored = [x for x in d.of(DeployTask) if x.tdd.restore is not None]
    d.run_all(restored)
    d.report(restored[0], S.FAILED, ErrorInfo("StateRestoreError", "cannot read op0-state.arrow"))
    for x in restored[1:]:
        d.report(x, S.CANCELED)
    d.advance(0)
    latest = [x for x in d.of(DeployTask) if x.tdd.restore is not None and x not in restored]
    assert latest and {x.tdd.restore.checkpoint_id for x in latest} == {1}  # type: ignore[union-attr]


@pytest.mark.parametrize("update_first", [False, True])
def test_a_trigger_that_finds_its_task_finished_is_no_failure(update_first: bool) -> None:
    """A bounded job's clean finish showed a failed checkpoint (issue 55): the trigger reached a
    source's TaskExecutor just after the source finished ("not running here"). Whether the task's
    FINISHED update comes before or after the failed call, the checkpoint goes on with the
    source counted as finished in it."""
    d, src, source, consumer = _src_to_sink("finishing-race")
    d.advance(1_000)  # checkpoint 1 triggered at the source
    gone = ErrorInfo("NotFoundError", f"triggerCheckpoint 1: task {source.attempt_id} is not running on TaskExecutor te")
    if update_first:
        d.report(source, S.FINISHED)
    d.core.checkpoint_trigger_failed(source.attempt_id, 1, gone)
    d.drain()
    if not update_first:
        d.report(source, S.FINISHED)
    assert d.core.checkpoints is not None and 1 in d.core.checkpoints.coordinator.pending
    d.ack(consumer, 1)
    d.core.checkpoint_metadata_written(1)
    d.drain()
    completed, failed, _ = d.core.checkpoints.coordinator.counts()
    assert (completed, failed) == (1, 0)
    assert d.core.checkpoints.coordinator.latest_completed.checkpoint_id == 1


def test_a_trigger_that_cannot_reach_its_task_still_aborts_the_checkpoint() -> None:
    d, src, source, consumer = _src_to_sink("unreachable")
    d.advance(1_000)
    d.core.checkpoint_trigger_failed(source.attempt_id, 1, ErrorInfo("RpcTimeoutError", "no answer in 10 s"))
    d.drain()
    assert d.core.checkpoints is not None and 1 not in d.core.checkpoints.coordinator.pending
