"""Leader election with kazoo's Lock recipe on ``<cluster>/leader/latch`` (Flink's
ZooKeeperLeaderElectionDriver, with Curator's LeaderLatch replaced by the lock).

A contender thread takes the lock. Once it holds it, it makes a new leader session id (uuid4
hex) and grants the contender leadership under it. Leadership ends (revoke) when the
connection is SUSPENDED (unless ``tolerate-suspended-connections``; then only once suspended
for longer than the session timeout), when the session is LOST, or when a fenced write finds our
latch node gone. After a revoke the thread gives up its nodes (the leader address if it is ours,
then the latch node) as soon as it is CONNECTED, and contends again.

The latch node held is the fencing token: ``fenced_commit`` adds a check of it (path and
version) to every write of the address node and of every store, so a deposed leader changes
nothing in ZooKeeper. Grant and revoke run on the services' callback thread, in order; a revoke
follows only a delivered grant, and nothing follows ``stop``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry

from yarnflow.common.errors import CoordinationUnavailableError, HighAvailabilityError, NotLeaderError
from yarnflow.common.ha.api import LeaderContender
from yarnflow.common.ha.zookeeper.client import CallbackThread, Stat, Transaction, ZooKeeperClient, ZooKeeperPaths

__all__ = ["ZooKeeperLeaderElection"]

log = logging.getLogger(__name__)

_CONFLICTS = (NodeExistsError, NoNodeError, BadVersionError)


@dataclass(frozen=True)
class _Leadership:
    session_id: str
    latch_node: str  # full path of our lock node


class ZooKeeperLeaderElection:
    def __init__(self, zk: ZooKeeperClient, paths: ZooKeeperPaths, callbacks: CallbackThread, *,
                 tolerate_suspended: bool, identifier: str = "") -> None:
        self._zk = zk
        self._paths = paths
        self._callbacks = callbacks
        self._tolerate_suspended = tolerate_suspended
        self._identifier = identifier or f"{socket.gethostname()}:{os.getpid()}"
        self._cond = threading.Condition()
        self._contender: LeaderContender | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._running = False
        self._leadership: _Leadership | None = None
        self._lock_recipe: Any = None  # kazoo's Lock being taken
        self._revocations = 0  # connection events that end a leadership (SUSPENDED, LOST)
        self._state = zk.state
        self._suspended_at: float | None = None
        self._delivered: str | None = None  # the session id last granted to the contender (callback thread)

    # -- LeaderElection -------------------------------------------------------------------------
    def start(self, contender: LeaderContender) -> None:
        """Join the election (once per start/stop)."""
        with self._cond:
            if self._zk.closed:
                raise HighAvailabilityError("the high-availability services are closed")
            if self._running or (self._thread is not None and self._thread.is_alive()):
                raise HighAvailabilityError("the leader election is started already (or still stopping)")
            self._running = True
            self._contender = contender
            self._stopping = threading.Event()
            self._state = self._zk.state
            self._zk.add_listener(self._on_state)
            self._thread = threading.Thread(target=self._contend, name="ha-leader-election", daemon=True)
            self._thread.start()
        log.info("joined the leader election at %s as %s", self._paths.latch, self._identifier)

    def confirm_leadership(self, session_id: str, address: str) -> None:
        """Publish ``address`` in the (ephemeral) address node, fenced; nothing happens when this
        contender does not lead under ``session_id`` (also when ZooKeeper says so: then the
        leadership is revoked). Raises CoordinationUnavailableError when ZooKeeper does not
        answer within the connection timeout."""
        lead = self._current(session_id)
        if lead is None:
            log.debug("not confirming leader session %s: it is not (or no longer) ours", session_id)
            return
        data = json.dumps({"address": address, "session_id": session_id}).encode()
        try:
            for _ in range(10):
                results = self._commit(lead, f"publishing the leader address {address}",
                                       self._address_ops(self._zk.exists(self._paths.address), data))
                if not any(isinstance(r, _CONFLICTS) for r in results):
                    log.info("leadership confirmed: %s, leader session %s", address, session_id)
                    return
            raise HighAvailabilityError(f"could not publish the leader address in {self._paths.address}: "
                                        "it keeps changing")
        except NotLeaderError as exc:
            log.info("leader session %s not confirmed: %s", session_id, exc)

    def _address_ops(self, stat: Stat | None, data: bytes) -> Callable[[Transaction], None]:
        path = self._paths.address
        ours = stat is not None and stat.ephemeralOwner == self._zk.session_id()

        def build(tx: Transaction) -> None:
            if stat is None:
                tx.create(path, data, ephemeral=True)
            elif ours:
                tx.set_data(path, data, version=stat.version)
            else:  # a former leader's node (its session may live on): replace it by one of ours
                tx.delete(path, version=stat.version)
                tx.create(path, data, ephemeral=True)
        return build

    def has_leadership(self, session_id: str) -> bool:
        """Granted under ``session_id``, not revoked, connected, and our latch node still there
        (asked of ZooKeeper)."""
        lead = self._current(session_id)
        if lead is None or not self._zk.connected:
            return False
        try:
            return self._zk.exists(lead.latch_node) is not None
        except HighAvailabilityError:
            return False

    def stop(self) -> None:
        """Leave the election: the lock and our address node are given up; no revoke follows."""
        self.leave(self._zk.settings.connection_timeout_ms / 1000.0 + 1.0)

    def leave(self, wait_s: float) -> None:
        """``stop``, waiting at most ``wait_s`` for the nodes to be given up (the contender
        thread may wait for the connection: closing the client ends it, see ``join``)."""
        with self._cond:
            if not self._running:
                return
            self._running = False
            self._stopping.set()
            self._leadership = None
            lock = self._lock_recipe
            thread = self._thread
            self._cond.notify_all()
        self._zk.remove_listener(self._on_state)
        if lock is not None:
            lock.cancel()
        if thread is not None and thread is not threading.current_thread() and wait_s > 0:
            thread.join(wait_s)
        log.info("left the leader election")

    def join(self, timeout: float) -> None:
        """Wait for the contender thread to end (after ``stop``, and the client's close)."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # -- fencing --------------------------------------------------------------------------------
    def require_leadership(self, what: str) -> None:
        """Raises NotLeaderError unless this process holds (or believes it holds) the leadership:
        the check before a write reads what it needs (ZooKeeper has the last word, in
        ``fenced_commit``)."""
        self._leader(what)

    def fenced_commit(self, what: str, build: Callable[[Transaction], None]) -> list[object]:
        """A write of the stores: applied only while this process leads. Raises NotLeaderError
        (nothing changed) otherwise; see ``ZooKeeperClient.fenced_commit``."""
        return self._commit(self._leader(what), what, build)

    def _leader(self, what: str) -> _Leadership:
        with self._cond:
            lead = self._leadership
        if lead is None:
            raise NotLeaderError(f"{what}: refused, this process does not lead the cluster")
        return lead

    def _commit(self, lead: _Leadership, what: str, build: Callable[[Transaction], None]) -> list[object]:
        try:
            return self._zk.fenced_commit(lead.latch_node, what, build)
        except NotLeaderError:
            with self._cond:
                if self._leadership is lead:
                    self._revoke_locked("ZooKeeper no longer has our latch node")
            raise

    def _current(self, session_id: str) -> _Leadership | None:
        with self._cond:
            lead = self._leadership
        return lead if lead is not None and session_id and lead.session_id == session_id else None

    # -- connection states (kazoo's connection thread: must not block) --------------------------
    def _on_state(self, state: str) -> None:
        with self._cond:
            self._state = state
            if state == KazooState.SUSPENDED:
                self._suspended_at = time.monotonic()
                if not self._tolerate_suspended:
                    self._revocations += 1
                    self._revoke_locked("the ZooKeeper connection is suspended")
            elif state == KazooState.LOST:
                self._revocations += 1
                self._revoke_locked("the ZooKeeper session is lost")
            else:
                self._suspended_at = None
            self._cond.notify_all()

    def _revoke_locked(self, reason: str) -> None:
        lead = self._leadership
        if lead is None:
            return
        self._leadership = None
        log.warning("leadership (session %s) revoked: %s", lead.session_id, reason)
        contender, stopping = self._contender, self._stopping
        self._callbacks.submit(lambda: self._deliver_revoke(lead.session_id, contender, stopping))
        self._cond.notify_all()

    # -- callbacks (the callback thread) --------------------------------------------------------
    def _deliver_grant(self, lead: _Leadership) -> None:
        with self._cond:
            current = self._leadership is lead and not self._stopping.is_set()
            contender = self._contender
        if current and contender is not None:
            self._delivered = lead.session_id
            contender.grant_leadership(lead.session_id)

    def _deliver_revoke(self, session_id: str, contender: LeaderContender | None, stopping: threading.Event) -> None:
        if self._delivered == session_id and not stopping.is_set() and contender is not None:
            self._delivered = None
            contender.revoke_leadership()

    # -- the contender thread -------------------------------------------------------------------
    def _contend(self) -> None:
        stopping = self._stopping
        lead: _Leadership | None = None
        while not stopping.is_set():
            with self._cond:
                while not stopping.is_set() and self._state != KazooState.CONNECTED:
                    self._cond.wait()
                if stopping.is_set():
                    break
                lock = self._zk.kazoo.Lock(self._paths.latch, self._identifier)
                # kazoo's own retry backs off to a minute; ours waits retry-wait and ends on stop
                lock._retry = KazooRetry(max_tries=-1, delay=self._zk.retry_wait_s, backoff=1, max_jitter=0.2,
                                         sleep_func=self._zk.kazoo.handler.sleep_func, interrupt=stopping.is_set)
                self._lock_recipe = lock
            log.info("%s contends for the leadership (a standby until it is granted)", self._identifier)
            try:
                acquired = bool(lock.acquire(blocking=True))
            except Exception as exc:  # noqa: BLE001 - cancelled, closed, or a ZooKeeper failure: try again
                log.debug("taking the leader latch failed: %s: %s", type(exc).__name__, exc)
                acquired = False
            if not acquired:
                # a node left behind by a failed attempt would block the election for good
                self._forget_lock(lock.prefix, until_done=not stopping.is_set())
                stopping.wait(self._zk.retry_wait_s)
                continue
            lead = self._grant(lock)
            if lead is None:
                continue
            self._hold(lead)
            if not stopping.is_set():
                self._give_up(lead, until_done=True)
                lead = None
        if lead is not None:
            self._give_up(lead, until_done=False)

    def _grant(self, lock: Any) -> _Leadership | None:
        """After taking the lock: lead under a new session id, unless the connection was
        suspended or lost meanwhile (then the lock is given up again)."""
        with self._cond:
            revocations = self._revocations
        node = f"{self._paths.latch}/{lock.node}"
        try:
            present = self._zk.exists(node) is not None
        except HighAvailabilityError:
            present = False
        with self._cond:
            if present and not self._stopping.is_set() and self._revocations == revocations \
                    and self._state == KazooState.CONNECTED:
                lead = _Leadership(uuid.uuid4().hex, node)
                self._leadership = lead
                self._callbacks.submit(lambda: self._deliver_grant(lead))
                log.info("leadership granted: leader session %s (latch node %s)", lead.session_id, node)
                return lead
        self._give_up(_Leadership("", node), until_done=True)
        return None

    def _hold(self, lead: _Leadership) -> None:
        """Wait while leading; a tolerated suspension longer than the session timeout ends it."""
        session_s = self._zk.settings.session_timeout_ms / 1000.0
        with self._cond:
            while not self._stopping.is_set() and self._leadership is lead:
                if self._suspended_at is not None and time.monotonic() - self._suspended_at > session_s:
                    self._revoke_locked("the ZooKeeper connection is suspended for longer than the session timeout")
                    break
                self._cond.wait(0.1 if self._suspended_at is not None else None)

    def _give_up(self, lead: _Leadership, *, until_done: bool) -> None:
        """Delete our address node (if it is ours) and our latch node."""
        def give_up() -> None:
            self._delete_own_address()
            self._zk.delete(lead.latch_node)
        self._when_connected(give_up, until_done=until_done)

    def _forget_lock(self, prefix: str, *, until_done: bool) -> None:
        """Delete the latch nodes of one Lock (their names start with its ``prefix``)."""
        def forget() -> None:
            for name in self._zk.children(self._paths.latch):
                if name.startswith(prefix):
                    self._zk.delete(f"{self._paths.latch}/{name}")
        self._when_connected(forget, until_done=until_done)

    def _when_connected(self, action: Callable[[], None], *, until_done: bool) -> None:
        """``action`` once connected. ``until_done``: wait for the connection and try again
        until it succeeded (unless stopping); else one try, if connected."""
        while True:
            try:
                if self._zk.connected:
                    action()
                    return
            except CoordinationUnavailableError as exc:
                log.debug("cleaning up the election's nodes: %s", exc)
            if not until_done or self._stopping.is_set():
                return
            with self._cond:
                while not self._stopping.is_set() and self._state != KazooState.CONNECTED:
                    self._cond.wait()
            self._stopping.wait(0.05)

    def _delete_own_address(self) -> None:
        found = self._zk.get(self._paths.address)
        if found is not None and found[1].ephemeralOwner == self._zk.session_id():
            self._zk.delete(self._paths.address, found[1].version)
