"""The formats of keyed state in snapshots, shared by the TaskExecutor (which writes and reads
them) and the AppMaster (which turns a RocksDB snapshot into a savepoint's tables).

- the canonical tables of keyed state (``KEYED_STATE_SCHEMA``, ``TIMERS_SCHEMA``; see
  ``worker/state/heap.py``) with the max parallelism in their schema metadata
  (``MAX_PARALLELISM_KEY``), and ``dumps``/``loads``: one pickled cell per value there;
- ``encode``/``decode``: a compact binary format for the keys and values of the RocksDB state
  backend, described below.

Values of known types are written as a tag byte and a fixed or length-prefixed body: ``None``,
``bool``, ``int`` (8 bytes when it fits, else its decimal digits), ``float`` (8 bytes), ``str``
(UTF-8), ``bytes``, and ``tuple`` / ``list`` / ``dict`` of such values. Anything else (a user's
object) is one pickle, marked with its own tag. A decoded value has the type it was written
with (a tuple stays a tuple, so a key decodes to the same tuple).

The encoding is deterministic for these types (a dict in its insertion order), so equal keys
give equal bytes: the backend uses the bytes as RocksDB keys.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

import cloudpickle
import pyarrow as pa

__all__ = ["KEYED_STATE_SCHEMA", "MAX_PARALLELISM_KEY", "TIMERS_SCHEMA", "decode", "dumps", "encode", "loads"]

KEYED_STATE_SCHEMA = pa.schema([("key_group", pa.int32()), ("state", pa.string()), ("kind", pa.string()),
                                ("key", pa.binary()), ("namespace", pa.binary()), ("value", pa.binary())])
TIMERS_SCHEMA = pa.schema([("key_group", pa.int32()), ("service", pa.string()), ("domain", pa.string()),
                           ("timestamp", pa.int64()), ("key", pa.binary()), ("namespace", pa.binary()),
                           ("seq", pa.int64())])
#: schema metadata of every table a keyed backend writes: key groups only mean something for one max parallelism
MAX_PARALLELISM_KEY = b"yarnflow.max_parallelism"


def dumps(value: Any) -> bytes:
    """``value`` as bytes (plain pickle when it can, else cloudpickle: lambdas, local classes)."""
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - anything plain pickle refuses, cloudpickle may take
        return cloudpickle.dumps(value)  # type: ignore[no-any-return]


def loads(data: bytes) -> Any:
    return pickle.loads(data)

_NONE, _FALSE, _TRUE, _INT, _BIGINT, _FLOAT, _STR, _BYTES, _TUPLE, _LIST, _DICT, _PICKLE = range(12)
_Q = struct.Struct(">q")
_D = struct.Struct(">d")
_I = struct.Struct(">I")
_INT_TAG = bytes([_INT])


def encode(value: Any) -> bytes:
    """``value`` as bytes (see the module docstring)."""
    if type(value) is int and -(1 << 63) <= value < (1 << 63):  # the commonest value: a count
        return _INT_TAG + _Q.pack(value)
    out = bytearray()
    _write(out, value)
    return bytes(out)


def _write(out: bytearray, value: Any) -> None:
    t = type(value)
    if value is None:
        out.append(_NONE)
    elif t is bool:
        out.append(_TRUE if value else _FALSE)
    elif t is int:
        if -(1 << 63) <= value < (1 << 63):
            out.append(_INT)
            out += _Q.pack(value)
        else:
            digits = str(value).encode()
            out.append(_BIGINT)
            out += _I.pack(len(digits)) + digits
    elif t is float:
        out.append(_FLOAT)
        out += _D.pack(value)
    elif t is str:
        data = value.encode("utf-8", "surrogatepass")
        out.append(_STR)
        out += _I.pack(len(data)) + data
    elif t is bytes:
        out.append(_BYTES)
        out += _I.pack(len(value)) + value
    elif t is tuple or t is list:
        out.append(_TUPLE if t is tuple else _LIST)
        out += _I.pack(len(value))
        for item in value:
            _write(out, item)
    elif t is dict:
        out.append(_DICT)
        out += _I.pack(len(value))
        for k, v in value.items():
            _write(out, k)
            _write(out, v)
    else:
        data = dumps(value)
        out.append(_PICKLE)
        out += _I.pack(len(data)) + data


def decode(data: bytes) -> Any:
    """The value ``data`` (from ``encode``) stands for. Raises ValueError on bytes it did not make."""
    try:
        value, end = _read(memoryview(data), 0)
    except (IndexError, struct.error) as exc:
        raise ValueError(f"not an encoded state value ({len(data)} bytes): {exc}") from None
    if end != len(data):
        raise ValueError(f"not an encoded state value: {len(data) - end} bytes left over")
    return value


def _read(buf: memoryview, at: int) -> tuple[Any, int]:
    tag = buf[at]
    at += 1
    if tag == _NONE:
        return None, at
    if tag == _FALSE or tag == _TRUE:
        return tag == _TRUE, at
    if tag == _INT:
        return _Q.unpack_from(buf, at)[0], at + 8
    if tag == _FLOAT:
        return _D.unpack_from(buf, at)[0], at + 8
    if tag in (_BIGINT, _STR, _BYTES, _PICKLE):
        (n,) = _I.unpack_from(buf, at)
        at += 4
        body = bytes(buf[at:at + n])
        if len(body) != n:
            raise IndexError("truncated")
        at += n
        if tag == _STR:
            return body.decode("utf-8", "surrogatepass"), at
        if tag == _BYTES:
            return body, at
        if tag == _BIGINT:
            return int(body), at
        return loads(body), at
    if tag in (_TUPLE, _LIST, _DICT):
        (n,) = _I.unpack_from(buf, at)
        at += 4
        if tag == _DICT:
            d = {}
            for _ in range(n):
                k, at = _read(buf, at)
                d[k], at = _read(buf, at)
            return d, at
        items = []
        for _ in range(n):
            item, at = _read(buf, at)
            items.append(item)
        return (tuple(items) if tag == _TUPLE else items), at
    raise IndexError(f"unknown tag {tag}")
