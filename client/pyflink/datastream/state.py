"""``pyflink.datastream.state``: PyFlink's state descriptors, each made yarnflow's own
(``_yarnflow``), whose state objects have PyFlink's methods (``value``/``update``/``clear``,
``get``/``add``/``add_all``, ``get``/``put``/``contains``/``remove``/``keys``/``items``)."""

from __future__ import annotations

from typing import Any

from yarnflow.common.errors import JobDefinitionError

__all__ = ["ValueStateDescriptor", "ListStateDescriptor", "MapStateDescriptor", "ReducingStateDescriptor",
           "AggregatingStateDescriptor", "StateTtlConfig", "with_ttl"]


class _Descriptor:
    def __init__(self, name: str) -> None:
        self.name = name
        self._ttl: Any = None

    def get_name(self) -> str:
        return self.name

    def enable_time_to_live(self, ttl_config: StateTtlConfig) -> None:
        """Entries of this state expire ``ttl_config``'s time after they were written."""
        if not isinstance(ttl_config, StateTtlConfig):
            raise JobDefinitionError(f"state {self.name!r}: enable_time_to_live takes a StateTtlConfig "
                                     "(StateTtlConfig.new_builder(Time.seconds(1)).build())")
        self._ttl = ttl_config

    def _yarnflow(self) -> Any:
        raise NotImplementedError


class ValueStateDescriptor(_Descriptor):
    def __init__(self, name: str, value_type_info: Any = None) -> None:
        super().__init__(name)

    def _yarnflow(self) -> Any:
        from yarnflow.common.api import ValueStateDescriptor as Ours

        return Ours(self.name)


class ListStateDescriptor(_Descriptor):
    def __init__(self, name: str, elem_type_info: Any = None) -> None:
        super().__init__(name)

    def _yarnflow(self) -> Any:
        from yarnflow.common.api import ListStateDescriptor as Ours

        return Ours(self.name)


class MapStateDescriptor(_Descriptor):
    def __init__(self, name: str, key_type_info: Any = None, value_type_info: Any = None) -> None:
        super().__init__(name)

    def _yarnflow(self) -> Any:
        from yarnflow.common.api import MapStateDescriptor as Ours

        return Ours(self.name)


class ReducingStateDescriptor(_Descriptor):
    def __init__(self, name: str, reduce_function: Any, type_info: Any = None) -> None:
        super().__init__(name)
        self.reduce_function = reduce_function

    def _yarnflow(self) -> Any:
        from yarnflow.common.api import ReducingStateDescriptor as Ours

        fn = self.reduce_function
        return Ours(self.name, fn.reduce if hasattr(fn, "reduce") else fn)


class AggregatingStateDescriptor(_Descriptor):
    """An AggregateFunction's accumulator per key: ``add(value)``, ``get()`` its result."""

    def __init__(self, name: str, agg_function: Any, state_type_info: Any = None) -> None:
        super().__init__(name)
        self.agg_function = agg_function

    def _yarnflow(self) -> Any:
        from yarnflow.common.api import ValueStateDescriptor as Ours

        return Ours(self.name)


class AggregatingState:
    """PyFlink's AggregatingState over a value state holding the accumulator."""

    def __init__(self, value_state: Any, fn: Any) -> None:
        self._state, self._fn = value_state, fn

    def add(self, value: Any) -> None:
        acc = self._state.value()
        self._state.update(self._fn.add(value, self._fn.create_accumulator() if acc is None else acc))

    def get(self) -> Any:
        acc = self._state.value()
        return None if acc is None else self._fn.get_result(acc)

    def clear(self) -> None:
        self._state.clear()


class StateTtlConfig:
    """State time-to-live, as Flink's (processing time): an entry written (and, with
    OnReadAndWrite, read) more than ``ttl`` ago is expired; NeverReturnExpired hides it (and
    drops it when read), ReturnExpiredIfNotCleanedUp returns it until it is dropped. Expired
    entries are dropped when read (Flink's lazy cleanup); ``cleanup_*`` settings are accepted."""

    class UpdateType:
        Disabled = 0
        OnCreateAndWrite = 1
        OnReadAndWrite = 2

    class StateVisibility:
        ReturnExpiredIfNotCleanedUp = 0
        NeverReturnExpired = 1

    class TtlTimeCharacteristic:
        ProcessingTime = 0

    def __init__(self, ttl_ms: int, update_type: int = 1, visibility: int = 1) -> None:
        self.ttl_ms, self.update_type, self.visibility = ttl_ms, update_type, visibility

    @staticmethod
    def new_builder(ttl: Any) -> StateTtlConfigBuilder:
        from yarnflow.pyflink.common.time import to_millis

        return StateTtlConfigBuilder(to_millis(ttl, "StateTtlConfig.new_builder"))

    def is_enabled(self) -> bool:
        return self.update_type != StateTtlConfig.UpdateType.Disabled

    def get_ttl(self) -> int:
        return self.ttl_ms


class StateTtlConfigBuilder:
    def __init__(self, ttl_ms: int) -> None:
        self._ttl, self._update, self._visibility = ttl_ms, StateTtlConfig.UpdateType.OnCreateAndWrite, \
            StateTtlConfig.StateVisibility.NeverReturnExpired

    def set_update_type(self, update_type: int) -> StateTtlConfigBuilder:
        self._update = update_type
        return self

    def update_ttl_on_create_and_write(self) -> StateTtlConfigBuilder:
        return self.set_update_type(StateTtlConfig.UpdateType.OnCreateAndWrite)

    def update_ttl_on_read_and_write(self) -> StateTtlConfigBuilder:
        return self.set_update_type(StateTtlConfig.UpdateType.OnReadAndWrite)

    def set_state_visibility(self, visibility: int) -> StateTtlConfigBuilder:
        self._visibility = visibility
        return self

    def never_return_expired(self) -> StateTtlConfigBuilder:
        return self.set_state_visibility(StateTtlConfig.StateVisibility.NeverReturnExpired)

    def return_expired_if_not_cleaned_up(self) -> StateTtlConfigBuilder:
        return self.set_state_visibility(StateTtlConfig.StateVisibility.ReturnExpiredIfNotCleanedUp)

    def set_ttl(self, ttl: Any) -> StateTtlConfigBuilder:
        from yarnflow.pyflink.common.time import to_millis

        self._ttl = to_millis(ttl, "set_ttl")
        return self

    def set_ttl_time_characteristic(self, characteristic: Any) -> StateTtlConfigBuilder:
        return self

    def cleanup_full_snapshot(self) -> StateTtlConfigBuilder:
        return self

    def cleanup_incrementally(self, cleanup_size: int = 5, run_cleanup_for_every_record: bool = False
                              ) -> StateTtlConfigBuilder:
        return self

    def cleanup_in_rocksdb_compact_filter(self, query_time_after_num_entries: int = 1000) -> StateTtlConfigBuilder:
        return self

    def disable_cleanup_in_background(self) -> StateTtlConfigBuilder:
        return self

    def build(self) -> StateTtlConfig:
        return StateTtlConfig(self._ttl, self._update, self._visibility)


class _Ttl:
    """Entries stored as (value, written at ms); expiry as ``config`` says, clock ``now``."""

    def __init__(self, config: StateTtlConfig, now: Any) -> None:
        self.config, self.now = config, now

    def wrap(self, value: Any) -> tuple[Any, int]:
        return value, int(self.now())

    def expired(self, entry: tuple[Any, int]) -> bool:
        return int(self.now()) - entry[1] >= self.config.ttl_ms

    @property
    def hides(self) -> bool:
        return self.config.visibility == StateTtlConfig.StateVisibility.NeverReturnExpired

    @property
    def touch(self) -> bool:
        return self.config.update_type == StateTtlConfig.UpdateType.OnReadAndWrite


class TtlValueState:
    def __init__(self, state: Any, ttl: _Ttl) -> None:
        self._s, self._t = state, ttl

    def value(self) -> Any:
        entry = self._s.value()
        if entry is None:
            return None
        if self._t.expired(entry):
            self._s.clear()  # (dropped when read)
            return None if self._t.hides else entry[0]
        if self._t.touch:
            self._s.update(self._t.wrap(entry[0]))
        return entry[0]

    def update(self, value: Any) -> None:
        self._s.update(self._t.wrap(value))

    def clear(self) -> None:
        self._s.clear()


class TtlListState:
    def __init__(self, state: Any, ttl: _Ttl) -> None:
        self._s, self._t = state, ttl

    def get(self) -> list[Any]:
        entries = list(self._s.get() or [])
        live = [e for e in entries if not self._t.expired(e)]
        if len(live) != len(entries) or (self._t.touch and live):
            self._s.update([self._t.wrap(e[0]) for e in live] if self._t.touch else live)
        return [e[0] for e in (live if self._t.hides else entries)]

    def add(self, value: Any) -> None:
        self._s.add(self._t.wrap(value))

    def add_all(self, values: Any) -> None:
        for v in values:
            self.add(v)

    def update(self, values: Any) -> None:
        self._s.update([self._t.wrap(v) for v in values])

    def clear(self) -> None:
        self._s.clear()


class TtlMapState:
    def __init__(self, state: Any, ttl: _Ttl) -> None:
        self._s, self._t = state, ttl

    def _live(self, key: Any) -> tuple[bool, Any]:
        if not self._s.contains(key):
            return False, None
        entry = self._s.get(key)
        if self._t.expired(entry):
            self._s.remove(key)
            return (False, None) if self._t.hides else (True, entry[0])
        if self._t.touch:
            self._s.put(key, self._t.wrap(entry[0]))
        return True, entry[0]

    def get(self, key: Any) -> Any:
        return self._live(key)[1]

    def contains(self, key: Any) -> bool:
        return self._live(key)[0]

    def put(self, key: Any, value: Any) -> None:
        self._s.put(key, self._t.wrap(value))

    def put_all(self, entries: dict[Any, Any]) -> None:
        for k, v in entries.items():
            self.put(k, v)

    def remove(self, key: Any) -> None:
        self._s.remove(key)

    def keys(self) -> list[Any]:
        return [k for k in list(self._s.keys()) if self._live(k)[0]]

    def values(self) -> list[Any]:
        return [self.get(k) for k in self.keys()]

    def items(self) -> list[tuple[Any, Any]]:
        return [(k, self.get(k)) for k in self.keys()]

    def is_empty(self) -> bool:
        return not self.keys()

    def clear(self) -> None:
        self._s.clear()


def with_ttl(descriptor: Any, state: Any, now: Any) -> Any:
    """``state`` with the time-to-live its descriptor enabled (``state`` itself without)."""
    config = getattr(descriptor, "_ttl", None)
    if config is None or not config.is_enabled():
        return state
    ttl = _Ttl(config, now)
    if isinstance(descriptor, ListStateDescriptor):
        return TtlListState(state, ttl)
    if isinstance(descriptor, MapStateDescriptor):
        return TtlMapState(state, ttl)
    if isinstance(descriptor, ValueStateDescriptor):
        return TtlValueState(state, ttl)
    raise JobDefinitionError(f"state {descriptor.name!r}: time-to-live is for value, list and map state in yarnflow's "
                             "PyFlink layer")
