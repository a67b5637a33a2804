"""What a task and its Python worker send each other over their socket: a small pickled
header, then (for batches) one Arrow IPC stream. The socket is a
``multiprocessing.connection.Connection``, which frames each message."""

from __future__ import annotations

import pickle
from multiprocessing.connection import Connection
from typing import Any

import pyarrow as pa

__all__ = ["read_batches", "recv", "schema_bytes", "schema_of", "send", "write_batches"]


def send(conn: Connection, header: Any, payload: pa.Buffer | bytes | None = None) -> None:
    conn.send_bytes(pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL))
    if payload is not None:
        conn.send_bytes(memoryview(payload))


def recv(conn: Connection) -> Any:
    """The next header (raises EOFError when the other side has gone)."""
    return pickle.loads(conn.recv_bytes())


def write_batches(batches: list[pa.RecordBatch]) -> pa.Buffer:
    """``batches`` (of one schema, at least one) as one IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue()


def read_batches(data: bytes) -> list[pa.RecordBatch]:
    return list(pa.ipc.open_stream(pa.py_buffer(data)))


def schema_bytes(schema: pa.Schema | None) -> bytes | None:
    return None if schema is None else schema.serialize().to_pybytes()


def schema_of(data: bytes | None) -> pa.Schema | None:
    return None if data is None else pa.ipc.read_schema(pa.py_buffer(data))
