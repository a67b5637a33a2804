"""The callables that run PyFlink's functions inside yarnflow's operators: each decodes a row
into the element (``records.py``), calls the function and encodes what it returns; the
process-function wrappers are yarnflow's function classes, emitting side outputs by OutputTag;
the window helpers run window functions on a fired window's elements."""

from __future__ import annotations

import itertools
import pickle
from typing import Any, Callable, Iterator

from yarnflow.common.api import KeyedProcessFunction as YarnflowKeyedProcessFunction
from yarnflow.common.api import ProcessFunction as YarnflowProcessFunction
from yarnflow.common.errors import JobDefinitionError
from yarnflow.pyflink.common.typeinfo import TypeInformation
from yarnflow.pyflink.datastream.functions import Function, KeyedProcessFunction, RuntimeContext
from yarnflow.pyflink.datastream.records import KEY, TS, decode, encode_key, encoder, reader

__all__ = ["OutputTag"]

_names = itertools.count(1)


def _target(fn: Any, method: str) -> Callable[..., Any]:
    """The function to call: ``fn.<method>`` of a function class's instance, else ``fn``."""
    bound = getattr(fn, method, None)
    if callable(bound) and (isinstance(fn, Function) or not callable(fn)):
        return bound  # type: ignore[no-any-return]
    if callable(fn):
        return fn  # type: ignore[no-any-return]
    raise JobDefinitionError(f"expected a function or an object with a {method}() method, got {fn!r}")


class _Wrapped:
    """A PyFlink function as a yarnflow row function (``open``/``close`` passed on)."""

    def __init__(self, fn: Any, method: str, output_type: TypeInformation | None = None) -> None:
        self.fn = fn
        self.method = method
        self.call = _target(fn, method)
        self.encode = encoder(output_type)
        self.read: Callable[[dict[str, Any]], Any] | None = None  # (the input's layout, from its first row)

    def decode(self, row: dict[str, Any]) -> Any:
        read = self.read
        if read is None:
            read = self.read = reader(row)
        return read(row)

    def __getstate__(self) -> dict[str, Any]:  # (shipped without the reader: a worker finds its own)
        return {**self.__dict__, "read": None}

    def open(self, ctx: Any) -> None:
        if callable(getattr(self.fn, "open", None)) and isinstance(self.fn, Function):
            self.fn.open(RuntimeContext(ctx))

    def close(self) -> None:
        if callable(getattr(self.fn, "close", None)) and isinstance(self.fn, Function):
            self.fn.close()


class _Map(_Wrapped):
    """A map; with ``key`` (a key_by right after it), each output's key too, in column ``__k``:
    no operator of its own for the key_by."""

    key: Callable[[Any], Any] | None = None

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        value = self.call(self.decode(row))
        out = self.encode(value)
        if self.key is not None:
            out[KEY] = encode_key(self.key(value))
        if TS in row:  # (a record's timestamp goes with it, as in Flink)
            out[TS] = row[TS]
        return out


class _FlatMap(_Wrapped):
    key: Callable[[Any], Any] | None = None

    def __call__(self, row: dict[str, Any]) -> Iterator[dict[str, Any]]:
        encode, key = self.encode, self.key
        values = self.call(self.decode(row)) or ()
        if key is not None:
            if TS in row:
                ts = row[TS]
                return ({**encode(v), KEY: encode_key(key(v)), TS: ts} for v in values)
            return ({**encode(v), KEY: encode_key(key(v))} for v in values)
        if TS in row:
            ts = row[TS]
            return ({**encode(v), TS: ts} for v in values)
        return (encode(v) for v in values)


class _Fused(_Wrapped):
    """Consecutive maps, flat_maps and filters of the layer in one yarnflow flat_map: the
    elements go from one function to the next as Python objects, not through Arrow between
    operators (``steps``: (kind, function) in order)."""

    def __init__(self, steps: list[tuple[str, Any, Any]], output_type: TypeInformation | None) -> None:
        super().__init__(steps[-1][1], steps[-1][2], output_type)
        self.steps = steps
        self.calls = [(kind, _target(fn, method)) for kind, fn, method in steps]

    def open(self, ctx: Any) -> None:
        for _, fn, _ in self.steps:
            if isinstance(fn, Function):
                fn.open(RuntimeContext(ctx))

    def close(self) -> None:
        for _, fn, _ in self.steps:
            if isinstance(fn, Function):
                fn.close()

    key: Callable[[Any], Any] | None = None

    def __call__(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        values = [self.decode(row)]
        for kind, call in self.calls:
            if kind == "map":
                values = [call(v) for v in values]
            elif kind == "flat_map":
                values = [w for v in values for w in (call(v) or ())]
            else:
                values = [v for v in values if call(v)]
        encode, key = self.encode, self.key
        out = [encode(v) for v in values]
        if key is not None:
            for o, v in zip(out, values):
                o[KEY] = encode_key(key(v))
        if TS in row:
            ts = row[TS]
            for o in out:
                o[TS] = ts
        return out


class _Stamp(_Wrapped):
    """The element's timestamp (ms) from the strategy's TimestampAssigner, in column ``__ts``."""

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        return {**row, TS: int(self.call(decode(row), row.get(TS, -(2**63))))}


class _Filter(_Wrapped):
    def __call__(self, row: dict[str, Any]) -> bool:
        return bool(self.call(self.decode(row)))


class _Key(_Wrapped):
    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        return {**row, KEY: encode_key(self.call(self.decode(row)))}


class _Reduce(_Wrapped):
    def __call__(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        read = self.read
        if read is None:
            read = self.read = reader(a)
            if "line" in a:  # (a text file's line, as it came: the reduced row keeps its input's columns)
                self.encode = _as_line
        out = self.encode(self.call(read(a), read(b)))
        out[KEY] = a[KEY]
        return out


def _as_line(value: Any) -> dict[str, Any]:
    return {"line": value}


class _AllKey:
    """window_all's one key."""

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        return {**row, KEY: 0}


class _PartitionKey(_Wrapped):
    def __call__(self, row: dict[str, Any]) -> Any:
        return self.call(decode(row))


class OutputTag:
    """A side output's name and element type (``yield output_tag, value`` in a process function)."""

    def __init__(self, tag_id: str, type_info: TypeInformation | None = None) -> None:
        if not isinstance(tag_id, str) or not tag_id:
            raise JobDefinitionError(f"OutputTag needs a name, not {tag_id!r}")
        self.tag_id = tag_id
        self.type_info = type_info


def _key_of(row: dict[str, Any]) -> Any:
    key = row.get(KEY)
    return pickle.loads(key) if isinstance(key, bytes) else key


class _Sides:
    """Emits what a process function yields: ``(OutputTag, value)`` to that side output (encoded
    as the tag's type), anything else to the main output (``self.encode``)."""

    encode: Callable[[Any], dict[str, Any]]

    def __init__(self) -> None:
        self._sides: dict[str, Any] = {}

    def emit(self, results: Any, ctx: Any, out: Any) -> None:
        for item in results or ():
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], OutputTag):
                tag, value = item
                encode = self._sides.get(tag.tag_id)
                if encode is None:
                    encode = self._sides[tag.tag_id] = encoder(tag.type_info)
                ctx.output(tag.tag_id, encode(value))
            else:
                out.collect(self.encode(item))


class _KeyedProcess(_Sides, YarnflowKeyedProcessFunction):
    """A PyFlink KeyedProcessFunction as yarnflow's: elements decoded, what it yields emitted
    (``_Sides``)."""

    def __init__(self, fn: Any, output_type: TypeInformation | None) -> None:
        super().__init__()
        self.fn = fn
        self.encode = encoder(output_type)

    def open(self, ctx: Any) -> None:
        self.fn.open(RuntimeContext(ctx, self))

    def close(self) -> None:
        self.fn.close()

    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        self.emit(self.fn.process_element(decode(row), KeyedProcessFunction.Context(ctx, _key_of(row))), ctx, out)

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        pyctx = KeyedProcessFunction.OnTimerContext(ctx, _key_of({KEY: ctx.current_key}))
        self.emit(self.fn.on_timer(timestamp, pyctx), ctx, out)


class _Process(_Sides, YarnflowProcessFunction):
    """A PyFlink ProcessFunction as yarnflow's."""

    def __init__(self, fn: Any, output_type: TypeInformation | None) -> None:
        super().__init__()
        self.fn = fn
        self.encode = encoder(output_type)

    def open(self, ctx: Any) -> None:
        self.fn.open(RuntimeContext(ctx))

    def close(self) -> None:
        self.fn.close()

    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        self.emit(self.fn.process_element(decode(row), KeyedProcessFunction.Context(ctx, None)), ctx, out)


class _Aggregate:
    """A PyFlink AggregateFunction as yarnflow's (rows decoded, the result encoded)."""

    def __init__(self, fn: Any, output_type: TypeInformation | None) -> None:
        self.fn = fn
        self.encode = encoder(output_type)

    def create_accumulator(self) -> Any:
        return self.fn.create_accumulator()

    def add(self, row: dict[str, Any], accumulator: Any) -> Any:
        return self.fn.add(decode(row), accumulator)

    def get_result(self, accumulator: Any) -> Any:
        return self.encode(self.fn.get_result(accumulator))

    def merge(self, a: Any, b: Any) -> Any:
        return self.fn.merge(a, b)


class _Collect:
    """A window's elements, as an aggregate: what a ProcessWindowFunction is given at the end."""

    def create_accumulator(self) -> list[Any]:
        return []

    def add(self, row: dict[str, Any], accumulator: list[Any]) -> list[Any]:
        accumulator.append(decode(row))
        return accumulator

    def get_result(self, accumulator: list[Any]) -> dict[str, Any]:
        return {"p": pickle.dumps(accumulator, pickle.HIGHEST_PROTOCOL)}

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return a + b


class _WindowCall(_Wrapped):
    """Runs a window function on a fired window's row (key, bounds and the elements, or the one
    pre-aggregated element), encoding what it yields."""

    def __init__(self, fn: Any, method: str, output_type: TypeInformation | None, collected: bool,
                 keyed: bool = True) -> None:
        super().__init__(fn, method, output_type)
        self.collected = collected
        self.keyed = keyed

    def __call__(self, row: dict[str, Any]) -> Iterator[dict[str, Any]]:
        from yarnflow.pyflink.datastream.window import TimeWindow

        window = TimeWindow(row["window_start"], row["window_end"])
        elements = decode(row) if self.collected else [decode(row)]
        encode = self.encode
        if self.method == "apply":  # (a WindowFunction: apply(key, window, inputs))
            results = self.call(_key_of(row), window, elements) if self.keyed else self.call(window, elements)
        else:  # (a ProcessWindowFunction: process(key, context, elements))
            context = _WindowContext(window)
            results = self.call(_key_of(row), context, elements) if self.keyed else self.call(context, elements)
        return (encode(v) for v in results or ())


class _WindowContext:
    def __init__(self, window: Any) -> None:
        self._window = window

    def window(self) -> Any:
        return self._window


def _window_method(fn: Any) -> str:
    return "apply" if callable(getattr(fn, "apply", None)) and not callable(getattr(fn, "process", None)) \
        else "process"


def _name(func: Any, kind: str) -> str:
    name = getattr(func, "__name__", None) or type(func).__name__
    return kind if name in ("<lambda>", "function") else f"{kind}: {name}"


def _decoded(table: Any) -> list[Any]:
    if table is None:
        return []
    return [decode(row) for row in table.to_pylist()]
