"""Event time: the TimestampsAndWatermarks operator (chained right after the source) applies a
user's WatermarkStrategy (``yarnflow.common.api.watermarks``): it checks timestamps and emits
watermarks in-band, and marks its output idle when no records came for a while."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from yarnflow.common.api.watermarks import WatermarkOutput, WatermarkStrategy
from yarnflow.common.errors import JobDefinitionError, YarnflowError
from yarnflow.worker.operators.base import Operator, Output, RuntimeContext
from yarnflow.worker.operators.rows import row_dicts
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


class GeneratorOutput(WatermarkOutput):
    """The WatermarkOutput a generator emits through: watermarks only ever rise; ``mark_idle``
    marks the stream idle until the next row or watermark."""

    def __init__(self, op: Operator) -> None:
        self._op = op
        self.emitted = -(2**63)
        self.idle = False

    def emit_watermark(self, timestamp: int) -> None:
        timestamp = int(timestamp)
        if timestamp > self.emitted:
            self.active()
            self.emitted = timestamp
            self._op.output.emit_watermark(Watermark(timestamp))

    def mark_idle(self) -> None:
        if not self.idle:
            self.idle = True
            _status(self._op, IDLE)

    def active(self) -> None:
        if self.idle:
            self.idle = False
            _status(self._op, ACTIVE)


def _status(op: Operator, status: object) -> None:
    emit = getattr(op.output, "emit_status", None)
    if emit is not None:
        emit(status)


class TimestampsAndWatermarks(Operator):
    """Applies a WatermarkStrategy to its input: checks each batch's event times, feeds them to
    the strategy's generator (``on_batch``, else ``on_event`` per row) and calls its
    ``on_periodic_emit`` every ``periodic_ms`` (a custom generator's ``pipeline.auto-watermark-
    interval``); marks the output idle when no rows came for the strategy's idleness."""

    kind = "timestamps_watermarks"

    def __init__(self, strategy: WatermarkStrategy, name: str | None = None) -> None:
        super().__init__(name or "timestamps/watermarks")
        if not strategy.timestamp_column:
            raise JobDefinitionError("the watermark strategy needs a timestamp column: "
                                     "strategy.with_timestamp_column('ts')")
        self.strategy = strategy
        self._last_record_ms = 0
        if strategy.idleness_ms:
            self.processing_time_interval_ms = max(10, min(strategy.idleness_ms // 2, 200))

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        if self.strategy.generator is not None:  # a custom generator's periodic emits
            from yarnflow.common.config import Options

            periodic = Options.WATERMARK_INTERVAL.convert(ctx.config.get(Options.WATERMARK_INTERVAL.key) or "200 ms")
            self.processing_time_interval_ms = min(periodic, self.processing_time_interval_ms or periodic)

    def open(self) -> None:
        self._last_record_ms = self.ctx.clock()
        self._generator = self.strategy.create_generator()
        self._out = GeneratorOutput(self)
        self._on_batch = getattr(self._generator, "on_batch", None)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        ts = event_times_ms(batch, self.strategy.timestamp_column, self.name)
        self._out.active()
        self._last_record_ms = self.ctx.clock()
        self.output.collect(batch)
        if self._on_batch is not None:
            self.call_user(self._on_batch, ts, self._out)
        else:
            on_event = self._generator.on_event
            for row, t in zip(row_dicts(batch), ts.tolist()):
                try:
                    on_event(row, t, self._out)
                except Exception as exc:
                    raise self.user_error(on_event, exc) from exc

    def process_watermark(self, watermark: Watermark, input_index: int = 0) -> None:
        # upstream watermarks are replaced by this strategy's, except the final one
        if watermark.timestamp == 2**63 - 1:
            self._out.emit_watermark(watermark.timestamp)

    def on_processing_time(self, now_ms: int) -> None:
        if self.strategy.generator is not None:
            self.call_user(self._generator.on_periodic_emit, self._out)
        idleness = self.strategy.idleness_ms
        if idleness and not self._out.idle and now_ms - self._last_record_ms >= idleness:
            self._out.mark_idle()
