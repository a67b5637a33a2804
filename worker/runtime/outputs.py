"""Where a chained operator's output goes (``ChainOutput``: the next operator of the chain;
``WriterOutput``: the chain's tail, to the record writers) and how a task combines the
watermarks of an input's channels (``WatermarkValve``: the minimum over the channels that are
not idle)."""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from yarnflow.worker.operators.base import Operator
from yarnflow.worker.elements import CheckpointBarrier, Watermark, WatermarkStatus
from yarnflow.worker.runtime.writer import RecordWriter


class WriterOutput:
    """The tail of a chain: batches go to the writers of the matching output tag."""

    def __init__(self, writers: Sequence[RecordWriter]) -> None:
        self._main = [w for w in writers if not w.output_tag]
        self._side: dict[str, list[RecordWriter]] = {}
        for w in writers:
            if w.output_tag:
                self._side.setdefault(w.output_tag, []).append(w)
        self._all = list(writers)
        self.records_out = 0
        self.watermark = -(2**63)  # the last watermark emitted (currentOutputWatermark)

    def collect(self, batch: pa.RecordBatch) -> None:
        self.records_out += batch.num_rows
        for w in self._main:
            w.emit(batch)

    def collect_side(self, tag: str, batch: pa.RecordBatch) -> None:
        for w in self._side.get(tag, ()):
            w.emit(batch)

    def emit_watermark(self, watermark: Watermark) -> None:
        self.watermark = watermark.timestamp
        for w in self._all:
            w.emit_watermark(watermark)

    def emit_status(self, status: WatermarkStatus) -> None:
        for w in self._all:
            w.broadcast_event(status)

    def broadcast_barrier(self, barrier: CheckpointBarrier) -> None:
        """To every subpartition of every writer, after everything emitted before it."""
        for w in self._all:
            w.broadcast_event(barrier)


class ChainOutput:
    """Connects an operator to the next one in its chain; side outputs leave the chain.
    Counts the records handed on (the operator's numRecordsOut, the next one's numRecordsIn)."""

    def __init__(self, nxt: Operator, tail: WriterOutput) -> None:
        self._next = nxt
        self._tail = tail
        #: which input of the next operator its predecessor feeds (0, but a two-input operator
        #: chained onto one input's operators may take it as its input 1)
        self._input = int(getattr(nxt, "chain_input", 0))
        self.records_out = 0

    def collect(self, batch: pa.RecordBatch) -> None:
        self.records_out += batch.num_rows
        self._next.process_batch(batch, self._input)

    def collect_side(self, tag: str, batch: pa.RecordBatch) -> None:
        self._tail.collect_side(tag, batch)

    def emit_watermark(self, watermark: Watermark) -> None:
        self._next.process_watermark(watermark, self._input)

    def emit_status(self, status: WatermarkStatus) -> None:
        self._tail.emit_status(status)


class WatermarkValve:
    """Combines the watermarks of one input's channels: the minimum over the live, active
    channels (finished and idle channels do not hold the watermark back), never decreasing."""

    def __init__(self, channels: Sequence[int]) -> None:
        self._wm = {ch: -(2**63) for ch in channels}
        self._done: set[int] = set()
        self._idle: set[int] = set()
        self.current = -(2**63)

    def on_watermark(self, channel: int, ts: int) -> int | None:
        if ts > self._wm[channel]:
            self._wm[channel] = ts
        return self._advance()

    def on_end(self, channel: int) -> int | None:
        self._done.add(channel)
        return self._advance()

    def on_status(self, channel: int, idle: bool) -> int | None:
        if idle:
            self._idle.add(channel)
        else:
            self._idle.discard(channel)
        return self._advance()

    @property
    def all_idle(self) -> bool:
        live = [ch for ch in self._wm if ch not in self._done]
        return bool(live) and all(ch in self._idle for ch in live)

    def _advance(self) -> int | None:
        live = [wm for ch, wm in self._wm.items() if ch not in self._done and ch not in self._idle]
        new = min(live) if live else None
        if new is not None and new > self.current:
            self.current = new
            return new
        return None
