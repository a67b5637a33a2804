"""Hand-written ResourceManager and JobMaster doubles served over real Thrift, and a real
TaskExecutor (in this process) connected to them: tests of the TaskExecutor's side of the
protocols (fencing, JobMaster heartbeats, slot reconciliation) talk to it as the AppMaster
would, over the wire.

``te_with_doubles(**conf)`` yields a ``RemoteTestbed``; everything it started is stopped on exit::

    with te_with_doubles() as bed:
        alloc = bed.allocate(0)            # requestSlot, as the RM would; the double accepts the offer
        bed.te_gateway.submit_task(bed.jm.token, bed.tdd(alloc))
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import fsspec

from tests.harness import wait_until
from yarnflow.common.config import Configuration
from yarnflow.common.errors import FencingTokenError, NotFoundError
from yarnflow.common.ids import AllocationID, ExecutionAttemptID, JobID, JobVertexID, ResourceID
from yarnflow.common.messages import (
    AllocatedSlotReport,
    RegistrationResponse,
    ResourceProfile,
    SlotOffer,
    SlotReport,
    SplitResponse,
    TaskDeploymentDescriptor,
    TaskExecutionStateUpdate,
    TaskExecutorHeartbeatPayload,
    TaskExecutorRegistration,
)
from yarnflow.common.rpc.gateways import (
    JOB_MASTER,
    RESOURCE_MANAGER,
    JobMasterServiceHandler,
    RemoteTaskExecutorGateway,
    ResourceManagerServiceHandler,
)
from yarnflow.common.rpc.server import RpcServer

# Fast heartbeats so the tests see several rounds in a second or two.
FAST_TE_CONF = {
    "heartbeat.interval": "100 ms",
    "heartbeat.timeout": "1500 ms",
    "rpc.timeout": "1 s",
    "taskmanager.numberOfTaskSlots": "2",
    "taskmanager.registration.timeout": "30 s",
    "task.cancellation.timeout": "0 ms",
}


class _TokenFirst:
    """A double's RPC entry (what ``RpcEndpoint.rpc_invoke`` is to a component): its methods
    take the caller's token first and check it themselves, so a test can make them refuse."""

    def rpc_invoke(self, method: str, token: str | None, args: tuple[Any, ...]) -> Any:
        return getattr(self, method)(*(args if token is None else (token, *args)))


class ResourceManagerDouble(_TokenFirst):
    """Accepts one TaskExecutor and keeps its latest slot report."""

    __test__ = False

    def __init__(self) -> None:
        self.fencing_token = "rm-token"
        self.registration: TaskExecutorRegistration | None = None
        self.reports: list[SlotReport] = []

    def register_task_executor(self, registration: TaskExecutorRegistration) -> RegistrationResponse:
        self.registration = registration
        return RegistrationResponse(True, self.fencing_token, "reg-1", 100)

    def heartbeat_from_task_executor(self, token: str, registration_id: str, report: SlotReport) -> None:
        if token != self.fencing_token:
            raise FencingTokenError("stale ResourceManager token")
        self.reports.append(report)

    def disconnect_task_executor(self, token: str, resource_id: ResourceID, reason: str) -> None:
        pass

    def held_allocations(self) -> set[str]:
        """The allocations the TaskExecutor reported in its latest heartbeat."""
        if not self.reports:
            return set()
        return {str(s.allocation_id) for s in self.reports[-1].slots if s.allocation_id is not None}


@dataclass
class JobMasterDouble:
    """One job's JobMaster. Accepts every offer and lists every accepted slot in its heartbeat
    answers unless told otherwise:

    * ``drop_updates``: updateTaskExecutionState fails (an internal error: the update is lost);
    * ``listed``: when set, the allocations the heartbeat answer lists;
    * ``answer``: ``"ok"``, ``"not_found"`` (the job is unknown) or ``"fencing"``;
    * ``artifacts``: what its blob service serves (sha256 -> URI; a test registers them)."""

    __test__ = False

    job_id: JobID = field(default_factory=JobID.generate)
    token: str = "jm-token"
    accepted: list[AllocationID] = field(default_factory=list)
    updates: list[TaskExecutionStateUpdate] = field(default_factory=list)
    heartbeats: list[TaskExecutorHeartbeatPayload] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)  # the blob service's: sha256 -> URI
    drop_updates: bool = False
    listed: set[AllocationID] | None = None
    answer: str = "ok"
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _check(self, token: str, job_id: JobID) -> None:
        if job_id != self.job_id or self.answer == "not_found":
            raise NotFoundError(f"no running job {job_id}")
        if token != self.token or self.answer == "fencing":
            raise FencingTokenError("stale JobMaster token")

    def offer_slots(self, token: str, job_id: JobID, resource_id: ResourceID,
                    offers: list[SlotOffer]) -> list[SlotOffer]:
        self._check(token, job_id)
        with self.lock:
            self.accepted.extend(o.allocation_id for o in offers)
        return offers

    def update_task_execution_state(self, token: str, update: TaskExecutionStateUpdate) -> bool:
        self._check(token, update.job_id)
        if self.drop_updates:
            raise RuntimeError(f"update {update.state.name} of {update.execution_attempt_id} lost in transit")
        with self.lock:
            self.updates.append(update)
        return True

    def request_split(self, token: str, job_id: JobID, vertex_id: JobVertexID, subtask_index: int,
                      attempt_id: ExecutionAttemptID, last_checkpoint_id: int = 0) -> SplitResponse:
        return SplitResponse(no_more_splits=True)

    def read_artifact(self, token: str, job_id: JobID, sha256: str, offset: int, length: int) -> bytes:
        """The blob service: the artifacts a test registered in ``artifacts`` (sha256 -> URI)."""
        self._check(token, job_id)
        uri = self.artifacts.get(sha256)
        if uri is None:
            raise NotFoundError(f"job {job_id} has no artifact {sha256[:12]}")
        with fsspec.open(uri, "rb") as fh:
            fh.seek(offset)
            return bytes(fh.read(length))

    def heartbeat_from_task_executor(self, token: str, job_id: JobID,
                                     payload: TaskExecutorHeartbeatPayload) -> AllocatedSlotReport:
        self._check(token, job_id)
        with self.lock:
            self.heartbeats.append(payload)
            listed = list(self.accepted) if self.listed is None else list(self.listed)
        return AllocatedSlotReport(listed)

    def reported_states(self, attempt_id: str) -> list[Any]:
        """Every state the heartbeats reported for ``attempt_id``, in order."""
        with self.lock:
            return [u.state for hb in self.heartbeats for u in hb.executions if u.execution_attempt_id == attempt_id]


class _AppMasterDouble(_TokenFirst):
    """Serves every job's JobMasterService (``jobmaster/<job id>``) and routes by job id."""

    def __init__(self) -> None:
        self.jobs: dict[JobID, JobMasterDouble] = {}

    def _jm(self, job_id: JobID) -> JobMasterDouble:
        jm = self.jobs.get(job_id)
        if jm is None:
            raise NotFoundError(f"no running job {job_id}")
        return jm

    def offer_slots(self, token: str, job_id: JobID, resource_id: ResourceID,
                    offers: list[SlotOffer]) -> list[SlotOffer]:
        return self._jm(job_id).offer_slots(token, job_id, resource_id, offers)

    def update_task_execution_state(self, token: str, update: TaskExecutionStateUpdate) -> bool:
        return self._jm(update.job_id).update_task_execution_state(token, update)

    def request_split(self, token: str, job_id: JobID, vertex_id: JobVertexID, subtask_index: int,
                      attempt_id: ExecutionAttemptID, last_checkpoint_id: int = 0) -> SplitResponse:
        return self._jm(job_id).request_split(token, job_id, vertex_id, subtask_index, attempt_id,
                                              last_checkpoint_id)

    def read_artifact(self, token: str, job_id: JobID, sha256: str, offset: int, length: int) -> bytes:
        return self._jm(job_id).read_artifact(token, job_id, sha256, offset, length)

    def heartbeat_from_task_executor(self, token: str, job_id: JobID,
                                     payload: TaskExecutorHeartbeatPayload) -> AllocatedSlotReport:
        return self._jm(job_id).heartbeat_from_task_executor(token, job_id, payload)


@dataclass
class RemoteTestbed:
    te: Any  # the TaskExecutor (in this process, reached only over Thrift by the tests)
    te_gateway: RemoteTaskExecutorGateway
    rm: ResourceManagerDouble
    jm: JobMasterDouble
    rm_server: RpcServer
    jm_server: RpcServer
    appmaster: _AppMasterDouble

    @property
    def jm_address(self) -> str:
        return self.jm_server.address

    def allocate(self, slot_index: int, jm: JobMasterDouble | None = None) -> AllocationID:
        """requestSlot as the ResourceManager sends it; waits until the JobMaster accepted the offer."""
        jm = jm or self.jm
        allocation_id = AllocationID.generate()
        self.te_gateway.request_slot(self.rm.fencing_token, slot_index, jm.job_id, allocation_id,
                                     ResourceProfile(), self.jm_address, jm.token)
        wait_until(lambda: allocation_id in jm.accepted, 10, f"the offer of {allocation_id} was not accepted")
        wait_until(lambda: str(allocation_id) in self.rm.held_allocations(), 10,
                   f"the TaskExecutor does not report {allocation_id} as held")
        return allocation_id

    def tdd(self, allocation_id: AllocationID, jm: JobMasterDouble | None = None) -> TaskDeploymentDescriptor:
        """A task whose artifact does not exist: it fails at once (a FAILED final update)."""
        jm = jm or self.jm
        return TaskDeploymentDescriptor(jm.job_id, JobVertexID("v-1"), "doomed", ExecutionAttemptID.generate(), 0, 0,
                                        1, 128, allocation_id, "file:///no/such/artifact.zip", "0" * 64,
                                        jobmaster_fencing_token=jm.token)

    def add_job(self, token: str = "jm-token-2") -> JobMasterDouble:
        jm = JobMasterDouble(token=token)
        self.appmaster.jobs[jm.job_id] = jm
        return jm


@contextlib.contextmanager
def te_with_doubles(**conf: str) -> Iterator[RemoteTestbed]:
    from yarnflow.worker.taskexecutor.task_executor import TaskExecutor

    appmaster = _AppMasterDouble()
    jm = JobMasterDouble()
    appmaster.jobs[jm.job_id] = jm
    rm = ResourceManagerDouble()
    # two ports (one in a real AppMaster), so a test can make the JobMasters unreachable alone
    rm_server = RpcServer("127.0.0.1", 0, {RESOURCE_MANAGER: ResourceManagerServiceHandler(rm).processor()},
                          name="rm-double").start()
    jm_server = RpcServer("127.0.0.1", 0, {}, name="jm-double")
    jm_server.fallback(JOB_MASTER, JobMasterServiceHandler(appmaster).processor())
    jm_server.start()
    config = Configuration.load({**FAST_TE_CONF, **{k.replace("__", "."): v for k, v in conf.items()}})
    work_dir = tempfile.mkdtemp(prefix="yarnflow-te-test-")
    te = TaskExecutor(config, ResourceID.generate(), rm_server.address, work_dir).start()
    gateway: RemoteTaskExecutorGateway | None = None
    try:
        wait_until(lambda: rm.registration is not None and rm.reports, 10, "the TaskExecutor did not register")
        assert rm.registration is not None
        gateway = RemoteTaskExecutorGateway(rm.registration.rpc_address, 5000)
        yield RemoteTestbed(te, gateway, rm, jm, rm_server, jm_server, appmaster)
    finally:
        if gateway is not None:
            gateway.close()
        te.shutdown("test over")
        jm_server.stop()
        rm_server.stop()
        _rmtree(work_dir)


def _rmtree(path: str) -> None:
    import shutil

    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)

