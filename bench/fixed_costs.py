"""fixed-costs: what a job costs before (and after) it does any work.

- ``trivial_wall_s``: the whole ``yarnflow run JOB.py`` command (embedded local cluster) of a
  trivial job (three rows, keyed count, collect), median of ``--runs`` runs, with the phases
  of the median run: ``to_execute_s`` (interpreter, CLI and the job file up to
  ``env.execute()``), ``execute_s`` (``env.execute()`` until it returns with the result: the
  cluster's start, the job, the result read back, the cluster's stop) and ``after_s`` (from
  there to the command's exit);
- ``trivial_submit_to_finished_ms``: the same runs' job time on the cluster (submit to
  FINISHED, as the JobMaster timed it), median;
- ``session_submit_to_finished_ms``: on a running session (2 TaskExecutors x 2 slots,
  security.ssl.internal.enabled: mutual TLS on every call), the trivial job compiled, its
  artifact stored, submitted and its result fetched, ``--submissions`` times after a warm-up:
  the median from the submit call to the end time of the job.

The command runs with Python's bytecode cache on (``PYTHONDONTWRITEBYTECODE`` removed from its
environment), after one run that is not counted, as on a user's machine.

Every run's result is checked (``verified``)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

TRIVIAL_JOB = '''
import json, os, time
import yarnflow

env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
env.from_collection([{"k": "a", "n": 1}, {"k": "b", "n": 1}, {"k": "a", "n": 1}]).key_by("k").count().collect()
at_execute = time.time()
result = env.execute("trivial")
done = time.time()
rows = sorted((r["k"], r["count"]) for r in result.collected().to_pylist())
with open(os.environ["FIXED_COSTS_OUT"], "w") as out:
    json.dump({"at_execute": at_execute, "done": done, "job_ms": result.duration_ms, "rows": rows}, out)
'''
EXPECTED = [["a", 2], ["b", 1]]


def _yarnflow_command() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "yarnflow")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "yarnflow.client"]


def _trivial_runs(runs: int, work_dir: str) -> tuple[list[dict[str, float]], bool]:
    job = os.path.join(work_dir, "trivial.py")
    with open(job, "w") as f:
        f.write(TRIVIAL_JOB)
    out_path = os.path.join(work_dir, "out.json")
    # as a user's machine runs it: Python's bytecode cache on (a sandbox may turn it off), and one
    # run first, not counted, that fills it
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["FIXED_COSTS_OUT"] = out_path
    phases, verified = [], True
    for i in range(runs + 1):
        started = time.time()
        proc = subprocess.run([*_yarnflow_command(), "run", job], env=env, capture_output=True, text=True,
                              timeout=300)
        ended = time.time()
        if proc.returncode != 0:
            raise RuntimeError(f"yarnflow run failed ({proc.returncode}): {proc.stderr[-2000:]}")
        with open(out_path) as f:
            got = json.load(f)
        os.unlink(out_path)
        verified = verified and got["rows"] == EXPECTED
        if i == 0:
            continue
        phases.append({"wall_s": ended - started, "to_execute_s": got["at_execute"] - started,
                       "execute_s": got["done"] - got["at_execute"], "after_s": ended - got["done"],
                       "job_ms": got["job_ms"]})
    return phases, verified


def _session(submissions: int, warmup: int = 5) -> tuple[list[float], bool]:
    import yarnflow
    from yarnflow.common.states import JobStatus
    from yarnflow.compiler import compile_job
    from yarnflow.local_cluster import LocalCluster
    from yarnflow.packaging import upload_artifact
    from yarnflow.worker.operators.sinks import read_collected

    finished_ms, verified = [], True
    with LocalCluster(2, 2, {"security.ssl.internal.enabled": "true"}) as cluster:
        gw = cluster.gateway(30_000)
        try:
            storage = gw.cluster_info().storage_dir
            for i in range(warmup + submissions):
                env = yarnflow.StreamExecutionEnvironment()
                env.from_collection([{"k": "a", "n": 1}, {"k": "b", "n": 1}, {"k": "a", "n": 1}]).key_by(
                    "k").count().collect()
                job = upload_artifact(compile_job(env, f"trivial-{i}"), None, storage)
                t0 = time.time()
                job_id = gw.submit_job(job.job_graph)
                result = gw.request_job_result(job_id, 60_000)
                table = read_collected(f"{storage}/jobs/{job_id}", next(iter(job.collect_sinks)))
                ok = (result.status == JobStatus.FINISHED and table is not None
                      and sorted([r["k"], r["count"]] for r in table.to_pylist()) == EXPECTED)
                verified = verified and ok
                if i >= warmup:
                    finished_ms.append(result.end_time_ms - t0 * 1000)
        finally:
            gw.close()
    return finished_ms, verified


def run_fixed_costs(runs: int = 5, submissions: int = 50, work_dir: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="yarnflow-fixed-costs-", dir=work_dir) as tmp:
        phases, trivial_ok = _trivial_runs(runs, tmp)
    session_ms, session_ok = _session(submissions)
    median = sorted(phases, key=lambda p: p["wall_s"])[len(phases) // 2]
    return {
        "name": "fixed-costs",
        "runs": runs,
        "trivial_wall_s": round(statistics.median(p["wall_s"] for p in phases), 3),
        "trivial_walls_s": [round(p["wall_s"], 3) for p in phases],
        "trivial_median_run_phases_s": {k: round(v, 3) for k, v in median.items() if k != "job_ms"},
        "trivial_submit_to_finished_ms": round(statistics.median(p["job_ms"] for p in phases), 1),
        "session_submissions": submissions,
        "session_submit_to_finished_ms": round(statistics.median(session_ms), 1),
        "session_p95_submit_to_finished_ms": round(sorted(session_ms)[int(0.95 * (len(session_ms) - 1))], 1),
        "targets": {"trivial_wall_s": 0.6, "trivial_submit_to_finished_ms": 100, "session_submit_to_finished_ms": 20},
        "verified": trivial_ok and session_ok,
    }
