"""The AppMaster's Prometheus metrics (Flink's JobManager metrics): its process's CPU and memory,
TaskExecutors registered,
slots total and available, running jobs, and per running job its restarts, uptime and
checkpoint counts, last duration and size. Read live at each scrape from the ResourceManager
and the JobMasters; a standby AppMaster reports only that it stands by."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterator

import psutil

from yarnflow.am.checkpoint.coordinator import DURATION_BUCKETS_MS
from yarnflow.common.errors import UnavailableError
from yarnflow.common.metrics import PREFIX, gauge

if TYPE_CHECKING:
    from yarnflow.am.appmaster import AppMaster

_JOB = ("job_id", "job_name")


_PROCESS = psutil.Process()
_PROCESS.cpu_percent(None)  # (the first reading starts the measurement)


def appmaster_families(am: AppMaster) -> Iterator[Any]:
    leader = gauge("jobmanager_isLeader", "1 when this AppMaster leads the cluster", ())
    leader.add_metric([], 1.0 if am.is_leader else 0.0)
    yield leader
    for name, doc, value in (  # the process (Flink's Status.JVM.CPU.Load / Memory, for a Python process)
            ("Status_Process_CPU_Load", "cores the AppMaster used since the previous scrape",
             _PROCESS.cpu_percent(None) / 100.0),
            ("Status_Process_Memory_RSS", "resident memory of the AppMaster", _PROCESS.memory_info().rss)):
        family = gauge(f"jobmanager_{name}", doc, ())
        family.add_metric([], float(value))
        yield family
    dispatcher, rm = am.dispatcher, am.rm
    if dispatcher is None or rm is None:
        return
    try:
        jms = dispatcher.ask(dispatcher.running_job_masters)
    except UnavailableError:  # it lost the leadership a moment ago
        return
    tes, total, free = rm.overview()
    for name, doc, value in (("numRegisteredTaskManagers", "TaskExecutors registered", tes),
                             ("taskSlotsTotal", "slots of the registered TaskExecutors", total),
                             ("taskSlotsAvailable", "free slots", free),
                             ("numRunningJobs", "jobs running", len(jms))):
        family = gauge(f"jobmanager_{name}", doc, ())
        family.add_metric([], float(value))
        yield family
    job_gauges = {name: gauge(f"jobmanager_job_{name}", doc, _JOB) for name, doc in (
        ("numRestarts", "restarts of the job's subtasks"), ("uptime", "ms since the job started"),
        ("numberOfCompletedCheckpoints", "completed checkpoints"),
        ("numberOfFailedCheckpoints", "failed checkpoints"),
        ("numberOfInProgressCheckpoints", "checkpoints in progress"),
        ("totalNumberOfCheckpoints", "checkpoints triggered"),
        ("lastCheckpointDuration", "ms the latest completed checkpoint took"),
        ("lastCheckpointSize", "bytes of the latest completed checkpoint"))}
    from prometheus_client.core import HistogramMetricFamily

    durations = HistogramMetricFamily(f"{PREFIX}_jobmanager_job_checkpointDurationSeconds",
                                      "how long each completed checkpoint took, trigger to completion", labels=_JOB)
    now = int(time.time() * 1000)
    for jm in jms:
        try:
            info = jm.status_info()
            histogram = jm.checkpoint_durations()
        except (UnavailableError, TimeoutError):
            continue  # ended meanwhile
        labels = [str(info.job_id), info.name]
        if histogram is not None:
            per_bucket, total_ms = histogram
            cumulative, buckets = 0, []
            for bound, n in zip([*(f"{b / 1000:g}" for b in DURATION_BUCKETS_MS), "+Inf"], per_bucket):
                cumulative += n
                buckets.append((bound, cumulative))
            durations.add_metric(labels, buckets, total_ms / 1000.0)
        counts = info.checkpoint_counts
        completed = [c for c in info.checkpoints if c.status == "COMPLETED"]
        last = completed[-1] if completed else None
        for name, value in (("numRestarts", info.num_restarts), ("uptime", now - info.start_time_ms),
                            ("numberOfCompletedCheckpoints", counts.completed),
                            ("numberOfFailedCheckpoints", counts.failed),
                            ("numberOfInProgressCheckpoints", counts.in_progress),
                            ("totalNumberOfCheckpoints", counts.completed + counts.failed + counts.in_progress),
                            ("lastCheckpointDuration", last.duration_ms if last else 0),
                            ("lastCheckpointSize", last.size_bytes if last else 0)):
            job_gauges[name].add_metric(labels, float(value))
    yield from job_gauges.values()
    yield durations
