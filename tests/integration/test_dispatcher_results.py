"""The Dispatcher's use of the JobResultStore (high availability): a new leader takes in the
results of ended jobs and does not run them again, removes their leftover JobGraphs, fails a
stored job whose JobGraph cannot be read (with a result saying why), drops a result once a
client fetched it and drops unfetched ones after ``job-result-store.retention``."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.doubles import call
from yarnflow.am.dispatcher.dispatcher import Dispatcher
from yarnflow.common.artifacts import ArtifactCache
from yarnflow.common.config import Configuration
from yarnflow.common.errors import NotFoundError
from yarnflow.common.ha import EmbeddedHaServices, JobResultEntry
from yarnflow.common.ids import JobID, JobVertexID
from yarnflow.common.messages import JobGraph, JobResult, JobVertex
from yarnflow.common.states import JobStatus

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


class _Graphs:
    """A JobGraphStore whose one stored job cannot be read."""

    def __init__(self, inner: Any, broken: str) -> None:
        self._inner, self._broken = inner, broken

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def job_ids(self) -> list[str]:
        return sorted([*self._inner.job_ids(), self._broken])

    def get(self, job_id: str) -> JobGraph:
        from yarnflow.common.errors import HighAvailabilityError

        if job_id == self._broken:
            raise HighAvailabilityError(f"the JobGraph of job {job_id} at file:///gone cannot be read")
        return self._inner.get(job_id)


def dispatcher(tmp_path: Any, ha: EmbeddedHaServices, **conf: str) -> Dispatcher:
    config = Configuration.load(conf)
    return Dispatcher(config, None, "c", (tmp_path / "storage").as_uri(), "local", lambda: None,  # type: ignore[arg-type]
                      ArtifactCache(str(tmp_path / "artifacts")), ha=ha, fencing_token="leader-2")


def graph(job_id: str) -> JobGraph:
    return JobGraph(JobID(job_id), "j", [JobVertex(JobVertexID("v"), "v", 1, 128, ["v"], is_source=True)], [],
                    artifact_uri="file:///none")


def test_a_new_leader_takes_in_ended_jobs_and_does_not_run_them_again(tmp_path: Any) -> None:
    ha = EmbeddedHaServices()
    done = JobResult(JobID("done"), JobStatus.FINISHED, 1, 2)
    ha.job_result_store().put(JobResultEntry(done, int(time.time() * 1000), extra={"name": "etl"}))
    ha.job_graph_store().put(graph("done"))  # the old leader died between writing the result and cleaning up
    ha.checkpoint_store("done").add(7, "file:///x/chk-7/_metadata")
    d = dispatcher(tmp_path, ha)
    assert d.recover_jobs() == []
    assert call(d, "get_job", "leader-2", JobID("done")).status == JobStatus.FINISHED
    assert call(d, "get_job", "leader-2", JobID("done")).name == "etl"
    assert ha.job_graph_store().job_ids() == [] and ha.checkpoint_store("done").checkpoints() == []
    assert call(d, "request_job_result", "leader-2", JobID("done"), 100) == done
    assert ha.job_result_store().get("done") is None  # fetched: no longer kept


def test_a_stored_job_whose_jobgraph_cannot_be_read_fails_with_the_reason(tmp_path: Any) -> None:
    ha = EmbeddedHaServices()
    ha.job_graph_store = lambda store=_Graphs(ha.job_graph_store(), "lost"): store  # type: ignore[method-assign]
    d = dispatcher(tmp_path, ha)
    assert d.recover_jobs() == []
    result = call(d, "request_job_result", "leader-2", JobID("lost"), 100)
    assert result.status == JobStatus.FAILED and result.failure_cause is not None
    assert "cannot be read" in result.failure_cause.message


def test_results_nobody_fetches_are_dropped_after_the_retention(tmp_path: Any) -> None:
    ha = EmbeddedHaServices()
    now = int(time.time() * 1000)
    ha.job_result_store().put(JobResultEntry(JobResult(JobID("old"), JobStatus.CANCELED, 1, 2), now - 3_600_001))
    ha.job_result_store().put(JobResultEntry(JobResult(JobID("new"), JobStatus.FAILED, 1, 2), now))
    d = dispatcher(tmp_path, ha, **{"job-result-store.retention": "1 h"})
    d._expire_results()  # noqa: SLF001 - what the retention timer runs
    assert ha.job_result_store().job_ids() == ["new"]
    with pytest.raises(NotFoundError):
        call(d, "request_job_result", "leader-2", JobID("unknown"), 100)
