"""Job-level figures the JobMaster reports with its status (Flink's job metrics): the
checkpoint counts. Task figures come from the TaskExecutors' heartbeats (``TaskMetrics``)."""

from __future__ import annotations

from collections.abc import Iterable

from yarnflow.am.checkpoint.coordinator import CheckpointStats, CheckpointStatus
from yarnflow.common.messages import CheckpointCounts


def count_checkpoints(history: Iterable[CheckpointStats]) -> CheckpointCounts:
    """Completed, failed (aborted) and in-progress checkpoints of the job so far."""
    completed = failed = in_progress = 0
    for stats in history:
        if stats.status == CheckpointStatus.COMPLETED:
            completed += 1
        elif stats.status == CheckpointStatus.ABORTED:
            failed += 1
        else:
            in_progress += 1
    return CheckpointCounts(completed, failed, in_progress)
