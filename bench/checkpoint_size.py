"""checkpoint-size: a keyed sum holding ``keys`` distinct keys (STREAMING): how long the task
pauses to take the snapshot (``sync_pause_ms``: ``snapshot_state`` on the task thread, which
freezes the state and copies its value columns) and how fast the snapshot is then made and
written as Arrow IPC on the writer's thread (``async_mb_per_s``, including making the table),
with the real operator and the real snapshot writer, on local disk. ``process_keys`` does the
same for a keyed process function with one ValueState per key (the heap backend's
copy-on-write layers) and reports ``process_sync_pause_ms``."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from typing import Any

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Discard:
    def collect(self, batch: Any) -> None:
        pass

    def collect_side(self, tag: str, batch: Any) -> None:
        pass

    def emit_watermark(self, watermark: Any) -> None:
        pass


class _Responder:
    def acknowledge(self, checkpoint_id: int, snapshot: Any) -> None:
        self.snapshot = snapshot

    def decline(self, checkpoint_id: int, reason: str) -> None:
        raise RuntimeError(reason)


def _process_pause(keys: int, batch: int) -> tuple[float, int]:
    """Sync pause of a keyed process function's snapshot with ``keys`` keys of ValueState."""
    from tests.harness import runtime_context
    from yarnflow.common.api import KeyedProcessFunction, ValueStateDescriptor
    from yarnflow.worker.operators.process import KeyedProcessOperator
    from yarnflow.worker.state.tables import materialize

    class Last(KeyedProcessFunction):
        def open(self, ctx: Any) -> None:
            self.last = self.get_state(ValueStateDescriptor("last"))

        def process_element(self, row: Any, ctx: Any, out: Any) -> None:
            self.last.update(row["v"])

    op = KeyedProcessOperator(["k"], Last())
    op.setup(runtime_context(runtime_mode="STREAMING", batch_size=batch), _Discard())
    op.open()
    for start in range(0, keys, batch):
        n = min(batch, keys - start)
        op.process_batch(pa.record_batch({"k": pa.array(range(start, start + n), pa.int64()),
                                          "v": pa.array([1] * n, pa.int64())}))
    t = time.perf_counter()
    snapshot = op.snapshot_state(1)
    pause_ms = (time.perf_counter() - t) * 1000
    rows = sum(t.num_rows for t in materialize(snapshot).values())
    return pause_ms, rows


def run_checkpoint_size(keys: int = 5_000_000, batch: int = 100_000, process_keys: int = 1_000_000) -> dict[str, Any]:
    from tests.harness import runtime_context
    from yarnflow.worker.operators.keyed import KeyedAggregate
    from yarnflow.worker.runtime.checkpoints import SnapshotWriter

    op = KeyedAggregate(["k"], [("v", "sum")])
    op.setup(runtime_context(runtime_mode="STREAMING", batch_size=batch), _Discard())
    op.open()
    t0 = time.perf_counter()
    for start in range(0, keys, batch):
        n = min(batch, keys - start)
        op.process_batch(pa.record_batch({"k": pa.array(range(start, start + n), pa.int64()),
                                          "v": pa.array([1] * n, pa.int64())}))
    fill_s = time.perf_counter() - t0
    import numpy as np

    rng = np.random.default_rng(1)

    def touch() -> float:  # a batch updating `batch` random existing keys
        keys_ = pa.array(rng.integers(0, keys, batch), pa.int64())
        t = time.perf_counter()
        op.process_batch(pa.record_batch({"k": keys_, "v": pa.array(np.ones(batch, dtype=np.int64))}))
        return (time.perf_counter() - t) * 1000

    batch_ms = touch()
    t1 = time.perf_counter()
    tables = op.snapshot_state(1)
    sync_ms = (time.perf_counter() - t1) * 1000
    cow_batch_ms = touch()  # copies, once, the chunks it changes while the snapshot is not yet made
    folder = tempfile.mkdtemp(prefix="yarnflow-ckpt-size-")
    try:
        responder = _Responder()
        writer = SnapshotWriter(f"file://{folder}", "v", 0, 0, responder, "bench")
        t2 = time.perf_counter()
        files = writer.write_files(1, [tables])
        async_s = time.perf_counter() - t2
        size = sum(f.size_bytes for f in files)
        from yarnflow.worker.runtime.checkpoints import read_task_state
        from yarnflow.common.messages import TaskRestore
        restored = read_task_state(TaskRestore(1, files, False), 1)[0]
        rows = sum(t.num_rows for t in restored.values())
        total = sum(restored["aggregates"].column("v").to_pylist()) if "aggregates" in restored else -1
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    process_ms, process_rows = _process_pause(process_keys, batch) if process_keys else (0.0, 0)
    return {"name": "checkpoint-size", "keys": keys, "state_rows": rows, "state_mb": round(size / 2**20, 1),
            "fill_s": round(fill_s, 2), "sync_pause_ms": round(sync_ms, 1), "async_mb_per_s": round(size / 2**20 / async_s),
            "batch_ms": round(batch_ms, 1), "batch_after_snapshot_ms": round(cow_batch_ms, 1),
            "process_keys": process_keys, "process_sync_pause_ms": round(process_ms, 1),
            "target_sync_pause_ms": 100,
            "verified": rows == keys and total == keys + batch and process_rows == process_keys}
