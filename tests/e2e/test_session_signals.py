"""`yarnflow session start` ends on SIGTERM and SIGINT: within a few seconds the CLI exits, its
AppMaster and TaskExecutors are gone (reaped, not zombies) and the session's work dir is removed."""

from __future__ import annotations

import os
import re
import signal
import time

import psutil
import pytest

from tests.conftest import tagged_processes
from tests.harness import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

EXIT_WITHIN_S = 10.0


def _start_session(cli):  # type: ignore[no-untyped-def]
    session = cli.start("session", "start", "--target", "local", "--taskexecutors", "2", "--slots", "1",
                        "-D", "heartbeat.interval=200 ms", "-D", "heartbeat.timeout=2 s")
    line = session.stdout.readline()
    m = re.search(r"running at (\S+:\d+)", line)
    assert m, f"no address in {line!r}: {session.stderr.read() if session.poll() is not None else ''}"
    address = m.group(1)
    answer = cli.run("list", "--address", address, "--json", timeout=60)
    assert answer.returncode == 0, answer.stderr  # the session answers
    return session, address


def _cluster_processes(tag: str, cli_pid: int) -> tuple[psutil.Process, list[psutil.Process], str]:
    """The session's AppMaster, its TaskExecutors and its work dir (from the AppMaster's flags)."""
    appmaster, workers = None, []
    for proc in tagged_processes(tag):
        try:
            cmd = proc.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "yarnflow.am" in cmd:
            appmaster = proc
        elif "yarnflow.worker" in cmd:
            workers.append(proc)
    assert appmaster is not None, "no AppMaster process found"
    assert appmaster.ppid() == cli_pid
    cmd = appmaster.cmdline()
    work_dir = cmd[cmd.index("--work-dir") + 1]
    return appmaster, workers, work_dir


def _gone(proc: psutil.Process) -> bool:
    """True once ``proc`` is reaped; a zombie (exited, not waited for) is not gone."""
    try:
        return not proc.is_running()  # also False when the pid was reused by a new process
    except psutil.NoSuchProcess:
        return True


def _left(procs: list[psutil.Process]) -> list[str]:
    """The processes of ``procs`` that still exist, described."""
    left = []
    for p in procs:
        if not _gone(p):
            try:
                left.append(f"pid {p.pid} ({p.status()}): {' '.join(p.cmdline()[:4])}")
            except psutil.Error:
                left.append(f"pid {p.pid}")
    return left


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_ends_the_session_its_processes_and_its_work_dir(cli, signum):
    session, _address = _start_session(cli)
    appmaster, workers, work_dir = _cluster_processes(cli.tag, session.pid)
    assert len(workers) == 2, workers
    assert os.path.isdir(work_dir)

    sent = time.monotonic()
    session.send_signal(signum)
    try:
        session.wait(EXIT_WITHIN_S)
    except Exception:  # noqa: BLE001 - report what hangs; the fixture kills it
        pytest.fail(f"`yarnflow session start` still runs {EXIT_WITHIN_S:.0f} s after {signum.name}; "
                    f"AppMaster {appmaster.pid} status: "
                    f"{appmaster.status() if not _gone(appmaster) else 'gone'}")
    took = time.monotonic() - sent
    assert session.returncode == 0, session.stderr.read()
    assert "session stopped" in session.stdout.read()

    procs = [appmaster, *workers]
    wait_until(lambda: not _left(procs), 2.0, lambda: f"still there {took:.1f} s after {signum.name}: {_left(procs)}",
               interval_s=0.1)
    # nothing of the work dir is left but the session's logs (kept to look into; --remove-logs removes them)
    assert os.listdir(work_dir) == ["log"], f"work dir {work_dir} left behind: {os.listdir(work_dir)}"
