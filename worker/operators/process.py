"""Keyed process functions and keyed AggregateFunctions on a hash-partitioned stream.

``KeyedProcessOperator`` runs a user ``KeyedProcessFunction`` (user API, in
``yarnflow.common.api``) row by row, passing it the ``ctx`` and ``out`` defined here
(ProcessContext, TimerService, Collector): for each row it sets the current key (keyed state
and timers are scoped to it) and calls ``process_element``.
Rows given to ``out.collect`` (and side-output rows given to ``ctx.output``) are buffered and
emitted as record batches after each input batch, after timers fire, and at the end; the
first emitted batch fixes the output's schema (each side output has its own).

Timers are per (key, timestamp): registering one twice is one timer.

- Event-time timers fire, in timestamp order, when a watermark reaches them; their output is
  emitted before the watermark is forwarded downstream. A timer registered at or below the
  current watermark fires at the next watermark (or at ``finish``). At ``finish`` only timers
  the watermark reached fire: a bounded input sends MAX_WATERMARK before it ends, so all of
  them fire; an input that ends without it leaves later timers unfired.
- Processing-time timers fire from ``on_processing_time`` (the task calls it about every
  ``processing_time_interval_ms``) once the processing time reaches them. Timers registered
  while they fire wait for the next call. They never fire at ``finish``: the job ending is not
  a point in processing time, so pending processing-time timers are dropped with the operator.

``KeyedAggregateFunctionOperator`` folds each key's rows with a user AggregateFunction: in
BATCH mode it emits one row per key when the input ends, in STREAMING mode the updated result
of every key a batch touched, after that batch (an upsert stream).

Keyed state and timers live in the operator's keyed state backend
(``yarnflow.worker.state.heap``), scoped to key groups: ``snapshot_state`` is the backend's
copy-on-write snapshot (tables ``keyed_state`` and ``timers``, made off the task thread) and
``initialize_state`` keeps the rows of this subtask's key-group range.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Sequence

import pyarrow as pa

from yarnflow.common.api.functions import (EVENT_TIME, PROCESSING_TIME, AggregateFunction, KeyedProcessFunction,
                                          ProcessFunction)
from yarnflow.common.api.co_functions import CheckpointedFunction
from yarnflow.common.api.state import StateDescriptor
from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.operators.base import Operator, Output, RuntimeContext
from yarnflow.worker.operators.keyed import DistinctKeys, KeyRecords, key_tuples, keyed_backend
from yarnflow.worker.operators.rows import RowBuffer, column_lists, gc_paused, row_dicts
from yarnflow.worker.operators.timestamps import MissingEventTimeError, event_times_ms
from yarnflow.worker.elements import Watermark
from yarnflow.worker.key_assignment import key_groups
from yarnflow.worker.state.heap import ABSENT, HeapKeyedStateBackend
from yarnflow.worker.operators.checkpointed import FunctionState
from yarnflow.worker.state.tables import AsyncSnapshot, Snapshot

__all__ = [
    "Collector",
    "KeyedAggregateFunctionOperator",
    "KeyedProcessOperator",
    "MissingEventTimeError",
    "ProcessContext",
    "TimerService",
]

_MIN_WATERMARK = -(2**63)


# --------------------------------------------------------------------------- what user functions are given


class Collector:
    """``out`` of process_element / on_timer."""

    def __init__(self, buffer: RowBuffer) -> None:
        self._buffer = buffer

    def collect(self, row: Any) -> None:
        self._buffer.add(row)


class TimerService:
    """Timers of the current key, in ms. Registering an existing timer does nothing; deleting
    a missing one does nothing."""

    def __init__(self, op: KeyedProcessOperator) -> None:
        self._op = op

    def register_event_time_timer(self, timestamp: int) -> None:
        self._op._timers.register(EVENT_TIME, int(timestamp))

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._op._timers.register(PROCESSING_TIME, int(timestamp))

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._op._timers.delete(EVENT_TIME, int(timestamp))

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._op._timers.delete(PROCESSING_TIME, int(timestamp))

    def current_watermark(self) -> int:
        return self._op.current_watermark

    def current_processing_time(self) -> int:
        return int(self._op.ctx.clock())


class ProcessContext:
    """``ctx`` of process_element / on_timer.

    ``current_key``: the key (a scalar for a one-column key, else a tuple). ``timestamp``: the
    row's event time (None without a time column), or the timer's time in on_timer.
    ``time_domain``: EVENT_TIME / PROCESSING_TIME in on_timer, None in process_element."""

    def __init__(self, op: KeyedProcessOperator) -> None:
        self._op = op
        self._timers = TimerService(op)
        self.current_key: Any = None
        self.timestamp: int | None = None
        self.time_domain: str | None = None

    def _set(self, key: tuple[Any, ...], timestamp: int | None, domain: str | None) -> None:
        self.current_key = key[0] if len(key) == 1 else key
        self.timestamp = timestamp
        self.time_domain = domain

    @property
    def runtime_context(self) -> RuntimeContext:
        return self._op.ctx

    def timer_service(self) -> TimerService:
        return self._timers

    def get_state(self, descriptor: StateDescriptor) -> Any:
        return self._op._backend.get_state(descriptor)

    def output(self, tag: str, row: Any) -> None:
        """Emit ``row`` on the side output ``tag``."""
        self._op._side_buffer(tag).add(row)


# --------------------------------------------------------------------------- internals


class BufferedOutputs:
    """Rows buffered (``_main`` and a RowBuffer per side output tag in ``_sides``, made in the
    operator's setup) and emitted as batches by ``_flush``: the user-function operators' output."""

    name: str
    ctx: RuntimeContext
    output: Output
    _main: RowBuffer
    _sides: dict[str, RowBuffer]

    def _side_buffer(self, tag: str) -> RowBuffer:
        buffer = self._sides.get(tag)
        if buffer is None:
            if not isinstance(tag, str) or not tag:
                raise JobDefinitionError(f"operator '{self.name}': a side output tag must be a non-empty "
                                         f"string, got {tag!r}")
            buffer = self._sides[tag] = RowBuffer(self.name, f"side output {tag!r}")
        return buffer

    def _flush(self) -> None:
        for batch in self._main.drain(self.ctx.batch_size):
            self.output.collect(batch)
        for tag, buffer in self._sides.items():
            for batch in buffer.drain(self.ctx.batch_size):
                self.output.collect_side(tag, batch)


class _KeyedOperator(BufferedOutputs, Operator):
    """Key extraction, the keyed state backend and output buffering shared by keyed operators."""

    def __init__(self, keys: Sequence[str], name: str | None = None) -> None:
        super().__init__(name)
        if isinstance(keys, str):
            keys = [keys]
        if not keys or not all(isinstance(k, str) for k in keys):
            raise JobDefinitionError(f"operator '{self.name}' needs at least one key column name, got {keys!r}")
        self.keys = list(keys)

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        self._backend = keyed_backend(ctx)
        self._main = RowBuffer(self.name)
        self._sides: dict[str, RowBuffer] = {}

    @property
    def state_backend(self) -> HeapKeyedStateBackend:
        return self._backend

    def _check_columns(self, schema: pa.Schema, extra: Iterable[str] = ()) -> None:
        for column in [*self.keys, *extra]:
            if schema.get_field_index(column) < 0:
                raise JobDefinitionError(f"operator '{self.name}': column {column!r} does not exist; "
                                         f"the input has columns {schema.names}")

    def _keyed_rows(self, batch: pa.RecordBatch) -> Iterable[tuple[int, dict[str, Any], int, tuple[Any, ...]]]:
        """(row index, row, key group, key) per row."""
        groups = key_groups(batch, self.keys, self.ctx.max_parallelism).tolist()
        return zip(itertools.count(), row_dicts(batch), groups, key_tuples(batch, self.keys))

    def snapshot_state(self, checkpoint_id: int) -> Snapshot:
        """The keyed state backend's snapshot (see ``yarnflow.worker.state.heap``)."""
        return self._backend.snapshot()

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        self._backend.restore(state)


# --------------------------------------------------------------------------- operators


class KeyedProcessOperator(_KeyedOperator):
    """``key_by(keys).process(fn)``: a KeyedProcessFunction with keyed state and timers.

    ``time_column`` (optional) gives each row's event time (integer ms, timestamp or date) as
    ``ctx.timestamp``; a null there raises MissingEventTimeError."""

    kind = "keyed_process"
    processing_time_interval_ms = 50

    def __init__(self, keys: Sequence[str], fn: KeyedProcessFunction, time_column: str | None = None,
                 name: str | None = None) -> None:
        super().__init__(keys, name)
        if isinstance(fn, type) or not callable(getattr(fn, "process_element", None)):
            raise JobDefinitionError(f"operator '{self.name}' needs a KeyedProcessFunction instance "
                                     f"(with process_element), got {fn!r}")
        self.fn = fn
        self.time_column = time_column

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        self._timers = self._backend.timer_service("__timers__")
        self.current_watermark = _MIN_WATERMARK
        self._context = ProcessContext(self)
        self._collector = Collector(self._main)
        self._key_records = KeyRecords()
        self._function_state = FunctionState(self, self.fn)

    def open(self) -> None:
        self.fn._yarnflow_state_backend = self._backend  # type: ignore[attr-defined]
        self._function_state.initialize()
        self.call_user(self.fn.open, self.ctx)

    def snapshot_state(self, checkpoint_id: int) -> Snapshot:
        """The keyed state backend's snapshot, and the function's operator state (a
        CheckpointedFunction's)."""
        own = self._function_state.snapshot(checkpoint_id)
        keyed = self._backend.snapshot()
        if not own:
            return keyed
        return keyed.with_tables(own) if isinstance(keyed, AsyncSnapshot) else {**keyed, **own}

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        self._backend.restore(self._function_state.restore(state))

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if batch.num_rows == 0:
            return
        self._check_columns(batch.schema, [self.time_column] if self.time_column else [])
        times = event_times_ms(batch, self.time_column, self.name).tolist() if self.time_column else None
        backend, context, process, collector = self._backend, self._context, self.fn.process_element, self._collector
        context.time_domain = context.timestamp = None
        with gc_paused():
            distinct = DistinctKeys.of(batch, self.keys, self.ctx.max_parallelism) if backend.entries_in_layers else None
            if distinct is not None:
                # the heap backend: a row's key is switched to by setting three fields (see
                # HeapKeyedStateBackend.check_key_groups), one key tuple and entry per key
                backend.check_key_groups(distinct.groups)
                records = distinct.by_row(self._key_records.of(distinct))
                key_index = batch.schema.get_field_index(self.keys[0])
                rows = row_dicts(batch, [distinct.by_row(distinct.values) if i == key_index else column.to_pylist()
                                         for i, column in enumerate(batch.columns)])
                for lo, hi in self.row_slices(len(rows)):
                    for row, (key, entry, kg, value), ts in zip(
                            rows[lo:hi], records[lo:hi], times[lo:hi] if times is not None else itertools.repeat(None)):
                        backend._key = key
                        backend._entry = entry
                        backend._key_group = kg
                        context.current_key = value
                        context.timestamp = ts
                        try:  # free unless raised (zero-cost exceptions)
                            process(row, context, collector)
                        except Exception as exc:
                            raise self.user_error(process, exc) from exc
            else:
                columns = column_lists(batch)
                rows = row_dicts(batch, columns)
                groups = key_groups(batch, self.keys, self.ctx.max_parallelism).tolist()
                if len(self.keys) == 1:  # ctx.current_key is the key's value, the backend's key a 1-tuple
                    values = columns[batch.schema.get_field_index(self.keys[0])]
                    keys: list[tuple[Any, ...]] = list(zip(values))
                else:
                    keys = list(key_tuples(batch, self.keys))
                    values = keys  # type: ignore[assignment]
                set_key = backend.set_current_key
                for lo, hi in self.row_slices(len(rows)):
                    for row, kg, key, value, ts in zip(rows[lo:hi], groups[lo:hi], keys[lo:hi], values[lo:hi],
                                                       times[lo:hi] if times is not None else itertools.repeat(None)):
                        set_key(key, kg)
                        context.current_key = value
                        context.timestamp = ts
                        try:
                            process(row, context, collector)
                        except Exception as exc:
                            raise self.user_error(process, exc) from exc
            self._flush()

    def _fire(self, ts: int, kg: int, key: tuple[Any, ...], domain: str) -> None:
        self._backend.set_current_key(key, kg)
        self._context._set(key, ts, domain)
        self.call_user(self.fn.on_timer, ts, self._context, self._collector)

    def _fire_event_timers(self) -> None:
        while (timer := self._timers.pop_next(EVENT_TIME, self.current_watermark)) is not None:
            self._fire(timer[0], timer[1], timer[2], EVENT_TIME)

    def process_watermark(self, watermark: Watermark, input_index: int = 0) -> None:
        if watermark.timestamp <= self.current_watermark:
            return
        self.current_watermark = watermark.timestamp
        self._fire_event_timers()
        self._flush()
        self.output.emit_watermark(watermark)

    def on_processing_time(self, now_ms: int) -> None:
        for timer in self._timers.due(PROCESSING_TIME, now_ms):
            if self._timers.take(PROCESSING_TIME, timer):
                self._fire(timer[0], timer[1], timer[2], PROCESSING_TIME)
        self._flush()

    def finish(self) -> None:
        self._fire_event_timers()  # timers registered at or below the watermark since it came
        self._flush()

    def close(self) -> None:
        self.call_user(self.fn.close)

    @property
    def pending_timers(self) -> dict[str, int]:
        return {EVENT_TIME: self._timers.count(EVENT_TIME), PROCESSING_TIME: self._timers.count(PROCESSING_TIME)}


class KeyedAggregateFunctionOperator(_KeyedOperator):
    """``key_by(keys).aggregate(agg_fn)`` without windows: rows are the key columns followed by
    the columns of ``get_result`` (a scalar result goes in column 'value'; a result column
    named like a key column is dropped, the key stays what it was). Each key's accumulator is
    an entry of the keyed state backend (``__accumulator__``); ``add`` may change it in place."""

    kind = "keyed_aggregate_function"

    def __init__(self, keys: Sequence[str], agg_fn: AggregateFunction[Any], name: str | None = None) -> None:
        super().__init__(keys, name)
        if isinstance(agg_fn, type) or not all(
                callable(getattr(agg_fn, m, None)) for m in ("create_accumulator", "add", "get_result")):
            raise JobDefinitionError(f"operator '{self.name}' needs an AggregateFunction instance, got {agg_fn!r}")
        self.agg_fn = agg_fn

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        self._acc = self._backend.internal_state("__accumulator__")

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if batch.num_rows == 0:
            return
        self._check_columns(batch.schema)
        agg, backend, acc_state = self.agg_fn, self._backend, self._acc
        touched: dict[tuple[Any, ...], int] = {}
        rows = self._keyed_rows(batch)
        for lo, hi in self.row_slices(batch.num_rows):
            for _, row, kg, key in itertools.islice(rows, hi - lo):
                backend.set_current_key(key, kg)
                acc = acc_state.get_for_update()
                if acc is ABSENT:
                    acc = self.call_user(agg.create_accumulator)
                acc_state.put(self.call_user(agg.add, row, acc))
                touched.setdefault(key, kg)
        if not self.ctx.is_batch:
            for key, kg in touched.items():
                backend.set_current_key(key, kg)
                self._emit(key, acc_state.get())
            self._flush()

    def _emit(self, key: tuple[Any, ...], acc: Any) -> None:
        result = self.call_user(self.agg_fn.get_result, acc)
        row = dict(zip(self.keys, key, strict=True))
        for column, value in (result if isinstance(result, dict) else {"value": result}).items():
            row.setdefault(column, value)
        self._main.add(row)

    def finish(self) -> None:
        if self.ctx.is_batch:
            for _, key, acc in self._backend.entries(self._acc.name):
                self._emit(key, acc)
                if len(self._main.rows) >= self.ctx.batch_size:
                    self._flush()
            self._flush()


class _NoTimers:
    """The timer service of a stream that is not keyed: the clocks, no timers (as in Flink)."""

    def __init__(self, op: ProcessOperator) -> None:
        self._op = op

    def current_watermark(self) -> int:
        return self._op.current_watermark

    def current_processing_time(self) -> int:
        return int(self._op.ctx.clock())

    def _refuse(self, *args: Any) -> None:
        raise JobDefinitionError(f"operator '{self._op.name}': timers need a keyed stream (key_by(...).process)")

    register_event_time_timer = register_processing_time_timer = _refuse
    delete_event_time_timer = delete_processing_time_timer = _refuse


class _UnkeyedContext:
    def __init__(self, op: ProcessOperator) -> None:
        self._op = op
        self._timers = _NoTimers(op)
        self.timestamp: int | None = None
        self.current_key = None
        self.time_domain: str | None = None

    @property
    def runtime_context(self) -> RuntimeContext:
        return self._op.ctx

    def timer_service(self) -> _NoTimers:
        return self._timers

    def output(self, tag: str, row: Any) -> None:
        self._op._side_buffer(tag).add(row)


class ProcessOperator(BufferedOutputs, Operator):
    """``stream.process(fn)`` on a stream that is not keyed: a ProcessFunction per row, with
    the row's event time (``time_column``), the clocks and side outputs; its own state is a
    CheckpointedFunction's."""

    kind = "process"

    def __init__(self, fn: ProcessFunction, time_column: str | None = None, name: str | None = None) -> None:
        super().__init__(name)
        if isinstance(fn, type) or not callable(getattr(fn, "process_element", None)):
            raise JobDefinitionError(f"operator '{self.name}' needs a ProcessFunction instance (with "
                                     f"process_element), got {fn!r}")
        self.fn = fn
        self.time_column = time_column

    @property
    def stateful(self) -> bool:
        return isinstance(self.fn, CheckpointedFunction)

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        self._main = RowBuffer(self.name)
        self._sides: dict[str, RowBuffer] = {}
        self.current_watermark = _MIN_WATERMARK
        self._context = _UnkeyedContext(self)
        self._collector = Collector(self._main)
        self._function_state = FunctionState(self, self.fn)

    def open(self) -> None:
        self._function_state.initialize()
        self.call_user(self.fn.open, self.ctx)

    def snapshot_state(self, checkpoint_id: int) -> Snapshot:
        return self._function_state.snapshot(checkpoint_id)

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        self._function_state.restore(state)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if batch.num_rows == 0:
            return
        times = event_times_ms(batch, self.time_column, self.name).tolist() if self.time_column else None
        context, process, collector = self._context, self.fn.process_element, self._collector
        with gc_paused():
            rows = row_dicts(batch)
            for lo, hi in self.row_slices(len(rows)):
                for row, ts in zip(rows[lo:hi], times[lo:hi] if times is not None else itertools.repeat(None)):
                    context.timestamp = ts
                    try:
                        process(row, context, collector)
                    except Exception as exc:
                        raise self.user_error(process, exc) from exc
            self._flush()

    def process_watermark(self, watermark: Watermark, input_index: int = 0) -> None:
        if watermark.timestamp > self.current_watermark:
            self.current_watermark = watermark.timestamp
        self.output.emit_watermark(watermark)

    def finish(self) -> None:
        self._flush()

    def close(self) -> None:
        self.call_user(self.fn.close)
