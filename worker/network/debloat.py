"""Buffer debloating (Flink's FLIP-183), the arithmetic only: no threads, no I/O.

Under back-pressure every queue in front of a slow task is full, so what is in flight to it is
what its buffers hold (``taskmanager.network.buffers-per-channel`` batches in each producer's
subpartition, credit x ``taskmanager.memory.segment-size`` in each remote channel), whatever
the task's pace: an aligned barrier waits behind all of it, and an unaligned checkpoint stores
all of it. Debloating sizes that data to what the task processes in
``taskmanager.network.memory.buffer-debloat.target`` (default 1 s): each period the task
measures the bytes it took from its gate over the time it was busy (waiting for input is not
counted), smooths it (an exponential moving average over ``.samples`` periods), and announces
a buffer size to its channels' producers:

    size = throughput x target / buffers,   clamped to [min-segment-size, segment-size]

``buffers`` is every buffer in front of the gate: the producers' subpartition queues, the
channels' exclusive buffers and the gate's floating ones. A producer then cuts what it sends
to that size (a batch takes one credit per buffer started) and holds its subpartition to its
queue's buffers of that size. A new size is announced only when it differs from the last one
by more than ``.threshold-percentages`` (each announcement is a message per channel).
"""

from __future__ import annotations


class BufferDebloater:
    """One input gate's buffer size. ``buffers``: the buffers in front of the gate."""

    def __init__(self, target_s: float, buffers: int, max_size: int, min_size: int,
                 threshold: float = 0.25, samples: int = 20) -> None:
        if target_s <= 0:
            raise ValueError(f"the debloat target must be positive, got {target_s} s")
        if not 0 < min_size <= max_size:
            raise ValueError(f"the debloated buffer size needs 0 < min ({min_size}) <= max ({max_size})")
        self.target_s = target_s
        self.buffers = max(1, buffers)
        self.max_size = max_size
        self.min_size = min_size
        self.threshold = threshold
        self._alpha = 2.0 / (max(1, samples) + 1)
        #: bytes per second the task takes from its gate while busy (smoothed; None: no sample yet)
        self.throughput: float | None = None
        #: the buffer size last announced (None: none yet, the producers use ``max_size``)
        self.announced: int | None = None

    def desired(self) -> int:
        """The buffer size the current throughput asks for."""
        if self.throughput is None:
            return self.max_size
        size = int(self.throughput * self.target_s / self.buffers)
        return max(self.min_size, min(self.max_size, size))

    def on_period(self, nbytes: int, busy_s: float) -> int | None:
        """A period ended in which the task took ``nbytes`` from its gate and was busy (not
        waiting for input) ``busy_s`` seconds. Returns the buffer size to announce now, or
        None (no measure: the task waited for input all along; or no change worth a message)."""
        if busy_s <= 0:
            return None
        rate = nbytes / busy_s
        self.throughput = rate if self.throughput is None else self.throughput + self._alpha * (rate - self.throughput)
        size = self.desired()
        last = self.announced if self.announced is not None else self.max_size
        if size == last or abs(size - last) <= self.threshold * last:
            return None
        self.announced = size
        return size
