"""Keyed state, scoped to key groups so it can be rescaled (Flink's HeapKeyedStateBackend).

State lives in ``{key_group: {state_name: {key: value}}}``. A key is always a tuple of the
key column values (a one-column key is a 1-tuple). The operator sets the current key (and
its key group, computed by ``yarnflow.worker.runtime.keygroups.key_groups``) before calling
user code; state objects read and write the entry of that current key.

Checkpoints: ``snapshot_table()`` is the state as one Arrow table, one row per (state, key):
``key_group`` (int32), ``state`` (string), ``kind`` (string: value, list, map, reducing),
``key`` (binary: the pickled key tuple) and ``value`` (binary: the pickled value).
``restore_table(table)`` keeps the rows of this backend's key-group range, so a rescaled
subtask can restore every old table that overlaps its range.

Rescaling: ``snapshot(key_groups)`` pickles the chosen key groups; ``restore(data, range)``
keeps only the key groups of ``range``. A new subtask restores every old snapshot that
overlaps its range, so each key group ends up in exactly one subtask.

The descriptors, StateError and StateDescriptorError are user API, in
``yarnflow.common.api.state``; this module adds the runtime's errors:

    YarnflowError
    └── StateError                              misuse of keyed state
        ├── StateDescriptorError (ValueError)   a name registered again with another kind
        ├── NoCurrentKeyError (RuntimeError)    state used outside a keyed context
        ├── KeyGroupOutOfRangeError (ValueError) a key that this backend does not own
        └── StateRestoreError (ValueError)      a snapshot that cannot be restored here
"""

from __future__ import annotations

import copy
import pickle
from typing import Any, Generic, Iterable, Iterator, TypeVar

import cloudpickle
import pyarrow as pa

from yarnflow.common.api.state import StateDescriptor, StateDescriptorError, StateError
from yarnflow.worker.operators.snapshots import dumps, loads, owned_rows, require_columns

__all__ = [
    "HeapKeyedStateBackend",
    "KeyGroupOutOfRangeError",
    "ListState",
    "MapState",
    "NoCurrentKeyError",
    "ReducingState",
    "StateRestoreError",
    "ValueState",
]

T = TypeVar("T")
_SNAPSHOT_VERSION = 1
_IMMUTABLE = (type(None), bool, int, float, str, bytes, tuple, frozenset)


class NoCurrentKeyError(StateError, RuntimeError):
    """Keyed state was read or written with no current key (e.g. from ``open``)."""


class KeyGroupOutOfRangeError(StateError, ValueError):
    """A key's key group is not owned by this backend: the input was not partitioned by the
    same keys and max parallelism as the operator."""


class StateRestoreError(StateError, ValueError):
    """A snapshot does not fit this backend (other max parallelism, format, or a key group
    restored twice)."""


# --------------------------------------------------------------------------- state objects


class _KeyedState:
    """Base of the state objects: reads and writes the backend's current key."""

    def __init__(self, backend: HeapKeyedStateBackend, descriptor: StateDescriptor) -> None:
        self._backend = backend
        self.descriptor = descriptor
        self.name = descriptor.name

    def _table(self, create: bool) -> dict[tuple[Any, ...], Any] | None:
        return self._backend._table(self.name, create)

    def _key(self) -> tuple[Any, ...]:
        return self._backend._require_key()

    def _get(self, missing: Any = None) -> Any:
        key = self._key()
        table = self._table(False)
        return missing if table is None else table.get(key, missing)

    def _set(self, value: Any) -> None:
        key = self._key()
        table = self._table(True)
        assert table is not None
        table[key] = value

    def clear(self) -> None:
        """Remove the current key's entry."""
        key = self._key()
        table = self._table(False)
        if table is not None:
            table.pop(key, None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class ValueState(_KeyedState, Generic[T]):
    def value(self) -> T:
        """The current key's value, or the descriptor's default (a fresh copy when mutable)."""
        key = self._key()
        table = self._table(False)
        if table is not None and key in table:
            return table[key]  # type: ignore[no-any-return]
        default = self.descriptor.default  # type: ignore[attr-defined]
        return default if isinstance(default, _IMMUTABLE) else copy.deepcopy(default)  # type: ignore[return-value]

    def update(self, value: T) -> None:
        self._set(value)


class ListState(_KeyedState, Generic[T]):
    def get(self) -> list[T]:
        """A copy of the current key's list (empty when there is none)."""
        return list(self._get(()))

    def add(self, value: T) -> None:
        current = self._get()
        if current is None:
            self._set([value])
        else:
            current.append(value)

    def add_all(self, values: Iterable[T]) -> None:
        values = list(values)
        if not values:
            return
        current = self._get()
        if current is None:
            self._set(values)
        else:
            current.extend(values)

    def update(self, values: Iterable[T]) -> None:
        """Replace the list; an empty iterable clears it."""
        values = list(values)
        if values:
            self._set(values)
        else:
            self.clear()


class MapState(_KeyedState):
    def _map(self) -> dict[Any, Any]:
        return self._get(None) or {}  # type: ignore[no-any-return]

    def get(self, key: Any, default: Any = None) -> Any:
        return self._map().get(key, default)

    def put(self, key: Any, value: Any) -> None:
        current = self._get()
        if current is None:
            self._set({key: value})
        else:
            current[key] = value

    def put_all(self, entries: dict[Any, Any]) -> None:
        if not entries:
            return
        current = self._get()
        if current is None:
            self._set(dict(entries))
        else:
            current.update(entries)

    def contains(self, key: Any) -> bool:
        return key in self._map()

    def remove(self, key: Any) -> None:
        current = self._get()
        if current is not None:
            current.pop(key, None)
            if not current:
                self.clear()

    def keys(self) -> list[Any]:
        return list(self._map().keys())

    def values(self) -> list[Any]:
        return list(self._map().values())

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._map().items())

    def is_empty(self) -> bool:
        return not self._map()


class ReducingState(_KeyedState, Generic[T]):
    def get(self) -> T | None:
        """The reduced value of the current key, or None when nothing was added."""
        return self._get(None)  # type: ignore[no-any-return]

    def add(self, value: T) -> None:
        missing = _Missing
        current = self._get(missing)
        if current is missing:
            self._set(value)
        else:
            self._set(self.descriptor.reduce_fn(current, value))  # type: ignore[attr-defined]


class _Missing:
    """Marks 'no entry' where None is a legal value."""


_STATE_CLASSES: dict[str, type[_KeyedState]] = {
    "value": ValueState, "list": ListState, "map": MapState, "reducing": ReducingState,
}
_KIND_NAMES = {"value": "ValueState", "list": "ListState", "map": "MapState", "reducing": "ReducingState"}


# --------------------------------------------------------------------------- backend


class HeapKeyedStateBackend:
    """In-memory keyed state for the key groups in ``key_group_range`` (of ``max_parallelism``).

    Not thread-safe: it belongs to one subtask's task thread."""

    def __init__(self, max_parallelism: int, key_group_range: range) -> None:
        if max_parallelism <= 0:
            raise ValueError(f"max_parallelism must be positive, got {max_parallelism}")
        self.max_parallelism = max_parallelism
        self.key_group_range = self._check_range(key_group_range)
        self._data: dict[int, dict[str, dict[tuple[Any, ...], Any]]] = {}
        self._kinds: dict[str, str] = {}
        self._states: dict[str, _KeyedState] = {}
        self._key: tuple[Any, ...] | None = None
        self._key_group: int | None = None

    def _check_range(self, key_group_range: range) -> range:
        if key_group_range.step != 1 or key_group_range.start < 0 or key_group_range.stop > self.max_parallelism:
            raise ValueError(f"key group range {key_group_range} is not a contiguous part of "
                             f"range(0, {self.max_parallelism})")
        return key_group_range

    # ---- current key

    def set_current_key(self, key: tuple[Any, ...], key_group: int) -> None:
        """Scope every state object to ``key`` (a tuple) in ``key_group``.

        Raises KeyGroupOutOfRangeError when this backend does not own ``key_group``."""
        if key_group not in self.key_group_range:
            raise KeyGroupOutOfRangeError(
                f"key {key!r} is in key group {key_group}, which is not in this backend's range "
                f"{self.key_group_range.start}..{self.key_group_range.stop - 1} (max parallelism "
                f"{self.max_parallelism}): the input is not partitioned by this operator's keys")
        self._key = key if isinstance(key, tuple) else (key,)
        self._key_group = key_group

    @property
    def current_key(self) -> tuple[Any, ...] | None:
        return self._key

    @property
    def current_key_group(self) -> int | None:
        return self._key_group

    def _require_key(self) -> tuple[Any, ...]:
        if self._key is None:
            raise NoCurrentKeyError("keyed state can only be used while processing a keyed element "
                                    "or timer (there is no current key)")
        return self._key

    def _table(self, name: str, create: bool) -> dict[tuple[Any, ...], Any] | None:
        self._require_key()
        assert self._key_group is not None
        group = self._data.get(self._key_group)
        if group is None:
            if not create:
                return None
            group = self._data[self._key_group] = {}
        table = group.get(name)
        if table is None and create:
            table = group[name] = {}
        return table

    # ---- registration

    def get_state(self, descriptor: StateDescriptor) -> Any:
        """The state object for ``descriptor``, bound to this backend's current key.

        Raises StateDescriptorError when the name is already registered with another kind."""
        if not isinstance(descriptor, StateDescriptor) or descriptor.kind not in _STATE_CLASSES:
            raise StateDescriptorError(f"not a state descriptor: {descriptor!r}")
        name, kind = descriptor.name, descriptor.kind
        known = self._kinds.get(name)
        if known is not None and known != kind:
            raise StateDescriptorError(
                f"state {name!r} is already registered as a {_KIND_NAMES[known]}; it cannot also be "
                f"a {_KIND_NAMES[kind]}: give the new state another name")
        self._kinds[name] = kind
        state = self._states.get(name)
        if state is None or state.descriptor != descriptor:
            state = self._states[name] = _STATE_CLASSES[kind](self, descriptor)
        return state

    @property
    def registered_states(self) -> dict[str, str]:
        """State name -> kind ("value", "list", "map", "reducing")."""
        return dict(self._kinds)

    def entries(self, name: str) -> Iterator[tuple[int, tuple[Any, ...], Any]]:
        """(key group, key, value) of every key that has state ``name``, by key group."""
        for kg in sorted(self._data):
            table = self._data[kg].get(name)
            if table:
                for key, value in list(table.items()):
                    yield kg, key, value

    def key_groups_with_state(self) -> list[int]:
        return sorted(kg for kg, group in self._data.items() if any(group.values()))

    # ---- snapshot / restore

    def snapshot(self, key_groups: Iterable[int] | None = None) -> bytes:
        """Serialise the state of ``key_groups`` (default: every key group held) to bytes.

        Values are pickled with cloudpickle, so they must be picklable."""
        wanted = None if key_groups is None else set(key_groups)
        groups = {kg: {name: dict(table) for name, table in group.items() if table}
                  for kg, group in self._data.items() if wanted is None or kg in wanted}
        payload = {
            "version": _SNAPSHOT_VERSION,
            "max_parallelism": self.max_parallelism,
            "kinds": dict(self._kinds),
            "key_groups": {kg: g for kg, g in groups.items() if g},
        }
        return cloudpickle.dumps(payload)

    def restore(self, data: bytes, key_group_range: range | None = None) -> None:
        """Add the key groups of snapshot ``data`` that fall in ``key_group_range`` (which
        becomes this backend's range; default: the current one). Call once per old snapshot.

        Raises StateRestoreError when the snapshot has another max parallelism, another kind
        for a known state name, or a key group this backend already holds."""
        try:
            payload = pickle.loads(data)
        except Exception as exc:
            raise StateRestoreError(f"not a keyed state snapshot: {type(exc).__name__}: {exc}") from exc
        if not isinstance(payload, dict) or payload.get("version") != _SNAPSHOT_VERSION:
            raise StateRestoreError("not a keyed state snapshot of a known version")
        if payload["max_parallelism"] != self.max_parallelism:
            raise StateRestoreError(
                f"the snapshot was taken with max parallelism {payload['max_parallelism']}, this backend "
                f"has {self.max_parallelism}: key groups differ, so the state cannot be restored")
        if key_group_range is not None:
            self.key_group_range = self._check_range(key_group_range)
        for name, kind in payload["kinds"].items():
            known = self._kinds.get(name)
            if known is not None and known != kind:
                raise StateRestoreError(f"state {name!r} is a {_KIND_NAMES[kind]} in the snapshot but a "
                                        f"{_KIND_NAMES[known]} here")
        kept = {kg: g for kg, g in payload["key_groups"].items() if kg in self.key_group_range}
        twice = sorted(kg for kg in kept if kg in self._data and any(self._data[kg].values()))
        if twice:
            raise StateRestoreError(f"key group(s) {twice} restored twice")
        for name, kind in payload["kinds"].items():
            self._kinds.setdefault(name, kind)
        self._data.update(kept)

    # ---- checkpoints: Arrow tables

    KEYED_STATE_SCHEMA = pa.schema([("key_group", pa.int32()), ("state", pa.string()), ("kind", pa.string()),
                                    ("key", pa.binary()), ("value", pa.binary())])

    def snapshot_table(self) -> pa.Table:
        """Every entry as a row of ``KEYED_STATE_SCHEMA`` (see the module docstring); keys and
        values are serialised now, so the table is a copy. Values must pickle (cloudpickle)."""
        cols: dict[str, list[Any]] = {name: [] for name in self.KEYED_STATE_SCHEMA.names}
        for kg in sorted(self._data):
            for name, table in self._data[kg].items():
                kind = self._kinds[name]
                for key, value in table.items():
                    cols["key_group"].append(kg)
                    cols["state"].append(name)
                    cols["kind"].append(kind)
                    cols["key"].append(dumps(key))
                    cols["value"].append(dumps(value))
        return pa.table(cols, schema=self.KEYED_STATE_SCHEMA)

    def restore_table(self, table: pa.Table) -> None:
        """Add the rows of ``table`` (from ``snapshot_table``) in this backend's key-group range.

        Raises StateRestoreError when a column is missing, a state has another kind here, or an
        entry is restored twice."""
        require_columns(table, "keyed_state", self.KEYED_STATE_SCHEMA.names)
        table = owned_rows(table, self.key_group_range)
        for kg, name, kind, key_bytes, value_bytes in zip(*(table.column(c).to_pylist()
                                                            for c in self.KEYED_STATE_SCHEMA.names)):
            if kind not in _STATE_CLASSES:
                raise StateRestoreError(f"state {name!r} has unknown kind {kind!r} in the snapshot")
            known = self._kinds.setdefault(name, kind)
            if known != kind:
                raise StateRestoreError(f"state {name!r} is a {_KIND_NAMES[kind]} in the snapshot but a "
                                        f"{_KIND_NAMES[known]} here")
            entries = self._data.setdefault(kg, {}).setdefault(name, {})
            key = loads(key_bytes)
            if key in entries:
                raise StateRestoreError(f"state {name!r} of key {key!r} (key group {kg}) restored twice")
            entries[key] = loads(value_bytes)
