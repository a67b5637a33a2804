"""Simple per-row functions run as Arrow compute on whole batches.

A per-row ``map`` or ``filter`` costs a Python dict per input row, a call per row and a value per
output cell; most of that is gone when the function is simple enough to be read as an expression
over columns. ``lift(fn, kind)`` reads the function's bytecode (straight-line code only) and
returns an expression tree when every instruction is one of:

- the row argument subscripted by a string constant (``r["word"]``), constants, module globals
  and closure variables holding ``int`` / ``float`` / ``str`` / ``bool`` (read again for every
  batch), local variables assigned from those;
- ``+ - * /`` and unary minus on numbers, ``+`` on strings, the comparisons ``< <= == != > >=``,
  ``is None`` / ``is not None``;
- the string methods and builtins of ``lifting_calls.py`` (``strip``, ``lower``, ``startswith``,
  ``replace``, ``split()[i]``, ``in``, slicing, ``not``, ``len``, ``int``, ``float``, ``str``,
  ``abs``, ``min``, ``max``, ``round``...), each
  with Python's exact result or refused for the batch;
- for ``map``: a dict with string-constant keys of such values, or one such value (the column
  ``value``); for ``filter``: one value;
- conditional expressions (``a if c else b``), ``and`` / ``or``, and ``if`` statements whose
  branches each return (at most ``MAX_BRANCHES`` of them: every path is read to its return);

Anything else (another call, an attribute, a loop, a mutable global) leaves the function per
row: that choice is made once per operator. The expression has no side effects by construction,
so evaluating it instead of calling the function changes nothing a user can see, as long as it
gives the same values. The evaluator refuses a batch (``None``: the operator then calls the
function per row, which gives its own result or error) whenever Arrow and Python could differ:

- a column of a type other than int64, double, string, bool (binary and date32 only passed
  through): ``to_pylist`` would change it (int32 -> int) and Python's rules apply to the values;
- nulls in a column used by arithmetic or a comparison (Python raises ``TypeError`` on ``None``);
- integer overflow (Python's ints are unbounded: the per-row path raises when it converts),
  a zero divisor (``ZeroDivisionError``), integers beyond 2**53 meeting floats (Python converts
  them exactly; Arrow's casts refuse them);
- operand types Python would reject (``1 + "a"``) or treat differently (``True + 1``, ``1 == "1"``);
- for ``filter``: a result that is not bool (truthiness of numbers and strings stays per row).

``python.row-functions.vectorize: false`` turns this off for a job.
"""

from __future__ import annotations

import dis
import logging
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

import pyarrow as pa
import pyarrow.compute as pc

from yarnflow.worker.operators.lifting_calls import (
    BUILTINS,
    Bounds,
    METHODS,
    Call,
    Contains,
    IfElse,
    Part,
    Refused,
    TypeRefused,
    describe_path,
    evaluate_call,
    evaluate_contains,
    evaluate_if_else,
    evaluate_part,
)
from yarnflow.worker.operators.lifting_calls import ARITH as _ARITH
from yarnflow.worker.operators.lifting_calls import WHAT as _WHAT
from yarnflow.worker.operators.lifting_calls import COMPARE as _COMPARE
from yarnflow.worker.operators.lifting_calls import binary as _binary
from yarnflow.worker.operators.lifting_calls import no_nulls as _no_nulls
from yarnflow.worker.operators.lifting_calls import scalar as _scalar

__all__ = ["LiftedFunction", "NotLiftable", "lift", "lift_with_reason"]

log = logging.getLogger(__name__)

_SUPPORTED_PYTHON = ((3, 11), (3, 12), (3, 13))
_COMPUTED_TYPES = (pa.int64(), pa.float64(), pa.string(), pa.bool_())
_PASSED_TYPES = (*_COMPUTED_TYPES, pa.binary(), pa.date32())


# -- the expression tree -------------------------------------------------------------------------

class _Row:
    """The function's argument: only ever subscripted."""


@dataclass(frozen=True)
class _Column:
    name: str


@dataclass(frozen=True)
class _Const:
    value: Any


@dataclass(frozen=True)
class _Free:
    """A module global or closure variable, read again for each batch."""
    name: str
    cell: int  # index into the closure, -1 for a global


@dataclass(frozen=True)
class _Binary:
    op: str  # a key of _ARITH or _COMPARE
    left: _Expr
    right: _Expr


@dataclass(frozen=True)
class _Negate:
    operand: _Expr


@dataclass(frozen=True)
class _IsNone:
    operand: _Expr
    negated: bool


_Expr = Union[_Column, _Const, _Free, _Binary, _Negate, _IsNone, Call, Contains, Part, IfElse]
_EXPR_TYPES = (_Column, _Const, _Free, _Binary, _Negate, _IsNone, Call, Contains, Part, IfElse)
#: jumps of a conditional expression (x if c else y), 3.11 to 3.13
_CONDITIONAL_JUMPS = {"POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE", "POP_JUMP_IF_NONE", "POP_JUMP_IF_NOT_NONE",
                      "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_FORWARD_IF_NONE",
                      "POP_JUMP_FORWARD_IF_NOT_NONE"}
#: forks of the paths read (each conditional expression, and, or doubles the paths after it:
#: up to 4 of them one after another)
MAX_BRANCHES = 16
_Refused = Refused
_TypeRefused = TypeRefused


class NotLiftable(Exception):
    """Why a function stays per row."""


@dataclass(frozen=True)
class _Callee:
    """On the stack before a call's arguments: a method of ``receiver`` or a builtin (None)."""

    name: str
    receiver: Any


# -- reading the bytecode ------------------------------------------------------------------------

def _read(fn: types.FunctionType, code: types.CodeType | None = None, start: int = 0,
          names: dict[str, Any] | None = None, stack: tuple[Any, ...] = (), stop: frozenset[str] = frozenset()) -> Any:
    """The value ``fn`` returns, as an expression tree (or dict of them); raises ``NotLiftable``
    saying why not. ``lifting_flat.py`` reads a part of it (or of its comprehension's ``code``):
    from instruction ``start`` with ``names`` and ``stack``, to an instruction in ``stop``,
    whose operand is the result."""
    if code is None:
        code = fn.__code__
        if (code.co_argcount != 1 or code.co_kwonlyargcount or code.co_posonlyargcount > 1
                or code.co_flags & (0x04 | 0x08 | 0x20 | 0x80 | 0x100 | 0x200) or code.co_cellvars):
            raise NotLiftable("it takes other arguments than one row, is a generator, or has inner functions")
    elif code.co_freevars:
        raise NotLiftable("its comprehension reads variables of the function")

    def run(n: int, names: dict[str, Any], stack: list[Any]) -> Any:
        """Run from instruction ``n`` to a return; a conditional jump runs both ways."""

        def pop() -> Any:
            if not stack:
                raise NotLiftable("its bytecode is not straight-line code")
            return stack.pop()

        while n < len(instructions):
            ins = instructions[n]
            n += 1
            op = ins.opname
            if op in ("RESUME", "NOP", "CACHE", "EXTENDED_ARG", "COPY_FREE_VARS", "NOT_TAKEN", "TO_BOOL"):
                continue
            if op in ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"):
                if ins.argval not in names:
                    raise NotLiftable(f"it reads {ins.argval} before setting it")
                stack.append(names[ins.argval])
            elif op in ("LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW_LOAD_FAST_BORROW"):
                for name in ins.argval:
                    if name not in names:
                        raise NotLiftable(f"it reads {name} before setting it")
                    stack.append(names[name])
            elif op == "STORE_FAST":
                names[ins.argval] = pop()
            elif op == "LOAD_CONST":
                stack.append(_Const(ins.argval))
            elif op == "RETURN_CONST":
                return _Const(ins.argval)
            elif op == "LOAD_GLOBAL":
                if "NULL" in ins.argrepr:  # the start of a call: of a builtin the module does not shadow
                    if ins.argval not in BUILTINS or ins.argval in fn.__globals__:
                        raise NotLiftable(f"it calls {ins.argval}()")
                    stack.append(_Callee(ins.argval, None))
                else:
                    stack.append(_Free(ins.argval, -1))
            elif op == "LOAD_METHOD" or (op == "LOAD_ATTR" and "NULL|self" in ins.argrepr):
                receiver = pop()
                if ins.argval not in METHODS and not (ins.argval == "findall" and "<flat>" in stop):
                    raise NotLiftable(f"it calls .{ins.argval}()")
                stack.append(_Callee(ins.argval, _value(receiver)))
            elif op == "PRECALL":
                continue
            elif op == "CALL":
                args = [_value(pop()) for _ in range(ins.arg or 0)][::-1]
                callee = pop()
                if not isinstance(callee, _Callee):
                    raise NotLiftable("it calls a function it did not name directly")
                if callee.receiver is not None and len(args) not in METHODS.get(callee.name, (1,)):
                    raise NotLiftable(f"it calls .{callee.name}() with {len(args)} arguments")
                stack.append(Call(callee.name, callee.receiver, tuple(args)))
            elif op == "CONTAINS_OP":
                haystack, needle = pop(), pop()
                stack.append(Contains(_value(needle), _value(haystack), negated=bool(ins.arg)))
            elif op == "LOAD_DEREF":
                if ins.argval not in code.co_freevars:
                    raise NotLiftable(f"it reads the variable {ins.argval} of an inner function")
                stack.append(_Free(ins.argval, code.co_freevars.index(ins.argval)))
            elif op == "BINARY_SUBSCR":
                key, obj = pop(), pop()
                if isinstance(key, Bounds):
                    stack.append(Call("slice", _value(obj), key.parts))
                    continue
                if (isinstance(obj, Call) and obj.name == "split" and obj.receiver is not None
                        and isinstance(key, _Const) and type(key.value) is int and key.value >= 0):
                    stack.append(Part(obj, key.value))  # s.split()[i]
                    continue
                if not (isinstance(obj, _Row) and isinstance(key, _Const) and type(key.value) is str):
                    raise NotLiftable("it subscripts something other than the row by a name or split() by "
                                      "an index")
                stack.append(_Column(key.value))
            elif op in ("BINARY_OP", "COMPARE_OP"):
                symbol = str(ins.argval) if op == "COMPARE_OP" else ins.argrepr  # 3.13: argrepr "bool(>)"
                if symbol not in _ARITH and symbol not in _COMPARE:
                    raise NotLiftable(f"it uses the operator {symbol}")
                right, left = pop(), pop()
                stack.append(_Binary(symbol, _value(left), _value(right)))
            elif op == "UNARY_NEGATIVE":
                stack.append(_Negate(_value(pop())))
            elif op == "UNARY_NOT":
                stack.append(Call("not", None, (_value(pop()),)))
            elif op == "BUILD_SLICE":  # x[a:b] (3.11), x[a:b:c]
                stack.append(Bounds(tuple(_value(pop()) for _ in range(ins.arg or 0))[::-1]))
            elif op == "BINARY_SLICE":  # x[a:b] (3.12+)
                upper, lower = _value(pop()), _value(pop())
                stack.append(Call("slice", _value(pop()), (lower, upper)))
            elif op == "IS_OP":
                right, left = pop(), pop()
                if isinstance(right, _Const) and right.value is None:
                    operand = left
                elif isinstance(left, _Const) and left.value is None:
                    operand = right
                else:
                    raise NotLiftable("it compares identity (is) with something other than None")
                stack.append(_IsNone(_value(operand), negated=bool(ins.arg)))
            elif op == "BUILD_CONST_KEY_MAP":
                keys = pop()
                values = [pop() for _ in range(ins.arg or 0)][::-1]
                if not isinstance(keys, _Const):
                    raise NotLiftable("the keys of the dict it returns are not constants")
                stack.append(_build_dict(list(keys.value), values))
            elif op == "BUILD_MAP":
                flat = [pop() for _ in range(2 * (ins.arg or 0))][::-1]
                keys = []
                for key in flat[0::2]:
                    if not isinstance(key, _Const):
                        raise NotLiftable("the keys of the dict it returns are not constants")
                    keys.append(key.value)
                stack.append(_build_dict(keys, flat[1::2]))
            elif op in _CONDITIONAL_JUMPS and ins.argval > ins.offset:  # x if c else y
                forks[0] += 1
                if forks[0] > MAX_BRANCHES:
                    raise NotLiftable(f"it has more than {MAX_BRANCHES} branches")
                top = _value(pop())
                none_test = op.endswith("NONE")
                cond = _IsNone(top, negated=op.endswith("NOT_NONE")) if none_test else top
                jumps_when = none_test or op.endswith("TRUE")
                jumped = run(index[ins.argval], dict(names), list(stack))
                fell = run(n, dict(names), list(stack))
                return if_else(cond, jumped, fell) if jumps_when else if_else(cond, fell, jumped)
            elif op in ("JUMP_IF_FALSE_OR_POP", "JUMP_IF_TRUE_OR_POP") and ins.argval > ins.offset:  # 3.11 and/or
                forks[0] += 1
                if forks[0] > MAX_BRANCHES:
                    raise NotLiftable(f"it has more than {MAX_BRANCHES} branches")
                top = _value(pop())
                jumped = run(index[ins.argval], dict(names), [*stack, top])  # the operand is the result
                fell = run(n, dict(names), list(stack))
                return if_else(top, jumped, fell) if op.endswith("TRUE_OR_POP") else if_else(top, fell, jumped)
            elif op == "COPY" and ins.arg == 1 and stack:  # 3.12+: and/or keep their operand
                stack.append(stack[-1])
            elif op == "POP_TOP":
                pop()
            elif op in ("JUMP_FORWARD", "JUMP", "JUMP_NO_INTERRUPT") and ins.argval > ins.offset:
                n = index[ins.argval]
            elif op == "RETURN_VALUE" or op in stop:
                return pop()
            else:
                raise NotLiftable(f"it uses {_WHAT.get(op.split('_')[0], op)}")
        raise NotLiftable("its bytecode is not straight-line code")

    instructions = [ins for ins in dis.get_instructions(code) if ins.opname != "CACHE"]
    index = {ins.offset: n for n, ins in enumerate(instructions)}
    forks = [0]
    try:
        return run(start, {code.co_varnames[0]: _Row()} if names is None else dict(names), list(stack))
    except _Refused:
        raise NotLiftable("it returns the row itself, a nested value or a tuple") from None
    raise NotLiftable("its bytecode is not straight-line code")


def if_else(cond: _Expr, then: Any, otherwise: Any) -> Any:
    """``then if cond else otherwise`` of two returned values (expressions, or dicts of the
    same keys in the same order)."""
    if isinstance(then, dict) and isinstance(otherwise, dict):
        if list(then) != list(otherwise):
            raise NotLiftable("its branches return dicts of different keys")
        return {k: if_else(cond, then[k], otherwise[k]) for k in then}
    if isinstance(then, dict) or isinstance(otherwise, dict):
        raise NotLiftable("one of its branches returns a dict and another does not")
    if then == otherwise and repr(then) == repr(otherwise):  # the same on both paths (not 1 and True)
        return _value(then)
    return IfElse(cond, _value(then), _value(otherwise))


def _value(item: Any) -> _Expr:
    if not isinstance(item, _EXPR_TYPES):
        raise _Refused  # the row itself, a dict, or a tuple constant inside an expression
    return item


def _build_dict(keys: list[Any], values: list[Any]) -> dict[str, _Expr]:
    if any(type(k) is not str for k in keys) or len(keys) != len(values):
        raise _Refused
    out: dict[str, _Expr] = {}
    for key, value in zip(keys, values):
        out[key] = _value(value)  # a repeated key keeps its first place and last value, as Python
    return out


# -- evaluating it on a batch --------------------------------------------------------------------

class LiftedFunction:
    """A per-row function read as column expressions; ``map_batch`` / ``filter_mask`` return
    None for a batch that must go per row."""

    def __init__(self, fn: types.FunctionType, kind: str, result: Any) -> None:
        self.fn = fn
        self.kind = kind
        self.outputs: dict[str, _Expr] = result if isinstance(result, dict) else {"value": result}
        self._refused_schemas: set[pa.Schema] = set()
        #: batches it evaluated, batches it handed to the row path, and why it handed the last one
        self.lifted_batches = self.row_batches = 0
        self.last_refusal = ""

    def describe(self) -> str:
        """How its operator ran, for ``yarnflow info``."""
        return describe_path(self.lifted_batches, self.row_batches, self.last_refusal)

    def map_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        arrays = self._evaluate(batch)
        if arrays is None:
            return None
        return pa.RecordBatch.from_arrays(arrays, names=list(self.outputs))

    def filter_mask(self, batch: pa.RecordBatch) -> pa.Array | None:
        arrays = self._evaluate(batch)
        if arrays is None or arrays[0].type != pa.bool_():
            return None
        return arrays[0]

    def _evaluate(self, batch: pa.RecordBatch) -> list[pa.Array] | None:
        if batch.schema in self._refused_schemas:
            self._per_row("")
            return None
        try:
            out = [self._output(expr, batch) for expr in self.outputs.values()]
        except _TypeRefused as exc:
            self._refused_schemas.add(batch.schema)  # the same for every batch of this schema
            self._per_row(str(exc) or "the types of the batch's columns")
            return None
        except _Refused as exc:
            self._per_row(str(exc) or "values where Arrow and Python could differ")
            return None
        except (pa.ArrowException, ArithmeticError):  # an overflow, or a case not foreseen
            self._per_row("a value Arrow refused (an overflow, or text it parses unlike Python)")
            return None
        self.lifted_batches += 1
        return out

    def _per_row(self, why: str) -> None:
        self.row_batches += 1
        self.last_refusal = why or self.last_refusal

    def _output(self, expr: _Expr, batch: pa.RecordBatch) -> pa.Array:
        if isinstance(expr, _Column):
            column = _column(batch, expr.name)
            if column.type not in _PASSED_TYPES:
                raise _TypeRefused
            return column
        value = self._eval(expr, batch)
        if isinstance(value, pa.Scalar):
            if not value.is_valid:
                raise _TypeRefused  # a None column: its type is decided per row, later
            return pa.repeat(value, batch.num_rows)
        return value

    def _eval(self, expr: _Expr, batch: pa.RecordBatch) -> pa.Array | pa.Scalar:
        if isinstance(expr, _Column):
            column = _column(batch, expr.name)
            if column.type not in _COMPUTED_TYPES:
                raise _TypeRefused
            return column
        if isinstance(expr, _Const):
            return _scalar(expr.value)
        if isinstance(expr, _Free):
            return _scalar(self._free_value(expr))
        if isinstance(expr, _IsNone):
            operand = self._eval(expr.operand, batch)
            if isinstance(operand, pa.Scalar):
                return pa.scalar(operand.is_valid == expr.negated)
            return pc.is_valid(operand) if expr.negated else pc.is_null(operand)
        if isinstance(expr, Call):
            if expr.receiver is None and expr.name in self.fn.__globals__:
                raise _Refused  # the module defines its own len, int...: per row
            receiver = self._eval(expr.receiver, batch) if expr.receiver is not None else None
            return evaluate_call(expr, receiver, [self._eval(a, batch) for a in expr.args])
        if isinstance(expr, Part):
            split = expr.split
            return evaluate_part(expr, self._eval(split.receiver, batch), [self._eval(a, batch) for a in split.args])
        if isinstance(expr, IfElse):
            return evaluate_if_else(self._eval(expr.cond, batch), lambda: self._eval(expr.then, batch),
                                    lambda: self._eval(expr.otherwise, batch))
        if isinstance(expr, Contains):
            return evaluate_contains(expr, self._eval(expr.needle, batch), self._eval(expr.haystack, batch))
        if isinstance(expr, _Negate):
            operand = _no_nulls(self._eval(expr.operand, batch))
            if operand.type not in (pa.int64(), pa.float64()):
                raise _TypeRefused
            return pc.negate_checked(operand)
        left = _no_nulls(self._eval(expr.left, batch))
        right = _no_nulls(self._eval(expr.right, batch))
        return _binary(expr.op, left, right)

    def _free_value(self, expr: _Free) -> Any:
        if expr.cell >= 0:
            try:
                value = self.fn.__closure__[expr.cell].cell_contents  # type: ignore[index]
            except (TypeError, IndexError, ValueError):  # an empty cell: per row raises NameError
                raise _Refused from None
        else:
            if expr.name not in self.fn.__globals__:  # a builtin, or a NameError per row
                raise _Refused
            value = self.fn.__globals__[expr.name]
        if type(value) not in (int, float, str, bool):
            raise _Refused
        return value


def _column(batch: pa.RecordBatch, name: str) -> pa.Array:
    index = batch.schema.get_field_index(name)  # -1 when missing or repeated
    if index < 0:  # per row: KeyError, or the last of the repeated columns
        raise _TypeRefused(f"no single column {name!r}")
    return batch.column(index)


def lift_with_reason(fn: Callable[..., Any], kind: str) -> tuple[LiftedFunction | None, str]:
    """``fn`` (the function of a ``map`` or ``filter``) as column expressions, or None and why not."""
    if sys.version_info[:2] not in _SUPPORTED_PYTHON:
        versions = " / ".join(f"{major}.{minor}" for major, minor in _SUPPORTED_PYTHON)
        return None, f"the vectoriser reads the bytecode of Python {versions} only"
    if kind not in ("map", "filter"):
        return None, f"{kind} functions are not vectorised"
    if type(fn) is not types.FunctionType:  # bound methods, partials, callables, builtins
        return None, "it is not a plain function (a method, a partial, a callable object or a builtin)"
    try:
        result = _read(fn)
    except NotLiftable as exc:
        return None, str(exc)
    if result is None or isinstance(result, _Row):
        return None, "it returns the row itself or None"
    if isinstance(result, dict):
        if kind != "map" or not result:
            return None, "a filter's function returns a dict, or a map's an empty one"
    elif not isinstance(result, _EXPR_TYPES):
        return None, "it returns a nested value or a tuple"
    return LiftedFunction(fn, kind, result), ""


def lift(fn: Callable[..., Any], kind: str) -> LiftedFunction | None:
    """``fn`` (the function of a ``map`` or ``filter``) as column expressions, or None."""
    return lift_with_reason(fn, kind)[0]
