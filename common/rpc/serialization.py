"""Messages as bytes, in the Thrift binary encoding of their IDL struct: what the
high-availability stores keep (a JobGraph, a JobResult), so a stored value reads back the same
in any process and any later version that keeps the IDL compatible."""

from __future__ import annotations

from typing import TypeVar

from thrift.protocol import TBinaryProtocol
from thrift.TSerialization import deserialize, serialize

from yarnflow.common.message_base import Message

__all__ = ["message_from_bytes", "message_to_bytes"]

M = TypeVar("M", bound=Message)
_PROTOCOL = TBinaryProtocol.TBinaryProtocolAcceleratedFactory()


def message_to_bytes(message: Message) -> bytes:
    return serialize(message.to_thrift(), _PROTOCOL)  # type: ignore[no-any-return]


def message_from_bytes(cls: type[M], data: bytes) -> M:
    """Raises ValueError when ``data`` is not an encoded ``cls``."""
    try:
        return cls.from_thrift(deserialize(cls._thrift(), data, _PROTOCOL))
    except Exception as exc:  # noqa: BLE001 - any decoding failure is bad data
        raise ValueError(f"not an encoded {cls.__name__}: {type(exc).__name__}: {exc}") from exc
