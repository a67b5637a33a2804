"""``pyflink.common.Configuration``: string settings (Flink's keys), handed to the job."""

from __future__ import annotations

from typing import Any

__all__ = ["Configuration"]


class Configuration:
    def __init__(self, other: Configuration | None = None) -> None:
        self._values: dict[str, str] = dict(other._values) if other is not None else {}

    def set_string(self, key: str, value: str) -> Configuration:
        self._values[key] = str(value)
        return self

    def get_string(self, key: str, default_value: str) -> str:
        return self._values.get(key, default_value)

    def set_integer(self, key: str, value: int) -> Configuration:
        return self.set_string(key, str(int(value)))

    def get_integer(self, key: str, default_value: int) -> int:
        return int(self._values.get(key, default_value))

    def set_boolean(self, key: str, value: bool) -> Configuration:
        return self.set_string(key, "true" if value else "false")

    def get_boolean(self, key: str, default_value: bool) -> bool:
        return str(self._values.get(key, default_value)).lower() == "true"

    def contains_key(self, key: str) -> bool:
        return key in self._values

    def to_dict(self) -> dict[str, str]:
        return dict(self._values)

    def add_all(self, other: Any) -> Configuration:
        self._values.update(other.to_dict())
        return self
