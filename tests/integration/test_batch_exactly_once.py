"""Batch jobs that restart still count every input row exactly once (issue 8): splits taken by
a replaced attempt go back to the enumerator, and file sinks commit only finished subtasks.

Every path is run on a real local cluster: a user function failing once (region and full
failover), a TaskExecutor SIGKILLed while the sources run, and one SIGKILLed between a finished
source stage and its running consumer (its blocking output is lost)."""

from __future__ import annotations

import collections
import os
import signal
import threading
import time

import pyarrow.dataset as pads
import pytest

from tests.harness import wait_until
from tests.integration.test_cluster_failures import _resource_id, _te_processes
from tests.integration.test_failover_jobs import _job, _run
from yarnflow.common.states import ExecutionState, JobStatus

pytestmark = [pytest.mark.integration]

RESTART = {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": "5",
           "restart-strategy.fixed-delay.delay": "100 ms"}
KEYS = 37


def _write_files(folder, files: int, rows: int) -> collections.Counter:
    """``files`` text files of ``rows`` lines ``k<n> <file> <row>`` in all; the expected count
    per key."""
    os.makedirs(folder, exist_ok=True)
    expected: collections.Counter = collections.Counter()
    per_file = rows // files
    for f in range(files):
        lines = [f"k{(f * per_file + r) % KEYS} {f} {r}" for r in range(per_file)]
        expected.update(line.split()[0] for line in lines)
        (folder / f"in-{f:02d}.txt").write_text("\n".join(lines) + "\n")
    return expected


def _committed_counts(folder) -> collections.Counter:
    """What a reader sees: ``pyarrow.dataset`` over the sink's folder (it skips hidden files).
    Every key must come exactly once."""
    table = pads.dataset(str(folder), format="parquet").to_table()
    if table.num_rows == 0:
        return collections.Counter()
    keys, counts = table["k"].to_pylist(), table["n"].to_pylist()
    assert len(keys) == len(set(keys)), "a key was committed twice"
    return collections.Counter(dict(zip(keys, counts)))


def _to_row(line: dict) -> dict:
    return {"k": line["line"].split()[0], "n": 1}


def _pipeline(src, out, map_fn, after_sum=None):
    def build(env):
        env.set_runtime_mode("BATCH")
        stream = env.read_text(str(src)).map(map_fn, name="parse").key_by("k").sum("n")
        if after_sum is not None:
            stream = stream.map(after_sum, name="after_sum")
        stream.sink_to_parquet(str(out))
    return build


def _kill(cluster, resource_id: str) -> None:
    [proc] = [p for p in _te_processes(cluster) if _resource_id(p) == resource_id]
    proc.send_signal(signal.SIGKILL)


def _run_in_thread(cluster, build, name, conf, parallelism):
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["result"] = _run(cluster, build, name, conf, parallelism)
        except BaseException as exc:  # noqa: BLE001
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def _wait_for(gw, name, predicate, timeout_s, message):
    """The job's status once ``predicate(info)`` holds; fails the test when the job ends first
    or ``timeout_s`` passes."""
    def check():
        info = next((j for j in gw.list_jobs() if j.name == name), None)
        if info is None:
            return None
        assert not info.status.is_globally_terminal, f"{message}: the job ended {info.status.name}"
        return info if predicate(info) else None

    return wait_until(check, timeout_s, message, interval_s=0.02)


def _vertex(info, prefix):
    return next(v for v in info.vertices if v.name.startswith(prefix))


def kill_between_stages(cluster, gw, name, consumers):
    """Once job ``name``'s two sources (read_text) have finished and its ``consumers`` sum
    subtasks all run, kill a TaskExecutor that holds a finished source's blocking output and a
    running consumer; returns the job's status as it was then."""
    def between_stages(i):
        s1, s2 = _vertex(i, "read_text"), _vertex(i, "sum")
        return s1.state_counts.get(ExecutionState.FINISHED) == 2 and \
            s2.state_counts.get(ExecutionState.RUNNING) == consumers and set(s1.subtask_locations) & set(s2.subtask_locations)

    info = _wait_for(gw, name, between_stages, 60,
                     "the consumer stage never ran, next to a finished source, while the sources were finished")
    s1, s2 = _vertex(info, "read_text"), _vertex(info, "sum")
    _kill(cluster, sorted(set(s1.subtask_locations) & set(s2.subtask_locations))[0])
    return info


@pytest.mark.timeout(150)
@pytest.mark.parametrize("strategy", ["region", "full"])
def test_map_failing_once_counts_every_row_once(run, tmp_path, strategy):
    src, out, marker = tmp_path / "in", tmp_path / "out", str(tmp_path / "failed-once")
    expected = _write_files(src, files=8, rows=2000)

    def parse(row):
        # fails once, on a row of the 6th file: the failing attempt has taken other files before
        if row["line"].endswith(" 5 100") and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("transient failure in parse")
        return _to_row(row)

    conf = {**RESTART, "jobmanager.execution.failover-strategy": strategy, "execution.batch-size": "50"}
    result = run(_pipeline(src, out, parse), name=f"fail-once-{strategy}", parallelism=2, conf=conf)
    assert result.status == JobStatus.FINISHED
    assert os.path.exists(marker)
    got = _committed_counts(out)
    assert sum(got.values()) == 2000
    assert got == expected
    gw = run.cluster.gateway()
    info = _job(gw, f"fail-once-{strategy}")
    gw.close()
    assert len(info.failure_history) == 1 and "transient failure" in info.failure_history[0].error.message
    # nothing hidden is left behind either
    assert sorted(os.listdir(out)) == ["part-00000.parquet", "part-00001.parquet"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layout", ["appmaster-process", "appmaster-in-process", "taskexecutors-started-ahead"])
def test_taskexecutor_killed_while_sources_run_counts_every_row_once(local_cluster, tmp_path, layout):
    appmaster_in_process = layout != "appmaster-process"
    ahead = layout == "taskexecutors-started-ahead"  # (`yarnflow run`'s: see warm_workers.py)
    cluster = local_cluster(taskexecutors=2, slots=2, appmaster_in_process=appmaster_in_process, prestart=ahead)
    # in process (what `yarnflow run` starts), the TaskExecutors are the caller's own children
    assert (cluster.proc.pid == os.getpid()) == appmaster_in_process
    if ahead:  # the job runs on the processes started ahead (their resource ids say so), not on new ones
        assert sorted(_resource_id(p)[:4] for p in _te_processes(cluster)) == ["te-w", "te-w"]
    src, out = tmp_path / "in", tmp_path / "out"
    expected = _write_files(src, files=12, rows=48_000)

    def slow_parse(row):
        if row["line"].endswith("0"):  # one row in 10 sleeps: ~10 s of work in all
            time.sleep(0.002)
        return _to_row(row)

    conf = {**RESTART, "jobmanager.execution.failover-strategy": "region", "execution.batch-size": "100"}
    gw = cluster.gateway()
    thread, outcome = _run_in_thread(cluster, _pipeline(src, out, slow_parse), "killed-te", conf, 2)
    _wait_for(gw, "killed-te", lambda i: _vertex(i, "read_text").state_counts.get(ExecutionState.RUNNING) == 2,
              60, "the sources never ran")
    time.sleep(3)
    info = _job(gw, "killed-te")
    source = _vertex(info, "read_text")
    assert source.state_counts.get(ExecutionState.RUNNING), "the sources were no longer running: kill came late"
    victim = next(loc for loc in source.subtask_locations if loc)
    _kill(cluster, victim)
    thread.join(120)
    assert "result" in outcome, outcome
    info = _job(gw, "killed-te")
    gw.close()
    assert info.status == JobStatus.FINISHED
    assert sum(_vertex(info, "read_text").subtask_attempts) > 0  # the kill really restarted a source
    assert any(victim in f.error.message for f in info.failure_history)
    got = _committed_counts(out)
    assert sum(got.values()) == 48_000
    assert got == expected


@pytest.mark.timeout(180)
def test_blocking_partition_lost_after_the_sources_finished_counts_every_row_once(local_cluster, tmp_path):
    cluster = local_cluster(taskexecutors=2, slots=2)
    src, out = tmp_path / "in", tmp_path / "out"
    expected = _write_files(src, files=8, rows=4000)

    def slow(row):  # the consumer stage runs for a while after it has read its inputs
        time.sleep(0.15)
        return row

    conf = {**RESTART, "jobmanager.execution.failover-strategy": "region"}
    gw = cluster.gateway()
    thread, outcome = _run_in_thread(cluster, _pipeline(src, out, _to_row, slow), "lost-partition", conf, 2)

    kill_between_stages(cluster, gw, "lost-partition", consumers=2)
    thread.join(120)
    assert "result" in outcome, outcome
    info = _job(gw, "lost-partition")
    gw.close()
    assert info.status == JobStatus.FINISHED
    assert sum(_vertex(info, "read_text").subtask_attempts) > 0  # a finished source ran again
    got = _committed_counts(out)
    assert sum(got.values()) == 4000
    assert got == expected
