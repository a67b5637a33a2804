"""The gateways components and clients use: generated from the IDL (common/rpc/services/),
plus the Dispatcher's client gateway, which keeps the Dispatcher's fencing token for its caller.

``Remote*Gateway`` classes are the client side (dataclass messages in, dataclass messages
out, project exceptions on failure); the handlers of the server side are in common/rpc/services/ too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from yarnflow.common import ids
from yarnflow.common.messages import ClusterInfo, JobGraph, JobResult, JobStatusInfo
from yarnflow.common.rpc.services import (
    DISPATCHER,
    JOB_MASTER,
    RESOURCE_MANAGER,
    TASK_EXECUTOR,
    DispatcherServiceGateway,
    DispatcherServiceHandler,
    JobMasterServiceGateway,
    JobMasterServiceHandler,
    ResourceManagerServiceGateway,
    ResourceManagerServiceHandler,
    TaskExecutorServiceGateway,
    TaskExecutorServiceHandler,
)

if TYPE_CHECKING:
    from yarnflow.common.security import TlsCredentials

__all__ = [
    "job_master_service",
    "DISPATCHER", "JOB_MASTER", "RESOURCE_MANAGER", "TASK_EXECUTOR", "RemoteDispatcherGateway",
    "RemoteJobMasterGateway", "RemoteResourceManagerGateway", "RemoteTaskExecutorGateway",
    "DispatcherServiceHandler", "JobMasterServiceHandler", "ResourceManagerServiceHandler",
    "TaskExecutorServiceHandler",
]


def job_master_service(job_id: str) -> str:
    """The service a job's JobMaster is served as on its AppMaster's port (each JobMaster is an
    endpoint of its own, as in Flink: a TaskExecutor calls it directly, not through the
    Dispatcher)."""
    return f"{JOB_MASTER}/{job_id}"


# ---- client side ---------------------------------------------------------------------------

class RemoteDispatcherGateway:
    """The Dispatcher's calls. Every call that acts on a job or the cluster carries the
    Dispatcher's fencing token (its leader session id): ``fencing_token`` when given, else the
    one read from ``clusterInfo`` at the first such call (and kept). A call that the Dispatcher
    refuses as stale raises ``FencingTokenError``: the client talks to a deposed leader; it
    may ``refresh_fencing_token()`` once it knows the new leader is the one it wants."""

    def __init__(self, address: str, timeout_ms: int = 10_000, fencing_token: str | None = None,
                 tls: TlsCredentials | None = None) -> None:
        self.address = address
        self._c = DispatcherServiceGateway(address, timeout_ms, tls=tls)
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
        return ids.JobID(self._c.submit_job(self.fencing_token, job_graph))

    def list_jobs(self) -> list[JobStatusInfo]:
        return self._c.list_jobs(self.fencing_token)

    def get_job(self, job_id: str) -> JobStatusInfo:
        return self._c.get_job(self.fencing_token, job_id)

    def cancel_job(self, job_id: str) -> None:
        self._c.cancel_job(self.fencing_token, job_id)

    def request_job_result(self, job_id: str, timeout_ms: int) -> JobResult:
        return self._c.request_job_result(self.fencing_token, job_id, timeout_ms, rpc_timeout_ms=timeout_ms + 10_000)

    def cluster_info(self) -> ClusterInfo:
        """Not fenced; the first answer also gives this gateway its fencing token."""
        info = self._c.cluster_info()
        if self._token is None:
            self._token = info.leader_session_id
        return info

    def shutdown_cluster(self) -> None:
        self._c.shutdown_cluster(self.fencing_token)

    def trigger_savepoint(self, job_id: str, target_dir: str = "", timeout_ms: int = 15 * 60_000) -> str:
        """The URL of a new savepoint of the job (waits up to ``timeout_ms`` for it)."""
        return self._c.trigger_savepoint(self.fencing_token, job_id, target_dir, rpc_timeout_ms=timeout_ms)

    def stop_with_savepoint(self, job_id: str, target_dir: str = "", drain: bool = False,
                            timeout_ms: int = 15 * 60_000) -> str:
        """Stop the job with a savepoint; the savepoint's URL once it is complete."""
        return self._c.stop_with_savepoint(self.fencing_token, job_id, target_dir, drain, rpc_timeout_ms=timeout_ms)

    def rescale_job(self, job_id: str, parallelism: int, timeout_ms: int = 15 * 60_000) -> int:
        """Rescale the running job to ``parallelism``; returns it once the job runs with it."""
        return self._c.rescale_job(self.fencing_token, job_id, parallelism, rpc_timeout_ms=timeout_ms)

    def scale_session(self, taskexecutors: int) -> int:
        """Have the cluster run ``taskexecutors`` TaskExecutors from now on."""
        return self._c.scale_session(self.fencing_token, taskexecutors)

    def close(self) -> None:
        self._c.close()


#: the other services' gateways are generated from the IDL as they are (common/rpc/services/)
RemoteResourceManagerGateway = ResourceManagerServiceGateway
RemoteJobMasterGateway = JobMasterServiceGateway
RemoteTaskExecutorGateway = TaskExecutorServiceGateway
