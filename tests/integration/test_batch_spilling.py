"""BATCH joins and aggregations larger than their managed memory, on a real local cluster: the
TaskExecutors get a few MB of managed memory, so the shuffled hash join and the keyed
aggregation spill to ``io.tmp.dirs``. Results from Parquet files are checked row by row
against pyarrow; the subtasks report what they spilled; no spill file is left when the job
ends, and a TaskExecutor SIGKILLed while its tasks spill restarts the job with exact results
(its spill folder removed by the next attempt that spills)."""

from __future__ import annotations

import glob
import json
import os
import signal
import threading

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from click.testing import CliRunner

from tests.harness import wait_until
from tests.rest import get
from yarnflow.cli import cli
from tests.integration.test_failover_jobs import _job, _run
from yarnflow.common.states import JobStatus

pytestmark = [pytest.mark.integration]

TINY = {"taskmanager__memory__managed__size": "6 mb"}  # 3 MB a slot
RESTART = {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": "3",
           "restart-strategy.fixed-delay.delay": "200 ms"}


def _inputs(folder, orders: int, customers: int, seed: int = 5) -> tuple[str, str]:
    rng = np.random.default_rng(seed)
    os.makedirs(folder / "orders")
    ids = rng.integers(0, customers * 2, orders)  # half the orders have no customer
    ids[: orders // 4] = 7  # a skewed key: a quarter of the orders
    for i, part in enumerate(np.array_split(np.arange(orders), 4)):
        pq.write_table(pa.table({"order_id": pa.array(part, pa.int64()), "customer_id": pa.array(ids[part]),
                                 "amount": pa.array(rng.integers(1, 100, len(part)), pa.int64())}),
                       folder / "orders" / f"part-{i}.parquet", row_group_size=20_000)
    pq.write_table(pa.table({"customer_id": pa.array(np.arange(0, customers * 3, 3), pa.int64()),
                             "region": pa.array([f"r{i % 50}" for i in range(customers)])}),
                   folder / "customers.parquet", row_group_size=20_000)
    return str(folder / "orders"), str(folder / "customers.parquet")


def _expected(orders: str, customers: str) -> dict[str, tuple[int, int]]:
    """(revenue, orders) per region of a full outer join (region null for orders without a
    customer; customers without orders count one null order)."""
    o, c = pq.read_table(orders), pq.read_table(customers)
    joined = o.join(c, "customer_id", join_type="full outer")
    agg = joined.group_by("region").aggregate([("amount", "sum"), ("region", "count", pa.compute.CountOptions("all"))])
    return {r: (s, n) for r, s, n in zip(agg["region"].to_pylist(), agg["amount_sum"].to_pylist(),
                                          agg["region_count"].to_pylist())}


def _pipeline(orders: str, customers: str, out: str):  # type: ignore[no-untyped-def]
    def build(env):  # type: ignore[no-untyped-def]
        env.set_runtime_mode("BATCH")
        o = env.read_parquet(orders, name="orders")
        c = env.read_parquet(customers, name="customers")
        (o.join(c, how="full_outer").where("customer_id").equal_to("customer_id").with_hint("shuffle_hash").apply()
         .map_batches(lambda b: pa.record_batch({"region": b.column("region"), "amount": b.column("amount"),
                                                 "n": pa.array(np.ones(b.num_rows, np.int64))}), name="project")
         .key_by("region").reduce(lambda a, r: {"region": r["region"], "amount": (a["amount"] or 0) + (r["amount"] or 0),
                                                "n": a["n"] + r["n"]}, name="per_region")
         .sink_to_parquet(out))
    return build


def _committed(out: str) -> dict[str, tuple[int, int]]:
    table = pads.dataset(out, format="parquet").to_table()
    regions = table["region"].to_pylist()
    assert len(regions) == len(set(regions)), "a region was committed twice"
    return {r: (a, n) for r, a, n in zip(regions, table["amount"].to_pylist(), table["n"].to_pylist())}


def _setup(local_cluster, tmp_path, orders: int, customers: int):  # type: ignore[no-untyped-def]
    """A cluster whose slots have 3 MB of managed memory and spill under ``tmp_path/spill``; the
    inputs; the output folder."""
    spill_dir = str(tmp_path / "spill")
    cluster = local_cluster(taskexecutors=2, slots=2, io__tmp__dirs=spill_dir, **TINY)
    return cluster, spill_dir, *_inputs(tmp_path, orders=orders, customers=customers), str(tmp_path / "out")


def _spill_files(tmp: str) -> list[str]:
    return [p for p in glob.glob(f"{tmp}/yarnflow-spill/*/*") if not p.endswith("owner.json")]


@pytest.mark.timeout(180)
def test_a_shuffled_join_and_a_reduce_larger_than_managed_memory_are_exact(local_cluster, tmp_path) -> None:
    cluster, spill_dir, orders, customers, out = _setup(local_cluster, tmp_path, 400_000, 300_000)
    _run(cluster, _pipeline(orders, customers, out), "spilling", None, 2)  # raises when the job fails
    assert _committed(out) == _expected(orders, customers)
    gw = cluster.gateway()
    info = _job(gw, "spilling")
    gw.close()
    spilled = {v.name: sum(m.spilled_bytes for m in v.subtask_metrics) for v in info.vertices}
    budget = {v.name: max(m.managed_memory_bytes for m in v.subtask_metrics) for v in info.vertices}
    assert spilled["join -> project"] > 0, spilled  # the build side did not fit
    assert budget["join -> project"] == 3 << 20  # the join alone in its chain: the whole slot
    peaks = [m.managed_memory_peak for v in info.vertices for m in v.subtask_metrics]
    assert max(peaks) <= 3 << 20
    assert _spill_files(spill_dir) == []
    # what users see: the REST API's vertex metrics and yarnflow info
    details = get(f"{cluster.web_url()}/jobs/{info.job_id}")
    join = next(v for v in details["vertices"] if v["name"] == "join -> project")
    assert join["metrics"]["spilled-bytes"] == spilled["join -> project"]
    assert join["metrics"]["managed-memory-bytes"] == 2 * (3 << 20)
    shown = CliRunner().invoke(cli, ["info", "--address", cluster.address, str(info.job_id)])
    assert shown.exit_code == 0, shown.output
    assert "managed memory 3.0 MiB (peak" in shown.output and "spilled " in shown.output


@pytest.mark.timeout(240)
def test_a_taskexecutor_killed_while_spilling_restarts_the_job_with_exact_results(local_cluster, tmp_path) -> None:
    cluster, spill_dir, orders, customers, out = _setup(local_cluster, tmp_path, 600_000, 400_000)
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["result"] = _run(cluster, _pipeline(orders, customers, out), "killed-spilling",
                                     {**RESTART, "execution.batch-size": "4096"}, 2)
        except BaseException as exc:  # noqa: BLE001
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    def spilling() -> list[str]:
        assert not outcome, f"the job ended before any task spilled: {outcome}"
        return _spill_files(spill_dir)[:1]

    [first] = wait_until(spilling, 90, "no task ever spilled", interval_s=0.01)
    with open(os.path.join(os.path.dirname(first), "owner.json")) as fh:
        victim = json.load(fh)["pid"]
    dead_folder = os.path.dirname(first)
    os.kill(victim, signal.SIGKILL)
    thread.join(200)
    assert "result" in outcome, outcome
    gw = cluster.gateway()
    info = _job(gw, "killed-spilling")
    gw.close()
    assert info.status == JobStatus.FINISHED
    assert info.failure_history, "the kill restarted nothing"
    assert _committed(out) == _expected(orders, customers)
    assert _spill_files(spill_dir) == []
    assert not os.path.exists(dead_folder)  # the killed TaskExecutor's files, removed by an attempt after it


@pytest.mark.timeout(180)
def test_a_sort_merge_join_and_a_sort_larger_than_managed_memory_are_exact(local_cluster, tmp_path) -> None:
    cluster, spill_dir, orders, customers, out = _setup(local_cluster, tmp_path, 300_000, 200_000)
    top = str(tmp_path / "top")

    def build(env):  # type: ignore[no-untyped-def]
        env.set_runtime_mode("BATCH")
        o = env.read_parquet(orders, name="orders")
        c = env.read_parquet(customers, name="customers")
        joined = o.join(c, how="left_outer").where("customer_id").equal_to("customer_id").with_hint("sort_merge").apply()
        joined.sort_by("amount", "order_id", ascending=[False, True], name="by_amount").sink_to_parquet(out)
        joined.sort_by("order_id", limit=1000, name="first").sink_to_parquet(top)

    _run(cluster, build, "sorted", None, 2)
    table = pads.dataset(out, format="parquet").to_table()
    assert len(os.listdir(out)) == 1  # what follows the sort keeps its parallelism: one file, in order
    o, c = pq.read_table(orders), pq.read_table(customers)
    want = o.join(c, "customer_id", join_type="left outer").sort_by([("amount", "descending"), ("order_id", "ascending")])
    assert table.num_rows == o.num_rows
    assert table["order_id"].to_pylist() == want["order_id"].to_pylist()
    assert table["region"].to_pylist() == want["region"].to_pylist()
    assert pads.dataset(top, format="parquet").to_table()["order_id"].to_pylist() == list(range(1000))
    gw = cluster.gateway()
    info = _job(gw, "sorted")
    gw.close()
    spilled = {v.name: sum(m.spilled_bytes for m in v.subtask_metrics) for v in info.vertices}
    assert spilled["join"] > 0 and spilled["by_amount -> parquet_sink"] > 0, spilled
    assert _spill_files(spill_dir) == []
