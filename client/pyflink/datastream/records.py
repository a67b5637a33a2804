"""How PyFlink's elements (any Python value) travel as yarnflow rows (dicts, stored as Arrow
columns), and back:

- a value of a basic type (or a list of them) given as ``output_type``: column ``v``;
- a TUPLE: its fields in columns ``f0``, ``f1``, ...; a ROW / ROW_NAMED: in columns ``r:<name>``;
  a field that is not basic (a MAP, a nested TUPLE or ROW, PICKLED) is pickled, in a column
  whose name ends with ``~p``;
- anything else (no ``output_type``, as PyFlink pickles too): pickled, in column ``p`` (a str
  untyped is kept as it is, in column ``v`` beside a null ``p``);
- a line of a text file (the FileSource's): column ``line``, a str.

A keyed stream adds the key in column ``__k`` (the key itself when a str, int, float or bool,
else pickled), and a stream with event time its records' timestamps in column ``__ts`` (ms),
which a PyFlink function never sees; other columns (a window's ``window_start`` and
``window_end``) are not part of the element either."""

from __future__ import annotations

import operator
import pickle
import re
from typing import Any, Callable

from yarnflow.pyflink.common.typeinfo import TypeInformation
from yarnflow.pyflink.common.types import Row

__all__ = ["encoder", "decode", "reader", "KEY", "TS", "encode_key"]

KEY = "__k"
TS = "__ts"
_DUMPS = pickle.dumps
_LOADS = pickle.loads
_PROTOCOL = pickle.HIGHEST_PROTOCOL
_FIELD = re.compile(r"f\d+(~p)?$")


def _field(t: TypeInformation) -> Callable[[Any], Any]:
    if t.scalar:
        return lambda v: v
    return lambda v: _DUMPS(v, _PROTOCOL)


def encoder(type_info: TypeInformation | None) -> Callable[[Any], dict[str, Any]]:
    """The function making a row of an element of ``type_info``."""
    if type_info is None:  # (a str as it is: no pickling for the most common untyped element)
        return lambda value: {"v": value, "p": None} if type(value) is str else {"v": None, "p": _DUMPS(value, _PROTOCOL)}
    if type_info.kind == "PICKLED":
        return lambda value: {"p": _DUMPS(value, _PROTOCOL)}
    if type_info.scalar:
        return lambda value: {"v": value}
    if type_info.kind == "TUPLE":
        names = [f"f{i}" + ("" if t.scalar else "~p") for i, t in enumerate(type_info.fields)]
    elif type_info.kind in ("ROW", "ROW_NAMED"):
        names = [f"r:{n}" + ("" if t.scalar else "~p") for n, t in zip(type_info.names, type_info.fields)]
    else:  # MAP and the like: pickled
        return lambda value: {"p": _DUMPS(value, _PROTOCOL)}
    convert = [_field(t) for t in type_info.fields]
    if all(t.scalar for t in type_info.fields):
        # a dict display per element (made once: several times quicker than dict(zip(...)))
        source = "lambda value: {" + ", ".join(f"{n!r}: value[{i}]" for i, n in enumerate(names)) + "}"
        return eval(source)  # type: ignore[no-any-return]  # noqa: S307 - names are the layer's own

    def mixed(value: Any) -> dict[str, Any]:
        return {n: c(v) for n, c, v in zip(names, convert, value)}
    return mixed


def reader(row: dict[str, Any]) -> Callable[[dict[str, Any]], Any]:
    """The function making the element of rows laid out as ``row`` (an operator's input rows
    share a layout: a caller keeps it for the rows after)."""
    if "p" in row:
        return decode
    if "v" in row:
        return operator.itemgetter("v")
    if "line" in row:
        return operator.itemgetter("line")
    names = tuple(row)
    read = _READERS.get(names)
    if read is None:
        read = _READERS[names] = _reader(names)
    return read


def decode(row: dict[str, Any]) -> Any:
    """The element a row holds (see the module docstring)."""
    if "p" in row:
        pickled = row["p"]
        if pickled is not None or "v" not in row:
            return _LOADS(pickled)
        return row["v"]
    if "v" in row:
        return row["v"]
    if "line" in row:
        return row["line"]
    names = tuple(row)
    read = _READERS.get(names)
    if read is None:
        read = _READERS[names] = _reader(names)
    return read(row)


#: per row layout (its column names), the function making its element: rows of one operator
#: share a layout, so the names are looked at once, not per row
_READERS: dict[tuple[str, ...], Callable[[dict[str, Any]], Any]] = {}


def _reader(columns: tuple[str, ...]) -> Callable[[dict[str, Any]], Any]:
    fields = [c for c in columns if c.startswith("r:") or _FIELD.match(c)]  # (not the key, time, window)
    pickled = [c.endswith("~p") for c in fields]
    names = [c[:-2] if p else c for c, p in zip(fields, pickled)]

    def values(row: dict[str, Any]) -> list[Any]:
        return [_LOADS(row[c]) if p else row[c] for c, p in zip(fields, pickled)]

    if names and names[0].startswith("r:"):
        named = [n[2:] for n in names]
        if named == [f"f{i}" for i in range(len(named))]:
            return lambda row: Row(*values(row))
        return lambda row: Row(**dict(zip(named, values(row))))
    if not any(pickled):
        getter = operator.itemgetter(*fields) if fields else None
        if len(fields) == 1:
            return lambda row: (getter(row),)  # type: ignore[misc]
        return lambda row: getter(row) if getter is not None else ()
    return lambda row: tuple(values(row))


def encode_key(key: Any) -> Any:
    """A key as its column holds it: itself when a str, int, float or bool, else pickled."""
    if isinstance(key, (str, int, float, bool)):
        return key
    return _DUMPS(key, _PROTOCOL)
