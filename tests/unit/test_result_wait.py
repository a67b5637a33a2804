"""The client's wait for a submitted job's result (``ClusterContext._wait``): a yarn-per-job
application ends as soon as its client fetched the result, so the call after that (the final
progress figures) meets no AppMaster; the job's result must still be the answer. Before, the
client reported the SUCCEEDED application as an error ("is not running")."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from yarnflow import executors
from yarnflow.common.errors import UnavailableError, YarnError
from yarnflow.common.ids import JobID
from yarnflow.common.messages import JobResult, JobStatusInfo
from yarnflow.common.states import JobStatus

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

JOB = JobID("0" * 32)
RESULT = JobResult(JOB, JobStatus.FINISHED, 1, 2)


class Gateway:
    """A per-job application's AppMaster: it ends once its result was fetched."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.calls: list[str] = []
        self.ended = False

    def request_job_result(self, job_id: JobID, timeout_ms: int) -> JobResult:
        self.calls.append("result")
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        self.ended = True
        return answer  # type: ignore[no-any-return]

    def get_job(self, job_id: JobID) -> JobStatusInfo:
        self.calls.append("job")
        if self.ended:
            raise YarnError("YARN application application_1_0001 is not running: FINISHED (final status SUCCEEDED)")
        return JobStatusInfo(JOB, "j", JobStatus.RUNNING, 1)


class Connection:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    def call(self, fn: Callable[[Gateway], Any], what: str = "") -> Any:
        return fn(self.gw)


def test_the_result_is_the_answer_when_the_application_ended_right_after_it_was_fetched() -> None:
    gw = Gateway([UnavailableError("not yet"), RESULT])
    result = executors.ClusterContext("", {}, progress=False)._wait(Connection(gw), JOB)  # type: ignore[arg-type]
    assert result == RESULT
    assert gw.calls == ["result", "job", "result", "job"]


def test_an_application_that_ended_before_the_result_was_fetched_is_still_an_error() -> None:
    gw = Gateway([YarnError("YARN application application_1_0001 is not running: FAILED")])
    with pytest.raises(YarnError, match="FAILED"):
        executors.ClusterContext("", {}, progress=False)._wait(Connection(gw), JOB)  # type: ignore[arg-type]
