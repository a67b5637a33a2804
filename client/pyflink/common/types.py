"""PyFlink's ``Row``: a tuple whose fields may have names (``Row(1, "a")``, ``Row(id=1,
name="a")``); fields by index, by name (``row.name``, ``row["name"]``), ``as_dict()``."""

from __future__ import annotations

from typing import Any

__all__ = ["Row", "RowKind"]


class RowKind:
    INSERT = 0
    UPDATE_BEFORE = 1
    UPDATE_AFTER = 2
    DELETE = 3


class Row(tuple):  # type: ignore[type-arg]
    _fields: tuple[str, ...] | None

    def __new__(cls, *values: Any, **named: Any) -> Row:
        if values and named:
            raise ValueError("Row takes its fields by position or by name, not both")
        row = super().__new__(cls, values if values else tuple(named.values()))
        row._fields = tuple(named) if named else None
        return row

    def __getnewargs_ex__(self) -> tuple[tuple[Any, ...], dict[str, Any]]:  # (pickling keeps the names)
        if self._fields:
            return (), dict(zip(self._fields, self))
        return tuple(self), {}

    def __getattr__(self, name: str) -> Any:
        fields = self.__dict__.get("_fields")
        if fields and name in fields:
            return tuple.__getitem__(self, fields.index(name))
        raise AttributeError(f"Row has no field {name!r}")

    def __getitem__(self, item: Any) -> Any:
        if isinstance(item, str):
            fields = self._fields or ()
            if item not in fields:
                raise KeyError(item)
            return tuple.__getitem__(self, fields.index(item))
        return tuple.__getitem__(self, item)

    def get_fields_by_names(self, names: list[str]) -> list[Any]:
        return [self[n] for n in names]

    def as_dict(self, recursive: bool = False) -> dict[str, Any]:
        if not self._fields:
            raise TypeError("as_dict needs a Row with field names")
        def conv(v: Any) -> Any:
            return v.as_dict(True) if recursive and isinstance(v, Row) and v._fields else v
        return {k: conv(v) for k, v in zip(self._fields, self)}

    def __repr__(self) -> str:
        if self._fields:
            return "Row(" + ", ".join(f"{k}={v!r}" for k, v in zip(self._fields, self)) + ")"
        return "Row(" + ", ".join(repr(v) for v in self) + ")"
