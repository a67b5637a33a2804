"""A process told to listen on an address its host does not have, or a TaskExecutor that would
advertise 127.0.0.1 to a ResourceManager on another host, exits at once with one line naming
the configuration key (issue 52), instead of starting and leaving its peers hanging."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from yarnflow.common.addresses import check_bind_address, check_reachable_from, is_loopback
from yarnflow.common.errors import ConfigurationError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: TEST-NET-3 (RFC 5737): documentation only, never an address of this machine
ABSENT = "203.0.113.7"


def _run(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("key", ["jobmanager.rpc.address", "rest.address", "rest.bind-address"])
def test_an_appmaster_given_an_address_this_host_lacks_exits_naming_the_key(tmp_path: Path, key: str) -> None:
    done = _run("yarnflow.am", "--work-dir", str(tmp_path / "am"), "-D", f"{key}={ABSENT}", "-D", "rest.port=0",
                cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {key}: cannot listen on {ABSENT}") and "not an address of this host" in last
    assert "Traceback" not in done.stderr


def test_a_taskexecutor_that_would_advertise_loopback_to_a_remote_resourcemanager_exits(tmp_path: Path) -> None:
    done = _run("yarnflow.worker", "--resource-id", "te-1", "--work-dir", str(tmp_path / "te"), "--rm-address",
                f"{ABSENT}:6123", "-D", "taskmanager.host=127.0.0.1", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: taskmanager.host is 127.0.0.1, a loopback address, but its peers are at {ABSENT}: processes on other "
        "hosts could not reach this one by it; set taskmanager.host to an address of this host they can reach")
    bad = _run("yarnflow.worker", "--resource-id", "te-1", "--work-dir", str(tmp_path / "te"), "--rm-address",
               "127.0.0.1:6123", "-D", f"taskmanager.host={ABSENT}", cwd=tmp_path)
    assert bad.returncode == 2 and f"error: taskmanager.host: cannot listen on {ABSENT}" in bad.stderr, bad.stderr


def test_the_checks_themselves() -> None:
    check_bind_address("127.0.0.1", "k")
    check_bind_address("0.0.0.0", "k")
    with pytest.raises(ConfigurationError, match="k: the host name 'no-such-host.invalid' does not resolve"):
        check_bind_address("no-such-host.invalid", "k")
    assert is_loopback("localhost") and is_loopback("127.0.0.2") and is_loopback("::1")
    assert not is_loopback("10.0.0.1") and not is_loopback("example.org")
    check_reachable_from("127.0.0.1", "k", "127.0.0.1")  # a one-host cluster
    check_reachable_from("10.0.0.2", "k", "10.0.0.1")
    check_reachable_from("127.0.0.1", "k", "")  # (HA: the peer is found in ZooKeeper later)
