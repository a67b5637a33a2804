"""SkeinDriver: TaskExecutors as YARN containers of the application's ``taskexecutor`` skein
service (Flink's YarnResourceManagerDriver), for an AppMaster that runs in YARN.

The service is declared in the application's spec with no instances (see
``yarnflow.yarn.application_spec``: memory ``taskmanager.memory.process.size``, vcores
``taskmanager.cpu.cores``, its script runs ``python -m yarnflow.worker`` with the container's
YARN id as ResourceID). ``start_worker`` adds one container to it (``add_container``, with the
ResourceManager's address in its environment); ``stop_worker`` kills a container by its YARN
container id. A watcher thread polls the service's containers: one that ends without being asked
(FAILED, KILLED by YARN, or exiting by itself) is reported to the ResourceManager, which replaces
it; more than ``yarn.maximum-failed-containers`` failures end the application (``on_fatal``).

A TaskExecutor's ResourceID is its YARN container id (``CONTAINER_ID`` in the container); until
YARN has allocated it the driver knows the container by its skein id (``taskexecutor_<n>``).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

from yarnflow.am.resourcemanager.drivers.base import WorkerTerminated
from yarnflow.common.config import Configuration, Options
from yarnflow.common.ids import ResourceID

__all__ = ["RM_ADDRESS_VAR", "SERVICE", "SPARK_MASTER_SERVICE", "SPARK_WORKER_SERVICE", "SkeinDriver"]

log = logging.getLogger(__name__)

SERVICE = "taskexecutor"
RM_ADDRESS_VAR = "YARNFLOW_RM_ADDRESS"
#: the services of Spark's standalone daemons (declared with no instances, see ``yarnflow.yarn``)
SPARK_MASTER_SERVICE, SPARK_WORKER_SERVICE = "spark-master", "spark-worker"
#: in a Spark master's container: the key-value store key it reports its URL under
SPARK_KEY_VAR = "YARNFLOW_SPARK_KEY"
#: in a Spark worker's container: its master's URL and what it offers executors
SPARK_MASTER_VAR, SPARK_MEMORY_VAR, SPARK_CORES_VAR = ("YARNFLOW_SPARK_MASTER", "YARNFLOW_SPARK_MEMORY",
                                                        "YARNFLOW_SPARK_CORES")
_ENDED = ("SUCCEEDED", "FAILED", "KILLED")


class SkeinDriver:
    """``app``: the application's skein ApplicationClient (default: ``from_current()``, inside
    the AppMaster's container). ``on_fatal(reason)``: the application cannot go on."""

    #: YARN ends an attempt's containers with it (skein keeps none across attempts), so a new
    #: attempt's ResourceManager waits for no previous TaskExecutor and starts its own at once
    workers_outlive_leader = False
    #: Spark stages run Spark on a standalone master and workers in containers of their own
    spark_in_containers = True

    def __init__(self, config: Configuration, app: Any = None, on_fatal: Callable[[str], None] | None = None,
                 poll_s: float = 1.0) -> None:
        if app is None:
            import skein

            app = skein.ApplicationClient.from_current()
        self._app = app
        self._max_failed = config[Options.YARN_MAX_FAILED_CONTAINERS]
        self.on_fatal: Callable[[str], None] = on_fatal or (lambda reason: None)
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._rm_address = ""
        self._on_terminated: WorkerTerminated | None = None
        self._containers: dict[str, str] = {}   # skein id -> YARN container id ("" until allocated)
        self._stopping: set[str] = set()        # skein ids killed on purpose
        self._reported: set[str] = set()        # skein ids whose end was handled
        self.failed = 0
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._spark_keys: dict[str, str] = {}  # Spark master container -> its URL's key

    def start(self, rm_address: str, on_terminated: WorkerTerminated) -> None:
        with self._lock:
            self._rm_address = rm_address
            self._on_terminated = on_terminated
            self._stop.clear()
            if self._watcher is None or not self._watcher.is_alive():
                self._watcher = threading.Thread(target=self._watch, name="skein-containers", daemon=True)
                self._watcher.start()

    def start_worker(self) -> ResourceID:
        container = self._app.add_container(SERVICE, env={RM_ADDRESS_VAR: self._rm_address})
        with self._lock:
            self._containers[container.id] = container.yarn_container_id or ""
        log.info("requested TaskExecutor container %s", container.id)
        return ResourceID(container.yarn_container_id or container.id)

    def _skein_id(self, resource_id: ResourceID) -> str | None:
        rid = str(resource_id)
        for skein_id, yarn_id in self._containers.items():
            if rid in (skein_id, yarn_id):
                return skein_id
        return None

    def stop_worker(self, resource_id: ResourceID) -> None:
        with self._lock:
            skein_id = self._skein_id(resource_id)
            if skein_id is None:
                return
            self._stopping.add(skein_id)
        try:
            self._app.kill_container(skein_id)
            log.info("released TaskExecutor container %s (%s)", skein_id, resource_id)
        except Exception as exc:  # noqa: BLE001 - gone already: nothing to release
            log.info("releasing TaskExecutor container %s: %s", skein_id, exc)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            live = [c for c in self._containers if c not in self._reported]
            self._stopping.update(live)
        for skein_id in live:
            try:
                self._app.kill_container(skein_id)
            except Exception:  # noqa: BLE001 - ended meanwhile
                log.debug("killing %s", skein_id, exc_info=True)

    # -- Spark's standalone daemons (see am/resourcemanager/spark_cluster.py) -----------------
    def start_spark_master(self) -> str:
        key = f"yarnflow.spark.master.{uuid.uuid4().hex[:12]}"
        container = self._app.add_container(SPARK_MASTER_SERVICE, env={SPARK_KEY_VAR: key})
        with self._lock:
            self._spark_keys[container.id] = key
        log.info("requested Spark master container %s", container.id)
        return str(container.id)

    def spark_master_url(self, handle: str) -> str | None:
        with self._lock:
            key = self._spark_keys.get(handle)
        if key is None:
            return None
        try:
            value = self._app.kv.get(key)
        except Exception:  # noqa: BLE001 - the store is going away: not up
            return None
        return value.decode() if value else None

    def start_spark_worker(self, master_url: str, memory_mb: int, cores: int) -> str:
        container = self._app.add_container(SPARK_WORKER_SERVICE, env={
            SPARK_MASTER_VAR: master_url, SPARK_MEMORY_VAR: f"{memory_mb}m", SPARK_CORES_VAR: str(cores)})
        log.info("requested Spark worker container %s (%d MB, %d cores for executors)", container.id, memory_mb, cores)
        return str(container.id)

    def spark_daemon_alive(self, handle: str) -> bool:
        try:
            [c] = [c for c in self._app.get_containers(services=[handle.rsplit("_", 1)[0]],
                                                        states=["WAITING", "REQUESTED", "RUNNING"]) if c.id == handle]
        except ValueError:
            return False
        except Exception:  # noqa: BLE001 - cannot tell: count it as alive, the next look decides
            return True
        return c is not None

    def stop_spark_daemon(self, handle: str) -> None:
        with self._lock:
            self._spark_keys.pop(handle, None)
        try:
            self._app.kill_container(handle)
        except Exception as exc:  # noqa: BLE001 - gone already
            log.info("releasing Spark container %s: %s", handle, exc)

    def worker_pids(self) -> dict[ResourceID, int]:
        """The containers this driver asked for and that have not ended (no pids: they may run
        on other hosts)."""
        with self._lock:
            return {ResourceID(yarn_id or skein_id): 0 for skein_id, yarn_id in self._containers.items()
                    if skein_id not in self._reported}

    # -- watching the containers -------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                containers = self._app.get_containers(services=[SERVICE], states=[
                    "WAITING", "REQUESTED", "RUNNING", "SUCCEEDED", "FAILED", "KILLED"])
            except Exception as exc:  # noqa: BLE001 - the AppMaster service is going away
                log.debug("listing containers failed: %s", exc)
                continue
            self.check(containers)

    def check(self, containers: list[Any]) -> None:
        """Take note of allocated YARN ids and of containers that ended (called by the
        watcher; public for tests)."""
        ended: list[tuple[ResourceID, str, bool]] = []
        with self._lock:
            for c in containers:
                if c.id not in self._containers:
                    continue  # not this attempt's (or not ours)
                if c.yarn_container_id:
                    self._containers[c.id] = c.yarn_container_id
                if str(c.state) not in _ENDED or c.id in self._reported:
                    continue
                self._reported.add(c.id)
                expected = c.id in self._stopping
                failed = str(c.state) == "FAILED" and not expected
                if failed:
                    self.failed += 1
                reason = (f"container {c.yarn_container_id or c.id} {str(c.state).lower()}"
                          f"{': ' + c.exit_message if c.exit_message else ''}")
                if not expected:
                    ended.append((ResourceID(c.yarn_container_id or c.id), reason, failed))
        for resource_id, reason, _ in ended:
            log.warning("TaskExecutor %s", reason)
            if self._on_terminated is not None:
                self._on_terminated(resource_id, reason)
        if ended and self.failed > self._max_failed:
            self.on_fatal(f"{self.failed} TaskExecutor containers failed, more than yarn.maximum-failed-containers "
                           f"({self._max_failed}); the last: {ended[-1][1]}")
