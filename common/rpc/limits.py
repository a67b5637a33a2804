"""What one Thrift call may be, checked before the decoder builds anything of it.

Calls travel framed (Thrift's framed transport: a 4-byte length, then the message), so a server
knows a message's size before it reads it and refuses one above ``rpc.max-message-size``
without holding it. Inside a message, strings and containers are length-limited by the decoder
(``rpc.max-string-size``, ``rpc.max-container-items``). How deep structs and containers nest is
bounded by Thrift's accelerated decoder at a fixed 64 (its C code's own recursion limit, which it
also applies when it skips a field it does not know); ``rpc.max-nesting-depth`` may set it lower,
and then every message is scanned for its depth, without recursion, before it is decoded. It
cannot be set below what the IDL itself needs (the deepest arguments of any call) nor above 64.

A message beyond a limit ends its connection (logged once per host by the server); the server
and its other connections serve on.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from io import BytesIO
from typing import TYPE_CHECKING, Any

from thrift.protocol.TProtocol import TProtocolException
from thrift.Thrift import TType
from thrift.transport.TTransport import CReadableTransport, TTransportBase, TTransportException

if TYPE_CHECKING:
    from yarnflow.common.config import Configuration

#: how deep Thrift's accelerated decoder lets structs and containers nest (fixed in its C code)
THRIFT_DECODER_DEPTH = 64

_FIXED = {TType.BOOL: 1, TType.BYTE: 1, TType.DOUBLE: 8, TType.I16: 2, TType.I32: 4, TType.I64: 8, 16: 16}  # 16: UUID
_I32 = struct.Struct("!i")
_STRUCT, _SEQ, _MAP = 0, 1, 2


@dataclass(frozen=True)
class RpcLimits:
    """The limits a server applies to every call it reads."""

    max_message_bytes: int = 256 << 20
    max_string_bytes: int = 256 << 20
    max_container_items: int = 1 << 22
    max_nesting_depth: int = THRIFT_DECODER_DEPTH

    @staticmethod
    def from_config(config: Configuration) -> RpcLimits:
        from yarnflow.common.config import Options
        from yarnflow.common.errors import ConfigurationError

        depth, needed = config[Options.RPC_MAX_NESTING], idl_depth()
        if depth < needed:  # (at most 64 and 1 gb are the options' own bounds)
            raise ConfigurationError(f"rpc.max-nesting-depth is {depth}: it must be at least {needed}, how deep the "
                                     "arguments of the deepest call of yarnflow's RPC interface nest")
        size = config[Options.RPC_MAX_MESSAGE]
        return RpcLimits(size, config[Options.RPC_MAX_STRING], config[Options.RPC_MAX_CONTAINER], depth)


class LimitedFramedTransport(TTransportBase, CReadableTransport):  # type: ignore[misc]  # thrift is untyped
    """Thrift's framed transport, with a message's size checked before it is read and, where
    ``max_depth`` is below Thrift's own limit, its nesting checked before it is decoded.
    (Thrift's ``TFramedTransport`` checks a size too, but keeps its read buffer private, so the
    check between reading a frame and decoding it cannot be added by subclassing it.)"""

    def __init__(self, trans: Any, max_bytes: int = RpcLimits.max_message_bytes,
                 max_depth: int = THRIFT_DECODER_DEPTH) -> None:
        self._trans = trans
        self._max_bytes = max_bytes
        self._max_depth = max_depth
        self._rbuf = BytesIO(b"")
        self._wbuf = BytesIO()

    def isOpen(self) -> bool:  # noqa: N802 - Thrift's names
        return bool(self._trans.isOpen())

    def open(self) -> None:
        self._trans.open()

    def close(self) -> None:
        self._trans.close()

    def read(self, sz: int) -> bytes:
        data = self._rbuf.read(sz)
        if data:
            return data
        self._read_frame()
        return self._rbuf.read(sz)

    def _read_frame(self) -> None:
        (size,) = _I32.unpack(self._trans.readAll(4))
        if size < 0:
            raise TTransportException(TTransportException.NEGATIVE_SIZE, f"a message of negative size ({size})")
        if size > self._max_bytes:
            raise TTransportException(TTransportException.SIZE_LIMIT,
                                      f"a message of {size} bytes, above rpc.max-message-size ({self._max_bytes})")
        frame = self._trans.readAll(size)
        if self._max_depth < THRIFT_DECODER_DEPTH:
            check_nesting(frame, self._max_depth)
        self._rbuf = BytesIO(frame)

    def write(self, buf: bytes) -> None:
        self._wbuf.write(buf)

    def flush(self) -> None:
        out = self._wbuf.getvalue()
        self._wbuf = BytesIO()
        self._trans.write(_I32.pack(len(out)) + out)  # one write: a second send costs more than the copy
        self._trans.flush()

    @property
    def cstringio_buf(self) -> BytesIO:  # the accelerated decoder reads this buffer directly
        return self._rbuf

    def cstringio_refill(self, prefix: bytes, reqlen: int) -> BytesIO:
        while len(prefix) < reqlen:
            self._read_frame()
            prefix += self._rbuf.getvalue()
        self._rbuf = BytesIO(prefix)
        return self._rbuf


class LimitedFramedTransportFactory:
    def __init__(self, limits: RpcLimits) -> None:
        self._limits = limits

    def getTransport(self, trans: Any) -> LimitedFramedTransport:  # noqa: N802 - Thrift's names
        return LimitedFramedTransport(trans, self._limits.max_message_bytes, self._limits.max_nesting_depth)


def check_nesting(message: bytes, limit: int) -> None:
    """Raise ``TProtocolException`` (DEPTH_LIMIT) if the structs and containers of a binary-protocol
    message nest deeper than ``limit`` (its arguments struct is depth 1), INVALID_DATA if it is
    not one. Iterative: a hostile message cannot exhaust the stack of the scan itself."""
    try:
        _scan(message, limit)
    except (IndexError, struct.error):
        raise TProtocolException(TProtocolException.INVALID_DATA, "a malformed message (it ends early)") from None


def _scan(buf: bytes, limit: int) -> None:
    (first,) = _I32.unpack_from(buf, 0)
    if first < 0:  # strict: version and type, name, sequence id
        pos = 8 + _I32.unpack_from(buf, 4)[0] + 4
    else:  # old style: name, type, sequence id
        pos = 4 + first + 1 + 4
    end = len(buf)
    stack: list[list[int]] = [[_STRUCT, 0, 0, 0]]  # [kind, type a, type b, values left]
    while stack:
        if pos > end:
            raise IndexError
        top = stack[-1]
        kind = top[0]
        if kind == _STRUCT:
            ttype = buf[pos]
            pos += 1
            if ttype == TType.STOP:
                stack.pop()
                continue
            pos += 2  # the field id
        else:
            left = top[3]
            if left == 0:
                stack.pop()
                continue
            top[3] = left - 1
            ttype = top[1] if kind == _SEQ or left % 2 == 0 else top[2]
        size = _FIXED.get(ttype)
        if size is not None:
            pos += size
        elif ttype == TType.STRING:
            n = _I32.unpack_from(buf, pos)[0]
            if n < 0:
                raise IndexError
            pos += 4 + n
        elif ttype == TType.STRUCT:
            stack.append([_STRUCT, 0, 0, 0])
        elif ttype in (TType.LIST, TType.SET):
            etype, n = buf[pos], _I32.unpack_from(buf, pos + 1)[0]
            pos += 5
            if n < 0:
                raise IndexError
            esize = _FIXED.get(etype)
            if esize is not None:  # a list of fixed-size values: stepped over at once
                pos += esize * n
                if len(stack) + 1 > limit:
                    break
                continue
            stack.append([_SEQ, etype, 0, n])
        elif ttype == TType.MAP:
            ktype, vtype, n = buf[pos], buf[pos + 1], _I32.unpack_from(buf, pos + 2)[0]
            pos += 6
            if n < 0:
                raise IndexError
            stack.append([_MAP, ktype, vtype, 2 * n])
        else:
            raise TProtocolException(TProtocolException.INVALID_DATA, f"a malformed message (type {ttype})")
        if len(stack) > limit:
            break
    else:
        return
    raise TProtocolException(TProtocolException.DEPTH_LIMIT,
                             f"a message nested deeper than rpc.max-nesting-depth ({limit})")


def idl_depth() -> int:
    """How deep the arguments of yarnflow's deepest call nest (its arguments struct is depth 1)."""
    import importlib

    from yarnflow.common.rpc.gen import yarnflow_rpc

    deepest = 0
    for service in ("DispatcherService", "JobMasterService", "ResourceManagerService", "TaskExecutorService"):
        module = importlib.import_module(f"{yarnflow_rpc.__name__}.{service}")
        for name in dir(module):
            if name.endswith("_args"):
                cls = getattr(module, name)
                deepest = max(deepest, _depth(TType.STRUCT, (cls, cls.thrift_spec), ()))
    return deepest


def _depth(ttype: int, args: Any, seen: tuple[type, ...]) -> int:
    if ttype == TType.STRUCT:
        cls = args[0]
        if cls in seen:  # a recursive type: as deep as a message can be
            return THRIFT_DECODER_DEPTH
        return 1 + max([_depth(f[1], f[3], seen + (cls,)) for f in cls.thrift_spec if f] or [0])
    if ttype in (TType.LIST, TType.SET):
        return 1 + _depth(args[0], args[1], seen)
    if ttype == TType.MAP:
        return 1 + max(_depth(args[0], args[1], seen), _depth(args[2], args[3], seen))
    return 0
