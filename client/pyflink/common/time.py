"""``pyflink.common.time``: Duration and Time (milliseconds inside)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Duration", "Time", "to_millis"]


def to_millis(value: object, what: str) -> int:
    """Milliseconds from a ``Time``, a ``Duration`` or an int of ms; TypeError naming ``what``."""
    to_ms = getattr(value, "to_milliseconds", None)
    if callable(to_ms):
        return int(to_ms())
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what}: expected Time, Duration or milliseconds, not {value!r}")
    return value


@dataclass(frozen=True)
class Duration:
    millis: int

    @staticmethod
    def of_millis(millis: int) -> Duration:
        return Duration(int(millis))

    @staticmethod
    def of_seconds(seconds: int) -> Duration:
        return Duration(int(seconds) * 1000)

    @staticmethod
    def of_minutes(minutes: int) -> Duration:
        return Duration(int(minutes) * 60_000)

    @staticmethod
    def of_hours(hours: int) -> Duration:
        return Duration(int(hours) * 3_600_000)

    @staticmethod
    def of_days(days: int) -> Duration:
        return Duration(int(days) * 86_400_000)

    @staticmethod
    def zero() -> Duration:
        return Duration(0)

    def to_milliseconds(self) -> int:
        return self.millis

    def total_seconds(self) -> float:  # (so yarnflow's settings take it as they take a timedelta)
        return self.millis / 1000


@dataclass(frozen=True)
class Time:
    millis: int

    @staticmethod
    def milliseconds(ms: int) -> Time:
        return Time(int(ms))

    @staticmethod
    def seconds(s: int) -> Time:
        return Time(int(s) * 1000)

    @staticmethod
    def minutes(m: int) -> Time:
        return Time(int(m) * 60_000)

    @staticmethod
    def hours(h: int) -> Time:
        return Time(int(h) * 3_600_000)

    @staticmethod
    def days(d: int) -> Time:
        return Time(int(d) * 86_400_000)

    def to_milliseconds(self) -> int:
        return self.millis
