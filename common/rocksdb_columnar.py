"""The RocksDB form of a vectorised operator's aggregate table, shared by the TaskExecutor (which
writes it, ``worker/state/rocksdb_columnar.py``) and the AppMaster (which turns a native snapshot
into a savepoint's canonical tables, through ``rocksdb_snapshot.canonical_batches``).

One column family per aggregate state, named as the state, one entry per key:

- RocksDB key: the key group (``kg_prefix``, 2 bytes) then the key's tuple in the
  ``state_format.encode`` format, so the keys of a key-group range are one range scan;
- value: the tuple of the aggregate values, encoded so too.

Keys and values are written in their storage form (``to_storage``): a timestamp, date, time or
duration as its integer, a decimal as its text, a dictionary-encoded value as its value, any
other as the Python int / float / bool / str / bytes Arrow gives; null as None. So known types
are never pickled, and the entries do not depend on the Arrow types, which may still change
(a column that was only ever null takes the type of its first real value).

The Arrow types of the key and value columns are an entry of the family too, under
``TYPES_KEY`` (past every key group, so range scans never meet it): a serialised Arrow schema of
the key columns then the value columns, with the number of key columns in its metadata. Each
database carries its own, so a restore that merges the databases of several old subtasks reads
every one with its own types. ``aggregate_batches`` makes the canonical table out of a family:
``key_group`` (int32), the key columns, the value columns, typed as recorded: the same table as
the in-memory ``AggregateTable``'s snapshot.

The namespaced tables of the vectorised windows (``NamespacedTables``: Arrow tables per
namespace, a window start) take a column family each too: a table added to a namespace is cut
by key group, and each piece is one entry, RocksDB key = key group + ``encode((namespace,
sequence))`` (the sequence numbers the additions), value = the piece as an Arrow IPC stream.
Their ``TYPES_KEY`` entry is the schema of their tables (every addition's, unified) with the
namespaces flagged (windows that have fired) in its metadata. ``namespaced_batches`` makes
their canonical table: ``key_group`` (int32), ``namespace`` (int64), ``flagged`` (bool), then
the tables' columns, as the in-memory ``NamespacedTables`` snapshot.

A native snapshot's manifest names these columnar states in its schema metadata
(``COLUMNAR_KEY``: a JSON object, state name -> kind).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from yarnflow.common.rocksdb_db import scan
from yarnflow.common.state_format import MAX_PARALLELISM_KEY, decode

if TYPE_CHECKING:  # rocksdict is loaded only by jobs on the rocksdb backend
    from rocksdict import Rdict

__all__ = ["AGGREGATE_KIND", "COLUMNAR_KEY", "NAMESPACED_KIND", "TYPES_KEY", "aggregate_batches", "columnar_batches",
           "columnar_states", "conform", "from_ipc", "from_storage", "namespaced_batches", "namespaced_entry", "read_namespaced",
           "read_types", "to_ipc", "to_storage", "types_entry"]

#: schema metadata of a native snapshot's manifest: its columnar states on disk (name -> kind)
COLUMNAR_KEY = b"yarnflow.rocksdb.columnar"
AGGREGATE_KIND = "aggregate_table"
NAMESPACED_KIND = "namespaced_tables"
#: the entry of an aggregate's family that holds its Arrow types: after every key group's entries
#: (an entry of key group 0xffff goes on with an encoded tuple's tag, never with 0xff)
TYPES_KEY = b"\xff\xff\xff\xfftypes"
_KEY_COUNT = b"yarnflow.key_columns"
_FLAGGED = b"yarnflow.flagged"


def _int_view(t: pa.DataType) -> pa.DataType | None:
    if pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_duration(t):
        return pa.int32() if t.bit_width == 32 else pa.int64()
    return None


def to_storage(arr: pa.Array | pa.ChunkedArray) -> list[Any]:
    """The values of ``arr`` in their storage form (see the module docstring)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    view = _int_view(t)
    if view is not None:
        return arr.view(view).to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_decimal(t):
        return arr.cast(pa.string()).to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_dictionary(t):
        return arr.dictionary_decode().to_pylist()  # type: ignore[no-any-return]
    return arr.to_pylist()  # type: ignore[no-any-return]


def from_storage(values: Sequence[Any], t: pa.DataType) -> pa.Array:
    """``values`` (storage form) as an Arrow array of type ``t``."""
    if pa.types.is_null(t):
        return pa.nulls(len(values))
    view = _int_view(t)
    if view is not None:
        return pa.array(values, type=view).view(t)
    if pa.types.is_decimal(t):
        return pa.array(values, type=pa.string()).cast(t)
    return pa.array(values, type=t)


def types_entry(keys: Sequence[str], key_types: Sequence[pa.DataType], values: Sequence[str],
                value_types: Sequence[pa.DataType]) -> bytes:
    """The ``TYPES_KEY`` entry for these columns."""
    schema = pa.schema([*zip(keys, key_types), *zip(values, value_types)],
                       metadata={_KEY_COUNT: str(len(keys)).encode()})
    return schema.serialize().to_pybytes()  # type: ignore[no-any-return]


def read_types(cf: Rdict) -> tuple[list[pa.Field], list[pa.Field]] | None:
    """(key fields, value fields) recorded in the family ``cf``; None when it has none (no row was
    ever written)."""
    data = cf.get(TYPES_KEY)
    if data is None:
        return None
    schema = pa.ipc.read_schema(pa.py_buffer(data))
    nk = int((schema.metadata or {})[_KEY_COUNT])
    fields = list(schema)
    return fields[:nk], fields[nk:]


def columnar_states(metadata: dict[bytes, bytes]) -> dict[str, str]:
    """State name -> kind of the columnar states a manifest's ``metadata`` names."""
    raw = metadata.get(COLUMNAR_KEY)
    return json.loads(raw) if raw else {}


def aggregate_batches(cf: Rdict, key_group_range: range, metadata: dict[bytes, bytes] | None = None,
                      batch_rows: int = 65_536) -> Iterator[pa.RecordBatch]:
    """The canonical table of the aggregate family ``cf`` in ``key_group_range`` (see the module
    docstring), as record batches of at most ``batch_rows`` rows, with ``metadata`` in their
    schema (the max parallelism): a large state is never in memory as a whole."""

    fields = read_types(cf)
    if fields is None:
        return
    key_fields, value_fields = fields
    schema = pa.schema([pa.field("key_group", pa.int32()), *key_fields, *value_fields],
                       metadata={k: v for k, v in (metadata or {}).items() if k == MAX_PARALLELISM_KEY})
    groups: list[int] = []
    keys: list[Any] = []
    values: list[Any] = []

    def batch() -> pa.RecordBatch:
        key_cols: list[Sequence[Any]] = list(zip(*keys)) if keys else [[] for _ in key_fields]
        value_cols: list[Sequence[Any]] = list(zip(*values)) if values else [[] for _ in value_fields]
        arrays = [pa.array(groups, pa.int32())]
        arrays += [from_storage(col, f.type) for col, f in zip(key_cols, key_fields)]
        arrays += [from_storage(col, f.type) for col, f in zip(value_cols, value_fields)]
        return pa.record_batch(arrays, schema=schema)

    for kg, key, value in scan(cf, key_group_range):
        if key_group_range.stop >= 1 << 16 and kg == 0xFFFF and key.startswith(TYPES_KEY[2:]):
            continue
        groups.append(kg)
        keys.append(decode(key))
        values.append(decode(value))
        if len(groups) >= batch_rows:
            yield batch()
            groups, keys, values = [], [], []
    if groups:
        yield batch()


def to_ipc(table: pa.Table) -> bytes:
    """``table`` as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()  # type: ignore[no-any-return]


def from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def namespaced_entry(schema: pa.Schema | None, flagged: set[int]) -> bytes:
    """The ``TYPES_KEY`` entry of namespaced tables: their schema, the flagged namespaces."""
    marked = (schema or pa.schema([])).with_metadata({_FLAGGED: json.dumps(sorted(flagged)).encode()})
    return marked.serialize().to_pybytes()  # type: ignore[no-any-return]


def read_namespaced(cf: Rdict) -> tuple[pa.Schema, set[int]] | None:
    """(schema, flagged namespaces) recorded in the family ``cf``; None when it has none."""
    data = cf.get(TYPES_KEY)
    if data is None:
        return None
    schema = pa.ipc.read_schema(pa.py_buffer(data))
    flagged = set(json.loads((schema.metadata or {}).get(_FLAGGED, b"[]")))
    return schema.remove_metadata(), flagged


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with the columns of ``schema`` (cast; null where it has none)."""
    if table.schema.equals(schema):
        return table
    n = table.num_rows
    cols = [table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(n, f.type)
            for f in schema]
    return pa.Table.from_arrays(cols, schema=schema)


def namespaced_batches(cf: Rdict, key_group_range: range, metadata: dict[bytes, bytes] | None = None,
                       batch_rows: int = 65_536) -> Iterator[pa.RecordBatch]:
    """The canonical table of the namespaced-tables family ``cf`` in ``key_group_range`` (see
    the module docstring), as record batches of about ``batch_rows`` rows at most."""

    found = read_namespaced(cf)
    if found is None:
        return
    schema, flagged = found
    head = [pa.field("key_group", pa.int32()), pa.field("namespace", pa.int64()), pa.field("flagged", pa.bool_())]
    out_schema = pa.schema([*head, *schema],
                           metadata={k: v for k, v in (metadata or {}).items() if k == MAX_PARALLELISM_KEY})
    parts: list[pa.Table] = []
    rows = 0
    for kg, key, value in scan(cf, key_group_range):
        if key_group_range.stop >= 1 << 16 and kg == 0xFFFF and key.startswith(TYPES_KEY[2:]):
            continue
        ns, _seq = decode(key)
        piece = conform(from_ipc(value), schema)
        n = piece.num_rows
        arrays = [pa.array([kg] * n, pa.int32()), pa.array([ns] * n, pa.int64()), pa.array([ns in flagged] * n)]
        parts.append(pa.Table.from_arrays([*arrays, *piece.columns], schema=out_schema))
        rows += n
        if rows >= batch_rows:
            yield from pa.concat_tables(parts).combine_chunks().to_batches(max_chunksize=batch_rows)
            parts, rows = [], 0
    if parts:
        yield from pa.concat_tables(parts).combine_chunks().to_batches(max_chunksize=batch_rows)


def columnar_batches(kind: str, cf: Rdict, key_group_range: range, metadata: dict[bytes, bytes] | None = None,
                     batch_rows: int = 65_536) -> Iterator[pa.RecordBatch]:
    """The canonical table of a columnar state of ``kind`` in family ``cf``; raises ValueError
    for a kind it does not know."""
    if kind == AGGREGATE_KIND:
        return aggregate_batches(cf, key_group_range, metadata, batch_rows)
    if kind == NAMESPACED_KIND:
        return namespaced_batches(cf, key_group_range, metadata, batch_rows)
    raise ValueError(f"unknown columnar state kind {kind!r}")
