"""rocksdb-keys: a STREAMING ``key_by("k").sum("n")`` over N distinct int64 keys (random order,
8 Parquet files) on the rocksdb backend, through the CLI as a user runs it
(``yarnflow run --taskexecutors 2`` with 1-slot, 1 GB TaskExecutors and 5 s checkpoints: the
embedded cluster's start-up included). Reports the wall time of the whole command, each
TaskExecutor's peak RSS (sampled every 0.2 s: the figure YARN's NodeManager would check against
the 1 GB container) and ``verified``: every key committed exactly once with n = 1.

This file is also the job: ``yarnflow run`` runs it with the input and output folders."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

FILES = 8


def generate(folder: str, keys: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    order = np.random.default_rng(28).permutation(keys).astype(np.int64)
    for i, part in enumerate(np.array_split(order, FILES)):
        pq.write_table(pa.table({"k": part, "n": np.ones(len(part), np.int64)}),
                       os.path.join(folder, f"part-{i}.parquet"), row_group_size=1 << 20)


def run_rocksdb_keys(keys: int = 20_000_000, memory: str = "1 gb", managed: bool = True) -> dict[str, Any]:
    import psutil
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    root = tempfile.mkdtemp(prefix="yarnflow-rocksdb-keys-")
    try:
        src, out = os.path.join(root, "in"), os.path.join(root, "out")
        generate(src, keys)
        conf = {"taskmanager.numberOfTaskSlots": "1", "taskmanager.memory.process.size": memory,
                "state.backend.type": "rocksdb", "execution.checkpointing.interval": "5 s",
                "state.backend.rocksdb.memory.managed": str(managed).lower()}
        cmd = [sys.executable, "-m", "yarnflow", "run", "--taskexecutors", "2", "--no-progress",
               *[a for k, v in conf.items() for a in ("-D", f"{k}={v}")], os.path.abspath(__file__), src, out]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        peaks: dict[int, int] = {}
        while proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                try:
                    if "yarnflow.worker" in child.cmdline():
                        peaks[child.pid] = max(peaks.get(child.pid, 0), child.memory_info().rss)
                except psutil.Error:
                    continue
            time.sleep(0.2)
        seconds = time.perf_counter() - t0
        stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.returncode:
            raise RuntimeError(f"the job failed:\n{stderr[-2000:]}")
        table = pads.dataset(out, format="parquet").to_table(columns=["k", "n"])
        verified = (table.num_rows == keys and pc.count_distinct(table["k"]).as_py() == keys
                    and pc.all(pc.equal(table["n"], 1)).as_py())
        return {"name": "rocksdb-keys", "keys": keys, "taskexecutor_memory": memory, "rocksdb_memory_managed": managed,
                "seconds": round(seconds, 1), "keys_per_s": round(keys / seconds),
                "taskexecutor_peak_rss_mb": sorted(round(v / 2**20) for v in peaks.values()), "verified": verified}
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__" and len(sys.argv) == 3 and "yarnflow" in sys.modules:  # the job, under `yarnflow run`
    import yarnflow

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(2)
    env.set_runtime_mode("STREAMING")
    env.read_parquet(sys.argv[1]).key_by("k").sum("n").uid("sum").sink_to_parquet(sys.argv[2])
    env.execute("rocksdb-keys")
