"""batch-agg: a BATCH keyed sum over R rows (default 100,000,000) with N distinct keys, natively
and in plain PySpark (``groupBy("key").sum("value")``, local[2]) in the same run; both write
their result as Parquet (N rows: too many to collect).

Input: ``rows.parquet``-style files of ``key`` (int64: a 64-bit mix of ``i % N``, so exactly N
distinct keys in no order) and ``value`` (int64, ``i % 100``), generated a row group at a time
in a child process unless ``--input`` names a folder. Verification (in a child process too,
from the written files, a row group at a time): both results have N rows and the same
checksum, sum over rows of mix(key) * sum mod 2**64, as the one computed from the input.

Prints ``seconds`` (submit to result), ``pyspark_seconds`` (process start to result),
``ratio_to_pyspark``, ``peak_rss_mb`` (the whole local cluster and the client),
``spilled_mb`` and ``verified``."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

_ROW_GROUP = 1_000_000
_FILE_ROWS = 10_000_000

PLAIN = textwrap.dedent("""\
    import json, sys, time
    t0 = time.perf_counter()
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.read.parquet(sys.argv[1]).groupBy("key").sum("value").withColumnRenamed("sum(value)", "value") \\
        .write.mode("overwrite").parquet(sys.argv[2])
    print(json.dumps({"seconds": time.perf_counter() - t0}))
    spark.stop()
""")


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of uint64, so distinct inputs give distinct keys."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def generate(folder: str, rows: int, keys: int) -> None:
    os.makedirs(folder, exist_ok=True)
    schema = pa.schema([("key", pa.int64()), ("value", pa.int64())])
    for f, start in enumerate(range(0, rows, _FILE_ROWS)):
        with pq.ParquetWriter(os.path.join(folder, f"part-{f:03d}.parquet"), schema) as writer:
            for s in range(start, min(rows, start + _FILE_ROWS), _ROW_GROUP):
                i = np.arange(s, min(rows, start + _FILE_ROWS, s + _ROW_GROUP), dtype=np.int64)
                writer.write_table(pa.table({"key": pa.array(_mix(i % keys).view(np.int64)),
                                             "value": pa.array(i % 100)}, schema=schema))


def checksum(keys: np.ndarray, sums: np.ndarray) -> int:
    with np.errstate(over="ignore"):
        return int((_mix(keys.view(np.uint64)) * sums.astype(np.uint64)).sum(dtype=np.uint64))


def expected(rows: int, keys: int) -> tuple[int, int]:
    """(distinct keys, checksum) of the input, from its definition (a chunk of keys at a time)."""
    total = 0
    for lo in range(0, keys, 5_000_000):
        r = np.arange(lo, min(keys, lo + 5_000_000), dtype=np.int64)
        count = (rows - r + keys - 1) // keys  # rows i = r + k * keys < rows
        # sum over k < count of (r + k * keys) % 100, a period at most 100 long in k
        sums = np.zeros(len(r), dtype=np.int64)
        period = 100 // np.gcd(keys, 100)
        full, rest = count // period, count % period
        for k in range(period):
            v = (r + k * keys) % 100
            sums += v * full + np.where(k < rest, v, 0)
        with np.errstate(over="ignore"):
            total += checksum(_mix(r).view(np.int64), sums)
    return min(keys, rows), total % 2**64


def observed(folder: str) -> tuple[int, int]:
    """(rows, checksum) of a result written as Parquet, a row group at a time."""
    n, total = 0, 0
    for path in sorted(glob.glob(os.path.join(folder, "*.parquet"))):
        pf = pq.ParquetFile(path)
        for g in range(pf.num_row_groups):
            t = pf.read_row_group(g, columns=["key", "value"])
            n += t.num_rows
            total += checksum(t["key"].to_numpy(), t["value"].to_numpy())
    return n, total % 2**64


def _prepare(input_dir: str | None, rows: int, keys: int) -> tuple[str, int]:
    folder = input_dir or tempfile.mkdtemp(prefix="yarnflow-batch-agg-")
    if not input_dir:
        generate(folder, rows, keys)
    return folder, pq.ParquetDataset(folder).read(columns=["value"]).num_rows if input_dir else rows


def run_batch_agg(rows: int = 100_000_000, keys: int = 50_000_000, input_dir: str | None = None,
                  parallelism: int = 2, conf: dict[str, str] | None = None) -> dict[str, Any]:
    from w3 import spilled_mb
    from workloads import LAST_JOB, RssSampler, in_child  # noqa: F401
    from yarnflow import executors

    folder, n = in_child(_prepare, input_dir, rows, keys)
    out = tempfile.mkdtemp(prefix="yarnflow-batch-agg-out-")
    try:
        conf = dict(conf or {})
        executors.set_context(executors.ClusterContext("", conf, progress=False))
        try:
            seconds, peak = _run(folder, os.path.join(out, "native"), parallelism, conf)
        finally:
            executors.set_context(None)
        spilled = spilled_mb(LAST_JOB[0]) if LAST_JOB else 0.0
        plain = subprocess.run([sys.executable, "-c", PLAIN, folder, os.path.join(out, "pyspark")],
                               capture_output=True, text=True, timeout=7200,
                               env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
        if plain.returncode != 0:
            raise RuntimeError(f"plain PySpark failed:\n{plain.stderr[-3000:]}")
        p = json.loads(plain.stdout.strip().splitlines()[-1])
        want = in_child(expected, n, keys) if not input_dir else None
        got, spark = in_child(observed, os.path.join(out, "native")), in_child(observed, os.path.join(out, "pyspark"))
        return {"name": "batch-agg", "rows": n, "keys": keys, "parallelism": parallelism,
                "seconds": round(seconds, 3), "pyspark_seconds": round(p["seconds"], 3),
                "ratio_to_pyspark": round(seconds / p["seconds"], 3), "peak_rss_mb": round(peak.peak_bytes / 2**20),
                "peak_pss_mb": round(peak.peak_pss_bytes / 2**20), "spilled_mb": spilled,
                "verified": got == spark and (want is None or got == want)}
    finally:
        shutil.rmtree(out, ignore_errors=True)
        if not input_dir:
            shutil.rmtree(folder, ignore_errors=True)


def _run(folder: str, out: str, parallelism: int, conf: dict[str, str]) -> tuple[float, Any]:
    """The native job (``workloads._run_job`` collects its result; this one writes Parquet)."""
    import time

    import yarnflow
    from workloads import LAST_JOB, RssSampler
    from yarnflow.common.rpc.gateways import RemoteDispatcherGateway
    from yarnflow.common.states import JobStatus
    from yarnflow.compiler import compile_job
    from yarnflow.local_cluster import LocalCluster
    from yarnflow.packaging import upload_artifact

    with LocalCluster(2, 2, conf, appmaster_in_process=True) as cluster:
        gw = RemoteDispatcherGateway(cluster.address, 7_200_000)
        storage = gw.cluster_info().storage_dir
        env = yarnflow.StreamExecutionEnvironment(parallelism=parallelism, runtime_mode="BATCH")
        env.read_parquet(folder, name="rows").key_by("key").sum("value", name="sum").sink_to_parquet(out)
        job = upload_artifact(compile_job(env, "batch-agg"), None, storage)
        with RssSampler([os.getpid(), cluster.proc.pid]) as rss:
            t0 = time.perf_counter()
            job_id = gw.submit_job(job.job_graph)
            result = gw.request_job_result(job_id, 7_200_000)
            seconds = time.perf_counter() - t0
        if result.status != JobStatus.FINISHED:
            raise RuntimeError(f"batch-agg ended {result.status.name}: {result.failure_cause}")
        LAST_JOB[:] = [gw.get_job(job_id)]
        gw.close()
    return seconds, rss
