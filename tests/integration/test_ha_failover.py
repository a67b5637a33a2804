"""ZooKeeper high availability on a real local cluster (issue 9): an active AppMaster and a
standby, a real ZooKeeper server (tests/zookeeper.py), real TaskExecutor processes.

The leader is SIGKILLed mid-job (STREAMING with checkpoints, and BATCH), frozen past its session
timeout and resumed (it must notice, suspend its jobs and be refused everywhere, while the new
leader takes the running tasks over), ZooKeeper is
restarted under a running job; every time the job's committed output holds each input row once.
A finished job is not run again by the next leader; the CLI finds the leader in ZooKeeper and
follows it; an unreachable quorum is one clear error."""

from __future__ import annotations

import collections
import json
import os
import random
import re
import signal
import threading
import time
from typing import Any

import pyarrow.dataset as pads
import pytest

import yarnflow
from tests.harness import wait_until
from tests.integration.test_batch_exactly_once import _committed_counts, _pipeline, _to_row, _write_files
from tests.integration.test_streaming_exactly_once import CHECKPOINTS, _build, _write, assert_upsert_totals
from yarnflow import executors
from yarnflow.common.config import Configuration
from yarnflow.common.errors import NotLeaderRpcError
from yarnflow.common.rpc.gateways import RemoteDispatcherGateway
from yarnflow.common.states import JobStatus
from yarnflow.connection import ClusterConnection

pytestmark = [pytest.mark.integration]

HA_KEYS = ("high-availability.type", "high-availability.zookeeper.quorum", "high-availability.zookeeper.path.root",
           "high-availability.cluster-id", "high-availability.storageDir",
           "high-availability.zookeeper.client.session-timeout",
           "high-availability.zookeeper.client.connection-timeout", "high-availability.zookeeper.client.retry-wait")
# TaskExecutors must wait for the next leader longer than a failover takes
HA_CLUSTER = {"taskmanager.registration.timeout": "20 s", "heartbeat.timeout": "4 s"}


def ha_conf(chroot: Any) -> dict[str, str]:
    strings = chroot.config.to_strings()
    return {k: strings[k] for k in HA_KEYS}


@pytest.fixture
def ha_cluster(zk_chroot, local_cluster):  # type: ignore[no-untyped-def]
    """``ha_cluster(standby=1, **conf)``: a LocalCluster with ZooKeeper HA and ``standby`` more
    AppMasters; ``.ha`` holds the HA keys a client needs."""
    def start(standby: int = 1, taskexecutors: int = 2, slots: int = 2, **conf: str) -> Any:
        cluster = local_cluster(taskexecutors, slots, standby=standby,
                                **{**ha_conf(zk_chroot), **HA_CLUSTER, **conf})
        cluster.ha_keys = ha_conf(zk_chroot)
        return cluster
    return start


def run_following_the_leader(cluster: Any, build: Any, name: str, conf: dict[str, str],
                             parallelism: int = 2) -> tuple[threading.Thread, dict[str, Any]]:
    """Run the job as a client that knows only the HA keys (no address), in a thread."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        ctx = executors.ClusterContext("", {**cluster.ha_keys, **conf}, progress=False)
        executors.set_context(ctx)
        try:
            env = yarnflow.StreamExecutionEnvironment(parallelism=parallelism)
            build(env)
            outcome["result"] = env.execute(name)
        except BaseException as exc:  # noqa: BLE001
            outcome["error"] = exc
        finally:
            executors.set_context(None)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def connection(cluster: Any) -> ClusterConnection:
    return ClusterConnection(Configuration.load(cluster.ha_keys))


def job_info(conn: ClusterConnection, name: str) -> Any:
    return next((j for j in conn.call(lambda gw: gw.list_jobs()) if j.name == name), None)


def leader(cluster: Any) -> tuple[str, Any]:
    address = cluster.leader_address(10)
    return address, cluster.appmasters()[address]


def wait_for_new_leader(cluster: Any, old: str, timeout_s: float = 20) -> str:
    return wait_until(lambda: (a := cluster.leader_address(timeout_s)) != old and a, timeout_s,
                      f"no AppMaster took over from {old}")


def exact_rows(out: Any, rows: list[str]) -> None:
    table = pads.dataset(str(out), format="parquet").to_table()
    got = collections.Counter(f"{k} {f} {r}" for k, f, r in zip(table["k"].to_pylist(), table["file"].to_pylist(),
                                                                table["row"].to_pylist()))
    missing = sum((collections.Counter(rows) - got).values())
    repeated = sum((got - collections.Counter(rows)).values())
    assert (missing, repeated) == (0, 0), f"{missing} rows lost, {repeated} rows committed more than once"


@pytest.mark.timeout(240)
def test_sigkill_of_the_leader_mid_streaming_job_loses_and_repeats_nothing(ha_cluster, tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    rows = _write(src)
    cluster = ha_cluster(standby=1)
    old, proc = leader(cluster)
    thread, outcome = run_following_the_leader(cluster, _build(src, out, False), "ha-streaming", CHECKPOINTS)
    conn = connection(cluster)
    try:
        wait_until(lambda: (j := job_info(conn, "ha-streaming")) is not None and j.latest_completed_checkpoint_id >= 2,
                   60, "the job never completed two checkpoints", interval_s=0.02)
        proc.send_signal(signal.SIGKILL)
        new = wait_for_new_leader(cluster, old)
        thread.join(200)
        assert "error" not in outcome, outcome.get("error")
        assert outcome["result"].status == JobStatus.FINISHED
        info = job_info(conn, "ha-streaming")
    finally:
        conn.close()
    assert new in cluster.appmasters() and new != old
    assert info.status == JobStatus.FINISHED
    exact_rows(out, rows)
    assert re.search(r"job \S+ resumes from checkpoint [1-9]", _appmaster_log(cluster, cluster.appmasters()[new])), \
        "the new leader did not resume the job from its latest checkpoint"
    # the old leader's TaskExecutors registered with the new one: none was started in their place
    workers = [p for p in cluster._descendants() if "yarnflow.worker" in p.cmdline()]  # (not Python workers)
    assert len(workers) == 2, [" ".join(p.cmdline()[:5]) for p in workers]


@pytest.mark.timeout(240)
def test_sigkill_of_the_leader_mid_batch_job_counts_every_row_once(ha_cluster, tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    expected = _write_files(src, files=12, rows=6000)

    def slow_row(line: dict) -> dict:
        time.sleep(0.001)
        return _to_row(line)

    cluster = ha_cluster(standby=1)
    old, proc = leader(cluster)
    thread, outcome = run_following_the_leader(cluster, _pipeline(src, out, slow_row), "ha-batch",
                                               {"execution.batch-size": "100"})
    conn = connection(cluster)
    try:
        wait_until(lambda: (j := job_info(conn, "ha-batch")) is not None and j.status == JobStatus.RUNNING
                   and any(v.state_counts for v in j.vertices), 60, "the batch job never ran", interval_s=0.02)
        time.sleep(random.Random(3).uniform(0.5, 1.5))
        proc.send_signal(signal.SIGKILL)
        wait_for_new_leader(cluster, old)
        thread.join(200)
    finally:
        conn.close()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].status == JobStatus.FINISHED
    assert _committed_counts(out) == expected
    new = cluster.leader_address(10)
    assert "it starts from the beginning" in _appmaster_log(cluster, cluster.appmasters()[new])


@pytest.mark.timeout(240)
def test_a_frozen_leader_is_fenced_off_and_suspends_its_jobs_when_it_wakes(ha_cluster, tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    rows = _write(src)
    cluster = ha_cluster(standby=1)
    old, proc = leader(cluster)
    thread, outcome = run_following_the_leader(cluster, _build(src, out, False), "ha-fenced", CHECKPOINTS)
    conn = connection(cluster)
    try:
        wait_until(lambda: (j := job_info(conn, "ha-fenced")) is not None and j.latest_completed_checkpoint_id >= 1,
                   60, "the job never completed a checkpoint", interval_s=0.02)
        proc.send_signal(signal.SIGSTOP)
        try:
            new = wait_for_new_leader(cluster, old, 30)  # the session timeout (2 s) passes first
            wait_until(lambda: (j := job_info(conn, "ha-fenced")) is not None and j.status == JobStatus.RUNNING,
                       30, "the new leader did not resume the job")
        finally:
            proc.send_signal(signal.SIGCONT)
        # the old leader wakes up: it learns it lost the leadership and refuses to act as leader
        gw = RemoteDispatcherGateway(old, 5000)
        try:
            wait_until(lambda: _refused(gw), 20, "the old leader still answers as leader")
        finally:
            gw.close()
        thread.join(200)
    finally:
        conn.close()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].status == JobStatus.FINISHED
    exact_rows(out, rows)
    log = _appmaster_log(cluster, proc)
    assert "lost the leadership" in log and new != old
    after = log[log.index("lost the leadership"):]
    # once it knew, the old leader completed no checkpoint: it wrote no pointer and no _metadata
    assert not re.search(r"checkpoint \d+ complete", after), after[:2000]
    # the tasks ran on through it all: the new leader took every one over (issue 34)
    assert "reconciled: 2 subtasks adopted as they run, 0 to restart" in _appmaster_log(
        cluster, cluster.appmasters()[new])


def _refused(gw: RemoteDispatcherGateway) -> bool:
    try:
        gw.refresh_fencing_token()
    except NotLeaderRpcError:
        return True
    return False


def _appmaster_log(cluster: Any, proc: Any) -> str:
    logs = os.path.dirname(cluster.log_path)
    index = cluster.procs.index(proc)
    name = "appmaster.log" if index == 0 else f"appmaster-standby-{index}.log"
    with open(os.path.join(logs, name), errors="replace") as fh:
        return fh.read()


@pytest.mark.timeout(240)
def test_a_zookeeper_restart_is_survived(ha_cluster, zookeeper_server, tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    rows = _write(src)
    cluster = ha_cluster(standby=1)
    thread, outcome = run_following_the_leader(cluster, _build(src, out, True), "ha-zk-restart", CHECKPOINTS)
    conn = connection(cluster)
    try:
        wait_until(lambda: (j := job_info(conn, "ha-zk-restart")) is not None
                   and j.latest_completed_checkpoint_id >= 1, 60, "the job never completed a checkpoint",
                   interval_s=0.02)
        zookeeper_server.restart()
        thread.join(200)
    finally:
        conn.close()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].status == JobStatus.FINISHED
    assert_upsert_totals(out, rows)
    # the suspended connection ended the leadership (the job was suspended, not failed) and
    # whoever led after the reconnect resumed the job from its checkpoint
    logs = "".join(_appmaster_log(cluster, p) for p in cluster.procs)
    assert "lost the leadership" in logs and "suspended" in logs
    assert re.search(r"job \S+ resumes from checkpoint [1-9]", logs)


@pytest.mark.timeout(180)
def test_a_finished_job_is_not_run_again_by_the_next_leader(ha_cluster, zk_chroot, tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    expected = _write_files(src, files=4, rows=400)
    cluster = ha_cluster(standby=1)
    thread, outcome = run_following_the_leader(cluster, _pipeline(src, out, _to_row), "ha-done", {})
    thread.join(120)
    assert outcome["result"].status == JobStatus.FINISHED
    first = sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir())
    old, proc = leader(cluster)
    proc.send_signal(signal.SIGKILL)
    wait_for_new_leader(cluster, old)
    conn = connection(cluster)
    try:
        time.sleep(3)  # a leader that ran it again would have done so by now
        assert job_info(conn, "ha-done") is None or job_info(conn, "ha-done").status == JobStatus.FINISHED
    finally:
        conn.close()
    assert sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir()) == first  # not written again
    assert _committed_counts(out) == expected
    assert not zk_chroot.admin.get_children(f"{zk_chroot.base}/jobgraphs")  # nothing left to recover


@pytest.mark.timeout(240)
def test_the_cli_finds_and_follows_the_leader_in_zookeeper(ha_cluster, cli, tmp_path):
    cluster = ha_cluster(standby=1)
    keys = [arg for k, v in cluster.ha_keys.items() for arg in ("-D", f"{k}={v}")]
    job = tmp_path / "job.py"
    job.write_text("import yarnflow\n"
                   "env = yarnflow.StreamExecutionEnvironment.get_execution_environment()\n"
                   "env.from_collection([{'k': i % 3, 'v': i} for i in range(30)]).key_by('k').sum('v').print()\n"
                   "env.execute('cli-ha')\n")
    first = cli.run("run", *keys, str(job), timeout=120)
    assert first.returncode == 0, first.stderr
    assert "Submitted job cli-ha" in first.stderr and cluster.address in first.stderr
    listed = cli.run("list", *keys, "--json", timeout=60)
    assert listed.returncode == 0, listed.stderr
    [entry] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert entry["name"] == "cli-ha" and entry["state"] == "FINISHED"
    old, proc = leader(cluster)
    proc.send_signal(signal.SIGKILL)
    new = wait_for_new_leader(cluster, old)
    again = cli.run("run", *keys, str(job), timeout=120)
    assert again.returncode == 0, again.stderr
    assert new in again.stderr  # submitted to the new leader, found in ZooKeeper
    info = cli.run("info", *keys, entry["id"], timeout=60)  # the first job's result is gone or known
    assert info.returncode in (0, 1), info.stderr


@pytest.mark.timeout(60)
def test_an_unreachable_quorum_is_one_clear_error_within_the_connection_timeout(cli):
    started = time.monotonic()
    proc = cli.run("list", "-D", "high-availability.type=zookeeper", "-D", "high-availability.zookeeper.quorum=127.0.0.1:1",
                   "-D", "high-availability.storageDir=file:///tmp/nowhere",
                   "-D", "high-availability.zookeeper.client.connection-timeout=2 s", timeout=30)
    took = time.monotonic() - started
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "127.0.0.1:1" in lines[0], proc.stderr
    assert took < 15, f"took {took:.1f} s"
