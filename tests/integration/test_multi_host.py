"""yarnflow on a cluster whose machines are really apart (issue 52), on the YARN sandbox with
hosts of their own (yarnflow.sandbox.hosts): every NodeManager is a network namespace with its
own address on a bridge, the client runs on a host of its own, and the ResourceManager's services
listen on another. A container sees its own host's folders only: the other NodeManagers'
folders and the client's are empty to it. Only ``shared/`` (the HDFS of this cluster: the input,
the output) is seen by every host.

So a job runs here only if every process advertises an address its peers can reach (no
127.0.0.1: each host has its own), the client reaches the AppMaster over the network, and the
TaskExecutors get the job's code from the AppMaster (the blob service), not from a file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli
from tests.harness import assert_upsert_counts, wait_until
from tests.integration.test_yarn_jobs import (CHECKPOINTS, JOB, YARN_CONF, app_id_of,
                                              container_processes, dconf, job_info, wait_checkpointed,
                                              write_input)
from tests.zookeeper import ZooKeeperServer, serving_on_host
from yarnflow.common.states import JobStatus
from tests.yarn import MAX_MEMORY_MB, MAX_VCORES
from yarnflow.sandbox import Sandbox

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240),
              pytest.mark.filterwarnings("ignore:distutils Version classes are deprecated:DeprecationWarning")]

NODES = 3


@pytest.fixture
def hosts(skein_config: str, tmp_path: Path, cli: Cli) -> Iterator[Sandbox]:
    """A sandbox of ``NODES`` NodeManagers on hosts of their own, plus the client's; the client's
    folders (its job file, its temp dir) are hidden from every NodeManager."""
    if os.geteuid() != 0:
        pytest.fail("hosts of their own are network namespaces: this test needs root (as CI runs it)")
    client = tmp_path / "client"
    client.mkdir()
    (tmp_path / "shared").mkdir()
    with Sandbox(skein_config, work_dir=str(tmp_path / "work"), max_memory_mb=MAX_MEMORY_MB, max_vcores=MAX_VCORES,
                 kill_grace_s=0.5, node_count=NODES, separate_hosts=True, extra_hosts=["zookeeper"],
                 hide=[str(client), cli.env["TMPDIR"]]) as sandbox:
        yield sandbox


@pytest.fixture
def client_cli(cli: Cli, hosts: Sandbox, tmp_path: Path) -> Cli:
    """The CLI on the client's host, in its folder (the job file is there)."""
    cli.env["SKEIN_CONFIG"] = hosts.config_dir
    cli.cwd = str(tmp_path / "client")
    (tmp_path / "client" / "job.py").write_text(JOB)
    cli.prefix = hosts.host_command("client", [])
    return cli


def _container_logs(sandbox: Sandbox, app_id: str) -> dict[str, dict[str, str]]:
    """node -> container id -> the container's log files (joined)."""
    found: dict[str, dict[str, str]] = {}
    for node in sorted((Path(sandbox.work_dir) / "nodes").iterdir()):
        for container in sorted((node / "logs" / app_id).glob("container_*")):
            found.setdefault(node.name, {})[container.name] = "".join(
                p.read_text(errors="replace") for p in container.rglob("*") if p.is_file())
    return found


def _check_hosts(sandbox: Sandbox, app_id: str) -> None:
    """The application's containers ran on every NodeManager, each process bound to and
    advertising its own host's address, and the TaskExecutors got the job's code from the
    AppMaster."""
    logs = _container_logs(sandbox, app_id)
    assert len(logs) == NODES, f"the containers ran on {sorted(logs)}, not on {NODES} hosts"
    address = {h.name: h.address for h in sandbox.hosts().values()}
    am_node, am_log = next((node, text) for node, containers in logs.items() for name, text in containers.items()
                           if name.endswith("_000001"))
    assert f"listening on {address[am_node]}:" in am_log, am_log[-3000:]
    ran_tasks = set()
    for node, containers in logs.items():
        if node == am_node:
            continue
        for text in containers.values():  # a TaskExecutor on a host of its own
            assert f"started: rpc {address[node]}:" in text and f"data {address[node]}:" in text, text[-3000:]
            assert f"registered at the ResourceManager {address[am_node]}:" in text, text[-3000:]
            if "deploying" in text:
                assert "bytes from the AppMaster)" in text, "the job's code came from elsewhere than the AppMaster"
                ran_tasks.add(node)
    assert len(ran_tasks) == NODES - 1, f"only {sorted(ran_tasks)} ran tasks"


@pytest.mark.parametrize("mode", ["per-job", "session", "application"])
def test_a_word_count_across_three_hosts_is_exact(client_cli: Cli, hosts: Sandbox, tmp_path: Path, mode: str) -> None:
    shared = tmp_path / "shared"
    expected = write_input(shared / "in")
    # (STREAMING: both TaskExecutors run their subtask at once, the keyed exchange goes from host to host)
    job = ["job.py", str(shared / "in"), str(shared / "out"), "STREAMING", "0", "wordcount"]
    if mode == "session":
        started = client_cli.run("session", "start", "--target", "yarn", "--detached", *dconf(YARN_CONF), timeout=90)
        assert started.returncode == 0, started.stderr
        app_id = app_id_of(started.stdout)
        keys = ["-D", f"yarn.application.id={app_id}"]
        ran = client_cli.run("run", *keys, *job, timeout=120)
        assert ran.returncode == 0, ran.stderr
        assert "Submitted job wordcount" in ran.stderr
        client_cli.run("session", "stop", *keys, check=True)
    else:
        ran = client_cli.run("run", "--target", f"yarn-{mode}", *dconf(YARN_CONF), *job, timeout=180)
        assert ran.returncode == 0, ran.stderr
        app_id = app_id_of(ran.stderr)
        assert f"YARN application {app_id} FINISHED (final status SUCCEEDED)" in ran.stderr
    assert_upsert_counts(shared / "out", expected)
    _check_hosts(hosts, app_id)


def test_a_node_sees_neither_the_clients_nor_another_nodes_folders(hosts: Sandbox, tmp_path: Path) -> None:
    import subprocess

    (tmp_path / "client" / "secret.txt").write_text("the client's")
    (Path(hosts.work_dir) / "nodes" / "node-2" / "mine.txt").write_text("node-2's")
    (tmp_path / "shared" / "data.txt").write_text("everyone's")
    check = ("import os, sys; c, n2, s = sys.argv[1:4]; "
             "print(os.listdir(c), os.path.exists(n2), open(s).read())")
    out = subprocess.run(hosts.host_command("node-1", [sys.executable, "-c", check, str(tmp_path / "client"),
                                                       str(Path(hosts.work_dir) / "nodes" / "node-2" / "mine.txt"),
                                                       str(tmp_path / "shared" / "data.txt")]),
                         capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "[] False everyone's", out.stderr
    node2 = hosts.hosts()["node-2"].address
    reach = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], 9), timeout=2)\n"
             "except ConnectionRefusedError:\n    print('refused')\nexcept OSError as e:\n    print(type(e).__name__)\n")
    # node-2's address answers from node-1 (a refused port: the host is there), 127.0.0.1 is node-1's own
    out = subprocess.run(hosts.host_command("node-1", [sys.executable, "-c", reach, node2]), capture_output=True,
                         text=True, timeout=30)
    assert out.stdout.strip() == "refused", out.stderr
    hosts.network.cut("node-2")  # type: ignore[union-attr]
    try:
        out = subprocess.run(hosts.host_command("node-1", [sys.executable, "-c", reach, node2]), capture_output=True,
                             text=True, timeout=30)
        assert out.stdout.strip() in ("TimeoutError", "OSError", "timeout"), out.stdout + out.stderr
    finally:
        hosts.network.heal("node-2")  # type: ignore[union-attr]


def test_a_checkpointed_streaming_job_survives_a_killed_taskexecutor_host_process(
        client_cli: Cli, hosts: Sandbox, tmp_path: Path) -> None:
    """TaskExecutors on two hosts, checkpoints in the shared storage; one TaskExecutor SIGKILLed
    mid-job: a replacement container comes, the job restores, every key's count is exact."""
    shared = tmp_path / "shared"
    expected = write_input(shared / "in")
    conf = {**YARN_CONF, **CHECKPOINTS, "execution.checkpointing.dir": f"file://{shared}/checkpoints"}
    proc = client_cli.start("run", "--target", "yarn-per-job", *dconf(conf), "job.py", str(shared / "in"),
                            str(shared / "out"), "STREAMING", "0.1", "te-kill")
    assert hosts.cluster is not None
    cluster = hosts.cluster
    app_id = wait_until(lambda: next((a.id for a in cluster.applications()), None), 30, "no application was submitted")
    wait_checkpointed(app_id, "te-kill")
    [victim, *_] = container_processes(app_id, "yarnflow.worker")
    killed = victim.environ()["CONTAINER_ID"]
    victim.send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=150)
    assert proc.returncode == 0, stderr
    assert_upsert_counts(shared / "out", expected)
    logs = _container_logs(hosts, app_id)
    started = sorted(c for containers in logs.values() for c in containers)
    assert killed in started and len(started) == 4, started  # the AppMaster, two TaskExecutors, a replacement
    assert "restores checkpoint" in "".join(t for containers in logs.values() for t in containers.values())


@pytest.fixture
def zookeeper_host(hosts: Sandbox, tmp_path: Path) -> Iterator[ZooKeeperServer]:
    """A ZooKeeper server on a host of its own."""
    with serving_on_host(tmp_path / "zookeeper", hosts.hosts()["zookeeper"].address,
                         hosts.host_command("zookeeper", [])) as server:
        yield server


def test_an_ha_session_is_taken_over_by_an_appmaster_on_another_host(
        client_cli: Cli, hosts: Sandbox, zookeeper_host: ZooKeeperServer, tmp_path: Path) -> None:
    """ZooKeeper on a host of its own, the HA storage shared; the session's AppMaster SIGKILLed
    mid-job: YARN's next attempt runs on another host, leads, recovers the job from its latest
    checkpoint, and the output is exact."""
    shared = tmp_path / "shared"
    expected = write_input(shared / "in")
    ha = {"high-availability.type": "zookeeper", "high-availability.zookeeper.quorum": zookeeper_host.quorum,
          "high-availability.storageDir": f"file://{shared}/ha", "high-availability.zookeeper.client.session-timeout":
          "4 s", "yarn.application-attempts": "2", "taskmanager.registration.timeout": "20 s"}
    conf = {**YARN_CONF, **CHECKPOINTS, **ha, "execution.checkpointing.dir": f"file://{shared}/checkpoints"}
    started = client_cli.run("session", "start", "--target", "yarn", "--detached", *dconf(conf), timeout=90)
    assert started.returncode == 0, started.stderr
    app_id = app_id_of(started.stdout)
    keys = ["-D", f"yarn.application.id={app_id}", *dconf(ha)]
    ran = client_cli.run("run", "--detached", *keys, "job.py", str(shared / "in"), str(shared / "out"), "STREAMING",
                         "0.1", "ha-hosts", timeout=90)
    assert ran.returncode == 0, ran.stderr
    wait_checkpointed(app_id, "ha-hosts", ha)
    [am] = container_processes(app_id, "yarnflow.am")
    first_host = am.environ()["NM_HOST"]
    am.send_signal(signal.SIGKILL)
    wait_until(lambda: (j := job_info(app_id, "ha-hosts", ha)) is not None and j.status == JobStatus.FINISHED, 150,
               "the job did not finish after the takeover")
    assert_upsert_counts(shared / "out", expected)
    [second] = container_processes(app_id, "yarnflow.am")
    assert second.environ()["CONTAINER_ID"].split("_")[-2] == "02"  # YARN's next attempt
    assert second.environ()["NM_HOST"] != first_host
    client_cli.run("session", "stop", *keys, check=True)


# ---- network partitions (Jepsen-style: processes live on, links cut and healed) -------------

def _start_streaming(client_cli: Cli, hosts: Sandbox, shared: Path, name: str,
                     **extra: str) -> tuple[Any, str, Any]:
    """A checkpointed STREAMING per-job word count of ~12 s, checkpointed once: (the client's
    process, the application id, the expected counts)."""
    expected = write_input(shared / "in", rows=12_000)
    conf = {**YARN_CONF, **CHECKPOINTS, "execution.checkpointing.dir": f"file://{shared}/checkpoints",
            "taskmanager.registration.timeout": "30 s", **extra}
    proc = client_cli.start("run", "--target", "yarn-per-job", *dconf(conf), "job.py", str(shared / "in"),
                            str(shared / "out"), "STREAMING", "0.2", name)
    assert hosts.cluster is not None
    cluster = hosts.cluster
    app_id = wait_until(lambda: next((a.id for a in cluster.applications()), None), 30, "no application was submitted")
    wait_checkpointed(app_id, name)
    return proc, app_id, expected


def _taskexecutor_host(hosts: Sandbox, app_id: str) -> tuple[str, str]:
    """(host name, container id) of a TaskExecutor on another host than the AppMaster."""
    by_address = {h.address: h.name for h in hosts.hosts().values()}
    [am] = container_processes(app_id, "yarnflow.am")
    te = next(p for p in container_processes(app_id, "yarnflow.worker") if p.environ()["NM_HOST"] != am.environ()["NM_HOST"])
    return by_address[te.environ()["NM_HOST"]], te.environ()["CONTAINER_ID"]


def _log_of(hosts: Sandbox, app_id: str, container: str) -> str:
    return next(text for containers in _container_logs(hosts, app_id).values() for c, text in containers.items()
                if c == container)


def _finish(proc: Any, hosts: Sandbox, app_id: str, timeout_s: float = 180) -> None:
    """Wait for the client's ``yarnflow run`` to end, successfully; on a timeout, fail with the
    ends of the AppMaster's and TaskExecutors' logs (what each was doing when it stalled)."""
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        tails = [f"--- {node} {c}:\n{text[-4000:]}" for node, cs in _container_logs(hosts, app_id).items()
                 for c, text in cs.items()]
        pytest.fail(f"the job did not end within {timeout_s:.0f} s:\n" + "\n".join(tails))
    assert proc.returncode == 0, stderr


def test_a_taskexecutor_host_cut_off_past_the_heartbeat_timeout_is_failed_over_and_rejoins_clean(
        client_cli: Cli, hosts: Sandbox, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    proc, app_id, expected = _start_streaming(client_cli, hosts, shared, "cut-te")
    node, container = _taskexecutor_host(hosts, app_id)
    assert hosts.network is not None
    hosts.network.cut(node)
    try:  # past the heartbeat timeout (3 s): the JobMaster fails its tasks over to a new container elsewhere
        wait_until(lambda: "did not answer for" in _log_of(hosts, app_id, container), 20,
                   "the cut-off TaskExecutor did not give its JobMaster up")
    finally:
        hosts.network.heal(node)
    _finish(proc, hosts, app_id)
    assert_upsert_counts(shared / "out", expected)  # (the cut-off sink committed nothing twice)
    cut_log = _log_of(hosts, app_id, container)
    after = cut_log[cut_log.index("did not answer for"):]
    assert "registered at the ResourceManager" in after, "the TaskExecutor did not register again after the heal"
    assert "restores checkpoint" in "".join(t for cs in _container_logs(hosts, app_id).values() for t in cs.values())


def test_a_partition_that_heals_before_any_timeout_restarts_nothing(client_cli: Cli, hosts: Sandbox,
                                                                     tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    proc, app_id, expected = _start_streaming(client_cli, hosts, shared, "blip")
    node, _ = _taskexecutor_host(hosts, app_id)
    assert hosts.network is not None
    hosts.network.cut(node)
    time.sleep(1.0)  # (the heartbeat timeout is 3 s)
    hosts.network.heal(node)
    _finish(proc, hosts, app_id)
    assert_upsert_counts(shared / "out", expected)
    logs = "".join(t for cs in _container_logs(hosts, app_id).values() for t in cs.values())
    assert "restores checkpoint" not in logs and "did not answer for" not in logs, "something restarted"


def test_a_cut_data_link_between_two_taskexecutor_hosts_restarts_the_region(client_cli: Cli, hosts: Sandbox,
                                                                            tmp_path: Path) -> None:
    """Only the link between the two TaskExecutors' hosts goes, silently (both still reach the
    AppMaster, so no heartbeat misses): the keyed exchange between them stalls, no barrier gets
    through, the checkpoint in flight expires (execution.checkpointing.timeout; no failed
    checkpoint tolerated, Flink's default) and the tasks that held it up fail over with their
    region, from the latest checkpoint; once the link heals the job ends, and the output is exact."""
    shared = tmp_path / "shared"
    proc, app_id, expected = _start_streaming(client_cli, hosts, shared, "cut-data",
                                              **{"execution.checkpointing.timeout": "3 s"})
    [am] = container_processes(app_id, "yarnflow.am")
    by_address = {h.address: h.name for h in hosts.hosts().values()}
    te_nodes = sorted({by_address[p.environ()["NM_HOST"]] for p in container_processes(app_id, "yarnflow.worker")})
    assert len(te_nodes) == 2 and by_address[am.environ()["NM_HOST"]] not in te_nodes, te_nodes
    assert hosts.network is not None
    hosts.network.cut_between(*te_nodes)
    try:
        wait_until(lambda: "checkpoints failed in a row" in _log_of_am(hosts, app_id), 60, "nothing noticed the cut")
    finally:
        hosts.network.heal_between(*te_nodes)
    _finish(proc, hosts, app_id)
    assert_upsert_counts(shared / "out", expected)
    am_log = _log_of_am(hosts, app_id)
    assert "failed: CheckpointFailureError" in am_log and "resume from checkpoint" in am_log, am_log[-3000:]


def _log_of_am(hosts: Sandbox, app_id: str) -> str:
    return next(text for containers in _container_logs(hosts, app_id).values() for c, text in containers.items()
                if c.endswith("_000001"))
