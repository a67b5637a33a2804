"""Many hosts (issue 52): W1 and W2 with the TaskExecutors on two hosts of their own against the
same on one host, and the time from a cut TaskExecutor host to the job RUNNING again.

Both runs go through YARN (the sandbox, `yarnflow run --target yarn-per-job`, parallelism 2,
one slot per TaskExecutor): "one host" is a sandbox whose containers all run on this machine's
network (127.0.0.1); "two hosts" is one with hosts of their own (network namespaces on a
bridge, sandbox/hosts.py), the AppMaster on one, a TaskExecutor on each of two others, the
client on its own. The input is generated once into a folder every host sees (the "HDFS"), the
jobs write Parquet there, and the output is checked against the pyarrow reference of
workloads.py. A job's time is the AppMaster's own (submit to FINISHED, from its log), so the
containers' start, the same in both, is left out.

The cut: a checkpointed STREAMING W1 on the two-host sandbox; once a checkpoint completed, one
TaskExecutor's host is cut off (its link down) and the time until every task is RUNNING again
(in a new container elsewhere) is measured, then the link heals. Root is needed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads

from workloads import generate_w1, generate_w2, in_child, reference_w1, reference_w2

JOB = textwrap.dedent("""\
    import sys
    import time
    import yarnflow
    from yarnflow.windows import TumblingEventTimeWindows, WatermarkStrategy

    workload, src, out, mode = sys.argv[1:5]
    pause = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0  # (s per batch: a job that runs long enough to cut)

    def slowly(batch):
        time.sleep(pause)
        return batch

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(2)
    env.set_runtime_mode(mode)
    if workload == "w1":
        words = env.read_parquet(src, columns=["word"])
        if pause:
            words = words.map_batches(slowly, name="slowly")
        words.key_by("word").count().sink_to_parquet(out)
    else:
        strategy = WatermarkStrategy.for_bounded_out_of_orderness(200).with_timestamp_column("ts")
        (env.read_parquet(src).assign_timestamps_and_watermarks(strategy).key_by("key")
            .window(TumblingEventTimeWindows.of(1000)).sum("value").sink_to_parquet(out))
    env.execute(f"{workload}-{mode.lower()}")
""")

CONF = {"jobmanager.memory.process.size": "1 gb", "taskmanager.memory.process.size": "2 gb",
        "taskmanager.numberOfTaskSlots": "1", "heartbeat.interval": "500 ms", "heartbeat.timeout": "5 s",
        "taskmanager.registration.timeout": "60 s", "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.delay": "0 ms"}


def _dconf(conf: dict[str, str]) -> list[str]:
    return [a for k, v in conf.items() for a in ("-D", f"{k}={v}")]


def _am_log(work_dir: str, app_id: str) -> str:
    return "".join(p.read_text(errors="replace") for p in Path(work_dir).rglob(f"logs/{app_id}/*_000001/*")
                   if p.is_file())


def _verify(workload: str, out: str, expected: Any) -> bool:
    table = pads.dataset(out, format="parquet").to_table()
    if workload == "w1":  # BATCH: each word once
        got = dict(zip(table["word"].to_pylist(), table["count"].to_pylist()))
        return got == expected and len(got) == table.num_rows
    got = dict(zip(zip(table["key"].to_pylist(), table["window_start"].to_pylist()), table["value"].to_pylist()))
    return got.keys() == expected.keys() and all(abs(got[k] - expected[k]) < 1e-6 * max(1.0, abs(expected[k]))
                                                 for k in expected)


def _run(sandbox: Any, client: list[str], env: dict[str, str], cwd: str, workload: str, src: str, out: str,
         mode: str, conf: dict[str, str], background: bool = False, pause: float = 0.0) -> Any:
    cmd = [*client, sys.executable, "-m", "yarnflow", "run", "--target", "yarn-per-job", *_dconf(conf), "job.py",
           workload, src, out, mode, str(pause)]
    if background:
        return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"{workload} failed:\n{done.stderr[-3000:]}")
    app_id = re.search(r"YARN application (application_\d+_\d+)", done.stderr).group(1)  # type: ignore[union-attr]
    seconds = float(re.search(r"ended FINISHED after ([\d.]+) s", _am_log(sandbox.work_dir, app_id)).group(1))  # type: ignore[union-attr]
    return seconds


def _cut_to_running(sandbox: Any, client: list[str], env: dict[str, str], cwd: str, src: str, out: str) -> float:
    """A checkpointed STREAMING W1; one TaskExecutor host cut once a checkpoint completed: the
    seconds until every task of the job runs again."""
    import skein
    import skein.core

    from yarnflow.common.config import Configuration
    from yarnflow.connection import ClusterConnection

    os.environ["SKEIN_CONFIG"] = env["SKEIN_CONFIG"]  # (skein reads it into its properties at import)
    skein.core.properties = skein.properties = skein.core.Properties()

    conf = {**CONF, "execution.checkpointing.interval": "1 s", "execution.checkpointing.dir": f"file://{os.path.dirname(out)}/chk",
            "execution.batch-size": "5000"}
    proc = _run(sandbox, client, env, cwd, "w1", src, out, "STREAMING", conf, background=True, pause=0.1)
    try:
        app_id = ""
        deadline = time.monotonic() + 120
        while not app_id and time.monotonic() < deadline:
            apps = [a.id for a in sandbox.cluster.applications() if a.state == "RUNNING"]
            app_id = apps[-1] if apps else ""
            time.sleep(0.2)
        conn = ClusterConnection(Configuration.load({"yarn.application.id": app_id, "client.timeout": "20 s"}), "")

        def job() -> Any:
            jobs = conn.call(lambda gw: gw.list_jobs(), "listJobs")
            return jobs[0] if jobs else None

        while (j := job()) is None or j.latest_completed_checkpoint_id < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("no checkpoint completed")
            time.sleep(0.1)
        by_address = {h.address: h.name for h in sandbox.hosts().values()}
        import psutil

        am_host = te_host = ""
        for p in psutil.process_iter(["cmdline"]):
            try:
                e = p.environ()
                if not e.get("CONTAINER_ID", "").startswith("container_" + app_id[len("application_"):]):
                    continue
                if "yarnflow.am" in (p.info["cmdline"] or []):
                    am_host = e["NM_HOST"]
                elif "yarnflow.worker" in (p.info["cmdline"] or []):
                    te_host = te_host or e["NM_HOST"]
            except (psutil.Error, KeyError):
                continue
        if not te_host or te_host == am_host:
            raise RuntimeError("no TaskExecutor on another host than the AppMaster")
        node = by_address[te_host]
        cut_at = time.monotonic()
        sandbox.network.cut(node)
        try:
            seen_restart = False
            while True:
                j = job()
                restarted = j is not None and any(min(v.subtask_attempts) >= 1 for v in j.vertices)
                seen_restart = seen_restart or restarted
                if seen_restart and j.status.name == "RUNNING" and all(
                        v.state_counts.get(_running(), 0) + v.state_counts.get(_finished(), 0) == v.parallelism
                        and min(v.subtask_attempts) >= 1 for v in j.vertices):
                    return time.monotonic() - cut_at
                if time.monotonic() - cut_at > 120:
                    raise RuntimeError("the job did not run again within 120 s of the cut")
                time.sleep(0.05)
        finally:
            sandbox.network.heal(node)
            conn.close()
    finally:
        proc.kill()
        proc.communicate(timeout=60)


def _running() -> Any:
    from yarnflow.common.states import ExecutionState

    return ExecutionState.RUNNING


def _finished() -> Any:
    from yarnflow.common.states import ExecutionState

    return ExecutionState.FINISHED


def run_multi_host(records: int = 5_000_000, work_dir: str | None = None) -> dict[str, Any]:
    from yarnflow.sandbox import Sandbox

    if os.geteuid() != 0:
        raise RuntimeError("hosts of their own are network namespaces: run this benchmark as root")
    root = tempfile.mkdtemp(prefix="yarnflow-multi-host-", dir=work_dir)
    shared = os.path.join(root, "shared")
    client_dir = os.path.join(root, "client")
    os.makedirs(client_dir)
    Path(client_dir, "job.py").write_text(JOB)
    try:
        in_child(generate_w1, os.path.join(shared, "w1"), records)
        in_child(generate_w2, os.path.join(shared, "w2"), records)
        expected = {"w1": in_child(reference_w1, os.path.join(shared, "w1"))[0],
                    "w2": in_child(reference_w2, os.path.join(shared, "w2"))[0]}
        figures: dict[str, dict[str, float]] = {"w1": {}, "w2": {}}
        verified = True
        cut_s = 0.0
        for layout in ("one_host", "two_hosts"):
            config = os.path.join(root, f"skein-{layout}")
            env = {**os.environ, "SKEIN_CONFIG": config, "TMPDIR": client_dir}
            apart = layout == "two_hosts"
            with Sandbox(config, work_dir=os.path.join(root, f"work-{layout}"), max_memory_mb=4096, max_vcores=2,
                         node_count=3 if apart else 1, separate_hosts=apart, hide=[client_dir] if apart else ()) as sb:
                client = sb.host_command("client", []) if apart else []
                for workload, mode in (("w1", "BATCH"), ("w2", "STREAMING")):
                    out = os.path.join(shared, f"out-{workload}-{layout}")
                    seconds = _run(sb, client, env, client_dir, workload, os.path.join(shared, workload), out,
                                   mode, CONF)
                    ok = _verify(workload, out, expected[workload])
                    verified = verified and ok
                    figures[workload][layout] = seconds
                if apart:
                    cut_s = _cut_to_running(sb, client, env, client_dir, os.path.join(shared, "w1"),
                                            os.path.join(shared, "out-cut"))
        timeout_s = 5.0
        return {"name": "multi-host", "records": records,
                "w1": {**{f"{k}_s": round(v, 2) for k, v in figures["w1"].items()},
                       "ratio_to_one_host": round(figures["w1"]["one_host"] / figures["w1"]["two_hosts"], 3)},
                "w2": {**{f"{k}_s": round(v, 2) for k, v in figures["w2"].items()},
                       "ratio_to_one_host": round(figures["w2"]["one_host"] / figures["w2"]["two_hosts"], 3)},
                "heartbeat_timeout_s": timeout_s, "cut_to_running_s": round(cut_s, 2),
                "cut_to_running_s_over_heartbeat_timeout": round(cut_s - timeout_s, 2), "verified": verified}
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(run_multi_host(int(sys.argv[1]) if len(sys.argv) > 1 else 5_000_000)))
