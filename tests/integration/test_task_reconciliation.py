"""A master failover that keeps the tasks running (issue 34): real ZooKeeper, an active
AppMaster and standbys, real TaskExecutor processes, STREAMING jobs reading files with a
two-phase (Parquet) sink.

The leader is SIGKILLed three times at random moments (one of them while a checkpoint is
pending): the TaskExecutors keep the job's tasks running, each new leader's JobMaster takes them
over, and no attempt number changes; every input row is committed exactly once, with its key's
running count (keyed state) exact and gapless. A TaskExecutor killed during a failover: only
its region restarts (the other region's tasks are adopted as they run). A TaskExecutor frozen
through the failover and the reconciliation: when it comes back its tasks are given up."""

from __future__ import annotations

import collections
import random
import re
import signal
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pytest

from tests.harness import wait_until
from tests.integration.test_ha_failover import (
    _appmaster_log,
    connection,
    exact_rows,
    ha_cluster,  # noqa: F401 - the fixture
    job_info,
    leader,
    run_following_the_leader,
    wait_for_new_leader,
)
from yarnflow import KeyedProcessFunction, ValueStateDescriptor
from yarnflow.common.states import JobStatus

pytestmark = [pytest.mark.integration]

CONF = {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": "5",
        "restart-strategy.fixed-delay.delay": "200 ms", "execution.checkpointing.interval": "300 ms",
        "execution.batch-size": "100"}
KEYS = 17


def write_input(folder: Any, files: int, per_file: int) -> list[str]:
    """``files`` text files of "k<key> <file> <row>" lines; more files than subtasks, so splits
    are handed out before and after every failover."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for f in range(files):
        lines = [f"k{(f * per_file + r) % KEYS} {f} {r}" for r in range(per_file + 13 * (f % 3))]
        rows.extend(lines)
        (folder / f"in-{f:02d}.txt").write_text("\n".join(lines) + "\n")
    return rows


def slow_parse(batch: pa.RecordBatch) -> pa.RecordBatch:
    """~50 ms per 100-row batch: the job runs long enough for three failovers."""
    time.sleep(0.05)
    parts = pc.split_pattern(batch.column("line"), " ")
    return pa.record_batch({"k": pc.list_element(parts, 0), "file": pc.list_element(parts, 1),
                            "row": pc.list_element(parts, 2)})


class Sequence(KeyedProcessFunction):
    """Each row out again with its key's running count (ValueState): exact only if the state
    saw every row of the key once."""

    def open(self, ctx: Any) -> None:
        self.count = self.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, row: dict, ctx: Any, out: Any) -> None:
        n = self.count.value() + 1
        self.count.update(n)
        out.collect({"k": row["k"], "file": row["file"], "row": row["row"], "seq": n})


def keyed_job(src: Any, out: Any) -> Any:
    def build(env: Any) -> None:
        env.set_runtime_mode("STREAMING")
        (env.read_text(str(src)).map_batches(slow_parse, name="parse").key_by("k")
         .process(Sequence(), name="sequence").uid("sequence").sink_to_parquet(str(out)))
    return build


def forward_job(src: Any, out: Any) -> Any:
    """read -> parse -> sink, forward only: one pipelined region per subtask."""
    def build(env: Any) -> None:
        env.set_runtime_mode("STREAMING")
        env.read_text(str(src)).map_batches(slow_parse, name="parse").sink_to_parquet(str(out))
    return build


def assert_sequences(out: Any, rows: list[str]) -> None:
    """Every key's running counts are 1..n exactly once, n its number of rows."""
    table = pads.dataset(str(out), format="parquet").to_table()
    seqs: dict[str, list[int]] = collections.defaultdict(list)
    for k, n in zip(table["k"].to_pylist(), table["seq"].to_pylist()):
        seqs[k].append(n)
    expected = collections.Counter(line.split()[0] for line in rows)
    assert {k: sorted(v) for k, v in seqs.items()} == {k: list(range(1, n + 1)) for k, n in expected.items()}


def attempts(info: Any) -> dict[str, list[int]]:
    return {v.name: list(v.subtask_attempts) for v in info.vertices}


def running_with_checkpoint_after(conn: Any, name: str, after: int, pending: bool) -> Any:
    """The job RUNNING under the current leader with a checkpoint newer than ``after`` completed
    (and, with ``pending``, the next one under way)."""
    def ready() -> Any:
        info = job_info(conn, name)
        if info is None or info.status != JobStatus.RUNNING or info.latest_completed_checkpoint_id <= after:
            return None
        if pending and not (info.checkpoints and info.checkpoints[-1].status in ("PENDING", "FINALIZING")):
            return None
        return info
    return wait_until(ready, 60, f"{name} never went on checkpointing after checkpoint {after}", interval_s=0.01)


def taskexecutor_of_subtask(cluster: Any, info: Any, index: int) -> Any:
    """The TaskExecutor process running subtask ``index`` of the job's one vertex."""
    [vertex] = info.vertices
    location = vertex.subtask_locations[index]
    return next(p for p in cluster._descendants()
                if "yarnflow.worker" in p.cmdline() and any(location in a for a in p.cmdline()))


def ended_with_only_subtask_1_restarted(thread: Any, outcome: dict[str, Any], conn: Any, name: str, out: Any,
                                        rows: list[str]) -> None:
    """The job ended FINISHED, subtask 0's region taken over as it ran, subtask 1's restarted
    from the checkpoint, every row committed once."""
    thread.join(240)
    assert not thread.is_alive(), "the job did not end"
    assert "error" not in outcome, outcome.get("error")
    final = job_info(conn, name)
    assert final.status == JobStatus.FINISHED
    [vertex] = final.vertices
    assert vertex.subtask_attempts[0] == 0 and vertex.subtask_attempts[1] >= 1, vertex.subtask_attempts
    exact_rows(out, rows)


@pytest.mark.timeout(300)
def test_three_leader_kills_keep_every_task_running_and_commit_every_row_once(ha_cluster, tmp_path):  # noqa: F811
    src, out = tmp_path / "in", tmp_path / "out"
    rows = write_input(src, files=16, per_file=3000)
    cluster = ha_cluster(standby=3)
    thread, outcome = run_following_the_leader(cluster, keyed_job(src, out), "keep-running", CONF)
    conn = connection(cluster)
    rng = random.Random(34)
    try:
        info = running_with_checkpoint_after(conn, "keep-running", 0, pending=False)
        before = attempts(info)
        assert before and all(a == [0, 0] for a in before.values()), before
        latest = info.latest_completed_checkpoint_id
        leaders = []
        for kill in range(3):
            info = running_with_checkpoint_after(conn, "keep-running", latest, pending=kill == 1)
            time.sleep(rng.uniform(0, 0.3) if kill != 1 else 0)
            old, proc = leader(cluster)
            proc.send_signal(signal.SIGKILL)
            leaders.append(wait_for_new_leader(cluster, old))
            info = running_with_checkpoint_after(conn, "keep-running", 0, pending=False)
            latest = info.latest_completed_checkpoint_id
            assert info.status == JobStatus.RUNNING
            assert attempts(info) == before, f"after kill {kill + 1} tasks were restarted: {attempts(info)}"
            assert info.num_restarts == 0
        thread.join(240)
        assert not thread.is_alive(), "the job did not end"
        final = job_info(conn, "keep-running")
    finally:
        conn.close()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].status == JobStatus.FINISHED and final.status == JobStatus.FINISHED
    assert attempts(final) == before and final.num_restarts == 0
    exact_rows(out, rows)
    assert_sequences(out, rows)
    # a new leader numbers attempts from 0 again: the TaskExecutors' logs say no task was deployed twice
    deployed = sum(len(re.findall(r" deploying .+ \(\w+\)$", log.read_text(errors="replace"), re.M))
                   for log in Path(cluster.work_dir).rglob("te-*.log"))
    assert deployed == sum(len(a) for a in before.values()), f"{deployed} tasks deployed"
    for address in leaders:  # each new leader took the running tasks over
        log = _appmaster_log(cluster, cluster.appmasters()[address]) if address in cluster.appmasters() else ""
        assert not log or re.search(r"reconciled: \d+ subtasks adopted as they run, 0 to restart", log), log[-3000:]


@pytest.mark.timeout(300)
def test_a_taskexecutor_killed_during_the_failover_restarts_only_its_region(ha_cluster, tmp_path):  # noqa: F811
    src, out = tmp_path / "in", tmp_path / "out"
    rows = write_input(src, files=10, per_file=1200)
    cluster = ha_cluster(standby=1, taskexecutors=2, slots=1)
    thread, outcome = run_following_the_leader(cluster, forward_job(src, out), "one-region", CONF)
    conn = connection(cluster)
    try:
        info = running_with_checkpoint_after(conn, "one-region", 1, pending=False)
        assert [list(v.subtask_attempts) for v in info.vertices] == [[0, 0]]
        doomed = taskexecutor_of_subtask(cluster, info, 1)
        old, proc = leader(cluster)
        proc.send_signal(signal.SIGKILL)
        doomed.send_signal(signal.SIGKILL)  # while no AppMaster leads
        new = wait_for_new_leader(cluster, old)
        ended_with_only_subtask_1_restarted(thread, outcome, conn, "one-region", out, rows)
    finally:
        conn.close()
    log = _appmaster_log(cluster, cluster.appmasters()[new])
    assert "reconciled: 1 subtasks adopted as they run, 1 to restart" in log


@pytest.mark.timeout(300)
def test_a_taskexecutor_back_after_the_reconciliation_has_its_tasks_cancelled(ha_cluster, tmp_path):  # noqa: F811
    src, out = tmp_path / "in", tmp_path / "out"
    rows = write_input(src, files=10, per_file=1200)
    cluster = ha_cluster(standby=1, taskexecutors=2, slots=1)
    thread, outcome = run_following_the_leader(cluster, forward_job(src, out), "late-te", CONF)
    conn = connection(cluster)
    try:
        late = taskexecutor_of_subtask(cluster, running_with_checkpoint_after(conn, "late-te", 1, pending=False), 1)
        old, proc = leader(cluster)
        proc.send_signal(signal.SIGKILL)
        late.send_signal(signal.SIGSTOP)  # it misses the failover and the new leader's reconciliation
        try:
            new = wait_for_new_leader(cluster, old)
            wait_until(lambda: "reconciled: 1 subtasks adopted as they run, 1 to restart"
                       in _appmaster_log(cluster, cluster.appmasters()[new]), 30, "the new leader never reconciled")
        finally:
            late.send_signal(signal.SIGCONT)
        # it registers with the new leader, its slot and task of the job unknown there: given up
        wait_until(lambda: "reported after the reconciliation" in _appmaster_log(cluster, cluster.appmasters()[new]),
                   30, "the late TaskExecutor's tasks were never given up")
        ended_with_only_subtask_1_restarted(thread, outcome, conn, "late-te", out, rows)
    finally:
        conn.close()
