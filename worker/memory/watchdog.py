"""The TaskExecutor's memory watchdog: it measures the process, logs and reports when it comes
near its size, and fails its tasks before YARN kills the container.

YARN's NodeManager kills a container whose processes use more physical memory than it asked for
(``taskmanager.memory.process.size``): exit 143, "running beyond physical memory limits", and a
job that restarts for a reason its user never sees. Every ``taskmanager.memory.watchdog.interval``
the watchdog measures the resident memory of the TaskExecutor and its child processes (what
the NodeManager measures) and the parts it can name:

- Arrow's memory pool (the operators' batches; bounded on its own by
  ``taskmanager.memory.task.off-heap.size`` when that is set),
- managed memory (what batch operators reserved, and the slots' shared RocksDB memory, of which
  the block caches' current use is shown too),
- the rest: the interpreter, libraries, Python objects of user functions.

At ``warn-ratio`` of the size it logs once (with those parts) and reports the level ``warning``
in its heartbeats (REST ``/taskmanagers/:id`` ``memory``) and metrics. At ``fail-ratio``, when
the size is enforced (in a YARN container), it fails every running task with a
``MemoryLimitError`` that names the limit, the key to raise and the parts; it does the same
when Arrow's pool passes ``task.off-heap.size``. Ending the tasks lets go of their memory; the
watchdog then gives freed memory back to the system (``gc``, Arrow's pool, glibc's
``malloc_trim``). The JobMaster restarts the job as after any failure, and fails it for good
after ``restart-strategy.max-memory-failures`` such failures in a row with no checkpoint
completed in between: a job that cannot fit does not restart forever. A TaskExecutor that
stays at the limit with no task left to fail (memory held by something its tasks left behind,
such as a module global of user code) exits after ``STUCK_CHECKS`` measurements, so YARN gives
its slots a fresh container.

Outside YARN (the embedded local cluster) nothing kills a process for its size, so the
watchdog only warns there.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import psutil
import pyarrow as pa

from yarnflow.common.errors import MemoryLimitError
from yarnflow.common.memory import release_free_memory
from yarnflow.common.messages import MemoryStatus

log = logging.getLogger(__name__)

__all__ = ["MemoryWatchdog", "enforced_here", "process_tree_rss"]

MB = 1 << 20
#: measurements after failing tasks at which freed memory is given back to the system
TRIM_TICKS = 10
#: measurements at the limit with no task to fail (after the trims) before the process exits
STUCK_CHECKS = 25


def enforced_here() -> bool:
    """Whether this process runs in a YARN container (whose NodeManager enforces its size)."""
    return bool(os.environ.get("CONTAINER_ID"))


def process_tree_rss(proc: psutil.Process) -> int:
    """Resident bytes of ``proc`` and every process under it (as YARN counts a container)."""
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return int(total)


class MemoryWatchdog:
    """Watches a TaskExecutor of ``limit_bytes``. ``parts()`` gives ``(managed total, managed
    used, rocksdb cache use)`` bytes; ``fail_tasks(error)`` fails the running tasks and returns
    how many it failed. ``check()`` is one measurement (the thread calls it every
    ``interval_ms``)."""

    def __init__(self, name: str, limit_bytes: int, *, interval_ms: int = 200, warn_ratio: float = 0.85,
                 fail_ratio: float = 0.95, arrow_limit_bytes: int = 0, enforce: bool | None = None,
                 parts: Callable[[], tuple[int, int, int]] = lambda: (0, 0, 0),
                 fail_tasks: Callable[[MemoryLimitError], int] = lambda error: 0,
                 measure: Callable[[], int] | None = None, arrow_bytes: Callable[[], int] | None = None,
                 on_stuck: Callable[[str], None] = lambda why: None) -> None:
        self.name = name
        self.limit = int(limit_bytes)
        self.interval_ms = interval_ms
        self.warn_at = int(self.limit * warn_ratio)
        self.fail_at = int(self.limit * fail_ratio)
        self.arrow_limit = int(arrow_limit_bytes)
        self.enforce = enforced_here() if enforce is None else enforce
        self._parts = parts
        self._fail_tasks = fail_tasks
        proc = psutil.Process()
        self._measure = measure or (lambda: process_tree_rss(proc))
        self._arrow = arrow_bytes or pa.total_allocated_bytes
        self.level = "ok"
        self.used = self.peak = self.arrow_used = 0
        self._proc = proc
        proc.cpu_percent(None)  # (the first reading starts the measurement)
        #: cores the process used since the previous check (1.5: one and a half)
        self.cpu_load = 0.0
        #: times the watchdog failed tasks
        self.failures = 0
        self._trims_left = 0
        self._stuck = 0
        self._on_stuck = on_stuck
        self._stop = threading.Event()

    @classmethod
    def from_config(cls, name: str, config: Any, **kw: Any) -> MemoryWatchdog:
        from yarnflow.common.config import Options

        return cls(name, config[Options.TM_MEMORY], interval_ms=config[Options.WATCHDOG_INTERVAL],
                   warn_ratio=config[Options.WATCHDOG_WARN], fail_ratio=config[Options.WATCHDOG_FAIL],
                   arrow_limit_bytes=config[Options.TASK_OFF_HEAP], **kw)

    def start(self) -> MemoryWatchdog:
        if self.interval_ms > 0 and self.limit > 0:
            threading.Thread(target=self._loop, name="te-memory-watchdog", daemon=True).start()
            log.info("memory watchdog: %s may use %.0f MB; warns at %.0f MB%s", self.name, self.limit / MB,
                     self.warn_at / MB, f", fails its tasks at {self.fail_at / MB:.0f} MB" if self.enforce
                     else " (not in a YARN container: it does not fail tasks)")
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_ms / 1000.0):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watchdog must outlive a bad measurement
                log.warning("memory watchdog: a measurement failed", exc_info=True)

    def check(self) -> str:
        """Measure once, act on it; returns the level (ok, warning, critical)."""
        used, arrow = self._measure(), int(self._arrow())
        self.cpu_load = round(self._proc.cpu_percent(None) / 100.0, 3)
        self.used, self.arrow_used, self.peak = used, arrow, max(self.peak, used)
        over_arrow = self.arrow_limit > 0 and arrow > self.arrow_limit
        level = "critical" if used >= self.fail_at or over_arrow else "warning" if used >= self.warn_at else "ok"
        if level != "ok" and self.level == "ok":
            log.warning("memory watchdog: %s", self.describe())
        elif level == "ok" and self.level != "ok":
            log.info("memory watchdog: %s is back to %.0f MB of %.0f MB", self.name, used / MB, self.limit / MB)
        self.level = level
        if level == "critical" and (self.enforce or over_arrow):
            failed = self._fail_tasks(MemoryLimitError(self.describe(failing=True)))
            if failed:
                self.failures += 1
                self._trims_left = TRIM_TICKS
                log.error("memory watchdog: failed %d tasks: %s", failed, self.describe())
            elif self._trims_left == 0 and self.enforce and used >= self.fail_at:
                self._stuck += 1
                if self._stuck == STUCK_CHECKS:
                    log.error("memory watchdog: no task runs and %s stays at its limit: exiting so that a fresh "
                              "container replaces it", self.name)
                    self._on_stuck(f"it stayed at its memory limit with no task running ({self.describe()})")
        else:
            self._stuck = 0
        if self._trims_left > 0:  # while the failed tasks wind down
            self._trims_left -= 1
            release_free_memory()
        return level

    def describe(self, failing: bool = False) -> str:
        """Where the memory is, for a log line or a failure's cause."""
        managed_total, managed_used, rocksdb = self._parts()
        rest = max(0, self.used - self.arrow_used - managed_used)
        parts = (f"Arrow buffers {self.arrow_used / MB:.0f} MB, managed memory {managed_used / MB:.0f} of "
                 f"{managed_total / MB:.0f} MB reserved (RocksDB caches hold {rocksdb / MB:.0f} MB), the rest "
                 f"(Python objects, libraries) {rest / MB:.0f} MB")
        if self.arrow_limit and self.arrow_used > self.arrow_limit:
            head = (f"{self.name}: Arrow's memory pool holds {self.arrow_used / MB:.0f} MB, more than "
                    f"taskmanager.memory.task.off-heap.size ({self.arrow_limit / MB:.0f} MB)")
        else:
            head = (f"{self.name} uses {self.used / MB:.0f} MB of its {self.limit / MB:.0f} MB "
                    f"(taskmanager.memory.process.size)")
        if not failing:
            return f"{head}: {parts}"
        return (f"{head}, so its tasks were failed before YARN kills the container "
                f"(taskmanager.memory.watchdog.fail-ratio); {parts}. Give the TaskExecutors more memory "
                f"(taskmanager.memory.process.size) or fewer slots, or make the job hold less")

    def status(self) -> MemoryStatus:
        managed_total, managed_used, rocksdb = self._parts()
        return MemoryStatus(self.used, self.peak, self.limit, self.arrow_used, managed_total, managed_used, rocksdb,
                            self.level, self.cpu_load)
