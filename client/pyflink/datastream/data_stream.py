"""PyFlink's DataStream and KeyedStream over yarnflow's: each PyFlink function is wrapped in a
callable that decodes a row into the element, calls the function and encodes what it returns
(``records.py``), so the operators, exchanges, state and checkpoints are yarnflow's own."""

from __future__ import annotations

from typing import Any, Iterable

from yarnflow.common.errors import JobDefinitionError
from yarnflow.common.states import Partitioner
from yarnflow.pyflink.common.typeinfo import TypeInformation
from yarnflow.pyflink.datastream.functions import KeyedProcessFunction
from yarnflow.pyflink.datastream.records import KEY, TS
from yarnflow.pyflink.datastream.windowed import AllWindowedStream, WindowedStream
from yarnflow.pyflink.datastream.wrappers import (OutputTag, _AllKey, _decoded, _Filter, _FlatMap, _Fused, _Key,
                                                  _KeyedProcess, _Map, _name, _names, _PartitionKey, _Process,
                                                  _Reduce, _Stamp, _target)

__all__ = ["DataStream", "KeyedStream", "WindowedStream", "AllWindowedStream", "DataStreamSink", "CloseableIterator",
           "OutputTag"]


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
