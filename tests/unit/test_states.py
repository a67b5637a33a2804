"""State enums: terminal states, the transition tables, and errors naming both states."""

from __future__ import annotations

import enum
import itertools

import pytest

from yarnflow.common.errors import IllegalStateTransition, YarnflowError
from yarnflow.common.states import ExecutionState, JobStatus

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

E = ExecutionState
J = JobStatus

EXECUTION_LEGAL = {
    (E.CREATED, E.SCHEDULED), (E.CREATED, E.CANCELED), (E.CREATED, E.FAILED),
    (E.SCHEDULED, E.DEPLOYING), (E.SCHEDULED, E.CANCELED), (E.SCHEDULED, E.FAILED),
    # (no DEPLOYING -> RUNNING: a deployed task initializes first, as in Flink)
    (E.DEPLOYING, E.INITIALIZING), (E.DEPLOYING, E.FINISHED),
    (E.DEPLOYING, E.CANCELING), (E.DEPLOYING, E.FAILED),
    (E.INITIALIZING, E.RUNNING), (E.INITIALIZING, E.FINISHED), (E.INITIALIZING, E.CANCELING),
    (E.INITIALIZING, E.FAILED),
    (E.RUNNING, E.FINISHED), (E.RUNNING, E.CANCELING), (E.RUNNING, E.FAILED),
    # (no CANCELING -> FINISHED: a task that finishes while cancelled ends CANCELED, Flink's rule)
    (E.CANCELING, E.CANCELED), (E.CANCELING, E.FAILED),
    # a new leader's JobMaster takes over a running attempt, or gives it up (never back to DEPLOYING)
    (E.CREATED, E.RECONCILING), (E.RECONCILING, E.INITIALIZING),
    (E.RECONCILING, E.RUNNING), (E.RECONCILING, E.FINISHED), (E.RECONCILING, E.CANCELING),
    (E.RECONCILING, E.CANCELED), (E.RECONCILING, E.FAILED),
}

JOB_LEGAL = {
    (J.INITIALIZING, J.CREATED), (J.INITIALIZING, J.FAILED), (J.INITIALIZING, J.CANCELED),
    (J.INITIALIZING, J.SUSPENDED),
    (J.CREATED, J.RUNNING), (J.CREATED, J.CANCELLING), (J.CREATED, J.FAILING), (J.CREATED, J.FAILED),
    (J.CREATED, J.CANCELED), (J.CREATED, J.SUSPENDED),
    (J.RUNNING, J.FINISHED), (J.RUNNING, J.FAILING), (J.RUNNING, J.CANCELLING), (J.RUNNING, J.RESTARTING),
    (J.RUNNING, J.SUSPENDED),
    (J.FAILING, J.FAILED), (J.FAILING, J.RESTARTING), (J.FAILING, J.CANCELLING), (J.FAILING, J.SUSPENDED),
    (J.RESTARTING, J.RUNNING), (J.RESTARTING, J.CREATED), (J.RESTARTING, J.CANCELLING),
    (J.RESTARTING, J.FAILED), (J.RESTARTING, J.SUSPENDED), (J.RESTARTING, J.FAILING),
    (J.CANCELLING, J.CANCELED), (J.CANCELLING, J.FAILED), (J.CANCELLING, J.SUSPENDED),
}


def test_execution_terminal_states() -> None:
    assert {s for s in E if s.is_terminal} == {E.FINISHED, E.CANCELED, E.FAILED}


def test_job_globally_terminal_states() -> None:
    assert {s for s in J if s.is_globally_terminal} == {J.FINISHED, J.FAILED, J.CANCELED}
    # SUSPENDED ends this AppMaster's run of the job but not the job: a standby resumes it.
    assert not J.SUSPENDED.is_globally_terminal


@pytest.mark.parametrize(("states", "legal"), [(E, EXECUTION_LEGAL), (J, JOB_LEGAL)],
                         ids=["ExecutionState", "JobStatus"])
def test_transition_table(states: type[enum.Enum], legal: set) -> None:
    for source, target in itertools.product(states, states):
        assert source.can_move_to(target) == ((source, target) in legal), f"{source.name} -> {target.name}"


@pytest.mark.parametrize(("states", "legal"), [(E, EXECUTION_LEGAL), (J, JOB_LEGAL)],
                         ids=["ExecutionState", "JobStatus"])
def test_check_move_to_raises_naming_both_states(states: type[enum.Enum], legal: set) -> None:
    for source, target in itertools.product(states, states):
        if (source, target) in legal:
            source.check_move_to(target)
            continue
        with pytest.raises(IllegalStateTransition) as info:
            source.check_move_to(target, what="attempt abc")
        msg = str(info.value)
        assert f"{source.name} -> {target.name}" in msg
        assert "attempt abc" in msg


def test_illegal_transition_is_a_runtime_error_and_a_yarnflow_error() -> None:
    with pytest.raises(RuntimeError):
        E.FINISHED.check_move_to(E.RUNNING)
    with pytest.raises(YarnflowError):
        J.FINISHED.check_move_to(J.RUNNING)


@pytest.mark.parametrize("source", [s for s in E if s.is_terminal], ids=lambda s: s.name)
def test_terminal_execution_states_have_no_way_out(source: ExecutionState) -> None:
    assert not any(source.can_move_to(t) for t in E)


@pytest.mark.parametrize("source", [s for s in J if s.is_globally_terminal] + [J.SUSPENDED],
                         ids=lambda s: s.name)
def test_final_job_states_have_no_way_out(source: JobStatus) -> None:
    assert not any(source.can_move_to(t) for t in J)


def test_no_state_moves_to_itself() -> None:
    assert not any(s.can_move_to(s) for s in E)
    assert not any(s.can_move_to(s) for s in J)


@pytest.mark.parametrize(("states", "is_end"), [(E, lambda s: s.is_terminal),
                                                (J, lambda s: s.is_globally_terminal)],
                         ids=["ExecutionState", "JobStatus"])
def test_every_state_can_reach_an_end(states: type[enum.Enum], is_end) -> None:
    for start in states:
        seen, todo = {start}, [start]
        while todo:
            for nxt in states:
                if todo[-1].can_move_to(nxt) and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
                    break
            else:
                todo.pop()
        assert any(is_end(s) for s in seen) or start is J.SUSPENDED, start.name


def test_the_happy_paths() -> None:
    for path in ([E.CREATED, E.SCHEDULED, E.DEPLOYING, E.INITIALIZING, E.RUNNING, E.FINISHED],
                 [E.RUNNING, E.CANCELING, E.CANCELED],
                 [J.INITIALIZING, J.CREATED, J.RUNNING, J.FINISHED],
                 [J.RUNNING, J.FAILING, J.RESTARTING, J.RUNNING, J.CANCELLING, J.CANCELED]):
        for a, b in itertools.pairwise(path):
            a.check_move_to(b)
