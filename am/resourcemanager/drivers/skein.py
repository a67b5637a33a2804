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
from collections.abc import Callable
from typing import Any

from yarnflow.am.resourcemanager.drivers.base import WorkerTerminated
from yarnflow.common.config import Configuration, Options
from yarnflow.common.ids import ResourceID

__all__ = ["RM_ADDRESS_VAR", "SERVICE", "SkeinDriver"]

log = logging.getLogger(__name__)

SERVICE = "taskexecutor"
RM_ADDRESS_VAR = "YARNFLOW_RM_ADDRESS"
_ENDED = ("SUCCEEDED", "FAILED", "KILLED")


class SkeinDriver:
    """``app``: the application's skein ApplicationClient (default: ``from_current()``, inside
    the AppMaster's container). ``on_fatal(reason)``: the application cannot go on."""

    #: YARN ends an attempt's containers with it (skein keeps none across attempts), so a new
    #: attempt's ResourceManager waits for no previous TaskExecutor and starts its own at once
    workers_outlive_leader = False

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
