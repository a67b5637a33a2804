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


def key_group_range(max_parallelism: int, parallelism: int, index: int) -> range:
    """The key groups subtask ``index`` of ``parallelism`` owns."""
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism + parallelism - 1) // parallelism
    return range(start, end)
