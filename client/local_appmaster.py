"""The embedded local cluster's AppMaster on threads of the calling process, as Flink's
MiniCluster runs its JobManager: one Python process fewer (~90 MB of resident memory: pyarrow's
libraries and the interpreter's modules, loaded once instead of twice) and no interpreter to
start before the first job.

``LocalCluster(appmaster_in_process=True)`` uses it; ``yarnflow run`` and ``env.execute()``
without a cluster address do, unless ZooKeeper high availability is configured (failing over
needs AppMasters that can die apart from the client). ``yarnflow session start`` keeps the
AppMaster in a process of its own.

What changes for the calling process while the cluster runs:

- the TaskExecutors are its children (they die with it, as they died with the AppMaster);
- yarnflow's log records (the AppMaster's and the client's alike) are written to the cluster's
  ``log/appmaster.log`` at ``YARNFLOW_LOG_LEVEL`` (default INFO); those of the client's and
  the shared modules reach the process's own log handlers as before, at the levels its logging
  configuration lets through, the AppMaster's own (``yarnflow.am``) do not, as from a process;
- the AppMaster's process-wide settings (``process.memory.*``, signal handlers) are not applied:
  the process is the caller's.

``InProcessAppMaster`` offers the part of ``subprocess.Popen``'s interface ``LocalCluster``
uses, so that the cluster's start, wait and stop logic is the same for both."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from typing import TYPE_CHECKING, Mapping

from yarnflow.common import logs
from yarnflow.common.config import Configuration

if TYPE_CHECKING:
    from yarnflow.am.resourcemanager.drivers.warm_workers import WarmWorkers

_LOGGER = "yarnflow"
_AM_LOGGER = "yarnflow.am"


class _ToOwnHandlers(logging.Handler):
    """Hands a record on to the handlers it would have reached had the ``yarnflow`` logger kept
    its own level and propagation: those of its ancestors, at their effective level. The
    AppMaster's own records (``yarnflow.am``) are not handed on: as from an AppMaster process,
    they go to the cluster's log only (its warnings, such as a TaskExecutor's slot taken again
    after a retry, are about the cluster's insides, not about the user's job)."""

    def __init__(self, logger: logging.Logger, level: int) -> None:
        super().__init__()
        self._logger = logger
        self._level = level  # the yarnflow logger's effective level before the cluster

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < self._level or record.name == _AM_LOGGER or record.name.startswith(_AM_LOGGER + "."):
            return
        parent = self._logger.parent
        found = False
        while parent is not None:
            for handler in parent.handlers:
                found = True
                if record.levelno >= handler.level:
                    handler.handle(record)
            parent = parent.parent if parent.propagate else None
        if not found and logging.lastResort is not None and record.levelno >= logging.lastResort.level:
            logging.lastResort.handle(record)


class _ClusterLog:
    """While a cluster runs, yarnflow's records also go to its log file. Clusters may nest: the
    logger's settings are changed by the first and restored by the last."""

    _lock = threading.Lock()
    _active = 0
    _saved: tuple[int, bool] = (logging.NOTSET, True)
    _forward: _ToOwnHandlers | None = None

    def __init__(self, path: str) -> None:
        self._file = logging.FileHandler(path, encoding="utf-8")
        self._file.setFormatter(logging.Formatter(logs.FORMAT))
        self._file.addFilter(logs.JobTagFilter())
        self._file.setLevel(os.environ.get("YARNFLOW_LOG_LEVEL", "INFO").upper())
        logger = logging.getLogger(_LOGGER)
        cls = type(self)
        with cls._lock:
            if cls._active == 0:
                cls._saved = (logger.level, logger.propagate)
                cls._forward = _ToOwnHandlers(logger, logger.getEffectiveLevel())
                logger.addHandler(cls._forward)
                logger.propagate = False
                logger.setLevel(min(self._file.level, logger.getEffectiveLevel()))
            cls._active += 1
            logger.addHandler(self._file)

    def close(self) -> None:
        logger = logging.getLogger(_LOGGER)
        cls = type(self)
        with cls._lock:
            if self._file not in logger.handlers:
                return
            logger.removeHandler(self._file)
            cls._active -= 1
            if cls._active == 0:
                logger.setLevel(cls._saved[0])
                logger.propagate = cls._saved[1]
                if cls._forward is not None:
                    logger.removeHandler(cls._forward)
                    cls._forward = None
        self._file.close()


class InProcessAppMaster:
    """A started AppMaster on this process's threads, looking like the ``Popen`` of one."""

    def __init__(self, config: Configuration, cluster_id: str, work_dir: str, log_path: str,
                 worker_env: Mapping[str, str], warm: WarmWorkers | None = None) -> None:
        from yarnflow.am.appmaster import AppMaster
        from yarnflow.am.resourcemanager.drivers.local import LocalProcessDriver

        self.pid = os.getpid()
        self.returncode: int | None = None
        self.args = f"AppMaster of cluster {cluster_id} (in process {self.pid})"
        self._log = _ClusterLog(log_path)
        try:
            self._driver = LocalProcessDriver(config, work_dir, env=worker_env, warm=warm)
            self.appmaster = AppMaster(config, cluster_id, "local", driver=self._driver, work_dir=work_dir)
            try:
                self.appmaster.start()
            except BaseException:
                self.appmaster.shutdown()  # what it started before it failed
                raise
        except BaseException:
            self._log.close()
            raise
        self.address = self.appmaster.address
        # the log file is closed once the AppMaster's shutdown is over, whoever started it
        threading.Thread(target=self._close_log_when_finished, name="appmaster-log", daemon=True).start()

    def _close_log_when_finished(self) -> None:
        self.appmaster.wait_finished()
        self._log.close()

    def poll(self) -> int | None:
        if self.returncode is None and self.appmaster.wait_finished(0):
            self._log.close()
            self.returncode = 0
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Until its shutdown is over (the log file closed, the ``yarnflow`` logger as it was)."""
        if not self.appmaster.wait_finished(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        self._log.close()
        self.returncode = 0
        return 0

    def send_signal(self, _signum: int) -> None:
        """Any signal asks the AppMaster to shut down, as SIGTERM asks its process."""
        threading.Thread(target=self.appmaster.shutdown, name="shutdown", daemon=True).start()

    def terminate(self) -> None:
        self.send_signal(0)

    def kill(self) -> None:
        """What SIGKILL of its process does to a cluster without high availability: its
        TaskExecutors die at once. Safe in a signal handler (it only sends signals);
        ``LocalCluster.stop()`` still has to be called to stop the AppMaster's threads."""
        self._driver.kill_workers()
