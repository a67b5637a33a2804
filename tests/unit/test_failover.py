"""Pipelined regions of the execution topology and the failover strategies (full, region)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from yarnflow.am.scheduler.failover import (
    PartitionUnavailable,
    RestartAllFailoverStrategy,
    RestartPipelinedRegionFailoverStrategy,
    find_partition_unavailable,
    make_failover_strategy,
)
from yarnflow.am.scheduler.regions import (
    PipelinedRegion,
    SubtaskId,
    compute_pipelined_regions,
    regions_by_subtask,
    topological_region_order,
)
from yarnflow.common.errors import ConfigurationError
from yarnflow.common.ids import JobID, JobVertexID
from yarnflow.common.messages import JobEdge, JobGraph, JobVertex
from yarnflow.common.states import ExchangeMode, Partitioner

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

FWD, HASH, REB, BC = Partitioner.FORWARD, Partitioner.HASH, Partitioner.REBALANCE, Partitioner.BROADCAST
PIPE, BLOCK = ExchangeMode.PIPELINED, ExchangeMode.BLOCKING


def graph(vertices: dict[str, int], edges: list[tuple[str, str, Partitioner, ExchangeMode]]) -> JobGraph:
    """``graph({"a": 2, "b": 2}, [("a", "b", FWD, PIPE)])``; vertices in topological order."""
    jvs = [JobVertex(JobVertexID(n), n, p, max(p, 128)) for n, p in vertices.items()]
    jes = [JobEdge(JobVertexID(a), JobVertexID(b), part, mode, ["k"] if part == HASH else [])
           for a, b, part, mode in edges]
    g = JobGraph(JobID("job-1"), "test", jvs, jes)
    g.validate()
    return g


def s(vertex: str, index: int) -> SubtaskId:
    return SubtaskId(vertex, index)


def subtasks(spec: str) -> frozenset[SubtaskId]:
    """``"a0 b1"`` -> {a#0, b#1}."""
    return frozenset(s(tok[:-1], int(tok[-1])) for tok in spec.split())


def region_sets(regions: Iterable[PipelinedRegion]) -> set[frozenset[SubtaskId]]:
    return {r.subtasks for r in regions}


def everything(g: JobGraph) -> set[SubtaskId]:
    return {s(str(v.vertex_id), k) for v in g.vertices for k in range(v.parallelism)}


def assert_topological(regions: list[PipelinedRegion]) -> None:
    assert [r.region_id for r in regions] == list(range(len(regions)))
    for r in regions:
        assert all(p.region_id < r.region_id for p in r.consumed_blocking_regions)
        assert all(c.region_id > r.region_id for c in r.consumer_regions)


# ---- regions ----------------------------------------------------------------------------------

def test_subtask_id_is_a_small_value_type() -> None:
    assert s("a", 1) == SubtaskId("a", 1) and len({s("a", 1), s("a", 1)}) == 1
    assert str(s("map", 3)) == "map#3"
    assert sorted([s("b", 0), s("a", 2), s("a", 1)]) == [s("a", 1), s("a", 2), s("b", 0)]


def test_forward_pipelined_chain_is_one_region_per_subtask_index() -> None:
    g = graph({"a": 3, "b": 3, "c": 3}, [("a", "b", FWD, PIPE), ("b", "c", FWD, PIPE)])
    regions = compute_pipelined_regions(g)
    assert region_sets(regions) == {subtasks("a0 b0 c0"), subtasks("a1 b1 c1"), subtasks("a2 b2 c2")}
    assert all(not r.consumed_blocking_regions and not r.consumer_regions for r in regions)


@pytest.mark.parametrize("partitioner", [HASH, REB, BC])
def test_all_to_all_pipelined_edge_joins_every_subtask(partitioner: Partitioner) -> None:
    g = graph({"a": 3, "b": 2}, [("a", "b", partitioner, PIPE)])
    (region,) = compute_pipelined_regions(g)
    assert region.subtasks == subtasks("a0 a1 a2 b0 b1")
    assert len(region) == 5 and s("b", 1) in region


def test_blocking_edges_split_regions_and_link_producers_to_consumers() -> None:
    # a(2) -fwd,pipe-> b(2) -hash,blocking-> c(2) -fwd,pipe-> d(2)
    g = graph({"a": 2, "b": 2, "c": 2, "d": 2},
              [("a", "b", FWD, PIPE), ("b", "c", HASH, BLOCK), ("c", "d", FWD, PIPE)])
    regions = compute_pipelined_regions(g)
    assert region_sets(regions) == {subtasks("a0 b0"), subtasks("a1 b1"), subtasks("c0 d0"), subtasks("c1 d1")}
    by = regions_by_subtask(regions)
    producers = {by[s("a", 0)], by[s("a", 1)]}
    consumers = {by[s("c", 0)], by[s("c", 1)]}
    for p in producers:
        assert p.consumer_regions == consumers and not p.consumed_blocking_regions
    for c in consumers:
        assert c.consumed_blocking_regions == producers and not c.consumer_regions
    # the all-to-all blocking edge is one exchange, not 2 x 2 pairs
    (exchange,) = by[s("c", 0)].consumed_exchanges
    assert exchange.producers == (s("b", 0), s("b", 1)) and exchange.is_deterministic
    assert set(exchange.consumer_regions) == consumers
    assert_topological(regions)


def test_a_persistent_blocking_edge_splits_regions_as_a_blocking_one() -> None:
    g = graph({"a": 2, "b": 1}, [("a", "b", REB, ExchangeMode.BLOCKING_PERSISTENT)])
    regions = compute_pipelined_regions(g)
    assert region_sets(regions) == {subtasks("a0"), subtasks("a1"), subtasks("b0")}
    assert regions_by_subtask(regions)[s("b", 0)].consumed_blocking_regions == {
        regions_by_subtask(regions)[s("a", 0)], regions_by_subtask(regions)[s("a", 1)]}


def test_forward_blocking_edge_links_subtask_i_to_subtask_i_only() -> None:
    g = graph({"a": 3, "b": 3}, [("a", "b", FWD, BLOCK)])
    regions = compute_pipelined_regions(g)
    assert len(regions) == 6
    by = regions_by_subtask(regions)
    for i in range(3):
        assert by[s("b", i)].consumed_blocking_regions == {by[s("a", i)]}
        assert by[s("a", i)].consumer_regions == {by[s("b", i)]}
    assert_topological(regions)


def test_pipelined_diamond_is_one_region() -> None:
    g = graph({"a": 2, "b": 2, "c": 3, "d": 2},
              [("a", "b", FWD, PIPE), ("a", "c", REB, PIPE), ("b", "d", FWD, PIPE), ("c", "d", HASH, PIPE)])
    (region,) = compute_pipelined_regions(g)
    assert region.subtasks == everything(g)


def test_mixed_diamond() -> None:
    # a -fwd,pipe-> b -hash,blocking-> d ;  a -hash,blocking-> c -fwd,pipe-> d
    g = graph({"a": 2, "b": 2, "c": 2, "d": 2},
              [("a", "b", FWD, PIPE), ("a", "c", HASH, BLOCK), ("b", "d", HASH, BLOCK), ("c", "d", FWD, PIPE)])
    regions = compute_pipelined_regions(g)
    assert region_sets(regions) == {subtasks("a0 b0"), subtasks("a1 b1"), subtasks("c0 d0"), subtasks("c1 d1")}
    by = regions_by_subtask(regions)
    upstream = {by[s("a", 0)], by[s("a", 1)]}
    for i in range(2):
        assert by[s("d", i)].consumed_blocking_regions == upstream
        # two exchanges in: a->c and b->d
        assert len(by[s("c", i)].consumed_exchanges) == 2
    assert_topological(regions)
    assert {r.region_id for r in regions if r in upstream} == {0, 1}


def test_two_sources_joined() -> None:
    # s1(2) -hash,blocking-> join(3) <-hash,pipe- s2(1)
    g = graph({"s1": 2, "s2": 1, "join": 3}, [("s1", "join", HASH, BLOCK), ("s2", "join", HASH, PIPE)])
    regions = compute_pipelined_regions(g)
    assert region_sets(regions) == {subtasks("s10"), subtasks("s11"), subtasks("s20 join0 join1 join2")}
    by = regions_by_subtask(regions)
    join = by[s("join", 0)]
    assert join.consumed_blocking_regions == {by[s("s1", 0)], by[s("s1", 1)]}
    assert topological_region_order(regions)[-1] is join
    assert_topological(regions)


def test_regions_depending_on_each_other_in_a_cycle_are_merged() -> None:
    # a -hash,blocking-> b -hash,blocking-> c, and a -fwd,pipe-> c: {a0,c0} needs b, b needs {a0,c0}
    g = graph({"a": 2, "b": 2, "c": 2}, [("a", "b", HASH, BLOCK), ("b", "c", HASH, BLOCK), ("a", "c", FWD, PIPE)])
    (region,) = compute_pipelined_regions(g)
    assert region.subtasks == everything(g)
    assert not region.consumed_blocking_regions and not region.consumer_regions


def test_blocking_edge_inside_a_region() -> None:
    # a -fwd,pipe-> b -hash,pipe-> c joins everything; the blocking a -> c edge stays inside
    g = graph({"a": 2, "b": 2, "c": 1}, [("a", "b", FWD, PIPE), ("a", "c", HASH, BLOCK), ("b", "c", HASH, PIPE)])
    (region,) = compute_pipelined_regions(g)
    assert region.subtasks == everything(g)
    assert not region.consumed_blocking_regions
    (exchange,) = region.consumed_exchanges
    assert exchange.producer_regions == (region,) == exchange.consumer_regions


def test_topological_order_of_a_chain_of_blocking_stages_and_of_any_subset() -> None:
    g = graph({"a": 2, "b": 3, "c": 1, "d": 2},
              [("a", "b", REB, BLOCK), ("b", "c", HASH, BLOCK), ("c", "d", BC, BLOCK)])
    regions = compute_pipelined_regions(g)
    assert [sorted(r.subtasks)[0].vertex_id for r in regions] == ["a", "a", "b", "b", "b", "c", "d", "d"]
    assert_topological(regions)
    subset = [regions[6], regions[0], regions[5], regions[3]]
    assert topological_region_order(subset) == [regions[0], regions[3], regions[5], regions[6]]
    assert topological_region_order(reversed(regions)) == regions


def test_unequal_forward_edge_is_rejected() -> None:
    g = JobGraph(JobID("j"), "bad", [JobVertex(JobVertexID("a"), "a", 2, 8), JobVertex(JobVertexID("b"), "b", 3, 8)],
                 [JobEdge(JobVertexID("a"), JobVertexID("b"), FWD)])
    with pytest.raises(ValueError, match="parallelism 2 and 3"):
        compute_pipelined_regions(g)


def test_thousand_by_thousand_all_to_all_is_one_region() -> None:
    g = graph({"a": 1000, "b": 1000}, [("a", "b", HASH, PIPE)])
    (region,) = compute_pipelined_regions(g)
    assert len(region.subtasks) == 2000


def test_five_thousand_by_five_thousand_all_to_all_computes() -> None:
    g = graph({"a": 5000, "b": 5000}, [("a", "b", REB, PIPE)])
    (region,) = compute_pipelined_regions(g)
    assert len(region) == 10_000
    strategy = RestartPipelinedRegionFailoverStrategy(g)
    assert len(strategy.tasks_to_restart(s("b", 17), None, lambda _: False, lambda _: True)) == 10_000


def test_five_thousand_by_five_thousand_blocking_all_to_all_computes() -> None:
    g = graph({"a": 5000, "b": 5000}, [("a", "b", HASH, BLOCK)])
    regions = compute_pipelined_regions(g)
    assert len(regions) == 10_000
    assert len(regions[-1].consumed_exchanges) == 1 and len(regions[-1].consumed_blocking_regions) == 5000
    strategy = RestartPipelinedRegionFailoverStrategy(g)
    producers_done = lambda t: t.vertex_id == "a"  # noqa: E731
    assert strategy.tasks_to_restart(s("b", 4999), None, producers_done, lambda _: True) == {s("b", 4999)}


# ---- failover: full ----------------------------------------------------------------------------

def never(_: SubtaskId) -> bool:
    return False


def always(_: SubtaskId) -> bool:
    return True


def test_full_strategy_restarts_every_subtask() -> None:
    g = graph({"a": 2, "b": 3}, [("a", "b", HASH, BLOCK)])
    strategy = make_failover_strategy("full", g)
    assert isinstance(strategy, RestartAllFailoverStrategy)
    assert strategy.tasks_to_restart(s("b", 2), RuntimeError("boom"), always, always) == everything(g)
    with pytest.raises(KeyError):
        strategy.tasks_to_restart(s("zz", 0), None, never, always)


def test_make_failover_strategy_names() -> None:
    g = graph({"a": 1}, [])
    assert isinstance(make_failover_strategy("Region", g), RestartPipelinedRegionFailoverStrategy)
    with pytest.raises(ValueError, match="jobmanager.execution.failover-strategy") as info:
        make_failover_strategy("restart-individual", g)
    assert isinstance(info.value, ConfigurationError)


# ---- failover: region --------------------------------------------------------------------------

def test_pipelined_job_restarts_everything_connected() -> None:
    g = graph({"a": 2, "b": 2, "c": 2}, [("a", "b", FWD, PIPE), ("b", "c", HASH, PIPE)])
    strategy = make_failover_strategy("region", g)
    assert strategy.tasks_to_restart(s("a", 0), None, never, always) == everything(g)


def test_forward_only_pipelined_job_restarts_only_the_failed_chain() -> None:
    g = graph({"a": 3, "b": 3}, [("a", "b", FWD, PIPE)])
    strategy = make_failover_strategy("region", g)
    assert strategy.tasks_to_restart(s("b", 1), None, never, always) == subtasks("a1 b1")


def batch_graph(partitioner: Partitioner = HASH) -> JobGraph:
    """a(2) -blocking-> b(2) -fwd,pipe-> c(2): regions {a0} {a1} {b0 c0} {b1 c1}."""
    return graph({"a": 2, "b": 2, "c": 2}, [("a", "b", partitioner, BLOCK), ("b", "c", FWD, PIPE)])


def test_consumer_failure_with_producers_finished_and_available_restarts_only_its_region() -> None:
    strategy = make_failover_strategy("region", batch_graph())
    done = lambda t: t.vertex_id == "a"  # noqa: E731
    assert strategy.tasks_to_restart(s("c", 0), RuntimeError("x"), done, always) == subtasks("b0 c0")


def test_partition_unavailable_restarts_the_producer_region_too() -> None:
    strategy = make_failover_strategy("region", batch_graph())
    done = lambda t: t.vertex_id == "a"  # noqa: E731
    lost = PartitionUnavailable(s("a", 1))
    # a1's new output is read by the unfinished {b1 c1} as well; a0 keeps its output
    assert strategy.tasks_to_restart(s("b", 0), lost, done, always) == subtasks("a1 b0 c0 b1 c1")
    # the same cause, wrapped by the task's own exception
    try:
        try:
            raise lost
        except PartitionUnavailable as exc:
            raise RuntimeError("fetch failed") from exc
    except RuntimeError as wrapped:
        assert find_partition_unavailable(wrapped) is lost
        assert strategy.tasks_to_restart(s("b", 0), wrapped, done, always) == subtasks("a1 b0 c0 b1 c1")


def test_other_lost_results_of_a_restarting_region_are_produced_again() -> None:
    strategy = make_failover_strategy("region", batch_graph())
    done = lambda t: t.vertex_id == "a"  # noqa: E731
    gone = {s("a", 0), s("a", 1)}  # both producers ran on the lost TaskExecutor
    restart = strategy.tasks_to_restart(s("b", 0), PartitionUnavailable(s("a", 1)), done, lambda t: t not in gone)
    assert restart == everything(batch_graph())


def test_finished_consumers_of_a_deterministic_exchange_keep_their_results() -> None:
    # a(2) -hash,blocking-> b(2) -hash,blocking-> d(1); b1 already finished, b0 cannot read a1
    g = graph({"a": 2, "b": 2, "d": 1}, [("a", "b", HASH, BLOCK), ("b", "d", HASH, BLOCK)])
    strategy = make_failover_strategy("region", g)
    done = {s("a", 0), s("a", 1), s("b", 1)}.__contains__
    restart = strategy.tasks_to_restart(s("b", 0), PartitionUnavailable(s("a", 1)), done, always)
    assert restart == subtasks("a1 b0 d0")  # d has not finished: it must read b0's new output


@pytest.mark.parametrize("partitioner, expected", [(HASH, "a0 b0 c0"), (REB, "a0 b0 b1 c0")])
def test_non_deterministic_exchange_restarts_finished_consumers(partitioner: Partitioner, expected: str) -> None:
    # a(2) -?,blocking-> b(2) -hash,blocking-> c(1); a and b finished, c cannot read b0, whose
    # TaskExecutor also held a0's output
    g = graph({"a": 2, "b": 2, "c": 1}, [("a", "b", partitioner, BLOCK), ("b", "c", HASH, BLOCK)])
    strategy = make_failover_strategy("region", g)
    done = lambda t: t.vertex_id in ("a", "b")  # noqa: E731
    available = lambda t: t not in (s("a", 0), s("b", 0))  # noqa: E731
    restart = strategy.tasks_to_restart(s("c", 0), PartitionUnavailable(s("b", 0)), done, available)
    # with REBALANCE a0's new output differs from what the finished b1 read, so b1 runs again;
    # a1's output is still there either way
    assert restart == subtasks(expected)


def test_changed_output_propagates_downstream_through_deterministic_exchanges() -> None:
    # a(2) -rebalance-> b(2) -hash-> c(2) -hash-> d(1), all blocking; a, b, c finished, d running
    g = graph({"a": 2, "b": 2, "c": 2, "d": 1},
              [("a", "b", REB, BLOCK), ("b", "c", HASH, BLOCK), ("c", "d", HASH, BLOCK)])
    strategy = make_failover_strategy("region", g)
    done = lambda t: t.vertex_id != "d"  # noqa: E731
    lost_te = {s("a", 0), s("b", 0), s("c", 0)}
    restart = strategy.tasks_to_restart(s("d", 0), PartitionUnavailable(s("c", 0)), done,
                                        lambda t: t not in lost_te)
    # b1 reads a0's new (different) output, so b1's output differs too, so c1 runs again
    assert restart == everything(g) - {s("a", 1)}


def test_restart_of_a_producer_region_restarts_unfinished_consumers() -> None:
    # a source region fails while its blocking consumer already runs (e.g. reading a0's output)
    strategy = make_failover_strategy("region", graph({"a": 2, "b": 2}, [("a", "b", FWD, BLOCK)]))
    done = {s("a", 1)}.__contains__
    assert strategy.tasks_to_restart(s("a", 0), None, done, always) == subtasks("a0 b0")


def test_regions_to_restart_come_in_topological_order() -> None:
    g = graph({"a": 2, "b": 2, "c": 1}, [("a", "b", HASH, BLOCK), ("b", "c", HASH, BLOCK)])
    strategy = RestartPipelinedRegionFailoverStrategy(g)
    regions = strategy.regions_to_restart(s("c", 0), PartitionUnavailable(s("a", 0)), never, always)
    assert regions == topological_region_order(regions)
    assert strategy.region_of(s("a", 0)) in regions
    with pytest.raises(KeyError, match="not in the job"):
        strategy.tasks_to_restart(s("x", 0), None, never, always)


def test_all_lists_the_public_names() -> None:
    import inspect

    from yarnflow.am.scheduler import failover, regions

    for module in (regions, failover):
        public = {name for name, obj in vars(module).items()
                  if not name.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))
                  and obj.__module__ == module.__name__}
        assert set(module.__all__) == public, module.__name__


def brute_force_regions(g: JobGraph) -> set[frozenset[SubtaskId]]:
    """Channel by channel: join pipelined channels, then merge regions that reach each other
    through blocking channels (transitive closure)."""
    subs = sorted(everything(g))
    parent = {t: t for t in subs}

    def find(t: SubtaskId) -> SubtaskId:
        while parent[t] != t:
            t = parent[t]
        return t

    def channels(e: JobEdge) -> list[tuple[SubtaskId, SubtaskId]]:
        a, b = g.vertex(e.source_vertex_id), g.vertex(e.target_vertex_id)
        if e.partitioner == FWD:
            return [(s(a.vertex_id, k), s(b.vertex_id, k)) for k in range(a.parallelism)]
        return [(s(a.vertex_id, i), s(b.vertex_id, j)) for i in range(a.parallelism) for j in range(b.parallelism)]

    for e in g.edges:
        if e.exchange_mode == PIPE:
            for x, y in channels(e):
                parent[find(x)] = find(y)
    while True:
        reach = {find(t): {find(t)} for t in subs}
        for e in g.edges:
            if e.exchange_mode == BLOCK:
                for x, y in channels(e):
                    reach[find(x)].add(find(y))
        changed = True
        while changed:
            changed = False
            for out in reach.values():
                more = set().union(*(reach[o] for o in out)) - out
                if more:
                    out |= more
                    changed = True
        cyc = [(r, o) for r, out in reach.items() for o in out if o != r and r in reach[o]]
        if not cyc:
            break
        r, o = cyc[0]
        parent[find(r)] = find(o)
    groups: dict[SubtaskId, set[SubtaskId]] = {}
    for t in subs:
        groups.setdefault(find(t), set()).add(t)
    return {frozenset(v) for v in groups.values()}


@pytest.mark.parametrize("seed", range(40))
def test_regions_match_a_channel_by_channel_computation(seed: int) -> None:
    import random

    rng = random.Random(seed)
    n = rng.randint(2, 6)
    par = {f"v{i}": rng.choice([1, 2, 2, 3]) for i in range(n)}
    names = list(par)
    edges = []
    for j in range(1, n):
        for i in rng.sample(range(j), k=min(j, rng.randint(1, 2))):
            a, b = names[i], names[j]
            part = rng.choice([FWD, HASH, REB, BC]) if par[a] == par[b] else rng.choice([HASH, REB, BC])
            edges.append((a, b, part, rng.choice([PIPE, BLOCK])))
    g = graph(par, edges)
    regions = compute_pipelined_regions(g)
    assert region_sets(regions) == brute_force_regions(g)
    assert_topological(regions)
