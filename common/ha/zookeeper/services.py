"""``ZooKeeperHaServices``: the HighAvailabilityServices of ``high-availability.type:
zookeeper`` (Flink's ZooKeeperLeaderElectionHaServices), one per process."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from yarnflow.common.config import Configuration
from yarnflow.common.errors import HighAvailabilityError
from yarnflow.common.ha.zookeeper.client import CallbackThread, ZooKeeperClient, ZooKeeperPaths, ZooKeeperSettings
from yarnflow.common.ha.zookeeper.election import ZooKeeperLeaderElection
from yarnflow.common.ha.zookeeper.retrieval import ClusterShutdownWatch, ZooKeeperLeaderRetrieval
from yarnflow.common.ha.zookeeper.stores import (
    ZooKeeperCheckpointIDCounter,
    ZooKeeperCompletedCheckpointStore,
    ZooKeeperJobGraphStore,
    ZooKeeperJobResultStore,
    write_cluster_shutdown,
)

__all__ = ["ZooKeeperHaServices"]

log = logging.getLogger(__name__)


class ZooKeeperHaServices:
    """Connects at once (one ZooKeeper session for the process). ``sleep``: how retries wait
    (kazoo's ``sleep_func``; for tests).

    Raises ConfigurationError naming the key when ``high-availability.zookeeper.quorum`` or
    ``high-availability.storageDir`` is empty, and CoordinationUnavailableError when no
    ZooKeeper server answers within ``...client.connection-timeout``: check the quorum and that
    the servers run.

    ``leader_election()`` is the same object on every call (there is one contender per
    process); the stores' writes are fenced by it. Callbacks of the election, of every
    retrieval and of ``on_cluster_shutdown`` run on one callback thread of these services."""

    kind = "zookeeper"

    def __init__(self, config: Configuration, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.settings = ZooKeeperSettings.from_config(config)
        self.paths = ZooKeeperPaths.of(self.settings)
        self._zk = ZooKeeperClient(self.settings, sleep=sleep)
        self._zk.start()
        self._lock = threading.Lock()
        self._closed = False
        self._callbacks = CallbackThread(f"ha-callbacks-{self.settings.cluster_id}")
        self._election = ZooKeeperLeaderElection(self._zk, self.paths, self._callbacks,
                                                 tolerate_suspended=self.settings.tolerate_suspended)
        self._retrievals: list[ZooKeeperLeaderRetrieval] = []
        self._shutdown_watches: list[ClusterShutdownWatch] = []
        self._job_graphs = ZooKeeperJobGraphStore(self._zk, self.paths, self._election, self.settings.storage_dir)
        self._results = ZooKeeperJobResultStore(self._zk, self.paths, self._election)

    @property
    def client(self) -> ZooKeeperClient:
        """The ZooKeeper connection (for tools and tests)."""
        return self._zk

    def leader_election(self) -> ZooKeeperLeaderElection:
        return self._election

    def leader_retrieval(self) -> ZooKeeperLeaderRetrieval:
        with self._lock:
            self._check_open()
            retrieval = ZooKeeperLeaderRetrieval(self._zk, self.paths.address, self._callbacks)
            self._retrievals.append(retrieval)
        return retrieval

    def job_graph_store(self) -> ZooKeeperJobGraphStore:
        return self._job_graphs

    def job_result_store(self) -> ZooKeeperJobResultStore:
        return self._results

    def checkpoint_store(self, job_id: str) -> ZooKeeperCompletedCheckpointStore:
        return ZooKeeperCompletedCheckpointStore(self._zk, self.paths, self._election, job_id)

    def checkpoint_id_counter(self, job_id: str) -> ZooKeeperCheckpointIDCounter:
        return ZooKeeperCheckpointIDCounter(self._zk, self.paths, self._election, job_id)

    def request_cluster_shutdown(self) -> None:
        """Raises NotLeaderError when this process does not lead."""
        write_cluster_shutdown(self._zk, self.paths, self._election)
        log.info("cluster %s marked shut down", self.settings.cluster_id)

    def cluster_shut_down(self) -> bool:
        return self._zk.exists(self.paths.shutdown) is not None

    def start_anew(self) -> bool:
        if not self.cluster_shut_down():
            return False
        # a leader of the cluster that was shut down may still be ending (its address node goes
        # with its session): wait for that, as long as ZooKeeper would keep the node of one that died
        deadline = time.monotonic() + self.settings.session_timeout_ms / 1000 + 2
        while self._zk.exists(self.paths.address) is not None:
            if time.monotonic() > deadline:
                raise HighAvailabilityError(f"cluster {self.settings.cluster_id!r} was shut down but an AppMaster "
                                            f"still leads it (at {self.paths.address})")
            time.sleep(0.1)
        self._zk.delete(self.paths.shutdown)
        log.info("cluster %s was shut down earlier: its mark is removed, a new cluster starts under its id",
                 self.settings.cluster_id)
        return True

    def on_cluster_shutdown(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._check_open()
        watch = ClusterShutdownWatch(self._zk, self.paths.shutdown, self._callbacks, callback)
        with self._lock:
            self._shutdown_watches.append(watch)
            closed = self._closed
        if closed:
            watch.stop()

    def close(self) -> None:
        """Leave the election (no revoke callback), stop every watch, end the session and
        every thread of these services. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            retrievals, watches = list(self._retrievals), list(self._shutdown_watches)
        # connected: the nodes go at once; else the session's end takes them along
        self._election.leave(self.settings.connection_timeout_ms / 1000.0 if self._zk.connected else 0.0)
        for retrieval in retrievals:
            retrieval.stop()
        for watch in watches:
            watch.stop()
        try:
            self._zk.close()
        finally:
            self._election.join(10.0)
            self._callbacks.close()
        log.info("high-availability services of cluster %s closed", self.settings.cluster_id)

    def _check_open(self) -> None:
        if self._closed:
            raise HighAvailabilityError("the high-availability services are closed")
