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
