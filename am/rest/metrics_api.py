"""Flink's metric query paths (issue 32): ``/jobmanager/metrics``, ``/jobs/metrics``,
``/jobs/:jobid/metrics``, ``/jobs/:jobid/vertices/:vertexid/metrics``, its ``subtasks/metrics``
and ``subtasks/:index/metrics``, ``/taskmanagers/metrics`` and ``/taskmanagers/:tmid/metrics``.

As in Flink: without ``?get=`` an endpoint lists the metrics it has (``[{"id": name}]``); with
``?get=a,b`` it gives their values as strings (``[{"id", "value"}]``), leaving out names it does
not have; the aggregating endpoints give ``min``, ``max``, ``avg`` and ``sum`` over the jobs,
subtasks or TaskExecutors selected (``?jobs=``, ``?subtasks=1,3,5-9``, ``?taskmanagers=``; all
by default), limited to the aggregations of ``?agg=``. Values come from what the JobMasters and
TaskExecutors report with their heartbeats: a metric is as fresh as the last one."""

from __future__ import annotations

import os
import re
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

import psutil
from flask import Response, jsonify, request

from yarnflow.am.rest.api_error import ApiError
from yarnflow.common.messages import NO_WATERMARK, TaskMetrics

if TYPE_CHECKING:
    from yarnflow.am.rest.server import RestServer

Metrics = dict[str, float]
_AGGS = ("min", "max", "avg", "sum")
_RANGE = re.compile(r"(\d{1,9})(?:-(\d{1,9}))?")

#: a subtask's metrics: Flink's name -> TaskMetrics field
TASK_METRICS = {
    "numRecordsIn": "records_in", "numRecordsOut": "records_out", "numBytesIn": "bytes_in",
    "numBytesOut": "bytes_out", "numRecordsInPerSecond": "records_in_per_second",
    "numRecordsOutPerSecond": "records_out_per_second", "numBytesInPerSecond": "bytes_in_per_second",
    "numBytesOutPerSecond": "bytes_out_per_second", "busyTimeMsPerSecond": "busy_ms_per_second",
    "backPressuredTimeMsPerSecond": "backpressured_ms_per_second", "idleTimeMsPerSecond": "idle_ms_per_second",
    "managedMemoryUsed": "managed_memory_used", "managedMemoryTotal": "managed_memory_bytes",
    "spilledBytes": "spilled_bytes", "numLateRecordsDropped": "late_records_dropped",
    "accumulatedBusyTime": "busy_ms_total", "accumulatedBackPressuredTime": "backpressured_ms_total",
    "accumulatedIdleTime": "idle_ms_total",
}


def operator_names(v: Any) -> list[str]:
    """The names of a vertex's chained operators, head first (its name joins them)."""
    return str(v.name).split(" -> ")


def task_metrics(m: TaskMetrics, now_ms: int | None = None, operators: list[str] | None = None) -> Metrics:
    """A subtask's metrics by Flink's names; ``operators`` (the chain's operator names) name
    the per-operator ones, ``<operator>.numRecordsIn`` as Flink's operator scope does."""
    out = {name: float(getattr(m, field)) for name, field in TASK_METRICS.items()}
    out["isBackPressured"] = 1.0 if m.backpressured_ms_per_second >= 500 else 0.0
    for name, wm in (("currentInputWatermark", m.input_watermark), ("currentOutputWatermark", m.output_watermark)):
        if wm != NO_WATERMARK:  # (none yet: left out, as Flink shows no value)
            out[name] = float(wm)
    if m.output_watermark != NO_WATERMARK and m.output_watermark < 2**62:
        # how far event time (the watermark it emitted) trails wall-clock time
        out["watermarkLag"] = float((now_ms if now_ms is not None else int(time.time() * 1000)) - m.output_watermark)
    names = operators if operators is not None and len(operators) == len(m.operator_records_in) else \
        [f"operator-{i}" for i in range(len(m.operator_records_in))]
    for name, n_in, n_out in zip(names, m.operator_records_in, m.operator_records_out):
        out[f"{name}.numRecordsIn"] = float(n_in)
        out[f"{name}.numRecordsOut"] = float(n_out)
    out.update({name: float(v) for name, v in m.operator_gauges.items()})  # a connector's own (Kafka offsets, lag)
    return out


def job_metrics(info: Any) -> Metrics:
    """A job's own metrics (Flink's job scope)."""
    completed = [c for c in info.checkpoints if c.status == "COMPLETED"]
    running = info.status.name == "RUNNING"
    start = info.all_running_time_ms or info.start_time_ms
    counts = info.checkpoint_counts
    return {
        "uptime": float(int(time.time() * 1000) - start) if running and start else 0.0,
        "numRestarts": float(info.num_restarts), "fullRestarts": float(info.num_restarts),
        "numberOfCompletedCheckpoints": float(counts.completed), "numberOfFailedCheckpoints": float(counts.failed),
        "numberOfInProgressCheckpoints": float(counts.in_progress),
        "totalNumberOfCheckpoints": float(counts.completed + counts.failed + counts.in_progress),
        "lastCheckpointDuration": float(completed[-1].duration_ms) if completed else -1.0,
        "lastCheckpointSize": float(completed[-1].size_bytes) if completed else -1.0,
        "lastCompletedCheckpointId": float(completed[-1].checkpoint_id) if completed else -1.0,
    }


def task_manager_metrics(tm: dict[str, Any]) -> Metrics:
    """A TaskExecutor's: its slots and its memory watchdog's last measurement (bytes)."""
    out = {"Status.Slots.Total": float(tm["slotsNumber"]), "Status.Slots.Free": float(tm["freeSlots"])}
    memory = tm.get("memory") or {}
    for key, name in (("used", "Used"), ("peak", "Peak"), ("limit", "Limit"), ("arrow", "Arrow"),
                      ("managedTotal", "Managed.Total"), ("managedUsed", "Managed.Used"), ("rocksdb", "RocksDB")):
        if key in memory:
            out[f"Status.Memory.{name}"] = float(memory[key])
    if "cpuLoad" in memory:
        out["Status.Process.CPU.Load"] = float(memory["cpuLoad"])
    return out


def _own_process(proc: psutil.Process) -> Metrics:
    """This process's CPU (the load since the previous call) and memory."""
    with proc.oneshot():
        times, mem = proc.cpu_times(), proc.memory_info()
        return {"Status.Process.CPU.Time": float(int((times.user + times.system) * 1000)),
                "Status.Process.CPU.Load": proc.cpu_percent(None) / 100.0,
                "Status.Process.Memory.RSS": float(mem.rss), "Status.Process.Threads": float(proc.num_threads())}


def _value(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def _answer(metrics: Metrics) -> Response:
    wanted = [n for n in request.args.get("get", "").split(",") if n]
    if not wanted:
        return jsonify([{"id": n} for n in sorted(metrics)])
    return jsonify([{"id": n, "value": _value(metrics[n])} for n in wanted if n in metrics])


def _aggregate(sources: Iterable[Metrics]) -> Response:
    """Flink's AggregatedMetricsResponseBody over ``sources``."""
    sources = list(sources)
    names = sorted({n for m in sources for n in m})
    wanted = [n for n in request.args.get("get", "").split(",") if n]
    if not wanted:
        return jsonify([{"id": n} for n in names])
    aggs = [a.strip().lower() for a in request.args.get("agg", "").split(",") if a.strip()] or list(_AGGS)
    unknown = [a for a in aggs if a not in _AGGS]
    if unknown:
        raise ApiError(400, f"unknown aggregation {unknown[0][:40]!r}: use min, max, avg or sum")
    out = []
    for name in wanted:
        values = [m[name] for m in sources if name in m]
        if not values:
            continue
        stats = {"min": min(values), "max": max(values), "avg": sum(values) / len(values), "sum": sum(values)}
        out.append({"id": name, **{a: stats[a] for a in aggs}})
    return jsonify(out)


def _selected(raw: str) -> set[str] | None:
    return {x.strip() for x in raw.split(",") if x.strip()} if raw else None


def subtask_range(raw: str) -> set[int] | None:
    """``1,3,5-9`` -> {1, 3, 5, 6, 7, 8, 9}; empty: all (None)."""
    if not raw:
        return None
    out: set[int] = set()
    for part in raw.split(","):
        m = _RANGE.fullmatch(part.strip())
        if m is None:
            raise ApiError(400, f"subtasks {raw[:60]!r}: expected indexes and ranges, as 1,3,5-9")
        out.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return out


class MetricsApi:
    def __init__(self, rest: RestServer) -> None:
        self._r = rest
        self._proc = psutil.Process(os.getpid())
        self._proc.cpu_percent(None)  # (the first reading starts the measurement)

    def routes(self) -> list[tuple[str, Callable[..., Any], tuple[str, ...]]]:
        return [
            ("/jobmanager/metrics", self.job_manager, ("GET",)),
            ("/jobs/metrics", self.jobs, ("GET",)),
            ("/jobs/<jobid>/metrics", self.job, ("GET",)),
            ("/jobs/<jobid>/vertices/<vertexid>/metrics", self.vertex, ("GET",)),
            ("/jobs/<jobid>/vertices/<vertexid>/subtasks/metrics", self.subtasks, ("GET",)),
            ("/jobs/<jobid>/vertices/<vertexid>/subtasks/<index>/metrics", self.subtask, ("GET",)),
            ("/jobs/<jobid>/vertices/<vertexid>/watermarks", self.watermarks, ("GET",)),
            ("/taskmanagers/metrics", self.task_managers, ("GET",)),
            ("/taskmanagers/<tmid>/metrics", self.task_manager, ("GET",)),
        ]

    def job_manager(self) -> Response:
        dispatcher = self._r.dispatcher()
        info = dispatcher.ask(dispatcher.cluster_info)
        jobs = self._r.all_jobs()
        return _answer({**_own_process(self._proc), "numRegisteredTaskManagers": float(info.registered_taskexecutors),
                        "taskSlotsTotal": float(info.total_slots), "taskSlotsAvailable": float(info.free_slots),
                        "numRunningJobs": float(sum(1 for j in jobs if not j.status.is_globally_terminal))})

    def jobs(self) -> Response:
        chosen = _selected(request.args.get("jobs", ""))
        return _aggregate(job_metrics(j) for j in self._r.all_jobs() if chosen is None or str(j.job_id) in chosen)

    def job(self, jobid: str) -> Response:
        return _answer(job_metrics(self._r.job_status(jobid)))

    def vertex(self, jobid: str, vertexid: str) -> Response:
        _, v = self._r.vertex_status(jobid, vertexid)
        return _answer({f"{i}.{name}": value for i, m in enumerate(v.subtask_metrics)
                        for name, value in task_metrics(m, operators=operator_names(v)).items()})

    def watermarks(self, jobid: str, vertexid: str) -> Response:
        """Flink's: each subtask's ``currentInputWatermark`` (subtasks without one yet left out)."""
        _, v = self._r.vertex_status(jobid, vertexid)
        return jsonify([{"id": f"{i}.currentInputWatermark", "value": str(m.input_watermark)}
                        for i, m in enumerate(v.subtask_metrics) if m.input_watermark != NO_WATERMARK])

    def subtasks(self, jobid: str, vertexid: str) -> Response:
        _, v = self._r.vertex_status(jobid, vertexid)
        chosen = subtask_range(request.args.get("subtasks", ""))
        return _aggregate(task_metrics(m, operators=operator_names(v)) for i, m in enumerate(v.subtask_metrics)
                          if chosen is None or i in chosen)

    def subtask(self, jobid: str, vertexid: str, index: str) -> Response:
        _, v, i = self._r.job_api.vertex_index(jobid, vertexid, index)
        metrics = list(v.subtask_metrics)
        return _answer(task_metrics(metrics[i], operators=operator_names(v)) if i < len(metrics) else {})

    def task_managers(self) -> Response:
        chosen = _selected(request.args.get("taskmanagers", ""))
        return _aggregate(task_manager_metrics(tm) for tm in self._r.task_executors()
                          if chosen is None or tm["id"] in chosen)

    def task_manager(self, tmid: str) -> Response:
        for tm in self._r.task_executors():
            if tm["id"] == tmid:
                return _answer(task_manager_metrics(tm))
        raise ApiError(404, f"no TaskExecutor {tmid[:100]} is registered")
