"""User function interfaces (subclass them in a job file)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

ACC = TypeVar("ACC")


class AggregateFunction(Generic[ACC]):
    """An incremental aggregation, as Flink's AggregateFunction: rows are dicts.

    ``get_result`` returns a dict of output columns (or a scalar, put in column 'value')."""

    def create_accumulator(self) -> ACC:
        raise NotImplementedError

    def add(self, row: dict[str, Any], accumulator: ACC) -> ACC:
        raise NotImplementedError

    def get_result(self, accumulator: ACC) -> Any:
        raise NotImplementedError

    def merge(self, a: ACC, b: ACC) -> ACC:
        raise NotImplementedError(f"{type(self).__name__} does not support merge (needed by session windows)")
