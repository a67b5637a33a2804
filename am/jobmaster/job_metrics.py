"""What the JobMaster reports with the job's status (Flink's job metrics): each vertex's
subtasks (state, attempt, TaskExecutor, figures) and the checkpoint counts. Task figures come
from the TaskExecutors' heartbeats (``TaskMetrics``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from yarnflow.am.jobmaster.checkpointing import JobCheckpoints
from yarnflow.am.jobmaster.execution_graph import ExecutionGraph
from yarnflow.common.messages import CheckpointCounts, CheckpointInfo, TaskMetrics, VertexStatus
from yarnflow.common.states import ExecutionState


def vertex_statuses(graph: ExecutionGraph) -> list[VertexStatus]:
    """Each vertex's subtasks, as their current attempts stand."""
    statuses = []
    for vid, ejv in graph.vertices.items():
        counts: dict[ExecutionState, int] = {}
        active = ejv.active
        for ev in active:
            counts[ev.current.state] = counts.get(ev.current.state, 0) + 1
        statuses.append(VertexStatus(vid, ejv.job_vertex.name, ejv.parallelism, counts,
                                     [ev.current.attempt_number for ev in active],
                                     [str(ev.current.slot.resource_id) if ev.current.slot else "" for ev in active],
                                     [ev.current.state for ev in active],
                                     [_figures(ev.current) for ev in active],
                                     [dict(ev.current.timestamps) for ev in active]))
    return statuses


#: the figures of a moment, not of a total: an ended task's are zero (its last heartbeat's were
#: shown on a CANCELED job, "out 20.0k/s")
_RATES = ("records_in_per_second", "records_out_per_second", "bytes_in_per_second", "bytes_out_per_second",
          "busy_ms_per_second", "backpressured_ms_per_second", "idle_ms_per_second")


def _figures(execution: Any) -> TaskMetrics:
    metrics = execution.metrics or TaskMetrics(execution.records_in, execution.records_out)
    if execution.state.is_terminal:
        metrics = dataclasses.replace(metrics, **{rate: 0.0 for rate in _RATES})
    return metrics


def checkpoint_summary(checkpoints: JobCheckpoints | None) -> tuple[list[CheckpointInfo], int, CheckpointCounts]:
    """(the latest checkpoints, the id of the latest completed one or 0, the counts); nothing for
    a job without checkpoints (BATCH)."""
    if checkpoints is None:
        return [], 0, CheckpointCounts()
    return checkpoints.infos(), checkpoints.latest_completed_id(), CheckpointCounts(*checkpoints.coordinator.counts())


def kept_checkpoint_subtasks(core: Any) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """Each shown checkpoint's part per subtask (``checkpoint_subtasks``), taken as the job
    ends: the Dispatcher keeps them with the ended job's figures."""
    checkpoints = core.checkpoints
    if checkpoints is None:
        return {}
    out = {}
    for info in checkpoints.infos():
        rows = checkpoint_subtasks(core, info.checkpoint_id)
        if rows is not None:
            out[info.checkpoint_id] = rows
    return out


def checkpoint_subtasks(core: Any, checkpoint_id: int) -> dict[str, list[dict[str, Any]]] | None:
    """Per vertex, each subtask's part of a recent checkpoint: its acknowledgement (when, state
    bytes, sync and async time, alignment, start delay, unaligned and in-flight bytes) or that it is still pending; None when the
    checkpoint is not among the kept ones."""
    checkpoints = core.checkpoints
    if checkpoints is None:
        return None
    coordinator = checkpoints.coordinator
    stats = next((s for s in coordinator.history if s.checkpoint_id == checkpoint_id), None)
    if stats is None:
        return None
    out: dict[str, list[dict[str, Any]]] = {}
    for attempt_id, ack in stats.acks.items():
        ex = core.graph.execution(attempt_id)
        if ex is not None:
            out.setdefault(str(ex.vertex.job_vertex.vertex_id), []).append({
                "index": ex.vertex.subtask_index, "status": "completed", "ack_timestamp": ack.at_ms,
                "end_to_end_duration": ack.at_ms - stats.trigger_time_ms, "state_size": ack.state_size,
                "checkpointed_size": ack.state_size, "checkpoint": {"sync": ack.sync_ms, "async": ack.async_ms},
                "alignment": {"buffered": 0, "processed": 0, "persisted": ack.inflight_bytes,
                              "duration": ack.alignment_ms},
                "start_delay": ack.start_delay_ms, "unaligned_checkpoint": ack.unaligned, "aborted": False})
    for attempt_id in coordinator.awaiting(checkpoint_id):
        ex = core.graph.execution(attempt_id)
        if ex is not None:
            out.setdefault(str(ex.vertex.job_vertex.vertex_id), []).append(
                {"index": ex.vertex.subtask_index, "status": "pending_or_failed"})
    for sid in checkpoints.finished_before(checkpoint_id):  # (in it as finished: nothing to acknowledge)
        out.setdefault(str(sid.vertex_id), []).append({"index": sid.index, "status": "finished"})
    for rows in out.values():
        rows.sort(key=lambda r: r["index"])
    return out
