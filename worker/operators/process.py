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

Keyed state and timers are scoped to key groups; ``snapshot_key_groups`` / ``restore_key_groups``
serialise them per key group so a rescaled subtask can take over its share. At a checkpoint,
``snapshot_state`` gives them as Arrow tables with a ``key_group`` column (``keyed_state`` and,
for process functions, ``timers``); ``initialize_state`` keeps the rows of this subtask's
key-group range.
"""

from __future__ import annotations

import heapq
import itertools
import pickle
from typing import Any, Iterable, Sequence

import cloudpickle
import numpy as np
import pyarrow as pa

from yarnflow.common.errors import JobDefinitionError, YarnflowError
from yarnflow.worker.operators.base import Operator, Output, RuntimeContext
from yarnflow.common.api.functions import EVENT_TIME, PROCESSING_TIME, AggregateFunction, KeyedProcessFunction
from yarnflow.common.api.state import StateDescriptor, ValueStateDescriptor
from yarnflow.worker.operators.snapshots import dumps, loads, owned_rows, require_columns
from yarnflow.worker.operators.state import HeapKeyedStateBackend, StateRestoreError
from yarnflow.worker.operators.transforms import SchemaMismatchError
from yarnflow.worker.runtime.elements import Watermark
from yarnflow.worker.runtime.keygroups import key_group_range, key_groups

__all__ = [
    "Collector",
    "KeyedAggregateFunctionOperator",
    "KeyedProcessOperator",
    "MissingEventTimeError",
    "ProcessContext",
    "TimerService",
]

_MIN_WATERMARK = -(2**63)
_MS_SCALE = {"s": (1000, 1), "ms": (1, 1), "us": (1, 1000), "ns": (1, 1_000_000)}  # (multiply, floor-divide)


class MissingEventTimeError(YarnflowError, ValueError):
    """A row's event-time column is null. Fill or filter such rows before this operator."""


# --------------------------------------------------------------------------- what user functions are given


class Collector:
    """``out`` of process_element / on_timer."""

    def __init__(self, buffer: _RowBuffer) -> None:
        self._buffer = buffer

    def collect(self, row: Any) -> None:
        self._buffer.add(row)


class TimerService:
    """Timers of the current key, in ms. Registering an existing timer does nothing; deleting
    a missing one does nothing."""

    def __init__(self, op: KeyedProcessOperator) -> None:
        self._op = op

    def _scope(self) -> tuple[int, tuple[Any, ...]]:
        backend = self._op._backend
        key = backend._require_key()
        assert backend.current_key_group is not None
        return backend.current_key_group, key

    def register_event_time_timer(self, timestamp: int) -> None:
        self._op._event_timers.add(int(timestamp), *self._scope())

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._op._processing_timers.add(int(timestamp), *self._scope())

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._op._event_timers.remove(int(timestamp), *self._scope())

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._op._processing_timers.remove(int(timestamp), *self._scope())

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


class _RowBuffer:
    """Rows waiting to become batches; the first batch fixes the schema."""

    def __init__(self, op_name: str, tag: str | None = None) -> None:
        self.op_name = op_name
        self.tag = tag
        self.rows: list[dict[str, Any]] = []
        self.schema: pa.Schema | None = None

    def add(self, row: Any) -> None:
        self.rows.append(row if isinstance(row, dict) else {"value": row})

    def drain(self, batch_size: int) -> list[pa.RecordBatch]:
        rows, self.rows = self.rows, []
        return [self._to_batch(rows[i:i + batch_size]) for i in range(0, len(rows), max(1, batch_size))]

    def _to_batch(self, rows: list[dict[str, Any]]) -> pa.RecordBatch:
        try:
            if self.schema is None:
                names = list(dict.fromkeys(name for row in rows for name in row))
                batch = pa.RecordBatch.from_pydict({n: [row.get(n) for row in rows] for n in names})
                if not any(pa.types.is_null(f.type) for f in batch.schema):
                    self.schema = batch.schema  # else: types not known yet, decide on a later batch
                return batch
            known = set(self.schema.names)
            extra = sorted({name for row in rows for name in row if name not in known})
            if extra:
                raise SchemaMismatchError(f"new columns {extra}")
            return pa.RecordBatch.from_pylist(rows, schema=self.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, SchemaMismatchError) as exc:
            where = "output" if self.tag is None else f"side output {self.tag!r}"
            raise SchemaMismatchError(
                f"operator '{self.op_name}' emitted rows on its {where} that do not match the schema "
                f"fixed by its first batch ({self.schema}): {exc}") from None


class _TimerQueue:
    """Timers of one time domain: a set per key group (for snapshots) and a heap (for order)."""

    def __init__(self) -> None:
        self._groups: dict[int, set[tuple[int, tuple[Any, ...]]]] = {}
        self._heap: list[tuple[int, int, int, tuple[Any, ...]]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return sum(len(g) for g in self._groups.values())

    def add(self, ts: int, key_group: int, key: tuple[Any, ...]) -> None:
        group = self._groups.setdefault(key_group, set())
        if (ts, key) not in group:
            group.add((ts, key))
            heapq.heappush(self._heap, (ts, next(self._seq), key_group, key))

    def remove(self, ts: int, key_group: int, key: tuple[Any, ...]) -> bool:
        group = self._groups.get(key_group)
        if group is None or (ts, key) not in group:
            return False
        group.discard((ts, key))  # its heap entry is skipped when it comes up
        return True

    def pop_next(self, limit: int) -> tuple[int, int, tuple[Any, ...]] | None:
        """Remove and return the earliest live timer at or before ``limit``."""
        while self._heap and self._heap[0][0] <= limit:
            ts, _, kg, key = heapq.heappop(self._heap)
            if self.remove(ts, kg, key):
                return ts, kg, key
        return None

    def due(self, limit: int) -> list[tuple[int, int, tuple[Any, ...]]]:
        """The live timers at or before ``limit``, in order, still registered (the caller
        fires each one it can still ``remove``, so deletes by earlier callbacks win)."""
        out = []
        while self._heap and self._heap[0][0] <= limit:
            ts, _, kg, key = heapq.heappop(self._heap)
            if (ts, key) in self._groups.get(kg, ()):
                out.append((ts, kg, key))
        return out

    def in_order(self) -> list[tuple[int, int, tuple[Any, ...]]]:
        """The live timers as (timestamp, key group, key), in the order they would fire."""
        out, seen = [], set()
        for ts, _, kg, key in sorted(self._heap, key=lambda e: (e[0], e[1])):
            if (kg, ts, key) not in seen and (ts, key) in self._groups.get(kg, ()):
                seen.add((kg, ts, key))
                out.append((ts, kg, key))
        return out

    def snapshot(self, key_groups: set[int] | None) -> dict[int, list[tuple[int, tuple[Any, ...]]]]:
        return {kg: list(g) for kg, g in self._groups.items() if g and (key_groups is None or kg in key_groups)}

    def restore(self, groups: dict[int, list[tuple[int, tuple[Any, ...]]]], key_group_range: range) -> None:
        for kg, timers in groups.items():
            if kg in key_group_range:
                for ts, key in timers:
                    self.add(ts, kg, key)


def _event_times(batch: pa.RecordBatch, column: str, op_name: str) -> list[int]:
    """The time column as ms since the epoch, one int per row."""
    col = batch.column(batch.schema.get_field_index(column))
    if col.null_count:
        raise MissingEventTimeError(f"operator '{op_name}': event-time column {column!r} has "
                                    f"{col.null_count} null value(s); every row needs a time")
    t = col.type
    if pa.types.is_integer(t):
        return col.to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_timestamp(t) or pa.types.is_date64(t):
        raw = col.cast(pa.int64()).to_numpy(zero_copy_only=False)
        mul, div = _MS_SCALE[getattr(t, "unit", "ms")]
        return (raw.astype(np.int64) * mul // div).tolist()  # type: ignore[no-any-return]
    if pa.types.is_date32(t):
        return (col.cast(pa.int32()).to_numpy(zero_copy_only=False).astype(np.int64) * 86_400_000).tolist()  # type: ignore[no-any-return]
    raise JobDefinitionError(f"operator '{op_name}': event-time column {column!r} has type {t}; expected "
                             f"an integer (ms since the epoch), a timestamp or a date")


class _KeyedOperator(Operator):
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
        self._backend = HeapKeyedStateBackend(
            ctx.max_parallelism, key_group_range(ctx.max_parallelism, ctx.parallelism, ctx.subtask_index))
        self._main = _RowBuffer(self.name)
        self._sides: dict[str, _RowBuffer] = {}

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
        keys = self.keys
        for i, row in enumerate(batch.to_pylist()):
            yield i, row, groups[i], tuple(row[k] for k in keys)

    def _side_buffer(self, tag: str) -> _RowBuffer:
        buffer = self._sides.get(tag)
        if buffer is None:
            if not isinstance(tag, str) or not tag:
                raise JobDefinitionError(f"operator '{self.name}': a side output tag must be a non-empty "
                                         f"string, got {tag!r}")
            buffer = self._sides[tag] = _RowBuffer(self.name, tag)
        return buffer

    def _flush(self) -> None:
        for batch in self._main.drain(self.ctx.batch_size):
            self.output.collect(batch)
        for tag, buffer in self._sides.items():
            for batch in buffer.drain(self.ctx.batch_size):
                self.output.collect_side(tag, batch)

    def snapshot_state(self, checkpoint_id: int) -> dict[str, pa.Table]:
        """Table ``keyed_state``: see ``HeapKeyedStateBackend.snapshot_table``."""
        return {"keyed_state": self._backend.snapshot_table()}

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        table = state.get("keyed_state")
        if table is not None:
            self._backend.restore_table(table)

    def snapshot_key_groups(self, key_groups: Iterable[int] | None = None) -> bytes:
        """This operator's keyed state (and timers) for ``key_groups`` (default: all)."""
        return self._backend.snapshot(key_groups)

    def restore_key_groups(self, data: bytes, key_group_range: range | None = None) -> None:
        """Take over the key groups of ``data`` in ``key_group_range`` (default: this subtask's
        range). Call after ``setup``, before ``open``, once per overlapping old snapshot."""
        self._backend.restore(data, key_group_range)


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
        self._event_timers = _TimerQueue()
        self._processing_timers = _TimerQueue()
        self.current_watermark = _MIN_WATERMARK
        self._context = ProcessContext(self)
        self._collector = Collector(self._main)

    def open(self) -> None:
        self.fn._yarnflow_state_backend = self._backend  # type: ignore[attr-defined]
        self.call_user(self.fn.open, self.ctx)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if batch.num_rows == 0:
            return
        self._check_columns(batch.schema, [self.time_column] if self.time_column else [])
        times = _event_times(batch, self.time_column, self.name) if self.time_column else None
        backend, context, process = self._backend, self._context, self.fn.process_element
        for i, row, kg, key in self._keyed_rows(batch):
            backend.set_current_key(key, kg)
            context._set(key, times[i] if times is not None else None, None)
            self.call_user(process, row, context, self._collector)
        self._flush()

    def _fire(self, ts: int, kg: int, key: tuple[Any, ...], domain: str) -> None:
        self._backend.set_current_key(key, kg)
        self._context._set(key, ts, domain)
        self.call_user(self.fn.on_timer, ts, self._context, self._collector)

    def _fire_event_timers(self) -> None:
        while (timer := self._event_timers.pop_next(self.current_watermark)) is not None:
            self._fire(*timer, EVENT_TIME)

    def process_watermark(self, watermark: Watermark, input_index: int = 0) -> None:
        if watermark.timestamp <= self.current_watermark:
            return
        self.current_watermark = watermark.timestamp
        self._fire_event_timers()
        self._flush()
        self.output.emit_watermark(watermark)

    def on_processing_time(self, now_ms: int) -> None:
        for ts, kg, key in self._processing_timers.due(now_ms):
            if self._processing_timers.remove(ts, kg, key):
                self._fire(ts, kg, key, PROCESSING_TIME)
        self._flush()

    def finish(self) -> None:
        self._fire_event_timers()  # timers registered at or below the watermark since it came
        self._flush()

    def close(self) -> None:
        self.call_user(self.fn.close)

    @property
    def pending_timers(self) -> dict[str, int]:
        return {EVENT_TIME: len(self._event_timers), PROCESSING_TIME: len(self._processing_timers)}

    TIMERS_SCHEMA = pa.schema([("key_group", pa.int32()), ("domain", pa.string()), ("timestamp", pa.int64()),
                               ("key", pa.binary())])

    def snapshot_state(self, checkpoint_id: int) -> dict[str, pa.Table]:
        """Tables ``keyed_state`` (see ``HeapKeyedStateBackend.snapshot_table``) and ``timers``:
        one row per timer in firing order, ``key_group`` (int32), ``domain`` (string: EVENT_TIME or
        PROCESSING_TIME), ``timestamp`` (int64 ms) and ``key`` (binary: the pickled key tuple).
        The watermark is not state: a restored operator waits for its inputs' watermarks."""
        cols: dict[str, list[Any]] = {name: [] for name in self.TIMERS_SCHEMA.names}
        for domain, queue in ((EVENT_TIME, self._event_timers), (PROCESSING_TIME, self._processing_timers)):
            for ts, kg, key in queue.in_order():  # restored in this order: the same firing order
                cols["key_group"].append(kg)
                cols["domain"].append(domain)
                cols["timestamp"].append(ts)
                cols["key"].append(dumps(key))
        return {**super().snapshot_state(checkpoint_id), "timers": pa.table(cols, schema=self.TIMERS_SCHEMA)}

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        super().initialize_state(state)
        table = state.get("timers")
        if table is None:
            return
        require_columns(table, "timers", self.TIMERS_SCHEMA.names)
        queues = {EVENT_TIME: self._event_timers, PROCESSING_TIME: self._processing_timers}
        table = owned_rows(table, self._backend.key_group_range)
        for kg, domain, ts, key in zip(*(table.column(c).to_pylist() for c in self.TIMERS_SCHEMA.names)):
            queue = queues.get(domain)
            if queue is None:
                raise StateRestoreError(f"operator '{self.name}': restored timer of unknown domain {domain!r}")
            queue.add(ts, kg, loads(key))

    def snapshot_key_groups(self, key_groups: Iterable[int] | None = None) -> bytes:
        wanted = None if key_groups is None else set(key_groups)
        return cloudpickle.dumps({
            "keyed": self._backend.snapshot(wanted),
            "event_timers": self._event_timers.snapshot(wanted),
            "processing_timers": self._processing_timers.snapshot(wanted),
        })

    def restore_key_groups(self, data: bytes, key_group_range: range | None = None) -> None:
        payload = pickle.loads(data)
        self._backend.restore(payload["keyed"], key_group_range)
        owned = self._backend.key_group_range
        self._event_timers.restore(payload["event_timers"], owned)
        self._processing_timers.restore(payload["processing_timers"], owned)


class KeyedAggregateFunctionOperator(_KeyedOperator):
    """``key_by(keys).aggregate(agg_fn)`` without windows: rows are the key columns followed by
    the columns of ``get_result`` (a scalar result goes in column 'value'; a result column
    named like a key column is dropped, the key stays what it was)."""

    kind = "keyed_aggregate_function"
    _ACC = ValueStateDescriptor("_aggregate_accumulator")

    def __init__(self, keys: Sequence[str], agg_fn: AggregateFunction[Any], name: str | None = None) -> None:
        super().__init__(keys, name)
        if isinstance(agg_fn, type) or not all(
                callable(getattr(agg_fn, m, None)) for m in ("create_accumulator", "add", "get_result")):
            raise JobDefinitionError(f"operator '{self.name}' needs an AggregateFunction instance, got {agg_fn!r}")
        self.agg_fn = agg_fn

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        self._acc = self._backend.get_state(self._ACC)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if batch.num_rows == 0:
            return
        self._check_columns(batch.schema)
        agg, backend, acc_state = self.agg_fn, self._backend, self._acc
        touched: dict[tuple[Any, ...], int] = {}
        for _, row, kg, key in self._keyed_rows(batch):
            backend.set_current_key(key, kg)
            held = acc_state.value()  # (accumulator,) so that a None accumulator is allowed
            acc = self.call_user(agg.create_accumulator) if held is None else held[0]
            acc_state.update((self.call_user(agg.add, row, acc),))
            touched.setdefault(key, kg)
        if not self.ctx.is_batch:
            for key, kg in touched.items():
                backend.set_current_key(key, kg)
                self._emit(key, acc_state.value()[0])
            self._flush()

    def _emit(self, key: tuple[Any, ...], acc: Any) -> None:
        result = self.call_user(self.agg_fn.get_result, acc)
        row = dict(zip(self.keys, key, strict=True))
        for column, value in (result if isinstance(result, dict) else {"value": result}).items():
            row.setdefault(column, value)
        self._main.add(row)

    def finish(self) -> None:
        if self.ctx.is_batch:
            for _, key, (acc,) in self._backend.entries(self._ACC.name):
                self._emit(key, acc)
                if len(self._main.rows) >= self.ctx.batch_size:
                    self._flush()
            self._flush()
