"""The JobMaster shell in process (its main thread, timers, I/O pool) with testing gateways
for the ResourceManager and the TaskExecutors: a whole job runs without any process or
socket, so the shell's own duties are checked: fencing, carrying out the core's actions, and
turning an error inside the core into a visible job failure."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tests.doubles import TestingResourceManagerGateway, TestingTaskExecutorGateway, call
from tests.harness import wait_until
from yarnflow.am.jobmaster.job_master import JobMaster
from yarnflow.common.config import Configuration
from yarnflow.common.errors import FencingTokenError, IllegalStateTransition, RpcTimeoutError
from yarnflow.common.ids import JobID, JobVertexID, ResourceID
from yarnflow.common.messages import (
    JobEdge,
    TaskStateSnapshot,
    JobGraph,
    JobVertex,
    SlotOffer,
    TaskExecutionStateUpdate,
    TaskExecutorHeartbeatPayload,
)
from yarnflow.common.states import ExchangeMode, ExecutionState, JobStatus, Partitioner

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def job(mode: str = "BATCH") -> JobGraph:
    src = JobVertex(JobVertexID("v-src"), "src", 2, 128, ["src"], is_source=True)
    sink = JobVertex(JobVertexID("v-sink"), "sink", 2, 128, ["sink"])
    exchange = ExchangeMode.BLOCKING if mode == "BATCH" else ExchangeMode.PIPELINED
    return JobGraph(JobID.generate(), "shell", [src, sink],
                    [JobEdge(src.vertex_id, sink.vertex_id, Partitioner.HASH, exchange, ["k"])],
                    artifact_uri="file:///none", runtime_mode=mode)


class Cluster:
    """A JobMaster whose TaskExecutors finish every task they get (unless told otherwise)."""

    def __init__(self, job_graph: JobGraph, finish: bool = True, ha: Any = None, recover: bool = False,
                 is_leader: Any = None, checkpoints_dir: str = "", **conf: str) -> None:
        self.rm = TestingResourceManagerGateway()
        self.te = TestingTaskExecutorGateway(on_submit=self._run if finish else None)
        self.ended = threading.Event()
        self.errors: list[Exception] = []
        config = Configuration.load({"restart-strategy.type": "none", **conf})
        self.jm = JobMaster(job_graph, config, self.rm, "127.0.0.1:1", "file:///tmp/none",
                            lambda _jm: self.ended.set(), task_executor_gateways=lambda address: self.te,
                            collect_results=dict, ha=ha, recover=recover, is_leader=is_leader,
                            checkpoints_dir=checkpoints_dir)

    def _run(self, tdd: Any) -> None:
        def report() -> None:
            try:
                for state in (ExecutionState.RUNNING, ExecutionState.FINISHED):
                    call(self.jm, "update_task_execution_state", self.jm.fencing_token, TaskExecutionStateUpdate(
                        tdd.job_id, tdd.execution_attempt_id, state))
            except Exception as exc:  # noqa: BLE001 - as a TaskExecutor would: the JobMaster answered with an error
                self.errors.append(exc)
        threading.Thread(target=report, daemon=True).start()

    def __enter__(self) -> Cluster:
        self.jm.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.jm.stop()
        self.rm.stop()


def test_a_batch_job_runs_to_finished_through_the_shell() -> None:
    with Cluster(job()) as c:
        assert c.ended.wait(20)
        assert c.jm.status == JobStatus.FINISHED and c.jm.result is not None
        assert c.jm.result.status == JobStatus.FINISHED
        assert len(c.te.submitted) == 4
        wait_until(lambda: len(c.rm.freed) >= 2, 5, "the job's slots were not given back")


def test_an_error_inside_the_core_fails_the_job_visibly() -> None:
    with Cluster(job()) as c:
        def broken(*_: Any) -> None:
            raise IllegalStateTransition("src (1/2) attempt 0: illegal transition FINISHED -> RUNNING")

        c.jm.core._on_finished = broken  # type: ignore[method-assign]  # a bug in the core
        assert c.ended.wait(20), "the job must end, not hang with the event lost"
        assert c.jm.status == JobStatus.FAILED
        cause = c.jm.result.failure_cause if c.jm.result else None
        assert cause is not None and cause.error_class == "IllegalStateTransition"
        assert "FINISHED -> RUNNING" in cause.message
        assert c.jm.status_info().failure_history[-1].error.error_class == "IllegalStateTransition"


def test_a_deploy_call_that_times_out_is_cancelled_on_the_task_executor() -> None:
    with Cluster(job("STREAMING"), finish=False) as c:
        def time_out(tdd: Any) -> None:
            if tdd.subtask_index == 0 and tdd.task_name == "src":
                raise RpcTimeoutError("submitTask timed out")
        c.te.on_submit = time_out
        wait_until(lambda: c.jm.status in (JobStatus.FAILING, JobStatus.FAILED), 10, "the job did not fail")
        timed_out = next(t for t in c.te.submitted if t.subtask_index == 0 and t.task_name == "src")
        wait_until(lambda: str(timed_out.execution_attempt_id) in c.te.cancelled, 10,
                   "the attempt whose deployment timed out was not cancelled")


def test_calls_with_a_stale_jobmaster_token_are_refused() -> None:
    with Cluster(job("STREAMING"), finish=False) as c:
        wait_until(lambda: len(c.te.submitted) == 4, 10, "tasks not deployed")
        tdd = c.te.submitted[0]
        with pytest.raises(FencingTokenError):
            call(c.jm, "update_task_execution_state", "stale", TaskExecutionStateUpdate(
                tdd.job_id, tdd.execution_attempt_id, ExecutionState.FAILED))
        with pytest.raises(FencingTokenError):
            call(c.jm, "offer_slots", "stale", c.jm.job_id, ResourceID("te-x"), [SlotOffer(tdd.allocation_id, 0)])
        with pytest.raises(FencingTokenError):
            call(c.jm, "heartbeat_from_task_executor", "stale", c.jm.job_id, TaskExecutorHeartbeatPayload(ResourceID("te-sim-0"), [], []))
        with pytest.raises(FencingTokenError):
            call(c.jm, "request_split", "stale", c.jm.job_id, str(tdd.vertex_id), 0, str(tdd.execution_attempt_id))
        assert c.jm.status == JobStatus.RUNNING


def test_a_heartbeat_delivers_a_lost_finished_update() -> None:
    with Cluster(job("STREAMING"), finish=False) as c:
        wait_until(lambda: len(c.te.submitted) == 4, 10, "tasks not deployed")
        by_te: dict[str, list[Any]] = {}
        for tdd in c.te.submitted:
            call(c.jm, "update_task_execution_state", c.jm.fencing_token, TaskExecutionStateUpdate(
                tdd.job_id, tdd.execution_attempt_id, ExecutionState.RUNNING))
            by_te.setdefault(str(c.jm.core.slot_of(str(tdd.execution_attempt_id)).resource_id), []).append(tdd)
        for rid, tdds in by_te.items():  # the FINISHED updates were lost; heartbeats carry them
            report = call(c.jm, "heartbeat_from_task_executor", c.jm.fencing_token, c.jm.job_id, TaskExecutorHeartbeatPayload(
                ResourceID(rid), [TaskExecutionStateUpdate(t.job_id, t.execution_attempt_id, ExecutionState.FINISHED)
                                  for t in tdds], [t.allocation_id for t in tdds]))
            assert set(report.allocation_ids) <= {t.allocation_id for t in tdds}
        assert c.ended.wait(10)
        assert c.jm.status == JobStatus.FINISHED


# -- high availability: recovery by a new leader, suspension of a deposed one ----------------------

def _checkpoint(storage: Any, job_graph: JobGraph, checkpoint_id: int, folder: Any) -> str:
    """A completed checkpoint of every subtask (one readable state file each); its metadata URL."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    subtasks = {}
    for v in job_graph.vertices:
        for i in range(v.parallelism):
            path = folder / f"chk-{checkpoint_id}-{v.vertex_id}-{i}.arrow"
            table = pa.table({"x": [checkpoint_id]})
            with ipc.new_file(str(path), table.schema) as w:
                w.write_table(table)
            subtasks[f"{v.vertex_id}#{i}"] = {"finished": False, "files": [
                {"operator_index": 0, "name": "state", "path": path.as_uri(), "size_bytes": path.stat().st_size}]}
    return storage.write_metadata(checkpoint_id, {"version": 1, "job_id": str(job_graph.job_id),
                                                  "checkpoint_id": checkpoint_id, "subtasks": subtasks})


def test_a_recovered_job_resumes_from_the_latest_readable_retained_checkpoint(tmp_path: Any) -> None:
    from yarnflow.am.checkpoint.storage import CheckpointStorage, job_checkpoint_dir
    from yarnflow.common.ha import EmbeddedHaServices

    jg = job("STREAMING")
    ha = EmbeddedHaServices()
    storage = CheckpointStorage(job_checkpoint_dir(tmp_path.as_uri(), str(jg.job_id)))
    store = ha.checkpoint_store(str(jg.job_id))
    for cid in (3, 4, 5):
        store.add(cid, _checkpoint(storage, jg, cid, tmp_path))
    (tmp_path / f"chk-5-{jg.vertices[1].vertex_id}-1.arrow").write_bytes(b"not arrow")  # the latest is corrupt
    counter = ha.checkpoint_id_counter(str(jg.job_id))
    for _ in range(5):
        counter.get_and_increment()  # the previous leader took checkpoints 1..5
    with Cluster(jg, finish=False, ha=ha, recover=True, checkpoints_dir=tmp_path.as_uri(),
                 **{"execution.checkpointing.interval": "200 ms"}) as c:
        wait_until(lambda: len(c.te.submitted) == 4, 10, "the recovered job was not deployed")
        assert {t.restore.checkpoint_id for t in c.te.submitted if t.restore is not None} == {4}
        assert all(t.restore is not None for t in c.te.submitted)
        assert [i.checkpoint_id for i in c.jm.status_info().checkpoints] == [3, 4]
        for tdd in c.te.submitted:
            call(c.jm, "update_task_execution_state", c.jm.fencing_token, TaskExecutionStateUpdate(
                tdd.job_id, tdd.execution_attempt_id, ExecutionState.RUNNING))
        wait_until(lambda: c.te.triggered, 10, "no checkpoint was triggered")
        assert {cid for _, cid in c.te.triggered} == {6}  # ids go on after the previous leader's


def test_a_recovered_job_without_a_checkpoint_starts_from_its_savepoint_again(tmp_path: Any) -> None:
    """A job started from a savepoint (``run -s``, or rescaled: a new JobMaster under the same
    id) whose leader died before the job recorded a checkpoint of its own is recovered from
    that savepoint again, not from the beginning (its checkpoint pointers were cleared)."""
    import dataclasses
    import json

    from yarnflow.am.checkpoint.savepoints import write_savepoint
    from yarnflow.am.checkpoint.storage import CheckpointStorage, job_checkpoint_dir
    from yarnflow.common.ha import EmbeddedHaServices

    base = job("STREAMING")
    jg = dataclasses.replace(base, vertices=[dataclasses.replace(v, operator_uids=[v.name]) for v in base.vertices])
    old = CheckpointStorage(job_checkpoint_dir((tmp_path / "old").as_uri(), str(jg.job_id)))
    url = _checkpoint(old, jg, 7, tmp_path)
    doc = json.loads(Path(url.removeprefix("file://")).read_text())
    doc["vertices"] = {str(v.vertex_id): {"name": v.name, "parallelism": v.parallelism,
                                          "max_parallelism": v.max_parallelism, "operator_uids": v.operator_uids}
                       for v in jg.vertices}
    savepoint = write_savepoint((tmp_path / "sp").as_uri(), str(jg.job_id), doc)
    started = dataclasses.replace(jg, config={"execution.savepoint.path": savepoint})
    ha = EmbeddedHaServices()  # no checkpoint pointers: the leader died before the first was recorded
    with Cluster(started, finish=False, ha=ha, recover=True, checkpoints_dir=(tmp_path / "new").as_uri(),
                 **{"execution.checkpointing.interval": "200 ms"}) as c:
        wait_until(lambda: len(c.te.submitted) == 4, 10, "the recovered job was not deployed")
        assert {t.restore.checkpoint_id if t.restore else None for t in c.te.submitted} == {7}
        assert [cid for cid, _ in ha.checkpoint_store(str(jg.job_id)).checkpoints()] == [7]


def test_a_job_master_that_no_longer_leads_suspends_its_job_and_writes_nothing(tmp_path: Any) -> None:
    from yarnflow.common.ha import EmbeddedHaServices

    jg = job("STREAMING")
    ha = EmbeddedHaServices()
    leading = threading.Event()
    leading.set()
    with Cluster(jg, finish=False, ha=ha, is_leader=leading.is_set, checkpoints_dir=tmp_path.as_uri(),
                 **{"execution.checkpointing.interval": "100 ms"}) as c:
        wait_until(lambda: len(c.te.submitted) == 4, 10, "tasks not deployed")
        for tdd in c.te.submitted:
            call(c.jm, "update_task_execution_state", c.jm.fencing_token, TaskExecutionStateUpdate(
                tdd.job_id, tdd.execution_attempt_id, ExecutionState.RUNNING))
        leading.clear()  # the leadership is gone (a frozen AppMaster that just woke up)
        wait_until(lambda: c.te.triggered, 10, "no checkpoint was triggered")
        checkpoint_id = c.te.triggered[0][1]
        for tdd in c.te.submitted:  # every task acknowledges: the metadata would be written now
            call(c.jm, "acknowledge_checkpoint", c.jm.fencing_token, c.jm.job_id, tdd.execution_attempt_id, checkpoint_id,
                                        TaskStateSnapshot([], 0))
        assert c.ended.wait(10), "the JobMaster kept acting as leader"
        assert c.jm.status == JobStatus.SUSPENDED and c.jm.result is not None
    assert ha.checkpoint_store(str(jg.job_id)).checkpoints() == []
    assert not list(tmp_path.rglob("_metadata"))  # nothing written to the storage dir
    assert c.te.cancelled == []  # no calls to TaskExecutors either: they follow the new leader
