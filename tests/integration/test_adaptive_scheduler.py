"""The adaptive scheduler on a real local cluster (issue 30): a keyed STREAMING job (a running
sum, event-time windows and a keyed process function with timers, over text files) submitted at
parallelism 4 with ``jobmanager.scheduler: adaptive`` runs on 2 TaskExecutors x 2 slots. One
TaskExecutor is a process of its own (started here, as a standalone worker joins a cluster), the
other the cluster's, whose ``slotmanager.number-of-slots.max: 2`` keeps it from starting a
replacement. The extra TaskExecutor is SIGKILLed: the job goes on at parallelism 2 from its
latest checkpoint; a new one joins: the job is rescaled back to 4. The committed output is
exactly what an unchanged run commits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import closing
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import TAG_VAR, Cli
from tests.harness import wait_until
from yarnflow.common.states import ExecutionState, JobStatus
from tests.integration.test_rescaling import WINDOW_MS, _check, write_input

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FILES, PER_FILE = 32, 600  # ~0.1 s per 40-row batch: ~12 s at parallelism 4, ~24 s at 2 (files apart in event time)
CHECKPOINTS = ["-D", "execution.checkpointing.interval=300 ms", "-D", "execution.batch-size=40"]
ADAPTIVE = ["-D", "jobmanager.scheduler=adaptive",
            "-D", "jobmanager.adaptive-scheduler.resource-stabilization-timeout=1 s",
            "-D", "jobmanager.adaptive-scheduler.scaling-interval.min=2 s", *CHECKPOINTS]


@pytest.fixture
def extra_taskexecutors(tmp_path: Path, process_tag: str) -> Iterator[Any]:
    """``start(address, name)``: a TaskExecutor process of 2 slots that registers with the
    cluster at ``address``; each is killed (by pid) at the end of the test."""
    started: list[subprocess.Popen[bytes]] = []

    def start(address: str, name: str) -> subprocess.Popen[bytes]:
        work = tmp_path / name
        work.mkdir()
        env = {**os.environ, TAG_VAR: process_tag}
        with open(work / "te.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "yarnflow.worker", "--resource-id", name, "--rm-address", address,
                 "--work-dir", str(work), "-D", "taskmanager.numberOfTaskSlots=2", "-D", "heartbeat.interval=200 ms",
                 "-D", "heartbeat.timeout=2 s"],
                env=env, stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _parallelism(gw: Any, job: str) -> int | None:
    """The job's parallelism while every one of its tasks runs (every vertex of this job is at
    the job's parallelism), else None."""
    info = gw.get_job(job)
    if info.status != JobStatus.RUNNING:
        return None
    if any(n for v in info.vertices for state, n in v.state_counts.items() if state != ExecutionState.RUNNING):
        return None
    found = {v.parallelism for v in info.vertices}
    return found.pop() if len(found) == 1 else None


def _checkpointed(gw: Any, job: str) -> bool:
    return gw.get_job(job).latest_completed_checkpoint_id > 0


def test_an_adaptive_job_follows_the_slots_it_loses_and_gets_back_and_commits_exactly(
        cli: Cli, local_cluster: Any, extra_taskexecutors: Any, tmp_path: Path) -> None:
    assert WINDOW_MS == 500
    cluster = local_cluster(taskexecutors=1, slots=2, **{"slotmanager.number-of-slots.max": "2"})
    with closing(cluster.gateway()) as gw:
        _lose_and_get_back_slots(cli, cluster, gw, extra_taskexecutors, tmp_path)


def _lose_and_get_back_slots(cli: Cli, cluster: Any, gw: Any, extra_taskexecutors: Any, tmp_path: Path) -> None:
    events = write_input(tmp_path, FILES, PER_FILE)
    extra = extra_taskexecutors(cluster.address, "te-extra-1")
    wait_until(lambda: gw.cluster_info().total_slots == 4, 60, "the extra TaskExecutor did not register")

    cli.run("run", "-a", cluster.address, "--detached", *ADAPTIVE, "job.py", str(tmp_path / "in"),
            str(tmp_path / "out"), "4", check=True)
    job = wait_until(lambda: (gw.list_jobs() or [None])[0], 30, "no job").job_id
    wait_until(lambda: _parallelism(gw, job) == 4 and _checkpointed(gw, job), 60,
               "the job did not run at parallelism 4 with a completed checkpoint", interval_s=0.2)

    extra.send_signal(signal.SIGKILL)
    extra.wait(10)
    lost = time.monotonic()
    wait_until(lambda: _parallelism(gw, job) == 2, 60,
               "the job did not go on at parallelism 2 after it lost 2 of its 4 slots", interval_s=0.2)
    down_s = time.monotonic() - lost
    assert gw.cluster_info().total_slots == 2  # not replaced: the cluster is at its max
    wait_until(lambda: "scheduler: adaptive: parallelism 2, desired 4; waiting for slots to grow to 4"
               in cli.run("info", "-a", cluster.address, job).stdout, 10, "`yarnflow info` does not say why")

    extra_taskexecutors(cluster.address, "te-extra-2")
    back = time.monotonic()
    wait_until(lambda: _parallelism(gw, job) == 4, 60,
               "the job was not rescaled back to 4 when 2 slots came back", interval_s=0.2)
    up_s = time.monotonic() - back
    print(f"down to 2 in {down_s:.1f} s, back up to 4 in {up_s:.1f} s")

    wait_until(lambda: cli.job_status("-a", cluster.address, job) == "FINISHED", 180, "the job did not finish")
    assert [j.job_id for j in gw.list_jobs()] == [job]  # one job, one id throughout
    _check(tmp_path / "out", events)


def test_a_reactive_job_follows_a_session_scaled_up_and_down_and_commits_exactly(
        cli: Cli, local_cluster: Any, tmp_path: Path) -> None:
    """``scheduler-mode: reactive``: the job takes every slot of the session. ``yarnflow session
    scale`` from 1 to 3 TaskExecutors (2 slots each): it grows to 6; REST ``PATCH /taskmanagers
    ?count=2``: it runs on at 4. Output exact."""
    cluster = local_cluster(taskexecutors=1, slots=2)
    events = write_input(tmp_path, 48, PER_FILE)
    cli.run("run", "-a", cluster.address, "--detached", "-D", "scheduler-mode=reactive", *CHECKPOINTS,
            "-D", "jobmanager.adaptive-scheduler.scaling-interval.min=1 s", "job.py", str(tmp_path / "in"),
            str(tmp_path / "out"), "2", check=True)
    with closing(cluster.gateway()) as gw:
        job = wait_until(lambda: (gw.list_jobs() or [None])[0], 30, "no job").job_id
        wait_until(lambda: _parallelism(gw, job) == 2 and _checkpointed(gw, job), 60,
                   "the job did not run at parallelism 2 with a completed checkpoint", interval_s=0.2)

        scaled = cli.run("session", "scale", "-a", cluster.address, "--taskexecutors", "3", check=True)
        assert scaled.stdout.strip() == "the session runs 3 TaskExecutors"
        assert gw.cluster_info().registered_taskexecutors == 3  # (the command waited for them)
        wait_until(lambda: _parallelism(gw, job) == 6, 60, "the job did not grow to the session's 6 slots",
                   interval_s=0.2)
        assert "scheduler: reactive: parallelism 6, desired 128" in cli.run("info", "-a", cluster.address,
                                                                            job).stdout

        web = gw.cluster_info().web_url
        request = urllib.request.Request(f"{web}/taskmanagers?count=2", method="PATCH")
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert json.load(answer) == {"taskmanagers": 2}
        wait_until(lambda: _parallelism(gw, job) == 4 and gw.cluster_info().total_slots == 4, 60,
                   "the job did not run on at 4 when the session shrank to 2 TaskExecutors", interval_s=0.2)

        wait_until(lambda: cli.job_status("-a", cluster.address, job) == "FINISHED", 180, "the job did not finish")
    _check(tmp_path / "out", events)


def test_scaling_a_session_beyond_its_max_slots_is_refused(cli: Cli, local_cluster: Any) -> None:
    cluster = local_cluster(taskexecutors=1, slots=2, **{"slotmanager.number-of-slots.max": "4"})
    refused = cli.run("session", "scale", "-a", cluster.address, "--taskexecutors", "3")
    assert refused.returncode == 1
    assert "3 TaskExecutors of 2 slots: the cluster allows 2 (slotmanager.number-of-slots.max 4)" in refused.stderr

