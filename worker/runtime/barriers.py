"""Checkpoint barrier alignment (pure: no threads, no I/O; time comes from an injected clock).

A task with inputs learns of checkpoint ``n`` from the barriers its channels deliver (or, when
every upstream task had already finished, from a trigger the JobMaster sends it directly).
``BarrierAligner`` decides, channel event by channel event, when the task takes its snapshot:

- **exactly-once** (``barrier.exactly_once``): a channel that delivered barrier ``n`` is
  *blocked*: the task holds back what arrives on it after the barrier (``is_blocked``) until
  every live channel delivered barrier ``n``. A channel that ended (end of partition) counts
  as aligned. Then ``Snapshot`` (the task snapshots its chain, forwards the barrier and replays
  what it held back).
- **at-least-once**: nothing is blocked; ``Snapshot`` when the last live channel delivered
  barrier ``n``.
- **trigger** (``on_trigger``): a pending checkpoint that no channel will deliver a barrier
  for: ``Snapshot`` once every remaining channel has ended. An unaligned one waits so for up to
  ``DIRECT_GRACE_MS`` (then it is also the final checkpoint of the task's chain, which commits
  its last output) and then turns unaligned: each remaining channel's end of partition plays
  its barrier's part, what comes before it is in-flight data.
- A newer checkpoint arriving (barrier or trigger) while an older one is pending supersedes it:
  ``Decline`` of the older one, then the newer one is aligned. Barriers of checkpoints already
  taken or superseded are ignored.

- **unaligned** (Flink's FLIP-76; a barrier whose ``unaligned_at`` holds when it comes, or a
  pending aligned checkpoint older than its ``aligned_timeout_ms``: ``on_timeout``): ``Snapshot``
  (``unaligned``) at once; nothing is blocked. The channels whose barrier has not come yet are
  *recording* (``is_recording``): what the task takes from them until it comes is in-flight
  data of the checkpoint. ``InflightComplete`` once every live channel delivered the barrier
  (or ended).

One checkpoint is pending at a time: each event costs O(1) plus, when a checkpoint completes,
O(channels) to check them all.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Callable, Union

from yarnflow.worker.elements import CheckpointBarrier

log = logging.getLogger(__name__)

#: how long a checkpoint triggered directly (every upstream task finished) waits for the inputs
#: to end before it turns unaligned, when it may: a quick end makes it the final checkpoint of
#: the chain too (no further checkpoint is needed before a bounded job ends), a slow one does
#: not hold it up for longer
DIRECT_GRACE_MS = 200


@dataclass(frozen=True)
class Snapshot:
    """Take the task's snapshot for ``barrier`` now, then release every blocked channel."""

    barrier: CheckpointBarrier
    alignment_ms: int
    #: taken before every barrier came: the channels still recording hold in-flight data
    unaligned: bool = False
    #: no channel delivered the barrier, every one ended (a direct trigger at a task whose
    #: upstream finished before it snapshotted): the cut is the end of the whole input
    at_end: bool = False


@dataclass(frozen=True)
class InflightComplete:
    """Every live channel delivered the unaligned checkpoint's barrier: its in-flight data is
    complete (``alignment_ms``: from the snapshot to the last barrier)."""

    checkpoint_id: int
    alignment_ms: int


@dataclass(frozen=True)
class Decline:
    """Checkpoint ``checkpoint_id`` cannot be taken here; release every blocked channel."""

    checkpoint_id: int
    reason: str


AlignerAction = Union[Snapshot, InflightComplete, Decline]


class BarrierAligner:
    def __init__(self, num_channels: int, clock: Callable[[], float] = time.monotonic,
                 wall_ms: Callable[[], float] = lambda: time.time() * 1000) -> None:
        self._n = num_channels
        self._clock = clock
        self._wall_ms = wall_ms
        #: the pending checkpoint was taken unaligned (its snapshot is taken)
        self.unaligned = False
        self._unaligned_at = 0.0
        self._ended: set[int] = set()
        self._pending: CheckpointBarrier | None = None
        self._arrived: set[int] = set()
        self._started = 0.0
        #: the highest checkpoint taken, declined or superseded here: its barriers are stale
        self.last_handled = 0

    @property
    def pending(self) -> CheckpointBarrier | None:
        return self._pending

    def is_blocked(self, channel: int) -> bool:
        """True while ``channel`` delivered the pending exactly-once barrier and others have not."""
        p = self._pending
        return p is not None and p.exactly_once and not self.unaligned and channel in self._arrived

    def is_recording(self, channel: int) -> bool:
        """True while what ``channel`` delivers is in-flight data of the pending unaligned
        checkpoint (its barrier has not come yet)."""
        return self.unaligned and channel not in self._arrived and channel not in self._ended

    def timeout_in(self) -> float | None:
        """Seconds until the pending aligned checkpoint turns unaligned (None: it does not)."""
        p = self._pending
        if p is None or self.unaligned or p.aligned_timeout_ms <= 0 or not p.exactly_once:
            return None
        return max(0.0, (p.timestamp_ms + p.aligned_timeout_ms - self._wall_ms()) / 1000.0)

    def on_timeout(self) -> list[AlignerAction]:
        """Turn the pending aligned checkpoint unaligned if it is older than its timeout: the
        snapshot now, the channels not aligned yet record their in-flight data."""
        wait = self.timeout_in()
        if wait is None or wait > 0:
            return []
        return self._go_unaligned()

    def _go_unaligned(self) -> list[AlignerAction]:
        p = self._pending
        assert p is not None
        self.unaligned = True
        self._unaligned_at = self._clock()
        alignment_ms = int(round((self._clock() - self._started) * 1000))
        return [Snapshot(p, alignment_ms, unaligned=True), *self._check_aligned()]

    def on_barrier(self, channel: int, barrier: CheckpointBarrier) -> list[AlignerAction]:
        actions = self._begin(barrier)
        if self._pending is None or barrier.checkpoint_id != self._pending.checkpoint_id:
            log.debug("stale barrier %d on channel %d ignored", barrier.checkpoint_id, channel)
            return actions
        if not self.unaligned and barrier.unaligned_at(self._wall_ms()):
            self._arrived.add(channel)
            return actions + self._go_unaligned()
        self._arrived.add(channel)
        return actions + self._check_aligned()

    def on_trigger(self, barrier: CheckpointBarrier) -> list[AlignerAction]:
        """Checkpoint ``barrier`` was triggered at this task directly: its upstream tasks have
        finished, so it completes once every channel has ended (unaligned: at once, recording
        what the channels deliver until they end)."""
        if barrier.exactly_once and barrier.aligned_timeout_ms >= 0:
            # unaligned (or aligned with a timeout): aligned for a grace period from now first
            waited = int(self._wall_ms() - barrier.timestamp_ms)
            barrier = dataclasses.replace(barrier, aligned_timeout_ms=max(barrier.aligned_timeout_ms,
                                                                          waited + DIRECT_GRACE_MS))
        actions = self._begin(barrier)
        if self._pending is None or barrier.checkpoint_id != self._pending.checkpoint_id:
            return actions
        return actions + self._check_aligned()

    def on_overtaken(self, channel: int) -> list[AlignerAction]:
        """The pending unaligned checkpoint's barrier was taken out of ``channel``'s queue
        (it came in order, before the task went unaligned): the channel has delivered it."""
        if self._pending is None:
            return []
        self._arrived.add(channel)
        return self._check_aligned()

    def on_end_of_partition(self, channel: int) -> list[AlignerAction]:
        self._ended.add(channel)
        return self._check_aligned()

    def _begin(self, barrier: CheckpointBarrier) -> list[AlignerAction]:
        """Make ``barrier``'s checkpoint the pending one unless it is stale; a newer one
        supersedes the pending one."""
        if barrier.checkpoint_id <= self.last_handled:
            return []
        p = self._pending
        if p is not None and barrier.checkpoint_id <= p.checkpoint_id:
            return []  # the pending one (or an older one, already superseded)
        actions: list[AlignerAction] = []
        if p is not None:
            actions.append(Decline(p.checkpoint_id, f"checkpoint {p.checkpoint_id} was superseded by checkpoint "
                                                    f"{barrier.checkpoint_id} before its barriers were aligned"))
            self.last_handled = p.checkpoint_id
        self._pending = barrier
        self._arrived = set()
        self.unaligned = False
        self._started = self._clock()
        return actions

    def _check_aligned(self) -> list[AlignerAction]:
        p = self._pending
        if p is None or len(self._arrived | self._ended) < self._n:
            return []
        at_end = not self._arrived
        self._pending = None
        self._arrived = set()
        self.last_handled = p.checkpoint_id
        if self.unaligned:
            self.unaligned = False
            return [InflightComplete(p.checkpoint_id, int(round((self._clock() - self._unaligned_at) * 1000)))]
        alignment_ms = int(round((self._clock() - self._started) * 1000))
        return [Snapshot(p, alignment_ms, at_end=at_end)]
