"""The BATCH plan the compiler makes: a broadcast join of a small input chained onto the big
input's source (no exchange of the big side), a shuffled hash join building the smaller input,
hints that override, join types that cannot broadcast, local pre-aggregation before a keyed
sum, and the managed-memory fractions of the operators that share a slot."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import yarnflow
from yarnflow import executors
from yarnflow.common.errors import JobDefinitionError
from yarnflow.common.states import Partitioner
from yarnflow.compiler import compile_job
from yarnflow.worker.operators.batch.aggregate import LocalKeyedAggregate
from yarnflow.worker.operators.batch.hash_join import HashJoin
from yarnflow.worker.operators.keyed import KeyedAggregate

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


@pytest.fixture
def files(tmp_path):  # type: ignore[no-untyped-def]
    big = tmp_path / "orders"
    big.mkdir()
    for i in range(3):
        pq.write_table(pa.table({"customer_id": list(range(i, 30_000, 3)), "amount": [1.0] * 10_000}),
                       big / f"part-{i}.parquet")
    pq.write_table(pa.table({"customer_id": list(range(100)), "region": ["r"] * 100}), tmp_path / "customers.parquet")
    return str(big), str(tmp_path / "customers.parquet")


def compiled(build, conf=None):  # type: ignore[no-untyped-def]
    executors.set_context(executors.ClusterContext("", conf or {}, progress=False))
    try:
        env = yarnflow.StreamExecutionEnvironment(parallelism=2, runtime_mode="BATCH")
        build(env)
        return compile_job(env, "plan")
    finally:
        executors.set_context(None)


def vertex(job, *names):  # type: ignore[no-untyped-def]
    return next(v for v in job.job_graph.vertices if tuple(v.operator_names) == names)


def join_of(job) -> HashJoin:  # type: ignore[no-untyped-def]
    return next(op for chain in job.chains.values() for op in chain if isinstance(op, HashJoin))


def test_a_small_input_is_broadcast_to_a_join_chained_onto_the_big_source(files) -> None:
    big, small = files

    def build(env):  # type: ignore[no-untyped-def]
        orders = env.read_parquet(big, name="orders")
        customers = env.read_parquet(small, name="customers")
        orders.join(customers).where("customer_id").equal_to("customer_id").apply().collect()

    job = compiled(build)
    chain = vertex(job, "orders", "join", "collect")  # the big side is never exchanged
    customers = vertex(job, "customers")
    [edge] = job.job_graph.edges
    assert (edge.source_vertex_id, edge.target_vertex_id) == (customers.vertex_id, chain.vertex_id)
    assert edge.partitioner == Partitioner.BROADCAST
    join = join_of(job)
    assert join.build_input == 1 and join.chain_input == 0 and join.vertex_inputs == {edge.input_index: 1}
    # the vertices come in an order where the build side runs first
    assert [v.vertex_id for v in job.job_graph.vertices].index(customers.vertex_id) == 0


def test_above_the_threshold_both_inputs_are_shuffled_and_the_smaller_is_built(files) -> None:
    big, small = files

    def build(env):  # type: ignore[no-untyped-def]
        customers = env.read_parquet(small, name="customers")
        orders = env.read_parquet(big, name="orders")
        customers.join(orders, how="right_outer").where("customer_id").equal_to("customer_id").apply().collect()

    job = compiled(build, {"table.optimizer.join.broadcast-threshold": "1 kb"})
    assert {e.partitioner for e in job.job_graph.edges} == {Partitioner.HASH}
    assert join_of(job).build_input == 0  # the customers, the smaller


@pytest.mark.parametrize("how, build", [("left_outer", 1), ("right_outer", 0), ("left_semi", 1), ("inner", 1)])
def test_only_an_input_whose_unmatched_rows_are_not_output_is_broadcast(files, how: str, build: int) -> None:
    big, small = files

    def pipeline(env):  # type: ignore[no-untyped-def]
        a = env.read_parquet(small, name="a")
        b = env.read_parquet(small, name="b")
        a.join(b, how=how).where("customer_id").equal_to("customer_id").with_hint("broadcast").apply().collect()

    job = compiled(pipeline)
    assert join_of(job).build_input == build
    assert Partitioner.BROADCAST in {e.partitioner for e in job.job_graph.edges}


def test_a_full_outer_join_cannot_be_broadcast(files) -> None:
    big, small = files

    def build(env):  # type: ignore[no-untyped-def]
        a, b = env.read_parquet(big), env.read_parquet(small)
        a.join(b, how="full_outer").where("customer_id").equal_to("customer_id").with_hint("broadcast").apply().collect()

    with pytest.raises(JobDefinitionError, match="full_outer join outputs the unmatched rows of both inputs"):
        compiled(build)


def test_a_shuffle_hint_keeps_both_inputs_hashed(files) -> None:
    big, small = files

    def build(env):  # type: ignore[no-untyped-def]
        a, b = env.read_parquet(big), env.read_parquet(small)
        a.join(b).where("customer_id").equal_to("customer_id").with_hint("shuffle_hash").apply().collect()

    job = compiled(build)
    assert {e.partitioner for e in job.job_graph.edges} == {Partitioner.HASH}


def test_an_unknown_hint_is_refused() -> None:
    env = yarnflow.StreamExecutionEnvironment(parallelism=1)
    a = env.from_collection([{"k": 1}])
    with pytest.raises(JobDefinitionError, match="join hint 'fast'"):
        a.join(a).where("k").equal_to("k").with_hint("fast")


def test_a_keyed_sum_pre_aggregates_before_its_exchange_and_operators_share_their_slot(files) -> None:
    big, small = files

    def build(env):  # type: ignore[no-untyped-def]
        orders = env.read_parquet(big, name="orders")
        customers = env.read_parquet(small, name="customers")
        (orders.join(customers).where("customer_id").equal_to("customer_id").apply()
         .key_by("region").sum("amount", name="sum").collect())

    job = compiled(build)
    chain = job.chains[vertex(job, "orders", "join", "sum (local)").vertex_id]
    local = chain[-1]
    assert isinstance(local, LocalKeyedAggregate) and local.of == "sum"
    final = job.chains[vertex(job, "sum", "collect").vertex_id][0]
    assert isinstance(final, KeyedAggregate) and final.partial_input
    # join and local aggregation run in one slot at once: half each; the final sum has its own
    assert (chain[1].memory_fraction, local.memory_fraction, final.memory_fraction) == (0.5, 0.5, 1.0)


def test_no_pre_aggregation_when_the_input_feeds_something_else() -> None:
    def build(env):  # type: ignore[no-untyped-def]
        rows = env.from_collection([{"k": 1, "v": 2}])
        rows.key_by("k").sum("v").collect()
        rows.collect()

    job = compiled(build)
    assert not any(isinstance(op, LocalKeyedAggregate) for chain in job.chains.values() for op in chain)


def test_a_streaming_keyed_aggregation_pre_aggregates_each_batch_before_its_exchange() -> None:
    executors.set_context(executors.ClusterContext("", {}, progress=False))
    try:
        env = yarnflow.StreamExecutionEnvironment(parallelism=2, runtime_mode="STREAMING")
        env.from_collection([{"k": 1, "v": 2}]).key_by("k").sum("v").collect()
        job = compile_job(env, "s")
    finally:
        executors.set_context(None)
    ops = [op for chain in job.chains.values() for op in chain]
    [local] = [op for op in ops if isinstance(op, LocalKeyedAggregate)]
    [agg] = [op for op in ops if isinstance(op, KeyedAggregate)]
    assert agg.partial_input and local.of == agg.name


def test_a_spark_stage_reads_a_plain_parquet_source_itself_and_other_inputs_from_files_written_upstream(files) -> None:
    from yarnflow.common.states import ExchangeMode
    from yarnflow.worker.operators.spark import SparkStage

    big, small = files

    def build(env):  # type: ignore[no-untyped-def]
        orders = env.read_parquet(big, columns=["customer_id", "amount"], name="orders").filter(
            lambda r: r["amount"] > 0, name="positive")
        customers = env.read_parquet(small, name="customers")
        env.spark_sql("SELECT 1", orders=orders, customers=customers, name="stage").collect()

    job = compiled(build)
    names = {tuple(v.operator_names): v for v in job.job_graph.vertices}
    assert set(names) == {("orders", "positive", "orders -> stage"), ("stage",), ("stage output", "collect")}
    stage = job.chains[names[("stage",)].vertex_id][0]
    assert isinstance(stage, SparkStage) and stage.direct == {"customers": {"path": small, "columns": None}}
    modes = {(e.source_vertex_id, e.target_vertex_id): (e.partitioner, e.exchange_mode) for e in job.job_graph.edges}
    assert modes == {  # the stage's inputs and output are file names stored beside the files
        (names[("orders", "positive", "orders -> stage")].vertex_id, names[("stage",)].vertex_id):
            (Partitioner.REBALANCE, ExchangeMode.BLOCKING_PERSISTENT),
        (names[("stage",)].vertex_id, names[("stage output", "collect")].vertex_id):
            (Partitioner.REBALANCE, ExchangeMode.BLOCKING_PERSISTENT)}


def test_a_parquet_source_that_feeds_something_else_too_is_written_for_spark(files) -> None:
    big, small = files

    def build(env):  # type: ignore[no-untyped-def]
        customers = env.read_parquet(small, name="customers")
        customers.spark(lambda df: df, name="stage").collect()
        customers.collect(name="also")

    job = compiled(build)
    stage = next(op for chain in job.chains.values() for op in chain if op.kind == "spark")
    assert stage.direct == {}
    assert any("input -> stage" in v.operator_names for v in job.job_graph.vertices)
