# Generated from thrift/*.thrift by `python -m yarnflow.common.rpc.codegen`: do not edit by hand.
"""Gateway (client side), handler (server side) and method table of TaskExecutorService."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from yarnflow.common.ids import AllocationID, ExecutionAttemptID, JobID, JobVertexID
from yarnflow.common.messages import (
    JobReconnectReport,
    ResourceProfile,
    TaskDeploymentDescriptor,
    ThreadInfo,
    ThreadInfoSample,
)
from yarnflow.common.rpc.client import RpcClient
from yarnflow.common.rpc.endpoint import RpcTarget, read_args, translated
from yarnflow.common.rpc.gen.yarnflow_rpc import TaskExecutorService

if TYPE_CHECKING:
    from yarnflow.common.security import TlsCredentials

TASK_EXECUTOR = "taskexecutor"

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
    "reconnect_job": True,
    "request_thread_dump": False,
    "request_thread_info_samples": False,
    "ping": False,
}


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

    def reconnect_job(self, rm_fencing_token: str, job_id: str, jobmaster_address: str, jobmaster_fencing_token: str) -> JobReconnectReport: ...

    def request_thread_dump(self) -> list[ThreadInfo]: ...

    def request_thread_info_samples(self, job_id: str, vertex_id: str, subtasks: list[int], num_samples: int, delay_ms: int, max_depth: int) -> list[ThreadInfoSample]: ...

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

    def reconnect_job(self, rm_fencing_token: str, job_id: str, jobmaster_address: str, jobmaster_fencing_token: str, *, rpc_timeout_ms: int | None = None) -> JobReconnectReport:
        return JobReconnectReport.from_thrift(self._c.call("reconnectJob", str(rm_fencing_token), str(job_id), str(jobmaster_address), str(jobmaster_fencing_token), timeout_ms=rpc_timeout_ms))

    def request_thread_dump(self, *, rpc_timeout_ms: int | None = None) -> list[ThreadInfo]:
        return [ThreadInfo.from_thrift(v) for v in self._c.call("requestThreadDump", timeout_ms=rpc_timeout_ms) or ()]

    def request_thread_info_samples(self, job_id: str, vertex_id: str, subtasks: list[int], num_samples: int, delay_ms: int, max_depth: int, *, rpc_timeout_ms: int | None = None) -> list[ThreadInfoSample]:
        return [ThreadInfoSample.from_thrift(v) for v in self._c.call("requestThreadInfoSamples", str(job_id), str(vertex_id), [v for v in subtasks], num_samples, delay_ms, max_depth, timeout_ms=rpc_timeout_ms) or ()]

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
    def reconnectJob(self, rm_fencing_token: Any, job_id: Any, jobmaster_address: Any, jobmaster_fencing_token: Any) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("reconnect_job", rm_fencing_token, read_args("reconnectJob", lambda: (JobID(job_id), str(jobmaster_address), str(jobmaster_fencing_token), )))
        return result.to_thrift()

    @translated
    def requestThreadDump(self) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("request_thread_dump", None, read_args("requestThreadDump", lambda: ()))
        return [v.to_thrift() for v in result]

    @translated
    def requestThreadInfoSamples(self, job_id: Any, vertex_id: Any, subtasks: Any, num_samples: Any, delay_ms: Any, max_depth: Any) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("request_thread_info_samples", None, read_args("requestThreadInfoSamples", lambda: (JobID(job_id), JobVertexID(vertex_id), [int(v) for v in subtasks or ()], int(num_samples), int(delay_ms), int(max_depth), )))
        return [v.to_thrift() for v in result]

    @translated
    def ping(self) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("ping", None, read_args("ping", lambda: ()))
        return str(result)

    def processor(self) -> Any:
        return TaskExecutorService.Processor(self)
