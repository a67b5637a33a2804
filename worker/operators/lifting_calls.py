"""The calls and branches a lifted per-row function may have (see ``lifting.py``), and the
values and operators both modules evaluate. Calls: the string methods and
builtins per-row code commonly uses, each evaluated on whole columns with Python's exact result,
or refused for the batch (which then goes per row and gets the function's own result or error).

Methods of a string value (the receiver must have no nulls: ``None.strip()`` raises per row):

- ``strip()`` / ``lstrip()`` / ``rstrip()``: Python's whitespace; on ASCII-only batches (Unicode
  whitespace differs between Python and Arrow), with ``\\x1c``-``\\x1f`` trimmed as Python does;
  with a string argument (the characters to strip) on any batch;
- ``lower()`` / ``upper()``: ASCII-only batches (``"ß".upper()`` is ``"SS"`` in Python);
- ``startswith(s)`` / ``endswith(s)``, ``replace(old, new)`` (``old`` not empty), ``s in x``
  and ``s not in x``, with ``s``, ``old``, ``new`` string constants or variables;
- slicing ``s[a:b]`` (``a`` / ``b`` int constants or variables, or left out; no step), by code
  point with Python's negative and out-of-range bounds;
- ``split()[i]`` / ``split(sep)[i]`` (``i`` a constant >= 0): refused when a row has fewer
  parts (``IndexError`` per row); ``split()`` on ASCII-only batches without ``\\x1c``-``\\x1f``.

Builtins (when the function's module does not define a name of its own):

- ``len(x)`` of a string (code points, as Python counts);
- ``int(x)`` of a string (Arrow's parser is stricter than Python's: what it refuses, such as
  ``" 12"``, ``"+12"`` or ``"1_000"``, goes per row), of a float (truncated), of an int;
- ``float(x)`` of an int (exact up to 2**53; beyond, per row) or of a string (as for int);
- ``str(x)`` of an int or a string (``str`` of a float or a bool is refused: Arrow writes
  ``1`` and ``true`` where Python writes ``1.0`` and ``True``);
- ``abs(x)`` of a number;
- ``min(a, b)`` / ``max(a, b)`` of two ints, two floats or two strings, as Python decides
  (``b if b < a else a``: the first of equals, NaN and -0.0 as Python leaves them);
- ``round(x)`` of a float (half to even, an int) or of an int;
- ``not x`` of a bool (``not`` of anything else is its truthiness: per row).

Conditional expressions (``a if cond else b``, and ``if`` statements whose branches each
return): ``cond`` must be a bool without nulls, both branches of the same type; both are
evaluated for every row, so a branch that would fail where it is not taken (``10 / n if n != 0
else 0.0``) sends the batch per row, where each row evaluates its own branch only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["ARITH", "BUILTINS", "Bounds", "COMPARE", "METHODS", "WHAT", "Call", "Contains", "IfElse", "Part", "Refused", "TypeRefused", "evaluate_call",
           "describe_path", "evaluate_contains", "evaluate_if_else", "evaluate_part", "binary", "no_nulls", "scalar"]

#: Python's whitespace among ASCII characters (``str.isspace``)
PY_ASCII_WHITESPACE = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"
#: methods of str that lift, with the number of (string) arguments they may take
METHODS = {"strip": (0, 1), "lstrip": (0, 1), "rstrip": (0, 1), "lower": (0,), "upper": (0,),
           "startswith": (1,), "endswith": (1,), "replace": (2,), "split": (0, 1)}
ARITH = {"+": "add_checked", "-": "subtract_checked", "*": "multiply_checked", "/": "divide"}
COMPARE = {"<": "less", "<=": "less_equal", "==": "equal", "!=": "not_equal", ">": "greater",
            ">=": "greater_equal"}
_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1
BUILTINS = {"len", "int", "float", "str", "abs", "min", "max", "round"}


#: what the first part of an opcode's name means to a user
WHAT = {"POP": "a branch (if, and, or, a conditional expression)", "JUMP": "a branch or a loop",
         "FOR": "a loop", "GET": "a loop or an iterator", "LOAD": "an attribute or a name it cannot read",
         "STORE": "an assignment to something other than a local variable",
         "BUILD": "a list, tuple, set or f-string", "FORMAT": "an f-string", "CALL": "a call",
         "DELETE": "del", "RAISE": "raise", "IMPORT": "an import", "YIELD": "yield", "MAKE": "an inner function",
         "UNARY": "a unary operator other than - and not", "LIST": "a list", "DICT": "a dict it changes",
         "SET": "a set", "BINARY": "a subscript it cannot read", "RETURN": "a return of something else", "KW": "keyword arguments",
         "PUSH": "a call of something it did not name directly"}


class Refused(Exception):
    """This batch goes per row."""


class TypeRefused(Refused):
    """Refused because of the batch's schema: every later batch of that schema is refused too."""


@dataclass(frozen=True)
class Call:
    """``receiver.name(*args)`` for a method (``receiver`` set), ``name(*args)`` for a builtin."""

    name: str
    receiver: Any  # an expression, or None for a builtin
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Bounds:
    """The ``a:b`` (or ``a:b:c``) of a subscript, on the stack until the subscript reads it."""

    parts: tuple[Any, ...]


@dataclass(frozen=True)
class Contains:
    """``needle in haystack`` (``not in`` when ``negated``)."""

    needle: Any
    haystack: Any
    negated: bool


@dataclass(frozen=True)
class IfElse:
    """``then if cond else otherwise`` (a conditional expression, or an ``if`` whose branches
    both return)."""

    cond: Any
    then: Any
    otherwise: Any


@dataclass(frozen=True)
class Part:
    """``<split call>[index]``."""

    split: Call
    index: int


def describe_path(lifted: int, per_row: int, refusal: str) -> str:
    """How a lifted operator ran (its batches vectorised and per row), for ``yarnflow info``."""
    if not per_row:
        return "vectorised (Arrow compute)"
    return f"vectorised, {per_row} of {lifted + per_row} batches per row (the last because of {refusal})"


def _strings(value: Any) -> pa.Array | pa.Scalar:
    if value.type != pa.string():
        raise TypeRefused  # a method of str called on a number, a bool...: per row decides
    if isinstance(value, pa.Scalar):
        if not value.is_valid:
            raise TypeRefused
    elif value.null_count:
        raise Refused("nulls where a string method is called")  # None.strip(): AttributeError per row
    return value


def _ascii(value: pa.Array | pa.Scalar, no_separators: bool = False) -> None:
    """Refuse a batch with non-ASCII strings (or, with ``no_separators``, with ``\\x1c``-``\\x1f``)."""
    array = value if isinstance(value, pa.Array) else pa.array([value.as_py()], pa.string())
    if not pc.all(pc.string_is_ascii(array)).as_py():
        raise Refused("non-ASCII text (Python's and Arrow's Unicode rules differ)")
    if no_separators and pc.any(pc.match_substring_regex(array, "[\x1c-\x1f]")).as_py():
        raise Refused("characters \\x1c-\\x1f, whitespace to Python only")


def _text(arg: Any) -> str:
    """A method's argument: a Python str (a constant or a variable read for this batch)."""
    if not isinstance(arg, pa.Scalar) or arg.type != pa.string() or not arg.is_valid:
        raise TypeRefused
    return str(arg.as_py())


def evaluate_call(call: Call, receiver: Any, args: list[Any]) -> pa.Array | pa.Scalar:
    """``call`` with its receiver and arguments evaluated (Arrow arrays or scalars)."""
    name = call.name
    if call.receiver is None:
        return _builtin(name, args)
    s = _strings(receiver)
    if name in ("strip", "lstrip", "rstrip"):
        if args:
            chars = _text(args[0])
        else:
            _ascii(s)
            chars = PY_ASCII_WHITESPACE
        fn = {"strip": pc.utf8_trim, "lstrip": pc.utf8_ltrim, "rstrip": pc.utf8_rtrim}[name]
        return fn(s, characters=chars) if chars else s
    if name in ("lower", "upper"):
        _ascii(s)
        return pc.ascii_lower(s) if name == "lower" else pc.ascii_upper(s)
    if name in ("startswith", "endswith"):
        pattern = _text(args[0])
        return pc.starts_with(s, pattern=pattern) if name == "startswith" else pc.ends_with(s, pattern=pattern)
    if name == "replace":
        old, new = _text(args[0]), _text(args[1])
        if not old:
            raise TypeRefused  # "ab".replace("", "-") inserts everywhere: per row
        return pc.replace_substring(s, pattern=old, replacement=new)
    if name == "slice":
        start, stop, *step = (_bound(a) for a in args)
        if step not in ([], [None], [1]):
            raise TypeRefused  # a step: per row
        # by code point, negative and out-of-range bounds as Python takes them
        return pc.utf8_slice_codeunits(s, start=0 if start is None else start,
                                       stop=_INT64_MAX if stop is None else stop)
    raise TypeRefused  # split() alone makes a list: only split()[i] lifts


def _bound(arg: Any) -> int | None:
    """A slice's bound: None or a Python int (a constant or a variable read for this batch)."""
    if not isinstance(arg, pa.Scalar) or not (arg.type == pa.int64() or not arg.is_valid):
        raise TypeRefused  # a column as a bound, a float...: per row
    return arg.as_py()  # type: ignore[no-any-return]


def evaluate_part(part: Part, receiver: Any, args: list[Any]) -> pa.Array | pa.Scalar:
    """``receiver.split(*args)[part.index]``."""
    s = _strings(receiver)
    array = s if isinstance(s, pa.Array) else pa.array([s.as_py()], pa.string())
    if args:
        sep = _text(args[0])
        if not sep:
            raise TypeRefused  # ValueError: empty separator, per row
        parts = pc.split_pattern(array, pattern=sep)
        counts = pc.list_value_length(parts)
    else:
        _ascii(array, no_separators=True)
        trimmed = pc.utf8_trim(array, characters=PY_ASCII_WHITESPACE)
        parts = pc.ascii_split_whitespace(trimmed)
        # Python splits "" (or all whitespace) into no parts; Arrow into one empty one
        counts = pc.if_else(pc.equal(trimmed, ""), 0, pc.list_value_length(parts))
    if len(array) and pc.min(counts).as_py() <= part.index:
        raise Refused(f"a row with fewer parts than split()[{part.index}] takes")  # IndexError per row
    out = pc.list_element(parts, part.index)
    return out if isinstance(s, pa.Array) else out[0]


def evaluate_contains(node: Contains, needle: Any, haystack: Any) -> pa.Array | pa.Scalar:
    pattern = _text(needle)
    if not isinstance(haystack, pa.Array):
        raise TypeRefused  # two constants: not worth it
    found = pc.match_substring(_strings(haystack), pattern=pattern)
    return pc.invert(found) if node.negated else found


def _builtin(name: str, args: list[Any]) -> pa.Array | pa.Scalar:
    if name in ("min", "max") and len(args) == 2:
        return _min_max(name, args[0], args[1])
    if len(args) != 1:
        raise TypeRefused  # int(s, base), round(x, n)...: per row
    [x] = args
    if isinstance(x, pa.Scalar) and not x.is_valid or isinstance(x, pa.Array) and x.null_count:
        raise Refused(f"nulls passed to {name}()")  # len(None), int(None): TypeError per row
    t = x.type
    if name == "not":
        if t != pa.bool_():
            raise TypeRefused  # the truthiness of numbers and strings stays per row
        return pa.scalar(not x.as_py()) if isinstance(x, pa.Scalar) else pc.invert(x)
    if name == "len":
        if t != pa.string():
            raise TypeRefused
        return pc.cast(pc.utf8_length(x), pa.int64())
    if name == "abs":
        if t == pa.int64():
            return pc.abs_checked(x)
        if t == pa.float64():
            return pc.abs(x)
        raise TypeRefused
    if name == "int":
        if t == pa.int64():
            return x
        if t == pa.float64():
            return pc.cast(pc.trunc(x), pa.int64())  # NaN, inf, out of range: ArrowInvalid, per row
        if t == pa.string():
            return pc.cast(x, pa.int64())
        raise TypeRefused
    if name == "float":
        if t == pa.float64():
            return x
        if t in (pa.int64(), pa.string()):
            return pc.cast(x, pa.float64())  # beyond 2**53, or not a number: ArrowInvalid, per row
        raise TypeRefused
    if name == "round":
        if t == pa.int64():
            return x
        if t == pa.float64():  # NaN, inf: ArrowInvalid, per row (ValueError, OverflowError)
            return pc.cast(pc.round(x, 0, round_mode="half_to_even"), pa.int64())
        raise TypeRefused
    if name == "str":
        if t == pa.string():
            return x
        if t == pa.int64():
            return pc.cast(x, pa.string())
        raise TypeRefused
    raise TypeRefused


def _min_max(name: str, a: Any, b: Any) -> pa.Array | pa.Scalar:
    """Python's ``min(a, b)`` / ``max(a, b)``: ``b`` when it is strictly less (greater), else ``a``."""
    for x in (a, b):
        if isinstance(x, pa.Scalar) and not x.is_valid or isinstance(x, pa.Array) and x.null_count:
            raise Refused(f"nulls passed to {name}()")  # TypeError per row
    if a.type != b.type or a.type not in (pa.int64(), pa.float64(), pa.string()):
        raise TypeRefused  # min(1, 0.5) is a float, min(1, 2.0) an int: per row decides
    if isinstance(a, pa.Scalar) and isinstance(b, pa.Scalar):
        raise TypeRefused  # two constants: not worth it
    takes_b = pc.less(b, a) if name == "min" else pc.greater(b, a)
    if isinstance(a, pa.Scalar):
        a = pa.repeat(a, len(b))
    if isinstance(b, pa.Scalar):
        b = pa.repeat(b, len(a))
    return pc.if_else(takes_b, b, a)


def evaluate_if_else(cond: Any, then: Callable[[], Any], otherwise: Callable[[], Any]) -> pa.Array | pa.Scalar:
    """Python's ``then() if cond else otherwise()`` on columns: ``cond`` must be bools without
    nulls (the truthiness of anything else stays per row). Both branches are evaluated for every
    row (unless ``cond`` is one value), so a branch that would fail on rows it does not take
    refuses the batch, which then goes per row and evaluates each row's branch only."""
    if cond.type != pa.bool_():
        raise TypeRefused("a condition that is not a bool")
    if isinstance(cond, pa.Scalar):
        if not cond.is_valid:
            raise TypeRefused("a condition that is None")
        return then() if cond.as_py() else otherwise()
    if cond.null_count:
        raise Refused("nulls in a condition")
    a, b = then(), otherwise()
    if a.type != b.type:
        raise TypeRefused("branches of different types")  # 1 if c else 2.5: an int or a float per row
    return pc.if_else(cond, a, b)


# -- values and operators shared with lifting.py

def scalar(value: Any) -> pa.Scalar:
    if value is None:
        return pa.scalar(None, pa.null())
    if type(value) is bool:
        return pa.scalar(value, pa.bool_())
    if type(value) is int:
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise Refused
        return pa.scalar(value, pa.int64())
    if type(value) is float:
        return pa.scalar(value, pa.float64())
    if type(value) is str:
        return pa.scalar(value, pa.string())
    raise TypeRefused  # bytes, tuples...


def no_nulls(value: pa.Array | pa.Scalar) -> pa.Array | pa.Scalar:
    if isinstance(value, pa.Scalar) and not value.is_valid:
        raise TypeRefused("None in arithmetic or a comparison")
    if isinstance(value, pa.Array) and value.null_count:
        raise Refused("nulls in a value used by arithmetic or a comparison")
    return value


def binary(op: str, left: pa.Array | pa.Scalar, right: pa.Array | pa.Scalar) -> pa.Array | pa.Scalar:
    lt, rt = left.type, right.type
    numeric = (pa.int64(), pa.float64())
    if op in COMPARE:
        if not (lt in numeric and rt in numeric) and not (lt == rt and lt in (pa.string(), pa.bool_())):
            raise TypeRefused  # 1 == "1" is False per row, an error in Arrow: per row decides
        return getattr(pc, COMPARE[op])(left, right)
    if op == "+" and lt == rt == pa.string():
        return pc.binary_join_element_wise(left, right, "")
    if lt not in numeric or rt not in numeric:
        raise TypeRefused  # bools count as ints in Python; strings only add to strings
    if op == "/":
        divisor = right
        if (divisor.as_py() == 0 if isinstance(divisor, pa.Scalar)
                else pc.any(pc.equal(divisor, 0)).as_py()):
            raise Refused("a zero divisor")  # ZeroDivisionError per row
        return pc.divide(pc.cast(left, pa.float64()), pc.cast(right, pa.float64()))
    return getattr(pc, ARITH[op])(left, right)
