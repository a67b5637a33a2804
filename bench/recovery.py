"""recovery: from SIGKILL of a TaskExecutor running a streaming job to every task of the job
RUNNING again (new attempts, on the surviving and replacement TaskExecutors), with the local
driver: process exit detection, region failover, fixed-delay restart without delay."""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time
from typing import Any

import psutil


def _gen(start: int, n: int) -> Any:
    return {"k": [i % 100 for i in range(start, start + n)], "v": list(range(start, start + n))}


def run_recovery(kills: int = 5) -> dict[str, Any]:
    import yarnflow
    from yarnflow import executors
    from yarnflow.common.states import ExecutionState, JobStatus
    from yarnflow.local_cluster import LocalCluster

    conf = {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": str(kills + 5),
            "restart-strategy.fixed-delay.delay": "0 ms", "jobmanager.execution.failover-strategy": "region",
            "heartbeat.interval": "500 ms", "heartbeat.timeout": "5 s"}
    times: list[float] = []
    with LocalCluster(2, 2, conf) as cluster:
        gw = cluster.gateway()
        ctx = executors.ClusterContext(cluster.address, conf, progress=False)

        def job() -> None:
            executors.set_context(ctx)
            env = yarnflow.StreamExecutionEnvironment(parallelism=2, runtime_mode="STREAMING")
            env.from_generator(_gen, rate_per_s=20_000).key_by("k").sum("v").collect()
            try:
                env.execute("recovery")
            except yarnflow.JobFailedError:
                pass  # cancelled at the end

        thread = threading.Thread(target=job, daemon=True)
        thread.start()

        def status() -> Any:
            jobs = [j for j in gw.list_jobs() if j.name == "recovery"]
            return jobs[0] if jobs else None

        def all_running(info: Any, attempt: int) -> bool:
            return info is not None and info.status == JobStatus.RUNNING and all(
                v.state_counts.get(ExecutionState.RUNNING, 0) == v.parallelism
                and min(v.subtask_attempts) >= attempt for v in info.vertices)

        deadline = time.monotonic() + 60
        while not all_running(status(), 0):
            if time.monotonic() > deadline:
                raise RuntimeError("the job did not start")
            time.sleep(0.01)
        for k in range(1, kills + 1):
            info = status()
            victim = info.vertices[0].subtask_locations[0]
            am = psutil.Process(cluster.proc.pid)
            [proc] = [p for p in am.children() if victim in p.cmdline()]
            t0 = time.perf_counter()
            os.kill(proc.pid, signal.SIGKILL)
            while not all_running(status(), k):
                if time.perf_counter() - t0 > 60:
                    raise RuntimeError(f"no recovery after kill {k}")
                time.sleep(0.005)
            times.append(time.perf_counter() - t0)
            time.sleep(1.0)  # let the replacement TaskExecutor register before the next kill
        info = status()
        gw.cancel_job(info.job_id)
        thread.join(30)
        gw.close()
    return {"name": "recovery", "kills": kills, "recovery_s": round(statistics.median(times), 3),
            "max_s": round(max(times), 3), "all_s": [round(t, 3) for t in times], "target_s": 2.0,
            "verified": len(times) == kills}
