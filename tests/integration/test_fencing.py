"""Fencing against the real components over real Thrift (issue 7, point 10): a TaskExecutor
refuses submitTask / cancelTask / freeSlot / releasePartitions carrying a JobMaster token other
than the job's, also once the slot and the task are gone; the Dispatcher refuses every job call
carrying a stale leader session id."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.harness import wait_until
from tests.remote_doubles import RemoteTestbed, te_with_doubles
from yarnflow.common.errors import FencingTokenError, NotFoundError
from yarnflow.common.ids import ExecutionAttemptID, JobID
from yarnflow.common.messages import JobGraph, JobVertex
from yarnflow.common.rpc.gateways import RemoteDispatcherGateway
from yarnflow.common.states import ExecutionState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

STALE = "stale-jobmaster-token"


def _stale_calls(bed: RemoteTestbed, alloc: Any, attempt: ExecutionAttemptID) -> dict[str, Callable[[], None]]:
    gw, job = bed.te_gateway, bed.jm.job_id
    return {
        "submitTask": lambda: gw.submit_task(STALE, bed.tdd(alloc)),
        "cancelTask": lambda: gw.cancel_task(STALE, attempt),
        "freeSlot": lambda: gw.free_slot(STALE, alloc, "a deposed JobMaster"),
        "releasePartitions": lambda: gw.release_partitions(STALE, job, []),
    }


def _assert_all_refused(calls: dict[str, Callable[[], None]]) -> None:
    for name, call in calls.items():
        with pytest.raises(FencingTokenError):
            call()
            pytest.fail(f"{name} with a stale token was accepted")


def test_a_task_executor_refuses_a_stale_job_master_token_while_the_slot_is_held() -> None:
    with te_with_doubles() as bed:
        alloc = bed.allocate(0)
        tdd = bed.tdd(alloc)
        bed.te_gateway.submit_task(bed.jm.token, tdd)
        _assert_all_refused(_stale_calls(bed, alloc, tdd.execution_attempt_id))
        assert str(alloc) in bed.rm.held_allocations()  # nothing was freed by the refused calls


def test_a_task_executor_refuses_a_stale_token_after_the_slot_and_task_are_gone() -> None:
    with te_with_doubles() as bed:
        alloc = bed.allocate(0)
        tdd = bed.tdd(alloc)
        bed.te_gateway.submit_task(bed.jm.token, tdd)
        wait_until(lambda: any(u.state == ExecutionState.FAILED for u in bed.jm.updates), 15, "the task did not end")
        bed.te_gateway.free_slot(bed.jm.token, alloc, "job done")
        wait_until(lambda: str(alloc) not in bed.rm.held_allocations(), 10, "the slot was not freed")
        _assert_all_refused(_stale_calls(bed, alloc, tdd.execution_attempt_id))
        # the right token is still answered as before: idempotent no-ops, or NOT_FOUND for a new task
        bed.te_gateway.cancel_task(bed.jm.token, tdd.execution_attempt_id)
        bed.te_gateway.free_slot(bed.jm.token, alloc, "again")
        bed.te_gateway.release_partitions(bed.jm.token, bed.jm.job_id, [])
        with pytest.raises(NotFoundError):
            bed.te_gateway.submit_task(bed.jm.token, bed.tdd(alloc))


def test_a_new_job_master_deposes_the_old_ones_token() -> None:
    with te_with_doubles() as bed:
        old_alloc = bed.allocate(0)
        old_token = bed.jm.token
        bed.jm.token = "new-leader-token"  # the job's JobMaster after a failover
        new_alloc = bed.allocate(1)
        with pytest.raises(FencingTokenError):
            bed.te_gateway.release_partitions(old_token, bed.jm.job_id, [])
        with pytest.raises(FencingTokenError):
            bed.te_gateway.free_slot(old_token, old_alloc, "the old JobMaster")
        with pytest.raises(FencingTokenError):
            bed.te_gateway.submit_task(old_token, bed.tdd(new_alloc))
        bed.te_gateway.release_partitions(bed.jm.token, bed.jm.job_id, [])


def test_a_token_of_no_known_job_is_refused_for_an_unknown_task_or_slot() -> None:
    with te_with_doubles() as bed:
        bed.allocate(0)
        with pytest.raises(FencingTokenError):
            bed.te_gateway.cancel_task("forged", ExecutionAttemptID.generate())
        bed.te_gateway.cancel_task(bed.jm.token, ExecutionAttemptID.generate())  # unknown task: ignored


def test_the_dispatcher_refuses_a_stale_leader_session_id(local_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = local_cluster(taskexecutors=1, slots=1)
    good = cluster.gateway()
    stale = RemoteDispatcherGateway(cluster.address, 10_000, fencing_token="a-deposed-dispatcher")
    try:
        info = good.cluster_info()
        assert info.leader_session_id and good.fencing_token == info.leader_session_id
        assert good.list_jobs() == []
        with pytest.raises(NotFoundError):
            good.get_job(JobID.generate())
        job = JobGraph(JobID.generate(), "never", [JobVertex("v", "v", 1, 1)], [], artifact_uri="file:///none")
        for name, call in {
            "submitJob": lambda: stale.submit_job(job),
            "listJobs": stale.list_jobs,
            "getJob": lambda: stale.get_job(job.job_id),
            "cancelJob": lambda: stale.cancel_job(job.job_id),
            "requestJobResult": lambda: stale.request_job_result(job.job_id, 100),
            "shutdownCluster": stale.shutdown_cluster,
        }.items():
            with pytest.raises(FencingTokenError, match="Dispatcher: .* with a stale fencing token"):
                call()
                pytest.fail(f"{name} with a stale token was accepted")
        assert stale.cluster_info().cluster_id == info.cluster_id  # not fenced: how a client learns the token
        assert good.cluster_info().registered_taskexecutors == 1  # the stale shutdown did nothing
        assert stale.refresh_fencing_token() == info.leader_session_id
        assert stale.list_jobs() == []
    finally:
        good.close()
        stale.close()
