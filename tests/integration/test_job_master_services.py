"""Each running job's JobMaster is a service of its own on the AppMaster's port
(``jobmaster/<job id>``), which TaskExecutors call directly; when the job has ended there, or
never ran, the AppMaster answers NOT_FOUND (the TaskExecutor then frees the job's slots). Calls
the services do not know end one connection or one call, never the server."""

from __future__ import annotations

from typing import Any

import pytest

from yarnflow.common.errors import NotFoundError, RpcConnectionError, RpcError
from yarnflow.common.ids import JobID, ResourceID
from yarnflow.common.messages import TaskExecutorHeartbeatPayload
from yarnflow.common.rpc.client import RpcClient
from yarnflow.common.rpc.gateways import RemoteJobMasterGateway, job_master_service
from yarnflow.common.rpc.gen.yarnflow_rpc import DispatcherService

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _heartbeat(address: str, job_id: str) -> Any:
    gateway = RemoteJobMasterGateway(address, 5000, service=job_master_service(job_id))
    try:
        return gateway.heartbeat_from_task_executor("any-token", job_id, TaskExecutorHeartbeatPayload(
            ResourceID("te-probe"), [], []))
    finally:
        gateway.close()


def test_a_jobs_jobmaster_is_not_found_before_it_runs_and_after_it_ended(local_cluster) -> None:  # type: ignore[no-untyped-def]
    import yarnflow
    from yarnflow import executors

    cluster = local_cluster(taskexecutors=1, slots=2)
    with pytest.raises(NotFoundError, match="no running job"):
        _heartbeat(cluster.address, str(JobID.generate()))
    executors.set_context(executors.ClusterContext(cluster.address, {}, progress=False))
    try:
        env = yarnflow.StreamExecutionEnvironment(parallelism=2)
        env.from_collection([{"k": i % 3, "v": i} for i in range(30)]).key_by("k").sum("v").collect()
        result = env.execute("served")
    finally:
        executors.set_context(None)
    assert sorted(r["v"] for r in result.collected().to_pylist()) == [135, 145, 155]
    with pytest.raises(NotFoundError):  # its service went with the job
        _heartbeat(cluster.address, str(result.job_id))


def test_an_unknown_method_or_service_ends_a_call_or_a_connection_not_the_server(local_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = local_cluster(taskexecutors=1, slots=1)
    wrong = RpcClient(cluster.address, job_master_service("j"), DispatcherService.Client, 5000)
    try:
        with pytest.raises(RpcError, match="Unknown function clusterInfo"):
            wrong.call("clusterInfo")  # a JobMaster service has no such method
    finally:
        wrong.close()
    nowhere = RpcClient(cluster.address, "nosuchservice", DispatcherService.Client, 5000)
    try:
        with pytest.raises(RpcConnectionError):
            nowhere.call("clusterInfo")
    finally:
        nowhere.close()
    gateway = cluster.gateway()
    try:
        assert gateway.cluster_info().registered_taskexecutors == 1
    finally:
        gateway.close()
