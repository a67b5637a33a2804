"""Failure paths of a real local cluster: a TaskExecutor killed with SIGKILL, garbage on the
AppMaster's port, TaskExecutors whose AppMaster is gone, cancelling user code that is stuck or
merely slow."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tests.e2e.jobs import slow_job
from tests.harness import wait_until
from yarnflow import executors
from yarnflow.common.errors import JobFailedError
from yarnflow.common.states import JobStatus

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _run_in_thread(address: str, job_file: str, conf: dict[str, str]):
    """Runs the job file against ``address`` on a thread; returns (thread, outcome dict)."""
    import runpy

    outcome: dict[str, object] = {}

    def target() -> None:
        ctx = executors.ClusterContext(address, conf, job_file, progress=False)
        executors.set_context(ctx)
        try:
            runpy.run_path(job_file, run_name="__main__")
            outcome["ok"] = True
        except BaseException as exc:  # noqa: BLE001
            outcome["error"] = exc
        finally:
            executors.set_context(None)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, outcome


def _wait_running(gw, name: str, timeout_s: float = 30):
    """The job named ``name`` once it and all its subtasks run."""
    def running():
        return next((j for j in gw.list_jobs() if j.name == name and j.status == JobStatus.RUNNING and all(
            v.state_counts.get(4, 0) == v.parallelism for v in j.vertices)), None)

    return wait_until(running, timeout_s, f"job {name} did not reach RUNNING", interval_s=0.1)


def _te_processes(cluster) -> list[psutil.Process]:
    """The TaskExecutor processes the cluster's first AppMaster started (not their slot
    processes); with a standby that led, see ``_all_te_processes``."""
    am = psutil.Process(cluster.proc.pid)
    return [p for p in am.children() if "yarnflow.worker" in " ".join(p.cmdline())]


def _all_te_processes(cluster) -> list[psutil.Process]:
    """Every TaskExecutor process of the cluster, whichever AppMaster started it (found by the
    environment variable they inherit), slot processes aside."""
    return [p for p in cluster._descendants() if "yarnflow.worker" in p.cmdline()]


def _resource_id(proc: psutil.Process) -> str:
    cmd = proc.cmdline()
    return cmd[cmd.index("--resource-id") + 1]


def test_sigkill_of_a_taskexecutor_fails_the_job_naming_it(local_cluster, tmp_path):
    cluster = local_cluster(taskexecutors=2, slots=2)
    gw = cluster.gateway()
    job = slow_job(str(tmp_path / "slow.py"), str(tmp_path / "out"), rows=4000)
    thread, outcome = _run_in_thread(cluster.address, job, {"execution.batch-size": "10"})
    _wait_running(gw, "slow")
    victim = _te_processes(cluster)[0]
    rid = _resource_id(victim)
    victim.send_signal(signal.SIGKILL)
    thread.join(60)
    assert not thread.is_alive()
    error = outcome.get("error")
    assert isinstance(error, JobFailedError), outcome
    assert rid in str(error)
    [job_info] = [j for j in gw.list_jobs() if j.name == "slow"]
    assert job_info.status == JobStatus.FAILED
    assert rid in job_info.failure_cause.message
    # whichever is noticed first: the process's death, its silence, or a consumer losing its input from it
    assert any(why in job_info.failure_cause.message for why in ("SIGKILL", "heartbeat", "cannot read partition"))
    # the cluster survives and replaces the lost TaskExecutor
    wait_until(lambda: gw.cluster_info().registered_taskexecutors >= 2, 30, "the lost TaskExecutor was not replaced")
    assert gw.cluster_info().registered_taskexecutors == 2
    assert not (tmp_path / "out" / "part-00000.parquet").exists()
    gw.close()


def test_heartbeat_timeout_marks_a_frozen_taskexecutor_lost(local_cluster, tmp_path):
    """SIGSTOP: the process is alive but silent; only the heartbeat timeout can notice."""
    cluster = local_cluster(taskexecutors=2, slots=2)
    gw = cluster.gateway()
    job = slow_job(str(tmp_path / "slow.py"), str(tmp_path / "out"), rows=4000)
    thread, outcome = _run_in_thread(cluster.address, job, {"execution.batch-size": "10"})
    _wait_running(gw, "slow")
    victim = _te_processes(cluster)[0]
    rid = _resource_id(victim)
    victim.send_signal(signal.SIGSTOP)
    try:
        thread.join(60)
        assert isinstance(outcome.get("error"), JobFailedError), outcome
        [job_info] = [j for j in gw.list_jobs() if j.name == "slow"]
        assert job_info.status == JobStatus.FAILED
        assert rid in job_info.failure_cause.describe()
    finally:
        if victim.is_running():
            victim.send_signal(signal.SIGCONT)
    gw.close()


def test_garbage_on_the_appmaster_port_does_not_crash_it(local_cluster, tmp_path):
    cluster = local_cluster(taskexecutors=1, slots=2)
    host, port = cluster.address.rsplit(":", 1)
    payloads = [os.urandom(4096), b"\x80\x01\x00\x01" + b"\xff" * 64, b"\x00\x00\x00\x0b" + b"A" * 11,
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x80\x01\x00\x01\x7f\xff\xff\xffsubmitJob", b""]
    for payload in payloads:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            try:
                s.sendall(payload)
                s.shutdown(socket.SHUT_WR)
                s.recv(1024)
            except OSError:
                pass  # closed by the AppMaster (a frame declared too big is refused before it is read)
    assert cluster.proc.poll() is None
    gw = cluster.gateway()
    info = gw.cluster_info()
    assert info.registered_taskexecutors == 1 and info.total_slots == 2
    gw.close()


def test_taskexecutor_exits_when_no_resource_manager_answers(process_tag, tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    env = {**os.environ, "YARNFLOW_TEST_TAG": process_tag}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "yarnflow.worker", "--resource-id", "te-orphan", "--rm-address", dead,
                           "--work-dir", str(tmp_path), "-D", "taskmanager.registration.timeout=2 s",
                           "-D", "heartbeat.interval=200 ms"], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0
    assert time.monotonic() - start < 30
    assert "no ResourceManager answered" in proc.stderr


def test_taskexecutors_die_with_a_killed_appmaster(local_cluster, process_tag):
    cluster = local_cluster(taskexecutors=2, slots=1)
    tes = _te_processes(cluster)
    assert len(tes) == 2
    cluster.proc.send_signal(signal.SIGKILL)
    cluster.proc.wait(10)
    gone, alive = psutil.wait_procs(tes, timeout=20)
    assert not alive, [p.pid for p in alive]


def test_zombie_taskexecutor_exits_when_its_appmaster_freezes(local_cluster):
    """An AppMaster that stops answering (SIGSTOP; the process still exists, so no parent-death
    signal) is noticed through the registration timeout."""
    cluster = local_cluster(taskexecutors=1, slots=1, **{"taskmanager__registration__timeout": "2 s"})
    [te] = _te_processes(cluster)
    cluster.proc.send_signal(signal.SIGSTOP)
    try:
        # its parent is stopped, so it stays a zombie once it has exited
        wait_until(lambda: te.status() == psutil.STATUS_ZOMBIE, 30, lambda: f"the TaskExecutor is {te.status()}")
    finally:
        cluster.proc.send_signal(signal.SIGCONT)


def test_keyed_exchange_crosses_taskexecutor_processes(local_cluster, tmp_path):
    """With 2 TaskExecutors x 2 slots and parallelism 2, the slots are spread over both
    TaskExecutors, so the hash exchange moves batches between processes (over Flight)."""
    cluster = local_cluster(taskexecutors=2, slots=2)
    job = slow_job(str(tmp_path / "job.py"), str(tmp_path / "out"), rows=200, sleep_s=0.0, name="spread")
    thread, outcome = _run_in_thread(cluster.address, job, {})
    thread.join(60)
    assert outcome.get("ok"), outcome
    logs = {}
    log_dir = os.path.join(cluster.work_dir, "log")
    for name in os.listdir(log_dir):
        if name.startswith("te-"):
            with open(os.path.join(log_dir, name)) as fh:
                logs[name] = fh.read()
    placed = {name: sorted(line.split("deploying ")[1].split(" (")[0] + line.split(" (")[1][:4]
                           for line in text.splitlines() if "deploying " in line)
              for name, text in logs.items()}
    assert len(placed) == 2 and all(len(v) == 2 for v in placed.values()), placed
    # each TaskExecutor runs one subtask of each vertex: the keyed input of each sink subtask
    # comes half from the other process
    for tasks in placed.values():
        assert len({t.split("(")[0] for t in tasks}) == 2


def _run_map_job(cluster, tmp_path, name: str, rows: int, map_fn: str):
    """Runs a one-TaskExecutor STREAMING job ``from_collection(rows) -> map(map_fn) -> collect``
    named ``name`` until all of it runs; returns (gateway, job thread, its outcome, job info,
    the TaskExecutor's process)."""
    gw = cluster.gateway()
    job = tmp_path / f"{name}.py"
    job.write_text(
        "import time\nimport yarnflow\n"
        "env = yarnflow.StreamExecutionEnvironment.get_execution_environment()\n"
        "env.set_parallelism(1)\nenv.set_runtime_mode('STREAMING')\n"
        f"env.from_collection({{'x': list(range({rows}))}}).map({map_fn}).collect()\n"
        f"env.execute({name!r})\n")
    thread, outcome = _run_in_thread(cluster.address, str(job), {})
    info = _wait_running(gw, name)
    [te] = _te_processes(cluster)
    return gw, thread, outcome, info, te


def _te_logs(cluster) -> str:
    log_dir = os.path.join(cluster.work_dir, "log")
    logs = ""
    for name in os.listdir(log_dir):
        if name.startswith("te-"):
            with open(os.path.join(log_dir, name)) as fh:
                logs += fh.read()
    return logs


def test_a_task_stuck_after_its_cancel_ends_its_taskexecutor(local_cluster, tmp_path):
    """User code that ignores cancellation (a long sleep) cannot be interrupted; after
    task.cancellation.timeout the TaskExecutor ends its process, so the slot is really freed,
    the job ends CANCELED and the ResourceManager replaces the TaskExecutor."""
    cluster = local_cluster(taskexecutors=1, slots=2, **{"task__cancellation__timeout": "1 s"})
    gw, thread, outcome, info, te = _run_map_job(cluster, tmp_path, "stuck", 2, "lambda r: time.sleep(3600) or r")
    gw.cancel_job(info.job_id)
    te.wait(30)  # the TaskExecutor ends itself
    thread.join(30)
    assert isinstance(outcome.get("error"), JobFailedError) and "canceled" in str(outcome["error"])
    [job_info] = [j for j in gw.list_jobs() if j.name == "stuck"]
    assert job_info.status == JobStatus.CANCELED
    wait_until(lambda: gw.cluster_info().registered_taskexecutors >= 1, 30, "the TaskExecutor was not replaced")
    assert gw.cluster_info().registered_taskexecutors == 1  # replaced
    assert "did not stop within 1000 ms of its cancellation" in _te_logs(cluster)
    with open(cluster.log_path) as fh:
        assert f"(pid {te.pid}): process exited with code 1" in fh.read()  # a failure exit, seen by the AM
    gw.close()


def test_a_slow_per_row_function_stops_within_its_batch_when_cancelled(local_cluster, tmp_path):
    """A per-row function that is merely slow (5 ms a row: a batch of 20,000 rows would take
    100 s) stops between two slices of its batch: the job ends CANCELED well within
    task.cancellation.timeout and the TaskExecutor goes on living."""
    cluster = local_cluster(taskexecutors=1, slots=2, **{"task__cancellation__timeout": "20 s"})
    gw, thread, outcome, info, te = _run_map_job(cluster, tmp_path, "slow", 20_000, "lambda r: time.sleep(0.005) or r")
    time.sleep(0.5)  # inside the batch
    began = time.monotonic()
    gw.cancel_job(info.job_id)
    thread.join(30)
    assert time.monotonic() - began < 10
    assert isinstance(outcome.get("error"), JobFailedError) and "canceled" in str(outcome["error"])
    [job_info] = [j for j in gw.list_jobs() if j.name == "slow"]
    assert job_info.status == JobStatus.CANCELED
    assert te.is_running() and te.status() != psutil.STATUS_ZOMBIE
    assert "did not stop within" not in _te_logs(cluster)
    gw.close()
