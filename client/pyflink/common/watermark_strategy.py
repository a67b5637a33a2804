"""``pyflink.common.watermark_strategy``: only ``no_watermarks()`` so far (event time in the
PyFlink layer is to come; yarnflow's own API has it)."""

from __future__ import annotations

from typing import Any

__all__ = ["WatermarkStrategy", "TimestampAssigner"]


class TimestampAssigner:
    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        raise NotImplementedError


class WatermarkStrategy:
    def __init__(self, kind: str) -> None:
        self._kind = kind

    @staticmethod
    def no_watermarks() -> WatermarkStrategy:
        return WatermarkStrategy("none")

    @staticmethod
    def for_monotonous_timestamps() -> WatermarkStrategy:
        return WatermarkStrategy("monotonous")

    @staticmethod
    def for_bounded_out_of_orderness(max_out_of_orderness: Any) -> WatermarkStrategy:
        return WatermarkStrategy("bounded")

    def with_timestamp_assigner(self, timestamp_assigner: Any) -> WatermarkStrategy:
        return self

    def with_idleness(self, idle_timeout: Any) -> WatermarkStrategy:
        return self
