"""The REST API of a standby AppMaster (ZooKeeper high availability, a real ZooKeeper server):
it answers its configuration and its UI, and every cluster or job call with a 503 JSON error
that names the leader; the leader's REST API serves the cluster. After the leader dies, the
standby that takes over serves the jobs on the same port."""

from __future__ import annotations

import os
import re
import signal
from typing import Any

import pytest
import requests

from tests.harness import wait_until
from tests.integration.test_ha_failover import ha_cluster, leader, wait_for_new_leader  # noqa: F401
from tests.rest import get

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _rest_url(cluster: Any, log_name: str) -> str:
    path = os.path.join(os.path.dirname(cluster.log_path), log_name)

    def found() -> str | None:
        with open(path, errors="replace") as fh:
            m = re.search(r"REST API and web UI at (http://\S+)", fh.read())
        return m.group(1) if m else None
    return wait_until(found, 30, f"no REST URL in {path}")


def test_a_standby_answers_503_naming_the_leader_until_it_leads(ha_cluster: Any) -> None:  # noqa: F811
    cluster = ha_cluster(standby=1, rest__port="0")
    first, second = _rest_url(cluster, "appmaster.log"), _rest_url(cluster, "appmaster-standby-1.log")
    leader_web = cluster.web_url()
    assert leader_web in (first, second)
    standby_web = second if leader_web == first else first

    assert get(f"{leader_web}/overview")["taskmanagers"] == 2
    assert get(f"{standby_web}/config")["leader"] is False
    assert requests.get(f"{standby_web}/", timeout=10).status_code == 200  # the UI, which shows the error
    for path in ("/overview", "/jobs", "/jobs/" + "a" * 32, "/taskmanagers"):
        response = requests.get(standby_web + path, timeout=10)
        assert response.status_code == 503, (path, response.text)
        assert f"the leader is at {cluster.address}" in response.json()["errors"][0]

    old, proc = leader(cluster)
    proc.send_signal(signal.SIGKILL)
    wait_for_new_leader(cluster, old)
    wait_until(lambda: requests.get(f"{standby_web}/overview", timeout=10).status_code == 200, 60,
               "the new leader's REST API never served the cluster")
    assert get(f"{standby_web}/config")["leader"] is True
