"""The Spark cluster the AppMaster runs for Spark stages: Spark's standalone master and workers
(``yarnflow.worker.spark_daemon``) on the cluster's resources, YARN containers of the
application or local processes, started when a stage first asks and stopped when none has
asked for ``spark-stages.idle-timeout``.

A Spark stage's driver subtask asks its TaskExecutor's ResourceManager for a master
(``requestSparkMaster``, polled: a master takes a few seconds to come up); the answer is the
master's URL, ``"local"`` (Spark runs as ``local[N]`` inside the TaskExecutor: the default off
YARN, ``spark-stages.executors: taskexecutor``), or ``""`` while it starts. ``SparkCluster``
is a pure core driven by those requests and by ``check`` (the ResourceManager's periodic
timer): it starts the master, then ``spark.executor.instances`` workers (each with
``spark.executor.cores`` cores and room for one executor of ``spark.executor.memory``) once
the master's URL is known, replaces workers that died while the cluster is in use (a lost
executor is Spark's to retry: its tasks run again on the others), and stops everything when it
has been idle. The daemons themselves are the resource driver's (``SparkDaemons``).

Settings come from the AppMaster's configuration, overridden by the ``spark.*`` keys of the
first job that asks (a standalone cluster is shared: a later job with other sizes gets the
running one).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from yarnflow.common.clock import Clock

log = logging.getLogger(__name__)

__all__ = ["LOCAL", "SparkCluster", "SparkClusterSettings", "SparkDaemons", "executor_memory_mb"]

#: the answer that tells a stage to run Spark inside its TaskExecutor (``local[N]``)
LOCAL = "local"


class SparkDaemons(Protocol):
    """What a resource driver offers to run Spark's standalone daemons."""

    #: the daemons run in containers of their own (YARN): the default for Spark stages there
    spark_in_containers: bool

    def start_spark_master(self) -> str:
        """Start a master; returns a handle for the calls below."""
        ...

    def spark_master_url(self, handle: str) -> str | None:
        """The master's ``spark://`` URL once it accepts connections, else None (no waiting)."""
        ...

    def start_spark_worker(self, master_url: str, memory_mb: int, cores: int) -> str:
        """Start a worker offering ``cores`` cores and ``memory_mb`` MB to executors."""
        ...

    def spark_daemon_alive(self, handle: str) -> bool: ...

    def stop_spark_daemon(self, handle: str) -> None: ...


def executor_memory_mb(value: str) -> int:
    """A Spark memory string (``512m``, ``2g``; a bare number is MiB) in MiB."""
    text = value.strip().lower().rstrip("b")
    units = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
    if text and text[-1] in units:
        return max(1, int(float(text[:-1]) * units[text[-1]]))
    return int(float(text))


@dataclass(frozen=True)
class SparkClusterSettings:
    workers: int = 2
    cores: int = 1
    executor_memory_mb: int = 1024
    idle_timeout_ms: int = 60_000

    @classmethod
    def of(cls, settings: Mapping[str, str], idle_timeout_ms: int) -> SparkClusterSettings:
        """From ``spark.executor.instances`` / ``.cores`` / ``.memory`` (Spark's keys)."""
        try:
            return cls(max(1, int(settings.get("spark.executor.instances") or 2)),
                       max(1, int(settings.get("spark.executor.cores") or 1)),
                       executor_memory_mb(settings.get("spark.executor.memory") or "1g"), idle_timeout_ms)
        except ValueError as exc:
            raise ValueError(f"bad Spark executor setting: {exc}") from None


class SparkCluster:
    """One AppMaster's Spark standalone cluster (see the module docstring)."""

    def __init__(self, daemons: SparkDaemons, clock: Clock, defaults: Mapping[str, str], idle_timeout_ms: int) -> None:
        self._daemons = daemons
        self._clock = clock
        self._defaults = dict(defaults)
        self._idle_timeout_ms = idle_timeout_ms
        self.settings: SparkClusterSettings | None = None
        self.master: str | None = None
        self.url: str | None = None
        self.workers: list[str] = []
        self.replaced = 0
        self._last_use = 0

    @property
    def running(self) -> bool:
        return self.master is not None

    def request(self, settings: Mapping[str, str]) -> str:
        """A stage wants Spark: the master's URL once it is up (``""`` until then)."""
        self._last_use = self._clock.monotonic_ms()
        if self.master is None:
            self.settings = SparkClusterSettings.of({**self._defaults, **settings}, self._idle_timeout_ms)
            self.master = self._daemons.start_spark_master()
            log.info("starting a Spark master (%s) for Spark stages, then %d workers of %d cores and %d MB",
                     self.master, self.settings.workers, self.settings.cores, self.settings.executor_memory_mb)
            return ""
        if self.url is None:
            self.url = self._daemons.spark_master_url(self.master)
            if self.url is None:
                if not self._daemons.spark_daemon_alive(self.master):
                    log.warning("the Spark master %s ended before it was up: starting another", self.master)
                    self.master = self._daemons.start_spark_master()
                return ""
            log.info("Spark master %s is up at %s", self.master, self.url)
        self._keep_workers()
        return self.url

    def _keep_workers(self) -> None:
        assert self.settings is not None and self.url is not None
        alive = [w for w in self.workers if self._daemons.spark_daemon_alive(w)]
        lost = len(self.workers) - len(alive)
        if lost:
            log.warning("%d Spark worker(s) ended: starting new ones (Spark runs their tasks again elsewhere)", lost)
            self.replaced += lost
        self.workers = alive
        while len(self.workers) < self.settings.workers:
            self.workers.append(self._daemons.start_spark_worker(self.url, self.settings.executor_memory_mb,
                                                                 self.settings.cores))

    def check(self) -> None:
        """The periodic look: stop an idle cluster; keep a busy one's workers."""
        if self.master is None:
            return
        if self._clock.monotonic_ms() - self._last_use >= self._idle_timeout_ms:
            log.info("no Spark stage asked for %d ms: stopping the Spark master and its %d workers",
                     self._idle_timeout_ms, len(self.workers))
            self.stop()
        elif self.url is not None:
            if not self._daemons.spark_daemon_alive(self.master):
                log.warning("the Spark master %s ended: the next stage starts another", self.master)
                self.stop()
            else:
                self._keep_workers()

    def stop(self) -> None:
        for handle in [*self.workers, *([self.master] if self.master else [])]:
            try:
                self._daemons.stop_spark_daemon(handle)
            except Exception:  # noqa: BLE001 - stopping: the rest go anyway
                log.warning("stopping Spark daemon %s failed", handle, exc_info=True)
        self.master, self.url, self.workers = None, None, []
