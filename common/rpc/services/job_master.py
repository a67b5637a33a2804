# Generated from thrift/*.thrift by `python -m yarnflow.common.rpc.codegen`: do not edit by hand.
"""Gateway (client side), handler (server side) and method table of JobMasterService."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from yarnflow.common.ids import ExecutionAttemptID, JobID, JobVertexID, ResourceID
from yarnflow.common.messages import (
    AllocatedSlotReport,
    SlotOffer,
    SplitResponse,
    TaskExecutionStateUpdate,
    TaskExecutorHeartbeatPayload,
    TaskStateSnapshot,
)
from yarnflow.common.rpc.client import RpcClient
from yarnflow.common.rpc.endpoint import RpcTarget, read_args, translated
from yarnflow.common.rpc.gen.yarnflow_rpc import JobMasterService

if TYPE_CHECKING:
    from yarnflow.common.security import TlsCredentials

JOB_MASTER = "jobmaster"

#: JobMasterService's methods: Python name -> whether the IDL fences it
JOB_MASTER_METHODS = {
    "offer_slots": True,
    "update_task_execution_state": True,
    "request_split": True,
    "acknowledge_checkpoint": True,
    "decline_checkpoint": True,
    "read_artifact": True,
    "heartbeat_from_task_executor": True,
}


class JobMasterServiceCalls(Protocol):
    """The calls of a JobMasterService, as its gateway makes them."""

    def offer_slots(self, fencing_token: str, job_id: str, resource_id: str, offers: list[SlotOffer]) -> list[SlotOffer]: ...

    def update_task_execution_state(self, fencing_token: str, update: TaskExecutionStateUpdate) -> bool: ...

    def request_split(self, fencing_token: str, job_id: str, vertex_id: str, subtask_index: int, execution_attempt_id: str, last_checkpoint_id: int) -> SplitResponse: ...

    def acknowledge_checkpoint(self, fencing_token: str, job_id: str, execution_attempt_id: str, checkpoint_id: int, snapshot: TaskStateSnapshot) -> None: ...

    def decline_checkpoint(self, fencing_token: str, job_id: str, execution_attempt_id: str, checkpoint_id: int, reason: str) -> None: ...

    def read_artifact(self, fencing_token: str, job_id: str, sha256: str, offset: int, length: int) -> bytes: ...

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

    def read_artifact(self, fencing_token: str, job_id: str, sha256: str, offset: int, length: int, *, rpc_timeout_ms: int | None = None) -> bytes:
        return bytes(self._c.call("readArtifact", str(fencing_token), str(job_id), str(sha256), offset, length, timeout_ms=rpc_timeout_ms) or b'')

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
    def readArtifact(self, fencing_token: Any, job_id: Any, sha256: Any, offset: Any, length: Any) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("read_artifact", fencing_token, read_args("readArtifact", lambda: (JobID(job_id), str(sha256), int(offset), int(length), )))
        return bytes(result)

    @translated
    def heartbeatFromTaskExecutor(self, fencing_token: Any, job_id: Any, payload: Any) -> Any:  # noqa: N802 - Thrift's names
        result = self._e.rpc_invoke("heartbeat_from_task_executor", fencing_token, read_args("heartbeatFromTaskExecutor", lambda: (JobID(job_id), TaskExecutorHeartbeatPayload.from_thrift(payload), )))
        return result.to_thrift()

    def processor(self) -> Any:
        return JobMasterService.Processor(self)
