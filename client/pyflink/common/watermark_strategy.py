"""``pyflink.common.watermark_strategy``: event time from a TimestampAssigner, watermarks as
yarnflow's strategies make them (bounded out-of-orderness, monotonous, idleness)."""

from __future__ import annotations

from typing import Any

from yarnflow.pyflink.common.time import to_millis

__all__ = ["WatermarkStrategy", "TimestampAssigner"]


class TimestampAssigner:
    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        raise NotImplementedError


class WatermarkStrategy:
    def __init__(self, kind: str, max_out_of_orderness_ms: int = 0, assigner: Any = None,
                 idleness_ms: int | None = None) -> None:
        self._kind = kind
        self._max_ms = max_out_of_orderness_ms
        self._assigner = assigner
        self._idleness_ms = idleness_ms

    @staticmethod
    def no_watermarks() -> WatermarkStrategy:
        return WatermarkStrategy("none")

    @staticmethod
    def for_monotonous_timestamps() -> WatermarkStrategy:
        return WatermarkStrategy("monotonous")

    @staticmethod
    def for_bounded_out_of_orderness(max_out_of_orderness: Any) -> WatermarkStrategy:
        return WatermarkStrategy("bounded", to_millis(max_out_of_orderness, "for_bounded_out_of_orderness"))

    def with_timestamp_assigner(self, timestamp_assigner: Any) -> WatermarkStrategy:
        return WatermarkStrategy(self._kind, self._max_ms, timestamp_assigner, self._idleness_ms)

    def with_idleness(self, idle_timeout: Any) -> WatermarkStrategy:
        return WatermarkStrategy(self._kind, self._max_ms, self._assigner, to_millis(idle_timeout, "with_idleness"))

    def _yarnflow(self, column: str) -> Any:
        """yarnflow's strategy over the timestamps in ``column``."""
        from yarnflow.common.api import WatermarkStrategy as Ours

        ours = Ours.for_monotonous_timestamps() if self._kind == "monotonous" else \
            Ours.for_bounded_out_of_orderness(self._max_ms)
        ours = ours.with_timestamp_column(column)
        return ours.with_idleness(self._idleness_ms) if self._idleness_ms is not None else ours
