"""rescale: a running STREAMING keyed job with ``keys`` keys of state (a ``key_by().sum()``,
checkpointed, exactly-once Parquet sink) on a local session of 2 TaskExecutors x 2 slots is
rescaled by hand (``Dispatcher.rescale_job``, what ``yarnflow rescale`` calls) 2 -> 4 -> 2 while
it reads its files. Prints ``rescale_s`` (each rescale: the call until the job runs at the new
parallelism, which includes stopping at a consistent point, the savepoint of its state and the
restore), ``max_rescale_s`` (issue 30's target: < 3 s), ``rows_lost`` / ``rows_duplicated``
(keys whose committed running totals do not end at their count, and running totals committed
twice: 0 / 0) and ``verified``."""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
import threading
import time
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

FILES = 8


def _write(folder: str, keys: int, rows: int) -> dict[int, int]:
    """``rows`` rows in FILES files; each file holds every key (when rows >= FILES x keys), so
    once the job has read a file per subtask its state has every key."""
    os.makedirs(folder, exist_ok=True)
    per_file = rows // FILES
    counts: collections.Counter[int] = collections.Counter()
    for f in range(FILES):
        k = [(f + i) % keys for i in range(per_file)]
        counts.update(k)
        table = pa.table({"k": pa.array(k, pa.int64()), "n": pa.array([1] * per_file, pa.int64())})
        pq.write_table(table, os.path.join(folder, f"part-{f}.parquet"), row_group_size=50_000)
    return dict(counts)


def _slow(batch: Any) -> Any:
    time.sleep(0.05)  # so the job is still reading when it is rescaled
    return batch


def _committed_keys(out: str) -> int:
    try:
        return len(pads.dataset(out, format="parquet").to_table(columns=["k"]).column("k").unique())
    except (OSError, ValueError, pa.ArrowInvalid):  # nothing committed yet
        return 0


def run_rescale(keys: int = 1_000_000, rows: int = 8_000_000) -> dict[str, Any]:
    import yarnflow
    from yarnflow import executors
    from yarnflow.common.states import ExecutionState, JobStatus
    from yarnflow.local_cluster import LocalCluster

    work = tempfile.mkdtemp(prefix="yarnflow-rescale-")
    src, out = os.path.join(work, "in"), os.path.join(work, "out")
    expected = _write(src, keys, rows)
    conf = {"execution.checkpointing.interval": "1 s", "execution.batch-size": "20000",
            "execution.runtime-mode": "STREAMING"}
    times: list[float] = []
    try:
        with LocalCluster(2, 2, conf, work_dir=os.path.join(work, "cluster")) as cluster:
            gw = cluster.gateway()
            ctx = executors.ClusterContext(cluster.address, conf, progress=False)
            outcome: dict[str, Any] = {}

            def job() -> None:
                executors.set_context(ctx)
                env = yarnflow.StreamExecutionEnvironment(parallelism=2)
                (env.read_parquet(src).uid("source").map_batches(_slow, name="slow").uid("slow")
                    .key_by("k").sum("n").uid("sum").sink_to_parquet(out).uid("sink"))
                try:
                    outcome["result"] = env.execute("rescaled")
                except Exception as exc:  # noqa: BLE001 - reported below
                    outcome["error"] = exc

            thread = threading.Thread(target=job, daemon=True)
            thread.start()

            def running(parallelism: int) -> Any:
                jobs = [j for j in gw.list_jobs() if j.name == "rescaled"]
                info = jobs[0] if jobs else None
                ok = info is not None and info.status == JobStatus.RUNNING and info.latest_completed_checkpoint_id > 0 \
                    and all(v.parallelism == parallelism and v.state_counts.get(ExecutionState.RUNNING, 0)
                            + v.state_counts.get(ExecutionState.FINISHED, 0) == v.parallelism for v in info.vertices)
                return info if ok else None

            deadline = time.monotonic() + 120
            while (info := running(2)) is None or _committed_keys(out) < keys:  # every key in the state
                if time.monotonic() > deadline or not thread.is_alive():
                    raise RuntimeError(f"the job did not run with a checkpoint of every key: {outcome}")
                time.sleep(0.2)
            for parallelism in (4, 2):
                t0 = time.perf_counter()
                gw.rescale_job(info.job_id, parallelism)
                while (info := running(parallelism)) is None:
                    if time.perf_counter() - t0 > 120:
                        raise RuntimeError(f"the job did not run at parallelism {parallelism}")
                    time.sleep(0.01)
                times.append(time.perf_counter() - t0)
                time.sleep(1.5)  # a checkpoint at the new parallelism before the next rescale
            thread.join(600)
            gw.close()
        if "error" in outcome or outcome["result"].status != JobStatus.FINISHED:
            raise RuntimeError(f"the job did not finish: {outcome}")
        table = pads.dataset(out, format="parquet").to_table(columns=["k", "n"])
        totals: dict[int, list[int]] = collections.defaultdict(list)
        for k, n in zip(table["k"].to_pylist(), table["n"].to_pylist()):
            totals[k].append(n)
        lost = sum(1 for k, c in expected.items() if max(totals.get(k, [0])) != c)
        duplicated = sum(len(v) - len(set(v)) for v in totals.values())
        return {"name": "rescale", "keys": keys, "rows": rows, "keys_in_state_at_first_rescale": keys,
                "rescales": "2->4->2",
                "rescale_s": [round(t, 2) for t in times], "max_rescale_s": round(max(times), 2), "target_s": 3.0,
                "rows_lost": lost, "rows_duplicated": duplicated,
                "verified": lost == 0 and duplicated == 0 and set(totals) == set(expected)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
