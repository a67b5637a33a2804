"""metrics-overhead: W1 with every metric on against every metric off, in the same run, on the
same generated data. Three variants, in turn: "off"; "on": the REST API, the Prometheus
endpoints of the AppMaster and the TaskExecutors and the task I/O meters (bytes, busy / idle /
back-pressured time), read only by the JobMaster's heartbeats; "watched": the same, plus a
watcher that, like a dashboard and a Prometheus server, reads /jobs/overview, each job's
details and every Prometheus endpoint every ``watch_interval_s``. Off: ``rest.enabled: false``, ``metrics.reporters: ""``,
``metrics.task-io.enabled: false`` (records in/out per task are counted either way: the
JobMaster has always had them). After one warm-up run the three variants take turns ``rounds``
times, the order rotating every round (a run's place in a series changes its speed). Wall-clock throughput on a shared machine varies more between runs than metrics cost,
so the benchmark also reports the CPU seconds the cluster's processes (AppMaster and
TaskExecutors, read with psutil) spent per million records during the job, and the median of
the per-round ratios, which drift less (target: on costs < 2%)."""

from __future__ import annotations

import shutil
import statistics
import tempfile
import threading
import urllib.request

import psutil
from typing import Any, Callable

from yarnflow.common.metrics import free_port_range

OFF = {"rest.enabled": "false", "metrics.reporters": "", "metrics.task-io.enabled": "false"}


class Watcher:
    """Reads the REST API and every Prometheus endpoint once a second until stopped (``ports``
    None: reads nothing); counts the CPU seconds of the cluster's processes meanwhile."""

    def __init__(self, cluster: Any, ports: tuple[int, int] | None, interval_s: float = 1.0) -> None:
        self._interval_s = interval_s
        self._procs = [psutil.Process(pid) for pid in cluster.pids()]
        self._cpu_start = self._cpu()
        self.cpu_s = 0.0
        self._web = cluster.web_url() if ports else ""
        self._ports = range(ports[0], ports[1] + 1) if ports else range(0)
        self._stop = threading.Event()
        self.reads = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        if ports:
            self._thread.start()

    def _cpu(self) -> float:
        total = 0.0
        for proc in self._procs:
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                continue
        return total

    def _get(self, url: str) -> bytes:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read()

    def _run(self) -> None:
        import json

        while not self._stop.wait(self._interval_s):
            jobs = json.loads(self._get(f"{self._web}/jobs/overview"))["jobs"]
            for job in jobs:
                self._get(f"{self._web}/jobs/{job['jid']}")
            for port in self._ports:
                try:
                    self._get(f"http://127.0.0.1:{port}/metrics")
                except OSError:
                    continue
            self.reads += 1

    def stop(self) -> None:
        self.cpu_s = self._cpu() - self._cpu_start
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)


def accounting_cpu_us(batches: int = 400, rows: int = 65536, repeats: int = 5) -> dict[str, float]:
    """CPU microseconds per batch of ``rows`` W1 records that the task I/O meters add on the
    record path (in this process, so the machine's other load does not blur it): the batch goes
    through a RecordWriter hash-partitioned to two pipelined subpartitions (as W1's source sends
    it), each part is taken as a consumer's gate would and its bytes counted. Best of
    ``repeats`` for each variant, alternating."""
    import time

    import numpy as np
    import pyarrow as pa

    from yarnflow.common.ids import ResultPartitionID
    from yarnflow.common.states import Partitioner
    from yarnflow.worker.network.partition import ResultPartition
    from yarnflow.worker.runtime.writer import RecordWriter

    words = pa.array([f"w{i % 50_000}" for i in range(rows)])
    batch = pa.RecordBatch.from_arrays([words, pa.array(np.arange(rows))], names=["word", "ts"])

    def once(io_metrics: bool) -> float:
        partition = ResultPartition(ResultPartitionID("j.a.0"), 2, capacity=4)
        writer = RecordWriter(partition, Partitioner.HASH, ["word"], 128, rows, 100, lambda: False,
                              io_metrics=io_metrics)
        received = 0
        started = time.process_time()
        for _ in range(batches):
            writer.emit(batch)
            writer.flush_all()
            for sub in partition.subpartitions:
                while (element := sub.take(0)) is not None:
                    if io_metrics:
                        received += element.nbytes
        writer.bytes_out  # noqa: B018 - read as a heartbeat would
        return (time.process_time() - started) / batches * 1e6

    def added_ops() -> float:
        """The operations the meters add per batch, timed alone: the consumer's byte count of
        each part and the writer's look whether the subpartition is full."""
        partition = ResultPartition(ResultPartitionID("j.a.1"), 2, capacity=4)
        writer = RecordWriter(partition, Partitioner.HASH, ["word"], 128, rows, 100, lambda: False)
        writer.emit(batch)
        writer.flush_all()
        parts = [sub.take(0) for sub in partition.subpartitions]
        subs = partition.subpartitions
        n = 2000
        started = time.process_time()
        for _ in range(n):
            for part, sub in zip(parts, subs):
                part.nbytes  # noqa: B018
                getattr(sub, "full", False)
        return (time.process_time() - started) / n * 1e6

    best = {True: float("inf"), False: float("inf")}
    for _ in range(repeats):
        for io_metrics in (False, True):
            best[io_metrics] = min(best[io_metrics], once(io_metrics))
    return {"batch_cpu_us_off": round(best[False], 1), "batch_cpu_us_on": round(best[True], 1),
            "difference_cpu_us_per_batch": round(best[True] - best[False], 1),
            "accounting_cpu_us_per_batch": round(min(added_ops() for _ in range(repeats)), 2)}


def run_metrics_overhead(records: int = 20_000_000, parallelism: int = 2, rounds: int = 5,
                         mode: str = "BATCH", watch_interval_s: float = 1.0) -> dict[str, Any]:
    import workloads

    folder = tempfile.mkdtemp(prefix="yarnflow-w1-metrics-")
    variants = ("off", "on", "watched")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    watchers: dict[str, list[Watcher]] = {v: [] for v in variants}

    def watch(variant: str, ports: tuple[int, int] | None) -> Callable[[Any], Callable[[], None]]:
        def start(cluster: Any) -> Callable[[], None]:
            watcher = Watcher(cluster, ports, watch_interval_s)
            watchers[variant].append(watcher)
            return watcher.stop
        return start

    try:
        workloads.generate_w1(folder, records)
        workloads.run_w1(records, parallelism, folder, mode=mode)  # warm-up, not counted
        for r in range(rounds):
            for variant in variants[r % 3:] + variants[:r % 3]:  # each variant takes each place in turn
                ports = free_port_range(6, 31000)
                conf = OFF if variant == "off" else {"rest.port": "0",
                                                     "metrics.reporter.prom.port": f"{ports[0]}-{ports[1]}"}
                runs[variant].append(workloads.run_w1(records, parallelism, folder, mode=mode, conf=conf,
                                                      watch=watch(variant, ports if variant == "watched" else None)))
        n = runs["off"][0]["records"] / 1e6
        rate = {v: statistics.median(r["records_per_s"] for r in runs[v]) for v in variants}
        cpu = {v: statistics.median(w.cpu_s / n for w in watchers[v]) for v in variants}
        out: dict[str, Any] = {"name": "metrics-overhead", "workload": "w1", "mode": mode,
                               "records": runs["off"][0]["records"], "parallelism": parallelism, "rounds": rounds,
                               "watch_interval_s": watch_interval_s, "target_pct": 2.0}
        for v in variants:
            out[v] = {"records_per_s": round(rate[v]), "cpu_s_per_million": round(cpu[v], 4),
                      "runs_records_per_s": [r["records_per_s"] for r in runs[v]],
                      "runs_cpu_s_per_million": [round(w.cpu_s / n, 4) for w in watchers[v]]}
            if v != "off":
                paired = [100.0 * (off["records_per_s"] - r["records_per_s"]) / off["records_per_s"]
                          for r, off in zip(runs[v], runs["off"])]
                out[v].update({"overhead_pct": round(100.0 * (rate["off"] - rate[v]) / rate["off"], 2),
                               "paired_overhead_pct_median": round(statistics.median(paired), 2),
                               "cpu_overhead_pct": round(100.0 * (cpu[v] - cpu["off"]) / cpu["off"], 2)})
        out["watched"]["reads_per_run"] = [w.reads for w in watchers["watched"]]
        accounting = accounting_cpu_us()
        # W1's whole cluster spends cpu_s_per_million * 65536 / 1e6 CPU seconds per 65536 records
        w1_batch_us = cpu["off"] * 65536
        out["accounting"] = {**accounting, "w1_cluster_cpu_us_per_batch": round(w1_batch_us),
                             "share_of_w1_cpu_pct": round(100.0 * accounting["accounting_cpu_us_per_batch"]
                                                          / w1_batch_us, 3)}
        out["verified"] = (all(r["verified"] for v in variants for r in runs[v])
                           and all(w.reads > 0 for w in watchers["watched"]))
        return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)
