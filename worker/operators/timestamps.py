"""Event time: the TimestampsAndWatermarks operator (chained right after the source) applies a
user's WatermarkStrategy (``yarnflow.common.api.watermarks``): it checks timestamps and emits
watermarks in-band, and marks its output idle when no records came for a while."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from yarnflow.common.api.watermarks import WatermarkStrategy
from yarnflow.common.errors import JobDefinitionError, YarnflowError
from yarnflow.worker.operators.base import Operator
from yarnflow.worker.runtime.elements import ACTIVE, IDLE, Watermark


class EventTimeError(YarnflowError, ValueError):
    """A record has no usable event time; the message names the operator and the column."""


def event_times_ms(batch: pa.RecordBatch, column: str, op_name: str) -> pa.Array:
    """The event-time column as int64 milliseconds; errors name the operator and column."""
    idx = batch.schema.get_field_index(column)
    if idx < 0:
        raise JobDefinitionError(f"operator '{op_name}': event-time column {column!r} does not exist; "
                                 f"the input has columns {batch.schema.names}")
    col = batch.column(idx)
    if col.null_count:
        row = pc.index(pc.is_null(col), True).as_py()
        raise EventTimeError(f"operator '{op_name}': null event time in column {column!r} (row {row} of a batch)")
    t = col.type
    if pa.types.is_timestamp(t):
        return pc.cast(pc.cast(col, pa.timestamp("ms"), safe=False), pa.int64())  # truncates sub-ms digits
    if pa.types.is_integer(t):
        return pc.cast(col, pa.int64())
    raise EventTimeError(f"operator '{op_name}': event-time column {column!r} has type {t}; "
                         f"expected integer milliseconds or a timestamp")


class TimestampsAndWatermarks(Operator):
    kind = "timestamps_watermarks"

    def __init__(self, strategy: WatermarkStrategy, name: str | None = None) -> None:
        super().__init__(name or "timestamps/watermarks")
        if not strategy.timestamp_column:
            raise JobDefinitionError("the watermark strategy needs a timestamp column: "
                                     "strategy.with_timestamp_column('ts')")
        self.strategy = strategy
        self._max_ts = -(2**63)
        self._emitted = -(2**63)
        self._last_record_ms = 0
        self._idle = False
        if strategy.idleness_ms:
            self.processing_time_interval_ms = max(10, min(strategy.idleness_ms // 2, 200))

    def open(self) -> None:
        self._last_record_ms = self.ctx.clock()

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        ts = event_times_ms(batch, self.strategy.timestamp_column, self.name)
        if self._idle:
            self._idle = False
            self._status(ACTIVE)
        self._last_record_ms = self.ctx.clock()
        self.output.collect(batch)
        if len(ts):
            self._max_ts = max(self._max_ts, pc.max(ts).as_py())
            wm = self._max_ts - self.strategy.max_out_of_orderness_ms - 1
            if wm > self._emitted:
                self._emitted = wm
                self.output.emit_watermark(Watermark(wm))

    def process_watermark(self, watermark: Watermark, input_index: int = 0) -> None:
        # upstream watermarks are replaced by this strategy's, except the final one
        if watermark.timestamp == 2**63 - 1 and watermark.timestamp > self._emitted:
            self._emitted = watermark.timestamp
            self.output.emit_watermark(watermark)

    def on_processing_time(self, now_ms: int) -> None:
        idleness = self.strategy.idleness_ms
        if idleness and not self._idle and now_ms - self._last_record_ms >= idleness:
            self._idle = True
            self._status(IDLE)

    def _status(self, status: object) -> None:
        emit = getattr(self.output, "emit_status", None)
        if emit is not None:
            emit(status)
