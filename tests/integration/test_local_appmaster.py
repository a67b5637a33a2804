"""The embedded local cluster's AppMaster on threads of the calling process (``yarnflow run`` and
``env.execute()`` without a cluster address): jobs run as with an AppMaster process (and recover
from a killed TaskExecutor: test_batch_exactly_once.py runs that test both ways);
its TaskExecutors are this process's children; stopping it leaves no thread, process or log
setting behind; a failed start says why and leaves nothing either."""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
from typing import Any

import psutil
import pytest

from tests.harness import wait_until
from tests.integration.test_batch_exactly_once import _to_row, _write_files
from yarnflow.common.states import JobStatus
from yarnflow.local_cluster import ClusterStartError, LocalCluster

pytestmark = [pytest.mark.integration]


def _workers(pid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.Process(pid).children():
        try:  # (a child that ended unreaped, another test's, has no command line left)
            if "yarnflow.worker" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            continue
    return found


def _am_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t is not threading.current_thread()}


def _yarnflow_logger_state() -> tuple[int, bool, list[logging.Handler]]:
    logger = logging.getLogger("yarnflow")
    return logger.level, logger.propagate, list(logger.handlers)


def _assert_nothing_left(threads_before: set[threading.Thread],
                         logger_before: tuple[int, bool, list[logging.Handler]]) -> None:
    assert _workers(os.getpid()) == []
    wait_until(lambda: _am_threads() <= threads_before, 10,
               lambda: f"threads left: {sorted(t.name for t in _am_threads() - threads_before)}")
    assert _yarnflow_logger_state() == logger_before


def _count_exactly(ctx: Any, src: Any, expected: collections.Counter, parallelism: int) -> None:
    """``env.execute()`` under ``ctx`` of a BATCH keyed sum of the files in ``src``: FINISHED,
    every key counted exactly."""
    import yarnflow
    from yarnflow import executors

    executors.set_context(ctx)
    try:
        env = yarnflow.StreamExecutionEnvironment(parallelism=parallelism)
        env.set_runtime_mode("BATCH")
        env.read_text(str(src)).map(_to_row).key_by("k").sum("n").collect()
        result = env.execute("embedded")
    finally:
        executors.set_context(None)
    assert result.status == JobStatus.FINISHED
    table = result.collected()
    assert collections.Counter(dict(zip(table["k"].to_pylist(), table["n"].to_pylist()))) == expected


@pytest.mark.timeout(120)
def test_env_execute_runs_on_an_in_process_appmaster_and_leaves_nothing_behind(process_tag, tmp_path, monkeypatch):
    """The user's path: ``env.execute()`` with no cluster address starts the embedded cluster with
    its AppMaster on this process's threads, runs the job (rows from files, counted exactly) and
    stops it: no TaskExecutor, thread or change to the ``yarnflow`` logger is left."""
    from yarnflow import executors
    from tests.conftest import TAG_VAR

    monkeypatch.setenv(TAG_VAR, process_tag)
    src = tmp_path / "in"
    expected = _write_files(src, files=4, rows=4000)
    threads_before, logger_before = _am_threads(), _yarnflow_logger_state()
    seen: dict[str, set[int]] = {"workers": set(), "appmasters": set()}
    done = threading.Event()

    def watch() -> None:  # what this process starts while the job runs
        while not done.wait(0.02):
            for child in psutil.Process(os.getpid()).children():
                try:  # (one child gone or unreadable, e.g. a test server's, does not hide the others)
                    cmd = " ".join(child.cmdline())
                except psutil.Error:
                    continue
                for kind, module in (("workers", "yarnflow.worker"), ("appmasters", "yarnflow.am")):
                    if module in cmd:
                        seen[kind].add(child.pid)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    ctx = executors.LocalContext(2, 1, {"heartbeat.interval": "200 ms"}, progress=False)
    try:
        _count_exactly(ctx, src, expected, 2)
    finally:
        done.set()
        watcher.join(5)
    assert len(seen["workers"]) == 2 and seen["appmasters"] == set()
    assert ctx.cluster.appmaster_in_process and ctx.cluster.proc.pid == os.getpid()
    _assert_nothing_left(threads_before, logger_before)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("conf, layout", [({}, (3, 1)), ({"taskmanager.numberOfTaskSlots": "2"}, (2, 2))],
                         ids=["default-layout", "two-slots"])
def test_the_embedded_cluster_starts_the_taskexecutors_the_job_needs(process_tag, tmp_path, monkeypatch, conf, layout):
    """The default layout: one slot per TaskExecutor process, and ``env.execute()`` (``yarnflow
    run``) starts as many as the job's slots need, so a per-row job at parallelism 3 runs its three
    subtasks in three processes (three cores' worth of Python), not on threads of one; with two
    slots per TaskExecutor, two processes. Rows from files, counted exactly."""
    from yarnflow import executors
    from tests.conftest import TAG_VAR

    monkeypatch.setenv(TAG_VAR, process_tag)
    src = tmp_path / "in"
    expected = _write_files(src, files=3, rows=3000)
    ctx = executors.LocalContext(conf={"heartbeat.interval": "200 ms", **conf}, progress=False)
    _count_exactly(ctx, src, expected, 3)
    assert (ctx.cluster.taskexecutors, ctx.cluster.slots) == layout  # (3 slots: every subtask in a process of its own)


@pytest.mark.timeout(60)
def test_log_lines_go_to_the_cluster_log_and_the_clients_also_to_the_callers_handlers(tmp_path):
    root = logging.getLogger()
    caught: list[logging.LogRecord] = []
    handler = logging.Handler(logging.NOTSET)
    handler.emit = caught.append  # type: ignore[method-assign]
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.WARNING)
    before = _yarnflow_logger_state()
    cluster = LocalCluster(0, 1, work_dir=str(tmp_path / "c"), keep_work_dir=True, appmaster_in_process=True)
    try:
        cluster.start(wait_for_taskexecutors=False)
        logging.getLogger("yarnflow.am.test").info("an info line of the AppMaster")
        logging.getLogger("yarnflow.am.test").warning("a warning of the AppMaster")
        logging.getLogger("yarnflow.executors").info("an info line of the client")
        logging.getLogger("yarnflow.executors").warning("a warning of the client")
    finally:
        cluster.stop()
        root.removeHandler(handler)
        root.setLevel(old_level)
    # the caller's handlers get what they got before: the client's warning, none of the
    # AppMaster's lines (they went to its log file when it was a process of its own)
    assert [r.getMessage() for r in caught if r.name.startswith("yarnflow")] == ["a warning of the client"]
    with open(cluster.log_path) as fh:
        text = fh.read()
    for line in ("an info line of the AppMaster", "a warning of the AppMaster", "an info line of the client",
                 "a warning of the client"):
        assert line in text
    assert "AppMaster stopped" in text  # the file is closed only once the shutdown is over
    assert _yarnflow_logger_state() == before
    logging.getLogger("yarnflow.am.test").info("after the cluster")
    with open(cluster.log_path) as fh:
        assert "after the cluster" not in fh.read()


@pytest.mark.timeout(60)
def test_a_port_in_use_fails_the_start_saying_why_and_leaves_nothing(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    threads_before, logger_before = _am_threads(), _yarnflow_logger_state()
    cluster = LocalCluster(1, 1, {"jobmanager.rpc.address": "127.0.0.1", "jobmanager.rpc.port": str(port)},
                           work_dir=str(tmp_path / "c"), appmaster_in_process=True)
    try:
        with pytest.raises(ClusterStartError, match=f"did not start.*{port}"):
            cluster.start()
    finally:
        cluster.stop()
        taken.close()
    _assert_nothing_left(threads_before, logger_before)


@pytest.mark.timeout(60)
def test_kill_stops_the_taskexecutors_at_once_and_stop_still_ends_the_cluster(local_cluster):
    cluster = local_cluster(taskexecutors=1, slots=1, appmaster_in_process=True)
    [worker] = _workers(os.getpid())
    cluster.kill()
    worker.wait(10)  # killed, and reaped by the AppMaster's watcher
    cluster.stop()
    assert cluster.proc is not None and cluster.proc.poll() == 0


def test_an_in_process_appmaster_cannot_fail_over(tmp_path):
    conf = {"high-availability.type": "zookeeper", "high-availability.zookeeper.quorum": "127.0.0.1:1",
            "high-availability.storageDir": f"file://{tmp_path}"}
    with pytest.raises(ClusterStartError, match="without high availability"):
        LocalCluster(1, 1, conf, appmaster_in_process=True)


@pytest.mark.timeout(120)
def test_yarnflow_runs_first_taskexecutors_are_the_processes_started_ahead_and_more_come_as_needed(
        process_tag, tmp_path, monkeypatch):
    """``yarnflow run``'s path (issue 54): the cluster is made before the job file runs, with
    one TaskExecutor process started ahead (the default parallelism, 1). The job then runs at
    parallelism 3: the cluster takes the process started ahead and asks for two more; rows from
    files, counted exactly; nothing is left afterwards."""
    from tests.conftest import TAG_VAR
    from yarnflow import executors
    from yarnflow.local_cluster import prestarted

    monkeypatch.setenv(TAG_VAR, process_tag)
    src = tmp_path / "in"
    expected = _write_files(src, files=3, rows=3000)
    threads_before, logger_before = _am_threads(), _yarnflow_logger_state()
    conf = {"heartbeat.interval": "200 ms"}
    cluster = prestarted(None, None, conf)
    assert cluster is not None and cluster.taskexecutors == 1
    [ahead] = _workers(os.getpid())  # (started, loading, not yet a TaskExecutor: no cluster to join)
    assert "--warm" in ahead.cmdline()
    ctx = executors.LocalContext(conf=conf, progress=False, prestarted=cluster)
    ran: set[str] = set()
    original = executors.ClusterContext.follow

    def follow(self, conn, job, job_id, job_name, storage_dir):  # (which TaskExecutors ran the job)
        out = original(self, conn, job, job_id, job_name, storage_dir)
        info = conn.call(lambda gw: gw.get_job(job_id), "getJob")
        ran.update(loc for v in info.vertices for loc in v.subtask_locations if loc)
        return out

    monkeypatch.setattr(executors.ClusterContext, "follow", follow)
    try:
        _count_exactly(ctx, src, expected, 3)
    finally:
        ctx.close()
    # the process started ahead ran (part of) it; the cluster asked for three TaskExecutors (a
    # BATCH job's regions may all run on the first one to register, so where each ran varies)
    assert any(r.startswith("te-w") for r in ran) and ctx.cluster.taskexecutors == 3, ran
    assert not ahead.is_running()
    _assert_nothing_left(threads_before, logger_before)


@pytest.mark.timeout(60)
def test_processes_started_ahead_and_never_used_stop_and_others_settings_are_not_taken(process_tag, tmp_path,
                                                                                       monkeypatch):
    """A job file that ran no job: ``close()`` stops what was started ahead. A process started
    with other memory settings than the cluster's is not taken (it applied them before loading
    Arrow); the driver then starts a TaskExecutor of its own."""
    from tests.conftest import TAG_VAR
    from yarnflow import executors
    from yarnflow.am.resourcemanager.drivers.warm_workers import WarmWorkers
    from yarnflow.common.config import Configuration
    from yarnflow.local_cluster import prestarted

    monkeypatch.setenv(TAG_VAR, process_tag)
    ctx = executors.LocalContext(taskexecutors=2, progress=False, prestarted=prestarted(2, None, {}))
    assert len(_workers(os.getpid())) == 2
    ctx.close()
    assert _workers(os.getpid()) == []

    pool = WarmWorkers(Configuration.load({"process.memory.malloc-arena-max": "2"}), 1, str(tmp_path / "c"), {})
    try:
        assert pool.take(Configuration.load(), "127.0.0.1:1", None) is None
        assert len(pool.pids()) == 1
    finally:
        pool.close()
    assert _workers(os.getpid()) == []


@pytest.mark.timeout(90)
def test_a_process_started_ahead_that_died_is_passed_over(local_cluster, tmp_path):
    """One of the two processes started ahead is SIGKILLed before the cluster starts: the cluster
    takes the other and starts one TaskExecutor afresh, and a job on both counts every row."""
    from yarnflow import executors
    from yarnflow.local_cluster import LocalCluster

    cluster = LocalCluster(2, 1, {"heartbeat.interval": "200 ms"}, work_dir=str(tmp_path / "c"),
                           appmaster_in_process=True)
    cluster.prestart_taskexecutors(2)
    try:
        first, second = _workers(os.getpid())
        first.kill()
        first.wait(10)
        cluster.start()
        ids = sorted(p.cmdline()[p.cmdline().index("--resource-id") + 1] for p in _workers(os.getpid()))
        assert len(ids) == 2 and not ids[0].startswith("te-w") and ids[1].startswith("te-w")
        assert second.is_running()
        src = tmp_path / "in"
        expected = _write_files(src, files=2, rows=2000)
        _count_exactly(executors.ClusterContext(cluster.address, progress=False), src, expected, 2)
    finally:
        cluster.stop()
