"""Flame graphs and TaskExecutor thread dumps over REST (issue 32), on a real local cluster: the
TaskExecutors sample their tasks' threads (and the Python worker processes their per-row
functions moved to) and the AppMaster builds Flink's flame graph of a vertex from what they
sent; the graph shows the user's own function, on the CPU, where the job spends its time."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.harness import wait_until
from tests.rest import get, submit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SAMPLES = 20
FLAME = {"rest.port": "0", "rest.flamegraph.num-samples": str(SAMPLES), "rest.flamegraph.delay-between-samples": "20 ms",
         "rest.flamegraph.refresh-interval": "1 s"}


def busy_job(env: Any) -> None:
    def spend_time_in_user_code(row: dict[str, Any]) -> dict[str, Any]:
        total = 0
        for i in range(3000):  # (a loop: not a column expression, so it runs per row)
            total += i
        return {"k": row["k"], "v": row["v"] + total}

    env.from_generator(lambda start, n: {"k": [i % 7 for i in range(start, start + n)],
                                          "v": list(range(start, start + n))},
                       count=None, rate_per_s=20_000).map(spend_time_in_user_code, name="spend").print()


def names(node: dict[str, Any]) -> set[str]:
    found = {node["name"]}
    for child in node["children"]:
        found |= names(child)
    return found


def well_formed(node: dict[str, Any]) -> None:
    assert node["value"] >= sum(c["value"] for c in node["children"])
    for child in node["children"]:
        well_formed(child)


def sampled(web: str, path: str, after_ms: int = 0) -> dict[str, Any]:
    """The flame graph once samples taken after ``after_ms`` are in."""
    def ready() -> dict[str, Any] | None:
        answer = get(f"{web}{path}")
        return answer if answer["endTimestamp"] > after_ms else None
    return wait_until(ready, 30, f"{path} never had samples", interval_s=0.2)


def test_a_vertex_flame_graph_shows_the_user_function_and_its_python_worker(local_cluster: Any) -> None:
    # one TaskExecutor with both subtasks: their per-row functions contend for its GIL, so each
    # moves to a Python worker process (python.execution-mode: process)
    cluster = local_cluster(taskexecutors=1, slots=2, **FLAME)
    web = cluster.web_url()
    job_id = submit(cluster, busy_job, "busy")
    vertex = wait_until(lambda: next((v for v in get(f"{web}/jobs/{job_id}")["vertices"]
                                      if v["status"] == "RUNNING"), None), 60, "the job never ran")
    path = f"/jobs/{job_id}/vertices/{vertex['id']}/flamegraph"
    first = get(f"{web}{path}")
    assert first == {"endTimestamp": -3}  # the first request starts the sampling (Flink's "waiting")

    def with_worker() -> dict[str, Any] | None:
        graph = sampled(web, path)
        frames = names(graph["data"])
        return graph if any(f.startswith("python worker (pid ") for f in frames) else None
    graph = wait_until(with_worker, 60, "no sample ever came from the tasks' Python workers", interval_s=1)
    root = graph["data"]
    well_formed(root)
    assert root["name"] == "root" and graph["endTimestamp"] <= time.time() * 1000
    # each subtask's thread sampled SAMPLES times, and each worker's thread as often
    assert root["value"] == 4 * SAMPLES
    frames = names(root)
    assert any(".spend_time_in_user_code:" in f for f in frames)
    assert any(f.startswith("yarnflow.worker.task.Task._run:") for f in frames)

    # the user's function computes: it is on the CPU; the split adds up
    on, off = (get(f"{web}{path}?type={kind}") for kind in ("ON_CPU", "OFF_CPU"))
    assert on["endTimestamp"] == off["endTimestamp"] > 0
    assert on["data"]["value"] + off["data"]["value"] == get(f"{web}{path}")["data"]["value"]
    assert any(".spend_time_in_user_code:" in f for f in names(on["data"]))

    # one subtask: its thread and its worker's
    one = sampled(web, f"{path}?subtaskindex=1")
    assert one["data"]["value"] == 2 * SAMPLES

    # bad requests
    assert get(f"{web}{path}?type=WALL", expect=400)["errors"]
    assert get(f"{web}{path}?subtaskindex=2", expect=404)["errors"]
    assert get(f"{web}{path}?subtaskindex=-1", expect=400)["errors"]
    assert get(f"{web}/jobs/{job_id}/vertices/{'0' * 32}/flamegraph", expect=404)["errors"]

    # a TaskExecutor's thread dump: its tasks' threads with their stacks
    [tm] = get(f"{web}/taskmanagers")["taskmanagers"]
    dump = get(f"{web}/taskmanagers/{tm['id']}/thread-dump")["threadInfos"]
    by_name = {t["threadName"]: t["stringifiedThreadInfo"] for t in dump}
    tasks = [n for n in by_name if n.startswith("task ") and "spend" in n]
    assert len(tasks) == 2, sorted(by_name)
    assert "te-heartbeat" in by_name and "MainThread" in by_name
    assert "task.py" in by_name[tasks[0]] and " cpu=" in by_name[tasks[0]].splitlines()[0]
    assert get(f"{web}/taskmanagers/no-such-te/thread-dump", expect=404)["errors"]

    # a cancelled job's vertex has nothing to sample (Flink's "terminated")
    requests.patch(f"{web}/jobs/{job_id}?mode=cancel", timeout=10).raise_for_status()
    wait_until(lambda: get(f"{web}/jobs/{job_id}")["state"] == "CANCELED", 30, "the job was not cancelled")
    assert get(f"{web}{path}") == {"endTimestamp": -1}


def test_flame_graphs_on_the_task_thread_and_switched_off(local_cluster: Any, tmp_path: Path) -> None:
    """Per-row functions on the task thread (python.execution-mode: thread): the task's own samples
    show the user function; with rest.flamegraph.enabled false the answer says so (-2)."""
    cluster = local_cluster(taskexecutors=1, slots=2, **FLAME)
    web = cluster.web_url()
    job_id = submit(cluster, busy_job, "busy-thread", {"python.execution-mode": "thread"})
    vertex = wait_until(lambda: next((v for v in get(f"{web}/jobs/{job_id}")["vertices"]
                                      if v["status"] == "RUNNING"), None), 60, "the job never ran")
    path = f"/jobs/{job_id}/vertices/{vertex['id']}/flamegraph?type=ON_CPU"
    get(f"{web}{path}")
    graph = sampled(web, path)
    frames = names(graph["data"])
    assert any(".spend_time_in_user_code:" in f for f in frames)
    assert not any(f.startswith("python worker") for f in frames)
    # samples are refreshed once older than rest.flamegraph.refresh-interval
    later = sampled(web, path, after_ms=graph["endTimestamp"])
    assert later["endTimestamp"] > graph["endTimestamp"]

    off = local_cluster(taskexecutors=1, slots=1, **{**FLAME, "rest.flamegraph.enabled": "false"})
    off_web = off.web_url()
    job_id = submit(off, busy_job, "not-sampled", parallelism=1)
    vertex = wait_until(lambda: next((v for v in get(f"{off_web}/jobs/{job_id}")["vertices"]
                                      if v["status"] == "RUNNING"), None), 60, "the job never ran")
    assert get(f"{off_web}/jobs/{job_id}/vertices/{vertex['id']}/flamegraph") == {"endTimestamp": -2}
