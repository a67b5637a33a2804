"""The state objects of the keyed state backend: what ``ctx.get_state(descriptor)`` returns
(value, list, map and reducing state, the user API of keyed process functions) and the
operators' own ``InternalState``. Each reads and writes the entry of the backend's current key
(see ``heap.py``: a write goes to the newest layer; a mutable value of a frozen layer is copied
up before it is changed in place)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from yarnflow.common.api.state import StateDescriptor

if TYPE_CHECKING:
    from yarnflow.worker.state.heap import HeapKeyedStateBackend

__all__ = ["ABSENT", "IMMUTABLE", "InternalState", "LayeredInternalState", "LayeredValueState", "ListState", "MapState", "ReducingState",
           "ValueState"]

T = TypeVar("T")

#: values that are never changed in place: no copy before a write
IMMUTABLE = (type(None), bool, int, float, str, bytes, tuple, frozenset)


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


ABSENT: Any = _Marker("ABSENT")  # no entry
_TOMBSTONE: Any = _Marker("TOMBSTONE")   # an entry removed since the layers below were frozen (heap.py)


def deepcopy(value: Any) -> Any:
    return copy.deepcopy(value)


class _KeyedState:
    """Base of the state objects: reads and writes the entry of the backend's current key in
    this state's ``namespace``."""

    __slots__ = ("_backend", "descriptor", "name", "namespace")

    def __init__(self, backend: HeapKeyedStateBackend, descriptor: StateDescriptor, namespace: Any = None) -> None:
        self._backend = backend
        self.descriptor = descriptor
        self.name = descriptor.name
        self.namespace = namespace

    def _entry(self) -> tuple[Any, Any]:
        b = self._backend
        key = b._require_key()
        return b._entry if self.namespace is None else (key, self.namespace)  # type: ignore[return-value]

    def _get(self, missing: Any = None) -> Any:
        b = self._backend
        return b.lookup(self.name, b._key_group, self._entry(), missing)  # type: ignore[arg-type]

    def _set(self, value: Any) -> None:
        b = self._backend
        b.put(self.name, b._key_group, self._entry(), value)  # type: ignore[arg-type]

    def _for_update(self, copy_fn: Callable[[Any], Any]) -> Any:
        b = self._backend
        return b.for_update(self.name, b._key_group, self._entry(), copy_fn)  # type: ignore[arg-type]

    def clear(self) -> None:
        """Remove the current key's entry."""
        b = self._backend
        b.remove(self.name, b._key_group, self._entry())  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class ValueState(_KeyedState, Generic[T]):
    def value(self) -> T:
        """The current key's value, or the descriptor's default (a fresh copy when mutable).
        A mutable value may be changed in place: that change is the state's."""
        value: Any = self._for_update(deepcopy)
        return self._default() if value is ABSENT else value  # type: ignore[no-any-return]

    def _default(self) -> T:
        default = self.descriptor.default  # type: ignore[attr-defined]
        return default if isinstance(default, IMMUTABLE) else copy.deepcopy(default)  # type: ignore[no-any-return,return-value]

    def update(self, value: T) -> None:
        self._set(value)


class LayeredValueState(ValueState[T]):
    """The ValueState of a backend whose entries are its layers (the heap backend), for keyed
    process functions, which call ``value()`` and ``update()`` once or twice per row: they look
    in the newest layer themselves (the lookup of ``for_update``/``put`` without their calls)
    with the backend's ``_entry`` of the current key, and take the general path otherwise
    (no current key, a value in a frozen layer, a first write to a key group)."""

    def value(self) -> T:
        b = self._backend
        groups = b._layers[-1].get(self.name)
        if groups is not None:
            entries = groups.get(b._key_group)  # type: ignore[arg-type]  # no current key: no entries of key group None
            if entries is not None:
                value = entries.get(b._entry, ABSENT)
                if value is not ABSENT:
                    return self._default() if value is _TOMBSTONE else value  # type: ignore[no-any-return]
        return super().value()

    def update(self, value: T) -> None:
        b = self._backend
        groups = b._layers[-1].get(self.name)
        if groups is not None:
            entries = groups.get(b._key_group)  # type: ignore[arg-type]
            if entries is not None:
                entries[b._entry] = value
                return
        self._set(value)


class ListState(_KeyedState, Generic[T]):
    def get(self) -> list[T]:
        """A copy of the current key's list (empty when there is none)."""
        return list(self._get(()))

    def add(self, value: T) -> None:
        current = self._for_update(list)
        if current is ABSENT:
            self._set([value])
        else:
            current.append(value)

    def add_all(self, values: Iterable[T]) -> None:
        values = list(values)
        if not values:
            return
        current = self._for_update(list)
        if current is ABSENT:
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
        current = self._for_update(dict)
        if current is ABSENT:
            self._set({key: value})
        else:
            current[key] = value

    def put_all(self, entries: dict[Any, Any]) -> None:
        if not entries:
            return
        current = self._for_update(dict)
        if current is ABSENT:
            self._set(dict(entries))
        else:
            current.update(entries)

    def contains(self, key: Any) -> bool:
        return key in self._map()

    def remove(self, key: Any) -> None:
        current = self._for_update(dict)
        if current is not ABSENT:
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
        current = self._for_update(deepcopy)  # the reduce function may change it in place
        if current is ABSENT:
            self._set(value)
        else:
            self._set(self.descriptor.reduce_fn(current, value))  # type: ignore[attr-defined]


class InternalState(_KeyedState):
    """State for operators (not user API): one value per (current key, namespace), with the
    namespace given per call. ``get_for_update`` copies a value of a frozen layer up (with the
    state's ``copy_fn``) before the caller changes it in place."""

    __slots__ = ("copy_fn",)

    def __init__(self, backend: HeapKeyedStateBackend, descriptor: StateDescriptor,
                 copy_fn: Callable[[Any], Any] = deepcopy) -> None:
        super().__init__(backend, descriptor)
        self.copy_fn = copy_fn

    def _entry_in(self, namespace: Any) -> tuple[Any, Any]:
        b = self._backend
        key = b._require_key()
        return b._entry if namespace is None else (key, namespace)  # type: ignore[return-value]

    def get(self, namespace: Any = None, missing: Any = None) -> Any:
        b = self._backend
        return b.lookup(self.name, b._key_group, self._entry_in(namespace), missing)  # type: ignore[arg-type]

    def get_for_update(self, namespace: Any = None) -> Any:
        """The value to change in place, or ABSENT."""
        b = self._backend
        return b.for_update(self.name, b._key_group, self._entry_in(namespace), self.copy_fn)  # type: ignore[arg-type]

    def put(self, value: Any, namespace: Any = None) -> None:
        b = self._backend
        b.put(self.name, b._key_group, self._entry_in(namespace), value)  # type: ignore[arg-type]

    def delete(self, namespace: Any = None) -> None:
        b = self._backend
        b.remove(self.name, b._key_group, self._entry_in(namespace))  # type: ignore[arg-type]


class LayeredInternalState(InternalState):
    """The InternalState of the heap backend, for operators that read and write the current
    key's entry once per key and batch (a keyed reduce): without a namespace, it looks in the
    newest layer itself, as ``LayeredValueState`` does, and takes the general path otherwise."""

    __slots__ = ()

    def _newest(self) -> dict[Any, Any] | None:
        """This state's entries of the current key group in the newest layer, if any (no current
        key: none, there are no entries of key group None)."""
        b = self._backend
        groups = b._layers[-1].get(self.name)
        return None if groups is None else groups.get(b._key_group)  # type: ignore[arg-type]

    def get_for_update(self, namespace: Any = None) -> Any:
        entries = self._newest() if namespace is None else None
        if entries is not None:
            value = entries.get(self._backend._entry, ABSENT)
            if value is not ABSENT:
                return ABSENT if value is _TOMBSTONE else value
        return super().get_for_update(namespace)

    def put(self, value: Any, namespace: Any = None) -> None:
        entries = self._newest() if namespace is None else None
        if entries is not None:
            entries[self._backend._entry] = value
        else:
            super().put(value, namespace)


class InternalDescriptor(StateDescriptor):
    kind = "internal"


STATE_CLASSES: dict[str, type[_KeyedState]] = {
    "value": ValueState, "list": ListState, "map": MapState, "reducing": ReducingState,
}
