"""PyFlink's DataStream and KeyedStream over yarnflow's: each PyFlink function is wrapped in a
callable that decodes a row into the element, calls the function and encodes what it returns
(``records.py``), so the operators, exchanges, state and checkpoints are yarnflow's own."""

from __future__ import annotations

import itertools
import pickle
from typing import Any, Callable, Iterable, Iterator

from yarnflow.common.errors import JobDefinitionError
from yarnflow.common.states import Partitioner
from yarnflow.pyflink.common.typeinfo import TypeInformation
from yarnflow.common.api import KeyedProcessFunction as YarnflowKeyedProcessFunction
from yarnflow.common.api import ProcessFunction as YarnflowProcessFunction
from yarnflow.pyflink.datastream.functions import Function, KeyedProcessFunction, RuntimeContext
from yarnflow.pyflink.datastream.records import KEY, TS, decode, encode_key, encoder, reader

__all__ = ["DataStream", "KeyedStream", "WindowedStream", "AllWindowedStream", "DataStreamSink", "CloseableIterator", "OutputTag"]

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


class CloseableIterator:
    """``execute_and_collect``'s elements (an iterator that can be closed, as PyFlink's)."""

    def __init__(self, values: Iterable[Any]) -> None:
        self._it = iter(values)

    def __iter__(self) -> CloseableIterator:
        return self

    def __next__(self) -> Any:
        return next(self._it)

    def close(self) -> None:
        self._it = iter(())

    def __enter__(self) -> CloseableIterator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class DataStreamSink:
    """What ``print``, ``sink_to`` and ``add_sink`` return: name, uid and parallelism of the sink."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def name(self, name: str) -> DataStreamSink:
        self._stream.name(name)
        return self

    def uid(self, uid: str) -> DataStreamSink:
        self._stream.uid(uid)
        return self

    def set_parallelism(self, parallelism: int) -> DataStreamSink:
        self._stream.set_parallelism(parallelism)
        return self

    def set_uid_hash(self, uid_hash: str) -> DataStreamSink:
        return self.uid(uid_hash)

    def disable_chaining(self) -> DataStreamSink:
        self._stream.disable_chaining()
        return self

    def slot_sharing_group(self, group: Any) -> DataStreamSink:
        self._stream.slot_sharing_group(getattr(group, "name", group))
        return self


class DataStream:
    """A PyFlink stream: ``_ds`` is yarnflow's, ``_type`` what its elements are (None: pickled)."""

    def __init__(self, env: Any, ds: Any, type_info: TypeInformation | None = None) -> None:
        self._env = env
        self._ds = ds
        self._type = type_info
        #: the yarnflow stream whose side outputs this one's are (a window function's: the window's)
        self._sides_of = ds
        #: a row function of the layer: (the yarnflow stream it reads, its steps), for fusing the next
        self._steps: tuple[Any, list[tuple[str, Any, str]]] | None = None
        op = getattr(ds.transformation, "operator", None)
        self._default_name = getattr(op, "name", None)

    def _derive(self, ds: Any, type_info: TypeInformation | None) -> DataStream:
        return DataStream(self._env, ds, type_info)

    # -- naming and resources
    def name(self, name: str) -> DataStream:
        self._ds.name(name)
        return self

    def uid(self, uid: str) -> DataStream:
        self._ds.uid(uid)
        return self

    def set_uid_hash(self, uid_hash: str) -> DataStream:
        return self.uid(uid_hash)

    def get_name(self) -> str:
        return str(self._ds._operator().name)

    def set_parallelism(self, parallelism: int) -> DataStream:
        self._ds.set_parallelism(parallelism)
        return self

    def set_max_parallelism(self, max_parallelism: int) -> DataStream:
        self._ds.transformation.max_parallelism = max_parallelism
        return self

    def get_type(self) -> TypeInformation | None:
        return self._type

    def slot_sharing_group(self, group: Any) -> DataStream:
        self._ds.slot_sharing_group(getattr(group, "get_name", lambda: group)() if not isinstance(group, str)
                                    else group)
        return self

    def disable_chaining(self) -> DataStream:
        self._ds.disable_chaining()
        return self

    def start_new_chain(self) -> DataStream:
        return self.disable_chaining()

    def set_buffer_timeout(self, timeout_millis: int) -> DataStream:
        return self  # (yarnflow's execution.buffer-timeout is per job)

    # -- transformations
    def map(self, func: Any, output_type: TypeInformation | None = None) -> DataStream:
        fused = self._fuse("map", func, "map", output_type, "Map")
        if fused is not None:
            return fused
        out = self._derive(self._ds.map(_Map(func, "map", output_type), name=_name(func, "Map")), output_type)
        out._steps = (self._ds, [("map", func, "map")])
        return out

    def flat_map(self, func: Any, output_type: TypeInformation | None = None) -> DataStream:
        fused = self._fuse("flat_map", func, "flat_map", output_type, "FlatMap")
        if fused is not None:
            return fused
        out = self._derive(self._ds.flat_map(_FlatMap(func, "flat_map", output_type),
                                             name=_name(func, "FlatMap")), output_type)
        out._steps = (self._ds, [("flat_map", func, "flat_map")])
        return out

    def filter(self, func: Any) -> DataStream:
        fused = self._fuse("filter", func, "filter", self._type, "Filter")
        if fused is not None:
            return fused
        out = self._derive(self._ds.filter(_Filter(func, "filter"), name=_name(func, "Filter")), self._type)
        out._steps = (self._ds, [("filter", func, "filter")])
        return out

    def _fuse(self, kind: str, func: Any, method: str, output_type: TypeInformation | None, label: str
              ) -> DataStream | None:
        """This stream's row function(s) and ``func`` as one operator read from this stream's
        input, when nothing was set on this stream's operator (name, uid, parallelism, key): the
        operator of this stream is then dropped at execute unless something else reads it."""
        if self._steps is None or not self._fusable():
            return None
        source, steps = self._steps
        steps = [*steps, (kind, func, method)]
        _target(func, method)  # (refused now, as unfused)
        name = " -> ".join(_name(fn, {"map": "Map", "flat_map": "FlatMap", "filter": "Filter"}[k])
                           for k, fn, _ in steps)
        self._env._absorbed.append(self._ds.transformation)
        out = self._derive(source.flat_map(_Fused(steps, output_type), name=name), output_type)
        out._steps = (source, steps)
        return out

    def _fusable(self) -> bool:
        t = self._ds.transformation
        op = t.operator
        fn = getattr(op, "fn", None)
        return (isinstance(fn, (_Map, _FlatMap, _Filter, _Fused)) and getattr(fn, "key", None) is None and not self._ds._tag
                and not getattr(op, "user_uid", False) and t.parallelism is None and t.chaining
                and t.slot_sharing_group == "default" and self._ds._partitioner == Partitioner.FORWARD
                and op.name == self._default_name)

    def process(self, func: Any, output_type: TypeInformation | None = None) -> DataStream:
        """A ProcessFunction per element (event time, side outputs, the clocks)."""
        from yarnflow.pyflink.datastream.functions import ProcessFunction

        if not isinstance(func, ProcessFunction):
            raise JobDefinitionError(f"process takes a ProcessFunction (a KeyedProcessFunction after key_by), "
                                     f"not {func!r}")
        return self._derive(self._ds.process(_Process(func, output_type), name=_name(func, "Process")), output_type)

    def key_by(self, key_selector: Any, key_type: TypeInformation | None = None) -> KeyedStream:
        # right after one of the layer's maps or flat_maps, that operator writes the key as well
        # (other readers of its output do not see the column); else a map of its own does
        op = self._ds.transformation.operator
        wrapper = getattr(op, "fn", None)
        if isinstance(wrapper, (_Map, _FlatMap, _Fused)) and wrapper.key is None and not self._ds._tag:
            wrapper.key = _target(key_selector, "get_key")
            return KeyedStream(self._env, self._ds.key_by(KEY), self._type)
        keyed = self._ds.map(_Key(key_selector, "get_key"), name="key_by")
        return KeyedStream(self._env, keyed.key_by(KEY), self._type)

    def union(self, *streams: DataStream) -> DataStream:
        return self._derive(self._ds.union(*(s._ds for s in streams)), self._type)

    # -- partitioning
    def shuffle(self) -> DataStream:
        return self._derive(self._ds.shuffle(), self._type)

    def rebalance(self) -> DataStream:
        return self._derive(self._ds.rebalance(), self._type)

    def rescale(self) -> DataStream:
        return self._derive(self._ds.rescale(), self._type)

    def forward(self) -> DataStream:
        return self._derive(self._ds.forward(), self._type)

    def global_(self) -> DataStream:
        return self._derive(self._ds.global_(), self._type)

    def broadcast(self, *descriptors: Any) -> Any:
        """Every element to every subtask; with MapStateDescriptors, a BroadcastStream to connect
        another stream to (the broadcast state pattern)."""
        if descriptors:
            from yarnflow.pyflink.datastream.connected import BroadcastStream

            return BroadcastStream(self, descriptors)
        return self._derive(self._ds.broadcast(), self._type)

    def connect(self, stream: Any) -> Any:
        from yarnflow.pyflink.datastream.connected import (BroadcastConnectedStream, BroadcastStream,
                                                           ConnectedStreams)

        if isinstance(stream, BroadcastStream):
            return BroadcastConnectedStream(self, stream)
        return ConnectedStreams(self, stream)

    def partition_custom(self, partitioner: Any, key_selector: Any) -> DataStream:
        part = _target(partitioner, "partition")
        return self._derive(self._ds.partition_custom(part, _PartitionKey(key_selector, "get_key")), self._type)

    def window_all(self, window_assigner: Any) -> AllWindowedStream:
        from yarnflow.pyflink.datastream.window import yarnflow_assigner

        keyed = self._ds.map(_AllKey(), name="window_all").set_parallelism(1).key_by(KEY)
        keyed_stream = KeyedStream(self._env, keyed, self._type)
        windowed = keyed.window(yarnflow_assigner(window_assigner))
        return AllWindowedStream(keyed_stream, windowed, keyed_functions=False)

    # -- sinks
    def print(self, sink_identifier: str | None = None) -> DataStreamSink:
        """The elements, printed on the client's stdout when the job ends (yarnflow runs no
        TaskManager console), ``str(element)`` a line, prefixed with ``sink_identifier:``."""
        uid = f"pyflink-print-{next(_names)}"
        sink = self._ds.collect(name=uid)
        self._env._prints.append((uid, sink_identifier))
        return DataStreamSink(sink)

    def execute_and_collect(self, job_name: str | None = None, limit: int | None = None) -> CloseableIterator:
        uid = f"pyflink-collect-{next(_names)}"
        self._ds.collect(name=uid)
        result = self._env._execute(job_name)
        values = _decoded(result.collected(uid))
        return CloseableIterator(values[:limit] if limit is not None else values)

    def sink_to(self, sink: Any) -> DataStreamSink:
        attach = getattr(sink, "_attach", None)
        if attach is None:
            raise JobDefinitionError(f"sink_to: {type(sink).__name__} is not a sink yarnflow's PyFlink layer knows "
                                     "(FileSink)")
        return DataStreamSink(attach(self._ds))

    def add_sink(self, sink_func: Any) -> DataStreamSink:
        return self.sink_to(sink_func)

    def get_side_output(self, output_tag: OutputTag) -> DataStream:
        return self._derive(self._sides_of.get_side_output(output_tag.tag_id), output_tag.type_info)

    def assign_timestamps_and_watermarks(self, watermark_strategy: Any) -> DataStream:
        """Event time: each element's timestamp from the strategy's TimestampAssigner, and
        watermarks as the strategy says (bounded out-of-orderness, monotonous, idleness)."""
        if getattr(watermark_strategy, "_kind", "") == "none":
            return self
        assigner = getattr(watermark_strategy, "_assigner", None)
        if assigner is None:
            raise JobDefinitionError("assign_timestamps_and_watermarks: the WatermarkStrategy needs "
                                     ".with_timestamp_assigner(...) (yarnflow's sources carry no record timestamps)")
        stamped = self._ds.map(_Stamp(assigner, "extract_timestamp"), name="Timestamps/Watermarks")
        return self._derive(stamped.assign_timestamps_and_watermarks(watermark_strategy._yarnflow(TS)), self._type)


class KeyedStream(DataStream):
    def reduce(self, func: Any) -> DataStream:
        return self._derive(self._ds.reduce(_Reduce(func, "reduce", self._type), name=_name(func, "Reduce")),
                            self._type)

    def sum(self, position_to_sum: int = 0) -> DataStream:
        """Per key, the running sum of field ``position_to_sum`` of tuple elements (of the
        elements themselves when they are numbers)."""
        i = position_to_sum

        def add(a: Any, b: Any) -> Any:
            if isinstance(a, tuple):
                return tuple(x + y if n == i else x for n, (x, y) in enumerate(zip(a, b)))
            return a + b
        return self.reduce(add)

    def process(self, func: Any, output_type: TypeInformation | None = None) -> DataStream:
        """A KeyedProcessFunction: keyed state (from its open's runtime context), timers,
        ``ctx.timestamp()``, ``ctx.get_current_key()``, side outputs."""
        if not isinstance(func, KeyedProcessFunction):
            raise JobDefinitionError(f"process on a keyed stream takes a KeyedProcessFunction, not {func!r}")
        return self._derive(self._ds.process(_KeyedProcess(func, output_type), name=_name(func, "KeyedProcess")),
                            output_type)

    def window(self, window_assigner: Any) -> Any:
        from yarnflow.pyflink.datastream.window import CountTumblingWindowAssigner, yarnflow_assigner

        if isinstance(window_assigner, CountTumblingWindowAssigner):
            return self.count_window(window_assigner.size, window_assigner.slide)
        return WindowedStream(self, self._ds.window(yarnflow_assigner(window_assigner)))

    def count_window(self, size: int, slide: int | None = None) -> Any:
        """A window of every ``size`` elements of a key; with ``slide``, every ``slide`` elements
        a window of the last ``size``."""
        from yarnflow.pyflink.datastream.count_windows import CountWindowedStream
        from yarnflow.pyflink.datastream.window import CountTumblingWindowAssigner

        CountTumblingWindowAssigner(size, slide)  # (checks them)
        return CountWindowedStream(self, size, slide)



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


class WindowedStream:
    """``key_by(...).window(assigner)`` of PyFlink: ``reduce`` and ``aggregate`` (each with an
    optional window function), ``process`` (ProcessWindowFunction), ``apply`` (WindowFunction),
    lateness."""

    def __init__(self, keyed: KeyedStream, windowed: Any, keyed_functions: bool = True) -> None:
        self._keyed = keyed
        self._w = windowed
        self._keyed_functions = keyed_functions

    def allowed_lateness(self, time_ms: Any) -> WindowedStream:
        self._w.allowed_lateness(int(getattr(time_ms, "to_milliseconds", lambda: time_ms)()))
        return self

    def _then(self, ds: Any, fn: Any, method: str, output_type: TypeInformation | None, collected: bool
              ) -> DataStream:
        call = _WindowCall(fn, method, output_type, collected, self._keyed_functions)
        out = self._keyed._derive(ds.flat_map(call, name=_name(fn, "Window Function")), output_type)
        out._sides_of = ds  # (late data is the window's side output)
        return out

    def side_output_late_data(self, output_tag: OutputTag) -> WindowedStream:
        """Elements too late for their window go to ``output_tag`` (get_side_output of the result)."""
        self._w.side_output_late_data(output_tag.tag_id)
        return self

    def trigger(self, trigger: Any) -> WindowedStream:
        """Only the window's own default trigger (EventTimeTrigger / ProcessingTimeTrigger)."""
        default = getattr(trigger, "event_time", None)
        if default is not None and default == bool(getattr(self._w._assigner, "is_event_time", False)):
            return self
        raise JobDefinitionError(f"window trigger {type(trigger).__name__} is not supported yet by yarnflow's PyFlink "
                                 "layer: windows fire at their end (EventTimeTrigger / ProcessingTimeTrigger, the "
                                 "defaults), and again for late data within the allowed lateness")

    def evictor(self, evictor: Any) -> WindowedStream:
        raise JobDefinitionError("window evictors are not supported yet by yarnflow's PyFlink layer")

    def reduce(self, reduce_function: Any, window_function: Any = None,
               output_type: TypeInformation | None = None) -> DataStream:
        fn = _Reduce(reduce_function, "reduce", self._keyed._type)
        reduced = self._w.reduce(fn, name=_name(reduce_function, "Window Reduce"))
        if window_function is not None:
            return self._then(reduced, window_function, _window_method(window_function), output_type, False)
        return self._keyed._derive(reduced, self._keyed._type)

    def aggregate(self, aggregate_function: Any, window_function: Any = None,
                  accumulator_type: TypeInformation | None = None,
                  output_type: TypeInformation | None = None) -> DataStream:
        if window_function is not None:
            out = self._w.aggregate(_Aggregate(aggregate_function, None),
                                    name=_name(aggregate_function, "Window Aggregate"))
            return self._then(out, window_function, _window_method(window_function), output_type, False)
        out = self._w.aggregate(_Aggregate(aggregate_function, output_type),
                                name=_name(aggregate_function, "Window Aggregate"))
        return self._keyed._derive(out, output_type)

    def process(self, process_window_function: Any, output_type: TypeInformation | None = None) -> DataStream:
        """``process(key, context, elements)`` once a window fires (``context.window()``)."""
        collected = self._w.aggregate(_Collect(), name="Window Elements")
        return self._then(collected, process_window_function, "process", output_type, True)

    def apply(self, window_function: Any, output_type: TypeInformation | None = None) -> DataStream:
        """``apply(key, window, inputs)`` once a window fires."""
        collected = self._w.aggregate(_Collect(), name="Window Elements")
        return self._then(collected, window_function, "apply", output_type, True)


def _window_method(fn: Any) -> str:
    return "apply" if callable(getattr(fn, "apply", None)) and not callable(getattr(fn, "process", None)) \
        else "process"

class AllWindowedStream(WindowedStream):
    """``window_all(assigner)``: one window operator (parallelism 1, as in Flink) over every
    element; its functions take no key."""



def _name(func: Any, kind: str) -> str:
    name = getattr(func, "__name__", None) or type(func).__name__
    return kind if name in ("<lambda>", "function") else f"{kind}: {name}"


def _decoded(table: Any) -> list[Any]:
    if table is None:
        return []
    return [decode(row) for row in table.to_pylist()]
