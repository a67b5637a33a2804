"""Compiles the user's transformations into a JobGraph plus the operator chains.

Operators are chained into one vertex when the edge between them is forward, both have the
same parallelism and slot sharing group, the upstream operator feeds only this one, and
neither disabled chaining. A chain's operators travel in the job artifact (cloudpickle)."""

from __future__ import annotations

from dataclasses import dataclass

from yarnflow.common.errors import JobDefinitionError
from yarnflow.common.ids import JobID, JobVertexID
from yarnflow.common.messages import JobEdge, JobGraph, JobVertex
from yarnflow.common.states import ExchangeMode, Partitioner
from yarnflow.datastream import StreamExecutionEnvironment, Transformation
from yarnflow.worker.operators.base import Operator, SourceOperator
from yarnflow.worker.operators.sinks import CollectSink, ParquetSink


@dataclass
class CompiledJob:
    job_graph: JobGraph
    chains: dict[str, list[Operator]]  # vertex id -> operators, head first
    collect_sinks: dict[str, CollectSink]  # uid -> sink

    @property
    def num_slots(self) -> int:
        groups: dict[str, int] = {}
        for v in self.job_graph.vertices:
            groups[v.slot_sharing_group] = max(groups.get(v.slot_sharing_group, 0), v.parallelism)
        return sum(groups.values())


def compile_job(env: StreamExecutionEnvironment, job_name: str) -> CompiledJob:
    ts = env.transformations
    if not ts:
        raise JobDefinitionError("the pipeline is empty: add a source, transformations and a sink")
    consumers: dict[int, list[Transformation]] = {t.id: [] for t in ts}
    for t in ts:
        for up, _, _ in t.inputs:
            consumers[up.id].append(t)
    sinks = [t for t in ts if not consumers[t.id]]
    if not any(isinstance(t.operator, (ParquetSink, CollectSink)) for t in sinks):
        raise JobDefinitionError("the pipeline has no sink: end it with sink_to_parquet(), print() or collect()")

    def parallelism(t: Transformation) -> int:
        return t.parallelism or env.parallelism

    max_par = env.max_parallelism
    for t in ts:
        if parallelism(t) > (t.max_parallelism or max_par):
            raise JobDefinitionError(f"operator '{t.operator.name}': parallelism {parallelism(t)} exceeds the "
                                     f"max parallelism {t.max_parallelism or max_par}")

    # resolve partitioners: forward only between equal parallelism, else rebalance
    def edge_partitioner(up: Transformation, down: Transformation, p: Partitioner) -> Partitioner:
        if p == Partitioner.FORWARD and parallelism(up) != parallelism(down):
            return Partitioner.REBALANCE
        return p

    head_of: dict[int, Transformation] = {}
    chains: dict[int, list[Transformation]] = {}
    for t in ts:  # transformations are created in topological order
        chainable = False
        if len(t.inputs) == 1:
            up, p, _ = t.inputs[0]
            chainable = (edge_partitioner(up, t, p) == Partitioner.FORWARD and t.chaining and up.chaining
                         and len(consumers[up.id]) == 1 and up.slot_sharing_group == t.slot_sharing_group
                         and not t.is_source)
        if chainable:
            head = head_of[t.inputs[0][0].id]
            head_of[t.id] = head
            chains[head.id].append(t)
        else:
            head_of[t.id] = t
            chains[t.id] = [t]

    job_id = JobID.generate()
    vertex_ids = {hid: JobVertexID.generate() for hid in chains}
    vertices, edges = [], []
    all_bounded = True
    for hid, chain in chains.items():
        head = chain[0]
        if isinstance(head.operator, SourceOperator) and not head.operator.bounded:
            all_bounded = False
        names = [t.operator.name for t in chain]
        vertices.append(JobVertex(
            vertex_ids[hid], " -> ".join(names), parallelism(head), head.max_parallelism or max_par, names,
            head.slot_sharing_group, is_source=head.is_source, is_sink=not consumers[chain[-1].id]))
        for index, (up, p, keys) in enumerate(head.inputs):
            part = edge_partitioner(up, head, p)
            edges.append(JobEdge(vertex_ids[head_of[up.id].id], vertex_ids[hid], part, ExchangeMode.PIPELINED,
                                 list(keys), 0))
    mode = env.runtime_mode
    if mode == "AUTOMATIC":
        mode = "BATCH" if all_bounded else "STREAMING"
    elif mode == "BATCH" and not all_bounded:
        raise JobDefinitionError("BATCH runtime mode needs every source to be bounded")
    jg = JobGraph(job_id, job_name, vertices, edges, runtime_mode=mode)
    jg.validate()
    collect = {t.operator.uid: t.operator for t in ts if isinstance(t.operator, CollectSink)}
    return CompiledJob(jg, {vertex_ids[hid]: [t.operator for t in chain] for hid, chain in chains.items()}, collect)
