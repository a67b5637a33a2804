"""W3: revenue per region, orders ⨝ customers (5,000,000 orders of order_id, customer_id,
amount; 100,000 customers of customer_id, region; ``orders.parquet`` and ``customers.parquet``
in the input folder, generated unless given).

``--engine spark``: yarnflow reads both files natively and joins and sums in one Spark SQL stage
(driven from a TaskExecutor slot, local[2]); ``--engine native``: yarnflow's hash join and keyed
sum. In the same run plain PySpark does the same DataFrame join and aggregation in local[2] in a
process of its own. Both timings include starting Spark (the TaskExecutor's SparkSession
starts with the stage's first run; the plain run's with its process); ``pyspark_query_seconds``
is the plain run without it. Results are checked against pyarrow's join and aggregation."""

from __future__ import annotations

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
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    regions = pa.array([f"region-{i:02d}" for i in range(25)])
    pq.write_table(pa.table({"customer_id": pa.array(np.arange(customers, dtype=np.int64)),
                             "region": regions.take(pa.array(rng.integers(0, 25, customers)))}),
                   os.path.join(folder, "customers.parquet"))
    pq.write_table(pa.table({"order_id": pa.array(np.arange(orders, dtype=np.int64)),
                             "customer_id": pa.array(rng.integers(0, customers, orders, dtype=np.int64)),
                             "amount": pa.array(np.round(rng.random(orders) * 1000.0, 2))}),
                   os.path.join(folder, "orders.parquet"), row_group_size=250_000)


def reference_w3(folder: str) -> dict[str, float]:
    orders = pq.read_table(os.path.join(folder, "orders.parquet"), columns=["customer_id", "amount"])
    joined = orders.join(pq.read_table(os.path.join(folder, "customers.parquet")), "customer_id")
    agg = joined.group_by("region").aggregate([("amount", "sum")])
    return dict(zip(agg["region"].to_pylist(), agg["amount_sum"].to_pylist()))


def _close(got: dict[str, float], want: dict[str, float]) -> bool:
    return got.keys() == want.keys() and all(abs(got[k] - v) <= 1e-6 * max(1.0, abs(v)) for k, v in want.items())


def run_w3(input_dir: str | None = None, engine: str = "spark", parallelism: int = 2) -> dict[str, Any]:
    from workloads import _run_job

    folder = input_dir or tempfile.mkdtemp(prefix="yarnflow-w3-")
    try:
        if not input_dir:
            generate_w3(folder)
        want = reference_w3(folder)
        orders_path, customers_path = os.path.join(folder, "orders.parquet"), os.path.join(folder, "customers.parquet")
        n = pq.ParquetFile(orders_path).metadata.num_rows

        def build(env: Any) -> None:
            orders = env.read_parquet(orders_path, columns=["customer_id", "amount"], name="orders")
            customers = env.read_parquet(customers_path, name="customers")
            if engine == "spark":
                env.spark_sql(SQL, orders=orders, customers=customers, name="join_sum").collect()
            else:
                (orders.join(customers).where("customer_id").equal_to("customer_id").apply()
                 .map_batches(lambda b: pa.record_batch({"region": b.column("region"),
                                                         "revenue": b.column("amount")}), name="project")
                 .key_by("region").sum("revenue").collect())

        conf = {**SPARK_CONF, "taskmanager.memory.process.size": "3 gb"} if engine == "spark" else {}
        from yarnflow import executors

        executors.set_context(executors.ClusterContext("", conf, progress=False))
        try:
            table, seconds, peak = _run_job(build, parallelism, f"w3-{engine}", "BATCH", conf)
        finally:
            executors.set_context(None)
        got = dict(zip(table["region"].to_pylist(), table["revenue"].to_pylist()))
        plain = subprocess.run([sys.executable, "-c", PLAIN, folder, SQL], capture_output=True, text=True,
                               timeout=900, env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
        if plain.returncode != 0:
            raise RuntimeError(f"plain PySpark failed:\n{plain.stderr[-3000:]}")
        import json

        p = json.loads(plain.stdout.strip().splitlines()[-1])
        return {"name": "w3", "engine": engine, "orders": n, "parallelism": parallelism,
                "seconds": round(seconds, 3), "pyspark_seconds": round(p["seconds"], 3),
                "pyspark_query_seconds": round(p["query_seconds"], 3),
                "ratio_to_pyspark": round(seconds / p["seconds"], 3), "peak_rss_mb": round(peak.peak_bytes / 2**20),
                "peak_pss_mb": round(peak.peak_pss_bytes / 2**20),
                "verified": _close(got, want) and _close(p["result"], want)}
    finally:
        if not input_dir:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":  # pragma: no cover
    t = time.time()
    print(run_w3(engine=sys.argv[1] if len(sys.argv) > 1 else "spark"), time.time() - t)
