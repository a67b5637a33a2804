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


@dataclass(frozen=True)
class CheckpointBarrier:
    """Everything before it belongs to checkpoint ``checkpoint_id``, everything after to the
    next. Sources inject it; every task forwards it to all its subpartitions, after the data
    it has already emitted. ``exactly_once``: consumers align it (block each channel that
    delivered it until all did); otherwise they only count it (at-least-once)."""

    checkpoint_id: int
    timestamp_ms: int
    exactly_once: bool = True
    #: "stop" / "drain": the savepoint of stop-with-savepoint: nothing but the end of the
    #: partition follows it (with "drain", the producer finished its operators before it)
    stop: str = ""
    #: unaligned checkpoints: -1 never (aligned: savepoints, or unaligned checkpoints off), 0
    #: from the start, else once the checkpoint is this old (``aligned-checkpoint-timeout``)
    aligned_timeout_ms: int = -1

    def unaligned_at(self, now_ms: float) -> bool:
        """Whether a task that sees this barrier at ``now_ms`` (wall clock) takes it unaligned."""
        t = self.aligned_timeout_ms
        return self.exactly_once and (t == 0 or (t > 0 and now_ms - self.timestamp_ms >= t))


END_OF_PARTITION = EndOfPartition()
MAX_WATERMARK = Watermark(2**63 - 1)


def encode_event(event: object) -> bytes:
    if isinstance(event, Watermark):
        return b"W" + str(event.timestamp).encode()
    if isinstance(event, EndOfPartition):
        return b"E"
    if isinstance(event, WatermarkStatus):
        return b"I" if event.idle else b"A"
    if isinstance(event, CheckpointBarrier):
        return b"B%d:%d:%d:%s:%d" % (event.checkpoint_id, event.timestamp_ms, 1 if event.exactly_once else 0,
                                     event.stop.encode(), event.aligned_timeout_ms)
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
    if data[:1] == b"B":
        try:
            checkpoint_id, timestamp_ms, exactly_once, stop, timeout = data[1:].split(b":")
            if stop not in (b"", b"stop", b"drain"):
                raise ValueError(stop)
            return CheckpointBarrier(int(checkpoint_id), int(timestamp_ms), exactly_once == b"1", stop.decode(),
                                     int(timeout))
        except ValueError:
            raise ValueError(f"malformed checkpoint barrier {data[:64]!r}") from None
    raise ValueError(f"unknown channel event {data[:16]!r}")
