"""A user's SourceFunction (``worker/operators/user_source.py``) driven by the harness: rows go
out in batches, a snapshot taken at a tick holds exactly the state of the rows emitted before it,
a stop request ends ``run``, and the function's errors name the operator."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness import OperatorHarness
from yarnflow.common.api import CheckpointedFunction, ListStateDescriptor, SourceFunction
from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.operators.base import UserFunctionError
from yarnflow.worker.operators.user_source import UserSource

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Counter(SourceFunction, CheckpointedFunction):
    def __init__(self, n: int, fail_at: int | None = None) -> None:
        self.n, self.fail_at = n, fail_at

    def initialize_state(self, ctx: Any) -> None:
        self.state = ctx.get_operator_state_store().get_list_state(ListStateDescriptor("next"))
        self.next = (self.state.get() or [0])[0]

    def snapshot_state(self, ctx: Any) -> None:
        self.state.update([self.next])

    def run(self, ctx: Any) -> None:
        while self.next < self.n:
            if self.next == self.fail_at:
                raise RuntimeError("boom")
            ctx.collect({"i": self.next})
            self.next += 1


def test_a_snapshot_holds_the_state_of_exactly_the_rows_emitted_before_it() -> None:
    op = UserSource(Counter(25))
    h = OperatorHarness(op, open=False, batch_size=10)
    op.open()
    snapshots: list[tuple[int, Any]] = []

    def tick() -> bool:
        snapshots.append((len(h.rows()), op.snapshot_state(len(snapshots) + 1)))
        return False

    h.run(tick)
    assert [r["i"] for r in h.rows()] == list(range(25))
    for emitted, tables in snapshots:
        again = UserSource(Counter(25))
        OperatorHarness(again, open=False)
        again.initialize_state(tables)
        again.open()
        assert again.fn.next == emitted  # resumes exactly after the rows it had emitted


def test_a_stop_ends_the_run_and_errors_name_the_operator() -> None:
    h = OperatorHarness(UserSource(Counter(10**9), name="counter"), batch_size=10)
    calls = []
    h.run(lambda: bool(calls.append(1)) or len(calls) >= 3)
    assert len(h.rows()) == 30
    h = OperatorHarness(UserSource(Counter(100, fail_at=7), name="counter"), batch_size=10)
    with pytest.raises(UserFunctionError, match="operator 'counter' raised RuntimeError: boom"):
        h.run()
    with pytest.raises(JobDefinitionError, match="SourceFunction instance"):
        UserSource(Counter)


class Numbering(CheckpointedFunction):
    """A map that numbers its rows, the count kept in list state (Flink's CheckpointedFunction
    on a MapFunction)."""

    def initialize_state(self, ctx: Any) -> None:
        self.state = ctx.get_operator_state_store().get_list_state(ListStateDescriptor("seen"))
        self.seen = sum(self.state.get())
        self.opened = False

    def open(self, ctx: Any) -> None:
        self.opened = True

    def snapshot_state(self, ctx: Any) -> None:
        self.state.update([self.seen])

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        self.seen += 1
        return {**row, "n": self.seen}


def test_a_checkpointed_map_keeps_its_state_across_a_restore_and_stays_in_the_task() -> None:
    from yarnflow.worker.operators.transforms import RowMap
    from yarnflow.worker.pyworker import offloadable

    op = RowMap(Numbering())
    assert not offloadable(op) and op.stateful  # (its state must stay in the task's process)
    assert offloadable(RowMap(lambda r: r)) and not RowMap(lambda r: r).stateful
    h = OperatorHarness(op)
    assert op.fn.opened
    h.batch([{"x": 1}, {"x": 2}])
    snapshot = op.snapshot_state(1)
    again = RowMap(Numbering())
    h2 = OperatorHarness(again, open=False)
    again.initialize_state(snapshot)
    again.open()
    h2.batch([{"x": 3}])
    assert [r["n"] for r in h2.rows()] == [3]

    # rescaled 1 -> 2: the list (one count) is split; one subtask gets it, the other starts at 0
    counts = []
    for index in range(2):
        part = RowMap(Numbering())
        OperatorHarness(part, open=False, subtask_index=index, parallelism=2)
        part.initialize_state(snapshot)
        part.open()
        counts.append(part.fn.seen)
    assert sorted(counts) == [0, 2]
