"""The limits a Thrift server applies to each call before decoding it (issue 31, hardened
inputs): how deep a message nests, scanned without recursion, exactly at its bounds, and the
configuration that sets them."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from thrift.protocol.TProtocol import TProtocolException
from thrift.Thrift import TMessageType, TType
from thrift.transport import TTransport

from yarnflow.common.config import Configuration
from yarnflow.common.errors import ConfigurationError
from yarnflow.common.rpc.gen.yarnflow_rpc import (
    DispatcherService,
    JobMasterService,
    ResourceManagerService,
    TaskExecutorService,
)
from yarnflow.common.rpc.limits import THRIFT_DECODER_DEPTH, RpcLimits, check_nesting, idl_depth
from yarnflow.common.rpc.server import protocol_factory

pytestmark = pytest.mark.timeout(60)

HEADER = struct.pack("!i", -2147418112 | 1) + struct.pack("!i", 4) + b"ping" + struct.pack("!i", 1)


def _field(ttype: int, fid: int = 99) -> bytes:
    return bytes([ttype]) + struct.pack("!h", fid)


def _lists(depth: int, inner: bytes = b"\x08" + struct.pack("!i", 0)) -> bytes:
    """A list field nesting ``depth`` lists (the outermost included), the innermost of i32s."""
    body = inner
    for _ in range(depth - 1):
        body = b"\x0f" + struct.pack("!i", 1) + body
    return HEADER + _field(15) + body + b"\x00"


def _depth_error(message: bytes, limit: int) -> int | None:
    try:
        check_nesting(message, limit)
    except TProtocolException as exc:
        return int(exc.type)
    return None


@pytest.mark.parametrize("depth", [1, 5, 63])
def test_a_message_exactly_at_the_limit_passes_and_one_level_more_is_refused(depth: int) -> None:
    # the arguments struct is level 1: a list field in it with `depth` lists is depth + 1 deep
    message = _lists(depth)
    assert _depth_error(message, depth + 1) is None
    assert _depth_error(message, depth) == TProtocolException.DEPTH_LIMIT


def test_structs_maps_and_sets_count_as_levels_and_a_skipped_field_is_scanned_too() -> None:
    struct_in_struct = HEADER + _field(12) + _field(12, 1) + _field(8, 1) + b"\x00" * 4 + b"\x00" + b"\x00" + b"\x00"
    assert _depth_error(struct_in_struct, 3) is None and _depth_error(struct_in_struct, 2) == TProtocolException.DEPTH_LIMIT
    # map<string, set<i64>> with one entry holding two values: args, map, set = 3
    map_of_sets = (HEADER + _field(13) + bytes([11, 14]) + struct.pack("!i", 1) + struct.pack("!i", 1) + b"k"
                   + bytes([10]) + struct.pack("!i", 2) + b"\x00" * 16 + b"\x00")
    assert _depth_error(map_of_sets, 3) is None and _depth_error(map_of_sets, 2) == TProtocolException.DEPTH_LIMIT
    # a list of 100,000 nested lists costs the scan a loop, not a stack
    assert _depth_error(_lists(100_000), 64) == TProtocolException.DEPTH_LIMIT


@pytest.mark.parametrize("message", [
    HEADER + _field(11) + struct.pack("!i", 50) + b"short",  # a string longer than what follows
    HEADER + _field(15) + b"\x0f" + struct.pack("!i", 1_000_000),  # a million lists announced, none there
    HEADER + _field(11) + struct.pack("!i", -5) + b"\x00",  # a negative length
    HEADER + _field(15) + b"\x08" + struct.pack("!i", -1) + b"\x00",
    HEADER + _field(99) + b"\x00",  # no such type
    HEADER[:6],  # cut inside its header
    HEADER,  # no arguments at all
])
def test_a_malformed_message_is_invalid_data_not_an_exception_of_the_scan(message: bytes) -> None:
    assert _depth_error(message, 8) == TProtocolException.INVALID_DATA


def _filled(ttype: int, args: Any) -> Any:
    """A value of a Thrift type with every field set and one item in every container: as deep as the type goes."""
    if ttype == TType.STRUCT:
        cls = args[0]
        return cls(**{f[2]: _filled(f[1], f[3]) for f in cls.thrift_spec if f})
    if ttype == TType.LIST:
        return [_filled(args[0], args[1])]
    if ttype == TType.SET:
        return {_filled(args[0], args[1])}
    if ttype == TType.MAP:
        return {_filled(args[0], args[1]): _filled(args[2], args[3])}
    return {TType.STRING: "x", TType.BOOL: True, TType.DOUBLE: 1.5}.get(ttype, 1)


def _calls() -> list[tuple[str, bytes]]:
    out = []
    for service in (DispatcherService, JobMasterService, ResourceManagerService, TaskExecutorService):
        for name in dir(service):
            if name.endswith("_args"):
                cls = getattr(service, name)
                buf = TTransport.TMemoryBuffer()
                protocol = protocol_factory().getProtocol(buf)
                protocol.writeMessageBegin(f"svc:{name[:-5]}", TMessageType.CALL, 1)
                _filled(TType.STRUCT, (cls, cls.thrift_spec)).write(protocol)
                protocol.writeMessageEnd()
                out.append((f"{service.__name__.rsplit('.', 1)[-1]}.{name[:-5]}", buf.getvalue()))
    return out


def test_every_call_of_the_interface_filled_to_its_depth_passes_at_the_lowest_allowed_limit() -> None:
    calls = _calls()
    assert len(calls) > 30
    lowest = idl_depth()
    refused_one_lower = [name for name, message in calls if _depth_error(message, lowest - 1) is not None]
    assert all(_depth_error(message, lowest) is None for _, message in calls)
    assert refused_one_lower  # the deepest calls are exactly that deep
    assert "TaskExecutorService.submitTask" in refused_one_lower


def test_the_limits_come_from_the_configuration_and_refuse_what_cannot_work() -> None:
    assert RpcLimits.from_config(Configuration.load({})) == RpcLimits()
    limits = RpcLimits.from_config(Configuration.load({"rpc.max-message-size": "1 mb", "rpc.max-nesting-depth": "8"}))
    assert (limits.max_message_bytes, limits.max_nesting_depth) == (1 << 20, 8)
    assert 1 < idl_depth() < THRIFT_DECODER_DEPTH
    with pytest.raises(ConfigurationError, match=f"rpc.max-nesting-depth is 2: it must be at least {idl_depth()}"):
        RpcLimits.from_config(Configuration.load({"rpc.max-nesting-depth": "2"}))
    with pytest.raises(ConfigurationError, match="at most 64"):
        Configuration.load({"rpc.max-nesting-depth": "65"})
    with pytest.raises(ConfigurationError, match="at most"):
        Configuration.load({"rpc.max-message-size": "2 gb"})
