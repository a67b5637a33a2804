"""Every state machine's transition table (issue 27): each is walked (every state reachable,
none a trap, the terminal ones final), every change of every object goes through its table,
and an illegal change raises naming the object and the states it went through."""

from __future__ import annotations

import enum
import itertools

import pytest

from yarnflow.am.checkpoint.coordinator import CHECKPOINT_TRANSITIONS, CheckpointStats, CheckpointStatus
from yarnflow.am.jobmaster.slotpool.slot_pool import POOL_SLOT_TRANSITIONS, PoolSlotState, SlotPool
from yarnflow.common.errors import IllegalStateTransition
from yarnflow.common.ids import AllocationID, ExecutionAttemptID, JobID
from yarnflow.common.lifecycle import Lifecycle, check_table
from yarnflow.common.messages import ErrorInfo, ResourceProfile
from yarnflow.common.states import (
    _EXECUTION_TRANSITIONS,
    _JOB_TRANSITIONS,
    TASK_TRANSITIONS,
    ExecutionState,
    JobStatus,
)
from yarnflow.worker.taskexecutor.slot_table import SLOT_TRANSITIONS, SlotState, SlotTable

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

E, J = ExecutionState, JobStatus
TERMINAL_EXECUTION = frozenset({E.FINISHED, E.CANCELED, E.FAILED})

TABLES = {
    "execution": (_EXECUTION_TRANSITIONS, E.CREATED, TERMINAL_EXECUTION),
    "task": (TASK_TRANSITIONS, E.DEPLOYING, TERMINAL_EXECUTION),
    "job": (_JOB_TRANSITIONS, J.INITIALIZING, frozenset({J.FINISHED, J.FAILED, J.CANCELED, J.SUSPENDED})),
    "slot": (SLOT_TRANSITIONS, SlotState.FREE, frozenset()),
    "pooled slot": (POOL_SLOT_TRANSITIONS, PoolSlotState.PENDING, frozenset()),
    "checkpoint": (CHECKPOINT_TRANSITIONS, CheckpointStatus.PENDING,
                   frozenset({CheckpointStatus.COMPLETED, CheckpointStatus.ABORTED})),
}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_each_table_is_walked_and_every_listed_move_is_the_only_legal_one(name: str) -> None:
    table, initial, terminal = TABLES[name]
    if name != "task":  # (a TaskExecutor's task never takes CREATED, SCHEDULED, CANCELING or RECONCILING: see below)
        check_table(table, initial, terminal)
    for a, b in itertools.product(type(initial), repeat=2):
        life = Lifecycle("x", table, a)
        if b in table[a]:
            life.move(b)
            assert life.state == b and list(life.history) == [a, b]
        else:
            with pytest.raises(IllegalStateTransition):
                life.move(b)
            assert life.state == a


def test_the_task_table_runs_every_path_a_task_takes_to_its_end() -> None:
    for path in ([E.INITIALIZING, E.RUNNING, E.FINISHED], [E.INITIALIZING, E.RUNNING, E.CANCELED],
                 [E.INITIALIZING, E.FAILED], [E.CANCELED]):
        life = Lifecycle("task", TASK_TRANSITIONS, E.DEPLOYING)
        for state in path:
            life.move(state)
        assert not TASK_TRANSITIONS[life.state]


class Colour(enum.Enum):
    RED = 1
    GREEN = 2
    BLUE = 3


def test_a_bad_table_is_named() -> None:
    with pytest.raises(ValueError, match="misses"):
        check_table({Colour.RED: frozenset()}, Colour.RED, frozenset({Colour.RED}))
    with pytest.raises(ValueError, match="unreachable from RED: \\['BLUE'\\]"):
        check_table({Colour.RED: frozenset({Colour.GREEN}), Colour.GREEN: frozenset(), Colour.BLUE: frozenset()},
                    Colour.RED, frozenset({Colour.GREEN, Colour.BLUE}))
    with pytest.raises(ValueError, match="GREEN can never end"):
        check_table({Colour.RED: frozenset({Colour.GREEN, Colour.BLUE}), Colour.GREEN: frozenset({Colour.GREEN}),
                     Colour.BLUE: frozenset()}, Colour.RED, frozenset({Colour.BLUE}))


def test_an_illegal_move_names_the_object_and_its_history() -> None:
    life = Lifecycle("checkpoint 7", CHECKPOINT_TRANSITIONS, CheckpointStatus.PENDING)
    life.move(CheckpointStatus.FINALIZING)
    life.move(CheckpointStatus.COMPLETED)
    with pytest.raises(IllegalStateTransition, match="checkpoint 7: illegal transition COMPLETED -> ABORTED "
                                                     "\\(its states so far: PENDING -> FINALIZING -> COMPLETED\\)"):
        life.move(CheckpointStatus.ABORTED)


def test_a_checkpoints_status_changes_through_its_table() -> None:
    stats = CheckpointStats(3, 0)
    stats.move(CheckpointStatus.FINALIZING)
    stats.move(CheckpointStatus.ABORTED)
    assert stats.status == CheckpointStatus.ABORTED
    with pytest.raises(IllegalStateTransition, match="checkpoint 3"):
        stats.move(CheckpointStatus.COMPLETED)
    recovered = CheckpointStats(9, 0, CheckpointStatus.COMPLETED)  # found by a new leader: completed
    with pytest.raises(IllegalStateTransition):
        recovered.move(CheckpointStatus.ABORTED)


def test_slots_move_only_through_their_table() -> None:
    table = SlotTable(1, ResourceProfile(1.0, 512))
    job, alloc, task = JobID.generate(), AllocationID.generate(), ExecutionAttemptID.generate()
    table.allocate(0, job, alloc, "jm:1", "tok")
    table.mark_active(alloc)
    table.add_task(alloc, task)
    table.free(alloc)
    table.free(alloc)  # freeing again while its task runs: still RELEASING
    slot = table.slots[0]
    assert slot.state == SlotState.RELEASING
    table.remove_task(task)
    assert slot.state == SlotState.FREE
    assert [s.name for s in slot.life.history] == ["FREE", "ALLOCATED", "ACTIVE", "RELEASING", "FREE"]
    with pytest.raises(IllegalStateTransition, match="slot 0: illegal transition FREE -> ACTIVE"):
        slot.life.move(SlotState.ACTIVE)


def test_pooled_slots_move_only_through_their_table() -> None:
    from yarnflow.common.ids import ResourceID

    pool = SlotPool()
    alloc, fresh = pool.acquire("group")
    assert not fresh
    pool.offer(alloc, ResourceID("te-1"), "te-1:1", "te-1:2")
    pool.release(alloc, 10)
    pool.release(alloc, 20)  # released again: still IDLE, idle since the later release
    assert pool.take_idle("other") == alloc
    slot = pool.slots[alloc]
    assert [s.name for s in slot.life.history] == ["PENDING", "IN_USE", "IDLE", "IN_USE"]
    with pytest.raises(IllegalStateTransition, match=f"pooled slot {alloc}: illegal transition IN_USE -> PENDING"):
        slot.move(PoolSlotState.PENDING)


def test_force_failed_goes_through_failing_and_leaves_a_suspended_job_alone() -> None:
    from tests.unit.test_job_master_core import pipeline, started

    d, _ = started(pipeline(1))
    assert d.core.status == J.RUNNING
    d.core.force_failed(ErrorInfo("Boom", "broken core"))
    assert d.core.status == J.FAILED
    d2, _ = started(pipeline(1))
    d2.core.suspend("leadership lost")
    d2.core.force_failed(ErrorInfo("Boom", "broken core"))
    assert d2.core.status == J.SUSPENDED  # the new leader runs it: this one must not fail it
