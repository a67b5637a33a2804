"""What travels through a channel besides record batches, in order with them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Watermark:
    """Event time has reached ``timestamp`` (ms): no older records are expected."""

    timestamp: int


@dataclass(frozen=True)
class WatermarkStatus:
    """A channel went idle (its watermark no longer holds others back) or active again."""

    idle: bool


IDLE = WatermarkStatus(True)
ACTIVE = WatermarkStatus(False)


@dataclass(frozen=True)
class EndOfPartition:
    """The producer subtask has emitted everything for this channel."""


END_OF_PARTITION = EndOfPartition()
MAX_WATERMARK = Watermark(2**63 - 1)


def encode_event(event: object) -> bytes:
    if isinstance(event, Watermark):
        return b"W" + str(event.timestamp).encode()
    if isinstance(event, EndOfPartition):
        return b"E"
    if isinstance(event, WatermarkStatus):
        return b"I" if event.idle else b"A"
    raise TypeError(f"not a channel event: {event!r}")


def decode_event(data: bytes) -> object:
    if data[:1] == b"W":
        return Watermark(int(data[1:]))
    if data[:1] == b"E":
        return END_OF_PARTITION
    if data[:1] == b"I":
        return IDLE
    if data[:1] == b"A":
        return ACTIVE
    raise ValueError(f"unknown channel event {data[:16]!r}")
