"""The REST API's answers, in Flink's JSON shapes (field names as Flink's REST API v1 has them),
built from the messages the Dispatcher and the ResourceManager already give (pure functions: no
I/O, unit-tested). Figures Flink's web UI reads from its metrics endpoints (records per second,
busy / back-pressured / idle ms per second) are added to each vertex's ``metrics`` under names
of their own, which Flink clients ignore."""

from __future__ import annotations

import re
import time
from typing import Any, Iterable, Mapping

from yarnflow.common.messages import (
    CheckpointInfo,
    ErrorInfo,
    JobGraph,
    JobStatusInfo,
    TaskMetrics,
    VertexStatus,
)
from yarnflow.common.plan import job_plan
from yarnflow.common.states import ExecutionState, JobStatus

#: back-pressure levels as Flink's web UI draws them (ratio of time back-pressured)
LOW_BACKPRESSURE, HIGH_BACKPRESSURE = 0.10, 0.50


def now_ms() -> int:
    return int(time.time() * 1000)


def _duration(start_ms: int, end_ms: int) -> int:
    if start_ms <= 0:
        return -1
    return (end_ms if end_ms > 0 else now_ms()) - start_ms


def task_counts(states: Iterable[tuple[ExecutionState, int]], upper: bool = False) -> dict[str, int]:
    """A count per execution state, zeros included: lower case in ``/jobs/overview``'s ``tasks``
    (Flink's JobDetails), the states' own names (``RUNNING``) in a job's ``status-counts`` and
    its vertices' ``tasks`` (Flink's maps keyed by ExecutionState)."""
    name = (lambda s: s.name) if upper else (lambda s: s.name.lower())
    counts = {name(s): 0 for s in ExecutionState}
    for state, n in states:
        counts[name(state)] += n
    return counts


def vertex_status(v: VertexStatus) -> ExecutionState:
    return aggregate_state(v.state_counts)


def aggregate_state(state_counts: Mapping[ExecutionState, int]) -> ExecutionState:
    """Subtasks' states as Flink aggregates them (a vertex's): the furthest-behind state wins,
    except that any failure (or cancellation) shows."""
    counts = {s: n for s, n in state_counts.items() if n}
    for state in (ExecutionState.FAILED, ExecutionState.CANCELING, ExecutionState.CANCELED):
        if state in counts:
            return state
    order = [ExecutionState.CREATED, ExecutionState.RECONCILING, ExecutionState.SCHEDULED, ExecutionState.DEPLOYING,
             ExecutionState.INITIALIZING, ExecutionState.RUNNING, ExecutionState.FINISHED]
    for state in order:
        if state in counts:
            return state
    return ExecutionState.CREATED


def backpressure_level(ratio: float) -> str:
    if ratio >= HIGH_BACKPRESSURE:
        return "high"
    return "low" if ratio >= LOW_BACKPRESSURE else "ok"


def io_metrics(metrics: Iterable[TaskMetrics]) -> dict[str, Any]:
    """Flink's IOMetricsInfo summed over subtasks, plus the rates and time ratios (the
    per-second times averaged over the subtasks)."""
    ms = list(metrics)
    n = max(1, len(ms))
    out: dict[str, Any] = {
        "read-bytes": sum(m.bytes_in for m in ms), "read-bytes-complete": True,
        "write-bytes": sum(m.bytes_out for m in ms), "write-bytes-complete": True,
        "read-records": sum(m.records_in for m in ms), "read-records-complete": True,
        "write-records": sum(m.records_out for m in ms), "write-records-complete": True,
        "read-records-per-second": round(sum(m.records_in_per_second for m in ms), 1),
        "write-records-per-second": round(sum(m.records_out_per_second for m in ms), 1),
        "read-bytes-per-second": round(sum(m.bytes_in_per_second for m in ms), 1),
        "write-bytes-per-second": round(sum(m.bytes_out_per_second for m in ms), 1),
        "busy-time-ms-per-second": round(sum(m.busy_ms_per_second for m in ms) / n, 1),
        "backpressured-time-ms-per-second": round(sum(m.backpressured_ms_per_second for m in ms) / n, 1),
        "idle-time-ms-per-second": round(sum(m.idle_ms_per_second for m in ms) / n, 1),
        # yarnflow's: the managed memory of batch operators (their budgets, the most they held at
        # once, summed over subtasks) and what they spilled to disk (spilledBytes)
        "managed-memory-bytes": sum(m.managed_memory_bytes for m in ms),
        "managed-memory-peak-bytes": sum(m.managed_memory_peak for m in ms),
        "spilled-bytes": sum(m.spilled_bytes for m in ms),
        # the most bytes one remote input channel of a subtask held (credit-based flow control)
        "inflight-bytes-peak": max((m.inflight_bytes_peak for m in ms), default=0),
        "accumulated-busy-time": sum(m.busy_ms_total for m in ms),
        "accumulated-backpressured-time": sum(m.backpressured_ms_total for m in ms),
        "accumulated-idle-time": sum(m.idle_ms_total for m in ms),
        "num-late-records-dropped": sum(m.late_records_dropped for m in ms),
    }
    out["backpressure-level"] = backpressure_level(out["backpressured-time-ms-per-second"] / 1000.0)
    return out


def _subtask_metrics(v: VertexStatus) -> list[TaskMetrics]:
    return list(v.subtask_metrics)


def job_overview(info: JobStatusInfo) -> dict[str, Any]:
    """One entry of ``/jobs/overview`` (Flink's JobDetails)."""
    counts = task_counts((s, n) for v in info.vertices for s, n in v.state_counts.items())
    counts["total"] = sum(v.parallelism for v in info.vertices)
    return {"jid": str(info.job_id), "name": info.name, "state": info.status.name,
            "start-time": info.start_time_ms, "end-time": info.end_time_ms or -1,
            "duration": _duration(info.start_time_ms, info.end_time_ms),
            "last-modification": info.end_time_ms or info.start_time_ms, "tasks": counts}


def vertex_details(info: JobStatusInfo, v: VertexStatus, max_parallelism: int) -> dict[str, Any]:
    counts = task_counts(v.state_counts.items(), upper=True)
    return {"id": str(v.vertex_id), "name": v.name, "parallelism": v.parallelism, "maxParallelism": max_parallelism,
            "status": vertex_status(v).name, "start-time": info.start_time_ms, "end-time": info.end_time_ms or -1,
            "duration": _duration(info.start_time_ms, info.end_time_ms), "tasks": counts,
            "metrics": io_metrics(_subtask_metrics(v))}


def job_details(info: JobStatusInfo, graph: JobGraph | None) -> dict[str, Any]:
    """``/jobs/:jobid`` (Flink's JobDetailsInfo)."""
    max_par = {str(jv.vertex_id): jv.max_parallelism for jv in graph.vertices} if graph else {}
    vertices = [vertex_details(info, v, max_par.get(str(v.vertex_id), -1)) for v in info.vertices]
    status_counts = task_counts(((vertex_status(v), 1) for v in info.vertices), upper=True)
    timestamps = {s.name: 0 for s in JobStatus}
    timestamps[JobStatus.CREATED.name] = info.start_time_ms
    if info.all_running_time_ms:
        timestamps[JobStatus.RUNNING.name] = info.all_running_time_ms
    if info.end_time_ms:
        timestamps[info.status.name] = info.end_time_ms
    return {"jid": str(info.job_id), "name": info.name, "isStoppable": False, "state": info.status.name,
            "job-type": graph.runtime_mode if graph else "STREAMING",
            "start-time": info.start_time_ms, "end-time": info.end_time_ms or -1,
            "duration": _duration(info.start_time_ms, info.end_time_ms), "now": now_ms(),
            "maxParallelism": max(max_par.values(), default=-1), "timestamps": timestamps,
            "vertices": vertices, "status-counts": status_counts,
            "plan": plan(info, graph)["plan"], "num-restarts": info.num_restarts,
            **({"scheduler": info.scaling} if info.scaling else {})}


def plan(info: JobStatusInfo, graph: JobGraph | None) -> dict[str, Any]:
    """``/jobs/:jobid/plan`` (Flink's JobPlanInfo): the nodes with their inputs."""
    if graph is None:
        return {"plan": {"jid": str(info.job_id), "name": info.name, "type": "STREAMING", "nodes": []}}
    return job_plan(graph, info.name, {str(v.vertex_id): v.parallelism for v in info.vertices},
                    {str(v.vertex_id): v.name for v in info.vertices})


def subtask(info: JobStatusInfo, v: VertexStatus, i: int) -> dict[str, Any]:
    """One subtask's current attempt (Flink's SubtaskExecutionAttemptDetailsInfo). Its times are
    the job's: from its start (or its latest restart) to its end, or to now while it runs."""
    state = v.subtask_states[i] if i < len(v.subtask_states) else ExecutionState.CREATED
    where = v.subtask_locations[i] if i < len(v.subtask_locations) else ""
    start, end = subtask_times(info, v, i, state)
    return {"subtask": i, "status": state.name, "attempt": v.subtask_attempts[i] if i < len(v.subtask_attempts) else 0,
            "endpoint": where or "(unassigned)", "host": where.split(":")[0] if where else "(unassigned)",
            "taskmanager-id": where or "(unassigned)", "start-time": start, "start_time": start, "end-time": end,
            "duration": _duration(start, max(end, 0)) if start > 0 else -1,
            "metrics": io_metrics(v.subtask_metrics[i:i + 1])}


def subtask_times(info: JobStatusInfo, v: VertexStatus, i: int, state: ExecutionState) -> tuple[int, int]:
    """(start, end) of a subtask's current attempt: from when it was deployed (Flink's start)
    to when it reached its terminal state, -1 for an end not reached; the job's times where the
    attempt's are not known."""
    stamps = v.subtask_timestamps[i] if i < len(v.subtask_timestamps) else {}
    start = next((stamps[s] for s in (ExecutionState.DEPLOYING, ExecutionState.INITIALIZING, ExecutionState.RUNNING)
                  if s in stamps), 0)
    if not stamps:
        start = (info.all_running_time_ms or info.start_time_ms) if state != ExecutionState.CREATED else 0
    end = stamps.get(state, -1) if state.is_terminal else -1
    if state.is_terminal and end < 0:
        end = info.end_time_ms or -1
    return start or -1, end


def subtasks_times(info: JobStatusInfo, v: VertexStatus) -> dict[str, Any]:
    """``/jobs/:jobid/vertices/:vertexid/subtasktimes`` (Flink's SubtasksTimesInfo): when each
    subtask's current attempt entered each state."""
    rows = []
    for i in range(v.parallelism):
        stamps = v.subtask_timestamps[i] if i < len(v.subtask_timestamps) else {}
        row = subtask(info, v, i)
        rows.append({"subtask": i, "host": row["host"], "duration": row["duration"],
                     "timestamps": {s.name: stamps.get(s, 0) for s in ExecutionState}})
    return {"id": str(v.vertex_id), "name": v.name, "now": now_ms(), "subtasks": rows}


def subtasks(info: JobStatusInfo, v: VertexStatus, max_parallelism: int = -1) -> dict[str, Any]:
    """``/jobs/:jobid/vertices/:vertexid`` (Flink's JobVertexDetailsInfo): one entry per subtask."""
    return {"id": str(v.vertex_id), "name": v.name, "parallelism": v.parallelism, "maxParallelism": max_parallelism,
            "now": now_ms(), "subtasks": [subtask(info, v, i) for i in range(v.parallelism)]}


def backpressure(v: VertexStatus) -> dict[str, Any]:
    """``/jobs/:jobid/vertices/:vertexid/backpressure`` (Flink's JobVertexBackPressureInfo)."""
    rows: list[dict[str, Any]] = []
    worst = 0.0
    for i, m in enumerate(_subtask_metrics(v)):
        ratio = m.backpressured_ms_per_second / 1000.0
        worst = max(worst, ratio)
        rows.append({"subtask": i, "backpressure-level": backpressure_level(ratio), "ratio": round(ratio, 3),
                     "idleRatio": round(m.idle_ms_per_second / 1000.0, 3),
                     "busyRatio": round(m.busy_ms_per_second / 1000.0, 3)})
    return {"status": "ok", "backpressure-level": backpressure_level(worst), "end-timestamp": now_ms(),
            "subtasks": rows}


def _where(location: str) -> str | None:
    """The TaskExecutor a failure's location names (``TaskExecutor te-1-ab12 (pid ...) / task``)."""
    m = re.match(r"TaskExecutor (\S+)", location)
    return m.group(1) if m else None


def _error_entry(error: ErrorInfo, timestamp: int, task: str) -> dict[str, Any]:
    location = error.location or ""
    return {"exceptionName": error.error_class, "exceptionMessage": error.message,
            "stacktrace": error.traceback or error.describe(),
            "timestamp": timestamp, "taskName": task or None, "endpoint": location or None,
            "taskManagerId": _where(location), "failureLabels": {},
            "concurrentExceptions": []}


def exceptions(info: JobStatusInfo) -> dict[str, Any]:
    """``/jobs/:jobid/exceptions`` (Flink's JobExceptionsInfoWithHistory), newest first."""
    entries = [_error_entry(f.error, f.timestamp_ms, f.task) for f in reversed(info.failure_history)]
    root = info.failure_cause
    out: dict[str, Any] = {
        "root-exception": (root.traceback or root.describe()) if root else None,
        "timestamp": (info.end_time_ms or now_ms()) if root else None,
        "all-exceptions": [{"exception": e["stacktrace"], "task": e["taskName"], "location": e["endpoint"],
                            "timestamp": e["timestamp"], "taskManagerId": e["taskManagerId"]} for e in entries],
        "truncated": False,
        "exceptionHistory": {"entries": entries, "truncated": False},
    }
    return out


def checkpoint_entry(c: CheckpointInfo) -> dict[str, Any]:
    """One checkpoint or savepoint (Flink's CheckpointStatistics, with the fields of its completed
    or failed kind)."""
    status = {"COMPLETED": "COMPLETED", "ABORTED": "FAILED"}.get(c.status, "IN_PROGRESS")
    kind = {"COMPLETED": "Completed", "FAILED": "Failed"}.get(status, "Pending")
    entry = {"className": f".{kind}CheckpointStatistics", "id": c.checkpoint_id, "status": status,
             "is_savepoint": c.is_savepoint,
             "checkpoint_type": "SAVEPOINT" if c.is_savepoint else "UNALIGNED_CHECKPOINT" if c.unaligned
             else "CHECKPOINT", "unaligned": c.unaligned,
             "trigger_timestamp": c.trigger_time_ms,
             "latest_ack_timestamp": c.trigger_time_ms + c.duration_ms if c.duration_ms and status != "IN_PROGRESS"
             else -1,
             "state_size": c.size_bytes, "checkpointed_size": c.size_bytes, "end_to_end_duration": c.duration_ms,
             # persisted_data: the in-flight data an unaligned checkpoint stored; alignment_duration
             # (yarnflow's): the longest a task waited for its barriers (or, unaligned, for them to come)
             "alignment_buffered": 0, "processed_data": 0, "persisted_data": c.inflight_bytes,
             "alignment_duration": c.alignment_ms, "start_delay": c.start_delay_ms, "num_subtasks": c.num_subtasks,
             "num_acknowledged_subtasks": c.num_acknowledged, "tasks": {}}
    if status == "COMPLETED":
        entry.update({"external_path": c.external_path or None, "discarded": c.discarded})
    elif status == "FAILED":
        entry.update({"failure_timestamp": c.trigger_time_ms + c.duration_ms, "failure_message": c.failure or None})
    return entry


def _stats(values: list[int]) -> dict[str, Any]:
    if not values:
        return {"min": 0, "max": 0, "avg": 0, "p50": 0, "p90": 0, "p95": 0, "p99": 0, "p999": 0}
    ordered = sorted(values)

    def pct(p: float) -> int:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    return {"min": ordered[0], "max": ordered[-1], "avg": sum(ordered) // len(ordered), "p50": pct(0.5),
            "p90": pct(0.9), "p95": pct(0.95), "p99": pct(0.99), "p999": pct(0.999)}


def _restored(info: JobStatusInfo, history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The checkpoint the job last restored from after a failure (Flink's RestoredCheckpointStatistics)."""
    for f in reversed(info.failure_history):
        if f.restored_checkpoint_id > 0:
            known = next((h for h in history if h["id"] == f.restored_checkpoint_id), None)
            return {"id": f.restored_checkpoint_id, "restore_timestamp": f.timestamp_ms,
                    "is_savepoint": bool(known and known["is_savepoint"]),
                    "external_path": known.get("external_path") if known else None}
    return None


def checkpoints(info: JobStatusInfo) -> dict[str, Any]:
    """``/jobs/:jobid/checkpoints`` (Flink's CheckpointingStatistics): checkpoints and savepoints,
    newest first."""
    history = [checkpoint_entry(c) for c in reversed(info.checkpoints)]
    completed = [c for c in info.checkpoints if c.status == "COMPLETED"]
    counts = info.checkpoint_counts

    def latest(pick: Any) -> dict[str, Any] | None:
        return next((h for h in history if pick(h)), None)

    return {
        "counts": {"restored": sum(1 for f in info.failure_history if f.restored_checkpoint_id > 0),
                   "total": counts.completed + counts.failed + counts.in_progress,
                   "in_progress": counts.in_progress, "completed": counts.completed, "failed": counts.failed},
        "summary": {"state_size": _stats([c.size_bytes for c in completed]),
                    "checkpointed_size": _stats([c.size_bytes for c in completed]),
                    "end_to_end_duration": _stats([c.duration_ms for c in completed]),
                    "alignment_buffered": _stats([]), "processed_data": _stats([]),
                    "persisted_data": _stats([c.inflight_bytes for c in completed]),
                    "alignment_duration": _stats([c.alignment_ms for c in completed]),
                    # (yarnflow's): per checkpoint, the longest any task waited for its first barrier
                    "start_delay": _stats([c.start_delay_ms for c in completed])},
        "latest": {"completed": latest(lambda h: h["status"] == "COMPLETED" and not h["is_savepoint"]),
                   "savepoint": latest(lambda h: h["status"] == "COMPLETED" and h["is_savepoint"]),
                   "failed": latest(lambda h: h["status"] == "FAILED"), "restored": _restored(info, history)},
        "history": history,
    }


def overview_counts(jobs: Iterable[JobStatusInfo]) -> dict[str, int]:
    counts = {"jobs-running": 0, "jobs-finished": 0, "jobs-cancelled": 0, "jobs-failed": 0}
    for j in jobs:
        if j.status == JobStatus.FINISHED:
            counts["jobs-finished"] += 1
        elif j.status == JobStatus.CANCELED:
            counts["jobs-cancelled"] += 1
        elif j.status == JobStatus.FAILED:
            counts["jobs-failed"] += 1
        elif j.status != JobStatus.SUSPENDED:
            counts["jobs-running"] += 1
    return counts
