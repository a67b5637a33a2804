# Generated from thrift/*.thrift by `python -m yarnflow.common.rpc.codegen`: do not edit by hand.
"""Gateway (client side), handler (server side) and method table of DispatcherService."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from yarnflow.common.ids import JobID
from yarnflow.common.messages import (
    ClusterInfo,
    JobGraph,
    JobResult,
    JobStatusInfo,
)
from yarnflow.common.rpc.client import RpcClient
from yarnflow.common.rpc.endpoint import RpcTarget, read_args, translated
from yarnflow.common.rpc.gen.yarnflow_rpc import DispatcherService

if TYPE_CHECKING:
    from yarnflow.common.security import TlsCredentials

DISPATCHER = "dispatcher"

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
