"""The ZooKeeper connection of one ``ZooKeeperHaServices``: one ``KazooClient``, the paths of a
cluster, bounded calls with retries, fenced transactions and the thread that runs callbacks.

Settings (``high-availability.zookeeper.*``, read once by ``ZooKeeperSettings.from_config``):
``quorum`` are the hosts; ``client.session-timeout`` is the session asked of the servers (they
may narrow it to their min/max); ``client.connection-timeout`` bounds the first connect and
every single call of these services; ``client.retry-wait`` and ``client.max-retry-attempts``
make the command retry (an operation that met a connection loss is tried again after
retry-wait, doubling, up to max-retry-attempts more times). The connection itself is retried
every retry-wait (at most a third of the session timeout) for as long as the client runs, so a
session survives a ZooKeeper restart that is shorter than the session timeout.

Connection states (kazoo's ``KazooState``) and what the services do on each:

- CONNECTED: normal operation. After a revoke (below) the election contends again; watches
  (leader retrieval, the cluster-shutdown marker) read the current value again.
- SUSPENDED: the connection dropped; the session may still be alive on the servers (its
  ephemeral nodes, the leader's latch node among them, stay for up to the session timeout).
  The election revokes leadership at once, unless
  ``client.tolerate-suspended-connections`` is true, in which case it keeps it until the
  connection is back or the suspension lasts longer than the session timeout. Calls wait for
  the connection for at most ``client.connection-timeout`` and then raise
  ``CoordinationUnavailableError``; ``has_leadership`` answers False.
- LOST: the session expired (or the client was closed): every ephemeral node of this process
  is gone. The election revokes leadership (always) and contends again with a new session as
  soon as kazoo has one (CONNECTED); stale writes fail their fencing check (``NotLeaderError``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    NoNodeError,
    OperationTimeoutError,
    RolledBackError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler
from kazoo.protocol.states import KazooState
from kazoo.recipe.watchers import DataWatch
from kazoo.retry import KazooRetry, RetryFailedError

from yarnflow.common.config import Configuration, Options
from yarnflow.common.errors import (
    ConfigurationError,
    CoordinationUnavailableError,
    HighAvailabilityError,
    NotLeaderError,
)

__all__ = ["CallbackThread", "ZooKeeperClient", "ZooKeeperPaths", "ZooKeeperSettings"]

log = logging.getLogger(__name__)

T = TypeVar("T")
Stat = Any  # kazoo's ZnodeStat (untyped)
Transaction = Any  # kazoo's TransactionRequest (untyped)


@dataclass(frozen=True)
class ZooKeeperSettings:
    """The ``high-availability.*`` keys the ZooKeeper services use, checked."""

    quorum: str
    root: str
    cluster_id: str
    storage_dir: str
    session_timeout_ms: int
    connection_timeout_ms: int
    retry_wait_ms: int
    max_retry_attempts: int
    tolerate_suspended: bool

    @classmethod
    def from_config(cls, config: Configuration) -> ZooKeeperSettings:
        """Raises ConfigurationError naming the key when the quorum, the storage directory or
        the cluster id is empty, the root path is malformed or a timeout is zero."""
        quorum = config[Options.ZK_QUORUM].strip()
        if not quorum:
            raise ConfigurationError(
                f"{Options.ZK_QUORUM.key} is empty: ZooKeeper high availability needs the ZooKeeper "
                "hosts (host:port[,host:port...])")
        storage_dir = config[Options.HA_STORAGE_DIR].strip()
        if not storage_dir:
            raise ConfigurationError(
                f"{Options.HA_STORAGE_DIR.key} is empty: ZooKeeper high availability needs a storage "
                "directory every AppMaster can read (an fsspec URL such as hdfs:///yarnflow/ha)")
        cluster_id = config[Options.HA_CLUSTER_ID].strip()
        if not cluster_id or "/" in cluster_id or cluster_id in (".", ".."):
            raise ConfigurationError(
                f"{Options.HA_CLUSTER_ID.key} must be a non-empty name without '/', got {cluster_id!r}")
        segments = [s for s in config[Options.ZK_ROOT].split("/") if s]
        if any(s in (".", "..") for s in segments):
            raise ConfigurationError(
                f"{Options.ZK_ROOT.key} must be an absolute ZooKeeper path, got {config[Options.ZK_ROOT]!r}")
        for option in (Options.ZK_SESSION_TIMEOUT, Options.ZK_CONNECTION_TIMEOUT):
            if config[option] <= 0:
                raise ConfigurationError(f"{option.key} must be longer than 0 ms")
        return cls(quorum=quorum, root="/" + "/".join(segments), cluster_id=cluster_id,
                   storage_dir=storage_dir, session_timeout_ms=config[Options.ZK_SESSION_TIMEOUT],
                   connection_timeout_ms=config[Options.ZK_CONNECTION_TIMEOUT],
                   retry_wait_ms=config[Options.ZK_RETRY_WAIT],
                   max_retry_attempts=config[Options.ZK_MAX_RETRY_ATTEMPTS],
                   tolerate_suspended=config[Options.ZK_TOLERATE_SUSPENDED])


def _name(kind: str, value: str) -> str:
    """``value`` as one path segment (a job id); ValueError when it cannot be one."""
    value = str(value)
    if not value or "/" in value or value in (".", ".."):
        raise ValueError(f"{value!r} cannot name a {kind} in ZooKeeper")
    return value


@dataclass(frozen=True)
class ZooKeeperPaths:
    """The layout under ``/<root>/<cluster>`` (see the package docstring)."""

    base: str

    @classmethod
    def of(cls, settings: ZooKeeperSettings) -> ZooKeeperPaths:
        return cls(f"{settings.root.rstrip('/')}/{settings.cluster_id}")

    @property
    def latch(self) -> str:
        return f"{self.base}/leader/latch"

    @property
    def address(self) -> str:
        return f"{self.base}/leader/address"

    @property
    def job_graphs(self) -> str:
        return f"{self.base}/jobgraphs"

    def job_graph(self, job_id: str) -> str:
        return f"{self.job_graphs}/{_name('job', job_id)}"

    def checkpoints(self, job_id: str) -> str:
        return f"{self.base}/checkpoints/{_name('job', job_id)}"

    def checkpoint(self, job_id: str, checkpoint_id: int) -> str:
        if checkpoint_id < 0:
            raise ValueError(f"checkpoint id {checkpoint_id} is negative")
        return f"{self.checkpoints(job_id)}/{checkpoint_id:019d}"

    def counter(self, job_id: str) -> str:
        return f"{self.base}/checkpoint-counter/{_name('job', job_id)}"

    @property
    def job_results(self) -> str:
        return f"{self.base}/job-results"

    def job_result(self, job_id: str) -> str:
        return f"{self.job_results}/{_name('job', job_id)}"

    @property
    def shutdown(self) -> str:
        return f"{self.base}/shutdown"


class _Handler(SequentialThreadingHandler):  # type: ignore[misc]  # kazoo is untyped
    """kazoo's threading handler, sleeping with ``sleep`` (kazoo insists its retries and its
    handler sleep alike) and giving up a TCP connect after the connection timeout (kazoo would
    wait a whole session timeout for a host that drops packets, and ``stop`` would wait too)."""

    def __init__(self, sleep: Callable[[float], None], connect_timeout_s: float) -> None:
        super().__init__()
        self.sleep_func = sleep
        self._connect_timeout_s = connect_timeout_s

    def create_connection(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["timeout"] = min(kwargs.get("timeout") or self._connect_timeout_s, self._connect_timeout_s)
        return super().create_connection(*args, **kwargs)


class _DeadlinePassed(Exception):
    """A call ran out of its time budget between two attempts."""


class ZooKeeperClient:
    """One KazooClient with bounded calls: every call returns or raises within
    ``client.connection-timeout`` (CoordinationUnavailableError), retrying connection losses
    per the command retry. ``sleep`` is how retries wait (kazoo's ``sleep_func``)."""

    def __init__(self, settings: ZooKeeperSettings, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.settings = settings
        self.closed = False
        self._timeout_s = settings.connection_timeout_ms / 1000.0
        session_s = settings.session_timeout_ms / 1000.0
        wait_s = max(settings.retry_wait_ms / 1000.0, 0.01)
        self.retry_wait_s = wait_s
        handler = _Handler(sleep, connect_timeout_s=min(self._timeout_s, session_s))
        self._command_retry = KazooRetry(max_tries=settings.max_retry_attempts + 1, delay=wait_s, backoff=2,
                                         max_jitter=0.2, max_delay=max(wait_s, session_s), sleep_func=sleep)
        reconnect_s = min(wait_s, max(session_s / 3.0, 0.01))
        connection_retry = KazooRetry(max_tries=-1, delay=reconnect_s, backoff=1, max_jitter=0.2,
                                      max_delay=reconnect_s, sleep_func=sleep)
        try:
            self._kazoo = KazooClient(hosts=settings.quorum, timeout=session_s, handler=handler,
                                      connection_retry=connection_retry, command_retry=self._command_retry)
        except ValueError as exc:
            raise ConfigurationError(f"bad {Options.ZK_QUORUM.key} {settings.quorum!r}: {exc}") from None

    @property
    def kazoo(self) -> KazooClient:
        """The underlying client (for recipes and tests)."""
        return self._kazoo

    def start(self) -> None:
        """Connect. Raises CoordinationUnavailableError (and leaves no thread running) when no
        server of the quorum answers within the connection timeout."""
        try:
            self._kazoo.start(timeout=self._timeout_s)
        except Exception as exc:  # noqa: BLE001 - any failure to connect means the same to the caller
            self._kazoo.stop()
            self._kazoo.close()
            detail = "" if isinstance(exc, KazooTimeoutError) else f" ({type(exc).__name__}: {exc})"
            raise CoordinationUnavailableError(
                f"cannot reach ZooKeeper at {self.settings.quorum} ({Options.ZK_QUORUM.key}) within "
                f"{self.settings.connection_timeout_ms} ms ({Options.ZK_CONNECTION_TIMEOUT.key}){detail}") from None
        log.info("connected to ZooKeeper at %s (session timeout %d ms)", self.settings.quorum,
                 self.settings.session_timeout_ms)

    def close(self) -> None:
        """End the session (its ephemeral nodes go) and stop kazoo's threads; idempotent."""
        self.closed = True
        try:
            self._kazoo.stop()
        finally:
            self._kazoo.close()

    @property
    def state(self) -> str:
        """kazoo's KazooState: CONNECTED, SUSPENDED or LOST."""
        return str(self._kazoo.state)

    @property
    def connected(self) -> bool:
        return bool(self.state == KazooState.CONNECTED)

    def session_id(self) -> int | None:
        """The id of the current session (None while not connected)."""
        client_id = self._kazoo.client_id
        return int(client_id[0]) if client_id else None

    def add_listener(self, listener: Callable[[str], None]) -> None:
        self._kazoo.add_listener(listener)

    def remove_listener(self, listener: Callable[[str], None]) -> None:
        self._kazoo.remove_listener(listener)

    # -- bounded calls --------------------------------------------------------------------------
    def run(self, what: str, attempt: Callable[[float], T]) -> T:
        """``attempt(seconds left)`` under the command retry, all within the connection timeout.
        Raises CoordinationUnavailableError when ZooKeeper does not answer in time."""
        deadline = time.monotonic() + self._timeout_s
        retry = self._command_retry.copy()
        retry.deadline = self._timeout_s

        def once() -> T:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _DeadlinePassed()
            return attempt(left)

        try:
            return retry(once)  # type: ignore[no-any-return]
        except ConnectionClosedError:
            raise CoordinationUnavailableError(f"{what}: the ZooKeeper client is closed") from None
        except (KazooTimeoutError, RetryFailedError, ConnectionLoss, OperationTimeoutError, SessionExpiredError,
                _DeadlinePassed) as exc:
            raise CoordinationUnavailableError(
                f"{what}: ZooKeeper at {self.settings.quorum} did not answer within "
                f"{self.settings.connection_timeout_ms} ms ({type(exc).__name__})") from None

    def get(self, path: str) -> tuple[bytes, Stat] | None:
        """The node's data and stat, None when there is no node."""
        def attempt(left: float) -> tuple[bytes, Stat] | None:
            try:
                data, stat = self._kazoo.get_async(path).get(timeout=left)
            except NoNodeError:
                return None
            return bytes(data or b""), stat
        return self.run(f"reading {path}", attempt)

    def exists(self, path: str) -> Stat | None:
        return self.run(f"looking up {path}", lambda left: self._kazoo.exists_async(path).get(timeout=left))

    def children(self, path: str) -> list[str]:
        """The names of the node's children (none when there is no node)."""
        def attempt(left: float) -> list[str]:
            try:
                return sorted(str(c) for c in self._kazoo.get_children_async(path).get(timeout=left))
            except NoNodeError:
                return []
        return self.run(f"listing {path}", attempt)

    def delete(self, path: str, version: int = -1) -> bool:
        """Delete one node (not fenced: for giving up nodes of our own). False when it was not
        there or had another version."""
        def attempt(left: float) -> bool:
            try:
                self._kazoo.delete_async(path, version).get(timeout=left)
            except (NoNodeError, BadVersionError):
                return False
            return True
        return self.run(f"deleting {path}", attempt)

    def missing_ancestors(self, path: str) -> list[str]:
        """The ancestors of ``path`` that do not exist, outermost first."""
        missing: list[str] = []
        parent = path.rsplit("/", 1)[0]
        while parent and self.exists(parent) is None:
            missing.insert(0, parent)
            parent = parent.rsplit("/", 1)[0]
        return missing

    def fenced_commit(self, latch_node: str, what: str, build: Callable[[Transaction], None]) -> list[object]:
        """One transaction: a check that ``latch_node`` (the leader's lock node) still exists
        unchanged, then the operations ``build`` adds. Returns the results of those operations
        (an exception instance for a failed one: nothing was applied then).

        Raises NotLeaderError when the check fails (the latch node is gone: another may lead;
        nothing was applied) and CoordinationUnavailableError when ZooKeeper does not answer
        (the transaction may or may not have been applied)."""
        def attempt(left: float) -> list[object]:
            tx = self._kazoo.transaction()
            tx.check(latch_node, 0)
            build(tx)
            try:
                return list(tx.commit_async().get(timeout=left))
            except ConnectionClosedError:
                raise
            except SessionExpiredError:
                raise NotLeaderError(f"{what}: refused, the ZooKeeper session holding the leadership "
                                     "expired") from None

        results = self.run(what, attempt)
        if isinstance(results[0], (NoNodeError, BadVersionError)):
            raise NotLeaderError(f"{what}: refused, this process no longer leads the cluster (its latch node "
                                 f"{latch_node} is gone)")
        if results[0] is not True and not isinstance(results[0], RolledBackError):
            raise HighAvailabilityError(f"{what}: the fencing check failed unexpectedly: {results[0]!r}")
        return results[1:]

    def watch_data(self, path: str, func: Callable[[bytes | None, Stat | None], bool],
                   stopped: threading.Event) -> None:
        """A kazoo DataWatch on ``path``: ``func(data, stat)`` (both None without a node) now and
        after every change, on kazoo's event thread (it must not block); watching ends when
        ``func`` returns False. Blocks until the first read; while ZooKeeper is unreachable its
        retries wait retry-wait, and return at once after ``stopped`` is set."""
        watch = DataWatch(self._kazoo, path)
        watch._retry = KazooRetry(max_tries=-1, delay=self.retry_wait_s, backoff=2, max_jitter=0.2,
                                  max_delay=self.retry_wait_s * 4, sleep_func=stopped.wait)

        def call(data: bytes | None, stat: Stat | None, event: object = None) -> bool:
            return func(data, stat)

        watch(call)


class CallbackThread:
    """Runs submitted callbacks one at a time, in order, on one dedicated thread (never on
    kazoo's threads, where blocking calls are forbidden). A failing callback is logged."""

    _STOP = object()

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, callback: Callable[[], None]) -> None:
        self._queue.put(callback)

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    def close(self, timeout: float = 10.0) -> None:
        """Run what was submitted, then end the thread (waits, unless called on it)."""
        self._queue.put(self._STOP)
        if not self.is_current():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("a high-availability callback did not end within %g s", timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is self._STOP:
                return
            try:
                item()  # type: ignore[operator]
            except Exception:  # noqa: BLE001 - a listener's bug must not stop later callbacks
                log.exception("a high-availability callback failed")
