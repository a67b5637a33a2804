"""A source of the user's own (``SourceFunction``, ``env.add_source``): its ``run(ctx)`` emits
rows through ``ctx.collect``; they are gathered into batches (of the batch size, or whatever came
within ``FLUSH_S``). The batch is emitted, and the task's mail taken (a checkpoint's snapshot,
a cancellation), only when ``collect`` is called with the next row, before that row is kept,
or in ``ctx.sleep``: at those points the function has updated its state for every row emitted,
so a snapshot of its operator state (a ``CheckpointedFunction``'s list and union-list state)
matches exactly the rows before the barrier."""

from __future__ import annotations

import time
from typing import Any, Callable

import pyarrow as pa

from yarnflow.common.api.co_functions import CheckpointedFunction
from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.operators.base import Output, RuntimeContext, SourceOperator
from yarnflow.worker.operators.checkpointed import InitContext
from yarnflow.worker.operators.rows import RowBuffer
from yarnflow.worker.state.operator_state import OperatorStateStore

__all__ = ["UserSource"]

FLUSH_S = 0.05


class _Stopped(BaseException):
    """The task was cancelled or stopped: the function's run is left (a BaseException, so that a
    user's ``except Exception`` does not keep it running)."""


class SourceContext:
    """``ctx`` of ``SourceFunction.run``."""

    def __init__(self, op: UserSource, tick: Callable[[], bool]) -> None:
        self._op, self._tick = op, tick
        self._buffer = RowBuffer(op.name)
        self._since = time.monotonic()
        self._stopped = False

    @property
    def runtime_context(self) -> RuntimeContext:
        return self._op.ctx

    def collect(self, row: Any) -> None:
        if self._buffer.rows and (len(self._buffer.rows) >= self._op.ctx.batch_size
                                  or time.monotonic() - self._since >= FLUSH_S):
            self.flush()
        if self._stopped:
            raise _Stopped()
        self._buffer.add(row)

    def flush(self) -> None:
        """Emit what was collected, then take the task's mail (checkpoints happen here)."""
        for batch in self._buffer.drain(self._op.ctx.batch_size):
            self._op.output.collect(batch)
        self._since = time.monotonic()
        if self._tick():
            self._stopped = True

    def sleep(self, seconds: float) -> None:
        """Wait (counted as idle time), emitting what was collected and taking mail meanwhile."""
        self.flush()
        end = time.monotonic() + seconds
        while not self._stopped and (left := end - time.monotonic()) > 0:
            self._op.pause(min(left, FLUSH_S))
            if self._tick():
                self._stopped = True
        if self._stopped:
            raise _Stopped()

    def is_cancelled(self) -> bool:
        return self._stopped


class UserSource(SourceOperator):
    kind = "user_source"
    bounded = False

    def __init__(self, fn: Any, name: str | None = None) -> None:
        super().__init__(name or type(fn).__name__)
        if isinstance(fn, type) or not callable(getattr(fn, "run", None)):
            raise JobDefinitionError(f"add_source needs a SourceFunction instance (with run(ctx)), got {fn!r}")
        self.fn = fn

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        self._state = OperatorStateStore(ctx.subtask_index, ctx.parallelism, self.name)

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        self._state.restore(state)

    def open(self) -> None:
        if isinstance(self.fn, CheckpointedFunction):
            self.call_user(self.fn.initialize_state, InitContext(self._state))
        if callable(getattr(self.fn, "open", None)):
            self.call_user(self.fn.open, self.ctx)

    def run(self, cancelled: Callable[[], bool]) -> None:
        ctx = SourceContext(self, cancelled)
        try:
            self.call_user(self.fn.run, ctx)
            ctx.flush()
        except _Stopped:
            return

    def snapshot_state(self, checkpoint_id: int) -> dict[str, pa.Table]:
        if isinstance(self.fn, CheckpointedFunction):
            self.call_user(self.fn.snapshot_state, InitContext(self._state, checkpoint_id))
        return self._state.snapshot()

    def close(self) -> None:
        if callable(getattr(self.fn, "close", None)):
            self.call_user(self.fn.close)
