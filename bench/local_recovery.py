"""local-recovery: recovery time of a job with N MB of RocksDB keyed state after a task of it
fails, with task-local recovery (``state.backend.local-recovery``) off and on, in the same run.

The job (STREAMING, parallelism 2, one TaskExecutor of 2 slots, checkpoints every few seconds,
incremental RocksDB): an unbounded generator of rows ``(k, payload)`` cycling over the keys ->
``key_by("k").process(...)``, which keeps each key's payload (``--value-bytes`` of random bytes)
in a ValueState and emits the key -> ``rebalance()`` -> a map that fails once when the benchmark
asks it to (and drops the rows). Once a checkpoint holding every key completed, the benchmark
makes the map fail; the failure restarts the job's one pipelined region in the slots it had, and
every task restores the latest checkpoint. Figures, per mode:

- ``recovery_s``: from the request to fail to every task RUNNING again (restores done);
- ``restore_s``: the longest restore of one task (from its TaskExecutor's log: "restores
  checkpoint" to "restored checkpoint");
- ``local_mb`` / ``remote_mb``: the state the restored tasks read from their TaskExecutor's
  copies / from the checkpoint storage;
- ``state_mb``: the restored checkpoint's size.

Exactness: every key's value starts with the sequence number of the row that wrote it, and
the ``process`` function checks, for every row, that the key's value holds the row one cycle of
keys before it (a lost, stale or damaged state fails the job again). After the recovery the
benchmark waits until every key was checked again (each generator subtask, which owns half the
keys, emitted half a cycle since the restore, and the ``process`` tasks read all of it).

``verified``: the restored checkpoint held the state asked for (at least ``--state-mb``), no
check failed after the restore, and with local recovery on nothing was read from the storage,
with it off everything was (``--corrupt-copies``: every file came from the storage).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import numpy as np
from typing import Any

_RESTORE = re.compile(r"^(\S+ \S+) INFO task (.+?) \[job \w+\] \S+: .+? (restores|restored) checkpoint (\d+)"
                      r"(?:: (\d+) files \((\d+) bytes\) read locally, (\d+) files \((\d+) bytes\))?", re.M)


_CHUNK = 65_536  # the generator's rows per chunk (execution.batch-size)


def _keys(state_mb: int, value_bytes: int) -> int:
    """Keys for ``state_mb`` of values, rounded up to whole pairs of chunks: a key then always
    comes from the same generator subtask (chunks are dealt round-robin to 2), so its rows reach
    the ``process`` task in order."""
    pair = 2 * _CHUNK
    return -(-state_mb * 1_000_000 // value_bytes // pair) * pair


class _Gen:
    """Rows ``(k, seq, payload)`` for sequence numbers ``[start, start + n)``: key ``seq %
    keys``; the payload is the sequence number (8 bytes, little-endian) and random bytes."""

    def __init__(self, keys: int, value_bytes: int) -> None:
        self.keys, self.value_bytes = keys, value_bytes

    def __call__(self, start: int, n: int) -> Any:
        import pyarrow as pa

        size = self.value_bytes
        seq = np.arange(start, start + n, dtype="<i8")
        rows = np.frombuffer(os.urandom(n * size), dtype=np.uint8).reshape(n, size).copy()
        rows[:, :8] = seq.view(np.uint8).reshape(n, 8)
        blob = rows.tobytes()
        return {"k": pa.array(seq % self.keys), "seq": pa.array(seq),
                "payload": pa.array([blob[j * size:(j + 1) * size] for j in range(n)], pa.binary())}


class StateCheckError(AssertionError):
    """A key's restored value is not the one its last row before the checkpoint wrote."""


def _keeper(keys: int) -> Any:
    from yarnflow import ValueStateDescriptor
    from yarnflow.windows import KeyedProcessFunction

    class KeepPayload(KeyedProcessFunction):  # type: ignore[misc]
        def open(self, ctx: Any) -> None:
            self.payload = self.get_state(ValueStateDescriptor("payload"))

        def process_element(self, row: Any, ctx: Any, out: Any) -> None:
            seq, before = row["seq"], self.payload.value()
            held = int.from_bytes(before[:8], "little") if before is not None else None
            if seq >= keys and held != seq - keys:
                raise StateCheckError(f"key {row['k']}: the row of sequence {seq} found the value of "
                                      f"{held}, not {seq - keys}")
            self.payload.update(row["payload"])
            out.collect({"k": row["k"]})

    return KeepPayload()


class _FailOnce:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __call__(self, batch: Any) -> Any:
        if os.path.exists(self.marker):
            os.remove(self.marker)
            raise RuntimeError("a failure on purpose (the local-recovery benchmark)")
        return batch.slice(0, 0)  # (nothing to keep)


def _restores(work_dir: str, since: float) -> list[dict[str, Any]]:
    """Every restore the TaskExecutors logged after ``since`` (epoch seconds)."""
    started: dict[str, float] = {}
    done = []
    for log_file in Path(work_dir).rglob("te-*.log"):
        for m in _RESTORE.finditer(log_file.read_text(errors="replace")):
            at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if at < since:
                continue
            if m.group(3) == "restores":
                started[m.group(2)] = at
            elif m.group(5) is not None:
                done.append({"task": m.group(2), "seconds": at - started.get(m.group(2), at),
                             "local_bytes": int(m.group(6)), "remote_bytes": int(m.group(8))})
    return done


def _corrupt_copies(folder: str) -> int:
    """Replace every local copy by its bytes flipped (new files: an SST copy is a hard link of the
    live RocksDB file, which must stay intact): each then fails its checksum."""
    copies = [p for p in Path(folder).rglob("yarnflow-local-state/*/*/files/*") if p.is_file()]
    done = 0
    for p in copies:
        try:
            data = p.read_bytes()
        except FileNotFoundError:  # (an older checkpoint's copy, collected as a newer one completed)
            continue
        flipped = p.with_name(p.name + ".flipped")
        flipped.write_bytes(np.bitwise_not(np.frombuffer(data, dtype=np.uint8)).tobytes())
        flipped.replace(p)
        done += 1
    return done


def _one(state_mb: int, value_bytes: int, local_recovery: bool, work_dir: str | None,
         corrupt: bool = False) -> dict[str, Any]:
    import yarnflow
    from yarnflow import executors
    from yarnflow.common.states import ExecutionState, JobStatus
    from yarnflow.local_cluster import LocalCluster

    keys = _keys(state_mb, value_bytes)
    root = tempfile.mkdtemp(prefix="yarnflow-local-recovery-", dir=work_dir)
    marker = os.path.join(root, "fail-now")
    conf = {"state.backend.type": "rocksdb", "execution.checkpointing.incremental": "true",
            "state.backend.local-recovery": str(local_recovery).lower(),
            "execution.checkpointing.interval": "3 s", "execution.checkpointing.dir": f"file://{root}/checkpoints",
            "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": "0 ms",
            "taskmanager.memory.process.size": "4 gb", "execution.batch-size": str(_CHUNK)}
    if corrupt:  # no checkpoint may start while the copies are corrupted (a new one has intact copies)
        conf["execution.checkpointing.min-pause"] = "60 s"
    try:
        with LocalCluster(1, 2, conf, work_dir=os.path.join(root, "cluster")) as cluster:
            gw = cluster.gateway()
            ctx = executors.ClusterContext(cluster.address, conf, progress=False)

            def job() -> None:
                executors.set_context(ctx)
                env = yarnflow.StreamExecutionEnvironment(parallelism=2, runtime_mode="STREAMING")
                (env.from_generator(_Gen(keys, value_bytes)).uid("generator").key_by("k")
                    .process(_keeper(keys), name="keep").uid("keep")
                    .rebalance().map_batches(_FailOnce(marker), name="fail-once").uid("fail-once")
                    .collect().uid("collect"))
                try:
                    env.execute("local-recovery")
                except yarnflow.JobFailedError:
                    pass  # cancelled at the end

            thread = threading.Thread(target=job, daemon=True)
            thread.start()

            def status() -> Any:
                jobs = [j for j in gw.list_jobs() if j.name == "local-recovery"]
                return jobs[0] if jobs else None

            def all_running(info: Any, attempt: int) -> bool:
                return info is not None and info.status == JobStatus.RUNNING and all(
                    v.state_counts.get(ExecutionState.RUNNING, 0) == v.parallelism
                    and min(v.subtask_attempts) >= attempt for v in info.vertices)

            deadline = time.monotonic() + 1800
            while True:  # a checkpoint holding every key (taken after the state reached its size)
                info = status()
                full = [c for c in (info.checkpoints if info else []) if c.status == "COMPLETED"
                        and c.size_bytes >= state_mb * 1_000_000 and not c.is_savepoint]
                if len(full) >= 2:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no checkpoint of {state_mb} MB in 30 minutes")
                time.sleep(0.5)
            if corrupt:  # (before the clock starts, within the min-pause after the latest checkpoint)
                latest = max(c.checkpoint_id for c in full)
                _corrupt_copies(os.path.join(root, "cluster"))
                if max(c.checkpoint_id for c in status().checkpoints) != latest:
                    raise RuntimeError("a checkpoint started while the local copies were corrupted")
            failed_at = time.time()
            t0 = time.perf_counter()
            Path(marker).write_text("now")
            while not all_running(status(), 1):
                if time.perf_counter() - t0 > 600:
                    raise RuntimeError("the job did not recover in 10 minutes")
                time.sleep(0.01)
            recovery_s = time.perf_counter() - t0
            sent = None  # every key checked since the restore: each generator subtask (owning half the
            while True:  # keys) emitted half a cycle, and 'keep' read all the generator emitted by then
                info = status()
                gen = next(v for v in info.vertices if "generator" in v.name)
                keep = next(v for v in info.vertices if "keep" in v.name)
                checked = sum(m.records_in for m in keep.subtask_metrics)
                if sent is None and min(m.records_out for m in gen.subtask_metrics) >= keys // 2:
                    sent = sum(m.records_out for m in gen.subtask_metrics)
                if (sent is not None and checked >= sent) or len(info.failure_history) > 1 \
                        or info.status != JobStatus.RUNNING:
                    break
                if time.perf_counter() - t0 > 1800:
                    raise RuntimeError(f"only {checked} of {keys} keys checked in 30 minutes")
                time.sleep(0.5)
            failures = [f.error.message if f.error else "" for f in info.failure_history]
            restored_id = max(f.restored_checkpoint_id for f in info.failure_history)
            size = next((c.size_bytes for c in info.checkpoints if c.checkpoint_id == restored_id), 0)
            gw.cancel_job(str(info.job_id))
            thread.join(60)
            gw.close()
            restores = _restores(cluster.work_dir, failed_at - 1)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    local = sum(r["local_bytes"] for r in restores)
    remote = sum(r["remote_bytes"] for r in restores)
    return {"recovery_s": round(recovery_s, 2), "restore_s": round(max(r["seconds"] for r in restores), 2),
            "local_mb": round(local / 1e6, 1), "remote_mb": round(remote / 1e6, 1),
            "state_mb": round(size / 1e6, 1), "restored_checkpoint": restored_id, "tasks_restored": len(restores),
            "keys": keys, "keys_checked_after_restore": checked, "failures": failures,
            "exact": sent is not None and checked >= sent and len(failures) == 1}


def run_corrupt(state_mb: int = 1024, value_bytes: int = 1000, work_dir: str | None = None) -> dict[str, Any]:
    """Local recovery on, every local copy corrupted before the failure: each restored task reads
    its state from the storage instead (verified: nothing read locally, all of it remotely)."""
    on = _one(state_mb, value_bytes, True, work_dir, corrupt=True)
    return {"name": "local-recovery", "state_mb": state_mb, "corrupt_copies": True, "on": on,
            "verified": on["exact"] and on["local_mb"] == 0 and on["remote_mb"] >= state_mb}


def run_local_recovery(state_mb: int = 1024, value_bytes: int = 1000, work_dir: str | None = None) -> dict[str, Any]:
    off = _one(state_mb, value_bytes, False, work_dir)
    on = _one(state_mb, value_bytes, True, work_dir)
    ok = (off["exact"] and on["exact"] and min(off["state_mb"], on["state_mb"]) >= state_mb and on["remote_mb"] == 0 and off["local_mb"] == 0
          and off["remote_mb"] >= state_mb)
    return {"name": "local-recovery", "state_mb": state_mb, "value_bytes": value_bytes, "off": off, "on": on,
            "recovery_speedup": round(off["recovery_s"] / on["recovery_s"], 2) if on["recovery_s"] else None,
            "verified": ok}
