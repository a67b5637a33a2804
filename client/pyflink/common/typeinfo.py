"""PyFlink's ``Types``: what a stream's elements are, so yarnflow stores them as Arrow columns
(``records.py``) instead of pickled objects: a basic type in one column, a TUPLE's fields in
columns f0, f1, ..., a ROW's in columns of their names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Types", "TypeInformation", "BasicTypeInfo", "RowTypeInfo", "TupleTypeInfo"]


@dataclass(frozen=True)
class TypeInformation:
    kind: str  # STRING, INT, ..., TUPLE, ROW, LIST, MAP, PICKLED
    fields: tuple[TypeInformation, ...] = ()
    names: tuple[str, ...] = ()

    @property
    def scalar(self) -> bool:
        """Stored in one Arrow column as it is (a basic type, or a list of basic types)."""
        return self.kind in BASIC or (self.kind == "LIST" and all(f.scalar for f in self.fields))

    def __repr__(self) -> str:
        return f"Types.{self.kind}" + (f"({list(self.fields)})" if self.fields else "")


BASIC = {"STRING", "BYTE", "BOOLEAN", "SHORT", "INT", "LONG", "FLOAT", "DOUBLE", "CHAR", "BIG_INT", "BIG_DEC",
         "SQL_DATE", "SQL_TIME", "SQL_TIMESTAMP", "INSTANT", "LOCAL_DATE", "LOCAL_TIME", "LOCAL_DATE_TIME",
         "PRIMITIVE_ARRAY_BYTE"}


def _basic(kind: str) -> Any:
    return staticmethod(lambda: TypeInformation(kind))


@dataclass(frozen=True)
class RowTypeInfo(TypeInformation):
    pass


@dataclass(frozen=True)
class TupleTypeInfo(TypeInformation):
    pass


BasicTypeInfo = TypeInformation


class Types:
    STRING = _basic("STRING")
    BYTE = _basic("BYTE")
    BOOLEAN = _basic("BOOLEAN")
    SHORT = _basic("SHORT")
    INT = _basic("INT")
    LONG = _basic("LONG")
    FLOAT = _basic("FLOAT")
    DOUBLE = _basic("DOUBLE")
    CHAR = _basic("CHAR")
    BIG_INT = _basic("BIG_INT")
    BIG_DEC = _basic("BIG_DEC")
    SQL_DATE = _basic("SQL_DATE")
    SQL_TIME = _basic("SQL_TIME")
    SQL_TIMESTAMP = _basic("SQL_TIMESTAMP")
    INSTANT = _basic("INSTANT")
    LOCAL_DATE = _basic("LOCAL_DATE")
    LOCAL_TIME = _basic("LOCAL_TIME")
    LOCAL_DATE_TIME = _basic("LOCAL_DATE_TIME")
    PICKLED_BYTE_ARRAY = _basic("PICKLED")

    @staticmethod
    def PRIMITIVE_ARRAY(element: TypeInformation) -> TypeInformation:
        return TypeInformation("PRIMITIVE_ARRAY_BYTE") if element.kind == "BYTE" else Types.LIST(element)

    @staticmethod
    def BASIC_ARRAY(element: TypeInformation) -> TypeInformation:
        return Types.LIST(element)

    @staticmethod
    def OBJECT_ARRAY(element: TypeInformation) -> TypeInformation:
        return Types.LIST(element)

    @staticmethod
    def LIST(element: TypeInformation) -> TypeInformation:
        return TypeInformation("LIST", (element,))

    @staticmethod
    def MAP(key: TypeInformation, value: TypeInformation) -> TypeInformation:
        return TypeInformation("MAP", (key, value))

    @staticmethod
    def TUPLE(types: list[TypeInformation]) -> TypeInformation:
        return TupleTypeInfo("TUPLE", tuple(_check(types)))

    @staticmethod
    def ROW(types: list[TypeInformation]) -> TypeInformation:
        types = _check(types)
        return RowTypeInfo("ROW", tuple(types), tuple(f"f{i}" for i in range(len(types))))

    @staticmethod
    def ROW_NAMED(names: list[str], types: list[TypeInformation]) -> TypeInformation:
        types = _check(types)
        if len(names) != len(types) or len(set(names)) != len(names):
            raise ValueError(f"ROW_NAMED needs as many distinct names as types: {names} for {len(types)} types")
        return RowTypeInfo("ROW_NAMED", tuple(types), tuple(names))


def _check(types: Any) -> list[TypeInformation]:
    types = list(types)
    bad = [t for t in types if not isinstance(t, TypeInformation)]
    if bad:
        raise TypeError(f"expected Types.*() (call them: Types.STRING()), got {bad!r}")
    return types


