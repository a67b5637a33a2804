"""Operator state (Flink's OperatorStateStore): state of a subtask, not of a key. A user's
``CheckpointedFunction`` keeps list state (split evenly over the new subtasks on a rescale) and
union-list state (every subtask gets all of it on every restore); the broadcast state pattern
keeps broadcast state (a dict every subtask holds the same of; a rescaled job gives each new
subtask a copy). It lives in memory whatever the keyed state backend (as in Flink).

In a snapshot, each state is one table named ``operator.<mode>.<name>`` (``operator_table``) whose schema metadata
carries its redistribution mode (``common/keygroups.py``) and the parallelism that wrote it;
values are pickled cells (``common.state_format.dumps``). A split list restored at another
parallelism arrives as the rows of every old subtask, in subtask order; this subtask keeps every
``parallelism``-th of them from its index on."""

from __future__ import annotations

from typing import Any, Iterable

import pyarrow as pa

from yarnflow.common.api.state import ListStateDescriptor, MapStateDescriptor, StateDescriptorError, StateError
from yarnflow.common.keygroups import BROADCAST, OPERATOR_STATE_PREFIX, REDISTRIBUTE_KEY, SPLIT, UNION, operator_table
from yarnflow.common.state_format import dumps, loads
from yarnflow.worker.state.errors import StateRestoreError

__all__ = ["BroadcastState", "OperatorListState", "OperatorStateStore", "ReadOnlyBroadcastState"]

PARALLELISM_KEY = b"yarnflow.parallelism"


class OperatorListState:
    """A subtask's list (``get``, ``add``, ``add_all``, ``update``, ``clear``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._items: list[Any] = []

    def get(self) -> list[Any]:
        return list(self._items)

    def add(self, value: Any) -> None:
        self._items.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        self._items.extend(values)

    def update(self, values: Iterable[Any]) -> None:
        self._items = list(values)

    def clear(self) -> None:
        self._items = []


class BroadcastState:
    """The dict of a broadcast state descriptor, as ``process_broadcast_element`` may change it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._map: dict[Any, Any] = {}

    def get(self, key: Any, default: Any = None) -> Any:
        return self._map.get(key, default)

    def contains(self, key: Any) -> bool:
        return key in self._map

    def keys(self) -> list[Any]:
        return list(self._map)

    def values(self) -> list[Any]:
        return list(self._map.values())

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._map.items())

    def is_empty(self) -> bool:
        return not self._map

    def put(self, key: Any, value: Any) -> None:
        self._map[key] = value

    def put_all(self, entries: dict[Any, Any]) -> None:
        self._map.update(entries)

    def remove(self, key: Any) -> None:
        self._map.pop(key, None)

    def clear(self) -> None:
        self._map.clear()


class ReadOnlyBroadcastState:
    """A broadcast state as ``process_element`` sees it: readable only (a change there would make
    the subtasks' copies differ)."""

    def __init__(self, state: BroadcastState) -> None:
        self._state = state
        self.name = state.name

    def get(self, key: Any, default: Any = None) -> Any:
        return self._state.get(key, default)

    def contains(self, key: Any) -> bool:
        return self._state.contains(key)

    def keys(self) -> list[Any]:
        return self._state.keys()

    def values(self) -> list[Any]:
        return self._state.values()

    def items(self) -> list[tuple[Any, Any]]:
        return self._state.items()

    def is_empty(self) -> bool:
        return self._state.is_empty()

    def _refuse(self, *args: Any) -> None:
        raise StateError(f"broadcast state {self.name!r} is read-only in process_element: change it in "
                         "process_broadcast_element, where every subtask sees the same rows")

    put = put_all = remove = clear = _refuse


class OperatorStateStore:
    """The operator state of one subtask of one operator."""

    def __init__(self, subtask_index: int, parallelism: int, operator: str) -> None:
        self.subtask_index, self.parallelism, self.operator = subtask_index, parallelism, operator
        self._lists: dict[str, tuple[str, OperatorListState]] = {}
        self._broadcast: dict[str, BroadcastState] = {}
        self._restored: dict[str, pa.Table] = {}
        self.is_restored = False

    # -- the states --------------------------------------------------------------------------
    def get_list_state(self, descriptor: ListStateDescriptor) -> OperatorListState:
        return self._list(descriptor, SPLIT)

    def get_union_list_state(self, descriptor: ListStateDescriptor) -> OperatorListState:
        return self._list(descriptor, UNION)

    def _list(self, descriptor: Any, mode: str) -> OperatorListState:
        if not isinstance(descriptor, ListStateDescriptor):
            raise StateDescriptorError(f"operator list state needs a ListStateDescriptor, got {descriptor!r}")
        self._check_name(descriptor.name, mode)
        known = self._lists.get(descriptor.name)
        if known is not None:
            return known[1]
        state = OperatorListState(descriptor.name)
        table = self._restored.pop(operator_table(mode, descriptor.name), None)
        if table is not None:
            state.update(self._values(descriptor.name, table, mode))
        self._lists[descriptor.name] = (mode, state)
        return state

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> BroadcastState:
        if not isinstance(descriptor, MapStateDescriptor):
            raise StateDescriptorError(f"broadcast state needs a MapStateDescriptor, got {descriptor!r}")
        self._check_name(descriptor.name, BROADCAST)
        state = self._broadcast.get(descriptor.name)
        if state is None:
            state = self._broadcast[descriptor.name] = BroadcastState(descriptor.name)
            table = self._restored.pop(operator_table(BROADCAST, descriptor.name), None)
            if table is not None:
                _require(table, descriptor.name, ("key", "value"))
                state.put_all({loads(k): loads(v) for k, v in zip(table.column("key").to_pylist(),
                                                                   table.column("value").to_pylist())})
        return state

    def _check_name(self, name: str, mode: str) -> None:
        other = self._lists[name][0] if name in self._lists else BROADCAST if name in self._broadcast else None
        if other is not None and other != mode:
            raise StateDescriptorError(f"operator state {name!r} of '{self.operator}' is already a {other} state; "
                                       f"it cannot also be a {mode} state: give it another name")

    def _values(self, name: str, table: pa.Table, mode: str) -> list[Any]:
        _require(table, name, ("value",))
        cells = table.column("value").to_pylist()
        written = int((table.schema.metadata or {}).get(PARALLELISM_KEY, b"0") or 0)
        if mode == SPLIT and written != self.parallelism:  # every old subtask's rows: keep a share
            cells = cells[self.subtask_index::self.parallelism]
        return [loads(c) for c in cells]

    # -- snapshots -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, pa.Table]:
        """Every state as a table, its values pickled now (later changes are not in it)."""
        out: dict[str, pa.Table] = {}
        for name, (mode, state) in self._lists.items():
            out[operator_table(mode, name)] = self._table(
                {"value": pa.array([dumps(v) for v in state.get()], pa.binary())}, mode)
        for name, b in self._broadcast.items():
            items = b.items()
            out[operator_table(BROADCAST, name)] = self._table(
                {"key": pa.array([dumps(k) for k, _ in items], pa.binary()),
                 "value": pa.array([dumps(v) for _, v in items], pa.binary())}, BROADCAST)
        return out

    def _table(self, columns: dict[str, pa.Array], mode: str) -> pa.Table:
        return pa.table(columns).replace_schema_metadata({REDISTRIBUTE_KEY: mode.encode(),
                                                         PARALLELISM_KEY: str(self.parallelism).encode()})

    def restore(self, tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
        """Keep the operator state tables of ``tables`` for the states asked for later; returns
        the others (the keyed backend's)."""
        self.is_restored = True
        rest = {}
        for name, table in tables.items():
            if name.startswith(OPERATOR_STATE_PREFIX):
                self._restored[name] = table
            else:
                rest[name] = table
        return rest


def _require(table: pa.Table, name: str, columns: tuple[str, ...]) -> None:
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise StateRestoreError(f"the restored operator state {name!r} has no column(s) {missing}: not a snapshot "
                                "of this operator")
