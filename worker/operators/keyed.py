"""Keyed aggregations on a hash-partitioned stream.

In BATCH mode (bounded input) they emit one final row per key when their input ends, as
Flink's batch runtime does. In STREAMING mode they emit, after each batch, the updated
aggregate of every key that batch touched (an upsert stream), and nothing more at the end.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.operators.base import Operator
from yarnflow.worker.operators.snapshots import owned_rows, require_columns
from yarnflow.worker.runtime.keygroups import key_group_range, key_groups

AGG_FUNCS = ("sum", "min", "max", "count")
_COMBINE = {"sum": "sum", "min": "min", "max": "max", "count": "sum"}
_COMPACT_ROWS = 1 << 20


def keyed_state_table(rows: list[dict[str, Any]], schema: pa.Schema | None, keys: Sequence[str],
                      max_parallelism: int) -> pa.Table:
    """``rows`` (one per key) as a table of ``schema`` (inferred when the rows no longer fit it)
    with a ``key_group`` column (int32) first."""
    try:
        table = pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        table = pa.Table.from_pylist(rows)
    return with_key_groups(table, keys, max_parallelism)


def with_key_groups(table: pa.Table, keys: Sequence[str], max_parallelism: int) -> pa.Table:
    """``table`` with a first column ``key_group`` (int32): each row's key group."""
    groups = pa.array(key_groups(table, keys, max_parallelism) if table.num_rows else [], pa.int32())
    return table.add_column(0, "key_group", groups)


def restored_rows(state: dict[str, pa.Table], name: str, keys: Sequence[str], op: Operator) -> pa.Table | None:
    """The rows of the restored table ``name`` in ``op``'s key-group range, without ``key_group``."""
    table = state.get(name)
    if table is None:
        return None
    require_columns(table, name, ["key_group", *keys])
    ctx = op.ctx
    table = owned_rows(table, key_group_range(ctx.max_parallelism, ctx.parallelism, ctx.subtask_index))
    return table.drop_columns(["key_group"])


def check_columns(schema: pa.Schema, columns: Sequence[str], op_name: str) -> None:
    missing = [c for c in columns if schema.get_field_index(c) < 0]
    if missing:
        raise JobDefinitionError(f"operator '{op_name}': column(s) {missing} do not exist; "
                                 f"the input has columns {schema.names}")


class KeyedAggregate(Operator):
    """``key_by(keys).sum(col)`` and friends: aggregates (column, function) per key.

    State (table ``aggregates``): ``key_group`` (int32), the key columns and one column per
    aggregate, typed as the output; one row per key."""

    kind = "keyed_aggregate"

    def __init__(self, keys: Sequence[str], aggs: Sequence[tuple[str, str]], name: str | None = None) -> None:
        super().__init__(name)
        for _, fn in aggs:
            if fn not in AGG_FUNCS:
                raise JobDefinitionError(f"unknown aggregate {fn!r}: expected one of {AGG_FUNCS}")
        self.keys = list(keys)
        self.aggs = list(aggs)
        self._partials: list[pa.Table] = []
        self._partial_rows = 0
        self._state: dict[tuple[Any, ...], list[Any]] = {}
        self._state_schema: pa.Schema | None = None  # keys + aggregates, as the partials have them
        self._checked = False

    def _names(self) -> list[str]:
        """Output column per aggregate: the column's own name (``sum("count")`` stays "count"),
        "count" for a count, and ``<col>_<fn>`` where two aggregates, or an aggregate and a key,
        would share a name."""
        plain = ["count" if fn == "count" else col for col, fn in self.aggs]
        return [n if plain.count(n) == 1 and n not in self.keys else f"{col}_{fn}"
                for n, (col, fn) in zip(plain, self.aggs)]

    def _aggregate(self, table: pa.Table, combine: bool) -> pa.Table:
        if combine:
            specs: list[tuple[Any, ...]] = [(name, _COMBINE[fn]) for name, (_, fn) in zip(self._names(), self.aggs)]
        else:  # a count counts rows, also those whose counted column (the key) is null
            specs = [(c, f, pc.CountOptions(mode="all")) if f == "count" else (c, f) for c, f in self.aggs]
        grouped = table.group_by(self.keys, use_threads=False).aggregate(specs)
        cols = [grouped.column(k) for k in self.keys] + [grouped.column(f"{s[0]}_{s[1]}") for s in specs]
        return pa.table(cols, names=self.keys + self._names())

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if not self._checked:
            check_columns(batch.schema, self.keys + [c for c, _ in self.aggs if c], self.name)
            self._checked = True
        partial = self._aggregate(pa.Table.from_batches([batch]), combine=False)
        if self.ctx.is_batch:
            self._partials.append(partial)
            self._partial_rows += partial.num_rows
            if self._partial_rows > _COMPACT_ROWS:
                self._compact()
            return
        self._upsert(partial)

    def _compact(self) -> None:
        merged = self._aggregate(pa.concat_tables(self._partials, promote_options="permissive"), combine=True)
        self._partials, self._partial_rows = [merged], merged.num_rows

    def _upsert(self, partial: pa.Table) -> None:
        if self._state_schema is None or not any(pa.types.is_null(f.type) for f in partial.schema):
            self._state_schema = partial.schema
        nk = len(self.keys)
        funcs = [_COMBINE[f] for _, f in self.aggs]
        rows = partial.to_pylist()
        names = partial.column_names
        out = []
        for row in rows:
            values = [row[n] for n in names]
            key, aggs = tuple(values[:nk]), values[nk:]
            current = self._state.get(key)
            if current is None:
                current = list(aggs)
            else:
                for i, fn in enumerate(funcs):
                    a, b = current[i], aggs[i]
                    if a is None:
                        current[i] = b
                    elif b is not None:
                        current[i] = a + b if fn == "sum" else min(a, b) if fn == "min" else max(a, b)
            self._state[key] = current
            out.append(dict(zip(names, (*key, *current))))
        if out:
            self.output.collect(pa.RecordBatch.from_pylist(out, schema=partial.schema))

    def snapshot_state(self, checkpoint_id: int) -> dict[str, pa.Table]:
        if self.ctx.is_batch:
            if not self._partials:
                return {}
            self._compact()
            return {"aggregates": with_key_groups(self._partials[0], self.keys, self.ctx.max_parallelism)}
        if not self._state:
            return {}
        names = (self._state_schema.names if self._state_schema is not None
                 else self.keys + self._names())
        rows = [dict(zip(names, (*key, *values))) for key, values in self._state.items()]
        return {"aggregates": keyed_state_table(rows, self._state_schema, self.keys, self.ctx.max_parallelism)}

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        table = restored_rows(state, "aggregates", self.keys, self)
        if table is None or table.num_rows == 0:
            return
        require_columns(table, "aggregates", self._names())
        table = table.select(self.keys + self._names())
        if self.ctx.is_batch:
            self._partials, self._partial_rows = [table], table.num_rows
            return
        self._state_schema = table.schema
        nk = len(self.keys)
        for values in zip(*(table.column(c).to_pylist() for c in table.column_names)):
            self._state[tuple(values[:nk])] = list(values[nk:])

    def finish(self) -> None:
        if self.ctx.is_batch and self._partials:
            self._compact()
            for batch in self._partials[0].combine_chunks().to_batches(max_chunksize=self.ctx.batch_size):
                if batch.num_rows:
                    self.output.collect(batch)
            self._partials = []


class KeyedReduce(Operator):
    """``key_by(keys).reduce(fn)``: fn(accumulated_row, row) -> row, per key, row by row.

    State (table ``reduced``): ``key_group`` (int32) and the columns of the stream, typed as
    the input; one row (the accumulated one) per key."""

    kind = "keyed_reduce"

    def __init__(self, keys: Sequence[str], fn: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]],
                 name: str | None = None) -> None:
        super().__init__(name)
        self.keys = list(keys)
        self.fn = fn
        self._state: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._schema: pa.Schema | None = None

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if self._schema is None:
            check_columns(batch.schema, self.keys, self.name)
            self._schema = batch.schema
        updated: dict[tuple[Any, ...], dict[str, Any]] = {}
        for row in batch.to_pylist():
            key = tuple(row[k] for k in self.keys)
            acc = self._state.get(key)
            new = row if acc is None else self.call_user(self.fn, acc, row)
            if not isinstance(new, dict):
                raise JobDefinitionError(f"reduce function in operator '{self.name}' must return a dict row")
            for k in self.keys:  # the key stays what it was
                new[k] = row[k]
            self._state[key] = new
            updated[key] = new
        if not self.ctx.is_batch and updated:
            self.output.collect(pa.RecordBatch.from_pylist(list(updated.values()), schema=self._schema))

    def snapshot_state(self, checkpoint_id: int) -> dict[str, pa.Table]:
        if not self._state:
            return {}
        return {"reduced": keyed_state_table(list(self._state.values()), self._schema, self.keys,
                                             self.ctx.max_parallelism)}

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        table = restored_rows(state, "reduced", self.keys, self)
        if table is None or table.num_rows == 0:
            return
        self._schema = table.schema
        for row in table.to_pylist():
            self._state[tuple(row[k] for k in self.keys)] = row

    def finish(self) -> None:
        if self.ctx.is_batch and self._state:
            rows = list(self._state.values())
            for i in range(0, len(rows), self.ctx.batch_size):
                self.output.collect(pa.RecordBatch.from_pylist(rows[i:i + self.ctx.batch_size], schema=self._schema))
