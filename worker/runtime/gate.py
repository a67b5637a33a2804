"""The consumer side: an ``InputGate`` gathers the channels of one logical input.

Each channel has a reader (local: the producer's subpartition in this process; remote: an
Arrow Flight stream from the producer's TaskExecutor) that moves elements into the channel's
own bounded buffer. A full buffer stops only that reader, so a slow consumer back-pressures
only its own channels. The task thread polls the gate, which hands out elements round-robin.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable

import pyarrow as pa

from yarnflow.worker.runtime.elements import EndOfPartition

log = logging.getLogger(__name__)


class ChannelError:
    """Put in a channel when its reader failed; the task raises ``error`` when it gets there."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class InputGate:
    def __init__(self, num_channels: int, capacity: int, input_index: int = 0, io_metrics: bool = True) -> None:
        self.input_index = input_index
        #: time the task spent waiting in ``poll`` for input (its idle time), when ``io_metrics``
        self.idle_ns = 0
        self._io_metrics = io_metrics
        self.num_channels = num_channels
        self._buffers: list[collections.deque[Any]] = [collections.deque() for _ in range(num_channels)]
        self._batches = [0] * num_channels
        self._capacity = capacity
        self._cond = threading.Condition()
        self._cancelled = False
        self._next = 0
        self._finished = [False] * num_channels
        self._woken = False
        self._readers: list[ChannelReader] = []

    # -- reader side --------------------------------------------------------------------------
    def push(self, channel: int, element: Any) -> bool:
        """Add ``element`` to ``channel``'s buffer, waiting for room; False once cancelled."""
        is_batch = isinstance(element, pa.RecordBatch)
        with self._cond:
            while is_batch and self._batches[channel] >= self._capacity and not self._cancelled:
                self._cond.wait(0.5)
            if self._cancelled:
                return False
            self._buffers[channel].append(element)
            if is_batch:
                self._batches[channel] += 1
            self._cond.notify_all()
            return True

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def add_reader(self, reader: ChannelReader) -> None:
        self._readers.append(reader)

    def start(self) -> None:
        for reader in self._readers:
            reader.start()

    # -- task side ----------------------------------------------------------------------------
    def poll(self, timeout: float | None, channels: frozenset[int] | None = None) -> tuple[int, Any] | None:
        """The next ``(channel, element)``, round robin over the channels (only ``channels``
        when given: input selection, the others wait), or None after ``timeout`` (or as soon as
        ``wakeup`` was called)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._woken:
                    self._woken = False
                    return None
                for i in range(self.num_channels):
                    ch = (self._next + i) % self.num_channels
                    if not self._buffers[ch] or (channels is not None and ch not in channels):
                        continue
                    element = self._buffers[ch].popleft()
                    if isinstance(element, pa.RecordBatch):
                        self._batches[ch] -= 1
                        self._cond.notify_all()
                    elif isinstance(element, EndOfPartition):
                        self._finished[ch] = True
                    self._next = ch + 1
                    return ch, element
                remaining = None if deadline is None else deadline - time.monotonic()
                if self._cancelled or (remaining is not None and remaining <= 0):
                    return None
                if self._io_metrics:
                    started = time.perf_counter_ns()
                    self._cond.wait(remaining)
                    self.idle_ns += time.perf_counter_ns() - started
                else:
                    self._cond.wait(remaining)

    def wakeup(self) -> None:
        """Make the task's current (or next) ``poll`` return at once: it has other work (mail)."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    @property
    def finished(self) -> bool:
        return all(self._finished)

    def backlog(self) -> list[int]:
        with self._cond:
            return list(self._batches)

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()
        for reader in self._readers:
            reader.cancel()

    def join(self, timeout: float = 5.0) -> None:
        for reader in self._readers:
            reader.join(timeout)


class ChannelReader:
    """Moves one channel's elements into its gate on a thread of its own."""

    def __init__(self, gate: InputGate, channel: int, name: str,
                 source: Callable[[Callable[[Any], bool]], None], cancel: Callable[[], None]) -> None:
        self._gate = gate
        self._channel = channel
        self._source = source
        self._cancel = cancel
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            self._source(lambda el: self._gate.push(self._channel, el))
        except BaseException as exc:  # noqa: BLE001 - handed to the task thread
            if not self._gate.cancelled:
                log.debug("channel %s failed", self._thread.name, exc_info=True)
                self._gate.push(self._channel, ChannelError(exc))

    def cancel(self) -> None:
        try:
            self._cancel()
        except Exception:  # noqa: BLE001
            log.debug("cancelling %s", self._thread.name, exc_info=True)

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)
