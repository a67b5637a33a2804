"""A STREAMING Spark stage's micro-batches, without Spark: the files that arrive before
checkpoint n's barrier are epoch n; epochs run when a checkpoint covering them completes, in
order, their output named downstream after that checkpoint; an epoch not yet run at a
checkpoint is in its state and runs again after a restore; inputs and outputs are deleted once a
checkpoint after their run completes. (Spark itself is replaced by pyarrow here; the cluster
test in tests/integration/test_spark_stages.py runs the real thing.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.harness import OperatorHarness
from yarnflow.worker.operators.spark import SparkStage

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class ArrowStage(SparkStage):
    """Copies its inputs' rows to its output folder (what ``SELECT * FROM input`` would do)."""

    runs: list[list[str]] = []

    def _session(self) -> tuple[Any, str, float]:
        return None, "", 0.0

    def _write(self, session: Any, files: dict[int, list[str]], out_dir: str) -> None:
        paths = [p for ps in files.values() for p in ps]
        ArrowStage.runs.append([os.path.basename(p) for p in paths])
        os.makedirs(out_dir, exist_ok=True)
        pq.write_table(pa.concat_tables([pq.read_table(p.removeprefix("file://")) for p in paths]),
                       f"{out_dir}/part-0.parquet")

    def _report(self, *args: Any, **kwargs: Any) -> None:
        pass


def files(folder: Path, *names: str) -> pa.RecordBatch:
    paths = []
    for name in names:
        pq.write_table(pa.table({"x": [name]}), folder / name)
        paths.append(f"file://{folder / name}")
    return pa.record_batch({"path": paths, "rows": [1] * len(paths)})


def stage(tmp_path: Path) -> OperatorHarness:
    ArrowStage.runs = []
    return OperatorHarness(ArrowStage(["input"], query="SELECT * FROM input", name="s", uid="stage"),
                           runtime_mode="STREAMING", job_storage_dir=f"file://{tmp_path}/storage",
                           checkpointing=True)


def emitted(h: OperatorHarness) -> list[str]:
    return [r["x"] for b in h.out.take() for p in b.column("path").to_pylist()
            for r in pq.read_table(p.removeprefix("file://")).to_pylist()]


def test_epochs_run_when_their_checkpoint_completes_in_order(tmp_path) -> None:
    h = stage(tmp_path)
    h.batch(files(tmp_path, "a1", "a2"))
    state1 = h.op.snapshot_state(1)
    h.batch(files(tmp_path, "b1"))
    h.op.snapshot_state(2)
    h.batch(files(tmp_path, "c1"))  # after checkpoint 2: the next epoch
    assert state1["epochs"].column("epoch").to_pylist() == [1, 1]
    assert emitted(h) == []  # nothing before a checkpoint completes
    h.op.notify_checkpoint_complete(2)  # checkpoint 1's notification was missed: both run now
    assert ArrowStage.runs == [["a1", "a2"], ["b1"]]
    assert emitted(h) == ["a1", "a2", "b1"]
    assert all((tmp_path / f).exists() for f in ("a1", "a2", "b1"))  # until a checkpoint after their run
    h.op.snapshot_state(3)
    h.op.notify_checkpoint_complete(3)
    assert not any((tmp_path / f).exists() for f in ("a1", "a2", "b1"))
    assert ArrowStage.runs[-1] == ["c1"] and emitted(h) == ["c1"]
    assert not (tmp_path / "storage" / "intermediate" / "stage" / "out" / "epoch-1").exists()


def test_an_epoch_not_run_at_a_checkpoint_runs_again_after_a_restore(tmp_path) -> None:
    h = stage(tmp_path)
    h.batch(files(tmp_path, "a1"))
    h.op.snapshot_state(1)
    h.op.notify_checkpoint_complete(1)  # ran, emitted after barrier 1...
    assert emitted(h) == ["a1"]
    h.batch(files(tmp_path, "b1"))
    state2 = h.op.snapshot_state(2)  # ...so checkpoint 2 has it as run, and b1 as not run yet
    assert state2["epochs"].column("path").to_pylist() == [f"file://{tmp_path}/b1"]
    # the job fails before checkpoint 2's notification; it restarts from checkpoint 2
    restored = stage(tmp_path)
    restored.op.initialize_state(state2)
    restored.op.snapshot_state(3)
    restored.op.notify_checkpoint_complete(3)
    assert ArrowStage.runs == [["b1"]] and emitted(restored) == ["b1"]


def test_at_the_end_of_a_bounded_input_what_is_left_runs(tmp_path) -> None:
    h = stage(tmp_path)
    h.batch(files(tmp_path, "a1"))
    h.op.snapshot_state(1)
    h.batch(files(tmp_path, "z9"))
    h.finish()
    assert ArrowStage.runs == [["a1"], ["z9"]] and emitted(h) == ["a1", "z9"]
