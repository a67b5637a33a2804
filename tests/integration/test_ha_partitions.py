"""The leading AppMaster cut off from ZooKeeper while it lives on (issue 52, network partitions).

Two AppMasters (a leader and a standby) and ZooKeeper each on a host of their own: network
namespaces with an address on a bridge (yarnflow.sandbox.hosts), no YARN (a YARN application
has one AppMaster; standbys are a standalone session's). Each AppMaster's TaskExecutors run on
its host. The folder of the test stands for HDFS: the input, the output, the HA storage and the
checkpoints are seen by every host.

Only the link between the leader's host and ZooKeeper's is cut, silently (no error comes back,
as with a firewall's DROP): the leader still reaches its TaskExecutors, the standby and the
client. It must stop acting as leader before the standby takes over: no checkpoint completed
and no sink committed by two leaders (the output holds every input row exactly once), and on
heal it rejoins as a standby (the new leader keeps leading)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FAST_CONF, TAG_VAR
from tests.harness import wait_until
from tests.integration.test_ha_failover import HA_CLUSTER, exact_rows, run_following_the_leader
from tests.integration.test_streaming_exactly_once import CHECKPOINTS, _build, _write
from tests.zookeeper import ZooKeeperServer, serving_on_host
from yarnflow.common.config import Configuration
from yarnflow.common.states import JobStatus
from yarnflow.connection import ClusterConnection
from yarnflow.local_cluster import LocalCluster
from yarnflow.sandbox.hosts import HostNetwork

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

APPMASTERS = ("am-1", "am-2")


@pytest.fixture
def network() -> Iterator[HostNetwork]:
    if os.geteuid() != 0:
        pytest.fail("hosts of their own are network namespaces: this test needs root (as CI runs it)")
    net = HostNetwork([*APPMASTERS, "zookeeper"], {}).create()
    try:
        yield net
    finally:
        net.remove()


@pytest.fixture
def zookeeper_host(network: HostNetwork, tmp_path: Path) -> Iterator[ZooKeeperServer]:
    host = network.hosts["zookeeper"]
    with serving_on_host(tmp_path / "zookeeper", host.address, host.command([])) as server:
        yield server


@pytest.fixture
def ha_keys(zookeeper_host: ZooKeeperServer, tmp_path: Path) -> dict[str, str]:
    return {"high-availability.type": "zookeeper", "high-availability.zookeeper.quorum": zookeeper_host.quorum,
            "high-availability.storageDir": f"file://{tmp_path}/ha", "high-availability.cluster-id": "partitions",
            "high-availability.zookeeper.client.session-timeout": "4 s"}


@pytest.fixture
def cluster(network: HostNetwork, ha_keys: dict[str, str], tmp_path: Path, process_tag: str,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    """A leader and a standby, AppMaster ``i`` on host ``am-<i+1>`` (bound to and advertising
    that host's address, as its TaskExecutors do)."""
    monkeypatch.setenv(TAG_VAR, process_tag)

    def placement(index: int) -> tuple[list[str], dict[str, str]]:
        host = network.hosts[APPMASTERS[index]]
        return host.command([]), {"jobmanager.rpc.address": host.address, "taskmanager.host": host.address}

    made = LocalCluster(2, 2, {**FAST_CONF, **ha_keys, **HA_CLUSTER}, work_dir=str(tmp_path / "cluster"),
                        standby=1, placement=placement)
    try:
        yield made.start(timeout_s=60)
    finally:
        made.stop()


def _host_of(network: HostNetwork, address: str) -> str:
    return next(h.name for h in network.hosts.values() if address.startswith(f"{h.address}:"))


def _log(cluster: LocalCluster, index: int) -> str:
    name = "appmaster.log" if index == 0 else f"appmaster-standby-{index}.log"
    return (Path(cluster.work_dir) / "log" / name).read_text(errors="replace")


def _logged_at(log: str, pattern: str) -> datetime:
    """When the first line matching ``pattern`` was logged."""
    m = re.search(r"^(\S+ \S+) .*" + pattern, log, re.M)
    assert m is not None, f"nothing logged {pattern!r}:\n{log[-3000:]}"
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")


def test_a_leader_cut_off_from_zookeeper_steps_down_before_the_standby_leads_and_rejoins_as_standby(
        network: HostNetwork, cluster: LocalCluster, ha_keys: dict[str, str], tmp_path: Path) -> None:
    src, out = tmp_path / "in", tmp_path / "out"
    rows = _write(src)
    old = cluster.leader_address(10)
    old_host = _host_of(network, old)
    old_index, new_index = APPMASTERS.index(old_host), 1 - APPMASTERS.index(old_host)
    cluster.ha_keys = ha_keys  # type: ignore[attr-defined]  # (what the client knows: it finds the leader)
    thread, outcome = run_following_the_leader(cluster, _build(src, out, False), "cut-leader", CHECKPOINTS)
    conn = ClusterConnection(Configuration.load(ha_keys))
    try:
        def info() -> Any:
            return next((j for j in conn.call(lambda gw: gw.list_jobs()) if j.name == "cut-leader"), None)

        wait_until(lambda: (j := info()) is not None and j.latest_completed_checkpoint_id >= 1, 60,
                   "the job never completed a checkpoint", interval_s=0.05)
        network.cut_between(old_host, "zookeeper")
        try:
            new = wait_until(lambda: (a := cluster.leader_address(30)) != old and a, 60,
                             "the standby did not take over from the cut-off leader")
            wait_until(lambda: "lost the leadership" in _log(cluster, old_index), 30,
                       "the cut-off leader never stepped down")
        finally:
            network.heal_between(old_host, "zookeeper")
        thread.join(180)
        assert not thread.is_alive(), "the job did not end after the takeover"
        assert "error" not in outcome, outcome.get("error")
        assert outcome["result"].status == JobStatus.FINISHED
        exact_rows(out, rows)  # one leader's commits only: every input row once
        # healed, the old leader contends again as a standby; the new one keeps leading
        wait_until(lambda: len(re.findall("contends for the leadership", _log(cluster, old_index))) >= 2, 30,
                   "the old leader did not rejoin the election after the heal")
        assert cluster.leader_address(10) == new
    finally:
        conn.close()
    old_log, new_log = _log(cluster, old_index), _log(cluster, new_index)
    assert _host_of(network, new) != old_host
    stepped_down = _logged_at(old_log, "lost the leadership")
    took_over = _logged_at(new_log, r"AppMaster \S+ leads cluster")
    assert stepped_down < took_over, f"the old leader stepped down at {stepped_down}, after {took_over}"
    after = old_log[old_log.index("lost the leadership"):]
    assert not re.search(r"checkpoint \d+ complete", after), after[:2000]  # once deposed it completed none
    assert "started TaskExecutor" not in after, after[:3000]  # nor asked for workers
    assert re.search(r"job \S+ resumes from checkpoint [1-9]", new_log), new_log[-3000:]
