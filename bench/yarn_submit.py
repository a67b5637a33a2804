"""yarn-submit: ``yarnflow run --target yarn-per-job`` on the YARN sandbox, N times: the wall
time from the command's start to its exit with the job FINISHED (the application SUCCEEDED),
and how much of it went into starting containers.

Each run is a fresh CLI process that compiles a word count over small text files, submits a
YARN application through the real skein client, follows it, and exits. Container start is
read from the logs: application start -> the AppMaster's first line, plus the first
TaskExecutor container request -> the last TaskExecutor registered. The counts of every run are
checked against the input."""

from __future__ import annotations

import collections
import datetime
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

JOB = textwrap.dedent("""\
    import sys
    import yarnflow

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(2)
    env.set_runtime_mode("BATCH")
    (env.read_text(sys.argv[1])
        .flat_map(lambda r: ({"word": w, "n": 1} for w in r["line"].split()), name="split")
        .key_by("word").sum("n").sink_to_parquet(sys.argv[2]))
    env.execute("yarn-submit")
""")
CONF = {"jobmanager.memory.process.size": "512 mb", "taskmanager.memory.process.size": "512 mb",
        "taskmanager.numberOfTaskSlots": "1"}
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _stamp(line: str) -> float | None:
    m = STAMP.match(line)
    if not m:
        return None
    return datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _container_start_s(am_log: Path, app_start: float) -> float:
    """Application start -> the AppMaster's first log line, plus first TaskExecutor container
    requested -> last TaskExecutor registered."""
    lines = am_log.read_text(errors="replace").splitlines()
    stamps = [(s, ln) for ln in lines if (s := _stamp(ln)) is not None]
    am_up = stamps[0][0] - app_start
    requested = [s for s, ln in stamps if "requested TaskExecutor container" in ln]
    registered = [s for s, ln in stamps if re.search(r"TaskExecutor \S+ registered with", ln)]
    te_up = (max(registered) - min(requested)) if requested and registered else 0.0
    return am_up + te_up


def run_yarn_submit(runs: int = 5, words: int = 20_000) -> dict[str, Any]:
    import pyarrow.dataset as pads

    work = Path(tempfile.mkdtemp(prefix="bench-yarn-submit-"))
    config_dir = work / "skein"
    env = dict(os.environ, SKEIN_CONFIG=str(config_dir))
    os.environ["SKEIN_CONFIG"] = str(config_dir)
    import skein
    import skein.core

    skein.core.properties = skein.properties = skein.core.Properties()  # read SKEIN_CONFIG again

    from yarnflow.sandbox import Sandbox
    src = work / "in"
    src.mkdir()
    expected: collections.Counter = collections.Counter()
    for f in range(4):
        ws = [f"w{(f * 7919 + i * 31) % 997}" for i in range(words // 4)]
        expected.update(ws)
        (src / f"part-{f}.txt").write_text("\n".join(" ".join(ws[i:i + 10]) for i in range(0, len(ws), 10)) + "\n")
    (work / "job.py").write_text(JOB)
    totals: list[float] = []
    container: list[float] = []
    verified = True
    with Sandbox(str(config_dir), work_dir=str(work / "sandbox"), max_memory_mb=4096, max_vcores=2) as sandbox:
        client = skein.Client(address=sandbox.address)
        for i in range(runs):
            out = work / f"out-{i}"
            args = [sys.executable, "-m", "yarnflow", "run", "--target", "yarn-per-job", "--no-progress",
                    *[a for k, v in CONF.items() for a in ("-D", f"{k}={v}")],
                    str(work / "job.py"), str(src), str(out)]
            t0 = time.time()
            proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=str(work), timeout=300)
            totals.append(time.time() - t0)
            found = re.search(r"YARN application (application_\d+_\d+)", proc.stderr)
            if proc.returncode != 0 or not found:
                raise RuntimeError(f"run {i} failed ({proc.returncode}):\n{proc.stderr}")
            app_id = found.group(1)
            report = client.application_report(app_id)
            verified &= str(report.final_status) == "SUCCEEDED"
            table = pads.dataset(str(out), format="parquet").to_table()
            verified &= dict(zip(table["word"].to_pylist(), table["n"].to_pylist())) == dict(expected)
            logs = Path(sandbox.work_dir) / "logs" / app_id
            am_log = next(p for p in sorted(logs.iterdir()) if p.name.endswith("_01_000001")) / "stderr"
            container.append(_container_start_s(am_log, report.start_time.timestamp()))
        client.close()
    shutil.rmtree(work, ignore_errors=True)
    median = statistics.median(totals)
    return {"name": "yarn-submit", "runs": runs, "median_s": round(median, 3), "min_s": round(min(totals), 3),
            "max_s": round(max(totals), 3), "container_start_median_s": round(statistics.median(container), 3),
            "container_start_share": round(statistics.median(container) / median, 3),
            "runs_s": [round(t, 3) for t in totals], "verified": bool(verified)}
