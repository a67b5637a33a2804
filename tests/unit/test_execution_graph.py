"""The ExecutionGraph: expansion of a JobGraph into subtasks and attempts, execution states,
deployment descriptors (channels and result partitions)."""

from __future__ import annotations

import pytest

from yarnflow.am.jobmaster.execution_graph import ExecutionGraph, LogicalSlot
from yarnflow.common.errors import IllegalStateTransition, InvalidRequestError
from yarnflow.common.ids import AllocationID, JobID, JobVertexID, ResourceID
from yarnflow.common.messages import JobEdge, JobGraph, JobVertex
from yarnflow.common.states import ExchangeMode, ExecutionState, Partitioner

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

S = ExecutionState
JOB = JobID("job-1")
SRC, AGG, SINK = JobVertexID("v-src"), JobVertexID("v-agg"), JobVertexID("v-sink")


def vertex(vid: JobVertexID, parallelism: int, max_parallelism: int = 128, group: str = "default") -> JobVertex:
    return JobVertex(vid, str(vid)[2:], parallelism, max_parallelism, [str(vid)[2:]], group,
                     is_source=vid == SRC)


def hash_graph() -> JobGraph:
    """src (2) --hash(k)--> agg (3, max parallelism 16)."""
    return JobGraph(JOB, "hash", [vertex(SRC, 2), vertex(AGG, 3, 16)],
                    [JobEdge(SRC, AGG, Partitioner.HASH, ExchangeMode.PIPELINED, ["k"])])


def forward_graph() -> JobGraph:
    """src (2) --forward--> agg (2) --forward--> sink (2)."""
    return JobGraph(JOB, "forward", [vertex(SRC, 2), vertex(AGG, 2), vertex(SINK, 2)],
                    [JobEdge(SRC, AGG, Partitioner.FORWARD), JobEdge(AGG, SINK, Partitioner.FORWARD)])


def slot(n: int | str) -> LogicalSlot:
    return LogicalSlot(AllocationID(f"alloc-{n}"), ResourceID(f"te-{n}"), f"host{n}:6000", f"host{n}:7000")


def place_all(graph: ExecutionGraph) -> None:
    for vid, ejv in graph.vertices.items():
        for ev in ejv.subtasks:
            ev.current.slot = slot(f"{vid}-{ev.subtask_index}")


def tdd(graph: ExecutionGraph, vid: JobVertexID, index: int):  # type: ignore[no-untyped-def]
    ex = graph.vertices[vid].subtasks[index].current
    return graph.deployment_descriptor(ex, "file:///a.zip", "abc123", "jm-token", {"k": "v"}, "file:///jobs/1")


# ---- structure --------------------------------------------------------------------------------

def test_graph_expands_vertices_into_subtasks_with_one_attempt_each() -> None:
    g = ExecutionGraph(hash_graph())
    assert list(g.vertices) == [SRC, AGG]
    assert [len(ejv.subtasks) for ejv in g.vertices.values()] == [2, 3]
    agg = g.vertices[AGG].subtasks
    assert [ev.subtask_index for ev in agg] == [0, 1, 2]
    assert agg[1].name == "agg (2/3)" and agg[1].job_id == JOB
    executions = g.current_executions()
    assert len(executions) == len(g.all_vertices()) == 5
    assert all(ex.state == S.CREATED and ex.attempt_number == 0 and ex.slot is None for ex in executions)
    assert len({ex.attempt_id for ex in executions}) == 5
    for ex in executions:
        assert g.execution(str(ex.attempt_id)) is ex and g.is_current(ex)
    assert g.execution("no-such-attempt") is None


def test_a_malformed_job_graph_is_refused() -> None:
    bad = JobGraph(JOB, "bad", [vertex(SRC, 2), vertex(AGG, 3)], [JobEdge(SRC, AGG, Partitioner.FORWARD)])
    with pytest.raises(InvalidRequestError, match="forward edge"):
        ExecutionGraph(bad)
    with pytest.raises(InvalidRequestError, match="no vertices"):
        ExecutionGraph(JobGraph(JOB, "empty", [], []))


# ---- execution states -------------------------------------------------------------------------

def test_execution_moves_through_its_lifecycle() -> None:
    ex = ExecutionGraph(hash_graph()).vertices[SRC].subtasks[0].current
    for target in (S.SCHEDULED, S.DEPLOYING, S.INITIALIZING, S.RUNNING, S.FINISHED):
        assert ex.transition(target) is True
        assert ex.state == target
    assert ex.transition(S.FINISHED) is False  # already there: nothing changes


@pytest.mark.parametrize("start, path, target", [
    (S.CREATED, [], S.RUNNING),
    (S.CREATED, [], S.DEPLOYING),
    (S.SCHEDULED, [S.SCHEDULED], S.RUNNING),
    (S.RUNNING, [S.SCHEDULED, S.DEPLOYING, S.INITIALIZING, S.RUNNING], S.CANCELED),
    (S.RUNNING, [S.SCHEDULED, S.DEPLOYING, S.INITIALIZING, S.RUNNING], S.CREATED),
    # Flink's rules (issue 51): a deployed task initializes before it runs; a task finishing while
    # it is being cancelled ends CANCELED; a reconciled task never goes back to DEPLOYING
    (S.DEPLOYING, [S.SCHEDULED, S.DEPLOYING], S.RUNNING),
    (S.CANCELING, [S.SCHEDULED, S.DEPLOYING, S.CANCELING], S.FINISHED),
    (S.RECONCILING, [S.RECONCILING], S.DEPLOYING),
    (S.FINISHED, [S.SCHEDULED, S.DEPLOYING, S.FINISHED], S.RUNNING),
    (S.FAILED, [S.FAILED], S.CANCELED),
    (S.CANCELED, [S.CANCELED], S.FAILED),
])
def test_illegal_transitions_raise_and_change_nothing(start: S, path: list[S], target: S) -> None:
    ex = ExecutionGraph(hash_graph()).vertices[SRC].subtasks[0].current
    for step in path:
        ex.transition(step)
    assert ex.state == start
    with pytest.raises(IllegalStateTransition, match=f"{start.name} -> {target.name}") as info:
        ex.transition(target)
    assert "src (1/2) attempt 0" in str(info.value)
    assert ex.state == start


def test_canceling_ends_canceled_or_failed() -> None:
    for end in (S.CANCELED, S.FAILED):
        ex = ExecutionGraph(hash_graph()).vertices[SRC].subtasks[0].current
        for step in (S.SCHEDULED, S.DEPLOYING, S.INITIALIZING, S.RUNNING, S.CANCELING, end):
            ex.transition(step)
        assert ex.state == end and ex.state.is_terminal


def test_new_attempt_keeps_the_prior_ones() -> None:
    g = ExecutionGraph(hash_graph())
    ev = g.vertices[AGG].subtasks[2]
    first = ev.current
    first.transition(S.SCHEDULED)
    with pytest.raises(IllegalStateTransition, match="SCHEDULED"):
        g.new_attempt(ev)  # still live
    assert ev.current is first
    first.transition(S.FAILED)
    second = g.new_attempt(ev)
    assert ev.current is second and ev.prior == [first]
    assert (second.attempt_number, second.state, second.slot) == (1, S.CREATED, None)
    assert second.attempt_id != first.attempt_id
    assert g.execution(str(second.attempt_id)) is second
    assert g.execution(str(first.attempt_id)) is first  # a late update of the old attempt is recognised ...
    assert not g.is_current(first) and g.is_current(second)  # ... as stale
    second.transition(S.CANCELED)
    third = g.new_attempt(ev)
    assert third.attempt_number == 2 and ev.prior == [first, second]
    assert len(g.current_executions()) == 5


def test_vertex_statuses_count_current_states() -> None:
    g = ExecutionGraph(hash_graph())
    src0, src1 = (ev.current for ev in g.vertices[SRC].subtasks)
    src0.transition(S.FAILED)
    g.new_attempt(g.vertices[SRC].subtasks[0])  # the failed attempt no longer counts
    src1.transition(S.SCHEDULED)
    agg = [ev.current for ev in g.vertices[AGG].subtasks]
    for ex in agg:
        ex.transition(S.SCHEDULED)
        ex.transition(S.DEPLOYING)
    agg[0].transition(S.INITIALIZING)
    agg[0].transition(S.RUNNING)
    statuses = {s.vertex_id: s for s in g.vertex_statuses()}
    assert statuses[SRC].name == "src" and statuses[SRC].parallelism == 2
    assert statuses[SRC].state_counts == {S.CREATED: 1, S.SCHEDULED: 1}
    assert statuses[AGG].parallelism == 3
    assert statuses[AGG].state_counts == {S.RUNNING: 1, S.DEPLOYING: 2}
    assert sum(sum(s.state_counts.values()) for s in statuses.values()) == 5


def test_all_finished_and_all_terminal() -> None:
    g = ExecutionGraph(forward_graph())
    executions = g.current_executions()
    for ex in executions:
        ex.transition(S.SCHEDULED)
        ex.transition(S.DEPLOYING)
    assert not g.all_terminal() and not g.all_finished()
    for ex in executions[:-1]:
        ex.transition(S.FINISHED)
    assert not g.all_terminal()
    executions[-1].transition(S.FAILED)
    assert g.all_terminal() and not g.all_finished()
    g.new_attempt(executions[-1].vertex).transition(S.FAILED)  # CREATED -> FAILED
    last = g.new_attempt(executions[-1].vertex)
    for step in (S.SCHEDULED, S.DEPLOYING, S.FINISHED):
        last.transition(step)
    assert g.all_finished() and g.all_terminal()


# ---- deployment descriptors -------------------------------------------------------------------

def test_descriptor_of_a_hash_consumer_reads_its_subpartition_from_every_producer() -> None:
    g = ExecutionGraph(hash_graph())
    place_all(g)
    producers = [ev.current for ev in g.vertices[SRC].subtasks]
    for j in range(3):
        d = tdd(g, AGG, j)
        assert [gate.input_index for gate in d.input_gates] == [0]
        chans = d.input_gates[0].channels
        assert len(chans) == 2  # one per producer
        assert [c.partition_id for c in chans] == [p.partition_id(0) for p in producers]
        assert d.input_gates[0].subpartition_index == j
        assert [c.producer_resource_id for c in chans] == [p.slot.resource_id for p in producers]  # type: ignore[union-attr]
        assert [c.producer_data_address for c in chans] == [p.slot.data_address for p in producers]  # type: ignore[union-attr]
        assert d.result_partitions == []


def test_descriptor_of_a_hash_producer_has_one_subpartition_per_consumer() -> None:
    g = ExecutionGraph(hash_graph())
    place_all(g)
    ex = g.vertices[SRC].subtasks[1].current
    d = tdd(g, SRC, 1)
    assert d.input_gates == []
    [rp] = d.result_partitions
    assert rp.partition_id == ex.partition_id(0)
    assert str(rp.partition_id).startswith(f"{JOB}.")
    assert (rp.num_subpartitions, rp.partitioner, rp.key_columns) == (3, Partitioner.HASH, ["k"])
    assert rp.exchange_mode == ExchangeMode.PIPELINED
    assert rp.consumer_max_parallelism == 16


def test_descriptor_carries_the_task_and_job_fields() -> None:
    g = ExecutionGraph(hash_graph())
    place_all(g)
    ev = g.vertices[AGG].subtasks[2]
    ev.current.transition(S.FAILED)
    ex = g.new_attempt(ev)
    ex.slot = slot("new")
    d = tdd(g, AGG, 2)
    assert (d.job_id, d.vertex_id, d.task_name) == (JOB, AGG, "agg")
    assert (d.execution_attempt_id, d.subtask_index, d.attempt_number) == (ex.attempt_id, 2, 1)
    assert (d.parallelism, d.max_parallelism) == (3, 16)
    assert d.allocation_id == AllocationID("alloc-new")
    assert (d.artifact_uri, d.artifact_sha256, d.jobmaster_fencing_token) == ("file:///a.zip", "abc123", "jm-token")
    assert (d.config, d.runtime_mode, d.job_storage_dir) == ({"k": "v"}, "STREAMING", "file:///jobs/1")


def test_forward_edges_read_one_channel_from_the_same_subtask() -> None:
    g = ExecutionGraph(forward_graph())
    place_all(g)
    for i in range(2):
        d = tdd(g, AGG, i)
        [gate] = d.input_gates
        [chan] = gate.channels
        producer = g.vertices[SRC].subtasks[i].current
        assert chan.partition_id == producer.partition_id(0)
        assert gate.subpartition_index == 0
        assert chan.producer_resource_id == ResourceID(f"te-{SRC}-{i}")
        [rp] = d.result_partitions  # agg -> sink is the job's second edge
        assert rp.partition_id == g.vertices[AGG].subtasks[i].current.partition_id(1)
        assert str(rp.partition_id).endswith(".1")
        assert (rp.num_subpartitions, rp.partitioner) == (1, Partitioner.FORWARD)
    sink = tdd(g, SINK, 1)
    assert sink.input_gates[0].channels[0].partition_id == g.vertices[AGG].subtasks[1].current.partition_id(1)
    assert sink.result_partitions == []


def test_partition_ids_name_job_attempt_and_edge() -> None:
    g = ExecutionGraph(forward_graph())
    ex = g.vertices[AGG].subtasks[0].current
    assert ex.partition_id(1) == f"{JOB}.{ex.attempt_id}.1"
    ex.transition(S.FAILED)
    again = g.new_attempt(ex.vertex)
    assert again.partition_id(1) != ex.partition_id(1)  # a new attempt writes new partitions


def test_consumer_reads_the_current_attempt_of_a_restarted_producer() -> None:
    g = ExecutionGraph(hash_graph())
    place_all(g)
    ev = g.vertices[SRC].subtasks[0]
    old = ev.current
    old.transition(S.FAILED)
    new = g.new_attempt(ev)
    new.slot = slot("moved")
    chans = tdd(g, AGG, 0).input_gates[0].channels
    assert chans[0].partition_id == new.partition_id(0) != old.partition_id(0)
    assert chans[0].producer_resource_id == ResourceID("te-moved")


def test_descriptor_needs_every_producer_to_have_a_slot() -> None:
    g = ExecutionGraph(hash_graph())
    place_all(g)
    g.vertices[SRC].subtasks[1].current.slot = None
    with pytest.raises(LookupError, match=r"producer src \(2/2\) has no slot"):
        tdd(g, AGG, 0)
    tdd(g, SRC, 0)  # a source reads from nobody


def test_inputs_are_grouped_into_gates_by_input_index() -> None:
    left, right = JobVertexID("v-left"), JobVertexID("v-right")
    jg = JobGraph(JOB, "two inputs", [vertex(left, 2), vertex(right, 1), vertex(AGG, 2)], [
        JobEdge(left, AGG, Partitioner.HASH, key_columns=["k"], input_index=0),
        JobEdge(right, AGG, Partitioner.BROADCAST, input_index=1),
    ])
    g = ExecutionGraph(jg)
    place_all(g)
    d = tdd(g, AGG, 1)
    assert [gate.input_index for gate in d.input_gates] == [0, 1]
    assert [len(gate.channels) for gate in d.input_gates] == [2, 1]
    [chan] = d.input_gates[1].channels
    assert chan.partition_id == g.vertices[right].subtasks[0].current.partition_id(1)
    assert d.input_gates[1].subpartition_index == 1
    [rp] = tdd(g, right, 0).result_partitions
    assert (rp.num_subpartitions, rp.partitioner) == (2, Partitioner.BROADCAST)
