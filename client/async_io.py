"""Async I/O, as Flink's AsyncDataStream: a per-row coroutine calling an external service with
many calls in flight (``worker/operators/async_io.py`` says how results, timeouts, watermarks and
checkpoints behave).

    enriched = AsyncDataStream.ordered_wait(orders, Lookup(), timeout_ms=1000, capacity=100)
    enriched = AsyncDataStream.unordered_wait(orders, lookup, timeout_ms=1000)   # an async def function
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from yarnflow.datastream import DataStream

__all__ = ["AsyncDataStream"]


class AsyncDataStream:
    @staticmethod
    def ordered_wait(stream: DataStream, fn: Any, timeout_ms: int, capacity: int = 100,
                     name: str | None = None) -> DataStream:
        """Results in the order of their input rows."""
        from yarnflow.worker.operators.async_io import AsyncWaitOperator

        return stream._then(AsyncWaitOperator(fn, timeout_ms, capacity, ordered=True, name=name))

    @staticmethod
    def unordered_wait(stream: DataStream, fn: Any, timeout_ms: int, capacity: int = 100,
                       name: str | None = None) -> DataStream:
        """Results as their calls complete (never past a watermark that came after their input)."""
        from yarnflow.worker.operators.async_io import AsyncWaitOperator

        return stream._then(AsyncWaitOperator(fn, timeout_ms, capacity, ordered=False, name=name))
