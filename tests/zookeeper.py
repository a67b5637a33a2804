"""A real ZooKeeper for the tests (a pytest plugin, loaded by tests/conftest.py), in the manner
of kazoo's test harness: one server per test session, a chroot per test, sessions expired on
purpose.

Fixtures:

- ``zookeeper_server`` (session): the running ``ZooKeeperServer`` (``quorum``, ``stop()``,
  ``start()``, ``restart()`` keeping its data dir, ``expire_session(kazoo_client)``). Java and
  Debian's ``/usr/share/java/zookeeper.jar`` (or ``$ZOOKEEPER_JAR``, a class path) are needed;
  without them the tests that use it are skipped, saying so. The server process carries its own
  YARNFLOW_TEST_TAG and is killed by pid at the end of the session.
- ``zk_chroot`` (function): a ``ZooKeeperChroot``: a unique ``high-availability.zookeeper.path.root``
  (``root``; the cluster's node is ``base``) for this test and a ready ``config`` (ZooKeeper HA,
  cluster id ``test-cluster``, a tmp ``file://`` storageDir, session timeout 2 s, connection
  timeout 3 s, retry-wait 200 ms); ``conf({key: value})`` is that config with keys changed;
  ``services(config=None)`` makes ZooKeeperHaServices that are closed at teardown; ``admin`` is
  a plain kazoo client to look at the nodes; ``tree()`` is the chroot's content;
  ``expire_session(services)`` and ``drop_connection(services)`` break a services object's
  ZooKeeper session or connection on purpose. At teardown the chroot is deleted, and the server
  runs again (also after a test that stopped it).
- ``zk_config`` (function): ``zk_chroot.config``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.connection import _CONNECTION_DROP
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry

from tests.conftest import TAG_VAR, kill_tagged
from tests.harness import ServerProcess
from tests.harness import free_port, wait_until
from yarnflow.common.config import Configuration
from yarnflow.common.ha.zookeeper import ZooKeeperHaServices

__all__ = ["ZooKeeperChroot", "ZooKeeperServer", "drop_connection"]

MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
DEBIAN_JAR = "/usr/share/java/zookeeper.jar"
#: the client settings of ``zk_chroot.config`` (seconds)
SESSION_TIMEOUT_S = 2.0
CONNECTION_TIMEOUT_S = 3.0


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def _classpath() -> str | None:
    jar = os.environ.get("ZOOKEEPER_JAR") or DEBIAN_JAR
    return jar if all(os.path.exists(p) or p.endswith("*") for p in jar.split(os.pathsep)) else None


def _die_with_parent(command: list[str]) -> list[str]:
    """``command``, started so that it is SIGKILLed when the process that started it dies (so no
    server outlives a test run that was killed itself): Linux's PR_SET_PDEATHSIG through
    util-linux's ``setpriv`` (an exec: the pid stays the server's). The signal comes when the
    starting *thread* ends, so only a start from the main thread is wrapped."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return command
    return [setpriv, "--pdeathsig", "KILL", "--", *command]


def drop_connection(client: KazooClient, timeout: float = 10.0) -> None:
    """Drop ``client``'s connection (kazoo's own test hook, as its harness does): it goes
    SUSPENDED and reconnects at once to the same session. Returns once it is CONNECTED again."""
    suspended, back = threading.Event(), threading.Event()

    def watch(state: str) -> bool:
        if state == KazooState.SUSPENDED:
            suspended.set()
        elif suspended.is_set() and state == KazooState.CONNECTED:
            back.set()
            return True
        return False

    client.add_listener(watch)
    client._call(_CONNECTION_DROP, None)
    if not (suspended.wait(timeout) and back.wait(timeout)):
        client.remove_listener(watch)
        raise AssertionError(f"the connection was not dropped and made again within {timeout} s")


def _quiet_client(hosts: str, **options: Any) -> KazooClient:
    retry = KazooRetry(max_tries=-1, delay=0.05, backoff=1, max_delay=0.05)
    return KazooClient(hosts=hosts, connection_retry=retry, **options)


class ZooKeeperServer(ServerProcess):
    """One standalone ZooKeeper on 127.0.0.1 (a free port), its data in ``work_dir``; or on
    ``address``, started through ``prefix`` (a YARN sandbox host's entry: a host of its own)."""

    def __init__(self, work_dir: Path, java: str, classpath: str, address: str = "127.0.0.1",
                 prefix: list[str] | None = None) -> None:
        self.work_dir = work_dir
        self.address = address
        self.port = free_port() if address == "127.0.0.1" else 2181
        self.tag = f"zookeeper-{uuid.uuid4().hex}"
        self._command = [*(prefix or []), java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp",
                         classpath, MAIN, str(work_dir / "zoo.cfg")]
        self._process: subprocess.Popen[bytes] | None = None
        (work_dir / "data").mkdir(parents=True, exist_ok=True)
        (work_dir / "zoo.cfg").write_text("\n".join([
            "tickTime=500",
            f"dataDir={work_dir / 'data'}",
            f"clientPort={self.port}",
            f"clientPortAddress={address}",
            "minSessionTimeout=1000",
            "maxSessionTimeout=60000",
            "admin.enableServer=false",
        ]) + "\n")

    @property
    def quorum(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 30.0) -> None:
        """Start the server (keeping its data) and wait until a client connects."""
        if self.running:
            return
        env = dict(os.environ)
        env[TAG_VAR] = self.tag

        def probe() -> None:
            client = _quiet_client(self.quorum, timeout=1.0)  # a short session: a short handshake
            try:
                client.start(timeout=0.5)
                client.stop()
            finally:
                client.close()

        self._launch(_die_with_parent(self._command), self.work_dir / "zookeeper.log", probe, "ZooKeeper", timeout,
                     env=env, cwd=self.work_dir)

    def expire_session(self, client: KazooClient, timeout: float = 10.0) -> None:
        """Expire ``client``'s session on the server (as kazoo's harness did): a second client
        takes it over with its id and password and closes it. Returns once ``client`` saw LOST;
        its ephemeral nodes are gone by then."""
        client_id = client.client_id
        assert client_id is not None, "the client has no session to expire"
        lost = threading.Event()

        def watch(state: str) -> bool:
            if state == KazooState.LOST:
                lost.set()
                return True
            return False

        client.add_listener(watch)
        other = _quiet_client(self.quorum, client_id=client_id, timeout=client._session_timeout / 1000.0)
        try:
            other.start(timeout=timeout)
            other.stop()
        finally:
            other.close()
        if not lost.wait(timeout):
            client.remove_listener(watch)
            raise AssertionError(f"the session {client_id[0]:#x} was not lost within {timeout} s")

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = (self.work_dir / "zookeeper.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


@pytest.fixture(scope="session")
def zookeeper_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    java, classpath = _java(), _classpath()
    if java is None:
        pytest.skip("ZooKeeper tests need Java: no java on PATH and no $JAVA_HOME (see .ci/install-test-deps)")
    if classpath is None:
        pytest.skip(f"ZooKeeper tests need the ZooKeeper server: no {DEBIAN_JAR} and no $ZOOKEEPER_JAR "
                    "(see .ci/install-test-deps)")
    with serving(ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), java, classpath)) as server:
        yield server


@contextlib.contextmanager
def serving(server: ZooKeeperServer) -> Iterator[ZooKeeperServer]:
    """``server`` started; at the end killed, with anything else that carries its tag."""
    server.start()
    try:
        yield server
    finally:
        server.stop()
        kill_tagged(server.tag)


@contextlib.contextmanager
def serving_on_host(work_dir: Path, address: str, prefix: list[str]) -> Iterator[ZooKeeperServer]:
    """A server on a host of its own (the sandbox's hosts): on ``address``, started through
    ``prefix`` (the host's entry), its data in ``work_dir``; fails the test without Java or
    Debian's zookeeper package."""
    import pytest

    java, classpath = _java(), _classpath()
    if java is None or classpath is None:
        pytest.fail("ZooKeeper needs Java and Debian's zookeeper package (.ci/install-test-deps)")
    work_dir.mkdir(parents=True, exist_ok=True)
    with serving(ZooKeeperServer(work_dir, java, classpath, address=address, prefix=prefix)) as server:
        yield server


@dataclass
class ZooKeeperChroot:
    """What one test gets: its own root path in the shared server, and a configuration for it."""

    server: ZooKeeperServer
    root: str
    config: Configuration
    admin: KazooClient
    _services: list[ZooKeeperHaServices] = field(default_factory=list)

    @property
    def storage_dir(self) -> str:
        return str(self.config.get("high-availability.storageDir"))

    @property
    def base(self) -> str:
        """The cluster's node: ``<root>/<cluster id>``."""
        return f"{self.root}/{self.config.get('high-availability.cluster-id')}"

    def conf(self, overrides: dict[str, str]) -> Configuration:
        """``config`` with some keys set otherwise."""
        return self.config.with_overrides(overrides)

    def services(self, config: Configuration | None = None) -> ZooKeeperHaServices:
        """ZooKeeperHaServices for ``config`` (default: this chroot's), closed at teardown."""
        services = ZooKeeperHaServices(config or self.config)
        self._services.append(services)
        return services

    def tree(self) -> dict[str, bytes]:
        """Every node under the root: path -> data (what a fenced-off write must not change)."""
        found: dict[str, bytes] = {}

        def walk(path: str) -> None:
            try:
                data, _ = self.admin.get(path)
                children = self.admin.get_children(path)
            except NoNodeError:
                return
            found[path] = data
            for child in children:
                walk(f"{path}/{child}")

        walk(self.root)
        return found

    def expire_session(self, services: ZooKeeperHaServices) -> None:
        """Expire the ZooKeeper session of ``services`` on the server (see ZooKeeperServer)."""
        self.server.expire_session(services.client.kazoo)

    def drop_connection(self, services: ZooKeeperHaServices) -> None:
        """Drop the connection of ``services`` (SUSPENDED, then CONNECTED to the same session)."""
        drop_connection(services.client.kazoo)

    def close(self) -> None:
        errors = []
        for services in self._services:
            try:
                services.close()
            except Exception as exc:  # noqa: BLE001 - close the others all the same
                errors.append(exc)
        if not self.server.running:
            self.server.start()
        # a running kazoo client reconnects by itself (and start() would wait for it forever)
        wait_until(lambda: self.admin.connected, 15, "the admin client did not reconnect to ZooKeeper")
        self.admin.delete(self.root, recursive=True)
        self.admin.stop()
        self.admin.close()
        if errors:
            raise AssertionError(f"closing ZooKeeperHaServices failed: {errors}")


@pytest.fixture
def zk_chroot(zookeeper_server: ZooKeeperServer, tmp_path: Path) -> Iterator[ZooKeeperChroot]:
    if not zookeeper_server.running:
        zookeeper_server.start()
    root = f"/yarnflow-test-{uuid.uuid4().hex[:12]}"
    config = Configuration.load({
        "high-availability.type": "zookeeper",
        "high-availability.zookeeper.quorum": zookeeper_server.quorum,
        "high-availability.zookeeper.path.root": root,
        "high-availability.cluster-id": "test-cluster",
        "high-availability.storageDir": (tmp_path / "ha-storage").as_uri(),
        "high-availability.zookeeper.client.session-timeout": f"{SESSION_TIMEOUT_S:g} s",
        "high-availability.zookeeper.client.connection-timeout": f"{CONNECTION_TIMEOUT_S:g} s",
        "high-availability.zookeeper.client.retry-wait": "200 ms",
    })
    # a short session: a connect during a server's start that gets no answer is given up soon
    admin = _quiet_client(zookeeper_server.quorum, timeout=SESSION_TIMEOUT_S)
    admin.start(timeout=10)
    chroot = ZooKeeperChroot(zookeeper_server, root, config, admin)
    try:
        yield chroot
    finally:
        chroot.close()


@pytest.fixture
def zk_config(zk_chroot: ZooKeeperChroot) -> Configuration:
    return zk_chroot.config
