"""Failure handling for one job (Flink's ExecutionFailureHandler): a pure core.

Given a failed subtask, it asks the failover strategy (full / region) which subtasks must
restart and the restart strategy whether and after what backoff they may; every failure goes
into a bounded failure history (Flink's exception history), oldest first.

Memory failures (a TaskExecutor's watchdog failed its tasks near its container's size, or YARN
killed a container for its memory) are counted as well: a job whose tasks do not fit would
otherwise restart forever, the same way each time. After ``max_memory_failures`` of them with
no checkpoint completed in between (``restart-strategy.max-memory-failures``), the job fails
for good with the last one as its cause.

It decides; the JobMaster core carries the decision out (cancel, wait, reset, redeploy).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from yarnflow.am.scheduler.failover import FailoverStrategy, PartitionUnavailable
from yarnflow.am.scheduler.regions import SubtaskId
from yarnflow.am.scheduler.restart import RestartStrategy
from yarnflow.common.clock import Clock
from yarnflow.common.messages import ErrorInfo, FailureEntry

log = logging.getLogger(__name__)

DEFAULT_HISTORY_SIZE = 16
#: YARN's diagnostics of a container killed for its memory (Hadoop 2 and 3 wordings, and the
#: sandbox's), as a lost TaskExecutor's error carries them
_YARN_MEMORY_KILL = re.compile(r"beyond (the 'PHYSICAL' memory limit|physical memory limits)|physical memory used",
                               re.IGNORECASE)


def is_memory_failure(error: ErrorInfo) -> bool:
    """Whether ``error`` is a TaskExecutor running out of its memory: its watchdog's
    ``MemoryLimitError``, or a container YARN killed for its size."""
    return error.error_class == "MemoryLimitError" or (
        error.error_class == "TaskExecutorLostError" and bool(_YARN_MEMORY_KILL.search(error.message)))


@dataclass(frozen=True)
class FailureDecision:
    """What to do about a failure: restart ``to_restart`` after ``backoff_ms``, or, when
    ``can_restart`` is False, fail the job."""

    can_restart: bool
    to_restart: frozenset[SubtaskId]
    backoff_ms: int
    error: ErrorInfo


def explained_by(root: ErrorInfo, seen: ErrorInfo, task: str = "") -> ErrorInfo:
    """``root`` as the cause of the failure ``seen`` (by ``task``), which it explains."""
    by = f" by {task}" if task else ""
    return dataclasses.replace(root, message=f"{root.message} (seen first{by} as {seen.describe()})",
                               traceback=root.traceback or seen.traceback)


class FailureHandler:
    def __init__(self, failover: FailoverStrategy, restart: RestartStrategy, clock: Clock,
                 history_size: int = DEFAULT_HISTORY_SIZE, max_memory_failures: int = 3) -> None:
        self.failover = failover
        self.restart = restart
        self.max_memory_failures = max_memory_failures
        #: memory failures since the latest completed checkpoint ``_memory_checkpoint``
        self.memory_failures = 0
        self._memory_checkpoint = -1
        self._clock = clock
        self._history: collections.deque[FailureEntry] = collections.deque(maxlen=history_size)
        self.total_failures = 0
        #: failures that restarted subtasks (Flink's numRestarts)
        self.restarts = 0

    def task_failed(self, failed: SubtaskId, task_name: str, error: ErrorInfo,
                    cause: PartitionUnavailable | None,
                    finished: Callable[[SubtaskId], bool],
                    result_available: Callable[[SubtaskId], bool], checkpoint_id: int = 0) -> FailureDecision:
        """A subtask failed: which subtasks restart, and when (or that the job must fail).
        ``checkpoint_id``: the job's latest completed checkpoint."""
        self.restart.notify_failure(self._clock.monotonic_ms())
        final = self.memory_failure(error, checkpoint_id)
        if final is not None:
            self._record(task_name, final, 0)
            return FailureDecision(False, frozenset(), 0, final)
        if not self.restart.can_restart():
            self._record(task_name, error, 0)
            return FailureDecision(False, frozenset(), 0, error)
        to_restart = frozenset(self.failover.tasks_to_restart(failed, cause, finished, result_available))
        self._record(task_name, error, len(to_restart))
        self.restarts += 1
        return FailureDecision(True, to_restart, self.restart.backoff_ms(), error)

    def blame(self, root: ErrorInfo, since_ms: int, knock_on: Callable[[ErrorInfo], bool],
              latest_only: bool = False) -> int:
        """``root`` (a TaskExecutor lost, with its container's diagnostics) explains the
        knock-on failures recorded since ``since_ms``: consumers that could no longer read from
        it reported their failure before its loss was known. Those entries name ``root`` as
        their cause, what was seen first kept after it. Returns how many it explains."""
        explained = 0
        for i, entry in enumerate(self._history):
            if latest_only and i != len(self._history) - 1:
                continue
            if entry.timestamp_ms >= since_ms and knock_on(entry.error):
                self._history[i] = dataclasses.replace(entry, error=explained_by(root, entry.error, entry.task))
                explained += 1
        return explained

    def memory_failure(self, error: ErrorInfo, checkpoint_id: int) -> ErrorInfo | None:
        """Count ``error`` if it is a memory failure (``checkpoint_id``: the job's latest completed
        checkpoint now); the cause to fail the job with once there were too many, else None."""
        if not is_memory_failure(error):
            return None
        if checkpoint_id != self._memory_checkpoint:  # progress since the last one: count afresh
            self._memory_checkpoint, self.memory_failures = checkpoint_id, 0
        self.memory_failures += 1
        log.info("memory failure %d in a row (restart-strategy.max-memory-failures: %s): %s", self.memory_failures,
                 self.max_memory_failures or "no limit", error.message)
        if not self.max_memory_failures or self.memory_failures < self.max_memory_failures:
            return None
        return dataclasses.replace(error, message=(
            f"{error.message} [memory failure {self.memory_failures} in a row with no checkpoint completed in "
            f"between: restarting does not help, so the job fails (restart-strategy.max-memory-failures: "
            f"{self.max_memory_failures})]"))

    def global_failure(self, error: ErrorInfo) -> None:
        """A failure of the whole job (no restart): recorded only."""
        self._record("", error, 0)

    def _record(self, task: str, error: ErrorInfo, restarted: int) -> None:
        self.total_failures += 1
        self._history.append(FailureEntry(self._clock.now_ms(), task, error, restarted))

    def note_restore(self, checkpoint_id: int) -> None:
        """The restart after the latest failure resumed from ``checkpoint_id``."""
        if self._history and checkpoint_id:
            self._history[-1] = dataclasses.replace(self._history[-1], restored_checkpoint_id=checkpoint_id)

    def history(self) -> list[FailureEntry]:
        """The last failures (at most the history size), oldest first."""
        return list(self._history)

    def describe(self) -> str:
        return self.restart.describe()
