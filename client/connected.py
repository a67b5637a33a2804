"""Two connected streams (Flink's ConnectedStreams and BroadcastConnectedStream):

    a.connect(b).map(fn1, fn2)                       # or a CoMapFunction; flat_map likewise
    a.connect(b).process(CoProcessFunction())
    a.connect(b).key_by("k", "k").process(KeyedCoProcessFunction())   # or a.key_by(k).connect(b.key_by(k))
    events.connect(rules.broadcast(RULES)).process(BroadcastProcessFunction())
    events.key_by("k").connect(rules.broadcast(RULES)).process(KeyedBroadcastProcessFunction())

The operator (``worker/operators/co_process.py``) reads the first stream as its input 0 and the
second (or the broadcast stream) as input 1."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from yarnflow.common.api.state import MapStateDescriptor
from yarnflow.common.errors import JobDefinitionError
from yarnflow.common.states import Partitioner
from yarnflow.pipeline import Input, Transformation

if TYPE_CHECKING:
    from yarnflow.datastream import DataStream

__all__ = ["BroadcastConnectedStream", "BroadcastStream", "ConnectedStreams"]


def _input(stream: DataStream, index: int, partitioner: Partitioner | None = None,
           keys: tuple[str, ...] | None = None) -> Input:
    return Input(stream.transformation, partitioner or stream._partitioner,
                 stream._keys if keys is None else keys, stream._tag, index)


def _co_stream(first: DataStream, op: Any, inputs: list[Input]) -> DataStream:
    t = Transformation(op, inputs, slot_sharing_group=first.transformation.slot_sharing_group,
                       event_time_column=first.transformation.event_time_column)
    return first._stream(t)


def _pair(fn: Any, fn2: Any, names: tuple[str, str], what: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """Two per-row callables from a Co*Function (``names``: its two methods) or two functions."""
    if fn2 is None:
        if isinstance(fn, type) or not all(callable(getattr(fn, n, None)) for n in names):
            raise JobDefinitionError(f"connected {what} needs a Co{what.title().replace('_', '')}Function "
                                     f"(with {' and '.join(names)}) or two functions")
        return getattr(fn, names[0]), getattr(fn, names[1])
    if not callable(fn) or not callable(fn2):
        raise JobDefinitionError(f"connected {what}: both functions must be callable")
    return fn, fn2


class ConnectedStreams:
    """Two streams connected: each keeps its own rows (and schema); one operator sees both."""

    def __init__(self, first: DataStream, second: DataStream) -> None:
        if first.env is not second.env:
            raise JobDefinitionError("connect of streams from different environments")
        self.first, self.second = first, second

    def key_by(self, key1: str | tuple[str, ...], key2: str | tuple[str, ...]) -> ConnectedStreams:
        """Partition both streams by key (``key1`` columns of the first, ``key2`` of the second):
        rows of one key meet in one subtask."""
        k1 = (key1,) if isinstance(key1, str) else tuple(key1)
        k2 = (key2,) if isinstance(key2, str) else tuple(key2)
        if not k1 or len(k1) != len(k2):
            raise JobDefinitionError("connected key_by needs the same (non-zero) number of key columns on both sides")
        return ConnectedStreams(self.first.key_by(*k1), self.second.key_by(*k2))

    def _keys(self) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        k1, k2 = getattr(self.first, "keys", None), getattr(self.second, "keys", None)
        if (k1 is None) != (k2 is None):
            raise JobDefinitionError("connected streams: key both streams (key_by on each, or "
                                     "connect(...).key_by(k1, k2)), or neither")
        if k1 is not None and len(k1) != len(k2):  # type: ignore[arg-type]
            raise JobDefinitionError(f"connected streams are keyed by {len(k1)} and {len(k2)} columns: use the "  # type: ignore[arg-type]
                                     "same number")
        return (k1, k2) if k1 is not None else None  # type: ignore[return-value]

    def _op(self, op: Any) -> DataStream:
        return _co_stream(self.first, op, [_input(self.first, 0), _input(self.second, 1)])

    def _times(self) -> tuple[str | None, str | None]:
        return self.first.transformation.event_time_column, self.second.transformation.event_time_column

    def map(self, fn: Any, fn2: Any = None, name: str | None = None) -> DataStream:
        """``map1`` / ``map2`` of a CoMapFunction (or two functions) per row of each stream."""
        from yarnflow.worker.operators.co_process import CoMapAdapter, CoProcessOperator

        f1, f2 = _pair(fn, fn2, ("map1", "map2"), "map")
        return self._op(CoProcessOperator(CoMapAdapter(f1, f2), self._keys(), time_columns=self._times(),
                                          name=name or "co-map"))

    def flat_map(self, fn: Any, fn2: Any = None, name: str | None = None) -> DataStream:
        """``flat_map1`` / ``flat_map2`` of a CoFlatMapFunction (or two functions returning rows)."""
        from yarnflow.worker.operators.co_process import CoFlatMapAdapter, CoProcessOperator

        f1, f2 = _pair(fn, fn2, ("flat_map1", "flat_map2"), "flat_map")
        return self._op(CoProcessOperator(CoFlatMapAdapter(f1, f2), self._keys(), time_columns=self._times(),
                                          name=name or "co-flat-map"))

    def map_batches(self, fn1: Any, fn2: Any, name: str | None = None) -> DataStream:
        """The vectorised co-map: ``fn1`` / ``fn2`` take a RecordBatch of their stream and return
        a RecordBatch or Table."""
        from yarnflow.worker.operators.co_process import CoMapBatches

        return self._op(CoMapBatches(fn1, fn2, name))

    def process(self, fn: Any, name: str | None = None) -> DataStream:
        """A CoProcessFunction, or a KeyedCoProcessFunction when both streams are keyed."""
        from yarnflow.common.api.co_functions import KeyedCoProcessFunction
        from yarnflow.worker.operators.co_process import CoProcessOperator

        keys = self._keys()
        if isinstance(fn, KeyedCoProcessFunction) and keys is None:
            raise JobDefinitionError("a KeyedCoProcessFunction needs keyed streams: connect(...).key_by(k1, k2)")
        return self._op(CoProcessOperator(fn, keys, time_columns=self._times(), name=name or type(fn).__name__))


class BroadcastStream:
    """``stream.broadcast(descriptor, ...)``: every row goes to every subtask of the operator it
    is connected to, which keeps the declared broadcast state."""

    def __init__(self, stream: DataStream, descriptors: tuple[MapStateDescriptor, ...]) -> None:
        for d in descriptors:
            if not isinstance(d, MapStateDescriptor):
                raise JobDefinitionError(f"broadcast state is declared with MapStateDescriptor, got {d!r}")
        if len({d.name for d in descriptors}) != len(descriptors):
            raise JobDefinitionError("broadcast state descriptors need distinct names")
        self.stream, self.descriptors = stream, descriptors
        self.env = stream.env


class BroadcastConnectedStream:
    """A stream connected to a BroadcastStream: ``process(BroadcastProcessFunction)`` or, when
    the stream is keyed, ``process(KeyedBroadcastProcessFunction)``."""

    def __init__(self, first: DataStream, broadcast: BroadcastStream) -> None:
        if first.env is not broadcast.env:
            raise JobDefinitionError("connect of streams from different environments")
        self.first, self.broadcast = first, broadcast

    def process(self, fn: Any, name: str | None = None) -> DataStream:
        from yarnflow.common.api.co_functions import KeyedBroadcastProcessFunction
        from yarnflow.worker.operators.co_process import CoProcessOperator

        keys = getattr(self.first, "keys", None)
        if isinstance(fn, KeyedBroadcastProcessFunction) and keys is None:
            raise JobDefinitionError("a KeyedBroadcastProcessFunction needs a keyed stream: "
                                     "stream.key_by(k).connect(rules.broadcast(descriptor))")
        b = self.broadcast.stream
        op = CoProcessOperator(fn, (keys, None) if keys is not None else None, broadcast=self.broadcast.descriptors,
                               time_columns=(self.first.transformation.event_time_column,
                                             b.transformation.event_time_column),
                               name=name or type(fn).__name__)
        return _co_stream(self.first, op, [_input(self.first, 0), _input(b, 1, Partitioner.BROADCAST, ())])


class IntervalJoin:
    """``a.key_by(k).interval_join(b.key_by(k)).between(lower_ms, upper_ms)[.lower_bound_exclusive()]
    [.upper_bound_exclusive()][.side_output_left_late_data(tag)][.side_output_right_late_data(tag)]
    .process(fn=None)``: each row of ``a`` at event time ``ta`` with each row of ``b`` of its key at
    ``ta + lower <= tb <= ta + upper`` (``worker/operators/interval_join.py``). Both streams need
    event time (``assign_timestamps_and_watermarks``)."""

    def __init__(self, left: DataStream, right: DataStream) -> None:
        if getattr(left, "keys", None) is None or getattr(right, "keys", None) is None:
            raise JobDefinitionError("interval_join joins two keyed streams: a.key_by(k).interval_join(b.key_by(k))")
        for side, s in (("left", left), ("right", right)):
            if not s.transformation.event_time_column:
                raise JobDefinitionError(f"interval_join needs event time on the {side} stream: "
                                         "assign_timestamps_and_watermarks(...) before key_by")
        self._connected = ConnectedStreams(left, right)
        self._bounds: tuple[int, int] | None = None
        self._exclusive = [False, False]
        self._late: list[str | None] = [None, None]

    def between(self, lower_ms: int, upper_ms: int) -> IntervalJoin:
        if not isinstance(lower_ms, int) or not isinstance(upper_ms, int) or lower_ms > upper_ms:
            raise JobDefinitionError(f"interval_join between({lower_ms!r}, {upper_ms!r}): two whole numbers of ms, "
                                     "the lower one first")
        self._bounds = (lower_ms, upper_ms)
        return self

    def lower_bound_exclusive(self) -> IntervalJoin:
        self._exclusive[0] = True
        return self

    def upper_bound_exclusive(self) -> IntervalJoin:
        self._exclusive[1] = True
        return self

    def side_output_left_late_data(self, tag: str) -> IntervalJoin:
        self._late[0] = tag
        return self

    def side_output_right_late_data(self, tag: str) -> IntervalJoin:
        self._late[1] = tag
        return self

    def process(self, fn: Any = None, name: str = "interval join") -> DataStream:
        from yarnflow.worker.operators.interval_join import interval_function

        if self._bounds is None:
            raise JobDefinitionError("interval_join needs between(lower_ms, upper_ms) before process()")
        (lower, upper), (lower_exclusive, upper_exclusive) = self._bounds, self._exclusive
        join = interval_function(lower, upper, lower_exclusive, upper_exclusive, fn, (self._late[0], self._late[1]))
        return self._connected.process(join, name=name)
