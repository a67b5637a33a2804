"""PyFlink's function classes: subclass one and pass an instance (or pass a plain function)."""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["Function", "MapFunction", "FlatMapFunction", "FilterFunction", "ReduceFunction", "KeySelector",
           "RuntimeContext", "Partitioner", "AggregateFunction", "KeyedProcessFunction", "TimerService", "TimeDomain",
           "CoMapFunction", "CoFlatMapFunction", "CoProcessFunction", "KeyedCoProcessFunction", "BroadcastProcessFunction",
           "KeyedBroadcastProcessFunction", "ProcessWindowFunction", "WindowFunction", "ProcessAllWindowFunction",
           "AllWindowFunction", "ProcessFunction"]


class RuntimeContext:
    """What a function's ``open(runtime_context)`` learns about its subtask; in a keyed
    function, its keyed state (``get_state(ValueStateDescriptor(...))`` and the others)."""

    def __init__(self, ctx: Any, state: Any = None) -> None:
        self._ctx = ctx
        self._state = state  # (the yarnflow function whose get_state follows the current key)

    def _get(self, descriptor: Any) -> Any:
        if self._state is None:
            raise RuntimeError(f"state {getattr(descriptor, 'name', descriptor)!r}: keyed state is for functions on "
                               "a keyed stream (key_by(...).process(...))")
        from yarnflow.pyflink.datastream.state import with_ttl

        return with_ttl(descriptor, self._state.get_state(descriptor._yarnflow()), self._ctx.clock)

    def get_state(self, state_descriptor: Any) -> Any:
        return self._get(state_descriptor)

    def get_list_state(self, state_descriptor: Any) -> Any:
        return self._get(state_descriptor)

    def get_map_state(self, state_descriptor: Any) -> Any:
        return self._get(state_descriptor)

    def get_reducing_state(self, state_descriptor: Any) -> Any:
        return self._get(state_descriptor)

    def get_aggregating_state(self, state_descriptor: Any) -> Any:
        from yarnflow.pyflink.datastream.state import AggregatingState

        return AggregatingState(self._get(state_descriptor), state_descriptor.agg_function)

    def get_task_name(self) -> str:
        return str(self._ctx.task_name)

    def get_number_of_parallel_subtasks(self) -> int:
        return int(self._ctx.parallelism)

    def get_max_number_of_parallel_subtasks(self) -> int:
        return int(self._ctx.max_parallelism)

    def get_index_of_this_subtask(self) -> int:
        return int(self._ctx.subtask_index)

    def get_attempt_number(self) -> int:
        return int(self._ctx.attempt_number)

    def get_task_name_with_subtasks(self) -> str:
        return f"{self.get_task_name()} ({self.get_index_of_this_subtask() + 1}/{self.get_number_of_parallel_subtasks()})"

    def get_job_parameter(self, key: str, default_value: str) -> str:
        return str(self._ctx.config.get(key, default_value))


class Function:
    def open(self, runtime_context: RuntimeContext) -> None:
        pass

    def close(self) -> None:
        pass


class MapFunction(Function):
    def map(self, value: Any) -> Any:
        raise NotImplementedError


class FlatMapFunction(Function):
    def flat_map(self, value: Any) -> Iterable[Any]:
        raise NotImplementedError


class FilterFunction(Function):
    def filter(self, value: Any) -> bool:
        raise NotImplementedError


class ReduceFunction(Function):
    def reduce(self, value1: Any, value2: Any) -> Any:
        raise NotImplementedError


class KeySelector(Function):
    def get_key(self, value: Any) -> Any:
        raise NotImplementedError


class Partitioner(Function):
    def partition(self, key: Any, num_partitions: int) -> int:
        raise NotImplementedError


class AggregateFunction(Function):
    def create_accumulator(self) -> Any:
        raise NotImplementedError

    def add(self, value: Any, accumulator: Any) -> Any:
        raise NotImplementedError

    def get_result(self, accumulator: Any) -> Any:
        raise NotImplementedError

    def merge(self, acc_a: Any, acc_b: Any) -> Any:
        raise NotImplementedError


class TimeDomain:
    EVENT_TIME = 0
    PROCESSING_TIME = 1


class TimerService:
    """PyFlink's timer service over yarnflow's (the same method names)."""

    def __init__(self, ours: Any) -> None:
        self._ours = ours

    def register_event_time_timer(self, timestamp: int) -> None:
        self._ours.register_event_time_timer(timestamp)

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._ours.register_processing_time_timer(timestamp)

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._ours.delete_event_time_timer(timestamp)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._ours.delete_processing_time_timer(timestamp)

    def current_watermark(self) -> int:
        return int(self._ours.current_watermark())

    def current_processing_time(self) -> int:
        return int(self._ours.current_processing_time())


class KeyedProcessFunction(Function):
    """``process_element(value, ctx)`` and ``on_timer(timestamp, ctx)`` yield their outputs
    (``yield output_tag, value`` for a side output)."""

    class Context:
        def __init__(self, ours: Any, key: Any) -> None:
            self._ours, self._key = ours, key

        def timestamp(self) -> Any:
            return self._ours.timestamp

        def get_current_key(self) -> Any:
            return self._key

        def timer_service(self) -> TimerService:
            return TimerService(self._ours.timer_service())

    class OnTimerContext(Context):
        def time_domain(self) -> int:
            return TimeDomain.PROCESSING_TIME if self._ours.time_domain == "PROCESSING_TIME" else TimeDomain.EVENT_TIME

    def process_element(self, value: Any, ctx: Any) -> Any:
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        return None


class CoMapFunction(Function):
    def map1(self, value: Any) -> Any:
        raise NotImplementedError

    def map2(self, value: Any) -> Any:
        raise NotImplementedError


class CoFlatMapFunction(CoMapFunction):
    def flat_map1(self, value: Any) -> Any:
        raise NotImplementedError

    def flat_map2(self, value: Any) -> Any:
        raise NotImplementedError


class CoProcessFunction(CoMapFunction):
    """``process_element1`` / ``process_element2(value, ctx)`` yield outputs."""

    Context = KeyedProcessFunction.Context

    def process_element1(self, value: Any, ctx: Any) -> Any:
        raise NotImplementedError

    def process_element2(self, value: Any, ctx: Any) -> Any:
        raise NotImplementedError


class KeyedCoProcessFunction(CoProcessFunction):
    """As CoProcessFunction, with keyed state (from open's runtime context) and timers."""

    OnTimerContext = KeyedProcessFunction.OnTimerContext

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        return None


class BroadcastProcessFunction(CoMapFunction):
    """``process_element(value, ctx)`` reads ``ctx.get_broadcast_state(descriptor)``;
    ``process_broadcast_element(value, ctx)`` may change it."""

    def process_element(self, value: Any, ctx: Any) -> Any:
        raise NotImplementedError

    def process_broadcast_element(self, value: Any, ctx: Any) -> Any:
        raise NotImplementedError


class KeyedBroadcastProcessFunction(BroadcastProcessFunction):
    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        return None


class ProcessWindowFunction(Function):
    """``process(key, context, elements)`` once a window fires (``context.window()``: its
    ``start``, ``end``); yields outputs. On ``window_all``: ``process(context, elements)``."""

    def process(self, *args: Any) -> Any:
        raise NotImplementedError


class WindowFunction(Function):
    """``apply(key, window, inputs)`` once a window fires; yields outputs (on ``window_all``:
    ``apply(window, inputs)``)."""

    def apply(self, *args: Any) -> Any:
        raise NotImplementedError


ProcessAllWindowFunction = ProcessWindowFunction
AllWindowFunction = WindowFunction


class ProcessFunction(Function):
    """``process_element(value, ctx)`` on a stream that is not keyed: yields outputs
    (``yield output_tag, value`` for a side output); ``ctx.timestamp()``,
    ``ctx.timer_service()`` (the clocks; timers need a keyed stream)."""

    Context = KeyedProcessFunction.Context

    def process_element(self, value: Any, ctx: Any) -> Any:
        raise NotImplementedError
