"""metrics-overhead: W1 with every metric on against every metric off, in the same run, on the
same generated data. On: the REST API, the Prometheus endpoints of the AppMaster and the
TaskExecutors, the task I/O meters (bytes, busy / idle / back-pressured time), and a watcher
that, like a dashboard and a Prometheus server, reads /jobs/overview, each job's details and
every Prometheus endpoint once a second. Off: ``rest.enabled: false``, ``metrics.reporters: ""``,
``metrics.task-io.enabled: false`` (records in/out per task are counted either way: the
JobMaster has always had them). After one warm-up run the two variants alternate ``rounds``
times and the medians are compared (target: on costs < 2%)."""

from __future__ import annotations

import shutil
import statistics
import tempfile
import threading
import urllib.request
from typing import Any, Callable

from yarnflow.common.metrics import free_port_range

OFF = {"rest.enabled": "false", "metrics.reporters": "", "metrics.task-io.enabled": "false"}


class Watcher:
    """Reads the REST API and every Prometheus endpoint once a second until stopped."""

    def __init__(self, cluster: Any, ports: tuple[int, int]) -> None:
        self._web = cluster.web_url()
        self._ports = range(ports[0], ports[1] + 1)
        self._stop = threading.Event()
        self.reads = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _get(self, url: str) -> bytes:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read()

    def _run(self) -> None:
        import json

        while not self._stop.wait(1.0):
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
        self._stop.set()
        self._thread.join(10)


def run_metrics_overhead(records: int = 20_000_000, parallelism: int = 2, rounds: int = 5,
                         mode: str = "BATCH") -> dict[str, Any]:
    import workloads

    folder = tempfile.mkdtemp(prefix="yarnflow-w1-metrics-")
    watchers: list[Watcher] = []

    def watch(ports: tuple[int, int]) -> Callable[[Any], Callable[[], None]]:
        def start(cluster: Any) -> Callable[[], None]:
            watcher = Watcher(cluster, ports)
            watchers.append(watcher)
            return watcher.stop
        return start

    try:
        workloads.generate_w1(folder, records)
        workloads.run_w1(records, parallelism, folder, mode=mode)  # warm-up, not counted
        on_runs, off_runs = [], []
        for _ in range(rounds):
            off_runs.append(workloads.run_w1(records, parallelism, folder, mode=mode, conf=OFF))
            ports = free_port_range(6, 31000)
            on = {"rest.port": "0", "metrics.reporter.prom.port": f"{ports[0]}-{ports[1]}"}
            on_runs.append(workloads.run_w1(records, parallelism, folder, mode=mode, conf=on, watch=watch(ports)))
        on_rate = statistics.median(r["records_per_s"] for r in on_runs)
        off_rate = statistics.median(r["records_per_s"] for r in off_runs)
        return {"name": "metrics-overhead", "workload": "w1", "mode": mode, "records": on_runs[0]["records"],
                "parallelism": parallelism, "rounds": rounds,
                "records_per_s_metrics_on": round(on_rate), "records_per_s_metrics_off": round(off_rate),
                "overhead_pct": round(100.0 * (off_rate - on_rate) / off_rate, 2), "target_pct": 2.0,
                "runs_records_per_s_on": [r["records_per_s"] for r in on_runs],
                "runs_records_per_s_off": [r["records_per_s"] for r in off_runs],
                "watcher_reads_per_run": [w.reads for w in watchers],
                "verified": all(r["verified"] for r in on_runs + off_runs) and all(w.reads > 0 for w in watchers)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
