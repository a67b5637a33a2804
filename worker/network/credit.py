"""Credit-based flow control (Flink's, FLINK-7282), the accounting only: no threads, no I/O.

A remote input channel owns ``exclusive`` buffers of ``segment_size`` bytes
(``taskmanager.network.memory.buffers-per-channel``) and may borrow more from its gate's
``FloatingBufferPool`` (``taskmanager.network.memory.floating-buffers-per-gate``). A buffer it
owns and does not use is a *credit* it announces to the producer's TaskExecutor, which sends
that channel data only against credit (``SenderCredit``): a record batch of ``n`` bytes takes
``buffers_for(n)`` credits. So the bytes sent to a channel and not yet taken by its task never
exceed what the channel owns: exclusive plus borrowed buffers, times the segment size.

With each batch the sender announces its *backlog*, the buffers queued behind it for that
channel; a channel whose backlog exceeds its credit borrows floating buffers (as many as it
can, in the order channels asked) and announces them too. When the task takes a batch its
buffers are free again: borrowed ones go back to the pool (to the channels waiting for them)
while the channel has more than its backlog needs, the others are announced again.

Events (watermarks, barriers, end of partition) take no credit: they are small, and a producer
must be able to finish whatever its consumer's state.
"""

from __future__ import annotations

import collections
import math
from typing import Callable


def buffers_for(nbytes: int, segment_size: int) -> int:
    """The buffers (credits) a record batch of ``nbytes`` takes: at least one."""
    return max(1, math.ceil(nbytes / segment_size))


class SenderCredit:
    """The producer side of one channel: the credit its consumer announced and not used yet."""

    def __init__(self, initial: int = 0) -> None:
        self.credit = initial
        #: the highest credit ever held (what the consumer owned at most)
        self.peak = initial

    def grant(self, n: int) -> None:
        if n <= 0:
            raise ValueError(f"a credit announcement must be positive, got {n}")
        self.credit += n
        self.peak = max(self.peak, self.credit)

    def can_send(self, buffers: int) -> bool:
        return self.credit >= buffers

    def take(self, buffers: int) -> None:
        if buffers > self.credit:
            raise ValueError(f"sending {buffers} buffers against {self.credit} credits")
        self.credit -= buffers


class FloatingBufferPool:
    """A gate's floating buffers, lent to its channels whose backlog exceeds their credit, in
    the order they asked."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.available = size
        self._waiting: collections.deque[ReceiverCredit] = collections.deque()

    def request(self, channel: ReceiverCredit, n: int) -> int:
        """Lend up to ``n`` buffers to ``channel`` now; if fewer, it waits for the rest
        (``recycle`` hands them out)."""
        got = min(n, self.available)
        self.available -= got
        if got < n and channel not in self._waiting:
            self._waiting.append(channel)
        return got

    def recycle(self, n: int) -> list[tuple[ReceiverCredit, int]]:
        """``n`` buffers come back; returns ``(channel, buffers)`` lent at once to waiting
        channels (which announce them as credit)."""
        self.available += n
        lent: list[tuple[ReceiverCredit, int]] = []
        while self.available and self._waiting:
            channel = self._waiting[0]
            want = channel.wanted()
            if want <= 0:
                self._waiting.popleft()
                continue
            got = min(want, self.available)
            self.available -= got
            channel.borrowed += got
            channel.announced += got
            lent.append((channel, got))
            if got == want:
                self._waiting.popleft()
        return lent

    def forget(self, channel: ReceiverCredit) -> None:
        """``channel`` is gone: it waits no more (its buffers were recycled by ``close``)."""
        try:
            self._waiting.remove(channel)
        except ValueError:
            pass


class ReceiverCredit:
    """The consumer side of one channel's accounting. Every method returns the credit to
    announce to the producer now (0: none)."""

    def __init__(self, exclusive: int, pool: FloatingBufferPool | None = None) -> None:
        if exclusive < 1:
            raise ValueError("a channel needs at least one exclusive buffer")
        self.exclusive = exclusive
        self._pool = pool
        self.borrowed = 0
        #: credit the producer holds: announced, not yet used by a batch
        self.announced = 0
        #: buffers holding batches the task has not taken yet
        self.used = 0
        #: the producer's last announced backlog (buffers)
        self.backlog = 0
        #: credit announced beyond the channel's buffers (``overdraw``), not repaid yet
        self.overdrawn = 0
        #: called with ``(channel, credit)`` when the pool lends buffers later (``recycle``)
        self.on_lent: Callable[[ReceiverCredit, int], None] = lambda channel, n: None

    @property
    def owned(self) -> int:
        return self.exclusive + self.borrowed

    def initial(self) -> int:
        """The credit announced when the channel opens: its exclusive buffers."""
        self.announced = self.exclusive
        return self.announced

    def wanted(self) -> int:
        """Buffers the channel would borrow: backlog beyond its credit."""
        return max(0, self.backlog - self.announced)

    def on_batch(self, buffers: int, backlog: int) -> int:
        """A batch arrived, taking ``buffers`` of the producer's credit, with ``backlog``
        buffers queued behind it there."""
        if buffers > self.announced:
            raise ValueError(f"the producer sent {buffers} buffers against {self.announced} credits")
        self.announced -= buffers
        self.used += buffers
        return self.on_backlog(backlog)

    def on_backlog(self, backlog: int) -> int:
        """The producer's backlog: borrow floating buffers for what credit does not cover."""
        self.backlog = backlog
        want = self.wanted()
        if not want or self._pool is None:
            return 0
        got = self._pool.request(self, want)
        self.borrowed += got
        self.announced += got
        return got

    def overdraw(self) -> int:
        """Credit for the producer's whole backlog beyond the channel's buffers: its producer
        has finished, and the task takes what it still holds at once (an unaligned checkpoint
        records it, ``unaligned._pull_ahead``): bounded by the producer's queue. Repaid
        first as the task takes it."""
        extra = max(0, self.backlog - self.announced)
        self.overdrawn += extra
        self.announced += extra
        return extra

    def on_taken(self, buffers: int) -> int:
        """The task took a batch that held ``buffers``: borrowed buffers the backlog does not
        need go back to the pool, the rest are announced again."""
        self.used -= buffers
        free = buffers
        repaid = min(self.overdrawn, free)
        self.overdrawn -= repaid
        free -= repaid
        surplus = min(self.borrowed, free, max(0, self.announced + free - max(self.backlog, self.exclusive)))
        if surplus and self._pool is not None:
            self.borrowed -= surplus
            free -= surplus
            for channel, n in self._pool.recycle(surplus):
                channel.on_lent(channel, n)
        self.announced += free
        return free

    def close(self) -> None:
        """The channel ended: its borrowed buffers go back to the pool."""
        if self._pool is not None:
            self._pool.forget(self)
            if self.borrowed:
                n, self.borrowed = self.borrowed, 0
                for channel, lent in self._pool.recycle(n):
                    channel.on_lent(channel, lent)
