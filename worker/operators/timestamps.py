"""Event time: the TimestampsAndWatermarks operator (chained right after the source) applies a
user's WatermarkStrategy (``yarnflow.common.api.watermarks``): it checks timestamps and emits
watermarks in-band, and marks its output idle when no records came for a while."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from yarnflow.common.api.watermarks import WatermarkStrategy
from yarnflow.common.errors import JobDefinitionError, YarnflowError
from yarnflow.worker.operators.base import Operator
from yarnflow.worker.elements import ACTIVE, IDLE, Watermark


class EventTimeError(YarnflowError, ValueError):
    """A record has no usable event time; the message names the operator and the column."""


class MissingEventTimeError(EventTimeError):
    """A row's event-time column is null. Fill or filter such rows before this operator."""


class EventTimeTypeError(EventTimeError, JobDefinitionError):
    """The event-time column has a type that is not a time: integers (ms), timestamps or dates."""


_MS_SCALE = {"s": (1000, 1), "ms": (1, 1), "us": (1, 1000), "ns": (1, 1_000_000)}  # (multiply, floor-divide)


def event_times_ms(batch: pa.RecordBatch, column: str, op_name: str) -> np.ndarray:
    """The event-time column as an int64 numpy array of ms since the epoch: integers are taken
    as ms, timestamps are floored to ms, dates are their midnight. Every operator that reads
    event time from a column uses this.

    Raises JobDefinitionError when the column does not exist, MissingEventTimeError when a row's
    time is null and EventTimeTypeError (also a JobDefinitionError) for a column of another type."""
    idx = batch.schema.get_field_index(column)
    if idx < 0:
        raise JobDefinitionError(f"operator '{op_name}': event-time column {column!r} does not exist; "
                                 f"the input has columns {batch.schema.names}")
    col = batch.column(idx)
    if col.null_count:
        row = pc.index(pc.is_null(col), True).as_py()
        raise MissingEventTimeError(f"operator '{op_name}': null event time in column {column!r} "
                                    f"(row {row} of a batch of {batch.num_rows}); every row needs a time")
    t = col.type
    if pa.types.is_integer(t):
        return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64)
    if pa.types.is_timestamp(t) or pa.types.is_date64(t):
        raw = np.asarray(col.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)
        mul, div = _MS_SCALE[getattr(t, "unit", "ms")]
        return raw * mul if div == 1 else raw // div
    if pa.types.is_date32(t):
        return np.asarray(col.cast(pa.int32()).to_numpy(zero_copy_only=False), dtype=np.int64) * 86_400_000
    raise EventTimeTypeError(f"operator '{op_name}': event-time column {column!r} has type {t}; "
                             f"expected integer milliseconds, a timestamp or a date")


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
            self._max_ts = max(self._max_ts, int(ts.max()))
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
