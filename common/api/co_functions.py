"""User functions of two-input streams and of operator state, as Flink's DataStream API has them:
``a.connect(b)`` (CoMapFunction, CoFlatMapFunction, CoProcessFunction; keyed:
KeyedCoProcessFunction), the broadcast state pattern (``a.connect(rules.broadcast(descriptor))``:
BroadcastProcessFunction; keyed: KeyedBroadcastProcessFunction) and CheckpointedFunction
(operator state: list and union-list state, and the state a function keeps of its own).

Rows are dicts. The ``ctx`` and ``out`` objects the runtime passes in are the TaskExecutor's
(``yarnflow.worker.operators.co_process``); here they are described by what a user may call."""

from __future__ import annotations

from typing import Any, Iterable

from yarnflow.common.api.state import StateDescriptor
from yarnflow.common.errors import YarnflowError

__all__ = [
    "BroadcastProcessFunction",
    "CheckpointedFunction",
    "CoFlatMapFunction",
    "CoMapFunction",
    "CoProcessFunction",
    "KeyedBroadcastProcessFunction",
    "KeyedCoProcessFunction",
    "ProcessJoinFunction",
    "SourceFunction",
]


class _Function:
    def open(self, ctx: Any) -> None:
        """Called once per subtask before any row, with its RuntimeContext."""

    def close(self) -> None:
        pass


class CoMapFunction(_Function):
    """``connected.map(fn)``: ``map1`` for each row of the first stream, ``map2`` for each of the
    second; each returns one row (a dict, or a scalar kept in column 'value')."""

    def map1(self, row: dict[str, Any]) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement map1")

    def map2(self, row: dict[str, Any]) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement map2")


class CoFlatMapFunction(_Function):
    """``connected.flat_map(fn)``: ``flat_map1`` / ``flat_map2`` return any number of rows."""

    def flat_map1(self, row: dict[str, Any]) -> Iterable[Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement flat_map1")

    def flat_map2(self, row: dict[str, Any]) -> Iterable[Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement flat_map2")


class CoProcessFunction(_Function):
    """``connected.process(fn)`` on two streams that are not keyed: ``process_element1`` for the
    first stream's rows, ``process_element2`` for the second's. ``ctx`` has ``timestamp`` (the
    row's event time, None without one), ``timer_service()`` (the current watermark and
    processing time; timers need keyed streams), ``output(tag, row)`` and ``runtime_context``;
    ``out.collect(row)`` emits. Shared state across the two inputs lives in the function
    itself: make it a ``CheckpointedFunction`` so that it survives failures."""

    def process_element1(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement process_element1")

    def process_element2(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement process_element2")


class _Keyed(_Function):
    def get_state(self, descriptor: StateDescriptor) -> Any:
        """The keyed state of ``descriptor``, following the current key (from ``open`` on)."""
        backend = getattr(self, "_yarnflow_state_backend", None)
        if backend is None:
            raise YarnflowError(f"{type(self).__name__}.get_state can only be called once the function "
                                "runs in its operator (from open() on)")
        return backend.get_state(descriptor)

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        pass


class KeyedCoProcessFunction(_Keyed):
    """``a.connect(b).key_by(key_a, key_b).process(fn)`` (or ``a.key_by(k).connect(b.key_by(k))``):
    the rows of both streams with one key go to the same subtask, and share that key's state and
    timers. ``ctx`` also has ``current_key``, ``get_state(descriptor)``, ``time_domain`` (in
    ``on_timer``) and a timer service that registers event- and processing-time timers."""

    def process_element1(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement process_element1")

    def process_element2(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement process_element2")


class BroadcastProcessFunction(_Function):
    """``stream.connect(rules.broadcast(descriptor, ...)).process(fn)``: every row of the
    broadcast stream reaches every subtask (``process_broadcast_element``, where
    ``ctx.get_broadcast_state(descriptor)`` may be changed); the other stream's rows
    (``process_element``) may only read it. Every subtask must change its broadcast state the
    same way for the same rows, as in Flink: the state is checkpointed per subtask and a
    rescaled job gives each new subtask a copy."""

    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement process_element")

    def process_broadcast_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement process_broadcast_element")


class KeyedBroadcastProcessFunction(_Keyed):
    """``stream.key_by(k).connect(rules.broadcast(descriptor)).process(fn)``: as
    BroadcastProcessFunction, with the keyed stream's state and timers in ``process_element`` and
    ``on_timer`` (``ctx.current_key``, ``ctx.get_state``, ``ctx.timer_service()``), and
    ``ctx.apply_to_keyed_state(descriptor, fn)`` in ``process_broadcast_element``: ``fn(key,
    state)`` for every key of this subtask with a value in that state."""

    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement process_element")

    def process_broadcast_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement process_broadcast_element")


class CheckpointedFunction:
    """Mix it into a user function for operator state (Flink's CheckpointedFunction):
    ``initialize_state(ctx)`` is called before ``open`` (``ctx.is_restored()``, and
    ``ctx.get_operator_state_store()`` with ``get_list_state(descriptor)`` and
    ``get_union_list_state(descriptor)``); ``snapshot_state(ctx)`` at each checkpoint
    (``ctx.checkpoint_id``), where the function puts what it holds into its list states. On a
    rescale, list state is split evenly over the new subtasks, union-list state given whole to
    each of them."""

    def initialize_state(self, ctx: Any) -> None:
        pass

    def snapshot_state(self, ctx: Any) -> None:
        pass


class ProcessJoinFunction:
    """Subclass it and override ``process_element(left, right, ctx, out)``: called for each
    joined pair of an interval join (Flink's ProcessJoinFunction)."""

    def open(self, ctx: Any) -> None:
        pass

    def process_element(self, left: dict[str, Any], right: dict[str, Any], ctx: Any, out: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement process_element")

    def close(self) -> None:
        pass


class SourceFunction:
    """A source of your own (Flink's SourceFunction, parallel: ``env.add_source(fn)`` runs one
    instance per subtask; ``set_parallelism(1)`` for a single one). ``run(ctx)`` emits rows with
    ``ctx.collect(row)`` until it returns (the end of its input) or ``ctx.is_cancelled()`` says
    to stop; ``ctx.runtime_context`` has the subtask index and parallelism. Mix in
    ``CheckpointedFunction`` for state: a checkpoint is taken only inside ``ctx.collect`` (before
    the row it is given is emitted) or ``ctx.sleep``, so the function's state always matches the
    rows emitted before it: update it right after each ``collect``, as Flink's checkpoint lock
    has you do."""

    def open(self, ctx: Any) -> None:
        pass

    def run(self, ctx: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement run")

    def close(self) -> None:
        pass
