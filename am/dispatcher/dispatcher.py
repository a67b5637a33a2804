"""Dispatcher: accepts jobs, starts a JobMaster for each, answers list / get / cancel, keeps
the results of ended jobs, and waits for results on behalf of clients.

Fencing: the Dispatcher has a leader session id (``fencing_token``), given to clients by
``cluster_info``; every call that acts on a job or the cluster carries it and is refused with
FencingTokenError when it is another one (a client still talking to a deposed leader)."""

from __future__ import annotations

import logging
import threading
from typing import Callable

import fsspec

from yarnflow.common.version import __version__
from yarnflow.am.jobmaster.job_master import JobMaster
from yarnflow.am.resourcemanager.resource_manager import ResourceManager
from yarnflow.common.config import Configuration
from yarnflow.common.errors import (
    FencingTokenError,
    InvalidRequestError,
    NotFoundError,
    RefusedError,
    UnavailableError,
)
from yarnflow.common.ids import ExecutionAttemptID, JobID, LeaderSessionID, ResourceID
from yarnflow.common.messages import (
    AllocatedSlotReport,
    ClusterInfo,
    JobGraph,
    JobResult,
    JobStatusInfo,
    SlotOffer,
    SplitResponse,
    TaskExecutionStateUpdate,
    TaskExecutorHeartbeatPayload,
    TaskStateSnapshot,
)
from yarnflow.common.artifacts import ArtifactCache

log = logging.getLogger(__name__)


def job_storage_dir(storage_dir: str, job_id: str) -> str:
    return f"{storage_dir.rstrip('/')}/jobs/{job_id}"


class Dispatcher:
    def __init__(self, config: Configuration, rm: ResourceManager, cluster_id: str, storage_dir: str, target: str,
                 on_shutdown: Callable[[], None], artifacts: ArtifactCache) -> None:
        self._artifacts = artifacts
        self._config = config
        self._rm = rm
        self._cluster_id = cluster_id
        self._storage_dir = storage_dir
        self._target = target
        self._on_shutdown = on_shutdown
        self._lock = threading.Lock()
        self._running: dict[JobID, JobMaster] = {}
        self._ended: dict[JobID, tuple[JobStatusInfo, JobResult]] = {}
        self._done: dict[JobID, threading.Event] = {}
        self.address = ""
        self._accepting = True
        self.fencing_token = LeaderSessionID.generate()

    def _check_token(self, token: str, call: str) -> None:
        if token != self.fencing_token:
            raise FencingTokenError(f"{call} with a stale Dispatcher token {token!r}: "
                                    f"this Dispatcher's leader session is {self.fencing_token}")

    # -- DispatcherService ------------------------------------------------------------------
    def submit_job(self, token: str, job_graph: JobGraph) -> JobID:
        self._check_token(token, "submitJob")
        if not self._accepting:
            raise UnavailableError("the cluster is shutting down")
        job_graph.validate()
        if not job_graph.artifact_uri:
            raise InvalidRequestError("the JobGraph names no job artifact")
        try:
            exists = fsspec.core.url_to_fs(job_graph.artifact_uri)[0].exists(job_graph.artifact_uri)
        except (OSError, ValueError) as exc:
            raise InvalidRequestError(f"cannot check the job artifact {job_graph.artifact_uri}: {exc}") from None
        if not exists:
            raise InvalidRequestError(f"the job artifact {job_graph.artifact_uri} does not exist")
        with self._lock:
            if job_graph.job_id in self._running or job_graph.job_id in self._ended:
                raise RefusedError(f"job {job_graph.job_id} was already submitted")
            jm = JobMaster(job_graph, self._config, self._rm, self.address,
                           job_storage_dir(self._storage_dir, job_graph.job_id), self._job_ended, self._artifacts,
                           checkpoints_dir=f"{self._storage_dir.rstrip('/')}/checkpoints")
            self._running[job_graph.job_id] = jm
            self._done[job_graph.job_id] = threading.Event()
        log.info("job %s (%s) submitted: %d vertices", job_graph.name, job_graph.job_id, len(job_graph.vertices))
        jm.start()
        return job_graph.job_id

    def list_jobs(self, token: str) -> list[JobStatusInfo]:
        self._check_token(token, "listJobs")
        with self._lock:
            running = list(self._running.values())
            ended = [info for info, _ in self._ended.values()]
        infos = []
        for jm in running:
            try:
                infos.append(jm.status_info())
            except UnavailableError:
                pass  # ended between the two looks: it is in the ended list next time
        return sorted(infos + ended, key=lambda j: j.start_time_ms)

    def get_job(self, token: str, job_id: JobID) -> JobStatusInfo:
        self._check_token(token, "getJob")
        with self._lock:
            jm = self._running.get(job_id)
            ended = self._ended.get(job_id)
        if ended is not None:
            return ended[0]
        if jm is None:
            raise NotFoundError(f"no job {job_id} on this cluster")
        try:
            return jm.status_info()
        except UnavailableError:
            return self.get_job(token, job_id)

    def cancel_job(self, token: str, job_id: JobID) -> None:
        self._check_token(token, "cancelJob")
        with self._lock:
            jm = self._running.get(job_id)
            ended = self._ended.get(job_id)
        if ended is not None:
            raise RefusedError(f"job {job_id} already ended {ended[1].status.name}")
        if jm is None:
            raise NotFoundError(f"no job {job_id} on this cluster")
        log.info("cancelling job %s", job_id)
        jm.cancel()

    def request_job_result(self, token: str, job_id: JobID, timeout_ms: int) -> JobResult:
        self._check_token(token, "requestJobResult")
        with self._lock:
            event = self._done.get(job_id)
        if event is None:
            raise NotFoundError(f"no job {job_id} on this cluster")
        if not event.wait(timeout_ms / 1000.0):
            raise UnavailableError(f"job {job_id} is still running")
        with self._lock:
            return self._ended[job_id][1]

    def cluster_info(self) -> ClusterInfo:
        tes, total, free = self._rm.overview()
        return ClusterInfo(self._cluster_id, self._storage_dir, __version__, tes, total, free, self._target,
                           self.fencing_token)

    def shutdown_cluster(self, token: str) -> None:
        self._check_token(token, "shutdownCluster")
        log.info("shutdown requested by a client")
        self._accepting = False
        threading.Thread(target=self._on_shutdown, name="shutdown", daemon=True).start()

    # -- JobMasters -------------------------------------------------------------------------
    def _job_ended(self, jm: JobMaster) -> None:
        assert jm.result is not None
        info = jm._status_info()  # noqa: SLF001 - called on the JobMaster's own thread
        with self._lock:
            self._running.pop(jm.job_id, None)
            self._ended[jm.job_id] = (info, jm.result)
            event = self._done[jm.job_id]
        event.set()
        threading.Timer(2.0, jm.stop).start()  # let late task updates still get an answer

    def running_job_masters(self) -> list[JobMaster]:
        with self._lock:
            return list(self._running.values())

    def cancel_all(self, timeout_s: float) -> None:
        for jm in self.running_job_masters():
            jm.cancel()
        with self._lock:
            events = [self._done[j] for j in self._running]
        for e in events:
            e.wait(timeout_s)

    # -- JobMasterService routing (TaskExecutors -> the job's JobMaster) ---------------------
    def _jm(self, job_id: JobID) -> JobMaster:
        with self._lock:
            jm = self._running.get(job_id)
        if jm is None:
            raise NotFoundError(f"no running job {job_id}")
        return jm

    def offer_slots(self, token: str, job_id: JobID, resource_id: ResourceID, offers: list[SlotOffer]) -> list[SlotOffer]:
        return self._jm(job_id).offer_slots(token, resource_id, offers)

    def update_task_execution_state(self, token: str, update: TaskExecutionStateUpdate) -> bool:
        return self._jm(update.job_id).update_task_execution_state(token, update)

    def request_split(self, token: str, job_id: JobID, vertex_id: str, subtask_index: int,
                      attempt_id: str, last_checkpoint_id: int = 0) -> SplitResponse:
        return self._jm(job_id).request_split(token, vertex_id, subtask_index, attempt_id, last_checkpoint_id)

    def acknowledge_checkpoint(self, token: str, job_id: JobID, attempt_id: ExecutionAttemptID, checkpoint_id: int,
                               snapshot: TaskStateSnapshot) -> None:
        self._jm(job_id).acknowledge_checkpoint(token, attempt_id, checkpoint_id, snapshot)

    def decline_checkpoint(self, token: str, job_id: JobID, attempt_id: ExecutionAttemptID, checkpoint_id: int,
                           reason: str) -> None:
        self._jm(job_id).decline_checkpoint(token, attempt_id, checkpoint_id, reason)

    def heartbeat_from_task_executor(self, token: str, job_id: JobID,
                                     payload: TaskExecutorHeartbeatPayload) -> AllocatedSlotReport:
        """NotFoundError when the job has no running JobMaster here: the TaskExecutor then frees
        the job's slots."""
        jm = self._jm(job_id)
        return jm.heartbeat_from_task_executor(token, payload)
