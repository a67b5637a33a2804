"""What both sides agree on about key groups and state tables: which key groups a subtask
owns (Flink's KeyGroupRangeAssignment), and how a state table is dealt to the subtasks of
another parallelism (the savepoint writer on the AppMaster reads it from each table's schema)."""

from __future__ import annotations

#: Schema metadata of a state table whose rows cannot be dealt to the subtasks of another
#: parallelism (a position in a per-subtask slice of the input). How state is redistributed on
#: a rescaled restore: a table with a ``key_group`` column by key-group range; one marked with
#: this key not at all (the restore is refused); any other (operator state: held splits,
#: pending files) whole, old subtask ``i`` to new subtask ``i % parallelism``.
REDISTRIBUTE_KEY = b"yarnflow.redistribute"
#: The values of REDISTRIBUTE_KEY for user operator state (``worker/state/operator_state.py``):
#: ``split`` (list state: every new subtask reads every old subtask's rows and keeps an even
#: share of them), ``union`` (union-list state: every subtask gets every row, on every restore,
#: also at the same parallelism), ``broadcast`` (broadcast state: every subtask holds the same;
#: new subtask ``j`` takes old subtask ``j % old parallelism``'s copy).
SPLIT, UNION, BROADCAST = "split", "union", "broadcast"
#: the names of user operator state tables: ``operator.<mode>.<state name>`` (``operator_table``)
OPERATOR_STATE_PREFIX = "operator."


def operator_table(mode: str, name: str) -> str:
    """The table (and file) name of a user's operator state ``name``: the name as it is when
    it is made of letters, digits, '_' and '-', else its UTF-8 bytes in hex after an 'x' (a
    state file's name must be safe on every filesystem)."""
    safe = name if name.replace("_", "a").replace("-", "a").isalnum() and name.isascii() else "x" + name.encode().hex()
    return f"{OPERATOR_STATE_PREFIX}{mode}.{safe}"


def union_state(name: str) -> bool:
    """Whether the state table ``name`` is union-list state (every subtask restores all of it)."""
    return name.startswith(f"{OPERATOR_STATE_PREFIX}{UNION}.")


def key_group_range(max_parallelism: int, parallelism: int, index: int) -> range:
    """The key groups subtask ``index`` of ``parallelism`` owns."""
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism + parallelism - 1) // parallelism
    return range(start, end)
