"""Session mode: one long-running local cluster, many jobs, list and cancel."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.e2e.jobs import WORDCOUNT, reference_wordcount, slow_job, write_text_corpus
from tests.harness import wait_until
from yarnflow.common.errors import RpcConnectionError
from yarnflow.common.rpc.gateways import RemoteDispatcherGateway

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def _address(session) -> str:
    line = session.stdout.readline()
    m = re.search(r"running at (\S+:\d+)", line)
    assert m, f"no address in {line!r}: {session.stderr.read() if session.poll() is not None else ''}"
    return m.group(1)


def _jobs(cli, address):
    proc = cli.run("list", "--address", address, "--json", check=True)
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_session_runs_lists_cancels_and_stops(cli, tmp_path):
    session = cli.start("session", "start", "--target", "local", "--taskexecutors", "2", "--slots", "2",
                        "-D", "execution.batch-size=10")
    address = _address(session)
    # closed by default (mutual TLS): a client without the session's credentials is refused, the
    # CLI finds them by the address
    plain = RemoteDispatcherGateway(address, 3000)
    with pytest.raises(RpcConnectionError):
        plain.cluster_info()
    plain.close()

    # two jobs, one after the other, on the same cluster
    lines = write_text_corpus(str(tmp_path / "in"), files=2, lines_per_file=1000)
    for i in range(2):
        out = tmp_path / f"out{i}"
        proc = cli.run("run", "--address", address, WORDCOUNT, "--input", str(tmp_path / "in"), "--output", str(out))
        assert proc.returncode == 0, proc.stderr
        t = pq.read_table(str(out))
        assert dict(zip(t["word"].to_pylist(), t["count"].to_pylist())) == reference_wordcount(lines)

    jobs = _jobs(cli, address)
    assert [j["state"] for j in jobs] == ["FINISHED", "FINISHED"]
    assert all(j["name"] == "wordcount" and j["duration_s"] >= 0 and j["start"] for j in jobs)

    # a long job, cancelled from another client
    runner = cli.start("run", "--address", address, "--no-progress",
                       slow_job(str(tmp_path / "slow.py"), str(tmp_path / "slow_out"), rows=2000))
    slow = wait_until(lambda: next((j for j in _jobs(cli, address) if j["name"] == "slow" and j["state"] == "RUNNING"),
                                    None), 60, "the slow job did not reach RUNNING", interval_s=0.2)
    table = cli.run("list", "--address", address, check=True).stdout
    assert slow["id"] in table and "RUNNING" in table

    proc = cli.run("cancel", "--address", address, slow["id"])
    assert proc.returncode == 0, proc.stderr
    runner.wait(60)
    assert runner.returncode == 1
    assert "canceled" in runner.stderr.read()
    assert next(j for j in _jobs(cli, address) if j["id"] == slow["id"])["state"] == "CANCELED"
    assert not (tmp_path / "slow_out" / "part-00000.parquet").exists()  # nothing committed by a canceled job

    # cancelling again, or an unknown job: a clear one-line error
    again = cli.run("cancel", "--address", address, slow["id"])
    assert again.returncode == 1 and "already ended CANCELED" in again.stderr
    unknown = cli.run("cancel", "--address", address, "0" * 32)
    assert unknown.returncode == 1 and "no job" in unknown.stderr

    stop = cli.run("session", "stop", "--address", address)
    assert stop.returncode == 0, stop.stderr
    session.wait(30)
    assert session.returncode == 0
    after = cli.run("list", "--address", address)
    assert after.returncode == 1 and "cannot reach" in after.stderr
    # the log folder it printed at start outlives it (the rest of its work dir does not)
    said = session.stderr.read()
    folder = re.search(r"logs:\s+(\S+)", said).group(1)
    assert f"logs kept in {folder}" in said
    names = sorted(os.listdir(folder))
    assert "appmaster.log" in names and len(names) >= 3, names  # and the TaskExecutors'
    assert slow["id"] in (Path(folder) / "appmaster.log").read_text()  # what the session did is still there
    assert os.listdir(os.path.dirname(folder)) == ["log"]


def test_a_session_started_with_remove_logs_leaves_nothing(cli) -> None:
    session = cli.start("session", "start", "--target", "local", "--taskexecutors", "1", "--remove-logs")
    address = _address(session)
    assert cli.run("session", "stop", "--address", address).returncode == 0
    session.wait(30)
    folder = re.search(r"logs:\s+(\S+)", session.stderr.read()).group(1)
    assert session.returncode == 0 and not os.path.exists(os.path.dirname(folder))


def test_scaling_a_session_waits_for_taskexecutors_that_stay(cli, tmp_path):
    """``session scale`` returns once the TaskExecutors it asked for are registered
    (``--timeout``: past it the command fails saying how many there are, and the session goes on
    starting them; ``--no-wait``: once asked for). The TaskExecutors started for a client's call
    stay: they were started from the RPC thread of the call, and Linux's parent-death signal,
    sent when that *thread* ends, killed each as the client hung up (it was replaced: REST read
    one TaskExecutor short)."""
    session = cli.start("session", "start", "--target", "local", "--taskexecutors", "1", "--slots", "1")
    address = _address(session)
    logs = next(line.split("logs:", 1)[1].strip() for line in session.stderr if "logs:" in line)
    waited = cli.run("session", "scale", "--address", address, "--taskexecutors", "2", check=True)
    assert waited.stdout.strip() == "the session runs 2 TaskExecutors"
    late = cli.run("session", "scale", "--address", address, "--taskexecutors", "3", "--timeout", "0")
    assert late.returncode == 1
    assert "asked for 3 TaskExecutors; 2 registered after 0 s" in late.stderr, late.stderr
    asked = cli.run("session", "scale", "--address", address, "--taskexecutors", "3", "--no-wait", check=True)
    assert asked.stdout.strip() == "the session was asked to run 3 TaskExecutors"
    cli.run("session", "scale", "--address", address, "--taskexecutors", "3", check=True)
    time.sleep(1.5)  # (a TaskExecutor killed with its call's thread went within 0.1 s)
    log = Path(logs, "appmaster.log").read_text()
    assert "process exited" not in log and "killed by signal" not in log, log
    assert log.count("started TaskExecutor") == 3, log
    cli.run("session", "stop", "--address", address, check=True)
    assert session.wait(60) == 0
