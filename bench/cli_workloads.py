"""cli-workloads: the workloads as a user runs them, through ``yarnflow run JOB.py`` (embedded
local cluster, parallelism 2), against other tools in the same run (issue 54).

Each job file reads its Parquet input, computes and collects; the figure is the time from
``env.execute()`` to the result in hand (what the job costs the user, cluster start and stop
included, not the interpreter's start), and the whole command's wall time beside it:

- ``w1``: keyed count of 5M words; Bytewax's word count (``--bytewax-python``, 2 processes,
  ``bytewax_wordcount.py``) on the same files, its processes' start to end;
- ``w2``: sums per key and 1 s tumbling event-time window of 5M (key, value, ts) records;
- ``w3``: revenue per region of N orders joined with 100k customers (yarnflow's own join);
  DuckDB (if installed) with 2 threads, the same query over the same files, timed around the
  query in an already running interpreter (``duckdb_s``);
- ``rowmap``: 5M words through a per-row map calling a user helper (``normalise``, not
  vectorisable), then a keyed count; against a plain one-core Python loop calling the same
  helper on the same rows (read from the same files, as dicts), whole loop.

Results are checked against pyarrow / numpy references (``verified``). Python's bytecode cache
is on (``PYTHONDONTWRITEBYTECODE`` removed) and each job runs once before it is timed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

JOBS = {
    "w1": '''
env.read_parquet(DATA + "/w1", columns=["word"]).key_by("word").count().collect()
''',
    "w2": '''
from yarnflow.windows import TumblingEventTimeWindows, WatermarkStrategy
strategy = WatermarkStrategy.for_bounded_out_of_orderness(200).with_timestamp_column("ts")
(env.read_parquet(DATA + "/w2").assign_timestamps_and_watermarks(strategy)
    .key_by("key").window(TumblingEventTimeWindows.of(1000)).sum("value").collect())
''',
    "w3": '''
import pyarrow as pa
orders = env.read_parquet(DATA + "/w3/orders.parquet", columns=["customer_id", "amount"], name="orders")
customers = env.read_parquet(DATA + "/w3/customers.parquet", name="customers")
(orders.join(customers).where("customer_id").equal_to("customer_id").apply()
    .map_batches(lambda b: pa.record_batch({"region": b.column("region"), "revenue": b.column("amount")}),
                 name="project")
    .key_by("region").sum("revenue").collect())
''',
    "rowmap": '''
from helpers import normalise
env.read_parquet(DATA + "/w1", columns=["word"]).map(lambda r: {"word": normalise(r["word"])}) \\
    .key_by("word").count().collect()
''',
}

JOB_FILE = '''
import json, os, sys, time
import yarnflow
DATA = os.environ["CLI_WORKLOADS_DATA"]
env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
env.set_runtime_mode("{mode}")
{body}
at_execute = time.time()
result = env.execute("{name}")
done = time.time()
result.collected().to_pandas().to_parquet(os.environ["CLI_WORKLOADS_OUT"] + ".parquet")
with open(os.environ["CLI_WORKLOADS_OUT"], "w") as out:
    json.dump({{"at_execute": at_execute, "done": done}}, out)
'''

HELPERS = '''
def normalise(word):
    """A user's helper, per row: not something pyarrow compute does."""
    word = word.strip().lower()
    return word[:-1] if word.endswith("s") and len(word) > 3 else word
'''


def _loop(folder: str) -> tuple[dict[str, int], float]:
    """One core, plain Python: the helper on the same rows as dicts, counted in a dict."""
    import pyarrow.parquet as pq

    sys.path.insert(0, os.path.dirname(folder))
    from helpers import normalise  # type: ignore[import-not-found]

    started = time.perf_counter()
    counts: dict[str, int] = {}
    for name in sorted(os.listdir(folder)):
        for batch in pq.ParquetFile(os.path.join(folder, name)).iter_batches(65536, columns=["word"]):
            for row in batch.to_pylist():
                word = normalise(row["word"])
                counts[word] = counts.get(word, 0) + 1
    return counts, time.perf_counter() - started


def _duckdb(folder: str) -> tuple[dict[str, float], float] | None:
    try:
        import duckdb
    except ImportError:
        return None
    con = duckdb.connect()
    con.execute("SET threads TO 2")
    started = time.perf_counter()
    rows = con.execute(
        f"SELECT c.region, sum(o.amount) FROM read_parquet('{folder}/orders.parquet') o "
        f"JOIN read_parquet('{folder}/customers.parquet') c USING (customer_id) GROUP BY c.region").fetchall()
    took = time.perf_counter() - started
    con.close()
    return {r: float(v) for r, v in rows}, took


def _run(name: str, data: str, work: str, env: dict[str, str]) -> tuple[Any, float, float]:
    """``yarnflow run`` of the workload's job: (its result table, execute seconds, wall seconds)."""
    import pyarrow.parquet as pq

    job = os.path.join(work, f"{name}.py")
    with open(job, "w") as f:
        f.write(JOB_FILE.format(mode="BATCH", body=JOBS[name], name=name))
    out = os.path.join(work, f"{name}.json")
    cmd = [os.path.join(os.path.dirname(sys.executable), "yarnflow"), "run", "--parallelism", "2", job]
    started = time.time()
    proc = subprocess.run(cmd, env={**env, "CLI_WORKLOADS_OUT": out}, capture_output=True, text=True, timeout=3600,
                          cwd=work)
    wall = time.time() - started
    if proc.returncode != 0:
        raise RuntimeError(f"yarnflow run {name} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    with open(out) as f:
        times = json.load(f)
    return pq.read_table(out + ".parquet"), times["done"] - times["at_execute"], wall


def run_cli_workloads(records: int = 5_000_000, orders: int = 5_000_000, bytewax_python: str | None = None,
                      work_dir: str | None = None, only: list[str] | None = None) -> dict[str, Any]:
    sys.path.insert(0, HERE)
    from rowpath import run_bytewax
    from w3 import _close, generate_w3, reference_w3
    from workloads import generate_w1, generate_w2, reference_w1, reference_w2

    root = tempfile.mkdtemp(prefix="yarnflow-cli-workloads-", dir=work_dir)
    data = os.path.join(root, "data")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["CLI_WORKLOADS_DATA"] = data
    env["PYTHONPATH"] = os.pathsep.join([data, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    wanted = only or list(JOBS)
    result: dict[str, Any] = {"name": "cli-workloads", "records": records, "orders": orders}
    verified = True
    try:
        os.makedirs(data)
        with open(os.path.join(data, "helpers.py"), "w") as f:
            f.write(HELPERS)
        if {"w1", "rowmap"} & set(wanted):
            generate_w1(os.path.join(data, "w1"), records)
        if "w2" in wanted:
            generate_w2(os.path.join(data, "w2"), records)
        if "w3" in wanted:
            generate_w3(os.path.join(data, "w3"), orders)
        for name in wanted:
            _run(name, data, root, env)  # (once first: bytecode, page cache)
            table, seconds, wall = _run(name, data, root, env)
            entry: dict[str, Any] = {"seconds": round(seconds, 3), "wall_s": round(wall, 3)}
            if name == "w1":
                want, _ = reference_w1(os.path.join(data, "w1"))
                ok = dict(zip(table["word"].to_pylist(), table["count"].to_pylist())) == want
                entry["records_per_s"] = round(records / seconds)
                if bytewax_python:  # (its word count: str.strip on each word, count per word)
                    bw_s, bw_counts = run_bytewax(bytewax_python, os.path.join(data, "w1"), 2)
                    entry.update(bytewax_s=round(bw_s, 3), ratio_to_bytewax=round(bw_s / seconds, 2))
                    ok = ok and bw_counts == want
            elif name == "w2":
                want2, _ = reference_w2(os.path.join(data, "w2"))
                got2 = dict(zip(zip(table["key"].to_pylist(), table["window_start"].to_pylist()),
                                table["value"].to_pylist()))
                ok = got2.keys() == want2.keys() and all(abs(got2[k] - v) <= 1e-9 * max(1.0, abs(v))
                                                         for k, v in want2.items())
                entry["records_per_s"] = round(records / seconds)
            elif name == "w3":
                got3 = dict(zip(table["region"].to_pylist(), table["revenue"].to_pylist()))
                ok = _close(got3, reference_w3(os.path.join(data, "w3")))
                duck = _duckdb(os.path.join(data, "w3"))
                if duck is not None:
                    entry.update(duckdb_s=round(duck[1], 3), ratio_to_duckdb=round(seconds / duck[1], 2))
                    ok = ok and _close(duck[0], got3)
                else:
                    entry["duckdb"] = "skipped: not installed (pip install duckdb)"
            else:
                loop_counts, loop_s = _loop(os.path.join(data, "w1"))
                ok = dict(zip(table["word"].to_pylist(), table["count"].to_pylist())) == loop_counts
                entry.update(python_loop_s=round(loop_s, 3), ratio_to_python_loop=round(loop_s / seconds, 2))
            entry["verified"] = ok
            verified = verified and ok
            result[name] = entry
        result["verified"] = verified
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)
