"""PyFlink's function classes: subclass one and pass an instance (or pass a plain function)."""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["Function", "MapFunction", "FlatMapFunction", "FilterFunction", "ReduceFunction", "KeySelector",
           "RuntimeContext", "Partitioner", "AggregateFunction"]


class RuntimeContext:
    """What a function's ``open(runtime_context)`` learns about its subtask."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx

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
