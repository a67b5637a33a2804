"""Compiling pipelines into a JobGraph (chaining, edges, sharing groups, runtime mode, errors)
and packaging the operator chains into the content-addressed job artifact."""

from __future__ import annotations

import hashlib
import io
import threading
import zipfile
from pathlib import Path
from typing import Any

import cloudpickle
import pyarrow as pa
import pytest

import yarnflow
from yarnflow.common.errors import JobDefinitionError
from yarnflow.common.messages import JobGraph, JobVertex
from yarnflow.common.states import ExchangeMode, Partitioner
from yarnflow.compiler import CompiledJob, compile_job
from yarnflow.packaging import build_artifact, upload_artifact
from yarnflow.common.artifacts import chain_entry
from yarnflow.worker.operators.keyed import KeyedAggregate
from yarnflow.worker.operators.sinks import CollectSink
from yarnflow.worker.operators.sources import CollectionSource
from yarnflow.worker.operators.transforms import RowFilter, RowFlatMap, RowMap

from tests.harness import RecordingOutput, runtime_context

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

ROWS = [{"word": w, "n": i} for i, w in enumerate(["a", "b", "a", "c"])]


def env(parallelism: int = 2, max_parallelism: int = 16, mode: str = "STREAMING") -> yarnflow.StreamExecutionEnvironment:
    return yarnflow.StreamExecutionEnvironment(parallelism=parallelism, max_parallelism=max_parallelism,
                                               runtime_mode=mode)


def by_names(jg: JobGraph) -> dict[tuple[str, ...], JobVertex]:
    return {tuple(v.operator_names): v for v in jg.vertices}


def edge_between(jg: JobGraph, up: JobVertex, down: JobVertex):  # type: ignore[no-untyped-def]
    [edge] = [e for e in jg.edges if e.source_vertex_id == up.vertex_id and e.target_vertex_id == down.vertex_id]
    return edge


# ---- chaining -------------------------------------------------------------------------------

def test_stateless_operators_chain_behind_the_source() -> None:
    e = env(parallelism=2, max_parallelism=16)
    (e.from_collection(ROWS, name="words")
     .map(lambda r: r, name="m").filter(lambda r: True, name="f").flat_map(lambda r: [r], name="fm")
     .collect())
    job = compile_job(e, "chain")
    jg = job.job_graph
    assert jg.name == "chain" and jg.edges == []
    [v] = jg.vertices
    assert v.operator_names == ["words", "m", "f", "fm", "collect"]
    assert v.name == "words -> m -> f -> fm -> collect"
    assert (v.parallelism, v.max_parallelism, v.is_source, v.is_sink) == (2, 16, True, True)
    assert v.slot_sharing_group == "default"
    ops = job.chains[v.vertex_id]
    assert [type(op) for op in ops] == [CollectionSource, RowMap, RowFilter, RowFlatMap, CollectSink]
    assert list(job.collect_sinks.values()) == [ops[-1]]
    assert job.num_slots == 2


def test_key_by_breaks_the_chain_with_a_hash_edge() -> None:
    e = env()
    e.from_collection(ROWS).map(lambda r: r).key_by("word", "n").sum("n").collect()
    job = compile_job(e, "keyed")
    jg = job.job_graph
    names = by_names(jg)
    # a STREAMING keyed sum combines each batch before the exchange (planner.plan_streaming)
    src, agg = names[("collection", "map", "sum(n) (local)")], names[("sum(n)", "collect")]
    assert [v.vertex_id for v in jg.vertices] == [src.vertex_id, agg.vertex_id]  # topological order
    [edge] = jg.edges
    assert edge == edge_between(jg, src, agg)
    assert edge.partitioner == Partitioner.HASH and edge.key_columns == ["word", "n"]
    assert edge.exchange_mode == ExchangeMode.PIPELINED and edge.input_index == 0
    assert (src.is_source, src.is_sink, agg.is_source, agg.is_sink) == (True, False, False, True)
    head = job.chains[agg.vertex_id][0]
    assert isinstance(head, KeyedAggregate) and head.keys == ["word", "n"]


def test_different_parallelism_gives_a_rebalance_edge() -> None:
    e = env(parallelism=2)
    e.from_collection(ROWS).map(lambda r: r, name="wide").set_parallelism(3).filter(lambda r: True).collect()
    jg = compile_job(e, "rebalance").job_graph
    names = by_names(jg)
    src, wide, rest = names[("collection",)], names[("wide",)], names[("filter", "collect")]
    assert (src.parallelism, wide.parallelism, rest.parallelism) == (2, 3, 2)
    assert edge_between(jg, src, wide).partitioner == Partitioner.REBALANCE
    assert edge_between(jg, wide, rest).partitioner == Partitioner.REBALANCE
    assert len(jg.edges) == 2


def test_explicit_rebalance_is_not_chained() -> None:
    e = env()
    e.from_collection(ROWS).rebalance().map(lambda r: r).collect()
    jg = compile_job(e, "rebalance").job_graph
    names = by_names(jg)
    assert edge_between(jg, names[("collection",)], names[("map", "collect")]).partitioner == Partitioner.REBALANCE


def test_disable_chaining_isolates_the_operator() -> None:
    e = env()
    e.from_collection(ROWS).map(lambda r: r).disable_chaining().filter(lambda r: True).collect()
    jg = compile_job(e, "unchained").job_graph
    names = by_names(jg)
    assert set(names) == {("collection",), ("map",), ("filter", "collect")}
    assert edge_between(jg, names[("collection",)], names[("map",)]).partitioner == Partitioner.FORWARD
    assert edge_between(jg, names[("map",)], names[("filter", "collect")]).partitioner == Partitioner.FORWARD


def test_an_operator_feeding_two_consumers_ends_its_chain() -> None:
    e = env()
    src = e.from_collection(ROWS).map(lambda r: r, name="shared")
    src.filter(lambda r: True, name="left").collect()
    src.filter(lambda r: False, name="right").collect()
    jg = compile_job(e, "fan-out").job_graph
    names = by_names(jg)
    shared = names[("collection", "shared")]
    assert set(names) == {("collection", "shared"), ("left", "collect"), ("right", "collect")}
    assert sorted(e.target_vertex_id for e in jg.edges if e.source_vertex_id == shared.vertex_id) == sorted(
        [names[("left", "collect")].vertex_id, names[("right", "collect")].vertex_id])
    assert all(edge.partitioner == Partitioner.FORWARD for edge in jg.edges)


def test_slot_sharing_group_separates_vertices() -> None:
    e = env(parallelism=2)
    (e.from_collection(ROWS).map(lambda r: r).slot_sharing_group("heavy")
     .filter(lambda r: True).collect())  # created after: inherits "heavy"
    job = compile_job(e, "groups")
    names = by_names(job.job_graph)
    src, heavy = names[("collection",)], names[("map", "filter", "collect")]
    assert (src.slot_sharing_group, heavy.slot_sharing_group) == ("default", "heavy")
    assert edge_between(job.job_graph, src, heavy).partitioner == Partitioner.FORWARD
    assert job.num_slots == 4  # two groups of parallelism 2


def test_vertex_ids_and_job_ids_are_fresh_per_compilation() -> None:
    e = env()
    e.from_collection(ROWS).key_by("word").count().collect()
    a, b = compile_job(e, "a").job_graph, compile_job(e, "b").job_graph
    assert a.job_id != b.job_id
    assert {v.vertex_id for v in a.vertices}.isdisjoint({v.vertex_id for v in b.vertices})
    assert len({v.vertex_id for v in a.vertices}) == 2


# ---- runtime mode ---------------------------------------------------------------------------

def test_automatic_mode_is_batch_for_bounded_sources() -> None:
    e = env(mode="automatic")
    assert e.runtime_mode == "AUTOMATIC"
    e.from_collection(ROWS).collect()
    assert compile_job(e, "bounded").job_graph.runtime_mode == "BATCH"


def test_automatic_mode_is_streaming_for_unbounded_sources() -> None:
    e = env(mode="AUTOMATIC")
    e.from_generator(lambda start, n: {"i": list(range(start, start + n))}).collect()
    assert compile_job(e, "unbounded").job_graph.runtime_mode == "STREAMING"


def test_explicit_modes_are_kept_and_batch_needs_bounded_sources() -> None:
    e = env(mode="STREAMING")
    e.from_collection(ROWS).collect()
    assert compile_job(e, "s").job_graph.runtime_mode == "STREAMING"
    e = env(mode="BATCH")
    e.from_collection(ROWS).collect()
    assert compile_job(e, "b").job_graph.runtime_mode == "BATCH"
    e = env(mode="BATCH")
    e.from_generator(lambda start, n: {"i": list(range(start, start + n))}).collect()
    with pytest.raises(JobDefinitionError, match="bounded"):
        compile_job(e, "unbounded batch")


# ---- errors ---------------------------------------------------------------------------------

def test_empty_pipeline_is_refused() -> None:
    with pytest.raises(JobDefinitionError, match="empty"):
        compile_job(env(), "nothing")


def test_pipeline_without_sink_is_refused() -> None:
    e = env()
    e.from_collection(ROWS).map(lambda r: r)
    with pytest.raises(JobDefinitionError, match="no sink"):
        compile_job(e, "dangling")


def test_parallelism_above_max_parallelism_is_refused() -> None:
    e = env(parallelism=4, max_parallelism=2)
    e.from_collection(ROWS).collect()
    with pytest.raises(JobDefinitionError, match="parallelism 4 exceeds the max parallelism 2"):
        compile_job(e, "too wide")
    e = env(parallelism=2, max_parallelism=8)
    e.from_collection(ROWS).map(lambda r: r, name="hot").set_parallelism(9).collect()
    with pytest.raises(JobDefinitionError, match="'hot'"):
        compile_job(e, "too wide")


def test_key_by_needs_columns() -> None:
    stream = env().from_collection(ROWS)
    with pytest.raises(JobDefinitionError, match="column"):
        stream.key_by()
    with pytest.raises(JobDefinitionError):
        stream.key_by("")
    with pytest.raises(JobDefinitionError):
        stream.set_parallelism(0)


# ---- packaging ------------------------------------------------------------------------------

def _keyed_job() -> CompiledJob:
    factor = 10  # captured by value in the pickled lambda
    e = env()
    (e.from_collection(ROWS).map(lambda r: {"word": r["word"], "n": r["n"] * factor})
     .filter(lambda r: r["word"] != "c").key_by("word").sum("n").collect())
    return compile_job(e, "packaged")


def test_artifact_holds_one_loadable_chain_per_vertex(tmp_path: Path) -> None:
    job = _keyed_job()
    job_file = tmp_path / "my_job.py"
    job_file.write_text("print('hello')\n")
    data = build_artifact(job, str(job_file))
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = set(zf.namelist())
        assert {chain_entry(v.vertex_id) for v in job.job_graph.vertices} <= names
        assert "src/my_job.py" in names and zf.read("src/my_job.py") == b"print('hello')\n"
        chains = {v.vertex_id: cloudpickle.loads(zf.read(chain_entry(v.vertex_id))) for v in job.job_graph.vertices}
    src_vertex, agg_vertex = job.job_graph.vertices
    assert [op.name for op in chains[src_vertex.vertex_id]] == src_vertex.operator_names
    assert [op.name for op in chains[agg_vertex.vertex_id]] == agg_vertex.operator_names

    source, mapper, keep, _local_sum = chains[src_vertex.vertex_id]
    assert isinstance(source, CollectionSource) and source.table.num_rows == 4
    assert mapper is not job.chains[src_vertex.vertex_id][1]  # a real copy, not the same object
    out = RecordingOutput()
    for op in (mapper, keep):
        op.setup(runtime_context(job_id="job", task_name="task", max_parallelism=16), out)
    mapper.output = _Chain(keep)
    mapper.process_batch(pa.RecordBatch.from_pylist(ROWS))
    assert pa.Table.from_batches(out.batches).to_pylist() == [
        {"word": "a", "n": 0}, {"word": "b", "n": 10}, {"word": "a", "n": 20}]
    assert [e[0] for e in out.events] == ["data"]  # and no side output


class _Chain:
    """Output that feeds the next operator of a chain."""

    def __init__(self, op: Any) -> None:
        self.op = op

    def collect(self, batch: pa.RecordBatch) -> None:
        self.op.process_batch(batch)

    def collect_side(self, tag: str, batch: pa.RecordBatch) -> None:
        raise AssertionError("no side output expected")

    def emit_watermark(self, watermark: Any) -> None:
        pass


def test_unpicklable_operator_is_a_job_definition_error() -> None:
    lock = threading.Lock()
    e = env()
    e.from_collection(ROWS).map(lambda r: (lock, r)[1], name="locked").collect()
    with pytest.raises(JobDefinitionError, match="cannot serialise the operators .*locked"):
        build_artifact(compile_job(e, "bad"), None)


def test_upload_is_content_addressed_and_idempotent(tmp_path: Path) -> None:
    job = _keyed_job()
    storage = "file://" + str(tmp_path)
    uploaded = upload_artifact(job, None, storage)
    jg = uploaded.job_graph
    files = list((tmp_path / "artifacts").iterdir())
    assert [f.name for f in files] == [f"{jg.artifact_sha256}.zip"]
    assert hashlib.sha256(files[0].read_bytes()).hexdigest() == jg.artifact_sha256
    assert jg.artifact_uri == f"{storage}/artifacts/{jg.artifact_sha256}.zip"
    assert (jg.job_id, jg.vertices, jg.edges) == (job.job_graph.job_id, job.job_graph.vertices, job.job_graph.edges)
    assert job.job_graph.artifact_uri == ""  # the input is left as it was
    assert uploaded.chains is job.chains

    again = upload_artifact(job, None, storage + "/")
    assert again.job_graph.artifact_uri == jg.artifact_uri
    assert again.job_graph.artifact_sha256 == jg.artifact_sha256
    assert [f.name for f in (tmp_path / "artifacts").iterdir()] == [f"{jg.artifact_sha256}.zip"]  # no tmp left


def test_resources_of_chained_operators_add_up_on_their_vertex():
    import yarnflow
    from yarnflow.compiler import compile_job

    env = yarnflow.StreamExecutionEnvironment(parallelism=1)
    (env.from_collection({"x": [1]}).set_resources(cpu_cores=0.5, memory_mb=100)
        .map(lambda r: r).set_resources(cpu_cores=0.25, memory_mb=50).collect())
    [v] = compile_job(env, "res").job_graph.vertices
    assert (v.resources.cpu_cores, v.resources.memory_mb) == (0.75, 150)


# ---- operator uids: what checkpoints and savepoints are restored by ---------------------------

def _uids(build: Any, mode: str = "STREAMING") -> dict[str, list[str]]:
    env = yarnflow.StreamExecutionEnvironment(parallelism=2, runtime_mode=mode)
    build(env)
    return {v.name: v.operator_uids for v in compile_job(env, "uids").job_graph.vertices}


def _pipeline(env: Any, extra_map: bool = False, sum_uid: str | None = None) -> None:
    rows = env.from_collection({"k": ["a", "b"], "v": [1, 2]}, name="rows")
    if extra_map:
        rows = rows.map(lambda r: r, name="extra")
    summed = rows.key_by("k").sum("v", name="sum")
    if sum_uid:
        summed = summed.uid(sum_uid)
    summed.collect()


def test_the_same_pipeline_code_gives_the_same_uids() -> None:
    first, second = _uids(_pipeline), _uids(_pipeline)
    assert first == second
    assert all(len(u) == 16 for uids in first.values() for u in uids
               if not u.startswith("collect-") and "-local-" not in u)  # a pre-aggregation's is its aggregation's + -local-N
    assert len({u for uids in first.values() for u in uids}) == sum(len(u) for u in first.values())


def test_a_changed_pipeline_changes_the_derived_uids_but_not_a_given_one() -> None:
    plain = _uids(_pipeline)
    changed = _uids(lambda env: _pipeline(env, extra_map=True))
    assert plain["sum -> collect"][0] != changed["sum -> collect"][0]  # its input changed
    assert plain["rows -> sum (local)"][:1] == changed["rows -> extra -> sum (local)"][:1]  # what comes before the change keeps its uid
    named = _uids(lambda env: _pipeline(env, extra_map=True, sum_uid="totals"))
    assert named["sum -> collect"][0] == "totals"
    assert _uids(lambda env: _pipeline(env, sum_uid="totals"))["sum -> collect"][0] == "totals"


def test_a_stateful_operator_without_uid_is_warned_about_when_checkpointed(caplog: Any) -> None:
    from yarnflow import executors

    with caplog.at_level("WARNING"):
        _uids(_pipeline)  # no checkpoints: nothing to restore
    assert "without a uid" not in caplog.text
    executors.set_context(executors.LocalContext(conf={"execution.checkpointing.interval": "1 s"}))
    try:
        with caplog.at_level("WARNING"):
            _uids(_pipeline)
        assert "stateful operators without a uid ('rows', 'sum', 'collect')" in caplog.text
        caplog.clear()
        with caplog.at_level("WARNING"):
            _uids(_pipeline, mode="BATCH")
        assert "without a uid" not in caplog.text
    finally:
        executors.set_context(None)


def test_equal_operators_get_distinct_uids_and_a_uid_given_twice_is_refused() -> None:
    def twins(env: Any) -> None:
        a = env.from_collection({"x": [1]}, name="src")
        b = env.from_collection({"x": [2]}, name="src")
        a.union(b).collect()

    uids = [u for us in _uids(twins).values() for u in us]
    assert len(uids) == len(set(uids))

    def clash(env: Any) -> None:
        env.from_collection({"x": [1]}).uid("same").map(lambda r: r).uid("same").collect()

    with pytest.raises(JobDefinitionError, match="have the same uid 'same'"):
        _uids(clash)
