"""Leader retrieval: a kazoo DataWatch on ``<cluster>/leader/address`` (Flink's
ZooKeeperLeaderRetrievalDriver), and the watch on the cluster-shutdown marker.

kazoo calls a DataWatch on its event thread, where nothing may block; both watches here only
hand the value over to the services' callback thread, which calls the listener, in order."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable

from yarnflow.common.errors import HighAvailabilityError
from yarnflow.common.ha.api import LeaderInformation
from yarnflow.common.ha.zookeeper.client import CallbackThread, Stat, ZooKeeperClient

__all__ = ["ClusterShutdownWatch", "ZooKeeperLeaderRetrieval", "parse_leader"]

log = logging.getLogger(__name__)


def parse_leader(data: bytes | None) -> LeaderInformation | None:
    """The address node's JSON as LeaderInformation; None when absent or unparsable."""
    if not data:
        return None
    try:
        value = json.loads(data.decode())
        address, session_id = value["address"], value["session_id"]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        log.warning("the leader address node holds no leader: %r", data[:200])
        return None
    if not isinstance(address, str) or not isinstance(session_id, str) or not address:
        return None
    return LeaderInformation(address, session_id)


_UNSET = object()


class ZooKeeperLeaderRetrieval:
    """``start(listener)``: the listener gets the current leader (None: none known), then every
    change, on the callback thread; a value equal to the last one delivered is not repeated.
    ``start`` waits for the first read (while ZooKeeper is unreachable: until it is back, or
    the services are closed)."""

    def __init__(self, zk: ZooKeeperClient, path: str, callbacks: CallbackThread) -> None:
        self._zk = zk
        self._path = path
        self._callbacks = callbacks
        self._stopped = threading.Event()
        self._started = False
        self._listener: Callable[[LeaderInformation | None], None] | None = None
        self._last: object = _UNSET  # the value last delivered (callback thread)

    def start(self, listener: Callable[[LeaderInformation | None], None]) -> None:
        if self._started:
            raise HighAvailabilityError("a leader retrieval can be started once")
        self._started = True
        self._listener = listener
        self._zk.watch_data(self._path, self._on_data, self._stopped)

    def stop(self) -> None:
        self._stopped.set()

    def _on_data(self, data: bytes | None, stat: Stat | None) -> bool:
        """kazoo's event thread: hand over, never block. False ends the watch."""
        if self._stopped.is_set():
            return False
        leader = parse_leader(data)
        self._callbacks.submit(lambda: self._deliver(leader))
        return True

    def _deliver(self, leader: LeaderInformation | None) -> None:
        if self._stopped.is_set() or self._listener is None or leader == self._last:
            return
        self._last = leader
        self._listener(leader)


class ClusterShutdownWatch:
    """Calls ``callback`` once, on the callback thread, when the shutdown marker exists."""

    def __init__(self, zk: ZooKeeperClient, path: str, callbacks: CallbackThread,
                 callback: Callable[[], None]) -> None:
        self._callbacks = callbacks
        self._callback = callback
        self._stopped = threading.Event()
        self._fired = False
        zk.watch_data(path, self._on_data, self._stopped)

    def stop(self) -> None:
        self._stopped.set()

    def _on_data(self, data: bytes | None, stat: Stat | None) -> bool:
        if self._stopped.is_set() or self._fired:
            return False
        if stat is None:
            return True
        self._fired = True
        self._callbacks.submit(self._deliver)
        return False

    def _deliver(self) -> None:
        if not self._stopped.is_set():
            self._callback()
