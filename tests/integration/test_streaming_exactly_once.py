"""STREAMING jobs with checkpoints keep Flink's promise on a real local cluster (issue 8):
a TaskExecutor SIGKILLed at any moment (also during a checkpoint) and the committed output
still holds every input row exactly once; a corrupt latest checkpoint falls back to the
previous one; at-least-once mode never loses a row.

Sources are text files; the sink is Parquet, read back with pyarrow.dataset (which skips the
hidden in-progress files), so what is checked is what a reader of the output would see."""

from __future__ import annotations

import collections
import os
import random
import signal
import time
from contextlib import closing

import pyarrow.dataset as pads
import pytest

from tests.harness import assert_upsert_counts, frozen_then_one_killed, wait_until
from tests.integration.test_batch_exactly_once import _run_in_thread
from tests.integration.test_cluster_failures import _resource_id, _te_processes
from yarnflow.common.states import JobStatus

pytestmark = [pytest.mark.integration]

FILES, ROWS, KEYS = 10, 10_000, 23
CHECKPOINTS = {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": "5",
               "restart-strategy.fixed-delay.delay": "200 ms", "execution.checkpointing.interval": "200 ms",
               "execution.batch-size": "100", "heartbeat.timeout": "4 s"}


def _write(folder) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    rows = []
    per_file = ROWS // FILES
    for f in range(FILES):
        lines = [f"k{(f * per_file + r) % KEYS} {f} {r}" for r in range(per_file)]
        rows.extend(lines)
        (folder / f"in-{f:02d}.txt").write_text("\n".join(lines) + "\n")
    return rows


def _slow_parse(batch):
    """Split each line into columns; ~80 ms per 100-row batch (about 4 s for the job at
    parallelism 2), so checkpoints and kills land in the middle of it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    time.sleep(0.08)
    parts = pc.split_pattern(batch.column("line"), " ")
    return pa.record_batch({"k": pc.list_element(parts, 0), "file": pc.list_element(parts, 1),
                            "row": pc.list_element(parts, 2), "n": pa.array([1] * batch.num_rows, pa.int64())})


def _build(src, out, keyed: bool):
    def build(env):
        env.set_runtime_mode("STREAMING")
        stream = env.read_text(str(src)).map_batches(_slow_parse, name="parse")
        if keyed:
            stream = stream.key_by("k").sum("n")
        stream.sink_to_parquet(str(out))
    return build


def _committed(out):
    return pads.dataset(str(out), format="parquet").to_table()


def _job(gw, name):
    return next((j for j in gw.list_jobs() if j.name == name), None)


def _kill_a_busy_taskexecutor(cluster, gw, name, rng, during_checkpoint: bool) -> str:
    def ready():
        info = _job(gw, name)
        if info is None or info.status != JobStatus.RUNNING or not info.latest_completed_checkpoint_id:
            return None
        if during_checkpoint and not (info.checkpoints and info.checkpoints[-1].status in ("PENDING", "FINALIZING")):
            return None
        return info
    info = wait_until(ready, 60, "the job never completed a checkpoint", interval_s=0.01)
    busy = sorted({loc for v in info.vertices for loc in v.subtask_locations if loc})
    victim = rng.choice(busy)
    [proc] = [p for p in _te_processes(cluster) if _resource_id(p) == victim]
    proc.send_signal(signal.SIGKILL)
    return victim


def run_killing_one_taskexecutor(cluster, build, name, conf, rng, delay_s: tuple[float, float],
                                 during_checkpoint: bool = False):
    """Run the job (parallelism 2), SIGKILL a TaskExecutor running it once a checkpoint
    completed, and return its final status, checked to be FINISHED after a restart that
    restored a checkpoint."""
    with closing(cluster.gateway()) as gw:
        thread, outcome = _run_in_thread(cluster, build, name, conf, 2)
        time.sleep(rng.uniform(*delay_s))
        victim = _kill_a_busy_taskexecutor(cluster, gw, name, rng, during_checkpoint)
        thread.join(200)
        assert "error" not in outcome, outcome.get("error")
        info = _job(gw, name)
    assert info is not None and info.status == JobStatus.FINISHED
    assert any(victim in f.error.message for f in info.failure_history), "the kill did not hit the job"
    assert any(f.restored_checkpoint_id for f in info.failure_history), "the restart did not use a checkpoint"
    return info


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("seed", "keyed", "during_checkpoint"),
                         [(1, False, False), (2, True, False), (3, True, True)],
                         ids=["rows-random-kill", "keyed-random-kill", "keyed-kill-during-checkpoint"])
def test_a_sigkilled_taskexecutor_loses_and_repeats_nothing(local_cluster, tmp_path, seed, keyed, during_checkpoint):
    rng = random.Random(seed)
    src, out = tmp_path / "in", tmp_path / "out"
    rows = _write(src)
    cluster = local_cluster(taskexecutors=2, slots=2)
    run_killing_one_taskexecutor(cluster, _build(src, out, keyed), f"exactly-once-{seed}", CHECKPOINTS, rng,
                                 (0.0, 1.0), during_checkpoint)
    table = _committed(out)
    if not keyed:
        got = collections.Counter(f"{k} {f} {r}" for k, f, r in zip(table["k"].to_pylist(), table["file"].to_pylist(),
                                                                    table["row"].to_pylist()))
        assert sum(got.values()) == len(rows)
        assert got == collections.Counter(rows)
    else:
        assert_upsert_totals(out, rows)


def assert_upsert_totals(out, rows: list[str]) -> None:
    """The keyed job's committed upsert stream: each key's running totals, committed once each,
    ending at the key's count in ``rows``."""
    assert_upsert_counts(out, collections.Counter(line.split()[0] for line in rows))


@pytest.mark.timeout(240)
def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one(local_cluster, tmp_path, request):
    src, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "checkpoints"
    rows = _write(src)
    cluster = local_cluster(taskexecutors=2, slots=2)
    gw = cluster.gateway()
    request.addfinalizer(gw.close)
    conf = {**CHECKPOINTS, "execution.checkpointing.num-retained": "2", "execution.checkpointing.dir": str(ckpt)}
    thread, outcome = _run_in_thread(cluster, _build(src, out, False), "corrupt", conf, 2)
    info = wait_until(lambda: (j := _job(gw, "corrupt")) is not None and j.latest_completed_checkpoint_id >= 2 and j,
                      60, "two checkpoints never completed", interval_s=0.01)
    with frozen_then_one_killed(_te_processes(cluster)):
        info = _job(gw, "corrupt")
        latest = info.latest_completed_checkpoint_id
        files = [os.path.join(d, f) for d, _, fs in os.walk(ckpt / info.job_id / f"chk-{latest}")
                 for f in fs if f.endswith(".arrow")]
        assert files, "the latest checkpoint has no state files"
        for path in files:
            with open(path, "wb") as fh:
                fh.write(b"not arrow at all")
    thread.join(200)
    assert "error" not in outcome, outcome.get("error")
    info = _job(gw, "corrupt")
    assert info.status == JobStatus.FINISHED
    assert any(f.error.error_class == "CheckpointNotReadableError" for f in info.failure_history)
    restored = [f.restored_checkpoint_id for f in info.failure_history if f.restored_checkpoint_id]
    assert restored and restored[-1] < latest
    table = _committed(out)
    got = collections.Counter(f"{k} {f} {r}" for k, f, r in zip(table["k"].to_pylist(), table["file"].to_pylist(),
                                                                table["row"].to_pylist()))
    assert got == collections.Counter(rows)


@pytest.mark.timeout(240)
def test_at_least_once_mode_never_loses_a_row(local_cluster, tmp_path, request):
    src, out = tmp_path / "in", tmp_path / "out"
    rows = _write(src)
    cluster = local_cluster(taskexecutors=2, slots=2)
    gw = cluster.gateway()
    request.addfinalizer(gw.close)
    conf = {**CHECKPOINTS, "execution.checkpointing.mode": "AT_LEAST_ONCE"}
    thread, outcome = _run_in_thread(cluster, _build(src, out, False), "at-least-once", conf, 2)
    _kill_a_busy_taskexecutor(cluster, gw, "at-least-once", random.Random(7), False)
    thread.join(200)
    assert "error" not in outcome, outcome.get("error")
    table = _committed(out)
    got = collections.Counter(f"{k} {f} {r}" for k, f, r in zip(table["k"].to_pylist(), table["file"].to_pylist(),
                                                                table["row"].to_pylist()))
    missing = [r for r in rows if not got[r]]
    assert not missing, f"{len(missing)} rows lost, e.g. {missing[:3]}"
