"""W3: revenue per region, orders ⨝ customers (N orders of order_id, customer_id, amount,
default 5,000,000; 100,000 customers of customer_id, region; ``orders.parquet`` and
``customers.parquet`` in the input folder, generated unless given).

``--engine spark``: the join and the sum in one Spark SQL stage driven from a TaskExecutor slot
(local[2]); Spark reads both files itself (plain Parquet sources), or, with ``--prefilter``
(a native filter on the orders first), the files the upstream subtasks write; ``--engine native``: yarnflow's own join and keyed
sum (the compiler picks the join strategy: a broadcast join of the customers, with a local
pre-aggregation before the keyed exchange; ``--hint`` forces one). In the same run plain
PySpark does the same DataFrame join and aggregation in local[2] in a process of its own. Both
timings include starting Spark (the TaskExecutor's SparkSession starts with the stage's first
run; the plain run's with its process); ``pyspark_query_seconds`` is the plain run without it.

Data generation and the reference result (per-customer sums a row group at a time, then per
region) run in child processes, so the client, whose memory the benchmark counts with the
cluster's, holds none of the data. ``spilled_mb``: what the job's batch operators wrote to spill
files (from the subtasks' ``spilledBytes``); ``max_taskexecutor_rss_mb``: the highest peak of
one TaskExecutor process by itself, without the Spark JVM it starts (the driver's memory)."""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SQL = ("SELECT c.region, SUM(o.amount) AS revenue FROM orders o JOIN customers c USING (customer_id) "
       "GROUP BY c.region")
SPARK_CONF = {"spark.driver.memory": "1g"}  # the same for the stage and for plain PySpark
_ROW_GROUP = 250_000

PLAIN = textwrap.dedent("""\
    import json, sys, time
    t0 = time.perf_counter()
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.driver.memory", "1g").config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .getOrCreate())
    t1 = time.perf_counter()
    spark.read.parquet(sys.argv[1] + "/orders.parquet").createOrReplaceTempView("orders")
    spark.read.parquet(sys.argv[1] + "/customers.parquet").createOrReplaceTempView("customers")
    rows = spark.sql(sys.argv[2]).collect()
    t2 = time.perf_counter()
    print(json.dumps({"seconds": t2 - t0, "query_seconds": t2 - t1,
                      "result": {r["region"]: r["revenue"] for r in rows}}))
    spark.stop()
""")


def generate_w3(folder: str, orders: int = 5_000_000, customers: int = 100_000, seed: int = 3) -> None:
    """Writes the two files, orders a row group at a time (200,000,000 orders are 5 GB)."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    regions = pa.array([f"region-{i:02d}" for i in range(25)])
    pq.write_table(pa.table({"customer_id": pa.array(np.arange(customers, dtype=np.int64)),
                             "region": regions.take(pa.array(rng.integers(0, 25, customers)))}),
                   os.path.join(folder, "customers.parquet"))
    schema = pa.schema([("order_id", pa.int64()), ("customer_id", pa.int64()), ("amount", pa.float64())])
    with pq.ParquetWriter(os.path.join(folder, "orders.parquet"), schema) as writer:
        for start in range(0, orders, _ROW_GROUP):
            n = min(_ROW_GROUP, orders - start)
            writer.write_table(pa.table({"order_id": pa.array(np.arange(start, start + n, dtype=np.int64)),
                                         "customer_id": pa.array(rng.integers(0, customers, n, dtype=np.int64)),
                                         "amount": pa.array(np.round(rng.random(n) * 1000.0, 2))}, schema=schema))


def reference_w3(folder: str) -> dict[str, float]:
    """Revenue per region, a row group at a time: per-customer sums, then per region."""
    sums = np.zeros(0)
    pf = pq.ParquetFile(os.path.join(folder, "orders.parquet"))
    for g in range(pf.num_row_groups):
        t = pf.read_row_group(g, columns=["customer_id", "amount"])
        ids = t["customer_id"].to_numpy()
        part = np.bincount(ids, weights=t["amount"].to_numpy())
        if len(part) > len(sums):
            sums = np.concatenate((sums, np.zeros(len(part) - len(sums))))
        sums[:len(part)] += part
    customers = pq.read_table(os.path.join(folder, "customers.parquet"))
    ids = customers["customer_id"].to_numpy()
    known = ids < len(sums)
    revenue = pa.table({"region": customers["region"].filter(pa.array(known)),
                        "revenue": pa.array(sums[ids[known]])}).group_by("region").aggregate([("revenue", "sum")])
    return dict(zip(revenue["region"].to_pylist(), revenue["revenue_sum"].to_pylist()))


def _prepare(input_dir: str | None, orders: int) -> tuple[str, int]:
    folder = input_dir or tempfile.mkdtemp(prefix="yarnflow-w3-")
    if not input_dir:
        generate_w3(folder, orders)
    return folder, pq.ParquetFile(os.path.join(folder, "orders.parquet")).metadata.num_rows


def _close(got: dict[str, float], want: dict[str, float]) -> bool:
    return got.keys() == want.keys() and all(abs(got[k] - v) <= 1e-6 * max(1.0, abs(v)) for k, v in want.items())


def spilled_mb(job: Any) -> float:
    """MB the job's subtasks wrote to spill files."""
    return round(sum(m.spilled_bytes for v in job.vertices for m in v.subtask_metrics) / 2**20, 1)


#: the YARN sandbox run's containers: small TaskExecutors (one slot each), Spark executors of 512 MB
SANDBOX_CONF = {"jobmanager.memory.process.size": "512 mb", "taskmanager.memory.process.size": "1 gb",
                "taskmanager.numberOfTaskSlots": "1", "spark.driver.memory": "512m", "spark.executor.memory": "512m",
                "spark.executor.instances": "2"}


def _container_role(log_dir: str) -> str:
    """What ran in a sandbox container, from its logs: a Spark master or worker, the
    AppMaster, or a TaskExecutor."""
    text = "".join(open(os.path.join(log_dir, f), errors="replace").read() for f in os.listdir(log_dir))
    for marker, role in (("Starting Spark master", "spark-master"), ("Starting Spark worker", "spark-worker"),
                         ("yarnflow.am.", "appmaster"), ("yarnflow.worker.", "taskexecutor")):
        if marker in text:
            return role
    return "other"


def run_w3_sandbox(folder: str, n: int, engine: str, conf: dict[str, str]) -> dict[str, Any]:
    """W3 as a YARN per-job application on the sandbox (``examples/revenue_by_region.py``,
    submitted by ``yarnflow run --target yarn-per-job``): the Spark stage runs on executors in
    containers of the application (their count from the stage's report and the sandbox's
    containers); the result is checked against the reference."""
    import pyarrow.dataset as pads
    import skein
    import skein.core

    from workloads import in_child

    work = tempfile.mkdtemp(prefix="yarnflow-w3-sandbox-")
    config_dir = os.path.join(work, "skein")
    os.environ["SKEIN_CONFIG"] = config_dir
    skein.core.properties = skein.properties = skein.core.Properties()  # read SKEIN_CONFIG again
    from yarnflow.sandbox import Sandbox

    example = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                           "revenue_by_region.py")
    out, storage = os.path.join(work, "out"), os.path.join(work, "storage")
    settings = {**SANDBOX_CONF, **conf, "high-availability.storageDir": f"file://{storage}"}
    try:
        with Sandbox(config_dir, work_dir=os.path.join(work, "sandbox"), max_memory_mb=4096, max_vcores=2) as sandbox:
            args = [sys.executable, "-m", "yarnflow", "run", "--target", "yarn-per-job", "--no-progress",
                    *[a for k, v in settings.items() for a in ("-D", f"{k}={v}")], example, "--engine", engine,
                    "--input", folder, "--output", out]
            t0 = time.perf_counter()
            proc = subprocess.run(args, capture_output=True, text=True, cwd=work, timeout=3600,
                                  env=dict(os.environ, SKEIN_CONFIG=config_dir))
            seconds = time.perf_counter() - t0
            if proc.returncode != 0:
                raise RuntimeError(f"the YARN application failed:\n{proc.stderr[-3000:]}")
            app_id = next(p for p in os.listdir(os.path.join(sandbox.work_dir, "logs")))
            logs = os.path.join(sandbox.work_dir, "logs", app_id)
            containers = os.listdir(logs)
            roles = [_container_role(os.path.join(logs, c)) for c in containers]
        reports = [json.load(open(os.path.join(d, f))) for d, _, fs in os.walk(storage) for f in fs
                   if f.endswith(".json") and os.path.basename(d) == "spark"]
        table = pads.dataset(out, format="parquet").to_table()
        got = dict(zip(table["region"].to_pylist(), table["revenue"].to_pylist()))
        want = in_child(reference_w3, folder)
        return {"name": "w3", "engine": engine, "target": "yarn-sandbox", "orders": n, "seconds": round(seconds, 3),
                "containers": len(containers), "containers_by_role": dict(sorted(collections.Counter(roles).items())),
                "spark_master": reports[0]["master"] if reports else "",
                "spark_executors": reports[0]["executors"] if reports else 0,
                "executor_containers": roles.count("spark-worker"),  # Spark workers, an executor each
                "verified": _close(got, want)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_w3(input_dir: str | None = None, engine: str = "spark", parallelism: int = 2, orders: int = 5_000_000,
           hint: str | None = None, conf: dict[str, str] | None = None, prefilter: bool = False,
           target: str = "local") -> dict[str, Any]:
    from workloads import LAST_JOB, _run_job, in_child

    folder, n = in_child(_prepare, input_dir, orders)
    if target == "yarn-sandbox":
        try:
            return run_w3_sandbox(folder, n, engine, dict(conf or {}))
        finally:
            if not input_dir:
                shutil.rmtree(folder, ignore_errors=True)
    try:
        orders_path, customers_path = os.path.join(folder, "orders.parquet"), os.path.join(folder, "customers.parquet")

        def build(env: Any) -> None:
            orders_ = env.read_parquet(orders_path, columns=["customer_id", "amount"], name="orders")
            if prefilter:  # a native step first: the orders reach Spark through files the subtasks write
                orders_ = orders_.filter(lambda r: r["amount"] >= 0.0, name="prefilter")
            customers = env.read_parquet(customers_path, name="customers")
            if engine == "spark":
                env.spark_sql(SQL, orders=orders_, customers=customers, name="join_sum").collect()
            else:
                joined = orders_.join(customers).where("customer_id").equal_to("customer_id")
                if hint:
                    joined = joined.with_hint(hint)
                (joined.apply()
                 .map_batches(lambda b: pa.record_batch({"region": b.column("region"),
                                                         "revenue": b.column("amount")}), name="project")
                 .key_by("region").sum("revenue").collect())

        conf = dict(conf or {})
        if engine == "spark":
            conf = {**SPARK_CONF, "taskmanager.memory.process.size": "3 gb", **conf}
        from yarnflow import executors

        executors.set_context(executors.ClusterContext("", conf, progress=False))
        try:
            table, seconds, peak = _run_job(build, parallelism, f"w3-{engine}", "BATCH", conf)
        finally:
            executors.set_context(None)
        spilled = spilled_mb(LAST_JOB[0]) if LAST_JOB else 0.0
        got = dict(zip(table["region"].to_pylist(), table["revenue"].to_pylist()))
        want = in_child(reference_w3, folder)
        plain = subprocess.run([sys.executable, "-c", PLAIN, folder, SQL], capture_output=True, text=True,
                               timeout=3600, env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
        if plain.returncode != 0:
            raise RuntimeError(f"plain PySpark failed:\n{plain.stderr[-3000:]}")
        p = json.loads(plain.stdout.strip().splitlines()[-1])
        return {"name": "w3", "engine": engine, "hint": hint or "", "prefilter": prefilter, "orders": n,
                "parallelism": parallelism,
                "seconds": round(seconds, 3), "pyspark_seconds": round(p["seconds"], 3),
                "pyspark_query_seconds": round(p["query_seconds"], 3),
                "ratio_to_pyspark": round(seconds / p["seconds"], 3), "peak_rss_mb": round(peak.peak_bytes / 2**20),
                "peak_pss_mb": round(peak.peak_pss_bytes / 2**20), "spilled_mb": spilled,
                "max_taskexecutor_rss_mb": round(peak.taskexecutor_peak_bytes() / 2**20),
                "verified": _close(got, want) and _close(p["result"], want)}
    finally:
        if not input_dir:
            shutil.rmtree(folder, ignore_errors=True)
