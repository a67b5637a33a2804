"""How PyFlink's elements (any Python value) travel as yarnflow rows (dicts, stored as Arrow
columns), and back:

- a value of a basic type (or a list of them) given as ``output_type``: column ``v``;
- a TUPLE: its fields in columns ``f0``, ``f1``, ...; a ROW / ROW_NAMED: in columns ``r:<name>``;
  a field that is not basic (a MAP, a nested TUPLE or ROW, PICKLED) is pickled, in a column
  whose name ends with ``~p``;
- anything else (no ``output_type``, as PyFlink pickles too): pickled, in column ``p``;
- a line of a text file (the FileSource's): column ``line``, a str.

A keyed stream adds the key in column ``__k`` (the key itself when a str, int, float or bool,
else pickled), and a stream with event time its records' timestamps in column ``__ts`` (ms),
which a PyFlink function never sees; other columns (a window's ``window_start`` and
``window_end``) are not part of the element either."""

from __future__ import annotations

import pickle
import re
from typing import Any, Callable

from yarnflow.pyflink.common.typeinfo import TypeInformation
from yarnflow.pyflink.common.types import Row

__all__ = ["encoder", "decode", "KEY", "TS", "encode_key"]

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
    if type_info is None or type_info.kind == "PICKLED":
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
        def plain(value: Any) -> dict[str, Any]:
            return dict(zip(names, value))
        return plain

    def mixed(value: Any) -> dict[str, Any]:
        return {n: c(v) for n, c, v in zip(names, convert, value)}
    return mixed


def decode(row: dict[str, Any]) -> Any:
    """The element a row holds (see the module docstring)."""
    if "p" in row:
        return _LOADS(row["p"])
    if "v" in row:
        return row["v"]
    if "line" in row:
        return row["line"]
    values = []
    names = []
    for name, value in row.items():
        if not (name.startswith("r:") or _FIELD.match(name)):
            continue  # (the key, the timestamp, a window's bounds)
        if name.endswith("~p"):
            name, value = name[:-2], _LOADS(value)
        names.append(name)
        values.append(value)
    if names and names[0].startswith("r:"):
        named = [n[2:] for n in names]
        if named == [f"f{i}" for i in range(len(named))]:
            return Row(*values)
        return Row(**dict(zip(named, values)))
    return tuple(values)


def encode_key(key: Any) -> Any:
    """A key as its column holds it: itself when a str, int, float or bool, else pickled."""
    if isinstance(key, (str, int, float, bool)):
        return key
    return _DUMPS(key, _PROTOCOL)
