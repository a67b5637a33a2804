# Generated from thrift/*.thrift by `python -m yarnflow.common.rpc.codegen`: do not edit by hand.
"""Gateways (client side) and handlers (server side) of every service in the IDL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from yarnflow.common.ids import AllocationID, ExecutionAttemptID, JobID, JobVertexID, ResourceID
from yarnflow.common.messages import (
    AllocatedSlotReport,
    ClusterInfo,
    JobGraph,
    JobResult,
    JobStatusInfo,
    RegistrationResponse,
    ResourceProfile,
    SlotOffer,
    SlotReport,
    SplitResponse,
    TaskDeploymentDescriptor,
    TaskExecutionStateUpdate,
    TaskExecutorHeartbeatPayload,
    TaskExecutorRegistration,
    TaskStateSnapshot,
)
from yarnflow.common.rpc.client import RpcClient
from yarnflow.common.rpc.endpoint import RpcTarget, read_args, translated
from yarnflow.common.rpc.gen.yarnflow_rpc import DispatcherService, JobMasterService, ResourceManagerService, TaskExecutorService

if TYPE_CHECKING:
    from yarnflow.common.security import TlsCredentials

DISPATCHER = "dispatcher"
JOB_MASTER = "jobmaster"
RESOURCE_MANAGER = "resourcemanager"
TASK_EXECUTOR = "taskexecutor"

#: DispatcherService's methods: Python name -> whether the IDL fences it
DISPATCHER_METHODS = {
    "submit_job": True,
    "list_jobs": True,
    "get_job": True,
    "cancel_job": True,
    "request_job_result": True,
    "cluster_info": False,
    "shutdown_cluster": True,
    "trigger_savepoint": True,
    "stop_with_savepoint": True,
    "rescale_job": True,
    "scale_session": True,
}
#: JobMasterService's methods: Python name -> whether the IDL fences it
JOB_MASTER_METHODS = {
    "offer_slots": True,
    "update_task_execution_state": True,
    "request_split": True,
    "acknowledge_checkpoint": True,
    "decline_checkpoint": True,
    "heartbeat_from_task_executor": True,
}
#: ResourceManagerService's methods: Python name -> whether the IDL fences it
RESOURCE_MANAGER_METHODS = {
    "register_task_executor": False,
    "heartbeat_from_task_executor": True,
    "disconnect_task_executor": True,
    "request_spark_master": True,
}
#: TaskExecutorService's methods: Python name -> whether the IDL fences it
TASK_EXECUTOR_METHODS = {
    "request_slot": True,
    "submit_task": True,
    "cancel_task": True,
    "free_slot": True,
    "disconnect_resource_manager": True,
    "release_partitions": True,
    "trigger_checkpoint": True,
    "notify_checkpoint_complete": True,
    "notify_checkpoint_aborted": True,
    "ping": False,
}


class DispatcherServiceCalls(Protocol):
    """The calls of a DispatcherService, as its gateway makes them."""

    def submit_job(self, fencing_token: str, job_graph: JobGraph) -> str: ...

    def list_jobs(self, fencing_token: str) -> list[JobStatusInfo]: ...

    def get_job(self, fencing_token: str, job_id: str) -> JobStatusInfo: ...

    def cancel_job(self, fencing_token: str, job_id: str) -> None: ...

    def request_job_result(self, fencing_token: str, job_id: str, timeout_ms: int) -> JobResult: ...

    def cluster_info(self) -> ClusterInfo: ...

    def shutdown_cluster(self, fencing_token: str) -> None: ...

    def trigger_savepoint(self, fencing_token: str, job_id: str, target_dir: str) -> str: ...

    def stop_with_savepoint(self, fencing_token: str, job_id: str, target_dir: str, drain: bool) -> str: ...

    def rescale_job(self, fencing_token: str, job_id: str, parallelism: int) -> int: ...

    def scale_session(self, fencing_token: str, taskexecutors: int) -> int: ...

    def close(self) -> None: ...


class DispatcherServiceGateway:
    """Calls on a DispatcherService (``dispatcher`` on its server, or ``service`` when given)."""

    SERVICE = DISPATCHER

    def __init__(self, address: str, timeout_ms: int = 10_000, service: str | None = None,
                 tls: TlsCredentials | None = None) -> None:
        self.address = address
        self._c = RpcClient(address, service or self.SERVICE, DispatcherService.Client, timeout_ms, tls=tls)

    def submit_job(self, fencing_token: str, job_graph: JobGraph, *, rpc_timeout_ms: int | None = None) -> str:
        return str(self._c.call("submitJob", str(fencing_token), job_graph.to_thrift(), timeout_ms=rpc_timeout_ms))

    def list_jobs(self, fencing_token: str, *, rpc_timeout_ms: int | None = None) -> list[JobStatusInfo]:
        return [JobStatusInfo.from_thrift(v) for v in self._c.call("listJobs", str(fencing_token), timeout_ms=rpc_timeout_ms) or ()]

    def get_job(self, fencing_token: str, job_id: str, *, rpc_timeout_ms: int | None = None) -> JobStatusInfo:
        return JobStatusInfo.from_thrift(self._c.call("getJob", str(fencing_token), str(job_id), timeout_ms=rpc_timeout_ms))

    def cancel_job(self, fencing_token: str, job_id: str, *, rpc_timeout_ms: int | None = None) -> None:
        self._c.call("cancelJob", str(fencing_token), str(job_id), timeout_ms=rpc_timeout_ms)

    def request_job_result(self, fencing_token: str, job_id: str, timeout_ms: int, *, rpc_timeout_ms: int | None = None) -> JobResult:
        return JobResult.from_thrift(self._c.call("requestJobResult", str(fencing_token), str(job_id), timeout_ms, timeout_ms=rpc_timeout_ms))

    def cluster_info(self, *, rpc_timeout_ms: int | None = None) -> ClusterInfo:
        return ClusterInfo.from_thrift(self._c.call("clusterInfo", timeout_ms=rpc_timeout_ms))

    def shutdown_cluster(self, fencing_token: str, *, rpc_timeout_ms: int | None = None) -> None:
        self._c.call("shutdownCluster", str(fencing_token), timeout_ms=rpc_timeout_ms)

    def trigger_savepoint(self, fencing_token: str, job_id: str, target_dir: str, *, rpc_timeout_ms: int | None = None) -> str:
        return str(self._c.call("triggerSavepoint", str(fencing_token), str(job_id), str(target_dir), timeout_ms=rpc_timeout_ms))

    def stop_with_savepoint(self, fencing_token: str, job_id: str, target_dir: str, drain: bool, *, rpc_timeout_ms: int | None = None) -> str:
        return str(self._c.call("stopWithSavepoint", str(fencing_token), str(job_id), str(target_dir), drain, timeout_ms=rpc_timeout_ms))

    def rescale_job(self, fencing_token: str, job_id: str, parallelism: int, *, rpc_timeout_ms: int | None = None) -> int:
        return int(self._c.call("rescaleJob", str(fencing_token), str(job_id), parallelism, timeout_ms=rpc_timeout_ms))

    def scale_session(self, fencing_token: str, taskexecutors: int, *, rpc_timeout_ms: int | None = None) -> int:
        return int(self._c.call("scaleSession", str(fencing_token), taskexecutors, timeout_ms=rpc_timeout_ms))

    def close(self) -> None:
        self._c.close()


class DispatcherServiceHandler:
    """The Thrift side of a DispatcherService: wire values in, ``endpoint.rpc_invoke`` on them."""

    def __init__(self, endpoint: RpcTarget) -> None:
        self._e = endpoint

    @translated
    def submitJob(self, fencing_token: Any, job_graph: Any) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("submit_job", fencing_token, read_args("submitJob", lambda: (JobGraph.from_thrift(job_graph), )))
        return str(result)

    @translated
    def listJobs(self, fencing_token: Any) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("list_jobs", fencing_token, read_args("listJobs", lambda: ()))
        return [v.to_thrift() for v in result]

    @translated
    def getJob(self, fencing_token: Any, job_id: Any) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("get_job", fencing_token, read_args("getJob", lambda: (JobID(job_id), )))
        return result.to_thrift()

    @translated
    def cancelJob(self, fencing_token: Any, job_id: Any) -> Any:  # noqa: N802 - Thrift's names
        self._e.rpc_invoke("cancel_job", fencing_token, read_args("cancelJob", lambda: (JobID(job_id), )))

    @translated
    def requestJobResult(self, fencing_token: Any, job_id: Any, timeout_ms: Any) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("request_job_result", fencing_token, read_args("requestJobResult", lambda: (JobID(job_id), int(timeout_ms), )))
        return result.to_thrift()

    @translated
    def clusterInfo(self) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("cluster_info", None, read_args("clusterInfo", lambda: ()))
        return result.to_thrift()

    @translated
    def shutdownCluster(self, fencing_token: Any) -> Any:  # noqa: N802 - Thrift's names
        self._e.rpc_invoke("shutdown_cluster", fencing_token, read_args("shutdownCluster", lambda: ()))

    @translated
    def triggerSavepoint(self, fencing_token: Any, job_id: Any, target_dir: Any) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("trigger_savepoint", fencing_token, read_args("triggerSavepoint", lambda: (JobID(job_id), str(target_dir), )))
        return str(result)

    @translated
    def stopWithSavepoint(self, fencing_token: Any, job_id: Any, target_dir: Any, drain: Any) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("stop_with_savepoint", fencing_token, read_args("stopWithSavepoint", lambda: (JobID(job_id), str(target_dir), bool(drain), )))
        return str(result)

    @translated
    def rescaleJob(self, fencing_token: Any, job_id: Any, parallelism: Any) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("rescale_job", fencing_token, read_args("rescaleJob", lambda: (JobID(job_id), int(parallelism), )))
        return result

    @translated
    def scaleSession(self, fencing_token: Any, taskexecutors: Any) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("scale_session", fencing_token, read_args("scaleSession", lambda: (int(taskexecutors), )))
        return result

    def processor(self) -> Any:
        return DispatcherService.Processor(self)


class JobMasterServiceCalls(Protocol):
    """The calls of a JobMasterService, as its gateway makes them."""

    def offer_slots(self, fencing_token: str, job_id: str, resource_id: str, offers: list[SlotOffer]) -> list[SlotOffer]: ...

    def update_task_execution_state(self, fencing_token: str, update: TaskExecutionStateUpdate) -> bool: ...

    def request_split(self, fencing_token: str, job_id: str, vertex_id: str, subtask_index: int, execution_attempt_id: str, last_checkpoint_id: int) -> SplitResponse: ...

    def acknowledge_checkpoint(self, fencing_token: str, job_id: str, execution_attempt_id: str, checkpoint_id: int, snapshot: TaskStateSnapshot) -> None: ...

    def decline_checkpoint(self, fencing_token: str, job_id: str, execution_attempt_id: str, checkpoint_id: int, reason: str) -> None: ...

    def heartbeat_from_task_executor(self, fencing_token: str, job_id: str, payload: TaskExecutorHeartbeatPayload) -> AllocatedSlotReport: ...

    def close(self) -> None: ...


class JobMasterServiceGateway:
    """Calls on a JobMasterService (``jobmaster`` on its server, or ``service`` when given)."""

    SERVICE = JOB_MASTER

    def __init__(self, address: str, timeout_ms: int = 10_000, service: str | None = None,
                 tls: TlsCredentials | None = None) -> None:
        self.address = address
        self._c = RpcClient(address, service or self.SERVICE, JobMasterService.Client, timeout_ms, tls=tls)

    def offer_slots(self, fencing_token: str, job_id: str, resource_id: str, offers: list[SlotOffer], *, rpc_timeout_ms: int | None = None) -> list[SlotOffer]:
        return [SlotOffer.from_thrift(v) for v in self._c.call("offerSlots", str(fencing_token), str(job_id), str(resource_id), [v.to_thrift() for v in offers], timeout_ms=rpc_timeout_ms) or ()]

    def update_task_execution_state(self, fencing_token: str, update: TaskExecutionStateUpdate, *, rpc_timeout_ms: int | None = None) -> bool:
        return bool(self._c.call("updateTaskExecutionState", str(fencing_token), update.to_thrift(), timeout_ms=rpc_timeout_ms))

    def request_split(self, fencing_token: str, job_id: str, vertex_id: str, subtask_index: int, execution_attempt_id: str, last_checkpoint_id: int, *, rpc_timeout_ms: int | None = None) -> SplitResponse:
        return SplitResponse.from_thrift(self._c.call("requestSplit", str(fencing_token), str(job_id), str(vertex_id), subtask_index, str(execution_attempt_id), last_checkpoint_id, timeout_ms=rpc_timeout_ms))

    def acknowledge_checkpoint(self, fencing_token: str, job_id: str, execution_attempt_id: str, checkpoint_id: int, snapshot: TaskStateSnapshot, *, rpc_timeout_ms: int | None = None) -> None:
        self._c.call("acknowledgeCheckpoint", str(fencing_token), str(job_id), str(execution_attempt_id), checkpoint_id, snapshot.to_thrift(), timeout_ms=rpc_timeout_ms)

    def decline_checkpoint(self, fencing_token: str, job_id: str, execution_attempt_id: str, checkpoint_id: int, reason: str, *, rpc_timeout_ms: int | None = None) -> None:
        self._c.call("declineCheckpoint", str(fencing_token), str(job_id), str(execution_attempt_id), checkpoint_id, str(reason), timeout_ms=rpc_timeout_ms)

    def heartbeat_from_task_executor(self, fencing_token: str, job_id: str, payload: TaskExecutorHeartbeatPayload, *, rpc_timeout_ms: int | None = None) -> AllocatedSlotReport:
        return AllocatedSlotReport.from_thrift(self._c.call("heartbeatFromTaskExecutor", str(fencing_token), str(job_id), payload.to_thrift(), timeout_ms=rpc_timeout_ms))

    def close(self) -> None:
        self._c.close()


class JobMasterServiceHandler:
    """The Thrift side of a JobMasterService: wire values in, ``endpoint.rpc_invoke`` on them."""

    def __init__(self, endpoint: RpcTarget) -> None:
        self._e = endpoint

    @translated
    def offerSlots(self, fencing_token: Any, job_id: Any, resource_id: Any, offers: Any) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("offer_slots", fencing_token, read_args("offerSlots", lambda: (JobID(job_id), ResourceID(resource_id), [SlotOffer.from_thrift(v) for v in offers or ()], )))
        return [v.to_thrift() for v in result]

    @translated
    def updateTaskExecutionState(self, fencing_token: Any, update: Any) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("update_task_execution_state", fencing_token, read_args("updateTaskExecutionState", lambda: (TaskExecutionStateUpdate.from_thrift(update), )))
        return result

    @translated
    def requestSplit(self, fencing_token: Any, job_id: Any, vertex_id: Any, subtask_index: Any, execution_attempt_id: Any, last_checkpoint_id: Any) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("request_split", fencing_token, read_args("requestSplit", lambda: (JobID(job_id), JobVertexID(vertex_id), int(subtask_index), ExecutionAttemptID(execution_attempt_id), int(last_checkpoint_id), )))
        return result.to_thrift()

    @translated
    def acknowledgeCheckpoint(self, fencing_token: Any, job_id: Any, execution_attempt_id: Any, checkpoint_id: Any, snapshot: Any) -> Any:  # noqa: N802 - Thrift's names
        self._e.rpc_invoke("acknowledge_checkpoint", fencing_token, read_args("acknowledgeCheckpoint", lambda: (JobID(job_id), ExecutionAttemptID(execution_attempt_id), int(checkpoint_id), TaskStateSnapshot.from_thrift(snapshot), )))

    @translated
    def declineCheckpoint(self, fencing_token: Any, job_id: Any, execution_attempt_id: Any, checkpoint_id: Any, reason: Any) -> Any:  # noqa: N802 - Thrift's names
        self._e.rpc_invoke("decline_checkpoint", fencing_token, read_args("declineCheckpoint", lambda: (JobID(job_id), ExecutionAttemptID(execution_attempt_id), int(checkpoint_id), str(reason), )))

    @translated
    def heartbeatFromTaskExecutor(self, fencing_token: Any, job_id: Any, payload: Any) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("heartbeat_from_task_executor", fencing_token, read_args("heartbeatFromTaskExecutor", lambda: (JobID(job_id), TaskExecutorHeartbeatPayload.from_thrift(payload), )))
        return result.to_thrift()

    def processor(self) -> Any:
        return JobMasterService.Processor(self)


class ResourceManagerServiceCalls(Protocol):
    """The calls of a ResourceManagerService, as its gateway makes them."""

    def register_task_executor(self, registration: TaskExecutorRegistration) -> RegistrationResponse: ...

    def heartbeat_from_task_executor(self, fencing_token: str, registration_id: str, slot_report: SlotReport) -> None: ...

    def disconnect_task_executor(self, fencing_token: str, resource_id: str, reason: str) -> None: ...

    def request_spark_master(self, fencing_token: str, settings: dict[str, str]) -> str: ...

    def close(self) -> None: ...


class ResourceManagerServiceGateway:
    """Calls on a ResourceManagerService (``resourcemanager`` on its server, or ``service`` when given)."""

    SERVICE = RESOURCE_MANAGER

    def __init__(self, address: str, timeout_ms: int = 10_000, service: str | None = None,
                 tls: TlsCredentials | None = None) -> None:
        self.address = address
        self._c = RpcClient(address, service or self.SERVICE, ResourceManagerService.Client, timeout_ms, tls=tls)

    def register_task_executor(self, registration: TaskExecutorRegistration, *, rpc_timeout_ms: int | None = None) -> RegistrationResponse:
        return RegistrationResponse.from_thrift(self._c.call("registerTaskExecutor", registration.to_thrift(), timeout_ms=rpc_timeout_ms))

    def heartbeat_from_task_executor(self, fencing_token: str, registration_id: str, slot_report: SlotReport, *, rpc_timeout_ms: int | None = None) -> None:
        self._c.call("heartbeatFromTaskExecutor", str(fencing_token), str(registration_id), slot_report.to_thrift(), timeout_ms=rpc_timeout_ms)

    def disconnect_task_executor(self, fencing_token: str, resource_id: str, reason: str, *, rpc_timeout_ms: int | None = None) -> None:
        self._c.call("disconnectTaskExecutor", str(fencing_token), str(resource_id), str(reason), timeout_ms=rpc_timeout_ms)

    def request_spark_master(self, fencing_token: str, settings: dict[str, str], *, rpc_timeout_ms: int | None = None) -> str:
        return str(self._c.call("requestSparkMaster", str(fencing_token), dict(settings), timeout_ms=rpc_timeout_ms))

    def close(self) -> None:
        self._c.close()


class ResourceManagerServiceHandler:
    """The Thrift side of a ResourceManagerService: wire values in, ``endpoint.rpc_invoke`` on them."""

    def __init__(self, endpoint: RpcTarget) -> None:
        self._e = endpoint

    @translated
    def registerTaskExecutor(self, registration: Any) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("register_task_executor", None, read_args("registerTaskExecutor", lambda: (TaskExecutorRegistration.from_thrift(registration), )))
        return result.to_thrift()

    @translated
    def heartbeatFromTaskExecutor(self, fencing_token: Any, registration_id: Any, slot_report: Any) -> Any:  # noqa: N802 - Thrift's names
        self._e.rpc_invoke("heartbeat_from_task_executor", fencing_token, read_args("heartbeatFromTaskExecutor", lambda: (str(registration_id), SlotReport.from_thrift(slot_report), )))

    @translated
    def disconnectTaskExecutor(self, fencing_token: Any, resource_id: Any, reason: Any) -> Any:  # noqa: N802 - Thrift's names
        self._e.rpc_invoke("disconnect_task_executor", fencing_token, read_args("disconnectTaskExecutor", lambda: (ResourceID(resource_id), str(reason), )))

    @translated
    def requestSparkMaster(self, fencing_token: Any, settings: Any) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("request_spark_master", fencing_token, read_args("requestSparkMaster", lambda: (dict(settings or {}), )))
        return str(result)

    def processor(self) -> Any:
        return ResourceManagerService.Processor(self)


class TaskExecutorServiceCalls(Protocol):
    """The calls of a TaskExecutorService, as its gateway makes them."""

    def request_slot(self, rm_fencing_token: str, slot_index: int, job_id: str, allocation_id: str, profile: ResourceProfile, jobmaster_address: str, jobmaster_fencing_token: str) -> None: ...

    def submit_task(self, jobmaster_fencing_token: str, tdd: TaskDeploymentDescriptor) -> None: ...

    def cancel_task(self, jobmaster_fencing_token: str, execution_attempt_id: str) -> None: ...

    def free_slot(self, jobmaster_fencing_token: str, allocation_id: str, reason: str) -> None: ...

    def disconnect_resource_manager(self, rm_fencing_token: str, reason: str) -> None: ...

    def release_partitions(self, jobmaster_fencing_token: str, job_id: str, partition_ids: list[str]) -> None: ...

    def trigger_checkpoint(self, jobmaster_fencing_token: str, execution_attempt_id: str, checkpoint_id: int, timestamp_ms: int, exactly_once: bool, stop_mode: str = '', aligned_timeout_ms: int = -1) -> None: ...

    def notify_checkpoint_complete(self, jobmaster_fencing_token: str, execution_attempt_id: str, checkpoint_id: int) -> None: ...

    def notify_checkpoint_aborted(self, jobmaster_fencing_token: str, execution_attempt_id: str, checkpoint_id: int) -> None: ...

    def ping(self) -> str: ...

    def close(self) -> None: ...


class TaskExecutorServiceGateway:
    """Calls on a TaskExecutorService (``taskexecutor`` on its server, or ``service`` when given)."""

    SERVICE = TASK_EXECUTOR

    def __init__(self, address: str, timeout_ms: int = 10_000, service: str | None = None,
                 tls: TlsCredentials | None = None) -> None:
        self.address = address
        self._c = RpcClient(address, service or self.SERVICE, TaskExecutorService.Client, timeout_ms, tls=tls)

    def request_slot(self, rm_fencing_token: str, slot_index: int, job_id: str, allocation_id: str, profile: ResourceProfile, jobmaster_address: str, jobmaster_fencing_token: str, *, rpc_timeout_ms: int | None = None) -> None:
        self._c.call("requestSlot", str(rm_fencing_token), slot_index, str(job_id), str(allocation_id), profile.to_thrift(), str(jobmaster_address), str(jobmaster_fencing_token), timeout_ms=rpc_timeout_ms)

    def submit_task(self, jobmaster_fencing_token: str, tdd: TaskDeploymentDescriptor, *, rpc_timeout_ms: int | None = None) -> None:
        self._c.call("submitTask", str(jobmaster_fencing_token), tdd.to_thrift(), timeout_ms=rpc_timeout_ms)

    def cancel_task(self, jobmaster_fencing_token: str, execution_attempt_id: str, *, rpc_timeout_ms: int | None = None) -> None:
        self._c.call("cancelTask", str(jobmaster_fencing_token), str(execution_attempt_id), timeout_ms=rpc_timeout_ms)

    def free_slot(self, jobmaster_fencing_token: str, allocation_id: str, reason: str, *, rpc_timeout_ms: int | None = None) -> None:
        self._c.call("freeSlot", str(jobmaster_fencing_token), str(allocation_id), str(reason), timeout_ms=rpc_timeout_ms)

    def disconnect_resource_manager(self, rm_fencing_token: str, reason: str, *, rpc_timeout_ms: int | None = None) -> None:
        self._c.call("disconnectResourceManager", str(rm_fencing_token), str(reason), timeout_ms=rpc_timeout_ms)

    def release_partitions(self, jobmaster_fencing_token: str, job_id: str, partition_ids: list[str], *, rpc_timeout_ms: int | None = None) -> None:
        self._c.call("releasePartitions", str(jobmaster_fencing_token), str(job_id), [str(v) for v in partition_ids], timeout_ms=rpc_timeout_ms)

    def trigger_checkpoint(self, jobmaster_fencing_token: str, execution_attempt_id: str, checkpoint_id: int, timestamp_ms: int, exactly_once: bool, stop_mode: str = '', aligned_timeout_ms: int = -1, *, rpc_timeout_ms: int | None = None) -> None:
        self._c.call("triggerCheckpoint", str(jobmaster_fencing_token), str(execution_attempt_id), checkpoint_id, timestamp_ms, exactly_once, str(stop_mode), aligned_timeout_ms, timeout_ms=rpc_timeout_ms)

    def notify_checkpoint_complete(self, jobmaster_fencing_token: str, execution_attempt_id: str, checkpoint_id: int, *, rpc_timeout_ms: int | None = None) -> None:
        self._c.call("notifyCheckpointComplete", str(jobmaster_fencing_token), str(execution_attempt_id), checkpoint_id, timeout_ms=rpc_timeout_ms)

    def notify_checkpoint_aborted(self, jobmaster_fencing_token: str, execution_attempt_id: str, checkpoint_id: int, *, rpc_timeout_ms: int | None = None) -> None:
        self._c.call("notifyCheckpointAborted", str(jobmaster_fencing_token), str(execution_attempt_id), checkpoint_id, timeout_ms=rpc_timeout_ms)

    def ping(self, *, rpc_timeout_ms: int | None = None) -> str:
        return str(self._c.call("ping", timeout_ms=rpc_timeout_ms))

    def close(self) -> None:
        self._c.close()


class TaskExecutorServiceHandler:
    """The Thrift side of a TaskExecutorService: wire values in, ``endpoint.rpc_invoke`` on them."""

    def __init__(self, endpoint: RpcTarget) -> None:
        self._e = endpoint

    @translated
    def requestSlot(self, rm_fencing_token: Any, slot_index: Any, job_id: Any, allocation_id: Any, profile: Any, jobmaster_address: Any, jobmaster_fencing_token: Any) -> Any:  # noqa: N802 - Thrift's names
        self._e.rpc_invoke("request_slot", rm_fencing_token, read_args("requestSlot", lambda: (int(slot_index), JobID(job_id), AllocationID(allocation_id), ResourceProfile.from_thrift(profile), str(jobmaster_address), str(jobmaster_fencing_token), )))

    @translated
    def submitTask(self, jobmaster_fencing_token: Any, tdd: Any) -> Any:  # noqa: N802 - Thrift's names
        self._e.rpc_invoke("submit_task", jobmaster_fencing_token, read_args("submitTask", lambda: (TaskDeploymentDescriptor.from_thrift(tdd), )))

    @translated
    def cancelTask(self, jobmaster_fencing_token: Any, execution_attempt_id: Any) -> Any:  # noqa: N802 - Thrift's names
        self._e.rpc_invoke("cancel_task", jobmaster_fencing_token, read_args("cancelTask", lambda: (ExecutionAttemptID(execution_attempt_id), )))

    @translated
    def freeSlot(self, jobmaster_fencing_token: Any, allocation_id: Any, reason: Any) -> Any:  # noqa: N802 - Thrift's names
        self._e.rpc_invoke("free_slot", jobmaster_fencing_token, read_args("freeSlot", lambda: (AllocationID(allocation_id), str(reason), )))

    @translated
    def disconnectResourceManager(self, rm_fencing_token: Any, reason: Any) -> Any:  # noqa: N802 - Thrift's names
        self._e.rpc_invoke("disconnect_resource_manager", rm_fencing_token, read_args("disconnectResourceManager", lambda: (str(reason), )))

    @translated
    def releasePartitions(self, jobmaster_fencing_token: Any, job_id: Any, partition_ids: Any) -> Any:  # noqa: N802 - Thrift's names
        self._e.rpc_invoke("release_partitions", jobmaster_fencing_token, read_args("releasePartitions", lambda: (JobID(job_id), [str(v) for v in partition_ids or ()], )))

    @translated
    def triggerCheckpoint(self, jobmaster_fencing_token: Any, execution_attempt_id: Any, checkpoint_id: Any, timestamp_ms: Any, exactly_once: Any, stop_mode: Any, aligned_timeout_ms: Any) -> Any:  # noqa: N802 - Thrift's names
        self._e.rpc_invoke("trigger_checkpoint", jobmaster_fencing_token, read_args("triggerCheckpoint", lambda: (ExecutionAttemptID(execution_attempt_id), int(checkpoint_id), int(timestamp_ms), bool(exactly_once), str(stop_mode), int(aligned_timeout_ms), )))

    @translated
    def notifyCheckpointComplete(self, jobmaster_fencing_token: Any, execution_attempt_id: Any, checkpoint_id: Any) -> Any:  # noqa: N802 - Thrift's names
        self._e.rpc_invoke("notify_checkpoint_complete", jobmaster_fencing_token, read_args("notifyCheckpointComplete", lambda: (ExecutionAttemptID(execution_attempt_id), int(checkpoint_id), )))

    @translated
    def notifyCheckpointAborted(self, jobmaster_fencing_token: Any, execution_attempt_id: Any, checkpoint_id: Any) -> Any:  # noqa: N802 - Thrift's names
        self._e.rpc_invoke("notify_checkpoint_aborted", jobmaster_fencing_token, read_args("notifyCheckpointAborted", lambda: (ExecutionAttemptID(execution_attempt_id), int(checkpoint_id), )))

    @translated
    def ping(self) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("ping", None, read_args("ping", lambda: ()))
        return str(result)

    def processor(self) -> Any:
        return TaskExecutorService.Processor(self)
