"""The JobMaster's slot pool: reuse of idle slots (the preferred one first), idle timeout."""

from __future__ import annotations

import pytest

from yarnflow.am.jobmaster.slotpool.slot_pool import PoolSlotState, SlotPool
from yarnflow.common.ids import ResourceID

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

TE_A, TE_B = ResourceID("te-a"), ResourceID("te-b")


def test_new_allocation_is_pending_until_offered():
    pool = SlotPool()
    aid, reused = pool.acquire("g0")
    assert not reused and pool.slots[aid].state == PoolSlotState.PENDING
    assert pool.offer(aid, TE_A, "a:1", "a:2")
    assert pool.slots[aid].state == PoolSlotState.IN_USE and pool.slots[aid].resource_id == TE_A
    assert pool.offer(aid, TE_A, "a:1", "a:2")  # a duplicate offer is fine
    assert not pool.offer(aid, TE_B, "b:1", "b:2")  # the same allocation from another TE is not
    assert not pool.offer("unknown", TE_A, "a:1", "a:2")


def test_released_slot_is_kept_idle_and_reused_preferring_the_previous_one():
    pool = SlotPool()
    a1, _ = pool.acquire("g0")
    a2, _ = pool.acquire("g1")
    pool.offer(a1, TE_A, "a:1", "a:2")
    pool.offer(a2, TE_B, "b:1", "b:2")
    pool.release(a1, now_ms=100)
    pool.release(a2, now_ms=100)
    got, reused = pool.acquire("g1-restarted", preferred=a2)
    assert reused and got == a2  # back to the same slot
    got, reused = pool.acquire("g0-restarted", preferred=None)
    assert reused and got == a1
    assert pool.owner_of(a1) == "g0-restarted"


def test_idle_timeout_returns_slots():
    pool = SlotPool()
    a1, _ = pool.acquire("g0")
    pool.offer(a1, TE_A, "a:1", "a:2")
    pool.release(a1, now_ms=1000)
    assert pool.expired(now_ms=1500, idle_timeout_ms=1000) == []
    [gone] = pool.expired(now_ms=2000, idle_timeout_ms=1000)
    assert gone.allocation_id == a1 and a1 not in pool.slots


def test_releasing_a_pending_slot_cancels_it_and_lost_taskexecutor_drops_its_slots():
    pool = SlotPool()
    a1, _ = pool.acquire("g0")
    assert pool.release(a1, now_ms=0) is True and a1 not in pool.slots
    a2, _ = pool.acquire("g1")
    a3, _ = pool.acquire("g2")
    pool.offer(a2, TE_A, "a:1", "a:2")
    pool.offer(a3, TE_B, "b:1", "b:2")
    assert [s.allocation_id for s in pool.lost(TE_A)] == [a2]
    assert list(pool.slots) == [a3]


def test_region_sharing_groups_put_subtask_i_of_each_vertex_together():
    from yarnflow.am.jobmaster.execution_graph import region_sharing_groups
    from yarnflow.am.scheduler.regions import compute_pipelined_regions
    from yarnflow.common.ids import JobID, JobVertexID
    from yarnflow.common.messages import JobEdge, JobGraph, JobVertex
    from yarnflow.common.states import Partitioner

    a, b, c = JobVertexID("a"), JobVertexID("b"), JobVertexID("c")
    jg = JobGraph(JobID("j"), "j", [JobVertex(a, "a", 2, 8), JobVertex(b, "b", 3, 8),
                                    JobVertex(c, "c", 2, 8, slot_sharing_group="other")],
                  [JobEdge(a, b, Partitioner.HASH, key_columns=["k"]), JobEdge(b, c, Partitioner.REBALANCE)])
    [region] = compute_pipelined_regions(jg)
    groups = region_sharing_groups(jg, region)
    members = [sorted((s.vertex_id, s.index) for s in m) for _, m in groups]
    assert members == [[("a", 0), ("b", 0)], [("a", 1), ("b", 1)], [("b", 2)], [("c", 0)], [("c", 1)]]
    for _, m in groups:  # never two subtasks of one vertex in a slot
        assert len({s.vertex_id for s in m}) == len(m)
