"""Failover strategies: which subtasks to restart when one fails (pure; no I/O), as Flink's
``RestartAllFailoverStrategy`` and ``RestartPipelinedRegionFailoverStrategy``.

``full`` restarts every subtask. ``region`` restarts, starting from the failed subtask's region
(a breadth-first walk over pipelined regions and blocking exchanges):

1. the region of the failed subtask;
2. for every restarting region, the producer regions of its blocking inputs whose results
   are gone: a finished producer whose output ``is_result_available`` denies, and the producer
   named by a ``PartitionUnavailable`` cause (the consumer could not fetch it);
3. for every restarting region, the regions reading its blocking output that have not
   finished (they have read, or would read, output that is about to be produced again);
4. the regions reading its blocking output even when finished, when that output will differ
   from the one they read: the exchange is non-deterministic (REBALANCE), or the restarting
   region itself reads a changed input (the change propagates downstream).

Unlike Flink, the result also holds subtasks that never started (CREATED): the caller skips
those when cancelling and resetting, as Flink's ``getTasksNeedingRestart`` does.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

from yarnflow.common.errors import ConfigurationError, YarnflowError
from yarnflow.common.messages import JobGraph
from yarnflow.am.scheduler.regions import (
    BlockingExchange,
    PipelinedRegion,
    SubtaskId,
    compute_pipelined_regions,
    regions_by_subtask,
)

__all__ = [
    "FailoverStrategy",
    "PartitionUnavailable",
    "RestartAllFailoverStrategy",
    "RestartPipelinedRegionFailoverStrategy",
    "find_partition_unavailable",
    "make_failover_strategy",
]

log = logging.getLogger(__name__)

_FAILOVER_STRATEGY_KEY = "jobmanager.execution.failover-strategy"


class PartitionUnavailable(YarnflowError):
    """A consumer could not read the blocking output of ``producer`` (its TaskExecutor is gone).

    Pass it (or an exception whose ``__cause__`` / ``__context__`` chain holds it) as the
    failure cause: the region strategy then restarts the producer's region too."""

    def __init__(self, producer: SubtaskId, message: str = "") -> None:
        super().__init__(message or f"the blocking output of {producer} is not available")
        self.producer = producer


class FailoverStrategy(Protocol):
    def tasks_to_restart(self, failed: SubtaskId, cause: object | None,
                         finished: Callable[[SubtaskId], bool],
                         is_result_available: Callable[[SubtaskId], bool]) -> set[SubtaskId]:
        """The subtasks to cancel and restart after ``failed`` failed with ``cause``.

        ``finished(s)``: s's current attempt is FINISHED. ``is_result_available(s)``: the
        blocking output of finished subtask s can still be read. Raises ``KeyError`` for a
        subtask that is not in the job."""
        ...


def _all_subtasks(job_graph: JobGraph) -> frozenset[SubtaskId]:
    return frozenset(SubtaskId(str(v.vertex_id), k) for v in job_graph.vertices for k in range(v.parallelism))


class RestartAllFailoverStrategy:
    """``full``: every failure restarts every subtask of the job."""

    name = "full"

    def __init__(self, job_graph: JobGraph) -> None:
        self._all = _all_subtasks(job_graph)

    def tasks_to_restart(self, failed: SubtaskId, cause: object | None,
                         finished: Callable[[SubtaskId], bool],
                         is_result_available: Callable[[SubtaskId], bool]) -> set[SubtaskId]:
        if failed not in self._all:
            raise KeyError(f"subtask {failed} is not in the job")
        return set(self._all)


def find_partition_unavailable(cause: object | None) -> PartitionUnavailable | None:
    """The ``PartitionUnavailable`` in ``cause``'s ``__cause__`` / ``__context__`` chain, if any."""
    seen: set[int] = set()
    while isinstance(cause, BaseException) and id(cause) not in seen:
        if isinstance(cause, PartitionUnavailable):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


class RestartPipelinedRegionFailoverStrategy:
    """``region``: restart the failed subtask's pipelined region and what depends on it (see
    the module docstring for the rules)."""

    name = "region"

    def __init__(self, job_graph: JobGraph) -> None:
        self.regions: list[PipelinedRegion] = compute_pipelined_regions(job_graph)
        self._region_of: dict[SubtaskId, PipelinedRegion] = regions_by_subtask(self.regions)

    def region_of(self, subtask: SubtaskId) -> PipelinedRegion:
        try:
            return self._region_of[subtask]
        except KeyError:
            raise KeyError(f"subtask {subtask} is not in the job") from None

    def tasks_to_restart(self, failed: SubtaskId, cause: object | None,
                         finished: Callable[[SubtaskId], bool],
                         is_result_available: Callable[[SubtaskId], bool]) -> set[SubtaskId]:
        regions = self.regions_to_restart(failed, cause, finished, is_result_available)
        return {s for r in regions for s in r.subtasks}

    def regions_to_restart(self, failed: SubtaskId, cause: object | None,
                           finished: Callable[[SubtaskId], bool],
                           is_result_available: Callable[[SubtaskId], bool]) -> list[PipelinedRegion]:
        """The regions to restart, in topological order."""
        failed_region = self.region_of(failed)
        lost = find_partition_unavailable(cause)
        lost_producer = lost.producer if lost is not None else None

        def result_lost(p: SubtaskId) -> bool:
            return p == lost_producer or (finished(p) and not is_result_available(p))

        region_done: dict[PipelinedRegion, bool] = {}

        def is_finished(r: PipelinedRegion) -> bool:
            if r not in region_done:
                region_done[r] = all(finished(s) for s in r.subtasks)
            return region_done[r]

        restart: set[PipelinedRegion] = set()
        changed: set[PipelinedRegion] = set()   # restarting regions whose output will differ
        queue: deque[PipelinedRegion] = deque()

        def add(r: PipelinedRegion, output_changes: bool) -> None:
            fresh = r not in restart
            restart.add(r)
            if output_changes and r not in changed:
                changed.add(r)
                queue.append(r)       # look at its outputs again, now as changed
            elif fresh:
                queue.append(r)

        add(failed_region, False)
        if lost_producer is not None:
            add(self.region_of(lost_producer), False)

        inputs_seen: set[BlockingExchange] = set()
        outputs_seen: dict[BlockingExchange, bool] = {}   # exchange -> visited as changed
        while queue:
            r = queue.popleft()
            for x in r.consumed_exchanges:
                if x in inputs_seen:
                    continue
                inputs_seen.add(x)
                for p in x.producers:
                    if result_lost(p):
                        add(self._region_of[p], False)
            for x in r.produced_exchanges:
                differs = r in changed or not x.is_deterministic
                if x in outputs_seen and (outputs_seen[x] or not differs):
                    continue
                outputs_seen[x] = differs
                for c in x.consumer_regions:
                    if differs:
                        add(c, True)
                    elif not is_finished(c):
                        add(c, False)
        ordered = sorted(restart, key=lambda reg: reg.region_id)
        log.debug("failure of %s restarts %d of %d regions", failed, len(ordered), len(self.regions))
        return ordered


def make_failover_strategy(name: str, job_graph: JobGraph) -> FailoverStrategy:
    """``full`` or ``region`` (the values of jobmanager.execution.failover-strategy, any case).

    Raises ``ConfigurationError`` (a ``ValueError``) naming the key for any other name."""
    key = (name or "").strip().lower()
    if key == "full":
        return RestartAllFailoverStrategy(job_graph)
    if key == "region":
        return RestartPipelinedRegionFailoverStrategy(job_graph)
    raise ConfigurationError(f"bad value {name!r} for configuration key '{_FAILOVER_STRATEGY_KEY}': "
                             "expected full or region")
