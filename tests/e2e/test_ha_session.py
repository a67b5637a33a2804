"""The README's local high-availability session (issue 50): `yarnflow session start --standby 1`
with the ZooKeeper keys, a STREAMING job from text files, the leading AppMaster SIGKILLed. The
TaskExecutors it started outlive it (the same processes), the standby takes over within the
session timeout the README names, adopts the running tasks, and the committed output holds every
row once. A session stopped and started again under the same cluster id starts (ZooKeeper's
mark of the old one's shutdown does not stop the new AppMasters)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.harness import assert_upsert_counts, wait_until
from tests.integration.test_ha_failover import ha_conf
from tests.integration.test_yarn_jobs import JOB, dconf, write_input

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

#: what the README says shortens a takeover (the default session timeout is 60 s)
SHORT = {"high-availability.zookeeper.client.session-timeout": "4 s"}


def _processes(module: str) -> dict[int, psutil.Process]:
    found = {}
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "-m" in cmd and module in cmd:
            found[p.pid] = p
    return found


def _leader(taskexecutors: set[int]) -> psutil.Process:
    """The AppMaster whose children the TaskExecutors are (the one that started them leads)."""
    parents = {psutil.Process(pid).ppid() for pid in taskexecutors}
    [leader] = [p for pid, p in _processes("yarnflow.am").items() if pid in parents]
    return leader


def test_the_readme_ha_session_keeps_its_taskexecutors_when_the_leader_dies(cli: Any, zk_chroot: Any,
                                                                            tmp_path: Path) -> None:
    keys = dconf({**ha_conf(zk_chroot), **SHORT})
    session = cli.start("session", "start", "--standby", "1", "--taskexecutors", "2", *keys)
    first = session.stdout.readline()  # type: ignore[union-attr]
    assert re.search(r"running at \S+:\d+", first), first + (session.stderr.read() if session.poll() else "")
    # about 10 s of work: 400 batches of 100 lines, 50 ms each, at parallelism 2
    expected = write_input(tmp_path / "in", files=8, rows=40000)
    (tmp_path / "job.py").write_text(JOB)
    run = cli.run("run", "--detached", *keys, "-D", "execution.checkpointing.interval=300 ms",
                  "-D", "execution.batch-size=100", "job.py", str(tmp_path / "in"), str(tmp_path / "out"),
                  "STREAMING", "0.05", "ha-readme", check=True)
    job_id = re.search(r"\(([0-9a-f]{32})\) submitted detached", run.stderr).group(1)  # type: ignore[union-attr]
    assert f"yarnflow info {' '.join(keys)} {job_id}" in run.stderr  # the hint names the keys
    wait_until(lambda: "completed" in cli.run("info", *keys, job_id).stdout, 60, "no checkpoint completed")

    taskexecutors = set(_processes("yarnflow.worker"))
    assert len(taskexecutors) == 2
    leader = _leader(taskexecutors)
    assert cli.job_status(*keys, job_id) == "RUNNING"
    killed_at = time.monotonic()
    leader.kill()
    # the standby leads within the session timeout (and its election): the job's status comes back
    wait_until(lambda: cli.job_status(*keys, job_id) in ("RUNNING", "FINISHED"), 30, "no new leader")
    took = time.monotonic() - killed_at
    assert took < 20, took
    assert set(_processes("yarnflow.worker")) >= taskexecutors  # the same TaskExecutor processes go on
    wait_until(lambda: cli.job_status(*keys, job_id) == "FINISHED", 120, "the job did not finish")
    assert_upsert_counts(tmp_path / "out", expected)
    # the new leader took the running tasks over (none restarted)
    logs = [p.read_text(errors="replace") for p in Path(cli.env["TMPDIR"]).rglob("appmaster*.log")]
    assert any(re.search(r"reconciled: \d+ subtasks adopted as they run, 0 to restart", text) for text in logs)
    cli.run("session", "stop", *keys, check=True)
    session.wait(30)

    # the same cluster id again: a new session, not one that was shut down
    again = cli.start("session", "start", "--taskexecutors", "1", *keys)
    line = again.stdout.readline()  # type: ignore[union-attr]
    assert re.search(r"running at \S+:\d+", line), line + (again.stderr.read() if again.wait(30) is not None else "")
    cli.run("session", "stop", *keys, check=True)
    again.wait(30)
