r"""The word-splitting ``flat_map`` run as Arrow compute on whole batches.

The flat_map every word count writes, ``({"word": w, "count": 1} for w in WORD.findall(
row["line"].lower()))`` with ``WORD = re.compile(r"\w+")``, costs a dict per input row, a call,
a regex search and a dict per output row. ``lift_flat_map(fn)`` reads the function's bytecode
(with ``lifting.py``'s reader) when it returns one of

- ``<parts>`` itself (each part becomes a row ``{"value": part}``),
- a generator expression or list comprehension over ``<parts>`` with no ``if``, making for each
  part one value or a dict with string-constant keys, of expressions ``lifting.py`` reads over
  the part and the row,

where ``<parts>`` is ``<pattern>.findall(<text>)`` for a compiled pattern (a module global or
closure variable) of ``\w+``, ``<text>.split()`` or ``<text>.split(<separator>)``, and ``<text>``
an expression of the row that ``lifting.py`` reads (``row["line"].lower()``). It then splits the
text column with Arrow (``findall``: every non-word byte made a space, then
``ascii_split_whitespace``; ``split()``: ``ascii_split_whitespace``; ``split(sep)``: ``split_pattern``), drops the empty parts where Python's functions drop them, repeats each
row's other columns for its parts (``list_parent_indices``) and evaluates the output values on
that exploded batch. The result is the function's, in the same order, on batches where Python
and Arrow agree: ASCII-only text (``\w`` and whitespace are Unicode classes in Python, ASCII in
RE2), for ``split()`` without ``\x1c``-``\x1f`` (whitespace to Python only), no nulls; any other
batch goes per row, where the function gives its own result or error.
"""

from __future__ import annotations

import dataclasses
import dis
import re
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from yarnflow.worker.operators.lifting import LiftedFunction, NotLiftable, _Column, _Free, _read
from yarnflow.worker.operators.lifting_calls import Call, describe_path

__all__ = ["LiftedFlatMap", "lift_flat_map"]

#: the exploded batch's column holding the parts (the comprehension's variable)
PART = "\x00part"
#: byte -> itself for ASCII word characters (``[0-9A-Za-z_]``), else a space
_WORD_OR_SPACE = np.full(256, ord(" "), dtype=np.uint8)
_WORD_OR_SPACE[np.frombuffer(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_", dtype=np.uint8)] = (
    np.frombuffer(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_", dtype=np.uint8))
_LOOP_END = {"YIELD_VALUE", "LIST_APPEND"}
#: stops of the reader that also let it read ``findall`` (a flat_map's parts only)
_FLAT = frozenset({"RETURN_VALUE", "<flat>"})


class LiftedFlatMap:
    """A flat_map function read as a split of a text column and expressions per part;
    ``map_batch`` returns None for a batch that must go per row."""

    def __init__(self, fn: types.FunctionType, parts: Call, template: Any) -> None:
        self.fn = fn
        self.parts = parts
        self._text = LiftedFunction(fn, "map", {"text": parts.receiver if parts.name == "split" else parts.args[0]})
        self._sep = LiftedFunction(fn, "map", {"sep": parts.args[0]}) if parts.name == "split" and parts.args else None
        self._rows = LiftedFunction(fn, "map", template if isinstance(template, dict) else {"value": template})
        self.lifted_batches = self.row_batches = 0
        self.last_refusal = ""
        #: the row's columns the values per part read (only these are repeated per part)
        self._columns = sorted(_columns(template) - {PART})

    def describe(self) -> str:
        return describe_path(self.lifted_batches, self.row_batches, self.last_refusal)

    def map_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        out, why = self._evaluate(batch)
        if out is None:
            self.row_batches += 1
            self.last_refusal = why or self._rows.last_refusal or self._text.last_refusal or self.last_refusal
        else:
            self.lifted_batches += 1
        return out

    def _evaluate(self, batch: pa.RecordBatch) -> tuple[pa.RecordBatch | None, str]:
        if PART in batch.schema.names:
            return None, "a column named like its parts"
        texts = self._text._evaluate(batch)
        if texts is None:
            return None, ""
        text = texts[0]
        if not isinstance(text, pa.StringArray) or text.null_count:
            return None, "nulls or values that are not text where it splits"
        ascii_only = pc.all(pc.string_is_ascii(text)).as_py() is not False
        if self.parts.name == "findall":
            pattern = _regex_of(self.fn, self.parts.receiver)  # (the global may have been set to another)
            if pattern is None or pattern.pattern != r"\w+" or pattern.flags & ~re.UNICODE:
                return None, "findall() of a pattern other than \\w+"
            if not ascii_only:
                return None, "non-ASCII text (\\w is Unicode in Python, ASCII in Arrow)"
            lists = pc.ascii_split_whitespace(_words_and_spaces(text))
            keep_empty = False
        elif self._sep is None:  # split(): runs of Python's whitespace
            if not ascii_only or pc.any(pc.match_substring_regex(text, "[\x1c-\x1f]")).as_py():
                return None, "non-ASCII text or characters \\x1c-\\x1f (whitespace to Python only)"
            lists, keep_empty = pc.ascii_split_whitespace(text), False
        else:
            seps = self._sep._evaluate(batch)
            if seps is None or not isinstance(seps[0], pa.Array) or seps[0].type != pa.string():
                return None, "a separator that is not a string"
            sep = seps[0][0].as_py() if len(seps[0]) else None
            if not sep:
                return None, "an empty separator (ValueError per row)"
            lists, keep_empty = pc.split_pattern(text, pattern=sep), True
        parts = pc.list_flatten(lists)
        parents = pc.list_parent_indices(lists)
        if not keep_empty:
            nonempty = pc.not_equal(pc.binary_length(parts), 0)  # (bytes: 5x faster than characters)
            parts, parents = parts.filter(nonempty), parents.filter(nonempty)
        read = [n for n in self._columns if n in batch.schema.names]  # (a missing one: refused below)
        exploded = pa.RecordBatch.from_arrays([*batch.select(read).take(parents).columns, parts], names=[*read, PART])
        out = self._rows.map_batch(exploded)
        return out, ""


def _words_and_spaces(text: pa.StringArray) -> pa.StringArray:
    """ASCII ``text`` with every character that is not a word character (``\\w``) made a space,
    through a byte table over its data buffer (~1.5 ns a byte): a whitespace split of it gives
    ``findall(r"\\w+")``'s words, 3x faster than Arrow's regex split, which runs RE2 per row."""
    _, offsets, data = text.buffers()
    if data is None:  # (no characters at all)
        return text
    table = pa.py_buffer(_WORD_OR_SPACE[np.frombuffer(data, dtype=np.uint8)])
    return pa.StringArray.from_buffers(len(text), offsets, table, None, 0, text.offset)  # type: ignore[return-value]


def _columns(expr: Any) -> set[str]:
    """The names of the columns an expression tree (or dict of them) reads."""
    if isinstance(expr, _Column):
        return {expr.name}
    if isinstance(expr, dict):
        return set().union(*map(_columns, expr.values()))
    if isinstance(expr, tuple):
        return set().union(*map(_columns, expr))
    if dataclasses.is_dataclass(expr):
        return set().union(*(_columns(getattr(expr, f.name)) for f in dataclasses.fields(expr)))
    return set()


def _regex_of(fn: types.FunctionType, receiver: Any) -> re.Pattern[str] | None:
    """The compiled pattern a ``findall`` is called on (a global or closure variable), or None."""
    if not isinstance(receiver, _Free):
        return None
    try:
        value = (fn.__closure__[receiver.cell].cell_contents if receiver.cell >= 0  # type: ignore[index]
                 else fn.__globals__.get(receiver.name))
    except (TypeError, IndexError, ValueError):
        return None
    return value if isinstance(value, re.Pattern) else None


def _parts_of(fn: types.FunctionType, value: Any) -> Call:
    if isinstance(value, Call) and value.receiver is not None:
        if value.name == "split" and len(value.args) <= 1:
            return value
        if value.name == "findall" and len(value.args) == 1:
            pattern = _regex_of(fn, value.receiver)
            if pattern is not None and pattern.pattern == r"\w+" and pattern.flags & ~re.UNICODE == 0:
                return value
            raise NotLiftable("it calls findall() of a pattern other than \\w+ (or a changing one)")
    raise NotLiftable("it does not return the parts of a findall() or split(), or a comprehension over them")


def _loop(fn: types.FunctionType, code: types.CodeType, instructions: list[Any], at: int) -> Any:
    """The value made per part by the loop starting at ``instructions[at]`` (its FOR_ITER)."""
    if instructions[at].opname != "FOR_ITER" or at + 1 >= len(instructions):
        raise NotLiftable("its comprehension has a shape the vectoriser does not know")
    store = instructions[at + 1]
    part = _Column(PART)
    if store.opname == "STORE_FAST":
        return _read(fn, code, at + 2, {store.argval: part}, (), frozenset(_LOOP_END))
    if store.opname == "STORE_FAST_LOAD_FAST" and store.argval[0] == store.argval[1]:  # 3.13
        return _read(fn, code, at + 2, {store.argval[0]: part}, (part,), frozenset(_LOOP_END))
    raise NotLiftable("its comprehension unpacks its items or has a shape the vectoriser does not know")


def _read_flat(fn: types.FunctionType) -> tuple[Call, Any]:
    code = fn.__code__
    instructions = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
    ops = [i.opname for i in instructions]
    if "GET_ITER" not in ops:  # the parts themselves
        return _parts_of(fn, _read(fn, None, 0, None, (), _FLAT)), _Column(PART)
    get_iter = ops.index("GET_ITER")
    if ops[:3] == ["RESUME", "LOAD_CONST", "MAKE_FUNCTION"] and isinstance(instructions[1].argval, types.CodeType):
        inner = instructions[1].argval  # a generator expression, or a 3.11 list comprehension
        if instructions[2].arg or [o for o in ops[get_iter + 1:] if o != "PRECALL"] != ["CALL", "RETURN_VALUE"]:
            raise NotLiftable("it does more than return a comprehension")
        parts = _read(fn, code, 3, None, (), _FLAT | {"GET_ITER"})
        inner_instructions = [i for i in dis.get_instructions(inner) if i.opname != "CACHE"]
        inner_ops = [i.opname for i in inner_instructions]
        if inner_ops.count("FOR_ITER") != 1:
            raise NotLiftable("its comprehension has more than one loop")
        return _parts_of(fn, parts), _loop(fn, inner, inner_instructions, inner_ops.index("FOR_ITER"))
    # 3.12+: the list comprehension inlined in the function
    if ops[get_iter + 1:get_iter + 6] != ["LOAD_FAST_AND_CLEAR", "SWAP", "BUILD_LIST", "SWAP", "FOR_ITER"] \
            or ops.count("FOR_ITER") != 1:
        raise NotLiftable("it does more than return a comprehension")
    parts = _read(fn, code, 0, None, (), _FLAT | {"GET_ITER"})
    return _parts_of(fn, parts), _loop(fn, code, instructions, get_iter + 5)


def lift_flat_map(fn: Callable[..., Any]) -> tuple[LiftedFlatMap | None, str]:
    """``fn`` (a flat_map's function) as a split and expressions per part, or None and why not."""
    if type(fn) is not types.FunctionType:
        return None, "it is not a plain function (a method, a partial, a callable object or a builtin)"
    code = fn.__code__
    if code.co_argcount != 1 or code.co_kwonlyargcount or code.co_flags & (0x04 | 0x08 | 0x20) or code.co_cellvars:
        return None, "it takes other arguments than one row, is a generator, or has inner functions"
    try:
        parts, template = _read_flat(fn)
    except NotLiftable as exc:
        return None, str(exc)
    except (IndexError, ValueError, TypeError):
        return None, "its bytecode has a shape the vectoriser does not know"
    return LiftedFlatMap(fn, parts, template), ""

