"""ExecutionGraph: the JobGraph expanded into subtasks and their attempts (pure; no I/O).

    ExecutionJobVertex (one per JobVertex)
      └── ExecutionVertex (one per subtask)
            └── Execution (one per attempt; states follow ExecutionState)

Each attempt of a producer writes one result partition per outgoing edge, named
``<job id>.<attempt id>.<edge index>`` so a TaskExecutor can release a job's partitions.

A vertex with ``dynamic_parallelism`` (the adaptive batch scheduler) has as many subtasks as
its JobVertex's parallelism, its upper bound, until ``decide`` sets how many of them run (the
first ones): the others never run and are left out of everything but ``subtasks``. Its
producers write one subpartition per possible subtask (per key group: its max parallelism is
that same bound; one only for a broadcast), and subtask i reads the contiguous range of them
that key-group range i covers (Flink's consumed subpartition range).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from yarnflow.common.errors import IllegalStateTransition
from yarnflow.common.keygroups import key_group_range
from yarnflow.common.ids import AllocationID, ExecutionAttemptID, JobVertexID, ResourceID, ResultPartitionID
from yarnflow.common.messages import (
    ErrorInfo,
    InputChannelDescriptor,
    InputGateDescriptor,
    JobEdge,
    JobGraph,
    JobVertex,
    ResultPartitionDescriptor,
    TaskDeploymentDescriptor,
    TaskMetrics,
    TaskRestore,
    VertexStatus,
)
from yarnflow.common.states import ExecutionState, Partitioner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LogicalSlot:
    """Where an execution runs: a slot of a TaskExecutor, held under ``allocation_id``."""

    allocation_id: AllocationID
    resource_id: ResourceID
    rpc_address: str
    data_address: str


class Stamp:
    """Shared by the subtasks of one vertex: a counter bumped whenever one of them gets a new
    attempt or a slot (or the vertex its parallelism), so descriptors built from the vertex's
    locations can be cached; and the vertex's parallelism (decided at run time for a vertex
    with dynamic parallelism)."""

    __slots__ = ("value", "parallelism")

    def __init__(self, parallelism: int = 1) -> None:
        self.value = 0
        self.parallelism = parallelism


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Execution:
    vertex: ExecutionVertex
    attempt_number: int
    attempt_id: ExecutionAttemptID = field(default_factory=ExecutionAttemptID.generate)
    state: ExecutionState = ExecutionState.CREATED
    _slot: LogicalSlot | None = field(default=None, repr=False)
    failure: ErrorInfo | None = None
    records_in: int = 0
    records_out: int = 0
    metrics: TaskMetrics | None = None  # the latest figures its TaskExecutor reported
    restore: TaskRestore | None = None  # the checkpoint state this attempt starts from
    #: when it entered each state (wall clock ms: REST's subtask times)
    timestamps: dict[ExecutionState, int] = field(default_factory=lambda: {ExecutionState.CREATED: _now_ms()})

    @property
    def slot(self) -> LogicalSlot | None:
        return self._slot

    @slot.setter
    def slot(self, value: LogicalSlot | None) -> None:
        if value is not self._slot:
            self._slot = value
            self.vertex.stamp.value += 1

    def transition(self, target: ExecutionState) -> bool:
        """Move to ``target``; False (and nothing changes) if it is the current state."""
        if self.state == target:
            return False
        self.state.check_move_to(target, f"{self.vertex.name} attempt {self.attempt_number}")
        self.state = target
        self.timestamps[target] = _now_ms()
        return True

    def partition_id(self, edge_index: int) -> ResultPartitionID:
        return ResultPartitionID(f"{self.vertex.job_id}.{self.attempt_id}.{edge_index}")


@dataclass
class ExecutionVertex:
    job_vertex: JobVertex
    job_id: str
    subtask_index: int
    stamp: Stamp = field(default_factory=Stamp)
    current: Execution = field(init=False)
    prior: list[Execution] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.current = Execution(self, 0)

    @property
    def name(self) -> str:
        return f"{self.job_vertex.name} ({self.subtask_index + 1}/{self.stamp.parallelism})"

    def reset_for_new_attempt(self) -> Execution:
        if not self.current.state.is_terminal:
            raise IllegalStateTransition(f"{self.name}: cannot restart while {self.current.state.name}")
        self.prior.append(self.current)
        self.current = Execution(self, self.current.attempt_number + 1)
        self.stamp.value += 1
        return self.current


@dataclass
class ExecutionJobVertex:
    job_vertex: JobVertex
    subtasks: list[ExecutionVertex]  # all possible ones: see ``active``
    #: False until a vertex with dynamic parallelism has its parallelism decided
    decided: bool = True

    @property
    def parallelism(self) -> int:
        return self.subtasks[0].stamp.parallelism

    @property
    def active(self) -> list[ExecutionVertex]:
        """The subtasks that run (all but those a decided parallelism left out)."""
        return self.subtasks[:self.parallelism]


class ExecutionGraph:
    def __init__(self, job_graph: JobGraph) -> None:
        job_graph.validate()
        self.job_graph = job_graph
        self.vertices: dict[JobVertexID, ExecutionJobVertex] = {}
        for jv in job_graph.vertices:
            stamp = Stamp(jv.parallelism)
            self.vertices[jv.vertex_id] = ExecutionJobVertex(
                jv, [ExecutionVertex(jv, job_graph.job_id, i, stamp) for i in range(jv.parallelism)],
                decided=not jv.dynamic_parallelism)
        self._channel_cache: dict[int, tuple[int, list[InputChannelDescriptor]]] = {}
        self._by_attempt: dict[ExecutionAttemptID, Execution] = {}
        for ev in self.all_vertices():
            self._by_attempt[ev.current.attempt_id] = ev.current
        self._out_edges = {jv.vertex_id: [(i, e) for i, e in enumerate(job_graph.edges)
                                          if e.source_vertex_id == jv.vertex_id] for jv in job_graph.vertices}
        self._in_edges = {jv.vertex_id: [(i, e) for i, e in enumerate(job_graph.edges)
                                         if e.target_vertex_id == jv.vertex_id] for jv in job_graph.vertices}

    def out_edges(self, vertex_id: str) -> list[tuple[int, JobEdge]]:
        """``(edge index, edge)`` of the vertex's outgoing edges."""
        return self._out_edges[JobVertexID(vertex_id)]

    def in_edges(self, vertex_id: str) -> list[tuple[int, JobEdge]]:
        """``(edge index, edge)`` of the vertex's incoming edges."""
        return self._in_edges[JobVertexID(vertex_id)]

    def all_vertices(self) -> list[ExecutionVertex]:
        return [ev for ejv in self.vertices.values() for ev in ejv.active]

    def decide(self, vertex_id: str, parallelism: int) -> list[ExecutionVertex]:
        """Set the parallelism of a vertex with dynamic parallelism (once, before any of its
        subtasks was scheduled); returns the subtasks that will not run."""
        ejv = self.vertices[JobVertexID(vertex_id)]
        if ejv.decided:
            raise IllegalStateTransition(f"{ejv.job_vertex.name}: its parallelism is decided already")
        if not 1 <= parallelism <= len(ejv.subtasks):
            raise ValueError(f"{ejv.job_vertex.name}: parallelism {parallelism} is not between 1 and "
                             f"{len(ejv.subtasks)}")
        ejv.decided = True
        stamp = ejv.subtasks[0].stamp
        stamp.parallelism = parallelism
        stamp.value += 1
        return ejv.subtasks[parallelism:]

    def current_executions(self) -> list[Execution]:
        return [ev.current for ev in self.all_vertices()]

    def execution(self, attempt_id: str) -> Execution | None:
        return self._by_attempt.get(ExecutionAttemptID(attempt_id))

    def new_attempt(self, ev: ExecutionVertex) -> Execution:
        ex = ev.reset_for_new_attempt()
        self._by_attempt[ex.attempt_id] = ex
        return ex

    def adopt(self, ev: ExecutionVertex, attempt_id: ExecutionAttemptID, attempt_number: int) -> Execution:
        """The subtask's attempt is one a TaskExecutor kept running across a change of leader:
        it replaces the attempt this graph was built with (never run), in RECONCILING."""
        placeholder = ev.current
        if placeholder.state not in (ExecutionState.CREATED, ExecutionState.RECONCILING):
            raise IllegalStateTransition(f"{ev.name}: cannot adopt an attempt while {placeholder.state.name}")
        self._by_attempt.pop(placeholder.attempt_id, None)
        ex = ev.current = Execution(ev, attempt_number, ExecutionAttemptID(attempt_id))
        ex.transition(ExecutionState.RECONCILING)
        ex.restore = placeholder.restore
        ev.stamp.value += 1
        self._by_attempt[ex.attempt_id] = ex
        return ex

    def is_current(self, ex: Execution) -> bool:
        return ex.vertex.current is ex

    def all_finished(self) -> bool:
        return all(ex.state == ExecutionState.FINISHED for ex in self.current_executions())

    def all_terminal(self) -> bool:
        return all(ex.state.is_terminal for ex in self.current_executions())

    def vertex_statuses(self) -> list[VertexStatus]:
        out = []
        for vid, ejv in self.vertices.items():
            counts: dict[ExecutionState, int] = {}
            for ev in ejv.active:
                counts[ev.current.state] = counts.get(ev.current.state, 0) + 1
            out.append(VertexStatus(vid, ejv.job_vertex.name, ejv.parallelism, counts))
        return out

    # -- deployment -------------------------------------------------------------------------
    def _channels(self, ex: Execution, edge_index: int, producers: list[ExecutionVertex]
                  ) -> list[InputChannelDescriptor]:
        channels = []
        for producer in producers:
            slot = producer.current.slot
            if slot is None:
                raise LookupError(f"{ex.vertex.name}: producer {producer.name} has no slot yet")
            channels.append(InputChannelDescriptor(producer.current.partition_id(edge_index), slot.resource_id,
                                                   slot.data_address))
        return channels

    def deployment_descriptor(self, ex: Execution, artifact_uri: str, artifact_sha256: str, jm_token: str,
                              config: dict[str, str], job_storage_dir: str,
                              checkpoint_dir: str = "") -> TaskDeploymentDescriptor:
        """The TDD for ``ex``; every producer it reads from must already have a slot."""
        jg = self.job_graph
        jv = ex.vertex.job_vertex
        i = ex.vertex.subtask_index
        gates: list[InputGateDescriptor] = []
        parallelism = ex.vertex.stamp.parallelism
        for idx, edge in self._in_edges[jv.vertex_id]:
            producers = self.vertices[edge.source_vertex_id].active
            if edge.partitioner == Partitioner.FORWARD:
                gates.append(InputGateDescriptor(edge.input_index, self._channels(ex, idx, [producers[i]]), 0,
                                                 edge.exchange_mode))
                continue
            stamp = producers[0].stamp.value
            cached = self._channel_cache.get(idx)
            if cached is None or cached[0] != stamp:
                cached = (stamp, self._channels(ex, idx, producers))
                self._channel_cache[idx] = cached
            keys = list(edge.key_columns) if edge.partitioner == Partitioner.HASH else []
            if not jv.dynamic_parallelism:
                gates.append(InputGateDescriptor(edge.input_index, cached[1], i, edge.exchange_mode, key_columns=keys))
            elif edge.partitioner == Partitioner.BROADCAST:  # one subpartition, read by every subtask
                gates.append(InputGateDescriptor(edge.input_index, cached[1], 0, edge.exchange_mode))
            else:
                owned = key_group_range(jv.parallelism, parallelism, i)
                gates.append(InputGateDescriptor(edge.input_index, cached[1], owned.start, edge.exchange_mode,
                                                 owned.stop, key_columns=keys))
        partitions = []
        for idx, edge in self._out_edges[jv.vertex_id]:
            target = jg.vertex(edge.target_vertex_id)
            n = 1 if edge.partitioner == Partitioner.FORWARD else target.parallelism
            if target.dynamic_parallelism and edge.partitioner == Partitioner.BROADCAST:
                n = 1
            partitions.append(ResultPartitionDescriptor(
                ex.partition_id(idx), n, edge.partitioner, list(edge.key_columns),
                edge.exchange_mode, target.max_parallelism, edge.output_tag))
        if ex.slot is None:
            raise LookupError(f"{ex.vertex.name} has no slot yet")
        return TaskDeploymentDescriptor(
            job_id=jg.job_id, vertex_id=jv.vertex_id, task_name=jv.name, execution_attempt_id=ex.attempt_id,
            subtask_index=i, attempt_number=ex.attempt_number, parallelism=parallelism,
            max_parallelism=jv.max_parallelism, allocation_id=ex.slot.allocation_id, artifact_uri=artifact_uri,
            artifact_sha256=artifact_sha256,
            input_gates=sorted(gates, key=lambda g: g.input_index),
            result_partitions=partitions, jobmaster_fencing_token=jm_token, config=config,
            runtime_mode=jg.runtime_mode, job_storage_dir=job_storage_dir, checkpoint_dir=checkpoint_dir,
            restore=ex.restore, job_name=jg.name)


def region_sharing_groups(job_graph: JobGraph, region: Any) -> list[tuple[tuple[int, str, int], list[Any]]]:
    """Slot sharing inside one pipelined region: subtask i of every vertex of one slot sharing
    group shares a slot; two subtasks of one vertex never do. Returns ``(key, subtasks)`` per
    shared slot, the key being ``(region id, sharing group, i)``."""
    groups: dict[tuple[str, int], list[Any]] = {}
    for s in sorted(region.subtasks):
        group = job_graph.vertex(s.vertex_id).slot_sharing_group
        groups.setdefault((group, s.index), []).append(s)
    return [((region.region_id, g, i), members) for (g, i), members in sorted(groups.items())]
