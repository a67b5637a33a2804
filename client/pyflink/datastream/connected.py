"""PyFlink's connected and broadcast streams over yarnflow's (``yarnflow.connected``): each
PyFlink co-function wrapped as yarnflow's, elements decoded, what it returns or yields
encoded, ``(OutputTag, value)`` pairs sent to side outputs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from yarnflow.common.api.co_functions import (BroadcastProcessFunction as OurBroadcast,
                                              CoProcessFunction as OurCoProcess,
                                              KeyedBroadcastProcessFunction as OurKeyedBroadcast,
                                              KeyedCoProcessFunction as OurKeyedCoProcess)
from yarnflow.common.errors import JobDefinitionError
from yarnflow.pyflink.common.typeinfo import TypeInformation
from yarnflow.pyflink.datastream.records import KEY, decode, encoder
from yarnflow.pyflink.datastream.wrappers import _key_of, _Key, _name, _Sides
from yarnflow.pyflink.datastream.functions import (BroadcastProcessFunction, CoFlatMapFunction, CoMapFunction,
                                                   CoProcessFunction, KeyedBroadcastProcessFunction,
                                                   KeyedCoProcessFunction, KeyedProcessFunction, RuntimeContext)

if TYPE_CHECKING:
    from yarnflow.pyflink.datastream.data_stream import DataStream

__all__ = ["ConnectedStreams", "BroadcastStream", "BroadcastConnectedStream", "CoMapFunction", "CoFlatMapFunction",
           "CoProcessFunction", "KeyedCoProcessFunction", "BroadcastProcessFunction",
           "KeyedBroadcastProcessFunction"]  # (the functions are functions.py's)


class _Context(KeyedProcessFunction.OnTimerContext):
    """PyFlink's context over yarnflow's co-context: the keyed one's, and broadcast state."""

    def get_broadcast_state(self, state_descriptor: Any) -> Any:
        return self._ours.get_broadcast_state(state_descriptor._yarnflow())

    def apply_to_keyed_state(self, state_descriptor: Any, function: Any) -> None:
        self._ours.apply_to_keyed_state(state_descriptor._yarnflow(), function)


class _Co(_Sides):
    """The yarnflow side of any PyFlink co-function: open with state, emit with side outputs."""

    def __init__(self, fn: Any, output_type: TypeInformation | None) -> None:
        super().__init__()
        self.fn = fn
        self.encode = encoder(output_type)

    def open(self, ctx: Any) -> None:
        self.fn.open(RuntimeContext(ctx, self if hasattr(self, "get_state") else None))

    def close(self) -> None:
        self.fn.close()

    def _call(self, method: str, row: dict[str, Any] | None, ctx: Any, out: Any, *args: Any) -> None:
        key = _key_of(row) if row is not None else _key_of({KEY: ctx.current_key})
        values = (decode(row),) if row is not None else args
        self.emit(getattr(self.fn, method)(*values, _Context(ctx, key)), ctx, out)


class _CoMap(_Co, OurCoProcess):
    def process_element1(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        out.collect(self.encode(self.fn.map1(decode(row))))

    def process_element2(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        out.collect(self.encode(self.fn.map2(decode(row))))


class _CoFlatMap(_Co, OurCoProcess):
    def process_element1(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        for v in self.fn.flat_map1(decode(row)) or ():
            out.collect(self.encode(v))

    def process_element2(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        for v in self.fn.flat_map2(decode(row)) or ():
            out.collect(self.encode(v))


class _CoProcess(_Co, OurCoProcess):
    def process_element1(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        self._call("process_element1", row, ctx, out)

    def process_element2(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        self._call("process_element2", row, ctx, out)


class _KeyedCoProcess(_Co, OurKeyedCoProcess):
    def process_element1(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        self._call("process_element1", row, ctx, out)

    def process_element2(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        self._call("process_element2", row, ctx, out)

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        self._call("on_timer", None, ctx, out, timestamp)


class _Broadcast(_Co, OurBroadcast):
    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        self._call("process_element", row, ctx, out)

    def process_broadcast_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        self._call("process_broadcast_element", row, ctx, out)


class _KeyedBroadcast(_Broadcast, OurKeyedBroadcast):
    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        self._call("on_timer", None, ctx, out, timestamp)


class ConnectedStreams:
    def __init__(self, first: DataStream, second: DataStream) -> None:
        self._first, self._second = first, second

    def key_by(self, key_selector1: Any, key_selector2: Any, key_type: Any = None) -> ConnectedStreams:
        a = self._first._ds.map(_Key(key_selector1, "get_key"), name="key_by")
        b = self._second._ds.map(_Key(key_selector2, "get_key"), name="key_by")
        return ConnectedStreams(self._first._derive(a.key_by(KEY), self._first._type),
                                self._second._derive(b.key_by(KEY), self._second._type))

    def _connected(self) -> Any:
        return self._first._ds.connect(self._second._ds)

    def map(self, func: Any, output_type: TypeInformation | None = None) -> DataStream:
        out = self._connected().process(_CoMap(func, output_type), name=_name(func, "Co-Map"))
        return self._first._derive(out, output_type)

    def flat_map(self, func: Any, output_type: TypeInformation | None = None) -> DataStream:
        out = self._connected().process(_CoFlatMap(func, output_type), name=_name(func, "Co-Flat Map"))
        return self._first._derive(out, output_type)

    def process(self, func: Any, output_type: TypeInformation | None = None) -> DataStream:
        keyed = hasattr(self._first._ds, "keys")
        if isinstance(func, KeyedCoProcessFunction) and not keyed:
            raise JobDefinitionError("a KeyedCoProcessFunction needs keyed streams: connect(...).key_by(k1, k2)")
        wrapper = (_KeyedCoProcess if keyed else _CoProcess)(func, output_type)
        return self._first._derive(self._connected().process(wrapper, name=_name(func, "Co-Process")), output_type)


class BroadcastStream:
    def __init__(self, stream: DataStream, descriptors: tuple[Any, ...]) -> None:
        self._stream, self._descriptors = stream, descriptors


class BroadcastConnectedStream:
    def __init__(self, first: DataStream, broadcast: BroadcastStream) -> None:
        self._first, self._broadcast = first, broadcast

    def process(self, func: Any, output_type: TypeInformation | None = None) -> DataStream:
        keyed = hasattr(self._first._ds, "keys")
        if isinstance(func, KeyedBroadcastProcessFunction) and not keyed:
            raise JobDefinitionError("a KeyedBroadcastProcessFunction needs a keyed stream: "
                                     "stream.key_by(...).connect(other.broadcast(descriptor))")
        ours = self._broadcast._stream._ds.broadcast(*(d._yarnflow() for d in self._broadcast._descriptors))
        wrapper = (_KeyedBroadcast if keyed else _Broadcast)(func, output_type)
        out = self._first._ds.connect(ours).process(wrapper, name=_name(func, "Broadcast Process"))
        return self._first._derive(out, output_type)
