"""Job artifacts over a session's life: an artifact goes from the storage dir with the last job
that uses it, a TaskExecutor fetches each job's from the AppMaster (the blob service) and
deletes it when the job has left (its cache is empty between jobs), and the AppMaster's
unpacked copies (its split enumerators read file sources' splits from them) stay within
``blob.cache.max-size`` however many jobs it runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import yarnflow
from tests.harness import wait_until
from yarnflow import executors

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

BOUND = 40_000


def _files(folder: Path) -> list[Path]:
    return [Path(d, f) for d, _, files in os.walk(folder) for f in files]


def test_fifty_jobs_leave_no_artifact_behind_and_the_caches_stay_bounded(local_cluster: Any, tmp_path: Path) -> None:
    cluster = local_cluster(taskexecutors=1, slots=2, **{"blob.cache.max-size": str(BOUND)})
    gateway = cluster.gateway()
    storage = Path(gateway.cluster_info().storage_dir.removeprefix("file://"))
    gateway.close()
    am_caches: list[int] = []
    (tmp_path / "in.txt").write_text("1\n2\n")
    for i in range(50):
        ctx = executors.ClusterContext(cluster.address, {"execution.runtime-mode": "BATCH"}, progress=False)
        executors.set_context(ctx)
        try:
            env = yarnflow.StreamExecutionEnvironment(parallelism=1)
            # each job's own code (the constant in its function): an artifact of its own
            # a file source: its splits come from an enumerator the AppMaster loads from the artifact
            (env.read_text(str(tmp_path / "in.txt")).map(lambda row, i=i: {"v": (int(row["line"]) + i - 1) * 1000 + i})
             .collect())
            result = env.execute(f"job-{i}")
        finally:
            executors.set_context(None)
        assert sorted(result.collected().column("v").to_pylist()) == [i * 1000 + i, (i + 1) * 1000 + i]
        te_caches = [p for p in (tmp_path / "cluster0" / "taskexecutors").glob("*/artifacts") if p.is_dir()]
        assert te_caches, "no TaskExecutor cache found"
        wait_until(lambda caches=te_caches: not [f for c in caches for f in _files(c)], 10,  # type: ignore[misc]
                   f"job {i} left its artifact in the TaskExecutor")
        am_caches.append(sum(f.stat().st_size for f in _files(tmp_path / "cluster0" / "artifacts")))  # its work dir
    logs = "".join(p.read_text() for p in (tmp_path / "cluster0" / "log").glob("te-*.log"))
    assert logs.count("from the AppMaster") == 50, "each job's artifact is fetched from the AppMaster once"
    assert am_caches[0] > 0 and max(am_caches) <= BOUND + am_caches[0]  # the AppMaster's too
    assert am_caches[-1] < 50 * am_caches[0] / 2
    wait_until(lambda: not _files(storage / "artifacts"), 30, lambda: f"artifacts left: {_files(storage / 'artifacts')}")
