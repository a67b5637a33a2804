"""One object's state under a transition table: every change goes through ``Lifecycle.move``,
which refuses one the table does not list with an error naming the object and the states it
went through (the history is what tells a bug in a state machine from a race).

The tables live beside their enums (``common/states.py`` for executions, jobs and tasks,
``worker/taskexecutor/slot_table.py`` for slots, ``am/jobmaster/slotpool/slot_pool.py`` for the
JobMaster's pooled slots, ``am/checkpoint/coordinator.py`` for
checkpoints); ``check_table`` is what a test walks each of them with.
"""

from __future__ import annotations

import collections
import enum
from typing import Generic, Mapping, TypeVar

from yarnflow.common.errors import IllegalStateTransition

S = TypeVar("S", bound=enum.Enum)

#: states a lifecycle remembers for its error message
HISTORY = 12


class Lifecycle(Generic[S]):
    """``what`` (e.g. ``"slot 1"``) in state ``initial``, moving only as ``table`` allows."""

    def __init__(self, what: str, table: Mapping[S, frozenset[S]], initial: S) -> None:
        self.what = what
        self._table = table
        self.state = initial
        self.history: collections.deque[S] = collections.deque([initial], maxlen=HISTORY)

    def can_move(self, target: S) -> bool:
        return target in self._table[self.state]

    def move(self, target: S) -> None:
        """Enter ``target``; raises ``IllegalStateTransition`` (nothing changes) if the table
        does not allow it from the current state."""
        if target not in self._table[self.state]:
            trail = " -> ".join(s.name for s in self.history)
            raise IllegalStateTransition(f"{self.what}: illegal transition {self.state.name} -> {target.name} "
                                         f"(its states so far: {trail})")
        self.state = target
        self.history.append(target)


def check_table(table: Mapping[S, frozenset[S]], initial: S, terminal: frozenset[S]) -> None:
    """A transition table is well formed: it covers every state of its enum, each state is
    reachable from ``initial``, exactly the ``terminal`` states have no way out, and every
    other state can still reach a terminal one (none is a trap; a table without terminal
    states, such as a slot's, which cycles until the slot is removed, has no dead end).
    Raises ValueError."""
    states = set(type(initial))
    if set(table) != states:
        raise ValueError(f"the table misses {sorted(s.name for s in states - set(table))}")
    seen = _reachable(table, initial)
    if seen != states:
        raise ValueError(f"unreachable from {initial.name}: {sorted(s.name for s in states - seen)}")
    ends = {s for s in states if not table[s]}
    if ends != set(terminal):
        raise ValueError(f"states with no way out {sorted(s.name for s in ends)} are not the terminal ones "
                         f"{sorted(s.name for s in terminal)}")
    for state in states - ends if ends else ():
        if not _reachable(table, state) & ends:
            raise ValueError(f"{state.name} can never end")


def _reachable(table: Mapping[S, frozenset[S]], start: S) -> set[S]:
    """``start`` and every state some sequence of moves from it reaches."""
    seen, todo = {start}, [start]
    while todo:
        for nxt in table[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen
