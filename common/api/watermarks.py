"""Event time: a WatermarkStrategy names the event-time column and how watermarks follow it.
The TaskExecutor's TimestampsAndWatermarks operator (``yarnflow.worker.operators.timestamps``)
applies it to a stream."""

from __future__ import annotations

__all__ = ["WatermarkStrategy"]


class WatermarkStrategy:
    """How event time and watermarks are derived from a stream, as Flink's WatermarkStrategy.

        WatermarkStrategy.for_bounded_out_of_orderness(200).with_timestamp_column("ts").with_idleness(5000)

    Raises ValueError for a negative out-of-orderness or a non-positive idleness."""

    def __init__(self, max_out_of_orderness_ms: int = 0, timestamp_column: str = "", idleness_ms: int | None = None) -> None:
        if max_out_of_orderness_ms < 0:
            raise ValueError("max out-of-orderness cannot be negative")
        self.max_out_of_orderness_ms = max_out_of_orderness_ms
        self.timestamp_column = timestamp_column
        self.idleness_ms = idleness_ms

    @classmethod
    def for_bounded_out_of_orderness(cls, max_out_of_orderness_ms: int) -> WatermarkStrategy:
        return cls(max_out_of_orderness_ms)

    @classmethod
    def for_monotonous_timestamps(cls) -> WatermarkStrategy:
        return cls(0)

    def with_timestamp_column(self, column: str) -> WatermarkStrategy:
        return WatermarkStrategy(self.max_out_of_orderness_ms, column, self.idleness_ms)

    def with_idleness(self, idleness_ms: int) -> WatermarkStrategy:
        if idleness_ms <= 0:
            raise ValueError("idleness must be positive")
        return WatermarkStrategy(self.max_out_of_orderness_ms, self.timestamp_column, idleness_ms)
