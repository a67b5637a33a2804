"""Per-row functions in Python worker processes on a real local cluster (issue 29): two subtasks
of a per-row map in one TaskExecutor (1 x 2 slots) run their functions in Python workers of
their own; a worker SIGKILLed in the middle of a STREAMING job fails its task, the job restarts
from its latest checkpoint, and the committed output (Parquet, from text files) holds every
input row exactly once."""

from __future__ import annotations

import collections
import pathlib
import re
import signal
import time
from contextlib import closing

import psutil
import pytest

from tests.harness import wait_until
from tests.integration.test_batch_exactly_once import _run_in_thread
from tests.integration.test_cluster_failures import _te_processes
from tests.integration.test_streaming_exactly_once import CHECKPOINTS, _committed, _job, _write
from yarnflow.common.states import JobStatus

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

#: workers start at once (no 200 ms on the task thread first)
WORKERS = {**CHECKPOINTS, "python.worker.start-after": "0 ms", "python.row-functions.vectorize": "false"}


def _parse(row):
    """A per-row function (~1 ms a row: the job takes ~5 s at parallelism 2)."""
    time.sleep(0.001)
    k, f, r = row["line"].split()
    return {"k": k, "file": f, "row": r}


def _build(src, out):
    def build(env):
        env.set_runtime_mode("STREAMING")
        env.read_text(str(src)).map(_parse, name="parse").sink_to_parquet(str(out))
    return build


def python_workers(cluster) -> list[psutil.Process]:
    """The Python worker processes of the cluster's TaskExecutors (children of their fork servers)."""
    found = []
    for te in _te_processes(cluster):
        for server in te.children():
            try:
                if "forkserver" in " ".join(server.cmdline()):
                    found.extend(server.children())
            except psutil.Error:
                continue
    return found


def running_workers(cluster) -> list[int]:
    """The pids of the Python workers that run batches, from the TaskExecutors' logs."""
    logs = "".join(p.read_text() for p in pathlib.Path(cluster.work_dir, "log").glob("te-*.log"))
    return [int(pid) for pid in re.findall(r"its Python worker \(pid (\d+)\) runs its per-row functions", logs)]


def test_a_sigkilled_python_worker_fails_its_task_and_the_job_loses_and_repeats_nothing(local_cluster, tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    rows = _write(src)
    cluster = local_cluster(taskexecutors=1, slots=2)
    with closing(cluster.gateway()) as gw:
        thread, outcome = _run_in_thread(cluster, _build(src, out), "python-workers", WORKERS, 2)
        wait_until(lambda: (j := _job(gw, "python-workers")) is not None and j.latest_completed_checkpoint_id,
                   60, "the job never completed a checkpoint", interval_s=0.01)
        wait_until(lambda: len(running_workers(cluster)) == 2, 60,
                   "the two subtasks never ran their map in Python workers", interval_s=0.01)
        victim = running_workers(cluster)[0]
        assert victim in {p.pid for p in python_workers(cluster)}
        psutil.Process(victim).send_signal(signal.SIGKILL)
        thread.join(200)
        assert "error" not in outcome, outcome.get("error")
        info = _job(gw, "python-workers")
    assert info is not None and info.status == JobStatus.FINISHED
    failures = [f.error for f in info.failure_history]
    assert any(e.error_class == "PythonWorkerError" and "killed by SIGKILL" in e.message for e in failures), failures
    assert any(f.restored_checkpoint_id for f in info.failure_history), "the restart did not use a checkpoint"
    table = _committed(out)
    got = collections.Counter(f"{k} {f} {r}" for k, f, r in zip(table["k"].to_pylist(), table["file"].to_pylist(),
                                                                table["row"].to_pylist()))
    assert got == collections.Counter(rows)
