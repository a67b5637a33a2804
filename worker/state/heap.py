"""The in-memory keyed state backend (Flink's HeapKeyedStateBackend), copy-on-write.

One backend per keyed operator subtask, owning the key groups ``key_group_range`` of
``max_parallelism``. It holds three sorts of state, all scoped to key groups so a snapshot can be
split among the subtasks of another parallelism:

- per-key states, for code that works a row at a time: value, list, map and reducing states
  (``get_state``, the user API of keyed process functions), each entry under a key and a
  namespace (``None`` for plain keyed state; window operators use the window);
- timers (``timer_service``, see ``timers.py``), kept as per-key entries too;
- columnar states for vectorised operators (``aggregate_table``, ``namespaced_tables``, see
  ``columnar.py``).

Layers (copy-on-write). Per-key entries live in ``dict[state][key group][(key, namespace)]``
layers. Without checkpoints there is one layer, written in place. A snapshot freezes the layers
it sees (O(1): a new empty layer becomes the one written) and makes its tables from them later,
on the snapshot writer's thread. From then on the task never changes a frozen layer: a write goes
to the newest layer, a removal leaves a tombstone there, and a mutable value (a list, a dict, a
user's object) is copied up before it is changed in place. Reads look from the newest layer down.
Once the snapshot's files are written, the writer's thread folds the frozen layers into the
oldest one (O(entries written since the snapshot before)) and the task drops them at its next
snapshot. So the task pauses O(1) for a snapshot of per-key state, and between snapshots a read
looks at no more than three layers.

Snapshot tables (Arrow; made by ``snapshot().build()``):

- ``keyed_state``: ``key_group`` (int32), ``state`` (string), ``kind`` (value, list, map,
  reducing), ``key`` (binary: the pickled key tuple), ``namespace`` (binary, null for none),
  ``value`` (binary: the pickled value); one row per entry.
- ``timers``: ``key_group`` (int32), ``service``, ``domain`` (EVENT_TIME | PROCESSING_TIME),
  ``timestamp`` (int64 ms), ``key``, ``namespace`` (binary), ``seq`` (int64: registration order,
  kept so timers of one timestamp fire in the same order after a restore).
- one table per columnar state, under its own name (see ``columnar.py``).

Every table carries the max parallelism in its schema metadata (``yarnflow.max_parallelism``):
key groups mean nothing under another one, so such a restore is refused. ``restore(tables)``
keeps the rows of this backend's key groups; a rescaled subtask calls it once per old snapshot
that overlaps its range.

Not thread-safe, except where said: the task thread owns it; the snapshot writer's thread only
builds tables from frozen layers and folds them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa

from yarnflow.common.api.state import StateDescriptor, StateDescriptorError
from yarnflow.common.state_format import KEYED_STATE_SCHEMA, MAX_PARALLELISM_KEY, TIMERS_SCHEMA
from yarnflow.worker.state.columnar import AggregateState, AggregateTable, NamespacedState, NamespacedTables
from yarnflow.worker.state.errors import KeyGroupOutOfRangeError, NoCurrentKeyError
from yarnflow.worker.state.objects import (
    ABSENT,
    IMMUTABLE,
    STATE_CLASSES,
    InternalDescriptor,
    InternalState,
    LayeredInternalState,
    LayeredValueState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
    _KeyedState,
    _TOMBSTONE,
    deepcopy,
)
from yarnflow.worker.state.heap_restore import _KINDS, RESERVED_TABLES, HeapRestore
from yarnflow.worker.state.tables import AsyncSnapshot, dumps

__all__ = [
    "ABSENT",
    "IMMUTABLE",
    "KEYED_STATE_SCHEMA",
    "RESERVED_TABLES",
    "TIMERS_SCHEMA",
    "HeapKeyedStateBackend",
    "InternalState",
    "ListState",
    "MapState",
    "ReducingState",
    "ValueState",
]


Entries = dict[Any, Any]
Layer = dict[str, dict[int, Entries]]    # state name -> key group -> (key, namespace) -> value



# --------------------------------------------------------------------------- backend


class HeapKeyedStateBackend(HeapRestore):
    """In-memory keyed state for the key groups in ``key_group_range`` (of ``max_parallelism``);
    see the module docstring."""

    #: per-key entries are the layers' dicts (state objects may read and write them directly)
    entries_in_layers = True
    #: the class of each kind of state object (ValueState: the one that reads the layers itself)
    state_classes: dict[str, type[_KeyedState]] = {**STATE_CLASSES, "value": LayeredValueState}
    #: the class of operators' internal states
    internal_state_class: type[InternalState] = LayeredInternalState

    def __init__(self, max_parallelism: int, key_group_range: range) -> None:
        if max_parallelism <= 0:
            raise ValueError(f"max_parallelism must be positive, got {max_parallelism}")
        self.max_parallelism = max_parallelism
        self.key_group_range = self._check_range(key_group_range)
        self._kg_start, self._kg_stop = key_group_range.start, key_group_range.stop
        self._layers: list[Layer] = [{}]          # oldest first; the last one is written
        self._absorbed: tuple[Layer, ...] = ()    # frozen layers folded into the oldest (writer thread)
        self._fold_lock = threading.Lock()        # folding vs. iterating the oldest layer
        self._kinds: dict[str, str] = {}
        self._states: dict[str, _KeyedState] = {}
        self._timer_names: dict[str, tuple[str, str]] = {}   # state name -> (service, domain)
        self._timer_services: dict[str, Any] = {}
        self._columnar: dict[str, AggregateState | NamespacedState] = {}
        self._key: tuple[Any, ...] | None = None
        self._key_group: int | None = None
        self._entry: tuple[Any, None] | None = None   # (current key, None): its entry without namespace

    def _check_range(self, key_group_range: range) -> range:
        if key_group_range.step != 1 or key_group_range.start < 0 or key_group_range.stop > self.max_parallelism:
            raise ValueError(f"key group range {key_group_range} is not a contiguous part of "
                             f"range(0, {self.max_parallelism})")
        return key_group_range

    # ---- current key

    def set_current_key(self, key: tuple[Any, ...], key_group: int) -> None:
        """Scope every state object to ``key`` (a tuple) in ``key_group``.

        Raises KeyGroupOutOfRangeError when this backend does not own ``key_group``."""
        if not self._kg_start <= key_group < self._kg_stop:
            raise KeyGroupOutOfRangeError(
                f"key {key!r} is in key group {key_group}, which is not in this backend's range "
                f"{self.key_group_range.start}..{self.key_group_range.stop - 1} (max parallelism "
                f"{self.max_parallelism}): the input is not partitioned by this operator's keys")
        self._key = key = key if key.__class__ is tuple or isinstance(key, tuple) else (key,)
        self._entry = (key, None)
        self._key_group = key_group

    def check_key_groups(self, groups: list[int]) -> None:
        """Raises KeyGroupOutOfRangeError, as ``set_current_key`` would, unless this backend
        owns every key group of ``groups`` (the key groups of the rows of a batch).

        An operator calling a function per row may then switch between those rows' keys by
        setting ``_key`` (a tuple), ``_entry`` (``(_key, None)``) and ``_key_group`` itself, on a
        backend whose ``entries_in_layers`` (switching keys does nothing else there): a call
        per row is a good part of what a row costs. Reusing one ``_entry`` object per key makes
        each state access cheaper too (a dict finds its own key object by identity)."""
        if groups and not (self._kg_start <= min(groups) and max(groups) < self._kg_stop):
            bad = next(kg for kg in groups if not self._kg_start <= kg < self._kg_stop)
            self.set_current_key((), bad)

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

    # ---- registration

    def _register(self, name: str, kind: str) -> None:
        known = self._kinds.get(name)
        if known is not None and known != kind:
            raise StateDescriptorError(
                f"state {name!r} is already registered as a {_KINDS.get(known, known)}; it cannot also be "
                f"a {_KINDS.get(kind, kind)}: give the new state another name")
        if name in RESERVED_TABLES:
            raise StateDescriptorError(f"state name {name!r} is reserved")
        self._kinds[name] = kind

    def get_state(self, descriptor: StateDescriptor) -> Any:
        """The state object for ``descriptor``, bound to this backend's current key.

        Raises StateDescriptorError when the name is already registered with another kind."""
        if not isinstance(descriptor, StateDescriptor) or descriptor.kind not in STATE_CLASSES:
            raise StateDescriptorError(f"not a state descriptor: {descriptor!r}")
        self._register(descriptor.name, descriptor.kind)
        state = self._states.get(descriptor.name)
        if state is None or state.descriptor != descriptor:
            state = self._states[descriptor.name] = self.state_classes[descriptor.kind](self, descriptor)
        return state

    def internal_state(self, name: str, copy_fn: Callable[[Any], Any] = deepcopy) -> InternalState:
        """An operator's own per-(key, namespace) state (see ``InternalState``)."""
        self._register(name, "internal")
        state = self.internal_state_class(self, InternalDescriptor(name), copy_fn)
        self._states[name] = state
        return state

    def timer_service(self, name: str) -> Any:
        """The timer service ``name`` (created on first use; see ``timers.py``)."""
        service = self._timer_services.get(name)
        if service is None:
            from yarnflow.worker.state.timers import InternalTimerService

            service = self._timer_services[name] = InternalTimerService(self, name)
        return service

    def _register_timers(self, state_name: str, service: str, domain: str) -> None:
        self._register(state_name, "timer")
        self._timer_names[state_name] = (service, domain)

    def aggregate_table(self, name: str, keys: list[str], values: list[tuple[str, str]]) -> AggregateState:
        """A columnar state: one row of aggregates per key (see ``columnar.AggregateTable``)."""
        self._register(name, "aggregate_table")
        table = self._columnar[name] = AggregateTable(name, keys, values, self.max_parallelism)
        return table

    def namespaced_tables(self, name: str, key_columns: list[str]) -> NamespacedState:
        """A columnar state: Arrow tables per namespace (see ``columnar.NamespacedTables``)."""
        self._register(name, "namespaced_tables")
        tables = self._columnar[name] = NamespacedTables(name, key_columns, self.max_parallelism)
        return tables

    @property
    def registered_states(self) -> dict[str, str]:
        """State name -> kind ("value", "list", "map", "reducing", "internal", "timer", ...)."""
        return dict(self._kinds)

    # ---- entries (the layered maps)

    def lookup(self, name: str, kg: int, entry: Any, missing: Any = None) -> Any:
        for layer in reversed(self._layers):
            groups = layer.get(name)
            if groups is not None:
                entries = groups.get(kg)
                if entries is not None:
                    value = entries.get(entry, ABSENT)
                    if value is not ABSENT:
                        return missing if value is _TOMBSTONE else value
        return missing

    def _top(self, name: str, kg: int) -> Entries:
        layer = self._layers[-1]
        groups = layer.get(name)
        if groups is None:
            groups = layer[name] = {}
        entries = groups.get(kg)
        if entries is None:
            entries = groups[kg] = {}
        return entries

    def put(self, name: str, kg: int, entry: Any, value: Any) -> None:
        self._top(name, kg)[entry] = value

    def remove(self, name: str, kg: int, entry: Any) -> None:
        if len(self._layers) == 1:
            groups = self._layers[0].get(name)
            entries = groups.get(kg) if groups is not None else None
            if entries is not None:
                entries.pop(entry, None)
            return
        below = ABSENT
        for layer in self._layers[:-1]:
            groups = layer.get(name)
            if groups is not None and (entries := groups.get(kg)) is not None and entry in entries:
                below = entries[entry]
        if below is ABSENT or below is _TOMBSTONE:
            top = self._layers[-1].get(name)
            if top is not None and (entries := top.get(kg)) is not None:
                entries.pop(entry, None)
        else:
            self._top(name, kg)[entry] = _TOMBSTONE

    def for_update(self, name: str, kg: int, entry: Any, copy_fn: Callable[[Any], Any]) -> Any:
        """The entry's value, safe to change in place (a frozen layer's mutable value is copied
        up first), or ABSENT."""
        top = self._layers[-1].get(name)
        entries = top.get(kg) if top is not None else None
        if entries is not None:
            value = entries.get(entry, ABSENT)
            if value is not ABSENT:
                return ABSENT if value is _TOMBSTONE else value
        if len(self._layers) == 1:
            return ABSENT
        value = self.lookup(name, kg, entry, ABSENT)
        if value is not ABSENT and not isinstance(value, IMMUTABLE):
            value = copy_fn(value)
            self._top(name, kg)[entry] = value
        return value

    def _view(self, name: str, kg: int, layers: Iterable[Layer]) -> Entries:
        """The live entries of (name, kg) over ``layers`` (oldest first)."""
        found = [entries for layer in layers if (groups := layer.get(name)) is not None
                 and (entries := groups.get(kg))]
        if not found:
            return {}
        if len(found) == 1:
            merged = dict(found[0])
        else:
            merged = {}
            for entries in found:
                merged.update(entries)
        if len(found) > 1 or _TOMBSTONE in merged.values():
            merged = {e: v for e, v in merged.items() if v is not _TOMBSTONE}
        return merged

    def _key_groups_of(self, name: str, layers: Iterable[Layer]) -> list[int]:
        return sorted({kg for layer in layers if (groups := layer.get(name)) for kg in groups})

    def raw_entries(self, name: str) -> Iterator[tuple[int, Any, Any]]:
        """(key group, entry, value) of every entry of state ``name``, by key group. The entries
        are read now: changing the state while iterating is fine."""
        self._prune()
        with self._fold_lock:
            views = [(kg, self._view(name, kg, self._layers)) for kg in self._key_groups_of(name, self._layers)]
        for kg, entries in views:
            for entry, value in entries.items():
                yield kg, entry, value

    def namespaced_entries(self, name: str) -> Iterator[tuple[int, tuple[Any, ...], Any, Any]]:
        """(key group, key, namespace, value) of every entry of state ``name``, by key group."""
        for kg, (key, namespace), value in self.raw_entries(name):
            yield kg, key, namespace, value

    def entries(self, name: str) -> Iterator[tuple[int, tuple[Any, ...], Any]]:
        """(key group, key, value) of every key with a value in state ``name`` (no namespace)."""
        for kg, key, namespace, value in self.namespaced_entries(name):
            if namespace is None:
                yield kg, key, value

    def key_groups_with_state(self) -> list[int]:
        self._prune()
        with self._fold_lock:
            groups = {kg for name in self._kinds if name not in self._columnar
                      for kg in self._key_groups_of(name, self._layers) if self._view(name, kg, self._layers)}
        return sorted(groups)

    # ---- snapshots

    def _prune(self) -> None:
        """Drop frozen layers the writer's thread has folded into the oldest one."""
        absorbed = self._absorbed
        if absorbed:
            keep = [layer for layer in self._layers[1:-1] if not any(layer is a for a in absorbed)]
            self._layers = [self._layers[0], *keep, self._layers[-1]]
            if self._absorbed is absorbed:
                self._absorbed = ()

    def snapshot(self) -> AsyncSnapshot:
        """A consistent view of every state now, as an AsyncSnapshot whose ``build`` makes the
        tables (see the module docstring). The task pauses for the freeze and for copying the
        columnar states' arrays, not for serialising."""
        self._prune()
        frozen = tuple(self._layers)
        self._layers.append({})
        kinds = dict(self._kinds)
        timer_names = dict(self._timer_names)
        columnar = {name: state.snapshot_builder() for name, state in self._columnar.items()}

        def build() -> dict[str, pa.Table]:
            tables = dict(self._tables(frozen, kinds, timer_names))
            for name, (make, _) in columnar.items():
                table = make()
                if table.num_rows:
                    tables[name] = table
            meta = {MAX_PARALLELISM_KEY: str(self.max_parallelism).encode()}
            return {name: t.replace_schema_metadata({**(t.schema.metadata or {}), **meta})
                    for name, t in tables.items()}

        def release() -> None:
            for _, discard in columnar.values():
                discard()
            self._fold(frozen)

        return AsyncSnapshot(build, release)

    def _tables(self, layers: tuple[Layer, ...], kinds: dict[str, str],
                timer_names: dict[str, tuple[str, str]]) -> Iterator[tuple[str, pa.Table]]:
        state_cols: dict[str, list[Any]] = {name: [] for name in KEYED_STATE_SCHEMA.names}
        timer_cols: dict[str, list[Any]] = {name: [] for name in TIMERS_SCHEMA.names}
        names = sorted({name for layer in layers for name in layer})
        for name in names:
            kind = kinds[name]
            for kg in self._key_groups_of(name, layers):
                with self._fold_lock:
                    entries = self._view(name, kg, layers)
                if kind == "timer":
                    service, domain = timer_names[name]
                    for (key, namespace, ts), seq in entries.items():
                        timer_cols["key_group"].append(kg)
                        timer_cols["service"].append(service)
                        timer_cols["domain"].append(domain)
                        timer_cols["timestamp"].append(ts)
                        timer_cols["key"].append(dumps(key))
                        timer_cols["namespace"].append(None if namespace is None else dumps(namespace))
                        timer_cols["seq"].append(seq)
                    continue
                for (key, namespace), value in entries.items():
                    state_cols["key_group"].append(kg)
                    state_cols["state"].append(name)
                    state_cols["kind"].append(kind)
                    state_cols["key"].append(dumps(key))
                    state_cols["namespace"].append(None if namespace is None else dumps(namespace))
                    state_cols["value"].append(dumps(value))
        if state_cols["key_group"]:
            yield "keyed_state", pa.table(state_cols, schema=KEYED_STATE_SCHEMA)
        if timer_cols["key_group"]:
            yield "timers", pa.table(timer_cols, schema=TIMERS_SCHEMA)

    def _fold(self, frozen: tuple[Layer, ...]) -> None:
        """On the writer's thread, once a snapshot's tables are made: fold the frozen layers above
        the oldest into it. The task reads a folded layer before the oldest, so it sees the same
        values before and after each step."""
        base, above = frozen[0], frozen[1:]
        if not above or base is not self._layers[0]:
            return
        for layer in above:
            for name, groups in list(layer.items()):
                target = base.get(name)
                if target is None:
                    target = base[name] = {}
                for kg, entries in list(groups.items()):
                    with self._fold_lock:
                        into = target.get(kg)
                        if into is None:
                            into = target[kg] = {}
                        into.update(entries)
                        if _TOMBSTONE in entries.values():
                            for entry in [e for e, v in entries.items() if v is _TOMBSTONE]:
                                del into[entry]
        # every frozen layer not yet dropped by the task is in ``above`` (a snapshot freezes all
        # the layers it finds), so the latest fold names all the task may drop
        self._absorbed = above
