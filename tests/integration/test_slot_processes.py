"""Workers of slot processes (``taskmanager.slot-processes``, issue 29) on a real local cluster: a
worker of 2 slots runs 2 one-slot TaskExecutor processes, each with half its memory, and a job's
two subtasks run in different processes. The worker is the unit of failure: a SIGKILLed slot
process takes its sibling down, the job restarts from its latest checkpoint with every input row
committed once (text files in, Parquet out), and the worker is replaced; a SIGKILLed worker
leaves no slot process behind. On YARN (the sandbox, through the real skein client) a container
of 2 slots runs 2 slot processes, and one SIGKILLed gets the container replaced with the job
exact."""

from __future__ import annotations

import collections
import os
import signal
from contextlib import closing

import psutil
import pyarrow.parquet as pq
import pytest
import requests

from tests.conftest import Cli
from tests.harness import assert_upsert_counts, wait_until
from tests.integration.test_batch_exactly_once import _run_in_thread
from tests.integration.test_failover_jobs import _run
from tests.integration.test_cluster_failures import _resource_id, _te_processes
from tests.integration.test_streaming_exactly_once import CHECKPOINTS, _build, _committed, _job, _write
from tests.integration.test_yarn_jobs import (
    CHECKPOINTS as YARN_CHECKPOINTS,
    YARN_CONF,
    _apps,
    container_processes,
    containers_started,
    dconf,
    report,
    wait_checkpointed,
    write_input,
    yarn_cli,  # noqa: F401 - the fixture
)
from yarnflow.sandbox import Sandbox
from yarnflow.common.states import JobStatus
from yarnflow.worker.slot_processes import LAUNCHER_RESERVE_BYTES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SLOT_PROCESSES = {"taskmanager.slot-processes": "true", "taskmanager.memory.process.size": "1 gb"}


def _slot_processes(worker: psutil.Process) -> list[psutil.Process]:
    return [p for p in worker.children() if "--container-id" in p.cmdline()]


def _option(proc: psutil.Process, key: str) -> str:
    """The last ``-D key=value`` on a process's command line (the one that counts)."""
    values = [arg.split("=", 1)[1] for arg in proc.cmdline() if arg.startswith(f"{key}=")]
    return values[-1]


def _with_pid(row):
    """A per-row function: which process ran it."""
    return {"line": row["line"], "pid": os.getpid()}


def test_each_slot_of_a_worker_runs_in_a_taskexecutor_process_of_its_own(local_cluster, tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    rows = _write(src)
    cluster = local_cluster(taskexecutors=1, slots=2, **SLOT_PROCESSES)
    [worker] = _te_processes(cluster)
    slot_procs = _slot_processes(worker)
    assert len(slot_procs) == 2
    worker_id = _resource_id(worker)
    assert sorted(_resource_id(p) for p in slot_procs) == [f"{worker_id}-s0", f"{worker_id}-s1"]
    for proc in slot_procs:  # one slot each, with half the worker's memory and cores
        assert _option(proc, "taskmanager.numberOfTaskSlots") == "1"
        assert _option(proc, "taskmanager.memory.process.size") == str((2 ** 30 - LAUNCHER_RESERVE_BYTES) // 2)
        assert float(_option(proc, "taskmanager.cpu.cores")) == 1.0
    with closing(cluster.gateway()) as gw:
        info = gw.cluster_info()
        assert (info.registered_taskexecutors, info.total_slots) == (2, 2)
    listed = requests.get(f"{cluster.web_url()}/taskmanagers", timeout=10).json()["taskmanagers"]
    assert {(tm["id"], tm["worker"], tm["pid"]) for tm in listed} == {
        (_resource_id(p), worker_id, p.pid) for p in slot_procs}  # REST names each one's worker

    def build(env):
        env.set_runtime_mode("BATCH")
        env.read_text(str(src)).map(_with_pid, name="with-pid").sink_to_parquet(str(out))

    _run(cluster, build, "where-rows-ran", {"python.row-functions.vectorize": "false"}, 2)
    table = pq.read_table(str(out))
    assert collections.Counter(table["line"].to_pylist()) == collections.Counter(rows)
    assert set(table["pid"].to_pylist()) == {p.pid for p in slot_procs}  # both subtasks, each in its process
    logs = {f.name for f in (tmp_path / "cluster0" / "log").iterdir()}
    assert {f"{worker_id}-s0.log", f"{worker_id}-s1.log"} <= logs


def test_a_sigkilled_slot_process_takes_its_worker_down_and_the_job_loses_and_repeats_nothing(local_cluster,
                                                                                             tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    rows = _write(src)
    cluster = local_cluster(taskexecutors=2, slots=2, **SLOT_PROCESSES)
    with closing(cluster.gateway()) as gw:
        thread, outcome = _run_in_thread(cluster, _build(src, out, keyed=False), "slot-kill", CHECKPOINTS, 2)
        info = wait_until(lambda: (j := _job(gw, "slot-kill")) is not None and j.status == JobStatus.RUNNING
                          and j.latest_completed_checkpoint_id and j, 60, "the job never completed a checkpoint",
                          interval_s=0.01)
        busy = sorted({loc for v in info.vertices for loc in v.subtask_locations if loc})
        by_id = {_resource_id(p): (w, p) for w in _te_processes(cluster) for p in _slot_processes(w)}
        worker, victim = by_id[busy[0]]
        [sibling] = [p for p in _slot_processes(worker) if p.pid != victim.pid]
        victim.send_signal(signal.SIGKILL)
        gone, alive = psutil.wait_procs([sibling, worker], timeout=30)
        assert not alive, f"still running after its slot process was killed: {alive}"
        thread.join(200)
        assert "error" not in outcome, outcome.get("error")
        info = _job(gw, "slot-kill")
        assert info is not None and info.status == JobStatus.FINISHED
        assert any(busy[0] in f.error.message for f in info.failure_history), "the kill did not hit the job"
        assert any(f.restored_checkpoint_id for f in info.failure_history), "the restart did not use a checkpoint"
        # the worker was replaced: 2 workers of 2 slot processes again
        wait_until(lambda: gw.cluster_info().registered_taskexecutors == 4, 60, "the worker was not replaced")
    table = _committed(out)
    got = collections.Counter(f"{k} {f} {r}" for k, f, r in zip(table["k"].to_pylist(), table["file"].to_pylist(),
                                                                table["row"].to_pylist()))
    assert got == collections.Counter(rows)


def test_by_default_a_local_worker_of_two_slots_keeps_them_as_threads_of_one_process(local_cluster):
    cluster = local_cluster(taskexecutors=1, slots=2)  # (taskmanager.slot-processes: auto)
    [worker] = _te_processes(cluster)
    assert _slot_processes(worker) == []
    with closing(cluster.gateway()) as gw:
        info = gw.cluster_info()
        assert (info.registered_taskexecutors, info.total_slots) == (1, 2)


def test_a_sigkilled_worker_leaves_no_slot_process_behind(local_cluster):
    cluster = local_cluster(taskexecutors=1, slots=2, **SLOT_PROCESSES)
    [worker] = _te_processes(cluster)
    slot_procs = _slot_processes(worker)
    worker.send_signal(signal.SIGKILL)
    gone, alive = psutil.wait_procs(slot_procs, timeout=30)
    assert not alive, f"slot processes outlived their worker: {alive}"
    with closing(cluster.gateway()) as gw:  # the ResourceManager saw the worker go and started another
        wait_until(lambda: len(_te_processes(cluster)) == 1 and _te_processes(cluster)[0].pid != worker.pid
                   and gw.cluster_info().total_slots == 2, 60, "the worker was not replaced")
        info = gw.cluster_info()
        assert info.registered_taskexecutors == 2


@pytest.mark.filterwarnings("ignore:distutils Version classes are deprecated:DeprecationWarning")
def test_on_yarn_a_container_of_two_slots_runs_two_slot_processes_and_one_killed_is_replaced(
        yarn_cli: Cli, sandbox: Sandbox, tmp_path) -> None:  # noqa: F811 - yarn_cli is the fixture
    expected = write_input(tmp_path / "in")
    out = tmp_path / "out"
    conf = {**YARN_CONF, **YARN_CHECKPOINTS, "taskmanager.numberOfTaskSlots": "2",
            "taskmanager.memory.process.size": "1 gb"}  # (taskmanager.slot-processes: auto, the default)
    proc = yarn_cli.start("run", "--target", "yarn-per-job", *dconf(conf), "job.py", str(tmp_path / "in"), str(out),
                          "STREAMING", "0.1", "slot-kill")
    app_id = wait_until(lambda: next((a for a in _apps(sandbox) if a), None), 30, "no application was submitted")
    wait_checkpointed(app_id, "slot-kill")
    workers = container_processes(app_id, "yarnflow.worker")
    slot_procs = [p for p in workers if "--container-id" in p.cmdline()]
    [container] = {p.environ()["CONTAINER_ID"] for p in workers}  # one container for parallelism 2
    assert len(slot_procs) == 2 and len(workers) == 3  # its launcher and a process a slot
    slot_procs[0].send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert_upsert_counts(out, expected)
    started = containers_started(sandbox, app_id)
    assert container in started and len(started) == 3, started  # the AppMaster, the container, its replacement
    assert report(app_id).final_status == "SUCCEEDED"
