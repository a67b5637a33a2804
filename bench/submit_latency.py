"""submit-latency: in session mode, the latency from submit to RUNNING (every subtask
running) and from submit to FINISHED, for a two-vertex job on a tiny input.

The job (source -> map, then a hash exchange into a keyed sum -> collect sink) is compiled,
its artifact stored, and submitted N times to one local session cluster (2 TaskExecutors x 2
slots, parallelism 2). Each result is checked against the expected sums."""

from __future__ import annotations

import statistics
import time
from typing import Any

import pyarrow as pa


def _job(env_parallelism: int) -> Any:
    import yarnflow

    env = yarnflow.StreamExecutionEnvironment(parallelism=env_parallelism)
    data = {"k": [i % 10 for i in range(100)], "v": list(range(100))}
    env.from_collection(data).map(lambda r: {"k": r["k"], "v": r["v"] * 2}).key_by("k").sum("v").collect()
    return env


def _expected() -> dict[int, int]:
    out: dict[int, int] = {}
    for i in range(100):
        out[i % 10] = out.get(i % 10, 0) + 2 * i
    return out


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run_submit_latency(submissions: int = 50, warmup: int = 3) -> dict[str, Any]:
    from yarnflow.common.rpc.gateways import RemoteDispatcherGateway
    from yarnflow.common.states import JobStatus
    from yarnflow.compiler import compile_job
    from yarnflow.local_cluster import LocalCluster
    from yarnflow.packaging import upload_artifact
    from yarnflow.worker.operators.sinks import read_collected

    expected = _expected()
    running_ms: list[float] = []
    finished_ms: list[float] = []
    verified = True
    with LocalCluster(2, 2) as cluster:
        gw = RemoteDispatcherGateway(cluster.address, 30_000)
        storage = gw.cluster_info().storage_dir
        for i in range(warmup + submissions):
            job = upload_artifact(compile_job(_job(2), f"latency-{i}"), None, storage)
            t0 = time.time()
            job_id = gw.submit_job(job.job_graph)
            result = gw.request_job_result(job_id, 60_000)
            info = gw.get_job(job_id)
            uid = next(iter(job.collect_sinks))
            table = read_collected(f"{storage}/jobs/{job_id}", uid)
            ok = (result.status == JobStatus.FINISHED and table is not None
                  and dict(zip(table["k"].to_pylist(), table["v"].to_pylist())) == expected)
            if i < warmup:
                continue
            verified = verified and ok and info.all_running_time_ms > 0
            running_ms.append(info.all_running_time_ms - t0 * 1000)
            finished_ms.append(result.end_time_ms - t0 * 1000)
        gw.close()
    return {
        "name": "submit-latency",
        "submissions": submissions,
        "median_running_ms": round(statistics.median(running_ms), 1),
        "p95_running_ms": round(_pct(running_ms, 0.95), 1),
        "median_finished_ms": round(statistics.median(finished_ms), 1),
        "p95_finished_ms": round(_pct(finished_ms, 0.95), 1),
        "target_median_finished_ms": 300,
        "verified": verified,
    }


_ = pa  # pyarrow is imported for its side effect of loading early (steady timings)
