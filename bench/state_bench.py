"""state: keyed state of N keys on the hashmap or the rocksdb backend, checkpointed twice with
1% of the keys changed in between, then restored.

One process, no cluster: the benchmark drives what a keyed task does with its state (a
KeyedProcessFunction's ValueState per key: ``set_current_key``, ``value()``, ``update()``; or,
with ``--vectorised``, a STREAMING ``key_by("k").sum("n")``'s aggregate table: ``upsert`` of
100,000-key partial aggregates, as the operator does per batch), takes snapshots with the real ``SnapshotWriter`` into a local checkpoint dir, and restores a new
backend from the written files with ``read_task_state`` as a restarted task does. Figures:

- ``records_per_s``: state updates per second while loading the N keys (one read and one write
  per record; vectorised: per key of the partial aggregates);
- ``full_checkpoint_mb``: the bytes written by the first checkpoint (all the state);
- ``incremental_checkpoint_mb``: the bytes written by the second one, after 1% of the keys
  changed (the hashmap backend has no incremental checkpoints: it writes everything again);
- ``checkpoint_s``: the second checkpoint, from the task's snapshot call to its files written
  (``full_checkpoint_s``: the first);
- ``restore_s``: reading the second checkpoint's files into a new backend;
- ``peak_rss_mb``: the process's peak resident memory (ru_maxrss), whatever it held.

``verified``: 10,000 sampled keys read back from the restored backend have their values.
"""

from __future__ import annotations

import os
import random
import resource
import shutil
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MAX_PAR = 128


class _Responder:
    def acknowledge(self, checkpoint_id: int, snapshot: Any) -> None:
        self.snapshot = snapshot

    def decline(self, checkpoint_id: int, reason: str) -> None:
        raise RuntimeError(reason)


def _backend(kind: str, local: str, memory: Any = None) -> Any:
    from yarnflow.worker.state.heap import HeapKeyedStateBackend
    from yarnflow.worker.state.rocksdb import RocksDBKeyedStateBackend

    if kind == "rocksdb":
        return RocksDBKeyedStateBackend(MAX_PAR, range(MAX_PAR), os.path.join(local, f"b{time.monotonic_ns()}"),
                                        incremental=True, memory=memory)
    return HeapKeyedStateBackend(MAX_PAR, range(MAX_PAR))


def _checkpoint(writer: Any, backend: Any, checkpoint_id: int) -> tuple[float, list[Any]]:
    """(seconds from the snapshot call to the files written, the files)"""
    started = time.perf_counter()
    files = writer.write_files(checkpoint_id, [backend.snapshot()])
    seconds = time.perf_counter() - started
    return seconds, files


class _ValueStates:
    """A KeyedProcessFunction's ValueState per key: key i holds i (+1 when bumped)."""

    def __init__(self, backend: Any) -> None:
        from yarnflow.common.api import ValueStateDescriptor

        self.backend = backend
        self.state = backend.get_state(ValueStateDescriptor("count", default=0))

    def add(self, keys: list[int] | range, amount: Any) -> None:
        backend, state = self.backend, self.state
        for i in keys:
            backend.set_current_key((i,), i % MAX_PAR)
            state.update(state.value() + amount(i))

    def values(self, keys: list[int]) -> list[Any]:
        out = []
        for i in keys:
            self.backend.set_current_key((i,), i % MAX_PAR)
            out.append(self.state.value())
        return out


class _AggregateTable:
    """A STREAMING ``key_by("k").sum("n")``'s table, upserted 100,000 keys at a time."""

    batch = 100_000

    def __init__(self, backend: Any) -> None:
        self.table = backend.aggregate_table("aggregates", ["k"], [("n", "sum")])

    def add(self, keys: list[int] | range, amount: Any) -> None:
        import numpy as np
        import pyarrow as pa

        for start in range(0, len(keys), self.batch):
            part = np.asarray(keys[start:start + self.batch], dtype=np.int64)
            n = part if amount is _identity else np.full(len(part), amount(0), dtype=np.int64)
            self.table.upsert(pa.table({"k": part, "n": n}))

    def values(self, keys: list[int]) -> list[Any]:
        import pyarrow as pa

        out = self.table.upsert(pa.table({"k": pa.array(keys, pa.int64()), "n": pa.array([0] * len(keys), pa.int64())}))
        return out.column("n").to_pylist()  # type: ignore[no-any-return]


def _identity(i: int) -> int:
    return i


def run_state(backend_kind: str, keys: int, work_dir: str | None = None, vectorised: bool = False,
              rocksdb_memory_mb: int = 256) -> dict[str, Any]:
    from yarnflow.common.messages import SHARED_STATE_FILE, TaskRestore
    from yarnflow.worker.runtime.checkpoints import SnapshotWriter, read_task_state

    workload = _AggregateTable if vectorised else _ValueStates
    root = tempfile.mkdtemp(prefix="yarnflow-state-bench-", dir=work_dir)
    try:
        checkpoints, local = os.path.join(root, "checkpoints"), os.path.join(root, "local")
        writer = SnapshotWriter(checkpoints, "v", 0, 0, _Responder(), "state-bench")
        # a TaskExecutor's slot shares this among its RocksDB backends (0: RocksDB's own caches)
        from yarnflow.worker.memory.rocksdb_memory import RocksDBMemory

        memory = RocksDBMemory(rocksdb_memory_mb << 20) if rocksdb_memory_mb else None
        backend = _backend(backend_kind, local, memory)
        state = workload(backend)

        started = time.perf_counter()
        state.add(range(keys), _identity)
        load_s = time.perf_counter() - started

        def written(files: list[Any], before: set[str]) -> int:
            """Bytes of ``files`` not already written by an earlier checkpoint."""
            return sum(f.size_bytes for f in files if f.name != SHARED_STATE_FILE or f.path not in before)

        full_s, files1 = _checkpoint(writer, backend, 1)
        full_bytes = written(files1, set())
        rnd = random.Random(1)
        changed = sorted(rnd.sample(range(keys), max(1, keys // 100)))
        state.add(changed, lambda i: 1)
        incr_s, files2 = _checkpoint(writer, backend, 2)
        incr_bytes = written(files2, {f.path for f in files1 if f.name == SHARED_STATE_FILE})
        if hasattr(backend, "close"):
            backend.close()
        del backend, state

        started = time.perf_counter()
        restored = _backend(backend_kind, local, memory)
        restored_state = workload(restored)
        [tables] = read_task_state(TaskRestore(2, files2, False), 1)
        restored.restore(tables)
        restore_s = time.perf_counter() - started

        bumped = set(changed)
        sample = rnd.sample(range(keys), min(keys, 10_000))
        ok = restored_state.values(sample) == [i + (1 if i in bumped else 0) for i in sample]
        if hasattr(restored, "close"):
            restored.close()
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return {"name": "state", "backend": backend_kind, "state": "aggregate_table" if vectorised else "value_state",
                "keys": keys, "rocksdb_memory_mb": rocksdb_memory_mb if backend_kind == "rocksdb" else None,
                "records_per_s": round(keys / load_s),
                "full_checkpoint_mb": round(full_bytes / 1e6, 2),
                "incremental_checkpoint_mb": round(incr_bytes / 1e6, 2),
                "incremental_share": round(incr_bytes / full_bytes, 4) if full_bytes else None,
                "full_checkpoint_s": round(full_s, 2), "checkpoint_s": round(incr_s, 2),
                "restore_s": round(restore_s, 2), "peak_rss_mb": round(peak_mb),
                "verified": bool(ok)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
