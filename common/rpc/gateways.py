"""Typed gateways: the calls one component may make on another, over Thrift.

``Remote*Gateway`` classes are the client side (dataclass messages in, dataclass messages
out, project exceptions on failure). ``*Handler`` classes adapt an implementation object with
the same method names to the generated Thrift processor, translating errors in one place.
Only this module and ``rpc.server``/``rpc.client`` touch generated code.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Protocol

from yarnflow.common import ids
from yarnflow.common.errors import YarnflowError
from yarnflow.common.messages import (
    AllocatedSlotReport,
    ClusterInfo,
    JobGraph,
    JobResult,
    JobStatusInfo,
    RegistrationResponse,
    ResourceProfile,
    SplitResponse,
    SlotOffer,
    SlotReport,
    TaskDeploymentDescriptor,
    TaskExecutionStateUpdate,
    TaskExecutorHeartbeatPayload,
    TaskStateSnapshot,
    TaskExecutorRegistration,
)
from yarnflow.common.rpc.client import RpcClient
from yarnflow.common.rpc.errors import to_wire_error
from yarnflow.common.rpc.gen.yarnflow_rpc import (
    DispatcherService,
    JobMasterService,
    ResourceManagerService,
    TaskExecutorService,
)

log = logging.getLogger(__name__)

DISPATCHER, RESOURCE_MANAGER, JOB_MASTER, TASK_EXECUTOR = "dispatcher", "resourcemanager", "jobmaster", "taskexecutor"


# ---- client side ---------------------------------------------------------------------------

class RemoteDispatcherGateway:
    """The Dispatcher's calls. Every call that acts on a job or the cluster carries the
    Dispatcher's fencing token (its leader session id): ``fencing_token`` when given, else the
    one read from ``clusterInfo`` at the first such call (and kept). A call that the Dispatcher
    refuses as stale raises ``FencingTokenError``: the client talks to a deposed leader; it
    may ``refresh_fencing_token()`` once it knows the new leader is the one it wants."""

    def __init__(self, address: str, timeout_ms: int = 10_000, fencing_token: str | None = None) -> None:
        self.address = address
        self._c = RpcClient(address, DISPATCHER, DispatcherService.Client, timeout_ms)
        self._token = fencing_token

    @property
    def fencing_token(self) -> str:
        if self._token is None:
            self.cluster_info()
        assert self._token is not None
        return self._token

    def refresh_fencing_token(self) -> str:
        self._token = None
        return self.fencing_token

    def submit_job(self, job_graph: JobGraph) -> ids.JobID:
        return ids.JobID(self._c.call("submitJob", self.fencing_token, job_graph.to_thrift()))

    def list_jobs(self) -> list[JobStatusInfo]:
        return [JobStatusInfo.from_thrift(j) for j in self._c.call("listJobs", self.fencing_token)]

    def get_job(self, job_id: str) -> JobStatusInfo:
        return JobStatusInfo.from_thrift(self._c.call("getJob", self.fencing_token, str(job_id)))

    def cancel_job(self, job_id: str) -> None:
        self._c.call("cancelJob", self.fencing_token, str(job_id))

    def request_job_result(self, job_id: str, timeout_ms: int) -> JobResult:
        token = self.fencing_token
        return JobResult.from_thrift(self._c.call("requestJobResult", token, str(job_id), timeout_ms,
                                                  timeout_ms=timeout_ms + 10_000))

    def cluster_info(self) -> ClusterInfo:
        """Not fenced; the first answer also gives this gateway its fencing token."""
        info = ClusterInfo.from_thrift(self._c.call("clusterInfo"))
        if self._token is None:
            self._token = info.leader_session_id
        return info

    def shutdown_cluster(self) -> None:
        self._c.call("shutdownCluster", self.fencing_token)

    def trigger_savepoint(self, job_id: str, target_dir: str = "", timeout_ms: int = 15 * 60_000) -> str:
        """The URL of a new savepoint of the job (waits up to ``timeout_ms`` for it)."""
        return str(self._c.call("triggerSavepoint", self.fencing_token, str(job_id), target_dir,
                                timeout_ms=timeout_ms))

    def stop_with_savepoint(self, job_id: str, target_dir: str = "", drain: bool = False,
                            timeout_ms: int = 15 * 60_000) -> str:
        """Stop the job with a savepoint; the savepoint's URL once it is complete."""
        return str(self._c.call("stopWithSavepoint", self.fencing_token, str(job_id), target_dir, drain,
                                timeout_ms=timeout_ms))

    def close(self) -> None:
        self._c.close()


class RemoteResourceManagerGateway:
    def __init__(self, address: str, timeout_ms: int = 10_000) -> None:
        self.address = address
        self._c = RpcClient(address, RESOURCE_MANAGER, ResourceManagerService.Client, timeout_ms)

    def register_task_executor(self, registration: TaskExecutorRegistration) -> RegistrationResponse:
        return RegistrationResponse.from_thrift(self._c.call("registerTaskExecutor", registration.to_thrift()))

    def heartbeat_from_task_executor(self, token: str, registration_id: str, report: SlotReport) -> None:
        self._c.call("heartbeatFromTaskExecutor", token, registration_id, report.to_thrift())

    def disconnect_task_executor(self, token: str, resource_id: str, reason: str) -> None:
        self._c.call("disconnectTaskExecutor", token, str(resource_id), reason)

    def request_spark_master(self, token: str, settings: dict[str, str]) -> str:
        return str(self._c.call("requestSparkMaster", token, dict(settings)))

    def close(self) -> None:
        self._c.close()


class RemoteJobMasterGateway:
    def __init__(self, address: str, timeout_ms: int = 10_000) -> None:
        self.address = address
        self._c = RpcClient(address, JOB_MASTER, JobMasterService.Client, timeout_ms)

    def offer_slots(self, token: str, job_id: str, resource_id: str, offers: list[SlotOffer]) -> list[SlotOffer]:
        accepted = self._c.call("offerSlots", token, str(job_id), str(resource_id), [o.to_thrift() for o in offers])
        return [SlotOffer.from_thrift(o) for o in accepted]

    def update_task_execution_state(self, token: str, update: TaskExecutionStateUpdate) -> bool:
        return bool(self._c.call("updateTaskExecutionState", token, update.to_thrift()))

    def request_split(self, token: str, job_id: str, vertex_id: str, subtask_index: int,
                      attempt_id: str, last_checkpoint_id: int = 0) -> SplitResponse:
        return SplitResponse.from_thrift(self._c.call("requestSplit", token, str(job_id), str(vertex_id),
                                                      subtask_index, str(attempt_id), last_checkpoint_id))

    def acknowledge_checkpoint(self, token: str, job_id: str, attempt_id: str, checkpoint_id: int,
                               snapshot: TaskStateSnapshot) -> None:
        self._c.call("acknowledgeCheckpoint", token, str(job_id), str(attempt_id), checkpoint_id,
                     snapshot.to_thrift())

    def decline_checkpoint(self, token: str, job_id: str, attempt_id: str, checkpoint_id: int, reason: str) -> None:
        self._c.call("declineCheckpoint", token, str(job_id), str(attempt_id), checkpoint_id, reason)

    def heartbeat_from_task_executor(self, token: str, job_id: str,
                                     payload: TaskExecutorHeartbeatPayload) -> AllocatedSlotReport:
        """NotFoundError when the job has no JobMaster at that address any more,
        FencingTokenError when ``token`` is not its JobMaster's."""
        return AllocatedSlotReport.from_thrift(self._c.call("heartbeatFromTaskExecutor", token, str(job_id),
                                                            payload.to_thrift()))

    def close(self) -> None:
        self._c.close()


class RemoteTaskExecutorGateway:
    def __init__(self, address: str, timeout_ms: int = 10_000) -> None:
        self.address = address
        self._c = RpcClient(address, TASK_EXECUTOR, TaskExecutorService.Client, timeout_ms)

    def request_slot(self, rm_token: str, slot_index: int, job_id: str, allocation_id: str,
                     profile: ResourceProfile, jobmaster_address: str, jobmaster_token: str) -> None:
        self._c.call("requestSlot", rm_token, slot_index, str(job_id), str(allocation_id), profile.to_thrift(),
                     jobmaster_address, jobmaster_token)

    def submit_task(self, jm_token: str, tdd: TaskDeploymentDescriptor) -> None:
        self._c.call("submitTask", jm_token, tdd.to_thrift())

    def cancel_task(self, jm_token: str, attempt_id: str) -> None:
        self._c.call("cancelTask", jm_token, str(attempt_id))

    def free_slot(self, jm_token: str, allocation_id: str, reason: str) -> None:
        self._c.call("freeSlot", jm_token, str(allocation_id), reason)

    def disconnect_resource_manager(self, rm_token: str, reason: str) -> None:
        self._c.call("disconnectResourceManager", rm_token, reason)

    def release_partitions(self, jm_token: str, job_id: str, partition_ids: list[str]) -> None:
        """Release the job's blocking partitions there (all of them when the list is empty);
        FencingTokenError when ``jm_token`` is not the token of the job's JobMaster."""
        self._c.call("releasePartitions", jm_token, str(job_id), [str(p) for p in partition_ids])

    def trigger_checkpoint(self, jm_token: str, attempt_id: str, checkpoint_id: int, timestamp_ms: int,
                           exactly_once: bool, stop: str = "", aligned_timeout_ms: int = -1) -> None:
        self._c.call("triggerCheckpoint", jm_token, str(attempt_id), checkpoint_id, timestamp_ms, exactly_once,
                     stop, aligned_timeout_ms)

    def notify_checkpoint_complete(self, jm_token: str, attempt_id: str, checkpoint_id: int) -> None:
        self._c.call("notifyCheckpointComplete", jm_token, str(attempt_id), checkpoint_id)

    def notify_checkpoint_aborted(self, jm_token: str, attempt_id: str, checkpoint_id: int) -> None:
        self._c.call("notifyCheckpointAborted", jm_token, str(attempt_id), checkpoint_id)

    def ping(self) -> str:
        return str(self._c.call("ping"))

    def close(self) -> None:
        self._c.close()


# ---- server side ---------------------------------------------------------------------------

def _translated(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        try:
            return fn(*args)
        except YarnflowError as exc:
            log.debug("%s refused: %s", fn.__name__, exc)
            raise to_wire_error(exc) from None
        except Exception as exc:  # an unexpected error: still answer, with its traceback
            log.exception("handler %s failed", fn.__name__)
            raise to_wire_error(exc) from None

    return wrapper


class DispatcherImpl(Protocol):
    """Every method but ``cluster_info`` takes the caller's fencing token first and raises
    FencingTokenError when it is not the Dispatcher's."""

    def submit_job(self, token: str, job_graph: JobGraph) -> ids.JobID: ...
    def list_jobs(self, token: str) -> list[JobStatusInfo]: ...
    def get_job(self, token: str, job_id: ids.JobID) -> JobStatusInfo: ...
    def cancel_job(self, token: str, job_id: ids.JobID) -> None: ...
    def request_job_result(self, token: str, job_id: ids.JobID, timeout_ms: int) -> JobResult: ...
    def cluster_info(self) -> ClusterInfo: ...
    def shutdown_cluster(self, token: str) -> None: ...
    def trigger_savepoint(self, token: str, job_id: ids.JobID, target_dir: str) -> str: ...
    def stop_with_savepoint(self, token: str, job_id: ids.JobID, target_dir: str, drain: bool) -> str: ...


class DispatcherHandler:
    def __init__(self, impl: DispatcherImpl) -> None:
        self._i = impl

    @_translated
    def submitJob(self, token: str, job_graph: Any) -> str:  # noqa: N802 - Thrift names
        return str(self._i.submit_job(token, JobGraph.from_thrift(job_graph)))

    @_translated
    def listJobs(self, token: str) -> list[Any]:  # noqa: N802
        return [j.to_thrift() for j in self._i.list_jobs(token)]

    @_translated
    def getJob(self, token: str, job_id: str) -> Any:  # noqa: N802
        return self._i.get_job(token, ids.JobID(job_id)).to_thrift()

    @_translated
    def cancelJob(self, token: str, job_id: str) -> None:  # noqa: N802
        self._i.cancel_job(token, ids.JobID(job_id))

    @_translated
    def requestJobResult(self, token: str, job_id: str, timeout_ms: int) -> Any:  # noqa: N802
        return self._i.request_job_result(token, ids.JobID(job_id), timeout_ms).to_thrift()

    @_translated
    def clusterInfo(self) -> Any:  # noqa: N802
        return self._i.cluster_info().to_thrift()

    @_translated
    def shutdownCluster(self, token: str) -> None:  # noqa: N802
        self._i.shutdown_cluster(token)

    @_translated
    def triggerSavepoint(self, token: str, job_id: str, target_dir: str) -> str:  # noqa: N802
        return self._i.trigger_savepoint(token, ids.JobID(job_id), target_dir)

    @_translated
    def stopWithSavepoint(self, token: str, job_id: str, target_dir: str, drain: bool) -> str:  # noqa: N802
        return self._i.stop_with_savepoint(token, ids.JobID(job_id), target_dir, bool(drain))

    def processor(self) -> Any:
        return DispatcherService.Processor(self)


class ResourceManagerImpl(Protocol):
    def register_task_executor(self, registration: TaskExecutorRegistration) -> RegistrationResponse: ...
    def heartbeat_from_task_executor(self, token: str, registration_id: str, report: SlotReport) -> None: ...
    def disconnect_task_executor(self, token: str, resource_id: ids.ResourceID, reason: str) -> None: ...
    def request_spark_master(self, token: str, settings: dict[str, str]) -> str: ...


class ResourceManagerHandler:
    def __init__(self, impl: ResourceManagerImpl) -> None:
        self._i = impl

    @_translated
    def registerTaskExecutor(self, registration: Any) -> Any:  # noqa: N802
        return self._i.register_task_executor(TaskExecutorRegistration.from_thrift(registration)).to_thrift()

    @_translated
    def heartbeatFromTaskExecutor(self, token: str, registration_id: str, report: Any) -> None:  # noqa: N802
        self._i.heartbeat_from_task_executor(token, registration_id, SlotReport.from_thrift(report))

    @_translated
    def disconnectTaskExecutor(self, token: str, resource_id: str, reason: str) -> None:  # noqa: N802
        self._i.disconnect_task_executor(token, ids.ResourceID(resource_id), reason)

    @_translated
    def requestSparkMaster(self, token: str, settings: dict[str, str]) -> str:  # noqa: N802
        return self._i.request_spark_master(token, dict(settings or {}))

    def processor(self) -> Any:
        return ResourceManagerService.Processor(self)


class JobMasterImpl(Protocol):
    """Routes by job id to that job's JobMaster."""

    def offer_slots(self, token: str, job_id: ids.JobID, resource_id: ids.ResourceID,
                    offers: list[SlotOffer]) -> list[SlotOffer]: ...
    def update_task_execution_state(self, token: str, update: TaskExecutionStateUpdate) -> bool: ...
    def request_split(self, token: str, job_id: ids.JobID, vertex_id: ids.JobVertexID, subtask_index: int,
                      attempt_id: ids.ExecutionAttemptID, last_checkpoint_id: int) -> SplitResponse: ...
    def heartbeat_from_task_executor(self, token: str, job_id: ids.JobID,
                                     payload: TaskExecutorHeartbeatPayload) -> AllocatedSlotReport: ...
    def acknowledge_checkpoint(self, token: str, job_id: ids.JobID, attempt_id: ids.ExecutionAttemptID,
                               checkpoint_id: int, snapshot: TaskStateSnapshot) -> None: ...
    def decline_checkpoint(self, token: str, job_id: ids.JobID, attempt_id: ids.ExecutionAttemptID,
                           checkpoint_id: int, reason: str) -> None: ...


class JobMasterHandler:
    def __init__(self, impl: JobMasterImpl) -> None:
        self._i = impl

    @_translated
    def offerSlots(self, token: str, job_id: str, resource_id: str, offers: list[Any]) -> list[Any]:  # noqa: N802
        accepted = self._i.offer_slots(token, ids.JobID(job_id), ids.ResourceID(resource_id),
                                       [SlotOffer.from_thrift(o) for o in offers])
        return [o.to_thrift() for o in accepted]

    @_translated
    def updateTaskExecutionState(self, token: str, update: Any) -> bool:  # noqa: N802
        return self._i.update_task_execution_state(token, TaskExecutionStateUpdate.from_thrift(update))

    @_translated
    def requestSplit(self, token: str, job_id: str, vertex_id: str, subtask_index: int,  # noqa: N802
                     attempt_id: str, last_checkpoint_id: int) -> Any:
        return self._i.request_split(token, ids.JobID(job_id), ids.JobVertexID(vertex_id), subtask_index,
                                     ids.ExecutionAttemptID(attempt_id), last_checkpoint_id or 0).to_thrift()

    @_translated
    def acknowledgeCheckpoint(self, token: str, job_id: str, attempt_id: str, checkpoint_id: int,  # noqa: N802
                              snapshot: Any) -> None:
        self._i.acknowledge_checkpoint(token, ids.JobID(job_id), ids.ExecutionAttemptID(attempt_id), checkpoint_id,
                                       TaskStateSnapshot.from_thrift(snapshot))

    @_translated
    def declineCheckpoint(self, token: str, job_id: str, attempt_id: str, checkpoint_id: int,  # noqa: N802
                          reason: str) -> None:
        self._i.decline_checkpoint(token, ids.JobID(job_id), ids.ExecutionAttemptID(attempt_id), checkpoint_id,
                                   reason)

    @_translated
    def heartbeatFromTaskExecutor(self, token: str, job_id: str, payload: Any) -> Any:  # noqa: N802
        return self._i.heartbeat_from_task_executor(
            token, ids.JobID(job_id), TaskExecutorHeartbeatPayload.from_thrift(payload)).to_thrift()

    def processor(self) -> Any:
        return JobMasterService.Processor(self)


class TaskExecutorImpl(Protocol):
    def request_slot(self, rm_token: str, slot_index: int, job_id: ids.JobID, allocation_id: ids.AllocationID,
                     profile: ResourceProfile, jobmaster_address: str, jobmaster_token: str) -> None: ...
    def submit_task(self, jm_token: str, tdd: TaskDeploymentDescriptor) -> None: ...
    def cancel_task(self, jm_token: str, attempt_id: ids.ExecutionAttemptID) -> None: ...
    def free_slot(self, jm_token: str, allocation_id: ids.AllocationID, reason: str) -> None: ...
    def disconnect_resource_manager(self, rm_token: str, reason: str) -> None: ...
    def release_partitions(self, jm_token: str, job_id: ids.JobID, partition_ids: list[str]) -> None: ...
    def trigger_checkpoint(self, jm_token: str, attempt_id: ids.ExecutionAttemptID, checkpoint_id: int,
                           timestamp_ms: int, exactly_once: bool, stop: str = "",
                           aligned_timeout_ms: int = -1) -> None: ...
    def notify_checkpoint_complete(self, jm_token: str, attempt_id: ids.ExecutionAttemptID,
                                   checkpoint_id: int) -> None: ...
    def notify_checkpoint_aborted(self, jm_token: str, attempt_id: ids.ExecutionAttemptID,
                                  checkpoint_id: int) -> None: ...


class TaskExecutorHandler:
    def __init__(self, impl: TaskExecutorImpl) -> None:
        self._i = impl

    @_translated
    def requestSlot(self, rm_token: str, slot_index: int, job_id: str, allocation_id: str, profile: Any,  # noqa: N802
                    jobmaster_address: str, jobmaster_token: str) -> None:
        self._i.request_slot(rm_token, slot_index, ids.JobID(job_id), ids.AllocationID(allocation_id),
                             ResourceProfile.from_thrift(profile), jobmaster_address, jobmaster_token)

    @_translated
    def submitTask(self, jm_token: str, tdd: Any) -> None:  # noqa: N802
        self._i.submit_task(jm_token, TaskDeploymentDescriptor.from_thrift(tdd))

    @_translated
    def cancelTask(self, jm_token: str, attempt_id: str) -> None:  # noqa: N802
        self._i.cancel_task(jm_token, ids.ExecutionAttemptID(attempt_id))

    @_translated
    def freeSlot(self, jm_token: str, allocation_id: str, reason: str) -> None:  # noqa: N802
        self._i.free_slot(jm_token, ids.AllocationID(allocation_id), reason)

    @_translated
    def disconnectResourceManager(self, rm_token: str, reason: str) -> None:  # noqa: N802
        self._i.disconnect_resource_manager(rm_token, reason)

    @_translated
    def releasePartitions(self, jm_token: str, job_id: str, partition_ids: list[str]) -> None:  # noqa: N802
        self._i.release_partitions(jm_token, ids.JobID(job_id), list(partition_ids))

    @_translated
    def triggerCheckpoint(self, jm_token: str, attempt_id: str, checkpoint_id: int, timestamp_ms: int,  # noqa: N802
                          exactly_once: bool, stop: str | None = None, aligned_timeout_ms: int | None = None) -> None:
        self._i.trigger_checkpoint(jm_token, ids.ExecutionAttemptID(attempt_id), checkpoint_id, timestamp_ms,
                                   bool(exactly_once), stop or "", -1 if aligned_timeout_ms is None else aligned_timeout_ms)

    @_translated
    def notifyCheckpointComplete(self, jm_token: str, attempt_id: str, checkpoint_id: int) -> None:  # noqa: N802
        self._i.notify_checkpoint_complete(jm_token, ids.ExecutionAttemptID(attempt_id), checkpoint_id)

    @_translated
    def notifyCheckpointAborted(self, jm_token: str, attempt_id: str, checkpoint_id: int) -> None:  # noqa: N802
        self._i.notify_checkpoint_aborted(jm_token, ids.ExecutionAttemptID(attempt_id), checkpoint_id)

    def ping(self) -> str:
        return "pong"

    def processor(self) -> Any:
        return TaskExecutorService.Processor(self)
