"""The adaptive batch scheduler: the parallelism rule, the compiled JobGraph, the JobMaster
deciding a vertex's parallelism from its producers' bytes (only the decided subtasks run, each
reading its range of subpartitions, and the others stay out of failover), and a consumer
reading a range of a blocking partition's subpartitions as one channel."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

import yarnflow
from yarnflow.am.jobmaster.actions import DeployTask, JobReachedTerminalState
from yarnflow.am.jobmaster.auto_parallelism import decide_parallelism
from yarnflow.common.ids import ExecutionAttemptID, JobVertexID, ResultPartitionID
from yarnflow.common.messages import (
    ErrorInfo,
    JobEdge,
    JobGraph,
    JobVertex,
    TaskExecutionStateUpdate,
    TaskMetrics,
)
from yarnflow.common.states import ExchangeMode, ExecutionState, JobStatus, Partitioner
from yarnflow.compiler import compile_job
from yarnflow.worker.elements import END_OF_PARTITION, EndOfPartition
from yarnflow.worker.network.gate import InputGate, LocalInputChannel, SequenceChannel
from yarnflow.worker.network.partition import ResultPartitionManager

from tests.unit.test_job_master_core import JOB, Driver

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

S = ExecutionState
MB = 2**20


# ---- the rule --------------------------------------------------------------------------------

@pytest.mark.parametrize("input_bytes, broadcast, expected", [
    (0, 0, 1),                      # nothing to read: the least
    (1 * MB, 0, 1),
    (16 * MB, 0, 1),                # exactly one task's volume
    (16 * MB + 1, 0, 2),
    (40 * MB, 0, 3),
    (200 * MB, 0, 8),               # capped at the upper bound
    (24 * MB, 4 * MB, 2),           # 24 MB over tasks of 16 - 4 MB
    (24 * MB, 100 * MB, 3),         # broadcast counts at most half a task's volume: 24 / 8
])
def test_parallelism_follows_the_bytes_between_the_bounds(input_bytes: int, broadcast: int, expected: int) -> None:
    assert decide_parallelism(input_bytes, broadcast, 16 * MB, 1, 8) == expected


def test_min_parallelism_is_kept_unless_above_the_bound() -> None:
    assert decide_parallelism(0, 0, 16 * MB, 3, 8) == 3
    assert decide_parallelism(0, 0, 16 * MB, 12, 8) == 8


# ---- compiling ---------------------------------------------------------------------------------

def _auto_env(**conf: str) -> yarnflow.StreamExecutionEnvironment:
    e = yarnflow.StreamExecutionEnvironment(parallelism=4, max_parallelism=128, runtime_mode="BATCH")
    e.conf.update({"execution.batch.adaptive.auto-parallelism.enabled": "true", **conf})
    return e


def test_operators_given_no_parallelism_get_it_decided_sources_the_default_source_parallelism(tmp_path: Any) -> None:
    e = _auto_env(**{"execution.batch.adaptive.auto-parallelism.max-parallelism": "6",
                     "execution.batch.adaptive.auto-parallelism.default-source-parallelism": "3"})
    rows = e.read_parquet(str(tmp_path / "in")).map(lambda r: r, name="m")  # follows its source: chained
    rows.key_by("k").sum("v").sink_to_parquet(str(tmp_path / "sums"))
    rows.rebalance().map(lambda r: r, name="fixed").set_parallelism(2).sink_to_parquet(str(tmp_path / "copy"))
    jg = compile_job(e, "auto").job_graph
    by_head = {v.operator_names[0]: v for v in jg.vertices}
    source = next(v for v in jg.vertices if v.is_source)
    assert (source.parallelism, source.dynamic_parallelism, source.operator_names) == (3, False, ["read_parquet", "m"])
    [agg] = [v for v in jg.vertices if v.dynamic_parallelism]
    # its upper bound is both its parallelism and its max parallelism: one subpartition each
    assert (agg.parallelism, agg.max_parallelism) == (6, 6)
    # the sink given no parallelism follows the operator it is chained to
    assert by_head["fixed"].operator_names == ["fixed", "parquet_sink"]
    assert not by_head["fixed"].dynamic_parallelism and by_head["fixed"].parallelism == 2
    assert all(e.exchange_mode == ExchangeMode.BLOCKING for e in jg.edges)


def test_the_upper_bound_defaults_to_the_job_parallelism_and_off_nothing_is_decided(tmp_path: Any) -> None:
    e = _auto_env()
    e.read_parquet(str(tmp_path / "in")).key_by("k").sum("v").sink_to_parquet(str(tmp_path / "out"))
    jg = compile_job(e, "auto").job_graph
    assert sorted((v.parallelism, v.dynamic_parallelism) for v in jg.vertices) == [(4, False), (4, True)]
    off = yarnflow.StreamExecutionEnvironment(parallelism=4, runtime_mode="BATCH")
    off.read_parquet(str(tmp_path / "in")).key_by("k").sum("v").sink_to_parquet(str(tmp_path / "out"))
    assert not any(v.dynamic_parallelism for v in compile_job(off, "static").job_graph.vertices)
    streaming = yarnflow.StreamExecutionEnvironment(parallelism=4, runtime_mode="STREAMING")
    streaming.conf["execution.batch.adaptive.auto-parallelism.enabled"] = "true"
    streaming.from_collection([{"k": 1, "v": 1}]).key_by("k").sum("v").collect()
    assert not any(v.dynamic_parallelism for v in compile_job(streaming, "stream").job_graph.vertices)


def test_a_min_parallelism_above_the_bound_is_refused(tmp_path: Any) -> None:
    e = _auto_env(**{"execution.batch.adaptive.auto-parallelism.min-parallelism": "9"})
    e.read_parquet(str(tmp_path / "in")).key_by("k").sum("v").sink_to_parquet(str(tmp_path / "out"))
    with pytest.raises(yarnflow.JobDefinitionError, match="min-parallelism"):
        compile_job(e, "auto")


# ---- the JobMaster -----------------------------------------------------------------------------

def _graph(partitioner: Partitioner = Partitioner.HASH) -> JobGraph:
    """src (2) --partitioner--> agg (decided, at most 4) --rebalance--> out (1), all blocking."""
    src = JobVertex(JobVertexID("v-src"), "src", 2, 128, ["src"], is_source=True)
    agg = JobVertex(JobVertexID("v-agg"), "agg", 4, 4, ["agg"], dynamic_parallelism=True)
    out = JobVertex(JobVertexID("v-out"), "out", 1, 128, ["out"], is_sink=True)
    keys = ["k"] if partitioner == Partitioner.HASH else []
    return JobGraph(JOB, "auto", [src, agg, out],
                    [JobEdge(src.vertex_id, agg.vertex_id, partitioner, ExchangeMode.BLOCKING, keys),
                     JobEdge(agg.vertex_id, out.vertex_id, Partitioner.REBALANCE, ExchangeMode.BLOCKING)],
                    artifact_uri="file:///job.zip", runtime_mode="BATCH")


def _finish(d: Driver, deploy: DeployTask, result_bytes: int = 0) -> None:
    metrics = TaskMetrics(bytes_out=result_bytes, result_bytes=[result_bytes])
    d.core.task_state_changed(TaskExecutionStateUpdate(JOB, deploy.attempt_id, S.FINISHED, metrics=metrics))
    d.drain()


def _deploys_of(d: Driver, vertex: str, actions: list[Any] | None = None) -> list[DeployTask]:
    return [a for a in d.of(DeployTask, actions) if a.tdd.vertex_id == f"v-{vertex}"]


def _run_sources(d: Driver, bytes_each: int) -> list[DeployTask]:
    d.start()
    sources = _deploys_of(d, "src", d.offer_all())
    assert len(sources) == 2 and not _deploys_of(d, "agg")  # the consumer waits for its inputs
    d.run_all(sources)
    for s in sources:
        _finish(d, s, bytes_each)
    d.offer_all()
    return _deploys_of(d, "agg")


@pytest.mark.parametrize("bytes_each, parallelism, ranges", [
    (100_000, 1, [(0, 4)]),
    (12 * 2**20, 2, [(0, 2), (2, 4)]),
    (40 * 2**20, 4, [(0, 1), (1, 2), (2, 3), (3, 4)]),
])
def test_the_consumer_runs_at_the_parallelism_its_input_bytes_call_for(
        bytes_each: int, parallelism: int, ranges: list[tuple[int, int]]) -> None:
    d = Driver(_graph())
    aggs = _run_sources(d, bytes_each)
    assert len(aggs) == parallelism
    src_tdd = _deploys_of(d, "src")[0].tdd
    [partition] = src_tdd.result_partitions  # one subpartition per possible consumer subtask (key group)
    assert (partition.num_subpartitions, partition.consumer_max_parallelism) == (4, 4)
    for i, deploy in enumerate(sorted(aggs, key=lambda a: a.tdd.subtask_index)):
        tdd = deploy.tdd
        [gate] = tdd.input_gates
        assert (tdd.parallelism, tdd.max_parallelism) == (parallelism, 4)
        assert (gate.subpartitions.start, gate.subpartitions.stop) == ranges[i]
        assert len(gate.channels) == 2
    [agg_status] = [v for v in d.core.status_info().vertices if v.name == "agg"]
    assert agg_status.parallelism == parallelism and len(agg_status.subtask_states) == parallelism
    assert f"agg: parallelism {parallelism} of at most 4" in d.core.status_info().scaling
    d.run_all(aggs)
    for a in aggs:
        _finish(d, a, 1000)
    d.offer_all()
    [out] = _deploys_of(d, "out")
    assert len(out.tdd.input_gates[0].channels) == parallelism  # only the subtasks that ran
    d.run_all([out])
    _finish(d, out)
    [end] = d.of(JobReachedTerminalState)
    assert end.status == JobStatus.FINISHED


def test_before_its_inputs_are_complete_the_status_says_it_waits() -> None:
    d = Driver(_graph())
    d.start()
    assert "waiting for their inputs: agg" in d.core.status_info().scaling


def test_a_broadcast_input_is_written_once_and_read_whole_by_every_subtask() -> None:
    d = Driver(_graph(Partitioner.BROADCAST))
    aggs = _run_sources(d, 3 * 2**20)  # 6 MB broadcast: counted at most as 8 MB: one task
    assert len(aggs) == 1
    [partition] = _deploys_of(d, "src")[0].tdd.result_partitions
    assert partition.num_subpartitions == 1
    assert list(aggs[0].tdd.input_gates[0].subpartitions) == [0]


@pytest.mark.parametrize("strategy", ["region", "full"])
def test_a_failure_after_the_decision_restarts_only_subtasks_that_run(strategy: str) -> None:
    d = Driver(_graph(), restart_strategy_type="fixed-delay", restart_strategy_fixed_delay_attempts="3",
               restart_strategy_fixed_delay_delay="1 s", jobmanager_execution_failover_strategy=strategy)
    aggs = _run_sources(d, 12 * 2**20)
    assert len(aggs) == 2
    d.run_all(aggs)
    before = len(d.of(DeployTask))
    d.report(aggs[0], S.FAILED, ErrorInfo("RuntimeError", "boom"))
    if d.execution(aggs[1]).state == S.CANCELING:
        d.report(aggs[1], S.CANCELED)
    d.advance(1000)
    d.offer_all()
    if strategy == "full":  # the sources run again (their bytes change); the decision stands
        sources = d.of(DeployTask)[before:]
        assert sorted(t.tdd.vertex_id for t in sources) == ["v-src", "v-src"]
        d.run_all(sources)
        for t in sources:
            _finish(d, t, 40 * 2**20)
        d.offer_all()
    again = [t for t in d.of(DeployTask)[before:] if t.tdd.vertex_id == "v-agg"]
    expected = [0] if strategy == "region" else [0, 1]
    assert sorted(t.tdd.subtask_index for t in again) == expected
    assert all(t.tdd.parallelism == 2 for t in again)
    d.run_all(again)
    for t in again:
        _finish(d, t, 100)
    if strategy == "region":
        _finish(d, aggs[1], 100)
    d.offer_all()
    [out] = _deploys_of(d, "out")
    assert len(out.tdd.input_gates[0].channels) == 2
    d.run_all([out])
    _finish(d, out)
    assert d.of(JobReachedTerminalState)[-1].status == JobStatus.FINISHED
    assert all(len(v.subtask_states) == v.parallelism for v in d.core.status_info().vertices)


def test_the_decision_is_made_once() -> None:
    d = Driver(_graph())
    _run_sources(d, 100)
    with pytest.raises(Exception, match="decided already"):
        d.core.graph.decide("v-agg", 2)


# ---- reading a range of subpartitions ------------------------------------------------------------

def _batch(value: int) -> pa.RecordBatch:
    return pa.record_batch({"v": pa.array([value], pa.int64())})


def test_a_range_of_subpartitions_is_read_as_one_channel_ending_once(tmp_path: Any) -> None:
    manager = ResultPartitionManager(str(tmp_path))
    partition = manager.create_blocking(ResultPartitionID(f"job.{ExecutionAttemptID.generate()}.0"), 4)
    for i, sub in enumerate(partition.subpartitions):
        if i != 2:  # subpartition 2 gets no rows: no file at all
            sub.add(_batch(i))
            sub.add(_batch(10 + i))
        sub.add(END_OF_PARTITION)
    gate = InputGate(1)
    gate.set_channel(0, SequenceChannel(range(1, 4), lambda i: LocalInputChannel(manager, partition.partition_id, i)))
    got: list[Any] = []
    while True:
        polled = gate.poll(2.0)
        assert polled is not None, "the channel stalled"
        got.append(polled[1])
        if isinstance(polled[1], EndOfPartition):
            break
    assert [b.column(0)[0].as_py() for b in got[:-1]] == [1, 11, 3, 13]
    assert gate.finished and gate.poll(0.05) is None
    manager.close()
