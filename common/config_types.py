"""Typed values of configuration options: the parsers of durations, sizes, port ranges,
numbers and booleans, and ``ConfigOption`` (a key, its parser, its description and limits).
``common/config.py`` declares the options themselves."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")

_DURATION_UNITS = {"ms": 1, "s": 1000, "sec": 1000, "min": 60_000, "m": 60_000, "h": 3_600_000}
_SIZE_UNITS = {"b": 1, "kb": 1 << 10, "k": 1 << 10, "mb": 1 << 20, "m": 1 << 20,
               "gb": 1 << 30, "g": 1 << 30}


def parse_duration_ms(value: Any) -> int:
    """``"10 s"`` -> 10000; a bare number is milliseconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as '10 s' or '500 ms'")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return int(value)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", str(value).lower())
    if not m or (m.group(2) and m.group(2) not in _DURATION_UNITS):
        raise ValueError("expected a duration such as '10 s', '500 ms' or '1 min'")
    return int(float(m.group(1)) * _DURATION_UNITS[m.group(2) or "ms"])


def parse_buffer_timeout_ms(value: Any) -> int:
    """``execution.buffer-timeout``: a duration, or -1 for Flink's "flush only when full"."""
    if str(value).strip() in ("-1", "-1 ms", "-1ms"):
        return -1
    return parse_duration_ms(value)


def parse_size_bytes(value: Any) -> int:
    """``"1 gb"`` -> 1073741824; a bare number is bytes."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as '512 mb'")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return int(value)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", str(value).lower())
    if not m or (m.group(2) and m.group(2) not in _SIZE_UNITS):
        raise ValueError("expected a size such as '512 mb' or '1 gb'")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2) or "b"])


def _parse_optional_duration_ms(value: Any) -> int:
    """Like ``parse_duration_ms``; empty (unset) is 0, meaning off."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return 0
    return parse_duration_ms(value)


def _parse_optional_size(value: Any) -> int:
    """Like ``parse_size_bytes``; empty (unset) is 0."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return 0
    return parse_size_bytes(value)


def _parse_optional_float(value: Any) -> float:
    """Like ``_parse_float``; empty (unset) is 0."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return 0.0
    return _parse_float(value)


def _parse_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer")
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError("expected an integer") from None


def _parse_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError("expected a number") from None


def parse_port_range(value: Any) -> tuple[int, int]:
    """``"9250-9260"`` -> (9250, 9260); ``"8081"`` -> (8081, 8081); ``0`` -> (0, 0), any free port."""
    if isinstance(value, bool):
        raise ValueError("expected a port or a range such as 9250-9260")
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", str(value))
    if not m:
        raise ValueError("expected a port or a range such as 9250-9260")
    low = int(m.group(1))
    high = int(m.group(2)) if m.group(2) else low
    if high > 65535 or low > high or (low == 0 and high != 0):
        raise ValueError("expected ports from 1 to 65535, the lower first (or 0: any free port)")
    return low, high


def _parse_str(value: Any) -> str:
    return "" if value is None else str(value)


def _parse_bool_or_auto(value: Any) -> str:
    """"auto", "true" or "false" (any spelling ``_parse_bool`` takes for the latter two)."""
    if str(value).strip().lower() == "auto":
        return "auto"
    return "true" if _parse_bool(value) else "false"


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise ValueError("expected true or false")


@dataclass(frozen=True)
class ConfigOption(Generic[T]):
    key: str
    parse: Callable[[Any], T]
    description: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None

    def convert(self, raw: Any) -> T:
        value = self.parse(raw)
        if self.choices:
            upper = {c.upper(): c for c in self.choices}
            canon = upper.get(str(value).upper())
            if canon is None:
                raise ValueError(f"expected one of {', '.join(self.choices)}")
            value = canon  # type: ignore[assignment]
        if self.minimum is not None and value < self.minimum:  # type: ignore[operator]
            raise ValueError(f"must be at least {self.minimum:g}")
        if self.maximum is not None and value > self.maximum:  # type: ignore[operator]
            raise ValueError(f"must be at most {self.maximum:g}")
        return value


def _opt(key: str, parse: Callable[[Any], Any], description: str, **kw: Any) -> ConfigOption[Any]:
    return ConfigOption(key, parse, description, **kw)
