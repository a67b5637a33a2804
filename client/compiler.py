"""Compiles the user's transformations into a JobGraph plus the operator chains.

Operators are chained into one vertex when the edge between them is a forward edge of the
main output, both have the same parallelism and slot sharing group, the upstream operator
feeds only this one, and neither disabled chaining. Unions are virtual: their consumers read
every union input directly. A chain's operators travel in the job artifact (cloudpickle)."""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from yarnflow.common.yarn import FIXED_JOB_IDS_VAR
from yarnflow.common.config import Configuration, Options
from yarnflow.common.errors import JobDefinitionError
from yarnflow.common.ids import JobID, JobVertexID
from yarnflow.common.messages import JobEdge, JobGraph, JobVertex, ResourceProfile
from yarnflow.common.states import ExchangeMode, Partitioner
from yarnflow.pipeline import Input, Transformation
from yarnflow.planner import assign_memory_fractions, plan_batch, plan_streaming
from yarnflow.worker.operators.base import Operator
from yarnflow.worker.operators.sinks import CollectSink, _StagedFileSink
from yarnflow.worker.operators.spark import SparkStage

if TYPE_CHECKING:
    from yarnflow.datastream import StreamExecutionEnvironment

log = logging.getLogger(__name__)


@dataclass
class CompiledJob:
    job_graph: JobGraph
    chains: dict[str, list[Operator]]  # vertex id -> operators, head first
    collect_sinks: dict[str, CollectSink]  # uid -> sink
    file_sinks: list[str]  # where file sinks write

    @property
    def num_slots(self) -> int:
        groups: dict[str, int] = {}
        for v in self.job_graph.vertices:
            groups[v.slot_sharing_group] = max(groups.get(v.slot_sharing_group, 0), v.parallelism)
        return sum(groups.values())


def _expand(inputs: list[Input]) -> list[Input]:
    """Inputs with unions replaced by the union's own inputs (the consumer's partitioner wins
    unless it is forward)."""
    out: list[Input] = []
    for inp in inputs:
        if inp.upstream.is_union:
            for inner in _expand(inp.upstream.inputs):
                part = inp.partitioner if inp.partitioner != Partitioner.FORWARD else inner.partitioner
                keys = inp.keys if inp.partitioner != Partitioner.FORWARD else inner.keys
                out.append(Input(inner.upstream, part, keys, inner.output_tag, inp.input_index))
        else:
            out.append(inp)
    return out


def _restorable(conf: Mapping[str, str]) -> bool:
    """Whether the job keeps state to restore: checkpoints are on, or it starts from a savepoint."""
    return bool(conf.get("execution.checkpointing.interval") or conf.get("execution.savepoint.path"))


def _checkpointing(conf: Mapping[str, str]) -> bool:
    return bool(conf.get("execution.checkpointing.interval"))


def _is_stateful(op: Operator) -> bool:
    declared = getattr(op, "stateful", None)  # (an operator whose state depends on its function)
    if declared is not None:
        return bool(declared)
    return type(op).snapshot_state is not Operator.snapshot_state


def operator_uids(ts: list[Transformation], inputs: dict[int, list[Input]]) -> dict[int, str]:
    """Each operator's uid: the one ``uid()`` set, else one derived from the operator (class and
    name) and, recursively, its inputs (their uids, partitioners, keys), numbered among equal
    ones in the order they were added: the same pipeline code gives the same uids, run after
    run. Raises JobDefinitionError for a uid given twice."""
    uids: dict[int, str] = {}
    derived: dict[str, int] = {}
    owner: dict[str, str] = {}
    for t in ts:
        op = t.operator
        assert op is not None
        if getattr(op, "user_uid", False):
            uid = op.uid
        else:
            h = hashlib.sha256(f"{type(op).__module__}.{type(op).__qualname__}|{op.name}".encode())
            for inp in inputs[t.id]:
                h.update(f"|{uids[inp.upstream.id]}:{inp.partitioner.name}:{','.join(inp.keys)}:"
                         f"{inp.input_index}:{inp.output_tag}".encode())
            base = h.hexdigest()[:16]
            n = derived.get(base, 0)
            derived[base] = n + 1
            uid = base if n == 0 else f"{base}-{n}"
        if uid in owner:
            raise JobDefinitionError(f"operators '{owner[uid]}' and '{op.name}' have the same uid {uid!r}: "
                                     "uids must be unique in a job")
        owner[uid] = op.name
        uids[t.id] = uid
    return uids


def _topological(vertices: list[JobVertex], edges: list[JobEdge]) -> list[JobVertex]:
    """``vertices`` in an order where every edge's source comes before its target, else as
    given (a chain with side inputs can come before the vertices that feed them)."""
    pending = {v.vertex_id: sum(1 for e in edges if e.target_vertex_id == v.vertex_id) for v in vertices}
    out: list[JobVertex] = []
    left = list(vertices)
    while left:
        ready = next(v for v in left if pending[v.vertex_id] == 0)
        left.remove(ready)
        out.append(ready)
        for e in edges:
            if e.source_vertex_id == ready.vertex_id:
                pending[e.target_vertex_id] -= 1
    return out


def _exchange(mode: ExchangeMode, up: Transformation, down: Transformation) -> ExchangeMode:
    """A Spark stage's inputs (the names of its input files) and output (the names of its output
    files) are stored in the job's storage dir with the files they name: losing the TaskExecutor
    that produced them loses nothing (BATCH jobs)."""
    if mode == ExchangeMode.BLOCKING and (isinstance(up.operator, SparkStage) or isinstance(down.operator, SparkStage)):
        return ExchangeMode.BLOCKING_PERSISTENT
    return mode


def _runtime_mode(env: StreamExecutionEnvironment, ts: list[Transformation]) -> str:
    mode = env.runtime_mode
    all_bounded = all(getattr(t.operator, "bounded", True) for t in ts if t.is_source)
    if mode == "AUTOMATIC":
        return "BATCH" if all_bounded else "STREAMING"
    if mode == "BATCH" and not all_bounded:
        raise JobDefinitionError("BATCH runtime mode needs every source to be bounded")
    return mode


def _option(conf: Mapping[str, str], option: Any) -> Any:
    """``option``'s value in the job's configuration, else its default."""
    raw = conf.get(option.key)
    if raw is None or raw == "":
        return Configuration.load({})[option]
    try:
        return option.convert(raw)
    except ValueError as exc:
        raise JobDefinitionError(f"{option.key}: {exc}") from None


def _auto_parallelism(env: StreamExecutionEnvironment, mode: str) -> tuple[int, int] | None:
    """For a BATCH job with the adaptive batch scheduler on: the most parallelism it may decide
    for an operator given none, and the parallelism of sources given none; else None."""
    if mode != "BATCH" or not _option(env.conf, Options.AUTO_PARALLELISM):
        return None
    bound = int(_option(env.conf, Options.AUTO_MAX_PARALLELISM)) or env.parallelism
    least = int(_option(env.conf, Options.AUTO_MIN_PARALLELISM))
    if least > bound:
        raise JobDefinitionError(f"{Options.AUTO_MIN_PARALLELISM.key} ({least}) is above the most parallelism the "
                                 f"adaptive batch scheduler may decide ({bound})")
    return bound, int(_option(env.conf, Options.AUTO_SOURCE_PARALLELISM)) or env.parallelism


_compiled = itertools.count()


def _next_job_id() -> JobID:
    """A new job's id: random, or in application mode the next fixed one (``JobID.fixed``)."""
    seed = os.environ.get(FIXED_JOB_IDS_VAR, "")
    return JobID.fixed(seed, next(_compiled)) if seed else JobID.generate()


def compile_job(env: StreamExecutionEnvironment, job_name: str) -> CompiledJob:
    ts = [t for t in env.transformations if not t.is_union]
    if not ts:
        raise JobDefinitionError("the pipeline is empty: add a source, transformations and a sink")
    inputs = {t.id: _expand(t.inputs) for t in ts}

    mode = _runtime_mode(env, ts)
    auto = _auto_parallelism(env, mode)

    def follows(t: Transformation) -> Transformation | None:
        """Adaptive batch: the upstream whose parallelism ``t`` takes (given none itself, with one
        input, forward: Flink's forward group), so that it chains onto it."""
        if auto is None or t.parallelism or t.is_source or len(inputs.get(t.id, [])) != 1:
            return None
        inp = inputs[t.id][0]
        return inp.upstream if inp.partitioner == Partitioner.FORWARD and not inp.output_tag else None

    def parallelism(t: Transformation) -> int:
        if t.parallelism or auto is None:
            return t.parallelism or env.parallelism
        if t.is_source:
            return auto[1]
        up = follows(t)
        if up is not None:
            return parallelism(up)
        return min(auto[0], t.max_parallelism or env.max_parallelism)  # the upper bound of a decided one

    def dynamic(t: Transformation) -> bool:
        """Its parallelism is decided at run time (adaptive batch; one given none)."""
        if auto is None or t.parallelism or t.is_source or isinstance(t.operator, SparkStage):
            return False
        up = follows(t)
        return dynamic(up) if up is not None else True
    for t in ts:
        if isinstance(t.operator, SparkStage) and mode != "BATCH" and not _checkpointing(env.conf):
            raise JobDefinitionError(f"Spark stage '{t.operator.name}' in a STREAMING job runs once per completed "
                                     "checkpoint, over the rows that checkpoint covers: set "
                                     "execution.checkpointing.interval (or run the job in BATCH mode)")
        if getattr(t.operator, "batch_only", False) and mode != "BATCH":
            assert t.operator is not None
            what = "join without a window" if t.operator.kind == "join" else t.operator.kind.replace("_", " ")
            why = ("the runtime mode is STREAMING" if env.runtime_mode == "STREAMING" else
                   "a source is unbounded: " + ", ".join(repr(u.operator.name) for u in ts if u.operator is not None
                                                         and u.is_source and not getattr(u.operator, "bounded", True)))
            raise JobDefinitionError(f"{what} '{t.operator.name}' runs only in BATCH jobs (bounded inputs), and "
                                     f"{why}; a STREAMING job cannot have one")
    uids = operator_uids(ts, inputs)
    if mode == "BATCH":
        ts = plan_batch(ts, inputs, uids, parallelism, int(_option(env.conf, Options.JOIN_BROADCAST_THRESHOLD)))
    else:
        ts = plan_streaming(ts, inputs, uids, parallelism)
    consumers: dict[int, list[tuple[Transformation, Input]]] = {t.id: [] for t in ts}
    for t in ts:
        for inp in inputs[t.id]:
            consumers[inp.upstream.id].append((t, inp))
    sinks = [t for t in ts if not consumers[t.id]]
    if not any(isinstance(t.operator, (_StagedFileSink, CollectSink)) or getattr(t.operator, "connector_sink", False)
               for t in sinks):
        raise JobDefinitionError("the pipeline has no sink: end it with sink_to_parquet(), sink_to(a connector's "
                                 "sink), print() or collect()")

    max_par = env.max_parallelism
    for t in ts:
        if parallelism(t) > (t.max_parallelism or max_par):
            assert t.operator is not None
            raise JobDefinitionError(f"operator '{t.operator.name}': parallelism {parallelism(t)} exceeds the "
                                     f"max parallelism {t.max_parallelism or max_par}")

    def edge_partitioner(up: Transformation, down: Transformation, p: Partitioner) -> Partitioner:
        if p == Partitioner.FORWARD and parallelism(up) != parallelism(down):
            return Partitioner.REBALANCE
        return p

    for t in ts:  # forward() between different parallelisms is a mistake, as in Flink
        for inp in t.inputs:
            if inp.forward_only and parallelism(inp.upstream) != parallelism(t):
                names = [x.operator.name if x.operator is not None else "union" for x in (inp.upstream, t)]
                raise JobDefinitionError(
                    f"forward() from '{names[0]}' (parallelism {parallelism(inp.upstream)}) to '{names[1]}' "
                    f"(parallelism {parallelism(t)}): forward partitioning needs the same parallelism on both "
                    "sides; use rebalance() or rescale()")

    head_of: dict[int, Transformation] = {}
    chains: dict[int, list[Transformation]] = {}
    #: inputs of a chained operator that are not its chain predecessor (a broadcast join's build
    #: side): they become inputs of the chain's vertex
    side_inputs: dict[int, list[Input]] = {}
    for t in ts:  # transformations are created in topological order
        chainable = False
        ins = inputs[t.id]
        main, sides = ins, []
        if getattr(t.operator, "broadcast", False) and mode == "BATCH":
            build = t.operator.build_input  # type: ignore[union-attr]
            main = [i for i in ins if i.input_index != build]
            sides = [i for i in ins if i.input_index == build]
        if len(main) == 1 and not t.is_source:
            inp = main[0]
            up = inp.upstream
            chainable = (edge_partitioner(up, t, inp.partitioner) == Partitioner.FORWARD and not inp.output_tag
                         and t.chaining and up.chaining and len(consumers[up.id]) == 1
                         and up.slot_sharing_group == t.slot_sharing_group)
        if chainable:
            head = head_of[main[0].upstream.id]
            head_of[t.id] = head
            chains[head.id].append(t)
            assert t.operator is not None
            t.operator.chain_input = main[0].input_index  # type: ignore[attr-defined]
            if sides:
                side_inputs[t.id] = sides
        else:
            head_of[t.id] = t
            chains[t.id] = [t]
    for t in ts:
        if t.operator is not None and t.operator.kind == "spark":  # one output file per downstream subtask
            t.operator.output_splits = max((parallelism(c) for c, _ in consumers[t.id]), default=1)  # type: ignore[attr-defined]
    # BATCH: every exchange between vertices is blocking, so regions run one after another
    exchange = ExchangeMode.BLOCKING if mode == "BATCH" else ExchangeMode.PIPELINED
    assign_memory_fractions([[t.operator for t in chain if t.operator is not None] for chain in chains.values()],
                            [chain[0].slot_sharing_group for chain in chains.values()], mode == "BATCH")

    if mode == "STREAMING" and _restorable(env.conf):
        unnamed = [t.operator.name for t in ts if t.operator is not None and _is_stateful(t.operator)
                   and not getattr(t.operator, "user_uid", False)]
        if unnamed:
            log.warning("stateful operators without a uid (%s): their state is restored from checkpoints and "
                        "savepoints by a uid derived from the pipeline, so changing the pipeline before them may "
                        "break a restore; set one with .uid(\"...\")", ", ".join(repr(n) for n in unnamed))
    job_id = _next_job_id()
    vertex_ids = {hid: JobVertexID.generate() for hid in chains}
    vertices, edges = [], []
    for hid, chain in chains.items():
        head = chain[0]
        names = [t.operator.name for t in chain if t.operator is not None]
        resources = ResourceProfile(sum(t.cpu_cores for t in chain), sum(t.memory_mb for t in chain))
        vertices.append(JobVertex(
            vertex_ids[hid], " -> ".join(names), parallelism(head),
            parallelism(head) if dynamic(head) else head.max_parallelism or max_par, names,
            head.slot_sharing_group, resources, is_source=head.is_source, is_sink=not consumers[chain[-1].id],
            operator_uids=[uids[t.id] for t in chain if t.operator is not None], dynamic_parallelism=dynamic(head)))
        vertex_inputs = [(inp, inp.input_index) for inp in inputs[head.id]]
        next_index = max((i for _, i in vertex_inputs), default=-1) + 1
        for member in chain[1:]:
            for inp in side_inputs.get(member.id, []):
                assert member.operator is not None
                routes = getattr(member.operator, "vertex_inputs", {})
                routes[next_index] = inp.input_index
                member.operator.vertex_inputs = routes  # type: ignore[attr-defined]
                vertex_inputs.append((inp, next_index))
                next_index += 1
        for inp, index in vertex_inputs:
            part = edge_partitioner(inp.upstream, head, inp.partitioner)
            if part == Partitioner.FORWARD and dynamic(head):  # its parallelism is its own: decided later
                part = Partitioner.REBALANCE
            edges.append(JobEdge(vertex_ids[head_of[inp.upstream.id].id], vertex_ids[hid], part,
                                 _exchange(exchange, inp.upstream, head), list(inp.keys), index, inp.output_tag))
    jg = JobGraph(job_id, job_name, _topological(vertices, edges), edges, runtime_mode=mode)
    # the environment's configuration (-D, and what the job's code set: enable_checkpointing,
    # set_state_backend, ...), and what the job runs with, as decided here (the submitted
    # configuration may say AUTOMATIC, or nothing at all): the job's configuration shows these,
    # and the submission keeps them
    jg.config.update({**env.conf, Options.RUNTIME_MODE.key: mode, Options.PARALLELISM.key: str(env.parallelism)})
    jg.validate()
    collect = {t.operator.uid: t.operator for t in ts if isinstance(t.operator, CollectSink)}
    files = [t.operator.path for t in ts if isinstance(t.operator, _StagedFileSink)
             and not isinstance(t.operator, CollectSink)]
    return CompiledJob(jg, {vertex_ids[hid]: [t.operator for t in chain if t.operator is not None]
                            for hid, chain in chains.items()}, collect, files)
