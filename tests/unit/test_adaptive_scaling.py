"""The adaptive scheduler's decisions (am/dispatcher/adaptive.py), against a ResourceManager,
JobMasters and rescales that only record: when a job short of slots runs on at fewer
(stabilization without workers coming, the resource wait with them), when it grows (min
increase, scaling interval, every task running), reactive mode's target, and a job whose state
cannot move is not tried again. (tests/integration/test_adaptive_scheduler.py runs it for real.)"""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import Future
from typing import Any, Callable

import pytest

from tests.unit.test_job_master_core import JOB, pipeline
from yarnflow.am.dispatcher.adaptive import AdaptiveScaling
from yarnflow.am.dispatcher.rescaling import RescaleRefused
from yarnflow.common.config import Configuration
from yarnflow.common.messages import JobGraph, JobStatusInfo, VertexStatus
from yarnflow.common.states import ExecutionState, JobStatus

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

BASE = {"jobmanager.scheduler": "adaptive",
        "jobmanager.adaptive-scheduler.resource-stabilization-timeout": "2 s",
        "jobmanager.adaptive-scheduler.resource-wait-timeout": "10 s",
        "jobmanager.adaptive-scheduler.scaling-interval.min": "5 s"}


class Main:
    stopped = False

    def schedule(self, delay_ms: int, fn: Callable[[], None]) -> None:
        pass

    def execute(self, fn: Callable[..., Any], *args: Any) -> None:
        fn(*args)


class RM:
    def __init__(self) -> None:
        self.usable, self.coming = 4, 0

    def slots_for_job(self, job_id: Any) -> tuple[int, int]:
        return self.usable, self.coming


class JM:
    def __init__(self, graph: JobGraph, states: dict[ExecutionState, int] | None = None) -> None:
        self.job_id = graph.job_id
        self.job_graph = graph
        self.states = states or {ExecutionState.RUNNING: 1}

    def status_info(self) -> JobStatusInfo:
        return JobStatusInfo(self.job_id, "j", JobStatus.RUNNING, 0, vertices=[
            VertexStatus(v.vertex_id, v.name, v.parallelism, dict(self.states)) for v in self.job_graph.vertices])


class Rescales:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.answer: Future[int] = Future()

    def busy(self, job_id: Any) -> bool:
        return False

    def restart_from_checkpoint(self, jm: JM, parallelism: int) -> Future[int]:
        self.calls.append(("checkpoint", parallelism))
        return self.answer

    def start(self, jm: JM, parallelism: int) -> Future[int]:
        self.calls.append(("savepoint", parallelism))
        return self.answer


def _scaler(graph: JobGraph, monkeypatch: pytest.MonkeyPatch, **conf: str) -> tuple[Any, RM, Rescales, list[int]]:
    now = [0]
    monkeypatch.setattr(AdaptiveScaling, "_now", staticmethod(lambda: now[0]))
    rm, rescales = RM(), Rescales()
    jm = JM(dataclasses.replace(graph, config={**BASE, **conf}))
    scaler = AdaptiveScaling(Configuration.load({}), rm, rescales, {JOB: jm}, Main())  # type: ignore[arg-type]
    return scaler, rm, rescales, now


def _tick(scaler: Any, now: list[int], at_ms: int) -> None:
    now[0] = at_ms
    scaler._check_all()


def test_a_job_short_of_slots_with_none_coming_runs_on_at_fewer_after_the_stabilization_timeout(monkeypatch):
    scaler, rm, rescales, now = _scaler(pipeline(4), monkeypatch)
    _tick(scaler, now, 0)
    rm.usable = 2                                   # a TaskExecutor of 2 slots was lost
    _tick(scaler, now, 100)
    _tick(scaler, now, 2_000)
    assert rescales.calls == [] and "short of slots: 2 of 4" in scaler.reason(JOB)
    _tick(scaler, now, 2_100)                       # 2 s with no worker coming
    assert rescales.calls == [("checkpoint", 2)]


def test_a_job_short_of_slots_waits_for_workers_being_started_up_to_the_resource_wait(monkeypatch):
    scaler, rm, rescales, now = _scaler(pipeline(4), monkeypatch)
    _tick(scaler, now, 0)
    rm.usable, rm.coming = 2, 2
    _tick(scaler, now, 100)
    _tick(scaler, now, 9_000)
    assert rescales.calls == [] and "waiting for 2 being started" in scaler.reason(JOB)
    rm.usable, rm.coming = 4, 0                     # they came: nothing to do
    _tick(scaler, now, 9_500)
    assert rescales.calls == [] and scaler.reason(JOB) == ""
    rm.usable, rm.coming = 2, 2                     # lost again; this time they never come
    _tick(scaler, now, 10_000)
    _tick(scaler, now, 20_100)
    assert rescales.calls == [("checkpoint", 2)]


@pytest.mark.parametrize("conf, usable", [({}, 0), ({"jobmanager.scheduler": "default"}, 1)],
                         ids=["no-slot-at-all-is-not-a-rescale-to-zero", "a-default-scheduler-job-is-left-alone"])
def test_no_rescale(monkeypatch, conf, usable):
    scaler, rm, rescales, now = _scaler(pipeline(4), monkeypatch, **conf)
    rm.usable = usable
    for t in (0, 5_000, 60_000):
        _tick(scaler, now, t)
    assert rescales.calls == []


def test_a_job_grows_to_its_desired_parallelism_at_once_then_only_after_the_scaling_interval(monkeypatch):
    scaler, rm, rescales, now = _scaler(pipeline(4), monkeypatch, **{
        "jobmanager.adaptive-scheduler.desired-parallelism": "8"})
    rm.usable = 6
    _tick(scaler, now, 1_000)                       # never rescaled: no interval to wait for
    assert rescales.calls == [("savepoint", 6)]
    rescales.answer.set_result(6)
    scaler._running[JOB].job_graph = dataclasses.replace(pipeline(6), config=scaler._running[JOB].job_graph.config)
    rescales.answer = Future()
    rm.usable = 12                                  # more than it wants: it grows to 8, not 12
    _tick(scaler, now, 5_000)
    assert rescales.calls == [("savepoint", 6)] and "scaling-interval.min" in scaler.reason(JOB)
    _tick(scaler, now, 6_000)
    assert rescales.calls == [("savepoint", 6), ("savepoint", 8)]


def test_growth_below_the_min_increase_or_while_tasks_are_not_all_running_waits(monkeypatch):
    scaler, rm, rescales, now = _scaler(pipeline(2), monkeypatch, **{
        "jobmanager.adaptive-scheduler.desired-parallelism": "8",
        "jobmanager.adaptive-scheduler.min-parallelism-increase": "3"})
    rm.usable = 4
    _tick(scaler, now, 10_000)
    _tick(scaler, now, 20_000)
    assert rescales.calls == [] and "min-parallelism-increase" in scaler.reason(JOB)
    scaler._running[JOB].states = {ExecutionState.RUNNING: 1, ExecutionState.DEPLOYING: 1}
    rm.usable = 6
    _tick(scaler, now, 30_000)
    assert rescales.calls == [] and "every task to run" in scaler.reason(JOB)
    scaler._running[JOB].states = {ExecutionState.RUNNING: 2}
    _tick(scaler, now, 31_000)
    assert rescales.calls == [("savepoint", 6)]


def test_reactive_mode_grows_a_job_to_its_max_parallelism_and_shrinks_it_at_once(monkeypatch):
    scaler, rm, rescales, now = _scaler(pipeline(2), monkeypatch, **{
        "jobmanager.scheduler": "default", "scheduler-mode": "reactive"})
    rm.usable = 200
    _tick(scaler, now, 0)                           # as soon as it runs
    assert rescales.calls == [("savepoint", 128)]   # its max parallelism (key groups)
    rescales.calls.clear()
    scaler._running[JOB].job_graph = dataclasses.replace(pipeline(128), config=scaler._running[JOB].job_graph.config)
    scaler._jobs[JOB].last_rescale_ms = 0
    rescales.answer = Future()
    rm.usable = 3
    _tick(scaler, now, 6_000)                       # reactive: no stabilization wait
    assert rescales.calls == [("checkpoint", 3)]


def test_a_job_whose_state_cannot_move_is_not_tried_again(monkeypatch):
    scaler, rm, rescales, now = _scaler(pipeline(2), monkeypatch, **{
        "jobmanager.adaptive-scheduler.desired-parallelism": "4"})
    rm.usable = 4
    _tick(scaler, now, 0)
    assert rescales.calls == [("savepoint", 4)]
    rescales.answer.set_exception(RescaleRefused("operator 'numbers' cannot be rescaled"))
    assert "cannot be rescaled" in scaler.reason(JOB)
    for t in (60_000, 120_000):
        _tick(scaler, now, t)
    assert rescales.calls == [("savepoint", 4)]


def test_a_job_with_no_checkpoint_since_its_savepoint_runs_on_from_that_savepoint(tmp_path) -> None:
    """A job started from a savepoint records it as its first checkpoint (the savepoint's files
    dealt to its parallelism); made a savepoint again and dealt once more, key groups would be
    restored twice. With no checkpoint since, the rescale from the latest checkpoint uses the
    savepoint itself; with a later one, that checkpoint."""
    from yarnflow.am.dispatcher.rescaling import Rescales as RealRescales
    from yarnflow.common.ha import EmbeddedHaServices

    savepoint = tmp_path / "savepoint-x"
    savepoint.mkdir()
    (savepoint / "_metadata").write_text(json.dumps({"version": 1, "kind": "savepoint", "job_id": str(JOB),
                                                     "checkpoint_id": 10, "operators": {}}))
    ha = EmbeddedHaServices()
    ha.checkpoint_store(JOB).add(10, f"file://{tmp_path}/chk/chk-10/_metadata")
    rescales = RealRescales(Configuration.load({}), ha, lambda fn, *a: fn(*a), lambda g, r: None)
    jm = JM(dataclasses.replace(pipeline(4), config={"execution.savepoint.path": f"file://{savepoint}"}))
    assert rescales._latest_checkpoint(jm) == f"file://{savepoint}"  # type: ignore[arg-type]
    ha.checkpoint_store(JOB).add(11, f"file://{tmp_path}/chk/chk-11/_metadata")  # a real one since: not it
    with pytest.raises(Exception, match="chk-11"):
        rescales._latest_checkpoint(jm)  # type: ignore[arg-type]  # (its metadata does not exist here)
