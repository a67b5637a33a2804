# Generated from thrift/*.thrift by `python -m yarnflow.common.rpc.codegen`: do not edit by hand.
"""Gateway (client side), handler (server side) and method table of ResourceManagerService."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from yarnflow.common.ids import ResourceID
from yarnflow.common.messages import (
    RegistrationResponse,
    SlotReport,
    TaskExecutorRegistration,
)
from yarnflow.common.rpc.client import RpcClient
from yarnflow.common.rpc.endpoint import RpcTarget, read_args, translated
from yarnflow.common.rpc.gen.yarnflow_rpc import ResourceManagerService

if TYPE_CHECKING:
    from yarnflow.common.security import TlsCredentials

RESOURCE_MANAGER = "resourcemanager"

#: ResourceManagerService's methods: Python name -> whether the IDL fences it
RESOURCE_MANAGER_METHODS = {
    "register_task_executor": False,
    "heartbeat_from_task_executor": True,
    "disconnect_task_executor": True,
    "request_spark_master": True,
}


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
