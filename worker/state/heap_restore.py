"""How the in-memory keyed state backend takes in a snapshot's tables (``restore``): the
part of ``HeapKeyedStateBackend`` that checks a snapshot can be restored here (its max
parallelism, its states) and adds the rows of this backend's key groups, entries, timers and
columnar states. The tables' layout is in ``heap.py``'s docstring.

A mixin of the backend, kept in its own file only to keep each file readable; what it uses of
the backend is declared below."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from yarnflow.common.state_format import KEYED_STATE_SCHEMA, MAX_PARALLELISM_KEY, TIMERS_SCHEMA
from yarnflow.worker.state.columnar import AggregateState, NamespacedState
from yarnflow.worker.state.errors import StateRestoreError
from yarnflow.worker.state.objects import STATE_CLASSES
from yarnflow.worker.state.tables import loads, owned_rows, require_columns

__all__ = ["RESERVED_TABLES", "HeapRestore"]

#: the snapshot tables every keyed backend writes (a state may not take one of their names)
RESERVED_TABLES = ("keyed_state", "timers")
_KINDS = {"value": "ValueState", "list": "ListState", "map": "MapState", "reducing": "ReducingState",
          "internal": "internal state", "timer": "timers"}


class HeapRestore:
    # -- what the backend provides
    max_parallelism: int
    key_group_range: range
    _layers: list[dict[str, dict[int, dict[Any, Any]]]]
    _kinds: dict[str, str]
    _columnar: dict[str, AggregateState | NamespacedState]
    _timer_services: dict[str, Any]

    def timer_service(self, name: str) -> Any:
        raise NotImplementedError  # the backend's

    def restore(self, tables: dict[str, pa.Table]) -> None:
        """Add the rows of ``tables`` (a snapshot's) in this backend's key groups. Call before
        any state is written (after the operator registered its states), once per old snapshot.

        Raises StateRestoreError when a column is missing, a state has another kind here, an
        entry is restored twice, or a table belongs to no state of this operator."""
        if len(self._layers) != 1:
            raise StateRestoreError("state can only be restored before the first snapshot")
        self.check_restorable(tables, set(RESERVED_TABLES))
        if "keyed_state" in tables:
            self._restore_entries(tables["keyed_state"])
        if "timers" in tables:
            self._restore_timers(tables["timers"])
        self.restore_columnar(tables)

    def check_restorable(self, tables: dict[str, pa.Table], reserved: set[str]) -> None:
        """Refuse tables of another max parallelism, and tables that are neither ``reserved``
        nor the columnar state of a state this operator registered."""
        for table in tables.values():
            taken = (table.schema.metadata or {}).get(MAX_PARALLELISM_KEY)
            if taken is not None and int(taken) != self.max_parallelism:
                raise StateRestoreError(
                    f"the snapshot was taken with max parallelism {int(taken)}, this operator has "
                    f"{self.max_parallelism}: key groups differ, so the state cannot be restored (keep "
                    f"pipeline.max-parallelism as it was)")
        unknown = sorted(set(tables) - reserved - set(self._columnar))
        if unknown:
            raise StateRestoreError(f"the snapshot has state {unknown} that this operator does not have "
                                    f"(it has {sorted(self._columnar) or 'no columnar state'})")

    def restore_columnar(self, tables: dict[str, pa.Table]) -> None:
        """Restore the columnar states' rows of this backend's key groups."""
        for name, state in self._columnar.items():
            if name in tables:
                require_columns(tables[name], name, ["key_group"])
                state.restore(owned_rows(tables[name], self.key_group_range))

    def _restore_entries(self, table: pa.Table) -> None:
        require_columns(table, "keyed_state", KEYED_STATE_SCHEMA.names)
        table = owned_rows(table, self.key_group_range)
        base = self._layers[0]
        cols = [table.column(c).to_pylist() for c in KEYED_STATE_SCHEMA.names]
        for kg, name, kind, key, namespace, value in zip(*cols):
            if kind not in STATE_CLASSES and kind != "internal":
                raise StateRestoreError(f"state {name!r} has unknown kind {kind!r} in the snapshot")
            known = self._kinds.setdefault(name, kind)
            if known != kind:
                raise StateRestoreError(f"state {name!r} is a {_KINDS[kind]} in the snapshot but a "
                                        f"{_KINDS.get(known, known)} here")
            entries = base.setdefault(name, {}).setdefault(kg, {})
            entry = (loads(key), None if namespace is None else loads(namespace))
            if entry in entries:
                raise StateRestoreError(f"state {name!r} of key {entry[0]!r} (key group {kg}) restored twice")
            entries[entry] = loads(value)

    def _restore_timers(self, table: pa.Table) -> None:
        require_columns(table, "timers", TIMERS_SCHEMA.names)
        table = owned_rows(table, self.key_group_range)
        cols = [table.column(c).to_pylist() for c in TIMERS_SCHEMA.names]
        touched = set()
        for kg, service, domain, ts, key, namespace, seq in zip(*cols):
            timers = self.timer_service(service)
            name = timers.state_name(domain)
            entries = self._layers[0].setdefault(name, {}).setdefault(kg, {})
            entry = (loads(key), None if namespace is None else loads(namespace), ts)
            if entry in entries:
                raise StateRestoreError(f"timer {entry!r} of {service!r} (key group {kg}) restored twice")
            entries[entry] = seq
            touched.add(service)
        for service in touched:
            self._timer_services[service].rebuild()

