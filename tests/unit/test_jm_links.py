"""How a TaskExecutor's tasks reach their JobMaster across a change of leader (jm_links.py),
with a real TaskExecutorCore and JobMaster gateways faked: split requests wait for the new
JobMaster and survive a dead one; a split handed out by a JobMaster deposed during the call is
not booked (the new one hands it out); checkpoint answers while orphaned are dropped; the
takeover report names what the task took."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from yarnflow.common.clock import ManualClock
from yarnflow.common.errors import RpcConnectionError, UnavailableError
from yarnflow.common.ids import AllocationID, ExecutionAttemptID, JobID, JobVertexID, ResourceID
from yarnflow.common.messages import (
    ResourceProfile,
    SourceSplit,
    SplitResponse,
    TaskDeploymentDescriptor,
    TaskExecutionStateUpdate,
    TaskStateSnapshot,
)
from yarnflow.common.states import ExecutionState
from yarnflow.worker.taskexecutor import jm_links
from yarnflow.worker.taskexecutor.core import TaskExecutorCore
from yarnflow.worker.taskexecutor.jm_links import JobMasterLinks, JobMasterResponder
from yarnflow.worker.taskexecutor.job_table import JobTable
from yarnflow.worker.taskexecutor.slot_table import SlotTable

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

JOB = JobID("job-1")


class Inline:
    """The TaskExecutor's main thread, run inline."""

    def call(self, fn: Any, *args: Any, timeout: float | None = None) -> Any:
        return fn(*args)

    def execute(self, fn: Any, *args: Any) -> None:
        fn(*args)


class FakeTask:
    def __init__(self, tdd: TaskDeploymentDescriptor) -> None:
        self.tdd = tdd
        self.taken_splits: list[Any] = []
        self.state = ExecutionState.RUNNING
        self._responder: Any = None


class Gateway:
    """A JobMaster: ``answers`` are returned (or raised) in turn; ``during`` runs inside a call."""

    def __init__(self, name: str, te: Links, answers: list[Any]) -> None:
        self.name, self.te, self.answers = name, te, answers
        self.calls: list[tuple[str, Any]] = []
        self.during: Any = None

    def request_split(self, token: str, *args: Any) -> SplitResponse:
        self.calls.append(("split", token))
        if self.during is not None:
            during, self.during = self.during, None
            during()
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]

    def acknowledge_checkpoint(self, token: str, *args: Any) -> None:
        self.calls.append(("ack", token))


class Links(JobMasterLinks):
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.core = TaskExecutorCore(ResourceID("te-1"), SlotTable(1, ResourceProfile(1.0, 512)),
                                     JobTable(self.clock, 1000, 60_000), keep_tasks=True)
        self.core.registered("rm-1", "reg-1")
        self._main = Inline()  # type: ignore[assignment]
        self._stopped = threading.Event()
        self.gateways: dict[str, Gateway] = {}
        self.tasks = {}
        self._ended = {}
        self.resource_id = ResourceID("te-1")

    def _jm(self, address: str, job_id: JobID) -> Any:  # type: ignore[override]
        return self.gateways[address]

    def _task_done(self, update: TaskExecutionStateUpdate) -> None:  # (TaskExecutor's)
        self._remember_ended(self.tasks.pop(update.execution_attempt_id), update)
        self.core.task_ended(update)


def split(split_id: str) -> SplitResponse:
    return SplitResponse(SourceSplit(split_id, b"x"), False)


def deployed(te: Links) -> TaskDeploymentDescriptor:
    alloc = AllocationID("alloc-1")
    te.core.slot_requested(0, JOB, alloc, "am-1", "jm-1")
    tdd = TaskDeploymentDescriptor(JOB, JobVertexID("src"), "src (1/1)", ExecutionAttemptID("attempt-1"), 0, 0, 1,
                                   128, alloc, "file:///job.zip", "0" * 64, jobmaster_fencing_token="jm-1")
    te.core.deploy(tdd)
    te.tasks[tdd.execution_attempt_id] = FakeTask(tdd)
    return tdd


def test_a_split_request_survives_a_dead_jobmaster_and_asks_the_one_that_takes_over(monkeypatch) -> None:
    te = Links()
    tdd = deployed(te)
    old = te.gateways["am-1"] = Gateway("old", te, [RpcConnectionError("connection refused")])
    new = te.gateways["am-2"] = Gateway("new", te, [split("s7")])

    def failover() -> None:  # while the task waits: the leader changes, the new JobMaster takes over
        te.core.leader_changed(keep_tasks=True)
        te.core.registered("rm-2", "reg-2")
        te.core.reconnect_job(JOB, "am-2", "jm-2")

    old.during = failover
    monkeypatch.setattr(jm_links, "_POLL_S", 0.001)
    resp = te._split_requester(tdd, lambda: False)(4)
    assert resp.split is not None and resp.split.split_id == "s7"
    assert new.calls == [("split", "jm-2")]
    assert [(t.split_id, t.last_checkpoint_id) for t in te.tasks[tdd.execution_attempt_id].taken_splits] == [("s7", 4)]


def test_a_split_handed_out_by_a_jobmaster_deposed_meanwhile_is_not_booked_and_the_new_one_is_asked() -> None:
    te = Links()
    tdd = deployed(te)
    old = te.gateways["am-1"] = Gateway("old", te, [split("s1")])
    te.gateways["am-2"] = Gateway("new", te, [split("s2")])

    def taken_over() -> None:  # the old JobMaster answers only after the new one took the job over
        te.core.leader_changed(keep_tasks=True)
        te.core.registered("rm-2", "reg-2")
        te.core.reconnect_job(JOB, "am-2", "jm-2")

    old.during = taken_over
    resp = te._split_requester(tdd, lambda: False)(3)
    assert resp.split is not None and resp.split.split_id == "s2"
    assert [t.split_id for t in te.tasks[tdd.execution_attempt_id].taken_splits] == ["s2"]
    report = te.reconnect_job(JOB, "am-2", "jm-2")  # (the RPC's fencing is RpcEndpoint's)
    assert [t.split_id for task in report.tasks for t in task.taken_splits] == ["s2"]


def test_checkpoint_answers_while_orphaned_are_dropped_and_a_gone_job_ends_a_waiting_request() -> None:
    te = Links()
    tdd = deployed(te)
    old = te.gateways["am-1"] = Gateway("old", te, [])
    responder = JobMasterResponder(te, JOB, tdd.execution_attempt_id)
    responder.acknowledge(5, TaskStateSnapshot([]))
    assert old.calls == [("ack", "jm-1")] and responder.last_acknowledged == 5
    te.core.leader_changed(keep_tasks=True)
    responder.acknowledge(6, TaskStateSnapshot([]))  # the old leader's checkpoint: nobody completes it
    assert old.calls == [("ack", "jm-1")] and responder.last_acknowledged == 5
    te.clock.advance(61_001)  # nobody took the job over: it is given up
    te.core.heartbeats_due({}, [])
    with pytest.raises(UnavailableError):
        te._split_requester(tdd, lambda: False)(6)


def test_a_source_that_finished_while_orphaned_is_reported_with_its_splits_until_acknowledged() -> None:
    te = Links()
    tdd = deployed(te)
    te.gateways["am-1"] = Gateway("old", te, [split("s4")])
    te._split_requester(tdd, lambda: False)(2)
    te.core.leader_changed(keep_tasks=True)
    # it read its split to the end while no JobMaster led: its final update waits
    finished = TaskExecutionStateUpdate(JOB, tdd.execution_attempt_id, ExecutionState.FINISHED)
    te._task_done(finished)
    te.core.registered("rm-2", "reg-2")
    report = te.reconnect_job(JOB, "am-2", "jm-2")
    assert [(t.execution_attempt_id, t.state, [s.split_id for s in t.taken_splits]) for t in report.tasks] == [
        (tdd.execution_attempt_id, ExecutionState.FINISHED, ["s4"])]
    assert report.final_updates == [finished]
