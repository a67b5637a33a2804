"""The adaptive batch scheduler on a real local cluster (issue 30): one BATCH job, a keyed count
with no parallelism given, run on a 1 MB and on a 200 MB Parquet input. Its sources run at the
default source parallelism; the count runs at parallelism 1 for the small input and at its
upper bound (the job's parallelism, 4) for the large one, each subtask reading its range of
the sources' subpartitions. Every input row is counted exactly once either way, also when a
TaskExecutor is killed after the decision."""

from __future__ import annotations

import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from tests.integration.test_batch_exactly_once import (
    RESTART,
    _committed_counts,
    _pipeline as _text_pipeline,
    _run_in_thread,
    _to_row,
    _vertex,
    _write_files,
    kill_between_stages,
)
from tests.integration.test_failover_jobs import _job, _run
from yarnflow.common.states import JobStatus

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

AUTO = {"execution.batch.adaptive.auto-parallelism.enabled": "true",
        "execution.batch.adaptive.auto-parallelism.default-source-parallelism": "2"}


def _write_input(folder, megabytes: int, seed: int) -> int:
    """Parquet files of about ``megabytes`` MB in all: random 32-character keys, each in two
    rows (in different files). Returns the number of distinct keys."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    keys_per_file = max(1000, megabytes * 2**20 // 4 // 34)  # two files hold each key once
    for pair in range(2):
        raw = rng.integers(0, 2**63, size=(keys_per_file, 2), dtype=np.int64)
        keys = pa.array([f"{a:016x}{b:016x}" for a, b in raw.tolist()], pa.string())
        keys = pc.binary_join_element_wise(pa.scalar(f"{pair}-"), keys, "")  # distinct across pairs
        table = pa.table({"k": keys})
        for copy in range(2):
            pq.write_table(table.slice(0) if copy == 0 else table.take(pa.array(rng.permutation(len(table)))),
                           os.path.join(folder, f"part-{pair}-{copy}.parquet"), compression="none")
    return 2 * keys_per_file


def _pipeline(src, out):
    def build(env):
        env.set_runtime_mode("BATCH")
        env.read_parquet(str(src)).key_by("k").count().sink_to_parquet(str(out))
    return build


@pytest.mark.parametrize("megabytes, expected", [(1, 1), (200, 4)])
def test_the_count_runs_at_the_parallelism_its_input_calls_for_and_counts_every_row_once(
        local_cluster, tmp_path, megabytes, expected):
    src, out = tmp_path / "in", tmp_path / "out"
    keys = _write_input(src, megabytes, seed=megabytes)
    size = sum(os.path.getsize(src / f) for f in os.listdir(src))
    assert abs(size / 2**20 - megabytes) <= megabytes * 0.2 + 0.5, f"input is {size / 2**20:.1f} MB"
    cluster = local_cluster(taskexecutors=2, slots=2)
    name = f"auto-{megabytes}mb"
    _run(cluster, _pipeline(src, out), name, AUTO, parallelism=4)
    gw = cluster.gateway()
    info = _job(gw, name)
    gw.close()
    assert info.status == JobStatus.FINISHED
    parallelism = {v.name: v.parallelism for v in info.vertices}
    assert parallelism == {"read_parquet -> count (local)": 2, "count -> parquet_sink": expected}, parallelism
    assert f"parallelism {expected} of at most 4" in info.scaling
    written = [f for f in os.listdir(out) if not f.startswith((".", "_"))]
    assert len(written) == expected  # one file per subtask that ran
    table = pads.dataset(str(out), format="parquet").to_table()
    assert table.num_rows == keys and pc.count_distinct(table["k"]).as_py() == keys
    assert pc.min(table["count"]).as_py() == 2 == pc.max(table["count"]).as_py()


@pytest.mark.timeout(180)
def test_a_taskexecutor_lost_after_the_decision_keeps_it_and_counts_every_row_once(local_cluster, tmp_path):
    """The count's parallelism is decided (3 of at most 4: min-parallelism), then a TaskExecutor
    holding a finished source's blocking output and a running count subtask is killed: the
    source runs again, the count subtasks restart at the same parallelism (the subtask that
    never ran stays out) and every row is counted once."""
    cluster = local_cluster(taskexecutors=2, slots=2)
    src, out = tmp_path / "in", tmp_path / "out"
    expected = _write_files(src, files=8, rows=4000)

    def slow(row):  # the count's subtasks run on for a while after they have read their input
        time.sleep(0.3)
        return row

    conf = {**AUTO, **RESTART, "jobmanager.execution.failover-strategy": "region",
            "execution.batch.adaptive.auto-parallelism.min-parallelism": "3"}
    gw = cluster.gateway()
    thread, outcome = _run_in_thread(cluster, _text_pipeline(src, out, _to_row, slow), "auto-lost", conf, 4)

    info = kill_between_stages(cluster, gw, "auto-lost", consumers=3)
    assert _vertex(info, "sum").parallelism == 3
    thread.join(120)
    assert "result" in outcome, outcome
    info = _job(gw, "auto-lost")
    gw.close()
    assert info.status == JobStatus.FINISHED
    assert sum(_vertex(info, "read_text").subtask_attempts) > 0  # a finished source ran again
    count = _vertex(info, "sum")
    assert count.parallelism == 3 and len(count.subtask_attempts) == 3 and sum(count.subtask_attempts) > 0
    got = _committed_counts(out)
    assert sum(got.values()) == 4000 and got == expected
    assert len([f for f in os.listdir(out) if not f.startswith((".", "_"))]) == 3
