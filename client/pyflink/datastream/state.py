"""``pyflink.datastream.state``: PyFlink's state descriptors, each made yarnflow's own
(``_yarnflow``), whose state objects have PyFlink's methods (``value``/``update``/``clear``,
``get``/``add``/``add_all``, ``get``/``put``/``contains``/``remove``/``keys``/``items``)."""

from __future__ import annotations

from typing import Any

from yarnflow.common.errors import JobDefinitionError

__all__ = ["ValueStateDescriptor", "ListStateDescriptor", "MapStateDescriptor", "ReducingStateDescriptor",
           "AggregatingStateDescriptor", "StateTtlConfig"]


class _Descriptor:
    def __init__(self, name: str) -> None:
        self.name = name
        self._ttl: Any = None

    def get_name(self) -> str:
        return self.name

    def enable_time_to_live(self, ttl_config: Any) -> None:
        raise JobDefinitionError(f"state {self.name!r}: state time-to-live (StateTtlConfig) is not supported yet by "
                                 "yarnflow's PyFlink layer")

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
    """Accepted so programs import it; ``enable_time_to_live`` says it is not supported yet."""

    class UpdateType:
        Disabled = 0
        OnCreateAndWrite = 1
        OnReadAndWrite = 2

    class StateVisibility:
        ReturnExpiredIfNotCleanedUp = 0
        NeverReturnExpired = 1

    @staticmethod
    def new_builder(ttl: Any) -> Any:
        return _TtlBuilder()


class _TtlBuilder:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self

    def build(self) -> StateTtlConfig:
        return StateTtlConfig()
