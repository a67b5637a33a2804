"""Event time: a WatermarkStrategy names the event-time column and how watermarks follow it,
as Flink's WatermarkStrategy and WatermarkGenerator. The TaskExecutor applies it after a source
(``yarnflow.worker.operators.timestamps``) or inside a file source, per split
(``read_text(..., watermark_strategy=)``: FLIP-27's per-split watermarks).

A WatermarkGenerator sees each row's event time (``on_event``, or a whole batch's times at once
with ``on_batch``, the vectorised form) and emits watermarks through ``output.emit_watermark(ts)``
there (punctuated) or in ``on_periodic_emit`` (periodic: every ``pipeline.auto-watermark-interval``).
``output.mark_idle()`` says no rows will come for a while (downstream operators stop waiting for
this input); the next emitted row or watermark makes it active again."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["BoundedOutOfOrdernessWatermarks", "WatermarkGenerator", "WatermarkOutput", "WatermarkStrategy"]

MIN_WATERMARK = -(2**63)


class WatermarkOutput:
    """What a generator emits through (the runtime's implements it)."""

    def emit_watermark(self, timestamp: int) -> None:
        raise NotImplementedError

    def mark_idle(self) -> None:
        raise NotImplementedError


class WatermarkGenerator:
    """Subclass it (Flink's WatermarkGenerator). ``on_event(row, timestamp, output)`` per row;
    a generator may define ``on_batch(timestamps, output)`` instead (a numpy array of a batch's
    event times, ms), which is called once per batch and skips ``on_event``."""

    def on_event(self, row: dict[str, Any], timestamp: int, output: WatermarkOutput) -> None:
        pass

    def on_periodic_emit(self, output: WatermarkOutput) -> None:
        pass


class BoundedOutOfOrdernessWatermarks(WatermarkGenerator):
    """Rows up to ``max_out_of_orderness_ms`` behind the latest are on time: after each batch the
    watermark is the highest event time seen minus that, minus 1."""

    def __init__(self, max_out_of_orderness_ms: int) -> None:
        self.bound = max_out_of_orderness_ms
        self.max_ts = MIN_WATERMARK

    def on_batch(self, timestamps: Any, output: WatermarkOutput) -> None:
        if len(timestamps):
            self.max_ts = max(self.max_ts, int(timestamps.max()))
            output.emit_watermark(self.max_ts - self.bound - 1)

    def on_event(self, row: dict[str, Any], timestamp: int, output: WatermarkOutput) -> None:
        self.max_ts = max(self.max_ts, timestamp)

    def on_periodic_emit(self, output: WatermarkOutput) -> None:
        if self.max_ts > MIN_WATERMARK:
            output.emit_watermark(self.max_ts - self.bound - 1)


class WatermarkStrategy:
    """How event time and watermarks are derived from a stream, as Flink's WatermarkStrategy.

        WatermarkStrategy.for_bounded_out_of_orderness(200).with_timestamp_column("ts").with_idleness(5000)
        WatermarkStrategy.for_generator(lambda: MyGenerator()).with_timestamp_column("ts")

    Raises ValueError for a negative out-of-orderness or a non-positive idleness."""

    def __init__(self, max_out_of_orderness_ms: int = 0, timestamp_column: str = "", idleness_ms: int | None = None,
                 generator: Callable[[], WatermarkGenerator] | None = None) -> None:
        if max_out_of_orderness_ms < 0:
            raise ValueError("max out-of-orderness cannot be negative")
        if generator is not None and not callable(generator):
            raise ValueError(f"for_generator takes a function that makes a WatermarkGenerator, got {generator!r}")
        self.max_out_of_orderness_ms = max_out_of_orderness_ms
        self.timestamp_column = timestamp_column
        self.idleness_ms = idleness_ms
        self.generator = generator

    @classmethod
    def for_bounded_out_of_orderness(cls, max_out_of_orderness_ms: int) -> WatermarkStrategy:
        return cls(max_out_of_orderness_ms)

    @classmethod
    def no_watermarks(cls) -> WatermarkStrategy:
        """No event time: a source read with it emits no watermarks (Flink's ``noWatermarks``)."""
        return cls(0)

    @classmethod
    def for_monotonous_timestamps(cls) -> WatermarkStrategy:
        return cls(0)

    @classmethod
    def for_generator(cls, factory: Callable[[], WatermarkGenerator]) -> WatermarkStrategy:
        """Watermarks from ``factory()``'s generator (one per subtask, or per split in a source)."""
        return cls(0, generator=factory)

    def with_timestamp_column(self, column: str) -> WatermarkStrategy:
        return WatermarkStrategy(self.max_out_of_orderness_ms, column, self.idleness_ms, self.generator)

    def with_idleness(self, idleness_ms: int) -> WatermarkStrategy:
        if idleness_ms <= 0:
            raise ValueError("idleness must be positive")
        return WatermarkStrategy(self.max_out_of_orderness_ms, self.timestamp_column, idleness_ms, self.generator)

    def create_generator(self) -> WatermarkGenerator:
        if self.generator is None:
            return BoundedOutOfOrdernessWatermarks(self.max_out_of_orderness_ms)
        made = self.generator()
        if not callable(getattr(made, "on_event", None)) and not callable(getattr(made, "on_batch", None)):
            raise ValueError(f"the watermark generator factory made {made!r}, not a WatermarkGenerator")
        return made
