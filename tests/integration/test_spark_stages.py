"""Spark stages (issue 11) on a real local cluster with real PySpark in local mode, and the
native batch join beside them. One cluster serves the whole module, so its TaskExecutors start
one SparkSession for every test (each Spark stage runs in a TaskExecutor slot, never in the
client). Inputs come from Parquet files; results are compared with pyarrow's own join and
aggregation, row for row."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

import yarnflow
from tests.conftest import FAST_CONF, TAG_VAR, kill_tagged, live_tagged
from tests.harness import wait_until
from tests.integration.test_failover_jobs import _run as run
from yarnflow import executors
from yarnflow.common.errors import JobDefinitionError, JobFailedError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
SQL = ("SELECT c.region, SUM(o.amount) AS revenue, COUNT(*) AS orders FROM orders o "
       "JOIN customers c USING (customer_id) GROUP BY c.region")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """2 TaskExecutors x 2 slots for the module; every process it starts (the Spark JVMs too)
    carries the module's tag and none may outlive it."""
    from yarnflow.local_cluster import LocalCluster

    tag = uuid.uuid4().hex
    old = os.environ.get(TAG_VAR)
    os.environ[TAG_VAR] = tag
    try:
        c = LocalCluster(2, 2, {**FAST_CONF, "restart-strategy.type": "fixed-delay",
                                "restart-strategy.fixed-delay.attempts": "2",
                                "restart-strategy.fixed-delay.delay": "100 ms"},
                         work_dir=str(tmp_path_factory.mktemp("spark-cluster"))).start()
    finally:
        if old is None:
            os.environ.pop(TAG_VAR, None)
        else:
            os.environ[TAG_VAR] = old
    yield c
    c.stop()
    try:
        wait_until(lambda: not live_tagged(tag), 30, "processes outlived the cluster", interval_s=0.2)
    except AssertionError:
        pytest.fail(f"processes outlived the Spark cluster and were killed: {kill_tagged(tag)}")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """orders.parquet (order_id, customer_id, amount) and customers.parquet (customer_id,
    region); some orders name no customer (the outer join keeps them)."""
    folder = tmp_path_factory.mktemp("w3")
    rng = random.Random(5)
    n = 20_000
    pq.write_table(pa.table({"order_id": pa.array(range(n), pa.int64()),
                             "customer_id": pa.array([rng.randrange(520) for _ in range(n)], pa.int64()),
                             "amount": pa.array([rng.randrange(1, 100_000) / 100 for _ in range(n)])}),
                   folder / "orders.parquet", row_group_size=2000)
    pq.write_table(pa.table({"customer_id": pa.array(range(500), pa.int64()),
                             "region": [f"region-{i % 7}" for i in range(500)]}), folder / "customers.parquet")
    return folder


def reference(data: Path, min_amount: float = 0.0) -> dict[str, tuple[float, int]]:
    orders = pq.read_table(data / "orders.parquet")
    orders = orders.filter(pa.compute.greater_equal(orders["amount"], min_amount))
    joined = orders.join(pq.read_table(data / "customers.parquet"), "customer_id", join_type="inner")
    agg = joined.group_by("region").aggregate([("amount", "sum"), ("amount", "count")])
    return {r: (s, c) for r, s, c in zip(agg["region"].to_pylist(), agg["amount_sum"].to_pylist(),
                                         agg["amount_count"].to_pylist())}


def committed(out: Path) -> dict[str, tuple[float, int]]:
    t = pads.dataset(str(out), format="parquet").to_table()
    regions = t["region"].to_pylist()
    assert len(regions) == len(set(regions)), "a region was committed twice"
    return dict(zip(regions, zip(t["revenue"].to_pylist(), t["orders"].to_pylist())))


def assert_close(got: dict[str, tuple[float, int]], want: dict[str, tuple[float, int]]) -> None:
    assert set(got) == set(want)
    for region, (revenue, count) in want.items():
        assert got[region][1] == count, region
        assert got[region][0] == pytest.approx(revenue, rel=1e-9), region


def spark_reports(cluster: Any, job_id: str) -> list[dict[str, Any]]:
    folder = Path(cluster.work_dir) / "storage" / "jobs" / job_id / "spark"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def test_a_spark_sql_stage_joins_and_aggregates_on_a_taskexecutor(cluster: Any, data: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"

    def build(env: Any) -> None:
        orders = env.read_parquet(str(data / "orders.parquet"), name="orders")
        orders = orders.filter(lambda r: r["amount"] >= 10.0, name="min_amount")  # native, per row
        customers = env.read_parquet(str(data / "customers.parquet"), name="customers")
        env.spark_sql(SQL, orders=orders, customers=customers, name="join_sum").sink_to_parquet(str(out))

    result = run(cluster, build, "spark-sql")
    assert_close(committed(out), reference(data, 10.0))
    [report] = spark_reports(cluster, str(result.job_id))
    te_pids = {p.pid for p in psutil.Process(cluster.proc.pid).children() if "yarnflow.worker" in p.cmdline()}
    assert report["driver_pid"] in te_pids  # Spark was driven from a TaskExecutor, not from this client
    assert report["application_id"].startswith("local-") and report["master"] == "local[2]"
    assert report["jobs"] >= 1 and report["stages"] >= 1
    # Spark's own partitions of the result (adaptive execution sizes them from the data: a few
    # rows are one file), at most four a downstream subtask (parallelism 2)
    assert 1 <= report["output_files"] <= 8
    assert "pyspark" not in sys.modules or sys.modules["pyspark"].SparkContext._active_spark_context is None


def test_the_native_join_gives_the_spark_stages_results(cluster: Any, data: Path, tmp_path: Path) -> None:
    outs = {engine: tmp_path / engine for engine in ("spark", "native")}

    def build(engine: str) -> Any:
        def b(env: Any) -> None:
            orders = env.read_parquet(str(data / "orders.parquet"), name="orders")
            customers = env.read_parquet(str(data / "customers.parquet"), name="customers")
            if engine == "spark":
                stream = env.spark_sql(SQL, orders=orders, customers=customers)
            else:
                joined = orders.join(customers).where("customer_id").equal_to("customer_id").apply()
                stream = (joined.map_batches(lambda b: pa.record_batch({
                    "region": b.column("region"), "revenue": b.column("amount"),
                    "orders": pa.array([1] * b.num_rows, pa.int64())}), name="project")
                    .key_by("region").reduce(lambda a, b: {"region": a["region"], "revenue": a["revenue"]
                                              + b["revenue"], "orders": a["orders"] + b["orders"]}))
            stream.sink_to_parquet(str(outs[engine]))
        return b

    for engine in outs:
        run(cluster, build(engine), f"join-{engine}")
    want = reference(data)
    assert_close(committed(outs["spark"]), want)
    assert_close(committed(outs["native"]), want)


def test_a_left_outer_native_join_keeps_the_unmatched_rows(cluster: Any, data: Path) -> None:
    def build(env: Any) -> None:
        orders = env.read_parquet(str(data / "orders.parquet"), name="orders")
        customers = env.read_parquet(str(data / "customers.parquet"), name="customers")
        orders.join(customers, how="left_outer").where("customer_id").equal_to("customer_id").apply().collect()

    table = run(cluster, build, "left-outer").collected()
    orders = pq.read_table(data / "orders.parquet")
    want = orders.join(pq.read_table(data / "customers.parquet"), "customer_id", join_type="left outer")
    assert table.num_rows == orders.num_rows == want.num_rows
    assert table.column_names == ["order_id", "customer_id", "amount", "region"]
    got = sorted(zip(*(table[c].to_pylist() for c in ("order_id", "region"))))
    assert got == sorted(zip(*(want[c].to_pylist() for c in ("order_id", "region"))))
    assert sum(1 for _, region in got if region is None) == sum(1 for c in orders["customer_id"].to_pylist()
                                                                   if c >= 500) > 0


def test_a_failing_spark_stage_is_retried_without_duplicating_rows(cluster: Any, data: Path, tmp_path: Path) -> None:
    out, marker = tmp_path / "out", tmp_path / "failed-once"

    def flaky(df: Any) -> Any:
        from pyspark.sql import functions as F

        result = df.groupBy("customer_id").agg(F.sum("amount").alias("revenue"), F.count("*").alias("orders"))
        result.write.parquet(str(tmp_path / "half-done"), mode="overwrite")  # Spark did work before failing
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("the first attempt fails")
        return result.withColumnRenamed("customer_id", "region")

    def build(env: Any) -> None:
        env.read_parquet(str(data / "orders.parquet"), name="orders").spark(flaky, name="by_customer") \
            .sink_to_parquet(str(out))

    result = run(cluster, build, "flaky")
    orders = pq.read_table(data / "orders.parquet")
    agg = orders.group_by("customer_id").aggregate([("amount", "sum"), ("amount", "count")])
    assert_close(committed(out), {c: (s, n) for c, s, n in zip(agg["customer_id"].to_pylist(),
                                                                   agg["amount_sum"].to_pylist(),
                                                                   agg["amount_count"].to_pylist())})
    [report] = spark_reports(cluster, str(result.job_id))
    assert report["attempt"] == 1  # the second attempt of the stage committed
    job_dir = Path(cluster.work_dir) / "storage" / "jobs" / str(result.job_id)
    # nothing of either attempt is left once the job ended, but the stage's report
    wait_until(lambda: sorted(p.name for p in job_dir.iterdir()) == ["spark"], 30,
               f"files left: {sorted(str(p) for p in job_dir.rglob('*'))}")


def test_inputs_are_written_in_parallel_by_the_upstream_subtasks_and_the_driver_holds_none(
        cluster: Any, data: Path, tmp_path: Path) -> None:
    """Issue 25: no funnel. Orders go through a native filter at parallelism 3, whose three
    subtasks each write their own Parquet file; the customers, a plain Parquet source, are read
    by Spark from their file; the driver gets three file names, no rows; two readers read the
    output files in parallel."""
    out = tmp_path / "out"

    def build(env: Any) -> None:
        env.set_parallelism(3)
        orders = env.read_parquet(str(data / "orders.parquet"), name="orders")
        orders = orders.filter(lambda r: r["amount"] >= 10.0, name="min_amount")
        customers = env.read_parquet(str(data / "customers.parquet"), name="customers")
        env.spark_sql(SQL, orders=orders, customers=customers, name="join_sum").set_parallelism(2) \
            .sink_to_parquet(str(out))

    result = run(cluster, build, "no-funnel")
    assert_close(committed(out), reference(data, 10.0))
    gw = cluster.gateway()
    info = next(j for j in gw.list_jobs() if j.job_id == result.job_id)
    gw.close()
    vertices = {v.name: v for v in info.vertices}
    assert vertices["orders -> min_amount -> orders -> join_sum"].parallelism == 3
    assert "customers" not in " ".join(vertices)  # read by Spark itself
    stage = vertices["join_sum"]
    assert sum(m.records_in for m in stage.subtask_metrics) == 3  # one file name from each writer
    assert next(v for n, v in vertices.items() if n.startswith("join_sum output")).parallelism == 2
    [report] = spark_reports(cluster, str(result.job_id))
    assert report["input_files"] == {"orders": 3}  # one file a writer
    assert 1 <= report["output_files"] <= 8
    assert report["input_rows"]["customers"] == "read by Spark from its source files"
    # the job ended: its intermediate data (the stage's input and output files) is deleted,
    # its Spark report stays for `yarnflow info`
    folder = Path(cluster.work_dir) / "storage" / "jobs" / str(result.job_id)
    wait_until(lambda: not (folder / "intermediate").exists(), 30, "the ended job's intermediate data is left")
    assert spark_reports(cluster, str(result.job_id)) == [report]


def test_bad_sql_fails_the_job_with_one_line_naming_the_stage(cluster: Any, data: Path, tmp_path: Path) -> None:
    def build(env: Any) -> None:
        orders = env.read_parquet(str(data / "orders.parquet"), name="orders")
        env.spark_sql("SELECT regionz, SUM(amount) FROM orders GROUP BY regionz", orders=orders,
                      name="bad_query").sink_to_parquet(str(tmp_path / "out"))

    with pytest.raises(JobFailedError) as info:
        run(cluster, build, "bad-sql", {"restart-strategy.type": "none"})
    cause = info.value.cause
    assert cause is not None and cause.error_class == "SparkStageError"
    assert cause.message.startswith("Spark stage 'bad_query' failed: [UNRESOLVED_COLUMN")
    assert "regionz" in cause.message and "\n" not in cause.message and "at org.apache" not in cause.message
    assert cause.traceback == ""  # no wall of stack trace for the user; the TaskExecutor's log has it


def test_a_failing_function_names_the_stage_and_the_error(cluster: Any, data: Path, tmp_path: Path) -> None:
    def broken(df: Any) -> Any:
        raise ValueError("no such column in my head")

    def build(env: Any) -> None:
        env.read_parquet(str(data / "customers.parquet")).spark(broken, name="mine") \
            .sink_to_parquet(str(tmp_path / "out"))

    with pytest.raises(JobFailedError, match=r"Spark stage 'mine': user function broken raised ValueError: "
                                             r"no such column in my head"):
        run(cluster, build, "broken", {"restart-strategy.type": "none"})


def test_info_shows_the_spark_application_and_its_counts(cluster: Any, data: Path, tmp_path: Path) -> None:
    def build(env: Any) -> None:
        customers = env.read_parquet(str(data / "customers.parquet"), name="customers")
        env.spark_sql("SELECT region, COUNT(*) AS n FROM c GROUP BY region", c=customers, name="count_regions") \
            .sink_to_parquet(str(tmp_path / "out"))

    result = run(cluster, build, "info")
    proc = subprocess.run([sys.executable, "-m", "yarnflow", "info", "--address", cluster.address,
                           str(result.job_id)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "spark stages:" in proc.stdout
    line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith("count_regions:"))
    assert "application local-" in line and " jobs, " in line and " stages, " in line
    from tests.rest import get

    [stage] = get(f"{cluster.web_url()}/jobs/{result.job_id}/spark")["stages"]  # what the web UI's Spark tab shows
    assert stage["stage"] == "count_regions" and stage["application_id"].startswith("local-") and stage["jobs"] >= 1
    assert get(f"{cluster.web_url()}/jobs/{'0' * 32}/spark", expect=404)


def test_the_example_runs_with_both_engines(cluster: Any, data: Path, tmp_path: Path) -> None:
    results = {}
    for engine in ("spark", "native"):
        proc = subprocess.run([sys.executable, "-m", "yarnflow", "run", "--address", cluster.address,
                               "--no-progress", str(REPO / "examples" / "revenue_by_region.py"), "--engine", engine,
                               "--input", str(data), "--output", str(tmp_path / engine)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        t = pads.dataset(str(tmp_path / engine), format="parquet").to_table()
        results[engine] = dict(zip(t["region"].to_pylist(), t["revenue"].to_pylist()))
    want = {r: s for r, (s, _) in reference(data).items()}
    for got in results.values():
        assert set(got) == set(want)
        assert all(got[r] == pytest.approx(want[r], rel=1e-9) for r in want)


def test_spark_stages_chain_and_the_pipeline_goes_on_natively(cluster: Any, data: Path) -> None:
    def build(env: Any) -> None:
        customers = env.read_parquet(str(data / "customers.parquet"), name="customers")
        counted = customers.spark(lambda df: df.groupBy("region").count(), name="count")
        ranked = counted.spark(lambda df: df.orderBy("region"), name="order")
        ranked.filter(lambda r: r["count"] > 0).collect()

    table = run(cluster, build, "chained").collected()
    customers = pq.read_table(data / "customers.parquet")
    want = customers.group_by("region").aggregate([("region", "count")])
    assert sorted(zip(table["region"].to_pylist(), table["count"].to_pylist())) == sorted(
        zip(want["region"].to_pylist(), want["region_count"].to_pylist()))


def test_a_spark_stage_declares_the_drivers_memory_for_its_slot(cluster: Any, data: Path) -> None:
    from yarnflow.compiler import compile_job

    def build(env: Any) -> None:
        env.read_parquet(str(data / "customers.parquet")).spark(lambda df: df, name="big").collect()

    executors.set_context(executors.ClusterContext(cluster.address, {"spark.driver.memory": "2g"}, progress=False))
    try:
        env = yarnflow.StreamExecutionEnvironment(parallelism=2)
        build(env)
        [vertex] = [v for v in compile_job(env, "memory").job_graph.vertices if v.name == "big"]
    finally:
        executors.set_context(None)
    assert vertex.resources.memory_mb == 2048 and vertex.parallelism == 1
    # the cluster's slots have 512 MB (1 GB TaskExecutors with 2 slots): refused, not overcommitted
    with pytest.raises(JobFailedError, match=r"no slot can offer 0 cores and 2048 MB"):
        run(cluster, build, "too-big", {"spark.driver.memory": "2g", "restart-strategy.type": "none"})


def test_the_session_is_the_taskexecutors_own_with_the_jobs_spark_keys(cluster: Any, data: Path) -> None:
    def settings(df: Any) -> Any:
        spark = df.sparkSession
        sc = spark.sparkContext
        return spark.createDataFrame([(sc.getConf().get("spark.ui.enabled"),
                                       spark.conf.get("spark.sql.execution.arrow.pyspark.enabled"),
                                       sc.getConf().get("spark.driver.host"),
                                       spark.conf.get("spark.sql.shuffle.partitions"),
                                       sc.applicationId, os.getpid())],
                                     ["ui", "arrow", "host", "shuffle", "app", "pid"])

    results = []
    for shuffle in ("3", "5"):  # the SQL keys of each job, on the TaskExecutors' one SparkContext each
        def build(env: Any) -> None:
            env.read_parquet(str(data / "customers.parquet")).spark(settings, name="settings").collect()

        table = run(cluster, build, f"settings-{shuffle}", {"spark.sql.shuffle.partitions": shuffle}).collected()
        [row] = table.to_pylist()
        assert (row["ui"], row["arrow"], row["host"], row["shuffle"]) == ("false", "true", "127.0.0.1", shuffle)
        results.append(row)
    te_pids = {p.pid for p in psutil.Process(cluster.proc.pid).children() if "yarnflow.worker" in p.cmdline()}
    assert all(r["pid"] in te_pids for r in results)
    by_pid: dict[int, set[str]] = {}
    for r in results:
        by_pid.setdefault(r["pid"], set()).add(r["app"])
    assert all(len(apps) == 1 for apps in by_pid.values())  # one SparkContext per TaskExecutor, reused


@pytest.mark.parametrize("how", ["mode", "unbounded"])
def test_a_streaming_spark_stage_without_checkpoints_is_refused(how: str) -> None:
    env = yarnflow.StreamExecutionEnvironment(parallelism=2)
    if how == "mode":
        env.set_runtime_mode("STREAMING")
        source = env.from_collection({"x": [1, 2]})
    else:
        source = env.from_generator(lambda start, n: {"x": list(range(start, start + n))}, name="ticks")
    source.spark(lambda df: df, name="stage").print()
    from yarnflow.compiler import compile_job

    with pytest.raises(JobDefinitionError) as info:
        compile_job(env, "streaming")
    assert str(info.value) == ("Spark stage 'stage' in a STREAMING job runs once per completed checkpoint, over the "
                               "rows that checkpoint covers: set execution.checkpointing.interval (or run the job "
                               "in BATCH mode)")


@pytest.mark.timeout(300)
def test_a_streaming_spark_stage_runs_per_checkpoint_exactly_once_through_a_taskexecutor_kill(
        local_cluster: Any, tmp_path: Path) -> None:
    """Issue 25: Spark SQL between native operators in a STREAMING job with checkpoints: the
    stage runs once per completed checkpoint over that checkpoint's rows; the TaskExecutor that
    drives it is SIGKILLed after some micro-batches; every input row is once in the output the
    two-phase sink committed."""
    import signal
    import threading
    import time

    cluster = local_cluster(taskexecutors=2, slots=2)
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    n_files, per_file = 16, 3_000
    for f in range(n_files):
        ids = list(range(f * per_file, (f + 1) * per_file))
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array([i % 97 for i in ids], pa.int64())}),
                       src / f"part-{f:02d}.parquet", row_group_size=500)

    def slow(row: dict) -> dict:
        if row["id"] % 40 == 0:
            time.sleep(0.02)  # ~12 s of work a subtask: checkpoints and micro-batches come and go
        return {"id": row["id"], "v": row["v"] + 1}

    def build(env: Any) -> None:
        env.set_runtime_mode("STREAMING")
        rows = env.read_parquet(str(src), name="rows").map(slow, name="plus_one")
        doubled = env.spark_sql("SELECT id, v * 2 AS w FROM input", input=rows, name="double")
        doubled.map_batches(lambda b: b, name="native_after").sink_to_parquet(str(out))

    conf = {"execution.checkpointing.interval": "400 ms", "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": "3", "restart-strategy.fixed-delay.delay": "200 ms",
            "execution.batch-size": "250"}
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = run(cluster, build, "streaming-spark", conf)
        except BaseException as exc:  # noqa: BLE001
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    reports = Path(cluster.work_dir) / "storage" / "jobs"

    def ran_micro_batches() -> dict[str, Any] | None:
        assert not outcome, f"the job ended before the kill: {outcome}"
        for path in reports.glob("*/spark/*.json"):
            try:
                report = json.loads(path.read_text())
            except ValueError:
                continue  # being written
            if report.get("micro_batches", 0) >= 2:
                return report
        return None

    report = wait_until(ran_micro_batches, 150, "the stage never ran two micro-batches", interval_s=0.1)
    os.kill(report["driver_pid"], signal.SIGKILL)
    thread.join(240)
    assert "result" in outcome, outcome
    table = pads.dataset(str(out), format="parquet").to_table()
    ids = table["id"].to_pylist()
    assert sorted(ids) == list(range(n_files * per_file)), "a row was lost or committed twice"
    assert all(w == 2 * (i % 97 + 1) for i, w in zip(ids, table["w"].to_pylist()))
    gw = cluster.gateway()
    info = next(j for j in gw.list_jobs() if j.name == "streaming-spark")
    gw.close()
    assert info.failure_history, "the kill restarted nothing"
    [final] = [json.loads(p.read_text()) for p in reports.glob("*/spark/*.json")]
    assert final["micro_batches"] >= 1 and final["attempt"] >= 1  # the restored driver ran micro-batches


def test_a_taskexecutor_killed_while_it_drives_spark_retries_the_stage_with_its_inputs_kept(
        local_cluster: Any, data: Path, tmp_path: Path) -> None:
    """The driver subtask's TaskExecutor is SIGKILLed while Spark runs: the stage is retried on
    the other TaskExecutor under the restart strategy, reading the input files its upstream
    wrote once (the upstream is not run again); every row is counted once."""
    import signal
    import threading
    import time

    cluster = local_cluster(taskexecutors=2, slots=2)
    out, started = tmp_path / "out", tmp_path / "driver-started"

    seen = tmp_path / "retry-read"

    def slow(df: Any) -> Any:
        from pyspark.sql import functions as F

        if not started.exists():
            started.write_text(str(os.getpid()))  # the driver's TaskExecutor
            time.sleep(60)  # killed meanwhile
        files = [f.split("://", 1)[-1] for f in df.inputFiles()]  # what the retry reads, and when it was written
        seen.write_text(json.dumps({os.path.basename(f): os.stat(f).st_mtime_ns for f in files}))
        return df.groupBy("customer_id").agg(F.sum("amount").alias("revenue"), F.count("*").alias("orders")) \
            .withColumnRenamed("customer_id", "region")

    def build(env: Any) -> None:
        orders = env.read_parquet(str(data / "orders.parquet"), name="orders").filter(lambda r: True, name="all")
        orders.spark(slow, name="by_customer").sink_to_parquet(str(out))

    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = run(cluster, build, "killed-driver", {"restart-strategy.type": "fixed-delay",
                                                                      "restart-strategy.fixed-delay.attempts": "2",
                                                                      "restart-strategy.fixed-delay.delay": "200 ms"})
        except BaseException as exc:  # noqa: BLE001
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    pid = int(wait_until(lambda: started.exists() and started.read_text(), 120, "the stage never ran Spark"))
    folder = Path(cluster.work_dir) / "storage" / "jobs"
    [inputs] = list(folder.glob("*/intermediate/*/in/input"))
    written = {p.name: p.stat().st_mtime_ns for p in inputs.iterdir()}
    os.kill(pid, signal.SIGKILL)
    thread.join(150)
    assert "result" in outcome, outcome
    orders = pq.read_table(data / "orders.parquet")
    agg = orders.group_by("customer_id").aggregate([("amount", "sum"), ("amount", "count")])
    assert_close(committed(out), {c: (s, n) for c, s, n in zip(agg["customer_id"].to_pylist(),
                                                                   agg["amount_sum"].to_pylist(),
                                                                   agg["amount_count"].to_pylist())})
    gw = cluster.gateway()
    info = next(j for j in gw.list_jobs() if j.name == "killed-driver")
    gw.close()
    attempts = {v.name: sum(v.subtask_attempts) for v in info.vertices}
    assert attempts["by_customer"] >= 1 and attempts["orders -> all -> input -> by_customer"] == 0, attempts
    assert json.loads(seen.read_text()) == written  # the retry read the very files written before the kill


def test_spark_stages_can_run_on_a_standalone_cluster_of_local_processes_that_goes_when_idle(
        local_cluster: Any, data: Path, tmp_path: Path) -> None:
    """``spark-stages.executors: cluster`` off YARN: the AppMaster starts Spark's standalone
    master and two workers as processes of its own for the stage, and stops them once no stage
    has asked for ``spark-stages.idle-timeout``."""
    cluster = local_cluster(taskexecutors=2, slots=2, **{"spark-stages.executors": "cluster",
                                                         "spark-stages.idle-timeout": "3 s",
                                                         "spark.executor.memory": "512m"})
    out = tmp_path / "out"

    def build(env: Any) -> None:
        orders = env.read_parquet(str(data / "orders.parquet"), name="orders")
        customers = env.read_parquet(str(data / "customers.parquet"), name="customers")
        env.spark_sql(SQL, orders=orders, customers=customers, name="join_sum").sink_to_parquet(str(out))

    result = run(cluster, build, "standalone")
    assert_close(committed(out), reference(data))
    [report] = spark_reports(cluster, str(result.job_id))
    assert report["master"].startswith("spark://127.0.0.1:") and report["executors"] == 2, report

    def daemons() -> list[str]:
        found = []
        for p in psutil.process_iter(["cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if "org.apache.spark.deploy." in cmd and str(cluster.work_dir) in cmd:
                found.append(cmd)
        return found

    assert len(daemons()) == 2  # the two workers, found by their work dirs under the cluster's
    wait_until(lambda: not daemons(), 30, "the idle Spark cluster was not stopped")


def test_a_jobs_spark_master_may_name_a_standalone_master_of_the_users(
        cluster: Any, data: Path, tmp_path: Path) -> None:
    """``-D spark.master=spark://...``: the stage's Spark runs on the user's own standalone
    master and its worker (started here as a user would, with the daemons pyspark ships), even
    when the TaskExecutor already has a local SparkSession from an earlier job."""
    tag = os.environ.get(TAG_VAR) or uuid.uuid4().hex
    env = {**os.environ, TAG_VAR: tag, "SPARK_DAEMON_MEMORY": "256m"}
    url_file = tmp_path / "master-url"
    daemons = [subprocess.Popen([sys.executable, "-m", "yarnflow.worker.spark_daemon", "master",
                                 "--report-file", str(url_file)], env=env, start_new_session=True)]
    try:
        wait_until(url_file.exists, 60, "the Spark master did not start")
        url = url_file.read_text()
        daemons.append(subprocess.Popen([sys.executable, "-m", "yarnflow.worker.spark_daemon", "worker",
                                         "--master", url, "--cores", "1", "--memory", "768m",
                                         "--work-dir", str(tmp_path / "work")], env=env, start_new_session=True))
        out = tmp_path / "out"

        def build(env: Any) -> None:
            orders = env.read_parquet(str(data / "orders.parquet"), name="orders")
            customers = env.read_parquet(str(data / "customers.parquet"), name="customers")
            env.spark_sql(SQL, orders=orders, customers=customers, name="join_sum").sink_to_parquet(str(out))

        result = run(cluster, build, "users-master", {"spark.master": url, "spark.executor.memory": "512m"})
        assert_close(committed(out), reference(data))
        [report] = spark_reports(cluster, str(result.job_id))
        assert report["master"] == url and report["executors"] == 1, report
        # the next job naming no master is back on the TaskExecutor's local Spark
        again = tmp_path / "again"

        def local_build(env: Any) -> None:
            orders = env.read_parquet(str(data / "orders.parquet"), name="orders")
            customers = env.read_parquet(str(data / "customers.parquet"), name="customers")
            env.spark_sql(SQL, orders=orders, customers=customers, name="join_sum").sink_to_parquet(str(again))

        result = run(cluster, local_build, "local-again")
        assert_close(committed(again), reference(data))
        [report] = spark_reports(cluster, str(result.job_id))
        assert report["master"].startswith("local"), report
    finally:
        for proc in reversed(daemons):
            os.killpg(proc.pid, 15)
        for proc in daemons:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
