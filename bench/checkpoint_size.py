"""checkpoint-size: a keyed sum holding ``keys`` distinct keys (STREAMING): how long the task
pauses to take the snapshot (``sync_pause_ms``, on the task thread) and how fast the state is
then written as Arrow IPC in the background (``async_mb_per_s``), with the real operator and
the real snapshot writer, on local disk."""

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


def run_checkpoint_size(keys: int = 5_000_000, batch: int = 100_000) -> dict[str, Any]:
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
    t1 = time.perf_counter()
    tables = op.snapshot_state(1)
    sync_ms = (time.perf_counter() - t1) * 1000
    folder = tempfile.mkdtemp(prefix="yarnflow-ckpt-size-")
    try:
        responder = _Responder()
        writer = SnapshotWriter(f"file://{folder}", "v", 0, 0, responder, "bench")
        t2 = time.perf_counter()
        files = writer.write_files(1, [tables])
        async_s = time.perf_counter() - t2
        size = sum(f.size_bytes for f in files)
        rows = sum(t.num_rows for t in tables.values())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"name": "checkpoint-size", "keys": keys, "state_rows": rows, "state_mb": round(size / 2**20, 1),
            "fill_s": round(fill_s, 2), "sync_pause_ms": round(sync_ms), "async_mb_per_s": round(size / 2**20 / async_s),
            "target_sync_pause_ms": 100, "verified": rows == keys}
