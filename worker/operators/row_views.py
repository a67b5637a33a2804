"""Per-row functions that only read fields get the fields, not a dict per row.

Most per-row functions use their row one way: ``r["word"]``, ``r["n"]``. For such a function a
dict per row is pure cost (building it is a third of a simple map's time). ``row_view(fn)`` reads
the function's bytecode once; when every use of its argument is a subscript by a string constant
(``LOAD_FAST r; LOAD_CONST "key"; BINARY_SUBSCR``, on Python 3.11 to 3.13) and nothing else
can see the argument (it is not stored, deleted, captured by an inner function, returned or
passed on, and the function does not call ``locals`` / ``vars`` / ``eval`` / ``exec``), it
makes a copy of the function whose argument is

- the value itself when the function reads one field: ``r["word"]`` becomes ``r`` (the constant
  and the subscript turn into NOPs, so no offset, jump or line number moves); the operator then
  maps the copy over the column's Python list, in C;
- a tuple of the values when it reads several: ``r["n"]`` becomes ``r[1]`` (an int constant
  added to the copy's constants); the operator maps it over ``zip`` of the columns.

The copy runs the same bytecode on the same values, so it returns and raises what the function
does, with the same name, file and line numbers in a traceback. A batch without one of the
fields as a single column (the function would raise ``KeyError``), or of a schema the operator
has not seen, takes the dict path as before. Anything the reader does not recognise leaves the
function on the dict path.
"""

from __future__ import annotations

import dis
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = ["RowView", "row_view"]

_SUPPORTED_PYTHON = ((3, 11), (3, 12), (3, 13))
_LOADS = ("LOAD_FAST", "LOAD_FAST_CHECK")
#: names whose call could show the argument itself
_INTROSPECTION = {"locals", "vars", "eval", "exec", "globals"}
_NOP = dis.opmap["NOP"]


@dataclass(frozen=True)
class RowView:
    """``fn`` made to take ``keys``' values (one value, or a tuple of them) instead of a row."""

    fn: Callable[[Any], Any]
    keys: tuple[str, ...]

    def inputs(self, batch: pa.RecordBatch) -> list[Any] | None:
        """What to map ``fn`` over, one item per row of ``batch``; None when a key is not one
        column of the batch (the dict path then gives the function's own KeyError)."""
        indices = [batch.schema.get_field_index(k) for k in self.keys]
        if any(i < 0 for i in indices):
            return None
        columns = [batch.column(i).to_pylist() for i in indices]
        if not columns:
            return [None] * batch.num_rows
        if len(columns) == 1:
            return columns[0]
        return list(zip(*columns))


def row_view(fn: Callable[..., Any]) -> RowView | None:
    """``fn`` as a function of the fields it reads, or None when it may use its row otherwise."""
    if sys.version_info[:2] not in _SUPPORTED_PYTHON or type(fn) is not types.FunctionType:
        return None
    code = fn.__code__
    if (code.co_argcount != 1 or code.co_kwonlyargcount or code.co_flags & (0x04 | 0x08)
            or code.co_varnames[0] in code.co_cellvars):
        return None
    instructions = list(dis.get_instructions(code))
    arg = code.co_varnames[0]
    sites: list[int] = []
    for n, ins in enumerate(instructions):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval in _INTROSPECTION:
            return None
        mentions = ins.argval == arg or (isinstance(ins.argval, tuple) and arg in ins.argval)
        if not mentions or ins.opname.startswith(("LOAD_CONST", "LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL")):
            continue  # (a constant or a name that happens to equal the argument's)
        if not (ins.opname in _LOADS and ins.arg == 0 and n + 2 < len(instructions)):
            return None
        const, subscript = instructions[n + 1], instructions[n + 2]
        if (const.opname != "LOAD_CONST" or type(const.argval) is not str or subscript.opname != "BINARY_SUBSCR"
                or const.is_jump_target or subscript.is_jump_target):
            return None
        sites.append(n)
    keys = tuple(dict.fromkeys(instructions[n + 1].argval for n in sites))
    raw = bytearray(code.co_code)
    consts = code.co_consts
    if len(keys) > 1:
        if len(consts) + len(keys) > 256:
            return None  # an index past 255 would need an EXTENDED_ARG: no room in place
        index = {k: len(consts) + i for i, k in enumerate(keys)}
        consts = consts + tuple(range(len(keys)))
    for n in sites:
        const = instructions[n + 1]
        if len(keys) > 1:  # r["key"] -> r[i]
            raw[const.offset + 1] = index[const.argval]
        else:  # r["key"] -> r: the constant and the subscript (with its inline caches) do nothing
            end = instructions[n + 3].offset if n + 3 < len(instructions) else len(raw)
            raw[const.offset:end] = bytes([_NOP, 0]) * ((end - const.offset) // 2)
    copy = types.FunctionType(code.replace(co_code=bytes(raw), co_consts=consts), fn.__globals__, fn.__name__,
                              fn.__defaults__, fn.__closure__)
    copy.__qualname__ = fn.__qualname__
    return RowView(copy, keys)
