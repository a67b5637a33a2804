"""The BATCH plan: how each join runs, where keyed aggregations pre-aggregate, and how much of
its slot's managed memory each operator gets. Called by the compiler before it chains operators.

Joins (``HashJoin``): a *broadcast* join when one input may be sent whole to every subtask of
the join: its estimated size (from its sources' files, ``SourceOperator.estimated_bytes``) is at
most ``table.optimizer.join.broadcast-threshold`` and the join type does not output its
unmatched rows (an inner join either input; a left outer, semi or anti join the right one; a
right outer join the left one). The broadcast input is the join's build side; the other input
reaches it by a forward edge, so the join chains onto its probe side's operators and the big
input is never shuffled. Otherwise both inputs are hash-partitioned (a *shuffled hash join*)
and the smaller estimated input is built (the right one when sizes are unknown). A hint
(``with_hint``) overrides the choice; ``sort_merge`` makes it a ``SortMergeJoin``.

Keyed aggregations (``key_by().sum()`` and min, max, count): a ``LocalKeyedAggregate`` is chained
before the hash exchange when the input feeds nothing else, so only partial aggregates cross it;
likewise a sort with a ``limit`` gets a local top-N per upstream subtask.
Other keyed operators (``reduce``, ``aggregate``, ``process``, event-time windows) get their input
through a ``SpillingKeyedInput``, which runs them one partition of keys at a time when their
input does not fit in managed memory.

Spark stages: an input that is a Parquet source nothing else reads is read by Spark from the
source's files (no copy); any other input is written by its upstream subtasks as Parquet files.

Managed memory: the operators that use it (``uses_managed_memory``) and may run at the same time
in one slot share the slot's evenly (Flink's managed-memory fractions). In BATCH jobs every
exchange is blocking, so a slot runs one chain at a time: the chain's users share it. In
STREAMING jobs the whole slot-sharing group runs at once: its users share it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from yarnflow.common.errors import JobDefinitionError
from yarnflow.common.states import Partitioner
from yarnflow.pipeline import Input, Transformation
from yarnflow.worker.operators.base import Operator
from yarnflow.worker.operators.batch.aggregate import LocalKeyedAggregate
from yarnflow.worker.operators.batch.hash_join import HashJoin
from yarnflow.worker.operators.batch.keyed_input import SpillingKeyedInput, wants_spilling_input
from yarnflow.worker.operators.batch.sort import SortOperator
from yarnflow.worker.operators.batch.sort_merge_join import SortMergeJoin
from yarnflow.worker.operators.keyed import KeyedAggregate
from yarnflow.worker.operators.sources import FileSource
from yarnflow.worker.operators.spark import SparkStage, SparkStageInput

log = logging.getLogger(__name__)

__all__ = ["assign_memory_fractions", "plan_batch"]

#: which input of a join may be broadcast (its unmatched rows are not output), by join type
_BROADCASTABLE = {"inner": (0, 1), "left_outer": (1,), "right_outer": (0,), "full_outer": (),
                  "left_semi": (1,), "left_anti": (1,)}


class _Estimates:
    """Estimated bytes of each transformation's output: its sources' estimates, summed."""

    def __init__(self, inputs: dict[int, list[Input]]) -> None:
        self._inputs = inputs
        self._memo: dict[int, int | None] = {}

    def of(self, t: Transformation) -> int | None:
        if t.id not in self._memo:
            if t.is_source:
                self._memo[t.id] = t.operator.estimated_bytes()  # type: ignore[union-attr]
            else:
                parts = [self.of(i.upstream) for i in self._inputs.get(t.id, [])]
                self._memo[t.id] = None if not parts or any(p is None for p in parts) else sum(
                    p for p in parts if p is not None)
        return self._memo[t.id]


def _plan_join(t: Transformation, op: HashJoin, inputs: dict[int, list[Input]], estimates: _Estimates,
               threshold: int, parallelism: Callable[[Transformation], int]) -> None:
    ins = inputs[t.id]
    sides = {i: [inp for inp in ins if inp.input_index == i] for i in (0, 1)}
    est: dict[int, int | None] = {}
    for i in (0, 1):
        parts = [estimates.of(inp.upstream) for inp in sides[i]]
        est[i] = None if any(p is None for p in parts) else sum(p for p in parts if p is not None)
    hint = getattr(op, "hint", None)

    def smaller(candidates: tuple[int, ...]) -> int:
        known = [i for i in candidates if est[i] is not None]
        if len(known) == len(candidates) and known:
            return min(known, key=lambda i: (est[i], -i))  # type: ignore[return-value]
        return 1 if 1 in candidates else candidates[0]

    if hint == "sort_merge":
        smj = SortMergeJoin(op.left_keys, op.right_keys, op.how, join_fn=op.join_fn, name=op.name, uid=op.uid)
        if getattr(op, "user_uid", False):
            smj.user_uid = True  # type: ignore[attr-defined]
        t.operator = smj
        return
    allowed = _BROADCASTABLE[op.how]
    broadcast: int | None = None
    if hint == "broadcast":
        if not allowed:
            raise JobDefinitionError(f"join '{op.name}': a {op.how} join outputs the unmatched rows of both "
                                     "inputs, so neither can be broadcast; use shuffle_hash or sort_merge")
        broadcast = smaller(allowed)
    elif hint is None and threshold > 0:
        fits = tuple(i for i in allowed if est[i] is not None and est[i] <= threshold)  # type: ignore[operator]
        if fits:
            broadcast = smaller(fits)
    if broadcast is None:
        op.build_input = smaller((0, 1))
        log.debug("join '%s': shuffled hash join building its %s input (estimates %s)", op.name,
                  "left" if op.build_input == 0 else "right", est)
        return
    probe = 1 - broadcast
    op.build_input = broadcast
    op.broadcast = True  # type: ignore[attr-defined]
    inputs[t.id] = ([Input(inp.upstream, Partitioner.FORWARD, (), inp.output_tag, probe) for inp in sides[probe]]
                    + [Input(inp.upstream, Partitioner.BROADCAST, (), inp.output_tag, broadcast)
                       for inp in sides[broadcast]])
    if t.parallelism is None and len(sides[probe]) == 1:
        t.parallelism = parallelism(sides[probe][0].upstream)  # chains onto its probe side
    log.info("join '%s': broadcast join of its %s input (estimated %s bytes)", op.name,
             "left" if broadcast == 0 else "right", est[broadcast])


def _local_operator(op: Operator, streaming: bool = False) -> Operator | None:
    """The pre-aggregation (or top-N) to chain before ``t``'s exchange, if it has one (in a
    STREAMING job only the pre-aggregation, which combines each batch on its own)."""
    if isinstance(op, KeyedAggregate):
        return LocalKeyedAggregate(op.keys, op.aggs, name=f"{op.name} (local)", of=op.name)
    if streaming:
        return None
    if isinstance(op, SortOperator) and op.limit is not None and not op.local:
        return SortOperator(op.keys, op.limit, name=f"{op.name} (local top {op.limit})", local=True)
    return None


def _pre_aggregates(t: Transformation, op: Operator, inp: Input, consumers: dict[int, int],
                    parallelism: Callable[[Transformation], int]) -> bool:
    """Whether ``t``'s input ``inp`` can take a local pre-aggregation (or top-N) chained onto it."""
    if inp.output_tag or consumers[inp.upstream.id] != 1 or not (inp.upstream.chaining and t.chaining):
        return False
    if isinstance(op, KeyedAggregate):
        return inp.partitioner == Partitioner.HASH
    return inp.partitioner == Partitioner.REBALANCE and parallelism(inp.upstream) > 1  # a top-N


def _local_aggregates(ts: list[Transformation], inputs: dict[int, list[Input]], uids: dict[int, str],
                      parallelism: Callable[[Transformation], int], streaming: bool = False) -> list[Transformation]:
    consumers: dict[int, int] = {}
    for t in ts:
        for inp in inputs[t.id]:
            consumers[inp.upstream.id] = consumers.get(inp.upstream.id, 0) + 1
    out: list[Transformation] = []
    for t in ts:
        op = t.operator
        ins = inputs[t.id]
        if op is not None and _local_operator(op, streaming) is not None and ins and all(
                _pre_aggregates(t, op, inp, consumers, parallelism) for inp in ins):
            new_inputs = []
            for n, inp in enumerate(ins):
                up = inp.upstream
                local = Transformation(_local_operator(op, streaming), [Input(up, Partitioner.FORWARD)],
                                       parallelism=parallelism(up),
                                       max_parallelism=up.max_parallelism, slot_sharing_group=up.slot_sharing_group,
                                       event_time_column=up.event_time_column)
                inputs[local.id] = list(local.inputs)
                uids[local.id] = f"{uids[t.id]}-local-{n}"
                local.operator.uid = uids[local.id]  # type: ignore[union-attr]
                out.append(local)
                new_inputs.append(Input(local, inp.partitioner, inp.keys, "", inp.input_index))
            inputs[t.id] = new_inputs
            if isinstance(op, KeyedAggregate):
                op.partial_input = True
        out.append(t)
    return out


def _spark_direct_inputs(ts: list[Transformation], inputs: dict[int, list[Input]]) -> list[Transformation]:
    """A Spark stage's input that is a Parquet source nothing else reads, unchanged, is read by
    Spark from the source's files: the source and its ``SparkStageInput`` leave the job."""
    consumers: dict[int, list[Transformation]] = {}
    for t in ts:
        for inp in inputs[t.id]:
            consumers.setdefault(inp.upstream.id, []).append(t)
    gone: set[int] = set()
    for t in ts:
        if not isinstance(t.operator, SparkStage):
            continue
        kept = []
        for inp in inputs[t.id]:
            writer = inp.upstream
            [src_in] = inputs[writer.id]
            src = src_in.upstream
            if (isinstance(writer.operator, SparkStageInput) and isinstance(src.operator, FileSource)
                    and src.operator.fmt == "parquet" and consumers.get(src.id) == [writer] and not src_in.output_tag
                    and src_in.partitioner in (Partitioner.FORWARD, Partitioner.REBALANCE)):
                t.operator.direct[writer.operator.view] = {"path": src.operator.path,
                                                           "columns": src.operator.options.get("columns")}
                gone |= {writer.id, src.id}
                log.info("Spark stage '%s': Spark reads input %r from %s itself", t.operator.name,
                         writer.operator.view, src.operator.path)
            else:
                kept.append(inp)
        inputs[t.id] = kept
    return [t for t in ts if t.id not in gone]


def plan_batch(ts: list[Transformation], inputs: dict[int, list[Input]], uids: dict[int, str],
               parallelism: Callable[[Transformation], int], broadcast_threshold: int) -> list[Transformation]:
    """Plan a BATCH job (see the module docstring): changes ``inputs`` (and operators) in place;
    returns the transformations, with the local aggregations added."""
    ts = _spark_direct_inputs(ts, inputs)
    estimates = _Estimates(inputs)
    for t in ts:
        if isinstance(t.operator, HashJoin):
            _plan_join(t, t.operator, inputs, estimates, broadcast_threshold, parallelism)
        elif t.operator is not None and wants_spilling_input(t.operator) and inputs[t.id] and all(
                inp.partitioner == Partitioner.HASH for inp in inputs[t.id]):
            t.operator = SpillingKeyedInput(t.operator)
    return _local_aggregates(ts, inputs, uids, parallelism)


def assign_memory_fractions(chains: list[list[Operator]], groups: list[str], batch: bool) -> None:
    """Set ``memory_fraction`` on every operator that uses managed memory (see the module
    docstring); ``groups[i]`` is chain i's slot-sharing group."""
    if batch:
        for chain in chains:
            users = [op for op in chain if getattr(op, "uses_managed_memory", False)]
            for op in users:
                op.memory_fraction = 1.0 / len(users)  # type: ignore[attr-defined]
        return
    by_group: dict[str, list[Operator]] = {}
    for chain, group in zip(chains, groups):
        by_group.setdefault(group, []).extend(op for op in chain if getattr(op, "uses_managed_memory", False))
    for users in by_group.values():
        for op in users:
            op.memory_fraction = 1.0 / len(users)  # type: ignore[attr-defined]


def plan_streaming(ts: list[Transformation], inputs: dict[int, list[Input]], uids: dict[int, str],
                   parallelism: Callable[[Transformation], int]) -> list[Transformation]:
    """Plan a STREAMING job: a keyed aggregation's input is combined a batch at a time before
    its exchange (a ``LocalKeyedAggregate`` that holds nothing between batches, so it has no
    state and checkpoint barriers pass it as any stateless operator), so only one partial per
    key and batch crosses the network and reaches the keyed state."""
    return _local_aggregates(ts, inputs, uids, parallelism, streaming=True)

