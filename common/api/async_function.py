"""The user function of async I/O (``AsyncDataStream.ordered_wait`` / ``unordered_wait``), as
Flink's AsyncFunction; the TaskExecutor runs it in ``worker/operators/async_io.py``."""

from __future__ import annotations

from typing import Any

__all__ = ["AsyncFunction"]


class AsyncFunction:
    """Subclass it: ``async def async_invoke(self, row)`` returns the result rows of ``row``;
    ``async def timeout(self, row)`` those of a call that ran out of time (by default it raises
    TimeoutError, which fails the task). ``open(ctx)`` / ``close()`` run on the task's thread."""

    def open(self, ctx: Any) -> None:
        pass

    async def async_invoke(self, row: dict[str, Any]) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement async_invoke")

    async def timeout(self, row: dict[str, Any]) -> Any:
        raise TimeoutError(f"{type(self).__name__}: the call for {row!r} timed out")

    def close(self) -> None:
        pass
