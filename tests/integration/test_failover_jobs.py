"""Scheduling and failover on a real local cluster: region failover of a streaming job, batch
jobs running region by region on too few slots, and a TaskExecutor killed between the stages
of a batch job."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

import yarnflow
from tests.harness import wait_until
from yarnflow import executors
from yarnflow.common.states import ExecutionState, JobStatus

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

RESTART = {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": "3",
           "restart-strategy.fixed-delay.delay": "100 ms", "jobmanager.execution.failover-strategy": "region"}


def _run(cluster, build, name, conf=None, parallelism=2):
    ctx = executors.ClusterContext(cluster.address, conf or {}, progress=False)
    executors.set_context(ctx)
    try:
        env = yarnflow.StreamExecutionEnvironment(parallelism=parallelism)
        build(env)
        return env.execute(name)
    finally:
        executors.set_context(None)


def _job(gw, name):
    return next(j for j in gw.list_jobs() if j.name == name)


def test_streaming_task_failing_once_is_restarted_alone_by_region_failover(local_cluster, tmp_path):
    cluster = local_cluster(taskexecutors=2, slots=2)
    marker = str(tmp_path / "failed-once")

    def fail_once(row):
        if row["x"] == 7 and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("transient failure on row 7")
        return {"x": row["x"] * 10}

    def build(env):
        env.set_runtime_mode("STREAMING")
        # source -> map -> collect are chained; two subtasks = two independent pipelined regions
        env.from_collection({"x": list(range(100))}).map(fail_once, name="fail_once").collect()

    result = _run(cluster, build, "flaky", RESTART)
    assert sorted(result.collected()["x"].to_pylist()) == [10 * i for i in range(100)]
    gw = cluster.gateway()
    info = _job(gw, "flaky")
    gw.close()
    assert info.status == JobStatus.FINISHED
    [entry] = info.failure_history
    assert "transient failure on row 7" in entry.error.message and entry.restarted_subtasks == 1
    [vertex] = info.vertices
    assert vertex.subtask_attempts == [1, 0]  # row 7 is in subtask 1's slice; subtask 2 never restarted
    # the restarted subtask went back to the slot it had (the JobMaster's slot pool kept it)
    assert f"TaskExecutor {vertex.subtask_locations[0]} " in (entry.error.location or "")
    assert "fixed-delay" in info.restart_strategy


def test_restart_strategy_gives_up_with_root_cause_and_history(local_cluster):
    cluster = local_cluster(taskexecutors=1, slots=2)

    def always(row):
        raise ValueError(f"bad row {row['x']}")

    conf = {**RESTART, "restart-strategy.fixed-delay.attempts": "2"}
    with pytest.raises(yarnflow.JobFailedError) as err:
        _run(cluster, lambda env: env.from_collection({"x": [1]}).map(always).collect(), "doomed", conf, 1)
    assert "bad row 1" in str(err.value)
    gw = cluster.gateway()
    info = _job(gw, "doomed")
    gw.close()
    assert info.status == JobStatus.FAILED
    assert [f.restarted_subtasks for f in info.failure_history] == [1, 1, 0]  # two restarts, then gave up
    assert "bad row 1" in info.failure_cause.message


def test_batch_job_with_more_subtasks_than_slots_completes(local_cluster):
    cluster = local_cluster(taskexecutors=1, slots=2, **{"slotmanager__number-of-slots__max": "2"})
    data = {"k": [i % 50 for i in range(4000)], "v": list(range(4000))}

    def build(env):
        env.from_collection(data).map_batches(lambda b: b).key_by("k").sum("v").collect()

    result = _run(cluster, build, "wide", {}, parallelism=4)
    got = dict(zip(result.collected()["k"].to_pylist(), result.collected()["v"].to_pylist()))
    expected: dict[int, int] = {}
    for k, v in zip(data["k"], data["v"]):
        expected[k] = expected.get(k, 0) + v
    assert got == expected
    gw = cluster.gateway()
    assert gw.cluster_info().total_slots == 2  # it never had more than its 2 slots
    gw.close()


def test_two_independent_streaming_pipelines_share_slots_on_a_capped_cluster(local_cluster, tmp_path):
    """Slot sharing spans pipelined regions in STREAMING jobs, as in Flink: two independent
    pipelines of parallelism 2 need 2 slots, not 4, and run at the same time (pipeline a
    waits for a sign of life from pipeline b; without sharing, b never got a slot)."""
    marker = str(tmp_path / "b-ran")
    cluster = local_cluster(taskexecutors=1, slots=2, **{"slotmanager__number-of-slots__max": "2",
                                                         "slot__request__timeout": "20 s"})
    a = {"k": [i % 7 for i in range(700)], "v": [1] * 700}
    b = {"k": [i % 5 for i in range(500)], "v": [2] * 500}

    def wait_for_b(batch):
        deadline = time.monotonic() + 15
        while not os.path.exists(marker):
            if time.monotonic() > deadline:
                raise RuntimeError("pipeline b never ran beside pipeline a")
            time.sleep(0.05)
        return batch

    def b_runs(batch):
        open(marker, "a").close()
        return batch

    def build(env):
        env.set_runtime_mode("STREAMING")
        env.from_collection(a).map_batches(wait_for_b).key_by("k").sum("v").collect()
        env.from_collection(b).map_batches(b_runs).key_by("k").sum("v").collect()

    result = _run(cluster, build, "two-pipelines", {}, parallelism=2)
    finals = []
    for uid in result.collect_uids:
        table = result.collected(uid)
        final: dict[int, int] = {}
        for k, v in zip(table["k"].to_pylist(), table["v"].to_pylist()):
            final[k] = max(final.get(k, 0), v)   # STREAMING: running sums, the last is the largest
        finals.append(final)
    assert sorted(finals, key=len) == [{k: 200 for k in range(5)}, {k: 100 for k in range(7)}]
    gw = cluster.gateway()
    assert gw.cluster_info().total_slots == 2
    gw.close()


def test_taskexecutor_killed_after_the_first_stage_restarts_only_the_named_regions(local_cluster, tmp_path):
    cluster = local_cluster(taskexecutors=2, slots=2)
    data = {"k": [i % 40 for i in range(2000)], "v": list(range(2000))}
    gw = cluster.gateway()

    def slow_add(acc, row):
        time.sleep(0.004)
        return {"k": acc["k"], "v": acc["v"] + row["v"]}

    def build(env):
        env.set_runtime_mode("BATCH")
        (env.from_collection(data).map_batches(lambda b: b, name="stage1")
            .key_by("k").reduce(slow_add, name="stage2").collect())

    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["result"] = _run(cluster, build, "two-stage", RESTART)
        except BaseException as exc:  # noqa: BLE001
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    # wait for: stage 1 finished on both TaskExecutors, stage 2 running
    def stage_2_running():
        info = next((j for j in gw.list_jobs() if j.name == "two-stage"), None)
        if info is None:
            return None
        s1 = next(v for v in info.vertices if v.name.startswith("collection"))
        s2 = next(v for v in info.vertices if v.name.startswith("stage2"))
        done = s1.state_counts.get(ExecutionState.FINISHED) == 2 and s2.state_counts.get(ExecutionState.RUNNING) == 2
        return s1 if done else None

    s1 = wait_until(stage_2_running, 60, "stage 2 never ran while stage 1 was finished", interval_s=0.02)
    victim = s1.subtask_locations[0]
    assert s1.subtask_locations[0] != s1.subtask_locations[1]  # spread over both TaskExecutors
    am = psutil.Process(cluster.proc.pid)
    [proc] = [p for p in am.children() if victim in p.cmdline()]
    proc.send_signal(signal.SIGKILL)
    thread.join(90)
    assert "result" in outcome, outcome
    table = outcome["result"].collected()
    expected: dict[int, int] = {}
    for k, v in zip(data["k"], data["v"]):
        expected[k] = expected.get(k, 0) + v
    assert dict(zip(table["k"].to_pylist(), table["v"].to_pylist())) == expected

    info = _job(gw, "two-stage")
    gw.close()
    s1 = next(v for v in info.vertices if v.name.startswith("collection"))
    s2 = next(v for v in info.vertices if v.name.startswith("stage2"))
    # the rules: the lost TaskExecutor's running stage-2 subtask restarts; its stage-1 producer's
    # output is gone, so that producer's region re-runs; every stage-2 subtask reads it, so both
    # re-run; the stage-1 subtask on the surviving TaskExecutor is not touched
    assert s1.subtask_attempts == [1, 0]
    assert s2.subtask_attempts == [1, 1]
    assert victim not in s1.subtask_locations + s2.subtask_locations
    assert any(victim in f.error.message for f in info.failure_history)


def test_taskexecutors_are_started_on_demand_and_released_when_idle(process_tag, tmp_path, monkeypatch):
    """No TaskExecutor at start (slotmanager.number-of-slots.min 0): the job's slot requests
    make the ResourceManager start one; once idle for resourcemanager.taskmanager-timeout it
    is released."""
    from tests.conftest import FAST_CONF, TAG_VAR
    from yarnflow.local_cluster import LocalCluster

    monkeypatch.setenv(TAG_VAR, process_tag)
    conf = {**FAST_CONF, "resourcemanager.taskmanager-timeout": "1 s", "slot.idle.timeout": "200 ms"}
    cluster = LocalCluster(0, 2, conf, work_dir=str(tmp_path / "c"))
    try:
        cluster.start()
        gw = cluster.gateway()
        assert gw.cluster_info().registered_taskexecutors == 0
        result = _run(cluster, lambda env: env.from_collection({"x": list(range(10))}).collect(), "on-demand")
        assert sorted(result.collected()["x"].to_pylist()) == list(range(10))
        wait_until(lambda: gw.cluster_info().registered_taskexecutors == 0, 30, "idle TaskExecutors were not released",
                   interval_s=0.1)
        gw.close()
    finally:
        cluster.stop()


def test_resource_profiles_are_matched_to_slots(local_cluster):
    """Slots of 1 GB / 2 = 512 MB: a subtask asking for 300 MB runs; one asking for 4 GB can
    never get a slot (no TaskExecutor the cluster could start has one that big), so the job
    fails at once, saying why."""
    cluster = local_cluster(taskexecutors=1, slots=2)
    ok = _run(cluster, lambda env: env.from_collection({"x": [1, 2]}).set_resources(memory_mb=300).collect(),
              "fits", {}, parallelism=1)
    assert sorted(ok.collected()["x"].to_pylist()) == [1, 2]
    with pytest.raises(yarnflow.JobFailedError) as err:
        _run(cluster, lambda env: env.from_collection({"x": [1]}).set_resources(memory_mb=4096).collect(),
             "too-big", {}, parallelism=1)
    assert "NoResourceAvailableError" in str(err.value)
    assert "no slot can offer 0 cores and 4096 MB: a TaskExecutor slot has 1 cores and 512 MB" in str(err.value)


def test_blocking_partitions_go_to_disk_and_are_released_after_use(local_cluster):
    """A batch job's blocking exchange is written under the TaskExecutors' work dirs while it
    is needed and released (files deleted) once every consumer has read it."""
    import glob

    cluster = local_cluster(taskexecutors=2, slots=2)
    pattern = os.path.join(cluster.work_dir, "taskexecutors", "*", "partitions", "*", "*.arrow")
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.extend(glob.glob(pattern))
            time.sleep(0.01)

    def slow_add(acc, row):
        time.sleep(0.002)
        return {"k": acc["k"], "v": acc["v"] + row["v"]}

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = _run(cluster, lambda env: env.from_collection({"k": [i % 7 for i in range(700)],
                                                               "v": list(range(700))})
                      .key_by("k").reduce(slow_add).collect(), "spill")
    finally:
        stop.set()
        watcher.join(5)
    assert dict(zip(result.collected()["k"].to_pylist(), result.collected()["v"].to_pylist())) == \
        {k: sum(v for v in range(700) if v % 7 == k) for k in range(7)}
    assert seen, "the blocking exchange never reached the TaskExecutors' disks"
    wait_until(lambda: glob.glob(pattern) == [], 10, lambda: f"blocking partition files left: {glob.glob(pattern)}")
