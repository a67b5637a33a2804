"""User function interfaces: subclass them in a job file.

The objects the runtime passes to them (the ``ctx`` and ``out`` of a KeyedProcessFunction, the
RuntimeContext given to ``open``) are implemented by the TaskExecutor, in
``yarnflow.worker.operators``; here they are described by what a user may call on them."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from yarnflow.common.api.state import StateDescriptor
from yarnflow.common.errors import YarnflowError

__all__ = ["EVENT_TIME", "PROCESSING_TIME", "AggregateFunction", "KeyedProcessFunction"]

ACC = TypeVar("ACC")

#: ``ctx.time_domain`` in ``KeyedProcessFunction.on_timer``: which kind of timer fired
EVENT_TIME = "EVENT_TIME"
PROCESSING_TIME = "PROCESSING_TIME"


class AggregateFunction(Generic[ACC]):
    """An incremental aggregation, as Flink's AggregateFunction: rows are dicts.

    ``get_result`` returns a dict of output columns (or a scalar, put in column 'value')."""

    def create_accumulator(self) -> ACC:
        raise NotImplementedError

    def add(self, row: dict[str, Any], accumulator: ACC) -> ACC:
        raise NotImplementedError

    def get_result(self, accumulator: ACC) -> Any:
        raise NotImplementedError

    def merge(self, a: ACC, b: ACC) -> ACC:
        raise NotImplementedError(f"{type(self).__name__} does not support merge (needed by session windows)")


class ProcessFunction:
    """``stream.process(fn)`` on a stream that is not keyed: ``process_element(row, ctx, out)``
    per row. ``ctx`` has ``timestamp`` (the row's event time, None without one),
    ``timer_service()`` (``current_watermark()``, ``current_processing_time()``; timers need a
    keyed stream), ``output(tag, row)`` for side outputs and ``runtime_context``. Keep state
    across rows in the function, a ``CheckpointedFunction`` so that it survives failures."""

    def open(self, ctx: Any) -> None:
        """Called once per subtask before any row, with its RuntimeContext."""

    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement process_element")

    def close(self) -> None:
        pass


class KeyedProcessFunction:
    """Subclass it and override ``process_element`` (and ``on_timer`` when using timers).

    Rows are dicts of column -> value. ``out.collect(row)`` emits a dict row (a scalar goes in
    column 'value'). ``ctx`` has ``current_key``, ``timestamp`` (the row's event time, or the
    timer's time in ``on_timer``), ``time_domain`` (EVENT_TIME / PROCESSING_TIME in
    ``on_timer``), ``timer_service()``, ``get_state(descriptor)`` and ``output(tag, row)`` for
    side outputs. Keyed state: ``ctx.get_state(descriptor)``, or ``self.get_state(descriptor)``
    (also from ``open``: the state object follows the current key)."""

    def open(self, ctx: Any) -> None:
        """Called once per subtask before any row, with its RuntimeContext (subtask index,
        parallelism, job configuration)."""

    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement process_element")

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def get_state(self, descriptor: StateDescriptor) -> Any:
        """The keyed state of ``descriptor``, following the current key.

        Raises YarnflowError when the function is not (yet) running in a keyed process
        operator: call it from ``open`` or later, not from ``__init__``."""
        backend = getattr(self, "_yarnflow_state_backend", None)
        if backend is None:
            raise YarnflowError(f"{type(self).__name__}.get_state can only be called once the function "
                                f"runs in a keyed process operator (from open() on)")
        return backend.get_state(descriptor)
