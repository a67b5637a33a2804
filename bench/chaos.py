"""chaos: a STREAMING keyed job with checkpoints on a local session; N SIGKILLs of random
TaskExecutors at random times (each is replaced by the resource driver); then the committed
output is checked: every generated row exactly once, and every key's sequence numbers (kept
in keyed state) 1..count exactly once, so lost or replayed state shows too."""

from __future__ import annotations

import collections
import random
import shutil
import signal
import tempfile
import threading
import time
from typing import Any

import psutil

KEYS = 50


def _rows(start: int, n: int) -> Any:
    return {"id": list(range(start, start + n)), "k": [i % KEYS for i in range(start, start + n)]}


def check_sequence_output(out: str, rows: int) -> tuple[int, int, bool]:
    """The committed Parquet output of the sequence job: (rows lost, rows committed more than
    once, whether each key's sequence numbers are exactly 1..count)."""
    import pyarrow.dataset as pads

    table = pads.dataset(out, format="parquet").to_table()
    ids = collections.Counter(table["id"].to_pylist())
    lost = sum(1 for i in range(rows) if ids[i] == 0)
    duplicated = sum(c - 1 for c in ids.values() if c > 1)
    seqs: dict[int, list[int]] = collections.defaultdict(list)
    for k, s in zip(table["k"].to_pylist(), table["seq"].to_pylist()):
        seqs[k].append(s)
    return lost, duplicated, all(sorted(v) == list(range(1, len(v) + 1)) for v in seqs.values())


def run_chaos(kills: int = 20, rows: int = 400_000, interval: str = "500 ms", seed: int = 11) -> dict[str, Any]:
    import yarnflow
    from yarnflow import executors
    from yarnflow.common.api import KeyedProcessFunction, ValueStateDescriptor
    from yarnflow.common.states import JobStatus
    from yarnflow.local_cluster import LocalCluster

    class Sequence(KeyedProcessFunction):
        """Numbers each key's rows 1, 2, 3, ... in keyed state."""

        def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
            seen = ctx.get_state(ValueStateDescriptor("seen", default=0))
            n = seen.value() + 1
            seen.update(n)
            out.collect({"id": row["id"], "k": row["k"], "seq": n})

    rng = random.Random(seed)
    out = tempfile.mkdtemp(prefix="yarnflow-chaos-")
    conf = {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": str(kills * 3),
            "restart-strategy.fixed-delay.delay": "200 ms", "execution.checkpointing.interval": interval,
            "heartbeat.interval": "500 ms", "heartbeat.timeout": "4 s", "execution.batch-size": "500"}
    done_kills = 0
    outcome: dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        with LocalCluster(2, 2, conf) as cluster:
            gw = cluster.gateway()
            ctx = executors.ClusterContext(cluster.address, conf, progress=False)

            def job() -> None:
                executors.set_context(ctx)
                try:
                    env = yarnflow.StreamExecutionEnvironment(parallelism=2, runtime_mode="STREAMING")
                    (env.from_generator(_rows, count=rows, rate_per_s=rows / 40).key_by("k").process(Sequence())
                        .sink_to_parquet(out))
                    env.execute("chaos")
                    outcome["ok"] = True
                except BaseException as exc:  # noqa: BLE001 - reported in the figures
                    outcome["error"] = repr(exc)

            thread = threading.Thread(target=job, daemon=True)
            thread.start()
            while thread.is_alive() and done_kills < kills:
                time.sleep(rng.uniform(0.5, 2.0))
                info = next((j for j in gw.list_jobs() if j.name == "chaos"), None)
                if info is None or info.status != JobStatus.RUNNING:
                    continue
                tes = [p for p in psutil.Process(cluster.proc.pid).children(recursive=True)
                       if "yarnflow.worker" in " ".join(p.cmdline())]
                if tes:
                    rng.choice(tes).send_signal(signal.SIGKILL)
                    done_kills += 1
            thread.join(600)
            info = next((j for j in gw.list_jobs() if j.name == "chaos"), None)
            gw.close()
        seconds = time.perf_counter() - t0
        lost, duplicated, state_ok = check_sequence_output(out, rows)
        restored = sum(1 for f in (info.failure_history if info else []) if f.restored_checkpoint_id)
        return {"name": "chaos", "kills": done_kills, "rows": rows, "rows_lost": lost, "rows_duplicated": duplicated,
                "keyed_state_exact": state_ok, "restarts_from_checkpoint": restored,
                "checkpoints_completed": info.latest_completed_checkpoint_id if info else 0,
                "job_status": info.status.name if info else "unknown", "seconds": round(seconds, 1),
                "error": outcome.get("error", ""),
                "verified": bool(outcome.get("ok")) and lost == 0 and duplicated == 0 and state_ok
                and done_kills == kills}
    finally:
        shutil.rmtree(out, ignore_errors=True)
