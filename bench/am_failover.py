"""am-failover: a session with one standby AppMaster (ZooKeeper HA, a real ZooKeeper server
started for the run), a running STREAMING keyed job with checkpoints, and a SIGKILL of the
active AppMaster. The committed output is then checked like chaos's: every generated row
exactly once, and each key's sequence numbers (kept in keyed state) 1..count.

- ``seconds_to_new_leader``: from the kill until ZooKeeper names another AppMaster leader;
- ``failover_s``: from the kill until the job is RUNNING under the new leader with every task
  RUNNING;
- ``tasks_restarted``: tasks deployed after the kill, counted in the TaskExecutors' logs (0: the
  new leader took every task over as it ran, ``high-availability.keep-running-tasks``; a new
  leader numbers attempts from 0 again, so the job's attempt numbers cannot tell);
- ``processing_stall_ms``: the longest time, from a second before the kill to the end of the
  job, in which the job's tasks processed no record: each TaskExecutor's Prometheus endpoint is
  read every 100 ms (the tasks' ``numRecordsIn``), so this is measured without any AppMaster.

``-D high-availability.keep-running-tasks=false`` gives the earlier behaviour (every task
cancelled and restarted from the latest checkpoint) for comparison."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests.zookeeper

KEYS = 50


def _rows(start: int, n: int) -> Any:
    return {"id": list(range(start, start + n)), "k": [i % KEYS for i in range(start, start + n)]}


class RecordsSampler:
    """Every 100 ms, the records the job's tasks have read so far, from the TaskExecutors'
    Prometheus endpoints (found in their logs anywhere under ``work_dir``: the AppMaster that
    started them keeps them in its own folder)."""

    def __init__(self, work_dir: Path, interval_s: float = 0.1) -> None:
        self._work_dir = work_dir
        self._interval_s = interval_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="records-sampler", daemon=True)

    def __enter__(self) -> RecordsSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def deployments(self) -> int:
        """How many tasks the TaskExecutors were given so far (their logs)."""
        return sum(len(re.findall(r" deploying .+ \(\w+\)$", log.read_text(errors="replace"), re.M))
                   for log in self._work_dir.rglob("te-*.log"))

    def _urls(self) -> list[str]:
        urls = []
        for log in sorted(self._work_dir.rglob("te-*.log")):
            found = re.search(r"Prometheus metrics at (http://\S+/metrics)", log.read_text(errors="replace"))
            if found:
                urls.append(found.group(1))
        return urls

    def _run(self) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        urls: list[str] = []
        while not self._stop.wait(self._interval_s):
            if len(urls) < 2:
                urls = self._urls()
            total = 0.0
            for url in urls:
                try:
                    with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 - a local endpoint
                        text = resp.read().decode()
                except OSError:
                    continue
                for family in text_string_to_metric_families(text):
                    if family.name.endswith("taskmanager_job_task_numRecordsIn"):
                        total += sum(sample.value for sample in family.samples)
            self.samples.append((time.perf_counter(), total))

    def longest_stall_ms(self, since: float, until: float) -> int:
        """The longest run of samples between ``since`` and ``until`` in which the count did not
        grow (a restarted task's counter starts again from 0: no growth either)."""
        longest = 0.0
        stalled_from: float | None = None
        previous: float | None = None
        for t, total in self.samples:
            if t > until:
                break
            grew = previous is not None and total > previous
            first = previous is None
            previous = total
            if first or t < since or grew:
                stalled_from = None
                continue
            stalled_from = stalled_from if stalled_from is not None else t - self._interval_s
            longest = max(longest, t - stalled_from)
        return int(round(longest * 1000))


def run_am_failover(rows: int = 200_000, interval: str = "500 ms", session_timeout: str = "2 s",
                    seconds: float = 20.0, extra: dict[str, str] | None = None) -> dict[str, Any]:
    import yarnflow
    from chaos import check_sequence_output
    from tests.zookeeper import ZooKeeperServer, _classpath, _java
    from yarnflow import executors
    from yarnflow.common.api import KeyedProcessFunction, ValueStateDescriptor
    from yarnflow.common.config import Configuration
    from yarnflow.common.states import ExecutionState, JobStatus
    from yarnflow.connection import ClusterConnection
    from yarnflow.local_cluster import LocalCluster

    class Sequence(KeyedProcessFunction):
        def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
            seen = ctx.get_state(ValueStateDescriptor("seen", default=0))
            n = seen.value() + 1
            seen.update(n)
            out.collect({"id": row["id"], "k": row["k"], "seq": n})

    java, classpath = _java(), _classpath()
    if java is None or classpath is None:
        return {"name": "am-failover", "error": "needs java and the ZooKeeper jar (.ci/install-test-deps)",
                "verified": False}
    work = Path(tempfile.mkdtemp(prefix="yarnflow-am-failover-"))
    out = str(work / "out")
    zk = ZooKeeperServer(work / "zookeeper", java, classpath)
    zk.start()
    ha = {"high-availability.type": "zookeeper", "high-availability.zookeeper.quorum": zk.quorum,
          "high-availability.cluster-id": "bench", "high-availability.storageDir": (work / "ha").as_uri(),
          "high-availability.zookeeper.client.session-timeout": session_timeout,
          "high-availability.zookeeper.client.retry-wait": "200 ms"}
    conf = {**ha, "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": "10",
            "restart-strategy.fixed-delay.delay": "100 ms", "execution.checkpointing.interval": interval,
            "heartbeat.interval": "500 ms", "heartbeat.timeout": "4 s", "execution.batch-size": "500",
            "taskmanager.registration.timeout": "30 s", **(extra or {})}
    outcome: dict[str, Any] = {}
    failover_s = to_leader_s = -1.0
    restarted = -1
    try:
        with LocalCluster(2, 2, conf, work_dir=str(work / "cluster"), standby=1) as cluster, \
                RecordsSampler(work / "cluster") as sampler:
            conn = ClusterConnection(Configuration.load(ha))
            ctx = executors.ClusterContext("", conf, progress=False)

            def job() -> None:
                executors.set_context(ctx)
                try:
                    env = yarnflow.StreamExecutionEnvironment(parallelism=2, runtime_mode="STREAMING")
                    (env.from_generator(_rows, count=rows, rate_per_s=rows / seconds).key_by("k")
                        .process(Sequence()).sink_to_parquet(out))
                    env.execute("am-failover")
                    outcome["ok"] = True
                except BaseException as exc:  # noqa: BLE001 - reported in the figures
                    outcome["error"] = repr(exc)

            def info() -> Any:
                return next((j for j in conn.call(lambda gw: gw.list_jobs()) if j.name == "am-failover"), None)

            thread = threading.Thread(target=job, daemon=True)
            thread.start()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                j = info()
                if j is not None and j.status == JobStatus.RUNNING and j.latest_completed_checkpoint_id >= 2:
                    break
                time.sleep(0.05)
            old = cluster.leader_address(10)
            deployed = sampler.deployments()
            cluster.appmasters()[old].send_signal(signal.SIGKILL)
            killed = time.perf_counter()
            while time.perf_counter() - killed < 60 and to_leader_s < 0:
                try:
                    if cluster.leader_address(0.5) != old:
                        to_leader_s = time.perf_counter() - killed
                except Exception:  # noqa: BLE001 - no leader yet
                    pass
                time.sleep(0.02)
            while time.perf_counter() - killed < 60:
                try:
                    j = info()
                except Exception:  # noqa: BLE001 - no leader yet
                    j = None
                if (j is not None and j.status == JobStatus.RUNNING and conn.address != old
                        and all(v.state_counts.get(ExecutionState.RUNNING, 0) == v.parallelism for v in j.vertices)):
                    failover_s = time.perf_counter() - killed
                    break
                time.sleep(0.02)
            thread.join(300)
            ended = time.perf_counter()
            restarted = sampler.deployments() - deployed
            conn.close()
        lost, duplicated, state_ok = check_sequence_output(out, rows)
        # (until shortly before the end: the last records are read well before the job has ended)
        stall = sampler.longest_stall_ms(killed - 1.0, ended - 1.0)
        return {"name": "am-failover", "rows": rows, "session_timeout": session_timeout,
                "keep_running_tasks": conf.get("high-availability.keep-running-tasks", "true"),
                "seconds_to_new_leader": round(to_leader_s, 2), "failover_s": round(failover_s, 2),
                "target_failover_s": 4.0, "tasks_restarted": restarted, "processing_stall_ms": stall,
                "target_processing_stall_ms": 1000, "rows_lost": lost, "rows_duplicated": duplicated,
                "keyed_state_exact": state_ok, "error": outcome.get("error", ""),
                "verified": bool(outcome.get("ok")) and failover_s > 0 and lost == 0 and duplicated == 0
                and state_ok}
    finally:
        zk.stop()
        shutil.rmtree(work, ignore_errors=True)
