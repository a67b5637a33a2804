"""StreamTask: drives one subtask's operator chain from its input gate (or its source) to its
record writers. Runs on the task's own thread."""

from __future__ import annotations

import logging
from typing import Callable, Sequence

import pyarrow as pa

from yarnflow.common.errors import YarnflowError
from yarnflow.worker.operators.base import Operator, SourceOperator
from yarnflow.worker.runtime.elements import MAX_WATERMARK, EndOfPartition, Watermark
from yarnflow.worker.runtime.gate import ChannelError, InputGate
from yarnflow.worker.runtime.writer import RecordWriter

log = logging.getLogger(__name__)


class TaskCancelledError(YarnflowError):
    """Raised inside the task thread when the task was cancelled."""


class ChainOutput:
    """Connects an operator to the next one in its chain."""

    def __init__(self, nxt: Operator) -> None:
        self._next = nxt

    def collect(self, batch: pa.RecordBatch) -> None:
        self._next.process_batch(batch, 0)

    def emit_watermark(self, watermark: Watermark) -> None:
        self._next.process_watermark(watermark, 0)


class WriterOutput:
    """The tail of a chain: every outgoing edge's writer gets every batch."""

    def __init__(self, writers: Sequence[RecordWriter]) -> None:
        self._writers = list(writers)
        self.records_out = 0

    def collect(self, batch: pa.RecordBatch) -> None:
        self.records_out += batch.num_rows
        for w in self._writers:
            w.emit(batch)

    def emit_watermark(self, watermark: Watermark) -> None:
        for w in self._writers:
            w.emit_watermark(watermark)


class WatermarkValve:
    """Combines the watermarks of one input's channels: the minimum over live channels."""

    def __init__(self, channels: Sequence[int]) -> None:
        self._wm = {ch: -(2**63) for ch in channels}
        self._done: set[int] = set()
        self.current = -(2**63)

    def on_watermark(self, channel: int, ts: int) -> int | None:
        if ts > self._wm[channel]:
            self._wm[channel] = ts
        return self._advance()

    def on_end(self, channel: int) -> int | None:
        self._done.add(channel)
        return self._advance()

    def _advance(self) -> int | None:
        live = [wm for ch, wm in self._wm.items() if ch not in self._done]
        new = min(live) if live else None
        if new is not None and new > self.current:
            self.current = new
            return new
        return None


class StreamTask:
    def __init__(self, chain: Sequence[Operator], gate: InputGate | None, channel_inputs: Sequence[int],
                 writers: Sequence[RecordWriter], cancelled: Callable[[], bool], name: str) -> None:
        self.chain = list(chain)
        self.gate = gate
        self.channel_inputs = list(channel_inputs)
        self.writers = list(writers)
        self.cancelled = cancelled
        self.name = name
        self.records_in = 0
        self.tail = WriterOutput(writers)

    def wire(self, ctx_for: Callable[[Operator], object]) -> None:
        for op, nxt in zip(self.chain, self.chain[1:] + [None]):
            op.setup(ctx_for(op), ChainOutput(nxt) if nxt is not None else self.tail)  # type: ignore[arg-type]

    def invoke(self) -> None:
        opened: list[Operator] = []
        try:
            for op in reversed(self.chain):
                op.open()
                opened.append(op)
            head = self.chain[0]
            if isinstance(head, SourceOperator):
                head.run(self._check_cancelled_flag)
                self._check_cancelled()
                if head.bounded:
                    head.process_watermark(MAX_WATERMARK)
            else:
                self._run_input_loop(head)
            self._finish_chain()
            for w in self.writers:
                w.finish()
        finally:
            for op in opened:
                try:
                    op.close()
                except Exception:  # noqa: BLE001 - closing must not hide the real error
                    log.warning("%s: closing %s failed", self.name, op, exc_info=True)

    def _check_cancelled_flag(self) -> bool:
        if not self.cancelled():
            for w in self.writers:
                w.flush_if_due()
        return self.cancelled()

    def _check_cancelled(self) -> None:
        if self.cancelled():
            raise TaskCancelledError(f"{self.name} was cancelled")

    def _finish_chain(self) -> None:
        for i, op in enumerate(self.chain):
            if i > 0:
                op.end_input(0)
            op.finish()

    def _run_input_loop(self, head: Operator) -> None:
        gate = self.gate
        assert gate is not None
        inputs = sorted(set(self.channel_inputs))
        valves = {i: WatermarkValve([ch for ch, inp in enumerate(self.channel_inputs) if inp == i]) for i in inputs}
        remaining = {i: sum(1 for inp in self.channel_inputs if inp == i) for i in inputs}
        timeout: float | None = None
        while any(remaining.values()):
            self._check_cancelled()
            polled = gate.poll(timeout if timeout is not None else 0.5)
            if polled is not None:
                ch, element = polled
                inp = self.channel_inputs[ch]
                if isinstance(element, pa.RecordBatch):
                    self.records_in += element.num_rows
                    head.process_batch(element, inp)
                elif isinstance(element, Watermark):
                    wm = valves[inp].on_watermark(ch, element.timestamp)
                    if wm is not None:
                        head.process_watermark(Watermark(wm), inp)
                elif isinstance(element, EndOfPartition):
                    remaining[inp] -= 1
                    wm = valves[inp].on_end(ch)
                    if wm is not None and remaining[inp]:
                        head.process_watermark(Watermark(wm), inp)
                    if remaining[inp] == 0:
                        head.end_input(inp)
                elif isinstance(element, ChannelError):
                    raise element.error
            timeout = None
            for w in self.writers:
                due = w.flush_if_due()
                if due is not None:
                    timeout = due if timeout is None else min(timeout, due)
