"""am-failover: a session with one standby AppMaster (ZooKeeper HA, a real ZooKeeper server
started for the run), a running STREAMING keyed job with checkpoints, and a SIGKILL of the
active AppMaster. ``failover_s`` is the time from the kill until every task of the job is
RUNNING again under the new leader; the committed output is then checked like chaos's: every
generated row exactly once, and each key's sequence numbers (kept in keyed state) 1..count."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests.zookeeper

KEYS = 50


def _rows(start: int, n: int) -> Any:
    return {"id": list(range(start, start + n)), "k": [i % KEYS for i in range(start, start + n)]}


def run_am_failover(rows: int = 200_000, interval: str = "500 ms", session_timeout: str = "2 s",
                    seconds: float = 20.0) -> dict[str, Any]:
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
            "taskmanager.registration.timeout": "30 s"}
    outcome: dict[str, Any] = {}
    failover_s = -1.0
    try:
        with LocalCluster(2, 2, conf, work_dir=str(work / "cluster"), standby=1) as cluster:
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
            cluster.appmasters()[old].send_signal(signal.SIGKILL)
            killed = time.perf_counter()
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
            conn.close()
        lost, duplicated, state_ok = check_sequence_output(out, rows)
        return {"name": "am-failover", "rows": rows, "session_timeout": session_timeout,
                "failover_s": round(failover_s, 2), "target_failover_s": 4.0, "rows_lost": lost,
                "rows_duplicated": duplicated, "keyed_state_exact": state_ok, "error": outcome.get("error", ""),
                "verified": bool(outcome.get("ok")) and failover_s > 0 and lost == 0 and duplicated == 0
                and state_ok}
    finally:
        zk.stop()
        shutil.rmtree(work, ignore_errors=True)
