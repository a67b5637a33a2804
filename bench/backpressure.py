"""backpressure: checkpoints of a back-pressured job, aligned against unaligned, same run.

The job: a Parquet source -> a keyed per-row Python map about 10x slower than the source ->
a collect sink, parallelism 2, checkpoints every ``interval``, STREAMING. The map's inputs are
back-pressured for the whole run, so an aligned barrier waits behind every batch queued in
front of it; an unaligned one overtakes them (they are stored with the checkpoint). A watcher
reads the job every 200 ms and keeps every checkpoint it saw complete (the job's status holds
only the latest ten) and the most bytes one remote input channel held. Both runs are checked:
every input row once in the collected output, with its value.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from typing import Any, Callable


def _looped(row: dict[str, Any], rounds: int) -> dict[str, Any]:
    """A loop of float multiplications over the row's own value: Python holding the GIL."""
    x = 0.0
    v = row["value"]
    for i in range(rounds + row["key"] % 3):
        x += i * v
    return {"key": row["key"], "value": v, "x": x}


def _slow_row(row: dict[str, Any]) -> dict[str, Any]:
    """~15 us of Python per row (the per-row path)."""
    return _looped(row, 250)


def _sleep_1ms(row: dict[str, Any]) -> dict[str, Any]:
    """A call to an external service per row: 1 ms of waiting (the GIL is free meanwhile)."""
    import time

    time.sleep(0.001)
    return {"key": row["key"], "value": row["value"], "x": 0.0}


def _cpu_1ms(row: dict[str, Any]) -> dict[str, Any]:
    """Most of a millisecond of Python per row (parsing a big record, a model call)."""
    return _looped(row, 17_000)


#: --function: the per-row map, and its default number of records (about a minute of work at
#: parallelism 2 for the millisecond ones)
FUNCTIONS = {"loop-15us": (_slow_row, 2_000_000), "sleep-1ms": (_sleep_1ms, 100_000), "cpu-1ms": (_cpu_1ms, 100_000)}


def _watcher(seen: dict[int, Any], inflight: list[int]) -> Callable[[Any], Callable[[], None]]:
    def watch(cluster: Any) -> Callable[[], None]:
        from yarnflow.common.rpc.gateways import RemoteDispatcherGateway

        gw = RemoteDispatcherGateway(cluster.address, 10_000)
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(0.2):
                try:
                    for job in gw.list_jobs():
                        info = gw.get_job(job.job_id)
                        for c in info.checkpoints:
                            if c.status == "COMPLETED":
                                seen[c.checkpoint_id] = c
                        for v in info.vertices:
                            for m in v.subtask_metrics:
                                inflight[0] = max(inflight[0], m.inflight_bytes_peak)
                except Exception:  # noqa: BLE001 - the cluster is going away: the last reads count
                    pass

        thread = threading.Thread(target=run, daemon=True)
        thread.start()

        def stop_watching() -> None:
            stop.set()
            thread.join(5)
            gw.close()
        return stop_watching
    return watch


def _pct(values: list[int], p: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else 0


def _run(folder: str, records: int, parallelism: int, interval: str, unaligned: bool,
         expected: tuple[int, float], debloat: bool | None = None,
         function: Callable[[dict[str, Any]], dict[str, Any]] = _slow_row, aligned_timeout: str = "") -> dict[str, Any]:
    """``debloat``: buffer debloating on or off (None: the default configuration's).
    ``aligned_timeout``: unaligned checkpoints that start aligned for that long."""
    import workloads

    seen: dict[int, Any] = {}
    inflight = [0]

    def build(env: Any) -> None:
        env.read_parquet(folder, columns=["key", "value"]).key_by("key").map(function, name="slow").collect()

    conf = {"execution.checkpointing.interval": interval,
            "execution.checkpointing.unaligned.enabled": "true" if unaligned else "false"}
    if debloat is not None:
        conf["taskmanager.network.memory.buffer-debloat.enabled"] = "true" if debloat else "false"
    if aligned_timeout:
        conf["execution.checkpointing.aligned-checkpoint-timeout"] = aligned_timeout
    table, seconds, _ = workloads._run_job(build, parallelism, "backpressure", "STREAMING", conf,
                                           _watcher(seen, inflight))
    info = workloads.LAST_JOB[0]
    for c in info.checkpoints:
        if c.status == "COMPLETED":
            seen[c.checkpoint_id] = c
    durations = [c.duration_ms for c in seen.values()]
    return {"records_per_s": round(records / seconds), "seconds": round(seconds, 2),
            "checkpoints_completed": len(seen), "checkpoint_p50_ms": _pct(durations, 0.5),
            "checkpoint_p90_ms": _pct(durations, 0.9), "checkpoint_p99_ms": _pct(durations, 0.99),
            "checkpoint_max_ms": max(durations, default=0),
            # the ones over a second: (id, ms, unaligned); aligned ones at the end are the checkpoints
            # taken once the sources had finished (their tasks are triggered directly and drain)
            "slow_checkpoints": [(c.checkpoint_id, c.duration_ms, c.unaligned) for _, c in sorted(seen.items())
                                 if c.duration_ms > 1000],
            "unaligned_checkpoints": sum(1 for c in seen.values() if c.unaligned),
            "alignment_p99_ms": _pct([c.alignment_ms for c in seen.values()], 0.99),
            "persisted_inflight_bytes_max": max((c.inflight_bytes for c in seen.values()), default=0),
            "persisted_inflight_bytes_p50": _pct([c.inflight_bytes for c in seen.values() if c.unaligned], 0.5),
            "inflight_bytes_per_channel_max": inflight[0],
            "verified": table.num_rows == expected[0]
            and abs(sum(table["value"].to_pylist()) - expected[1]) <= 1e-6 * max(1.0, abs(expected[1]))}


def run_backpressure(records: int | None = None, parallelism: int = 2, interval: str = "1 s",
                     debloat: bool = False, function: str = "loop-15us") -> dict[str, Any]:
    """``debloat``: also both runs with buffer debloating off (``aligned_debloat_off``,
    ``unaligned_debloat_off``: it is on by default). ``function``: the map's per-row cost
    (``FUNCTIONS``); ``records`` defaults to its own."""
    fn, default_records = FUNCTIONS[function]
    records = records or default_records
    import pyarrow.dataset as pads

    import workloads
    from yarnflow.common.config import Configuration, Options

    folder = tempfile.mkdtemp(prefix="yarnflow-backpressure-")
    try:
        workloads.generate_w2(folder, records)
        data = pads.dataset(folder).to_table(columns=["value"])
        expected = (data.num_rows, sum(data["value"].to_pylist()))
        conf = Configuration.load({})
        out: dict[str, Any] = {
            "name": "backpressure", "function": function, "records": records, "parallelism": parallelism,
            "interval": interval, "debloat_default": conf[Options.DEBLOAT_ENABLED],
            "segment_size": conf[Options.SEGMENT_SIZE],
            "credit_bytes_per_channel": (conf[Options.EXCLUSIVE_BUFFERS] + conf[Options.FLOATING_BUFFERS])
            * conf[Options.SEGMENT_SIZE]}
        out["aligned"] = _run(folder, records, parallelism, interval, False, expected, function=fn)
        out["unaligned"] = _run(folder, records, parallelism, interval, True, expected, function=fn)
        if function != "loop-15us":  # a slow function: also aligned first, unaligned after a second
            out["aligned_timeout_1s"] = _run(folder, records, parallelism, interval, True, expected, function=fn,
                                             aligned_timeout="1 s")
        a, u = out["aligned"], out["unaligned"]
        out["throughput_unaligned_vs_aligned"] = round(u["records_per_s"] / max(1, a["records_per_s"]), 3)
        out["verified"] = a["verified"] and u["verified"] and u["checkpoints_completed"] > 0 \
            and u["unaligned_checkpoints"] > 0 and out.get("aligned_timeout_1s", u)["verified"]
        if debloat:
            out["aligned_debloat_off"] = _run(folder, records, parallelism, interval, False, expected, False, fn)
            out["unaligned_debloat_off"] = _run(folder, records, parallelism, interval, True, expected, False, fn)
            out["verified"] = out["verified"] and out["aligned_debloat_off"]["verified"] \
                and out["unaligned_debloat_off"]["verified"]
        return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)
