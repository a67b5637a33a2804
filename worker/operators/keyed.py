"""Keyed aggregations on a hash-partitioned stream.

In BATCH mode (bounded input) they emit one final row per key when their input ends, as
Flink's batch runtime does. In STREAMING mode they emit, after each batch, the updated
aggregate of every key that batch touched (an upsert stream), and nothing more at the end.

Their state is in a keyed state backend (``yarnflow.worker.state``): ``KeyedAggregate`` keeps one
row of aggregates per key as columns (an ``AggregateTable``, updated a batch at a time with
numpy), ``KeyedReduce`` one row (a dict) per key. In BATCH mode ``KeyedAggregate`` keeps partial
aggregates as Arrow tables instead: no checkpoints are taken there.
"""

from __future__ import annotations

import copy
import functools
import itertools
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.operators.base import Operator, Output, RuntimeContext
from yarnflow.worker.operators.batch.aggregate import AGG_FUNCS, HashAggregation, PartialSchema, output_names
from yarnflow.worker.operators.rows import gc_paused, row_dicts
from yarnflow.worker.key_assignment import key_group_range, key_groups
from yarnflow.worker.state.heap import ABSENT, IMMUTABLE, HeapKeyedStateBackend
from yarnflow.worker.state.tables import Snapshot, owned_rows, require_columns

_COMBINE = {"sum": "sum", "min": "min", "max": "max", "count": "sum"}


def check_columns(schema: pa.Schema, columns: Sequence[str], op_name: str) -> None:
    missing = [c for c in columns if schema.get_field_index(c) < 0]
    if missing:
        raise JobDefinitionError(f"operator '{op_name}': column(s) {missing} do not exist; "
                                 f"the input has columns {schema.names}")


def key_tuples(batch: pa.RecordBatch, keys: Sequence[str]) -> Iterator[tuple[Any, ...]]:
    """The key of each row, as a tuple (one per key column)."""
    return zip(*[batch.column(k).to_pylist() for k in keys])


def _groupable(t: pa.DataType) -> bool:
    """Key types whose Arrow equality is Python's (not floats: -0.0 == 0.0 and NaN != NaN in
    Python; not dictionary columns, whose dictionaries may repeat values)."""
    return (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_boolean(t)
            or pa.types.is_date(t) or pa.types.is_timestamp(t))


class DistinctKeys:
    """The keys of a batch's rows for a one-column key, each distinct key made once: ``values``
    (the key values, Python objects, in the order first seen; ``array``: the same as an Arrow
    array of the column's type), ``groups`` (the key group of each) and ``indices`` (an Arrow
    array: for each row, the position of its key in ``values``). ``of(batch)`` is None for keys
    it cannot group exactly as Python compares them (several columns, floats, dictionary
    columns): the caller then takes the keys row by row."""

    __slots__ = ("array", "groups", "indices", "values")

    def __init__(self, values: list[Any], groups: list[int], indices: pa.Array, array: pa.Array) -> None:
        self.values, self.groups, self.indices, self.array = values, groups, indices, array

    @staticmethod
    def of(batch: pa.RecordBatch, keys: Sequence[str], max_parallelism: int) -> DistinctKeys | None:
        if len(keys) != 1:
            return None
        column = batch.column(keys[0])
        if not _groupable(column.type):
            return None
        encoded = pc.dictionary_encode(column, null_encoding="encode")
        distinct = pa.RecordBatch.from_arrays([encoded.dictionary], names=[keys[0]])
        return DistinctKeys(encoded.dictionary.to_pylist(), key_groups(distinct, keys, max_parallelism).tolist(),
                            encoded.indices, encoded.dictionary)

    def by_row(self, per_key: list[Any]) -> list[Any]:
        """``per_key`` (one object per key of ``values``) repeated for each row: the rows' own
        list, made in C (the same objects, not copies)."""
        table = np.fromiter(per_key, dtype=object, count=len(per_key))
        return table[self.indices.to_numpy(zero_copy_only=False)].tolist()  # type: ignore[no-any-return]


#: (key tuple, state entry ``(key, None)``, key group, key value) of one key
KeyRecord = tuple[tuple[Any, ...], tuple[Any, None], int, Any]


class KeyRecords:
    """The ``KeyRecord`` of each key an operator has seen, kept between batches (up to
    ``limit`` keys; then it starts again), for operators that switch a heap backend's current
    key themselves (see ``HeapKeyedStateBackend.check_key_groups``): a state dict then finds its
    entry by identity, and no tuples are made per row or per batch."""

    __slots__ = ("_known", "limit")

    def __init__(self, limit: int = 1 << 17) -> None:
        self._known: dict[Any, KeyRecord] = {}
        self.limit = limit

    def of(self, distinct: DistinctKeys) -> list[KeyRecord]:
        """The record of each key of ``distinct.values``, in that order."""
        known = self._known
        if len(known) > self.limit:
            known.clear()
        records = []
        for value, kg in zip(distinct.values, distinct.groups):
            record = known.get(value)
            if record is None or record[2] != kg:
                key = (value,)
                record = known[value] = (key, (key, None), kg, value)
            records.append(record)
        return records


def keyed_backend(ctx: RuntimeContext) -> HeapKeyedStateBackend:
    """The keyed state backend of an operator running as ``ctx``'s subtask: in memory, or in
    RocksDB when the job sets ``state.backend.type: rocksdb`` (BATCH jobs keep theirs in memory:
    they take no checkpoints)."""
    kg_range = key_group_range(ctx.max_parallelism, ctx.parallelism, ctx.subtask_index)
    from yarnflow.common.config import Options

    try:
        kind = Options.STATE_BACKEND.convert(ctx.config.get(Options.STATE_BACKEND.key) or "hashmap")
        incremental = Options.CHECKPOINT_INCREMENTAL.convert(ctx.config.get(Options.CHECKPOINT_INCREMENTAL.key) or "false")
    except ValueError as exc:
        raise JobDefinitionError(f"operator '{ctx.task_name}': bad state backend setting: {exc}") from None
    if kind != "rocksdb" or ctx.is_batch:
        return HeapKeyedStateBackend(ctx.max_parallelism, kg_range)
    from yarnflow.worker.state.localdir import new_rocksdb_backend

    return new_rocksdb_backend(ctx.config, ctx.attempt_id, ctx.task_name, ctx.max_parallelism, kg_range,
                               bool(incremental), ctx.rocksdb_memory())


def _copy_row(row: dict[str, Any]) -> dict[str, Any]:
    if all(isinstance(v, IMMUTABLE) for v in row.values()):
        return dict(row)
    return copy.deepcopy(row)


class KeyedAggregate(Operator):
    """``key_by(keys).sum(col)`` and friends: aggregates (column, function) per key.

    STREAMING: the aggregates live in the keyed state backend (an ``AggregateTable``), and each
    batch emits the keys it changed. BATCH: a ``HashAggregation`` in the operator's managed
    memory, spilling by key hash when the keys do not fit; its input is partial aggregates when
    the compiler put a ``LocalKeyedAggregate`` before the exchange (``partial_input``).

    State (table ``aggregates``): ``key_group`` (int32), the key columns and one column per
    aggregate, typed as the output; one row per key."""

    kind = "keyed_aggregate"
    uses_managed_memory = True

    def __init__(self, keys: Sequence[str], aggs: Sequence[tuple[str, str]], name: str | None = None) -> None:
        super().__init__(name)
        for _, fn in aggs:
            if fn not in AGG_FUNCS:
                raise JobDefinitionError(f"unknown aggregate {fn!r}: expected one of {AGG_FUNCS}")
        self.keys = list(keys)
        self.aggs = list(aggs)
        #: the input is partial aggregates (a LocalKeyedAggregate runs before the exchange)
        self.partial_input = False
        self._checked = False

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        self._backend = keyed_backend(ctx)
        self._table = self._backend.aggregate_table(
            "aggregates", self.keys, [(name, _COMBINE[fn]) for name, (_, fn) in zip(self._names(), self.aggs)])
        self._partial_schema = PartialSchema(self.keys, self.aggs, self.name)
        self._batch = HashAggregation(self._partial_schema, ctx.memory, ctx.spill, self.name) if ctx.is_batch else None

    def _names(self) -> list[str]:
        return output_names(self.keys, self.aggs)

    def _aggregate(self, table: pa.Table) -> pa.Table:
        # a count counts rows, also those whose counted column (the key) is null
        specs: list[tuple[Any, ...]] = [(c, f, pc.CountOptions(mode="all")) if f == "count" else (c, f)
                                        for c, f in self.aggs]
        grouped = table.group_by(self.keys, use_threads=False).aggregate(specs)
        cols = [grouped.column(k) for k in self.keys] + [grouped.column(f"{s[0]}_{s[1]}") for s in specs]
        return pa.table(cols, names=self.keys + self._names())

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if self._batch is not None:
            if self.partial_input:
                if not self._checked:
                    check_columns(batch.schema, self.keys + self._names(), self.name)
                    self._checked = True
                    self._partial_schema.schema = _nullable(batch.schema)
                self._batch.add_partials(pa.Table.from_batches([batch]).cast(self._partial_schema.schema))
            else:
                self._batch.add_rows(batch)
            return
        if self.partial_input:  # STREAMING with a LocalKeyedAggregate before the exchange
            if not self._checked:
                check_columns(batch.schema, self.keys + self._names(), self.name)
                self._checked = True
                self._partial_schema.schema = _nullable(batch.schema)
            partials = pa.Table.from_batches([batch]).cast(self._partial_schema.schema)
            updated = self._table.upsert(self._partial_schema.combine(partials))
        else:
            if not self._checked:
                check_columns(batch.schema, self.keys + [c for c, _ in self.aggs if c], self.name)
                self._checked = True
            updated = self._table.upsert(self._aggregate(pa.Table.from_batches([batch])))
        for out in updated.to_batches():
            if out.num_rows:
                self.output.collect(out)

    def snapshot_state(self, checkpoint_id: int) -> Snapshot:
        if self._batch is None:
            return self._backend.snapshot()
        table = self._batch.snapshot()
        if table is None:
            return {}
        groups = pa.array(key_groups(table, self.keys, self.ctx.max_parallelism), pa.int32())
        return {"aggregates": table.add_column(0, "key_group", groups)}

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        if self._batch is None:
            self._backend.restore(state)
            return
        table = state.get("aggregates")
        if table is None:
            return
        require_columns(table, "aggregates", ["key_group", *self.keys, *self._names()])
        table = owned_rows(table, self._backend.key_group_range).select(self.keys + self._names())
        if table.num_rows:
            self._partial_schema.schema = _nullable(table.schema)
            self._batch.add_partials(table)

    def finish(self) -> None:
        if self._batch is not None:
            for batch in self._batch.results(self.ctx.batch_size):
                if batch.num_rows:
                    self.output.collect(batch)

    def close(self) -> None:
        if self._batch is not None:
            self._batch.abort()


def _nullable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_nullable(True) for f in schema])


class _NotADictError(Exception):
    """A reduce function returned something other than a dict (raised inside a fold)."""


def _reduce_step(fn: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]], key: str
                 ) -> Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]:
    """``fn`` as one step of a fold of one key's rows: its result must be a dict, and the key
    column stays what it was."""

    def step(acc: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        new = fn(acc, row)
        if new.__class__ is not dict and not isinstance(new, dict):
            raise _NotADictError
        new[key] = row[key]
        return new

    return step


class KeyedReduce(Operator):
    """``key_by(keys).reduce(fn)``: fn(accumulated_row, row) -> row, per key, row by row. The
    accumulated row of each key is an entry of the keyed state backend (``__reduced__``)."""

    kind = "keyed_reduce"

    def __init__(self, keys: Sequence[str], fn: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]],
                 name: str | None = None) -> None:
        super().__init__(name)
        self.keys = list(keys)
        self.fn = fn
        self._schema: pa.Schema | None = None

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        super().setup(ctx, output)
        self._backend = keyed_backend(ctx)
        self._reduced = self._backend.internal_state("__reduced__", _copy_row)
        self._step = _reduce_step(self.fn, self.keys[0]) if len(self.keys) == 1 else None
        self._key_records = KeyRecords()

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if self._schema is None:
            check_columns(batch.schema, self.keys, self.name)
            self._schema = batch.schema
        distinct = DistinctKeys.of(batch, self.keys, self.ctx.max_parallelism) if self._step is not None else None
        with gc_paused():
            if distinct is None:
                updated = self._fold_rows(batch)
                if not self.ctx.is_batch and updated:
                    self.output.collect(pa.RecordBatch.from_pylist(updated, schema=self._schema))
                return
            updated = self._fold_by_key(batch, distinct)
            if not self.ctx.is_batch and updated:
                self.output.collect(self._upserts(updated, distinct))

    def _fold_by_key(self, batch: pa.RecordBatch, distinct: DistinctKeys) -> list[dict[str, Any]]:
        """The batch's rows, sorted by key (stable: each key's rows stay in order), folded one
        key at a time by ``functools.reduce`` (the loop in C); each key's accumulated row is read
        from the state once and written back once. Returns the keys' new rows, in the order of
        ``distinct.values``.

        The rows' key column is made from ``distinct.values``: the rows of a key share its one
        value object (no per-row conversion of the key)."""
        indices = distinct.indices.to_numpy(zero_copy_only=False)
        if len(distinct.values) <= 1 << 16:  # numpy sorts 16-bit integers stably by radix: 3x faster
            order = pa.array(np.argsort(indices.astype(np.uint16), kind="stable"))
        else:
            order = pa.array(np.argsort(indices, kind="stable"))
        counts = np.bincount(indices, minlength=len(distinct.values))
        bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
        key_index = batch.schema.get_field_index(self.keys[0])
        values = np.fromiter(distinct.values, dtype=object, count=len(distinct.values))
        rows = row_dicts(batch, [np.repeat(values, counts).tolist() if i == key_index else column.take(order).to_pylist()
                                 for i, column in enumerate(batch.columns)])
        backend, state, step = self._backend, self._reduced, self._step
        assert step is not None  # DistinctKeys: one key column
        records = self._key_records.of(distinct)
        # the heap backend: the key is switched to by setting its three fields (see
        # HeapKeyedStateBackend.check_key_groups), with one key tuple and entry per key
        switch = backend.entries_in_layers
        if switch:
            backend.check_key_groups(distinct.groups)
        updated: list[dict[str, Any]] = []
        k, pos = 0, 0  # the key being folded (its index in records) and the next row
        acc: Any = None  # the key's row so far
        for _, stop in self.row_slices(len(rows)):  # a key's rows may span slices: its fold goes on
            while pos < stop:
                lo, hi = bounds[k], bounds[k + 1]
                if pos == lo:  # a new key: its row from the state, or its first row
                    key, entry, kg, _ = records[k]
                    if switch:
                        backend._key, backend._entry, backend._key_group = key, entry, kg
                    else:
                        backend.set_current_key(key, kg)
                    acc = state.get_for_update()
                    if acc is ABSENT:
                        acc, pos = rows[lo], lo + 1
                end = hi if hi <= stop else stop
                try:
                    acc = functools.reduce(step, rows[pos:end], acc)
                except _NotADictError:
                    raise JobDefinitionError(f"reduce function in operator '{self.name}' must return a dict row") from None
                except Exception as exc:
                    raise self.user_error(self.fn, exc) from exc
                pos = end
                if pos == hi:
                    state.put(acc)
                    updated.append(acc)
                    k += 1
        return updated

    def _upserts(self, updated: list[dict[str, Any]], distinct: DistinctKeys) -> pa.RecordBatch:
        """``RecordBatch.from_pylist(updated, schema)``, with the key column taken from
        ``distinct`` (the rows' keys are its values, in its order)."""
        schema = self._schema
        assert schema is not None
        key = self.keys[0]
        return pa.RecordBatch.from_arrays(
            [distinct.array if field.name == key
             else pa.array(list(map(dict.get, updated, itertools.repeat(field.name))), type=field.type)
             for field in schema], schema=schema)

    def _fold_rows(self, batch: pa.RecordBatch) -> list[dict[str, Any]]:
        """The batch's rows folded in order, row by row (keys of several columns, or of a type
        ``DistinctKeys`` does not group)."""
        groups = key_groups(batch, self.keys, self.ctx.max_parallelism).tolist()
        backend, state, keys, fn = self._backend, self._reduced, self.keys, self.fn
        # the batch's keys: read from the state once, folded row by row in order, written back once
        updated: dict[tuple[Any, ...], dict[str, Any]] = {}
        key_group: dict[tuple[Any, ...], int] = {}
        rows, tuples = row_dicts(batch), list(key_tuples(batch, keys))
        for lo, hi in self.row_slices(len(rows)):
            for row, kg, key in zip(rows[lo:hi], groups[lo:hi], tuples[lo:hi]):
                acc = updated.get(key, ABSENT)
                if acc is ABSENT:
                    backend.set_current_key(key, kg)
                    acc = state.get_for_update()
                    key_group[key] = kg
                if acc is ABSENT:
                    new = row
                else:
                    try:
                        new = fn(acc, row)
                    except Exception as exc:
                        raise self.user_error(fn, exc) from exc
                    if not isinstance(new, dict):
                        raise JobDefinitionError(f"reduce function in operator '{self.name}' must return a dict row")
                for k in keys:  # the key stays what it was
                    new[k] = row[k]
                updated[key] = new
        for key, new in updated.items():
            backend.set_current_key(key, key_group[key])
            state.put(new)
        return list(updated.values())

    def snapshot_state(self, checkpoint_id: int) -> Snapshot:
        return self._backend.snapshot()

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        self._backend.restore(state)

    def finish(self) -> None:
        if self.ctx.is_batch:
            rows = [row for _, _, row in self._backend.entries(self._reduced.name)]
            for i in range(0, len(rows), self.ctx.batch_size):
                self.output.collect(pa.RecordBatch.from_pylist(rows[i:i + self.ctx.batch_size], schema=self._schema))
