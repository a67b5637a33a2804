"""AppMaster: puts the Dispatcher, the ResourceManager and the JobMasters behind one Thrift
port, and owns the working and storage directories."""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from typing import cast

import fsspec

from yarnflow.am.dispatcher.dispatcher import Dispatcher
from yarnflow.am.resourcemanager.drivers.base import ResourceDriver
from yarnflow.am.resourcemanager.drivers.local import LocalProcessDriver
from yarnflow.am.resourcemanager.resource_manager import ResourceManager
from yarnflow.common.config import Configuration, Options
from yarnflow.common.rpc.gateways import (
    DISPATCHER,
    JOB_MASTER,
    RESOURCE_MANAGER,
    DispatcherHandler,
    JobMasterHandler,
    ResourceManagerHandler,
)
from yarnflow.common.rpc.server import RpcServer
from yarnflow.common.artifacts import ArtifactCache

log = logging.getLogger(__name__)


def default_work_dir(config: Configuration, cluster_id: str) -> str:
    base = config[Options.TMP_DIRS] or tempfile.gettempdir()
    return os.path.join(base, f"yarnflow-{cluster_id}")


class ResourceManagerProxy:
    """The AppMaster's current ResourceManager, for everything that must follow a change of
    leader (the RPC handler, the Dispatcher and its JobMasters)."""

    def __init__(self, appmaster: AppMaster) -> None:
        self._am = appmaster

    def __getattr__(self, name: str) -> object:
        return getattr(self._am.rm, name)


class AppMaster:
    def __init__(self, config: Configuration, cluster_id: str, target: str = "local",
                 driver: ResourceDriver | None = None, work_dir: str | None = None) -> None:
        self.config = config
        self.cluster_id = cluster_id
        self.work_dir = work_dir or default_work_dir(config, cluster_id)
        os.makedirs(self.work_dir, exist_ok=True)
        storage = config[Options.HA_STORAGE_DIR] or "file://" + os.path.join(self.work_dir, "storage")
        self.storage_dir = storage.rstrip("/")
        fs, path = fsspec.core.url_to_fs(self.storage_dir)
        fs.makedirs(path, exist_ok=True)
        self.driver = driver or LocalProcessDriver(config, self.work_dir)
        self.rm = ResourceManager(config, self.driver)
        # typed as the ResourceManager whose every attribute it forwards
        self.rm_proxy = cast(ResourceManager, ResourceManagerProxy(self))
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self.dispatcher = Dispatcher(config, self.rm_proxy, cluster_id, self.storage_dir, target, self.shutdown,
                                     ArtifactCache(os.path.join(self.work_dir, "artifacts")))
        self.server = RpcServer(config[Options.RPC_ADDRESS], config[Options.RPC_PORT], {
            DISPATCHER: DispatcherHandler(self.dispatcher).processor(),
            RESOURCE_MANAGER: ResourceManagerHandler(self.rm_proxy).processor(),
            JOB_MASTER: JobMasterHandler(self.dispatcher).processor(),
        }, name="appmaster")

    @property
    def address(self) -> str:
        return self.server.address

    def start(self) -> AppMaster:
        self.server.start()
        self.dispatcher.address = self.server.address
        self.rm.start(self.server.address)
        log.info("AppMaster of cluster %s running at %s (work dir %s, storage %s)", self.cluster_id,
                 self.address, self.work_dir, self.storage_dir)
        return self

    def replace_resource_manager(self) -> ResourceManager:
        """A new ResourceManager leader takes over (as after a leadership change): the old one
        is suspended, TaskExecutors re-register with the new one (their heartbeats are refused
        for the stale fencing token), and JobMasters reconnect and ask again for the slots they
        still wait for."""
        old = self.rm
        old.suspend()
        self.rm = ResourceManager(self.config, self.driver)
        self.rm.start(self.server.address)
        log.info("ResourceManager %s replaced %s", self.rm.fencing_token, old.fencing_token)
        return self.rm

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def shutdown(self) -> None:
        with self._stop_lock:
            if self._stopped.is_set():
                return
            log.info("AppMaster shutting down")
            self.dispatcher._accepting = False  # noqa: SLF001
            self.dispatcher.cancel_all(timeout_s=10)
            self.rm.stop()
            self.server.stop()
            self._stopped.set()
            log.info("AppMaster stopped")
