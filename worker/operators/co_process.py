"""Two-input operators of the DataStream API (user API: ``common/api/co_functions.py``): one
operator runs a CoProcessFunction, a KeyedCoProcessFunction, a BroadcastProcessFunction or a
KeyedBroadcastProcessFunction (and CoMap / CoFlatMap functions, through an adapter), row by row.

- Input 0 and input 1 are the two connected streams; with broadcast state input 1 is the
  broadcast stream (every subtask reads all of it).
- Keyed (``keys`` given, a list of key columns per keyed input): each row's key comes from its
  input's key columns; the rows of one key (from both inputs) share its keyed state and timers,
  in the job's keyed state backend, scoped to key groups as ``KeyedProcessOperator``'s. Timers
  fire as there: event-time ones when the watermark (the minimum of both inputs') reaches them,
  processing-time ones from ``on_processing_time``.
- Broadcast state: one dict per declared ``MapStateDescriptor``, in the subtask's operator state
  (``worker/state/operator_state.py``), writable while a broadcast row is processed, read-only
  otherwise.
- A function that is also a ``CheckpointedFunction`` gets the operator state store
  (``initialize_state`` before ``open``; ``snapshot_state`` at each checkpoint).

Output rows are buffered and emitted as batches after each input batch and after timers fire;
side outputs through ``ctx.output(tag, row)``."""

from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa

from yarnflow.common.api.co_functions import CheckpointedFunction
from yarnflow.common.api.functions import EVENT_TIME, PROCESSING_TIME
from yarnflow.common.api.state import MapStateDescriptor, StateDescriptor, StateDescriptorError, StateError
from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.elements import Watermark
from yarnflow.worker.key_assignment import key_groups
from yarnflow.worker.operators.base import Output, RuntimeContext, TwoInputOperator
from yarnflow.worker.operators.checkpointed import InitContext
from yarnflow.worker.operators.keyed import key_tuples, keyed_backend
from yarnflow.worker.operators.process import BufferedOutputs, Collector
from yarnflow.worker.operators.rows import RowBuffer, row_dicts
from yarnflow.worker.operators.timestamps import event_times_ms
from yarnflow.worker.state.operator_state import OperatorStateStore, ReadOnlyBroadcastState
from yarnflow.worker.state.tables import AsyncSnapshot, Snapshot

__all__ = ["CoFlatMapAdapter", "CoMapAdapter", "CoMapBatches", "CoProcessOperator"]

_METHODS = {False: ("process_element1", "process_element2"), True: ("process_element", "process_broadcast_element")}


class CoMapAdapter:
    """A CoMapFunction (or two functions) run as a CoProcessFunction."""

    def __init__(self, fn1: Any, fn2: Any) -> None:
        self.fn1, self.fn2 = fn1, fn2

    def open(self, ctx: Any) -> None:
        for fn in {id(self.fn1): self.fn1, id(self.fn2): self.fn2}.values():
            if callable(getattr(fn, "open", None)):
                fn.open(ctx)

    def close(self) -> None:
        for fn in {id(self.fn1): self.fn1, id(self.fn2): self.fn2}.values():
            if callable(getattr(fn, "close", None)):
                fn.close()

    def process_element1(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        out.collect(self.fn1(row))

    def process_element2(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        out.collect(self.fn2(row))


class CoFlatMapAdapter(CoMapAdapter):
    """A CoFlatMapFunction (or two functions returning iterables) run as a CoProcessFunction."""

    def process_element1(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        for r in self.fn1(row) or ():
            out.collect(r)

    def process_element2(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        for r in self.fn2(row) or ():
            out.collect(r)


class CoMapBatches(TwoInputOperator):
    """``connected.map_batches(fn1, fn2)``: the vectorised co-map, a RecordBatch of input 1 to
    ``fn1`` and one of input 2 to ``fn2`` (each returns a RecordBatch or Table); watermarks are
    the minimum of both inputs'."""

    kind = "co_map_batches"

    def __init__(self, fn1: Any, fn2: Any, name: str | None = None) -> None:
        super().__init__(name or "co-map-batches")
        if not callable(fn1) or not callable(fn2):
            raise JobDefinitionError(f"operator '{self.name}': map_batches needs two functions of a RecordBatch")
        self.fns = (fn1, fn2)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        from yarnflow.worker.operators.transforms import to_batches

        for out in to_batches(self.call_user(self.fns[1 if input_index else 0], batch), self.name):
            if out.num_rows:
                self.output.collect(out)


class _TimerService:
    def __init__(self, op: CoProcessOperator) -> None:
        self._op = op

    def _timers(self) -> Any:
        if self._op._timers is None:
            raise StateError(f"operator '{self._op.name}': timers need keyed streams (key_by both inputs, or the "
                             "non-broadcast one)")
        if self._op._context.current_key is None:
            raise StateError(f"operator '{self._op.name}': no current key here (a broadcast row has none)")
        return self._op._timers

    def register_event_time_timer(self, timestamp: int) -> None:
        self._timers().register(EVENT_TIME, int(timestamp))

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._timers().register(PROCESSING_TIME, int(timestamp))

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._timers().delete(EVENT_TIME, int(timestamp))

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._timers().delete(PROCESSING_TIME, int(timestamp))

    def current_watermark(self) -> int:
        return self._op.current_watermark

    def current_processing_time(self) -> int:
        return int(self._op.ctx.clock())


class CoContext:
    """``ctx`` of the functions' methods (see ``common/api/co_functions.py``)."""

    def __init__(self, op: CoProcessOperator) -> None:
        self._op = op
        self._timer_service = _TimerService(op)
        self.current_key: Any = None
        self.timestamp: int | None = None
        self.time_domain: str | None = None
        self._broadcast_side = False

    @property
    def runtime_context(self) -> RuntimeContext:
        return self._op.ctx

    def timer_service(self) -> _TimerService:
        return self._timer_service

    def get_state(self, descriptor: StateDescriptor) -> Any:
        if self._op._backend is None:
            raise StateError(f"operator '{self._op.name}': keyed state needs keyed streams")
        return self._op._backend.get_state(descriptor)

    def output(self, tag: str, row: Any) -> None:
        self._op._side_buffer(tag).add(row)

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> Any:
        if not any(d.name == getattr(descriptor, "name", None) for d in self._op.broadcast_states):
            raise StateDescriptorError(f"operator '{self._op.name}': broadcast state {descriptor!r} was not given to "
                                       f"broadcast(); it has {[d.name for d in self._op.broadcast_states]}")
        state = self._op.operator_state.get_broadcast_state(descriptor)
        return state if self._broadcast_side else ReadOnlyBroadcastState(state)

    def apply_to_keyed_state(self, descriptor: StateDescriptor, fn: Any) -> None:
        """``fn(key, state)`` for every key of this subtask with a value in ``descriptor``'s state
        (keyed broadcast functions, in process_broadcast_element)."""
        backend = self._op._backend
        if backend is None or not self._broadcast_side:
            raise StateError(f"operator '{self._op.name}': apply_to_keyed_state is for process_broadcast_element "
                             "of a KeyedBroadcastProcessFunction")
        state = backend.get_state(descriptor)
        for kg, key, _ in list(backend.entries(descriptor.name)):
            backend.set_current_key(key, kg)
            fn(key[0] if len(key) == 1 else key, state)


class CoProcessOperator(BufferedOutputs, TwoInputOperator):
    """``connect()``: ``fn`` per row of either input (see the module doc). ``keys``: the key
    columns of input 0 and of input 1 (None for an input that is not keyed: the broadcast one);
    ``broadcast``: the broadcast state descriptors (input 1 is then the broadcast stream);
    ``time_columns``: each input's event-time column."""

    kind = "co_process"

    def __init__(self, fn: Any, keys: tuple[Sequence[str] | None, Sequence[str] | None] | None = None,
                 broadcast: Sequence[MapStateDescriptor] = (), time_columns: tuple[str | None, str | None] = (None, None),
                 name: str | None = None) -> None:
        super().__init__(name or type(fn).__name__)
        self.broadcast_states = tuple(broadcast)
        for method in _METHODS[bool(self.broadcast_states)]:
            if isinstance(fn, type) or not callable(getattr(fn, method, None)):
                raise JobDefinitionError(f"operator '{self.name}' needs a function with {method}, got {fn!r}")
        for d in self.broadcast_states:
            if not isinstance(d, MapStateDescriptor):
                raise JobDefinitionError(f"operator '{self.name}': broadcast state is declared with "
                                         f"MapStateDescriptor, got {d!r}")
        self.fn = fn
        self.keys = tuple(list(k) if k else None for k in keys) if keys else (None, None)
        self.keyed = self.keys[0] is not None
        if self.keyed and not self.broadcast_states and self.keys[1] is None:
            raise JobDefinitionError(f"operator '{self.name}': key both connected streams, or neither")
        self.time_columns = time_columns
        self.processing_time_interval_ms = 50 if self.keyed else None

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        self._backend = keyed_backend(ctx) if self.keyed else None
        self._timers = self._backend.timer_service("__timers__") if self._backend is not None else None
        self.operator_state = OperatorStateStore(ctx.subtask_index, ctx.parallelism, self.name)
        self._main = RowBuffer(self.name)
        self._sides: dict[str, RowBuffer] = {}
        self._context = CoContext(self)
        self._collector = Collector(self._main)

    def open(self) -> None:
        if self._backend is not None:
            self.fn._yarnflow_state_backend = self._backend
        if isinstance(self.fn, CheckpointedFunction):
            self.call_user(self.fn.initialize_state, InitContext(self.operator_state))
        if callable(getattr(self.fn, "open", None)):
            self.call_user(self.fn.open, self.ctx)

    # -- input ---------------------------------------------------------------------------------
    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if batch.num_rows == 0:
            return
        side = 1 if input_index else 0
        keys, time_column = self.keys[side], self.time_columns[side]
        for column in [*(keys or ()), *([time_column] if time_column else [])]:
            if batch.schema.get_field_index(column) < 0:
                raise JobDefinitionError(f"operator '{self.name}': input {side + 1} has no column {column!r}; it has "
                                         f"{batch.schema.names}")
        method = getattr(self.fn, _METHODS[bool(self.broadcast_states)][side])
        context, collector, backend = self._context, self._collector, self._backend
        context._broadcast_side = bool(self.broadcast_states) and side == 1
        context.time_domain = None
        rows = row_dicts(batch)
        times = event_times_ms(batch, time_column, self.name).tolist() if time_column else [None] * len(rows)
        if keys is not None and backend is not None:
            groups = key_groups(batch, keys, self.ctx.max_parallelism).tolist()
            tuples = list(key_tuples(batch, keys))
        for lo, hi in self.row_slices(len(rows)):
            for i in range(lo, hi):
                if keys is not None and backend is not None:
                    key = tuples[i]
                    backend.set_current_key(key, groups[i])
                    context.current_key = key[0] if len(key) == 1 else key
                else:
                    context.current_key = None
                context.timestamp = times[i]
                try:
                    method(rows[i], context, collector)
                except Exception as exc:
                    raise self.user_error(method, exc) from exc
        context._broadcast_side = False
        self._flush()

    # -- time ------------------------------------------------------------------------------------
    def _fire(self, ts: int, kg: int, key: tuple[Any, ...], domain: str) -> None:
        assert self._backend is not None
        self._backend.set_current_key(key, kg)
        self._context.current_key = key[0] if len(key) == 1 else key
        self._context.timestamp, self._context.time_domain = ts, domain
        self.call_user(self.fn.on_timer, ts, self._context, self._collector)

    def on_watermark(self, timestamp: int) -> None:
        if self._timers is not None:
            while (timer := self._timers.pop_next(EVENT_TIME, timestamp)) is not None:
                self._fire(timer[0], timer[1], timer[2], EVENT_TIME)
            self._flush()
        self.output.emit_watermark(Watermark(timestamp))

    def on_processing_time(self, now_ms: int) -> None:
        if self._timers is None:
            return
        for timer in self._timers.due(PROCESSING_TIME, now_ms):
            if self._timers.take(PROCESSING_TIME, timer):
                self._fire(timer[0], timer[1], timer[2], PROCESSING_TIME)
        self._flush()

    def finish(self) -> None:
        if self._timers is not None:  # timers registered at or below the watermark since it came
            while (timer := self._timers.pop_next(EVENT_TIME, self.current_watermark)) is not None:
                self._fire(timer[0], timer[1], timer[2], EVENT_TIME)
        self._flush()

    def close(self) -> None:
        if callable(getattr(self.fn, "close", None)):
            self.call_user(self.fn.close)

    # -- state -----------------------------------------------------------------------------------
    def snapshot_state(self, checkpoint_id: int) -> Snapshot:
        if isinstance(self.fn, CheckpointedFunction):
            self.call_user(self.fn.snapshot_state, InitContext(self.operator_state, checkpoint_id))
        tables = self.operator_state.snapshot()
        if self._backend is None:
            return tables
        keyed = self._backend.snapshot()
        return keyed.with_tables(tables) if isinstance(keyed, AsyncSnapshot) else {**keyed, **tables}

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        rest = self.operator_state.restore(state)
        if self._backend is not None:
            self._backend.restore(rest)

    @property
    def pending_timers(self) -> dict[str, int]:
        if self._timers is None:
            return {EVENT_TIME: 0, PROCESSING_TIME: 0}
        return {EVENT_TIME: self._timers.count(EVENT_TIME), PROCESSING_TIME: self._timers.count(PROCESSING_TIME)}
