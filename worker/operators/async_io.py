"""Async I/O (Flink's AsyncWaitOperator): a per-row coroutine (``AsyncFunction.async_invoke``, or
an ``async def`` function) that calls an external service, with up to ``capacity`` calls in
flight at once on an asyncio event loop of the task's own (a thread), so the task does not wait
for one call before it starts the next.

- Ordered mode emits results in input order; unordered mode as they complete. A watermark
  waits until every call made before it has completed and its results went out (so results never
  come after a watermark that passed their input's time; Flink's unordered mode does the same).
- A call that takes longer than ``timeout_ms`` is cancelled and the function's ``timeout(row)``
  gives the result instead (by default it raises: the task fails, as in Flink).
- With ``capacity`` calls in flight the task waits for the oldest one (back-pressure).
- Checkpoints: the input rows of the calls still in flight (or done but not emitted) are the
  operator's list state; a restored subtask calls them again before anything new, so each input
  row's result is emitted once in what the checkpoints commit (Flink's semantics). On a rescale
  the list is split over the new subtasks.

A call returns the rows it emits: a dict (one row), an iterable of them, a scalar (kept in column
'value') or None (nothing)."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from concurrent.futures import Future
from typing import Any

import pyarrow as pa

from yarnflow.common.api.state import ListStateDescriptor
from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.elements import Watermark
from yarnflow.worker.operators.base import Operator, Output, RuntimeContext, TaskCancelledError
from yarnflow.worker.operators.rows import RowBuffer, row_dicts
from yarnflow.worker.state.operator_state import OperatorStateStore
from yarnflow.worker.state.tables import Snapshot

__all__ = ["AsyncWaitOperator"]

IN_FLIGHT = ListStateDescriptor("in-flight")
_POLL_S = 0.05


class _Call:
    __slots__ = ("row", "future")

    def __init__(self, row: dict[str, Any], future: Future[Any]) -> None:
        self.row, self.future = row, future


class AsyncWaitOperator(Operator):
    kind = "async_wait"
    processing_time_interval_ms = 10  # results of finished calls go out without waiting for input

    def __init__(self, fn: Any, timeout_ms: int, capacity: int = 100, ordered: bool = True,
                 name: str | None = None) -> None:
        super().__init__(name or getattr(fn, "__name__", None) or type(fn).__name__)
        invoke = getattr(fn, "async_invoke", fn)
        if isinstance(fn, type) or not asyncio.iscoroutinefunction(invoke):
            raise JobDefinitionError(f"async operator '{self.name}' needs an AsyncFunction (async def async_invoke) "
                                     f"or an async def function, got {fn!r}")
        if timeout_ms <= 0 or capacity < 1:
            raise JobDefinitionError(f"async operator '{self.name}': timeout must be positive and capacity at least 1 "
                                     f"(got {timeout_ms} ms, {capacity})")
        self.fn, self.timeout_ms, self.capacity, self.ordered = fn, timeout_ms, capacity, ordered

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        self._calls: collections.deque[_Call] = collections.deque()
        self._out = RowBuffer(self.name)
        self._state = OperatorStateStore(ctx.subtask_index, ctx.parallelism, self.name)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        self._state.restore(state)

    def open(self) -> None:
        if callable(getattr(self.fn, "open", None)):
            self.call_user(self.fn.open, self.ctx)
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name=f"async io of {self.name}", daemon=True)
        self._thread.start()
        for row in self._state.get_list_state(IN_FLIGHT).get():  # restored calls go first
            self._call(row)
        self._state.get_list_state(IN_FLIGHT).clear()

    # -- calls ---------------------------------------------------------------------------------
    async def _invoke(self, row: dict[str, Any]) -> Any:
        invoke = getattr(self.fn, "async_invoke", self.fn)
        try:
            return await asyncio.wait_for(invoke(row), self.timeout_ms / 1000)
        except asyncio.TimeoutError:
            on_timeout = getattr(self.fn, "timeout", None)
            if on_timeout is None:
                raise TimeoutError(f"async operator '{self.name}': the call for {row!r} took longer than "
                                   f"{self.timeout_ms} ms") from None
            return await on_timeout(row)

    def _call(self, row: dict[str, Any]) -> None:
        while len(self._calls) >= self.capacity:  # back-pressure: wait for the oldest (or any) call
            self._wait(self._calls[0].future if self.ordered else None)
            self._emit_done()
        assert self._loop is not None
        self._calls.append(_Call(row, asyncio.run_coroutine_threadsafe(self._invoke(row), self._loop)))

    def _wait(self, future: Future[Any] | None) -> None:
        """Wait for ``future`` (None: for any call) to complete; a cancelled task stops waiting."""
        while True:
            pending = [future] if future is not None else [c.future for c in self._calls]
            done, _ = concurrent.futures.wait(pending, _POLL_S, return_when=concurrent.futures.FIRST_COMPLETED)
            if done:
                return
            if self.ctx.cancelled():
                raise TaskCancelledError(f"{self.name} was cancelled")

    def _emit_done(self) -> None:
        """Emit the results of completed calls: from the head while done (ordered), or all done."""
        if self.ordered:
            while self._calls and self._calls[0].future.done():
                self._take(self._calls.popleft())
        else:
            done = [c for c in self._calls if c.future.done()]
            for c in done:
                self._calls.remove(c)
                self._take(c)
        for batch in self._out.drain(self.ctx.batch_size):
            self.output.collect(batch)

    def _take(self, call: _Call) -> None:
        error = call.future.exception()
        if error is not None:
            raise self.user_error(getattr(self.fn, "async_invoke", self.fn), error
                                  if isinstance(error, Exception) else RuntimeError(str(error))) from error
        result = call.future.result()
        if result is None:
            return
        if isinstance(result, dict) or not hasattr(result, "__iter__") or isinstance(result, (str, bytes)):
            self._out.add(result)
        else:
            self._out.extend(result)

    def _drain_all(self) -> None:
        while self._calls:
            self._wait(self._calls[0].future)
            self._emit_done()

    # -- input ---------------------------------------------------------------------------------
    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        for row in row_dicts(batch):
            self._call(row)
        self._emit_done()

    def process_watermark(self, watermark: Watermark, input_index: int = 0) -> None:
        self._drain_all()
        self.output.emit_watermark(watermark)

    def on_processing_time(self, now_ms: int) -> None:
        if self._calls:
            self._emit_done()

    def finish(self) -> None:
        self._drain_all()

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        self._emit_done()  # what is done goes out before the barrier; the rest is state

    def snapshot_state(self, checkpoint_id: int) -> Snapshot:
        self._state.get_list_state(IN_FLIGHT).update(c.row for c in self._calls)
        tables = self._state.snapshot()
        self._state.get_list_state(IN_FLIGHT).clear()
        return tables

    def close(self) -> None:
        for c in self._calls:
            c.future.cancel()
        self._calls.clear()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(5)
            if not self._loop.is_running():
                self._loop.close()
        if callable(getattr(self.fn, "close", None)):
            self.call_user(self.fn.close)

