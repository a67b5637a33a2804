"""The value formats of the Kafka connectors (``worker/operators/kafka.py``): records' bytes
to Arrow columns and rows to bytes, per batch where the format allows (JSON and CSV through
pyarrow's readers; Avro through fastavro, one record at a time)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson

from yarnflow.common.errors import YarnflowError


class KafkaSourceError(YarnflowError, RuntimeError):
    """The Kafka source cannot go on: a broker error, or a record it cannot decode (the message
    names the topic, partition and offset)."""


def decode_values(fmt: str, values: list[bytes | None], schema: pa.Schema | None,
                  where: Callable[[int], str], csv_columns: list[str] | None = None,
                  avro_schema: Any = None) -> pa.Table:
    """The records' values as columns: ``raw`` (binary ``value``), ``string`` (``value``),
    ``json`` (one JSON object per record: its fields), ``csv`` (one line per record), ``avro``
    (Avro binary of a record schema, without a header: its fields). A record that does not
    decode raises KafkaSourceError naming it (``where(i)``)."""
    if fmt == "raw":
        return pa.table({"value": pa.array(values, pa.binary())})
    if fmt == "string":
        try:
            return pa.table({"value": pa.array([None if v is None else v.decode() for v in values], pa.string())})
        except UnicodeDecodeError:
            bad = next(i for i, v in enumerate(values) if v is not None and not _utf8(v))
            raise KafkaSourceError(f"the record at {where(bad)} is not UTF-8 text") from None
    if fmt == "json":
        try:  # (one line per record: a record with a line break of its own, or none, takes the slow path)
            data = b"\n".join(values)  # type: ignore[arg-type]
            if data.count(b"\n") != len(values) - 1:
                raise TypeError
        except TypeError:
            data = b"\n".join(b"{}" if v is None else v.replace(b"\n", b" ") for v in values)
        try:
            opts = pajson.ParseOptions(explicit_schema=schema) if schema is not None else None
            # (one thread, one block: a poll's worth is small, and the task is one of a core's few)
            read = pajson.ReadOptions(use_threads=False, block_size=max(1 << 20, len(data) + 1))
            table = pajson.read_json(io.BytesIO(data), read_options=read, parse_options=opts)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise KafkaSourceError(f"the record at {where(_first_bad_json(values))} is not a JSON object: "
                                   f"{exc}") from None
        if table.num_rows != len(values):
            raise KafkaSourceError(f"the record at {where(_first_bad_json(values))} is not one JSON object")
        return table
    if fmt == "avro":
        return _decode_avro(values, avro_schema, where)
    if fmt == "csv":
        data = b"\n".join(b"" if v is None else v.rstrip(b"\r\n") for v in values) + b"\n"
        read = pacsv.ReadOptions(column_names=csv_columns or (schema.names if schema is not None else None),
                                 autogenerate_column_names=not (csv_columns or schema))
        convert = pacsv.ConvertOptions(column_types=schema) if schema is not None else None
        try:
            table = pacsv.read_csv(io.BytesIO(data), read_options=read, convert_options=convert)
        except pa.ArrowInvalid as exc:
            raise KafkaSourceError(f"a record in the batch at {where(0)}... does not parse as CSV: {exc}") from None
        if table.num_rows != len(values):
            raise KafkaSourceError(f"the records at {where(0)}... are not one CSV line each")
        return table
    raise ValueError(f"unknown Kafka value format {fmt!r}")


def _parsed_avro(schema: Any) -> Any:
    import fastavro

    return fastavro.parse_schema(json.loads(schema) if isinstance(schema, str) else schema)


def _decode_avro(values: list[bytes | None], schema: Any, where: Callable[[int], str]) -> pa.Table:
    import fastavro

    if schema is None:
        raise KafkaSourceError("the Avro format needs the records' schema (set_avro_schema)")
    parsed = _parsed_avro(schema)
    rows = []
    for i, v in enumerate(values):
        try:
            rows.append(fastavro.schemaless_reader(io.BytesIO(v or b""), parsed, None))
        except Exception as exc:  # noqa: BLE001 - any decoding failure: the record is named
            raise KafkaSourceError(f"the record at {where(i)} is not Avro of the given schema: "
                                   f"{type(exc).__name__}: {exc}") from None
    return pa.Table.from_pylist(rows)


def _encode_avro(table: pa.Table, schema: Any) -> list[bytes]:
    import fastavro

    parsed = _parsed_avro(schema)
    out = []
    for row in table.to_pylist():
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, row)
        out.append(buf.getvalue())
    return out


def _utf8(v: bytes) -> bool:
    try:
        v.decode()
        return True
    except UnicodeDecodeError:
        return False


def _first_bad_json(values: list[bytes | None]) -> int:
    for i, v in enumerate(values):
        try:
            if not isinstance(json.loads(v or b"{}"), dict):
                return i
        except ValueError:
            return i
    return 0


def encode_values(fmt: str, table: pa.Table, column: str | None, avro_schema: Any = None) -> list[bytes]:
    """Each row's value: ``json`` (the row as a JSON object), ``string`` / ``raw`` (one column),
    ``csv`` (the row as one CSV line, no header), ``avro`` (the row in Avro binary)."""
    if fmt == "avro":
        return _encode_avro(table, avro_schema)
    if fmt == "json":
        return [json.dumps(row, default=str, separators=(",", ":")).encode() for row in table.to_pylist()]
    if fmt in ("string", "raw"):
        name = column or ("value" if "value" in table.column_names else table.column_names[0])
        values = table.column(name).to_pylist()
        return [v if isinstance(v, bytes) else str(v).encode() for v in values]
    if fmt == "csv":
        out = io.BytesIO()
        pacsv.write_csv(table, out, pacsv.WriteOptions(include_header=False))
        return out.getvalue().rstrip(b"\n").split(b"\n") if table.num_rows else []
    raise ValueError(f"unknown Kafka value format {fmt!r}")


def encode_keys(table: pa.Table, columns: list[str]) -> list[bytes | None]:
    if not columns:
        return [None] * table.num_rows
    if len(columns) == 1:
        return [None if v is None else str(v).encode() for v in table.column(columns[0]).to_pylist()]
    rows = zip(*(table.column(c).to_pylist() for c in columns))
    return [json.dumps(list(r), default=str).encode() for r in rows]
