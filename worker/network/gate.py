"""The consumer side: an ``InputGate`` gathers the channels of one logical input.

The task thread polls the gate, which asks its channels in turn (round robin) for their next
element; no channel has a thread of its own:

- ``LocalInputChannel``: the producer's subpartition in this TaskExecutor, taken directly (the
  producer's bounded subpartition is the channel's only buffer, so a slow consumer stops only
  the producer's writes into it); a blocking partition's file is read a batch at a time;
- ``RemoteInputChannel`` (``network/client.py``): what the connection to the producer's
  TaskExecutor received for it, against the credit the channel announced: its exclusive
  buffers plus the floating buffers it borrowed from the gate's ``FloatingBufferPool``;
- ``IteratorChannel``: elements read on demand (a stored partition's files).

A channel that has something new wakes the gate (``notify``); a channel that fails hands the
task a ``ChannelError`` in place of its next element.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterator, Protocol


from yarnflow.worker.network.credit import FloatingBufferPool
from yarnflow.worker.elements import EndOfPartition
from yarnflow.worker.network.wait_clock import WaitClock
from yarnflow.worker.network.partition import (
    BlockingResultPartition,
    PartitionReleasedError,
    ResultPartitionManager,
    StoredResultPartition,
    Subpartition,
)

log = logging.getLogger(__name__)

#: how often the gate looks again at a channel whose partition is not there yet (its creation
#: wakes the gate too: this only bounds the wait for the channel's deadline)
_RETRY_S = 0.5


class ChannelError:
    """A channel's next element when it failed; the task raises ``error`` when it gets there."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class InputChannel(Protocol):
    #: True while the channel must be asked again without being woken (waits for its partition)
    pending: bool
    listener: Callable[[], None]

    @property
    def priority(self) -> bool:
        """An unaligned checkpoint's barrier is the next element."""
        ...

    @property
    def producer_finished(self) -> bool:
        """The producer has finished: what comes ends with the end of partition."""
        ...

    def overtake(self, checkpoint_id: int) -> list[Any] | None: ...

    def overtaken_by(self, checkpoint_id: int) -> list[Any]: ...

    def start(self) -> None: ...

    def poll(self) -> Any | None: ...

    def backlog(self) -> int: ...

    def cancel(self) -> None: ...


class LocalInputChannel:
    """Reads a subpartition of this TaskExecutor (``partitions``), or, without ``partitions``, an
    in-process queue of its own (``push``) of ``capacity`` batches."""

    def __init__(self, partitions: ResultPartitionManager | None = None, partition_id: str = "",
                 index: int = 0, capacity: int = 8, wait_for_partition_s: float = 30.0) -> None:
        self._partitions = partitions
        self.partition_id = partition_id
        self._index = index
        self._deadline = time.monotonic() + wait_for_partition_s
        self._sub: Subpartition | None = None
        self._elements: Iterator[Any] | None = None
        self._own = partitions is None
        self._failed = False
        self._buffer_size: int | None = None
        self.listener: Callable[[], None] = lambda: None
        if self._own:
            self._sub = Subpartition(capacity)
        self.pending = not self._own

    def start(self) -> None:
        if self._sub is not None:
            self._sub.set_listener(self.listener)

    def _resolve(self) -> Any | None:
        assert self._partitions is not None
        partition = self._partitions.peek(self.partition_id, self.listener)
        if partition is None:
            if time.monotonic() < self._deadline:
                return None
            from yarnflow.worker.network.flight import PartitionNotFoundError

            self.pending = False
            self._failed = True
            return ChannelError(PartitionNotFoundError(f"local partition {self.partition_id} was never produced",
                                                       partition_id=self.partition_id))
        self.pending = False
        if isinstance(partition, (BlockingResultPartition, StoredResultPartition)):
            self._elements = partition.read(self._index)
        else:
            self._sub = partition.subpartitions[self._index]
            self._sub.set_listener(self.listener)
            if self._buffer_size is not None:
                self._sub.set_buffer_size(self._buffer_size)
        return None

    def poll(self) -> Any | None:
        if self._failed:
            return None
        try:
            if self._sub is None and self._elements is None:
                failed = self._resolve()
                if failed is not None:
                    return failed
            if self._elements is not None:
                return next(self._elements, None)
            if self._sub is not None:
                return self._sub.take(0)
        except Exception as exc:  # noqa: BLE001 - released, or a file that cannot be read
            self._failed = True
            return ChannelError(exc)
        return None

    def push(self, element: Any, cancelled: Callable[[], bool] = lambda: False) -> bool:
        """Add ``element`` to the channel's own queue, waiting for room; False once cancelled."""
        assert self._own and self._sub is not None, "only a channel with a queue of its own takes elements"
        try:
            self._sub.add(element, cancelled)
            return True
        except PartitionReleasedError:
            return False

    def backlog(self) -> int:
        return self._sub.backlog() if self._sub is not None else 0

    @property
    def producer_finished(self) -> bool:
        """The producer has finished: what the channel holds ends with its end of partition."""
        return self._elements is not None or (self._sub is not None and not self._own and self._sub.producer_finished)

    def set_buffer_size(self, size: int) -> None:
        """Buffer debloating: hold the producer's subpartition to buffers of ``size`` bytes."""
        self._buffer_size = size
        if self._sub is not None and not self._own:
            self._sub.set_buffer_size(size)

    @property
    def priority(self) -> bool:
        """The producer put an unaligned checkpoint's barrier at the subpartition's head."""
        return self._sub is not None and self._sub.priority_head

    def overtake(self, checkpoint_id: int) -> list[Any] | None:
        """(A local channel buffers nothing of its own: an aligned barrier comes in order.)"""
        return None

    def overtaken_by(self, checkpoint_id: int) -> list[Any]:
        return []

    def cancel(self) -> None:
        if self._sub is not None:
            self._sub.set_listener(None)
            if self._own:
                self._sub.release()


class IteratorChannel:
    """Elements read on demand from ``source()`` (called at the first poll)."""

    def __init__(self, source: Callable[[], Iterator[Any]]) -> None:
        self._source = source
        self._elements: Iterator[Any] | None = None
        self._failed = False
        self.pending = False
        self.priority = False
        self.producer_finished = True  # (a stored partition's producer finished long ago)
        self.listener: Callable[[], None] = lambda: None

    def start(self) -> None:
        pass

    def overtake(self, checkpoint_id: int) -> list[Any] | None:
        return None

    def overtaken_by(self, checkpoint_id: int) -> list[Any]:
        return []

    def poll(self) -> Any | None:
        if self._failed:
            return None
        try:
            if self._elements is None:
                self._elements = self._source()
            return next(self._elements, None)
        except Exception as exc:  # noqa: BLE001 - handed to the task
            self._failed = True
            return ChannelError(exc)

    def backlog(self) -> int:
        return 0

    def cancel(self) -> None:
        elements, self._elements = self._elements, None
        close = getattr(elements, "close", None)
        if close is not None:
            close()


class SequenceChannel:
    """Subpartitions ``[a, b)`` of one producer's partition read as one channel, one after
    another (Flink's consumed subpartition range: a consumer whose parallelism was decided at
    run time reads a contiguous range of the subpartitions its producers wrote). ``open(i)``
    makes the channel of subpartition ``i``; the ends of partition of all but the last are
    swallowed. Only for blocking exchanges: no checkpoint barrier travels through it."""

    def __init__(self, subpartitions: range, open: Callable[[int], Any]) -> None:
        self._left = list(subpartitions)
        self._open = open
        self._current: Any = None
        self.listener: Callable[[], None] = lambda: None
        self.priority = False

    def _next_channel(self) -> None:
        channel = self._open(self._left.pop(0))
        channel.listener = self.listener
        channel.start()
        self._current = channel

    def start(self) -> None:
        self._next_channel()

    @property
    def pending(self) -> bool:
        return bool(self._current is not None and self._current.pending)

    @property
    def producer_finished(self) -> bool:
        return bool(self._current is not None and self._current.producer_finished)

    def overtake(self, checkpoint_id: int) -> list[Any] | None:
        return None

    def overtaken_by(self, checkpoint_id: int) -> list[Any]:
        return []

    def poll(self) -> Any | None:
        if self._current is None:
            self._next_channel()
        element = self._current.poll()
        while isinstance(element, EndOfPartition) and self._left:
            self._current.cancel()
            self._next_channel()
            element = self._current.poll()
        return element

    def backlog(self) -> int:
        return self._current.backlog() if self._current is not None else 0

    def take_rest(self) -> None:
        take_rest = getattr(self._current, "take_rest", None)
        if take_rest is not None:
            take_rest()

    def cancel(self) -> None:
        self._left = []
        if self._current is not None:
            self._current.cancel()


class InputGate:
    """``num_channels`` channels (``set_channel``; until then each an in-process queue of
    ``capacity`` batches, fed by ``push``). ``floating_buffers``: the pool its remote channels
    borrow from; ``credit_lock`` guards their credit accounting (one per gate)."""

    def __init__(self, num_channels: int, capacity: int = 8, input_index: int = 0, io_metrics: bool = True,
                 floating_buffers: int = 8) -> None:
        self.input_index = input_index
        self._capacity = capacity
        #: time the task spent waiting in ``poll`` for input (its idle time), when ``io_metrics``
        self._idle = WaitClock()
        self._io_metrics = io_metrics
        self.num_channels = num_channels
        self.pool = FloatingBufferPool(floating_buffers)
        self.credit_lock = threading.Lock()
        self._channels: list[Any] = []
        for _ in range(num_channels):
            ch = LocalInputChannel(capacity=capacity)
            ch.listener = self.notify
            self._channels.append(ch)
        self._cond = threading.Condition()
        self._signals = 0
        self._waiting = False  # the task waits in ``poll``: ``notify`` must wake it
        self._cancelled = False
        self._next = 0
        self._finished = [False] * num_channels
        self._woken = False
        self._started = False
        #: barriers of unaligned checkpoints may come (the task looks for them first); off, the
        #: task's polls skip the look (a job without unaligned checkpoints)
        self.watch_priority = True

    def set_channel(self, index: int, channel: Any) -> None:
        channel.listener = self.notify
        self._channels[index] = channel

    def start(self) -> None:
        self._started = True
        for ch in self._channels:
            ch.start()

    # -- producer side (in-process channels) ----------------------------------------------------
    def push(self, channel: int, element: Any) -> bool:
        """Add ``element`` to in-process channel ``channel``, waiting for room; False once
        cancelled."""
        if not self._started:
            self.start()
        return bool(self._channels[channel].push(element, lambda: self._cancelled)) and not self._cancelled

    def notify(self) -> None:
        """A channel has something new. (The count is read by ``poll`` before it asks the
        channels and again, under the lock, before it waits: a change in between is seen.)"""
        self._signals += 1
        if self._waiting:
            with self._cond:
                self._cond.notify_all()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    # -- task side ----------------------------------------------------------------------------
    def poll(self, timeout: float | None, channels: frozenset[int] | None = None) -> tuple[int, Any] | None:
        """The next ``(channel, element)``, round robin over the channels (only ``channels``
        when given: input selection, the others wait), or None after ``timeout`` (or as soon as
        ``wakeup`` was called)."""
        if not self._started:
            self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        n = self.num_channels
        while True:
            if self._woken:
                with self._cond:
                    self._woken = False
                return None
            if self._cancelled:
                return None
            seen = self._signals
            pending = False
            if self.watch_priority:
                for ch in range(n):  # an unaligned checkpoint's barrier goes first
                    if self._channels[ch].priority and not self._finished[ch]:
                        element = self._channels[ch].poll()
                        if element is not None:
                            return ch, element
            for i in range(n):
                ch = (self._next + i) % n
                if self._finished[ch] or (channels is not None and ch not in channels):
                    continue
                channel = self._channels[ch]
                element = channel.poll()
                if element is None:
                    pending = pending or channel.pending
                    continue
                if isinstance(element, EndOfPartition):
                    self._finished[ch] = True
                self._next = ch + 1
                return ch, element
            with self._cond:
                remaining = None if deadline is None else deadline - time.monotonic()
                if self._cancelled or (remaining is not None and remaining <= 0):
                    return None
                if self._signals != seen or self._woken:
                    continue
                if pending:
                    remaining = _RETRY_S if remaining is None else min(remaining, _RETRY_S)
                self._waiting = True
                if self._signals != seen:  # a notify came while the flag was not yet set
                    self._waiting = False
                    continue
                if self._io_metrics:
                    self._idle.begin()
                    try:
                        self._cond.wait(remaining)
                    finally:
                        self._idle.end()
                else:
                    self._cond.wait(remaining)
                self._waiting = False

    @property
    def idle_ns(self) -> int:
        """Nanoseconds the task waited in ``poll`` for input, a wait in progress included."""
        return self._idle.ns

    def wakeup(self) -> None:
        """Make the task's current (or next) ``poll`` return at once: it has other work (mail)."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    @property
    def finished(self) -> bool:
        return all(self._finished)

    def backlog(self) -> list[int]:
        """Batches waiting in each channel."""
        return [ch.backlog() for ch in self._channels]

    def network_buffers(self) -> int:
        """The buffers in front of the gate: each channel's producer queue (``capacity``
        batches), each remote channel's exclusive buffers, the floating ones (buffer debloating
        spreads the data it wants in flight over them)."""
        exclusive = sum(int(getattr(getattr(ch, "credit", None), "exclusive", 0)) for ch in self._channels)
        return self.num_channels * self._capacity + exclusive + self.pool.size

    def take_rest(self, channel: int) -> None:
        """Ask ``channel``'s finished producer for all it still holds, at once (a remote
        channel's credit otherwise lets it come a few buffers per round trip)."""
        take_rest = getattr(self._channels[channel], "take_rest", None)
        if take_rest is not None:
            take_rest()

    def producer_finished(self, channel: int) -> bool:
        """``channel``'s producer has finished (it sends no checkpoint barrier any more)."""
        return bool(getattr(self._channels[channel], "producer_finished", False))

    def set_buffer_size(self, size: int) -> None:
        """Buffer debloating: tell every channel's producer to use buffers of ``size`` bytes."""
        for ch in self._channels:
            announce = getattr(ch, "set_buffer_size", None)
            if announce is not None:
                announce(size)

    def has_priority(self) -> bool:
        """A channel has an unaligned checkpoint's barrier waiting (a task checks between the
        slices of a batch)."""
        return self.watch_priority and any(ch.priority for ch in self._channels)

    def overtake(self, channel: int, checkpoint_id: int) -> list[Any] | None:
        return self._channels[channel].overtake(checkpoint_id)

    def overtaken_by(self, channel: int, checkpoint_id: int) -> list[Any]:
        return self._channels[channel].overtaken_by(checkpoint_id)

    def inflight_bytes_peak(self) -> int:
        """The most bytes any remote channel of the gate held at once (0: none is remote)."""
        return max((int(getattr(ch, "peak_bytes", 0)) for ch in self._channels), default=0)

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()
        for ch in self._channels:
            try:
                ch.cancel()
            except Exception:  # noqa: BLE001
                log.debug("cancelling a channel failed", exc_info=True)

