"""Helpers shared by the operators' ``snapshot_state`` / ``initialize_state``.

Operator state goes into checkpoints as Arrow tables with typed columns (the runtime writes them
as Arrow IPC files under ``chk-<n>/``). Where a value's type is not known (a key tuple, a user's
state value, a split payload) it is one binary cell per entry, serialised on its own: never one
pickle of a whole structure. Serialising at snapshot time is also what makes the snapshot a copy
of mutable Python values."""

from __future__ import annotations

import pickle
from typing import Any, Iterable

import cloudpickle
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["dumps", "loads", "owned_rows", "require_columns", "single_row"]


def dumps(value: Any) -> bytes:
    """``value`` as bytes (plain pickle when it can, else cloudpickle: lambdas, local classes)."""
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - anything plain pickle refuses, cloudpickle may take
        return cloudpickle.dumps(value)  # type: ignore[no-any-return]


def loads(data: bytes) -> Any:
    return pickle.loads(data)


def require_columns(table: pa.Table, what: str, columns: Iterable[str]) -> None:
    """Raises StateRestoreError when ``table`` (the state ``what``) lacks one of ``columns``."""
    from yarnflow.worker.operators.state import StateRestoreError  # state.py imports this module

    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise StateRestoreError(f"the restored state {what!r} has no column(s) {missing} "
                                f"(it has {table.column_names}): not a snapshot of this operator")


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
    from yarnflow.worker.operators.state import StateRestoreError  # state.py imports this module

    columns = list(columns)
    require_columns(table, name, columns)
    if table.num_rows != 1:
        raise StateRestoreError(f"the restored state {name!r} has {table.num_rows} rows, expected one")
    return table.to_pylist()[0]  # type: ignore[no-any-return]
