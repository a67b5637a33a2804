"""Helpers for the tests of the REST API, the web UI and the metrics: jobs submitted detached
to a local cluster, JSON from its REST API, Prometheus text from its endpoints."""

from __future__ import annotations

from typing import Any, Callable

import requests
from prometheus_client.parser import text_string_to_metric_families

import yarnflow
from tests.harness import wait_until
from yarnflow import executors

#: a STREAMING job that runs until cancelled: a rate-limited generator -> map -> keyed sum -> sink
RATE = 2000


def generator_job(out: str, rate: int = RATE, fail_after: int | None = None, detail: str = ""
                  ) -> Callable[[Any], None]:
    """Generated rows, keyed sum, Parquet; with ``fail_after``, the source raises RuntimeError
    "boom at row N" (followed by ``detail``) once it passes that row."""
    def build(env: Any) -> None:
        def rows(start: int, n: int) -> dict[str, list[int]]:
            if fail_after is not None and start + n > fail_after:
                raise RuntimeError(f"boom at row {start + n}{detail}")
            return {"k": [i % 7 for i in range(start, start + n)], "v": list(range(start, start + n))}

        (env.from_generator(rows, count=None, rate_per_s=rate).uid("source").map_batches(lambda b: b, name="identity")
            .key_by("k").sum("v").uid("sum").sink_to_parquet(out).uid("sink"))
    return build


def submit(cluster: Any, build: Callable[[Any], None], name: str, conf: dict[str, str] | None = None,
           parallelism: int = 2) -> str:
    """Submit ``build``'s pipeline detached; returns the job id."""
    ctx = executors.ClusterContext(cluster.address, {"execution.runtime-mode": "STREAMING", **(conf or {})},
                                   progress=False, detached=True)
    executors.set_context(ctx)
    try:
        env = yarnflow.StreamExecutionEnvironment(parallelism=parallelism)
        build(env)
        return str(env.execute(name).job_id)
    finally:
        executors.set_context(None)


def get(url: str, expect: int = 200) -> Any:
    response = requests.get(url, timeout=10)
    assert response.status_code == expect, f"GET {url}: {response.status_code} {response.text}"
    assert response.headers["Content-Type"].startswith("application/json"), response.headers
    return response.json()


def wait_flowing(web: str, job_id: str, timeout_s: float = 60) -> dict[str, Any]:
    """The job's details once every vertex runs, its source reports records per second and every
    other vertex records read (each TaskExecutor's next heartbeat brings them)."""
    def flowing() -> dict[str, Any] | None:
        details = get(f"{web}/jobs/{job_id}")
        vertices = details["vertices"]
        if (all(v["status"] == "RUNNING" for v in vertices) and vertices[0]["metrics"]["write-records-per-second"] > 0
                and all(v["metrics"]["read-records"] > 0 for v in vertices[1:])):
            return details
        return None
    return wait_until(flowing, timeout_s, f"job {job_id} never ran with records flowing", interval_s=0.3)


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text at ``url`` -> metric name -> [(labels, value)]."""
    text = requests.get(url, timeout=10).text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out
