"""What operator snapshots are made of, and the helpers operators share to write and read them.

Operator state goes into checkpoints as Arrow tables with typed columns (the runtime writes them
as Arrow IPC files under ``chk-<n>/``). Where a value's type is not known (a key tuple, a user's
state value, a split payload) it is one binary cell per entry, serialised on its own: never one
pickle of a whole structure.

``snapshot_state`` returns either the tables themselves (small state: a source's position) or an
``AsyncSnapshot``: the task only takes a consistent view of its state (an O(1) freeze, a copy of a
few arrays) and the tables are made from that view on the snapshot writer's thread, so the task
pauses for the freeze, not for the serialisation.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Union

import pyarrow as pa
import pyarrow.compute as pc

from yarnflow.common.keygroups import REDISTRIBUTE_KEY
from yarnflow.common.state_format import dumps, loads
from yarnflow.worker.state.errors import StateRestoreError

__all__ = ["REDISTRIBUTE_KEY", "AsyncSnapshot", "Snapshot", "dumps", "loads", "materialize", "not_redistributable",
           "owned_rows", "require_columns", "single_row"]


class AsyncSnapshot:
    """A snapshot whose tables are made later, off the task thread.

    ``build()`` returns the tables (``{name: pa.Table}``); ``release()`` is called once after it,
    whether it succeeded or not (the backend then folds the frozen view back into its state).
    The snapshot writer calls both on its one thread, snapshots in the order they were taken."""

    def __init__(self, build: Callable[[], dict[str, pa.Table]], release: Callable[[], None] | None = None) -> None:
        self._build = build
        self._release = release
        self._done = False

    def build(self) -> dict[str, pa.Table]:
        return self._build()

    def release(self) -> None:
        if not self._done:
            self._done = True
            if self._release is not None:
                self._release()

    def with_tables(self, tables: dict[str, pa.Table]) -> AsyncSnapshot:
        """This snapshot plus ``tables`` (already made)."""
        return AsyncSnapshot(lambda: {**tables, **self._build()}, self.release)


Snapshot = Union[dict[str, pa.Table], AsyncSnapshot]


def materialize(snapshot: Snapshot) -> dict[str, pa.Table]:
    """The tables of ``snapshot`` (built and released now when it is an AsyncSnapshot)."""
    if isinstance(snapshot, AsyncSnapshot):
        try:
            return snapshot.build()
        finally:
            snapshot.release()
    return snapshot


def require_columns(table: pa.Table, what: str, columns: Iterable[str]) -> None:
    """Raises StateRestoreError when ``table`` (the state ``what``) lacks one of ``columns``."""
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise StateRestoreError(f"the restored state {what!r} has no column(s) {missing} "
                                f"(it has {table.column_names}): not a snapshot of this operator")


def not_redistributable(table: pa.Table) -> pa.Table:
    """``table`` marked as state that a rescaled restore cannot deal out (see REDISTRIBUTE_KEY)."""
    return table.replace_schema_metadata({**(table.schema.metadata or {}), REDISTRIBUTE_KEY: b"none"})


def owned_rows(table: pa.Table, key_group_range: range) -> pa.Table:
    """The rows of ``table`` whose ``key_group`` lies in ``key_group_range``."""
    kg = table.column("key_group")
    mask = pc.and_(pc.greater_equal(kg, key_group_range.start), pc.less(kg, key_group_range.stop))
    return table.filter(mask)


def single_row(tables: dict[str, pa.Table], name: str, columns: Iterable[str]) -> dict[str, Any] | None:
    """The one row of table ``name`` (None when the state has no such table)."""
    table = tables.get(name)
    if table is None:
        return None
    columns = list(columns)
    require_columns(table, name, columns)
    if table.num_rows != 1:
        raise StateRestoreError(f"the restored state {name!r} has {table.num_rows} rows, expected one")
    return table.to_pylist()[0]  # type: ignore[no-any-return]
