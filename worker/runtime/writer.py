"""RecordWriter: routes a task's output batches into the subpartitions of one result
partition, coalescing small batches and splitting large ones to the target batch size; a
partly filled batch is flushed after the buffer timeout so slow streams keep their latency."""

from __future__ import annotations

import itertools
import time
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from yarnflow.common.states import Partitioner
from yarnflow.worker.elements import END_OF_PARTITION, Watermark
from yarnflow.worker.key_assignment import key_groups, operator_index_for_key_groups
from yarnflow.worker.network.partition import ResultPartition
from yarnflow.worker.network.wait_clock import WaitClock


class RecordWriter:
    def __init__(self, partition: ResultPartition, partitioner: Partitioner, key_columns: Sequence[str],
                 consumer_max_parallelism: int, batch_size: int, buffer_timeout_ms: int,
                 cancelled: Callable[[], bool], producer_index: int = 0, output_tag: str = "",
                 io_metrics: bool = True, producer_parallelism: int = 1) -> None:
        self.output_tag = output_tag
        #: count bytes sent and time spent waiting for room (back-pressure), for the task's metrics
        self._io_metrics = io_metrics
        self._partition = partition
        self._subs = partition.subpartitions
        self._n = len(self._subs)
        self._partitioner = partitioner
        self._keys = list(key_columns)
        self._maxp = consumer_max_parallelism
        self._batch_size = batch_size
        #: flush a channel's partly filled batch once its oldest row is this old (None: only when full)
        self._timeout_s = buffer_timeout_ms / 1000.0 if buffer_timeout_ms >= 0 else None
        self._cancelled = cancelled
        self._pending: list[list[pa.RecordBatch]] = [[] for _ in range(self._n)]
        self._pending_rows = [0] * self._n
        self._oldest: list[float | None] = [None] * self._n
        self._rr = itertools.cycle(range(self._n)) if self._n else None
        self._rr_start = producer_index % max(1, self._n)
        for _ in range(self._rr_start):
            next(self._rr)  # type: ignore[arg-type]
        if partitioner == Partitioner.RESCALE and self._n:  # (Flink's pointwise: a subset of the consumers)
            p = max(1, producer_parallelism)
            first, last = producer_index * self._n // p, (producer_index + 1) * self._n // p
            self._rr = itertools.cycle(range(first, max(last, first + 1)))
        #: SHUFFLE's random choices (seeded per producer: a run is reproducible, producers differ)
        self._random = np.random.default_rng(producer_index)
        #: CUSTOM: the producer chain's ``channels(batch, n)`` (the user's Partitioner, per row)
        self.custom: Callable[[pa.RecordBatch, int], np.ndarray] | None = None
        self.records_out = 0
        #: time spent waiting for room in a subpartition (back-pressure), the wait in progress included
        self._backpressure = WaitClock()
        #: False: sends never wait for room; the task waits before each element instead
        #: (``wait_for_room``), between elements, where it can take a checkpoint
        self.blocking = True
        # pipelined subpartitions measure what they take in already: their sum is bytes_out
        self._subs_count_bytes = all(hasattr(sub, "bytes_added") for sub in self._subs)
        self._bytes_out = 0

    # -- routing ----------------------------------------------------------------------------
    def emit(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        self.records_out += batch.num_rows
        if self._partitioner == Partitioner.FORWARD or self._n == 1:
            self._buffer(0, batch)
        elif self._partitioner == Partitioner.BROADCAST:
            for i in range(self._n):
                self._buffer(i, batch)
        elif self._partitioner in (Partitioner.REBALANCE, Partitioner.RESCALE):
            self._buffer(next(self._rr), batch)  # type: ignore[arg-type]
        elif self._partitioner == Partitioner.GLOBAL:
            self._buffer(0, batch)
        elif self._partitioner == Partitioner.SHUFFLE:
            self._route(batch, self._random.integers(0, self._n, batch.num_rows))
        elif self._partitioner == Partitioner.CUSTOM:
            if self.custom is None:
                raise RuntimeError("a CUSTOM exchange whose producer has no partition_custom operator")
            self._route(batch, self.custom(batch, self._n))
        else:
            self._route(batch, operator_index_for_key_groups(key_groups(batch, self._keys, self._maxp), self._maxp,
                                                             self._n))

    def _route(self, batch: pa.RecordBatch, targets: np.ndarray) -> None:
        """Row ``r`` of ``batch`` to subpartition ``targets[r]``."""
        if self._n <= 8:
            for i in range(self._n):
                idx = np.flatnonzero(targets == i)
                if len(idx) == len(targets):
                    self._buffer(i, batch)
                elif len(idx):
                    self._buffer(i, batch.take(pa.array(idx)))
            return
        order = np.argsort(targets, kind="stable")
        counts = np.bincount(targets, minlength=self._n)
        ordered = batch.take(pa.array(order))
        offset = 0
        for i, c in enumerate(counts):
            if c:
                self._buffer(i, ordered.slice(offset, int(c)))
            offset += int(c)

    # -- batching ---------------------------------------------------------------------------
    def _buffer(self, i: int, batch: pa.RecordBatch) -> None:
        if self._pending[i] and not self._pending[i][-1].schema.equals(batch.schema):
            self._flush(i)  # never merge two schemas: the channel carries the new one after the old
        if not self._pending[i]:
            self._oldest[i] = time.monotonic()
        self._pending[i].append(batch)
        self._pending_rows[i] += batch.num_rows
        if self._pending_rows[i] >= self._rows_per_batch(i, batch):
            self._flush(i, only_full=True)

    def _rows_per_batch(self, i: int, sample: pa.RecordBatch) -> int:
        """``batch_size``; with buffer debloating, the rows of ``sample``'s width that fill
        the buffer size subpartition ``i``'s consumer asked for, if fewer."""
        size = getattr(self._subs[i], "buffer_size", None)
        if size is None or not sample.num_rows:
            return self._batch_size
        return max(1, min(self._batch_size, size * sample.num_rows // max(1, sample.nbytes)))

    def _flush(self, i: int, only_full: bool = False) -> None:
        pending = self._pending[i]
        if not pending:
            return
        if len(pending) == 1:
            merged = pending[0]
        else:
            merged = pa.Table.from_batches(pending).combine_chunks().to_batches()[0]
        size = self._rows_per_batch(i, merged)
        offset = 0
        while merged.num_rows - offset >= size:
            self._send(i, merged.slice(offset, size))
            offset += size
        rest = merged.num_rows - offset
        if rest and not only_full:
            self._send(i, merged.slice(offset, rest))
            rest = 0
        if rest:
            self._pending[i] = [merged.slice(offset, rest)]
            self._pending_rows[i] = rest
        else:
            self._pending[i] = []
            self._pending_rows[i] = 0
            self._oldest[i] = None

    def _send(self, i: int, batch: pa.RecordBatch) -> None:
        sub = self._subs[i]
        if not self.blocking:
            if self._io_metrics and not self._subs_count_bytes:
                self._bytes_out += batch.nbytes
            sub.add(batch, self._cancelled, block=False)
            return
        if self._io_metrics:
            if not self._subs_count_bytes:
                self._bytes_out += batch.nbytes
            if getattr(sub, "full", False):  # the add waits for the consumer: back-pressure
                self._backpressure.begin()
                try:
                    sub.add(batch, self._cancelled)
                finally:
                    self._backpressure.end()
                return
        sub.add(batch, self._cancelled)

    @property
    def backpressured_ns(self) -> int:
        """Nanoseconds spent waiting for room in the subpartitions, a wait in progress included."""
        return self._backpressure.ns

    @property
    def bytes_out(self) -> int:
        """Bytes of the batches sent (each copy of a broadcast counts)."""
        written = getattr(self._partition, "bytes_written", None)
        if written is not None:  # a blocking partition counts what it wrote, I/O metrics or not
            return int(written)
        if self._subs_count_bytes:
            return sum(sub.bytes_added for sub in self._subs)
        return self._bytes_out

    def flush_all(self) -> None:
        for i in range(self._n):
            self._flush(i)

    def flush_if_due(self) -> float | None:
        """Flush channels whose oldest buffered batch is older than the buffer timeout; returns
        seconds until the next flush is due (None when nothing is buffered)."""
        if self._timeout_s is None:  # execution.buffer-timeout: -1
            return None
        now = time.monotonic()
        next_due: float | None = None
        for i in range(self._n):
            oldest = self._oldest[i]
            if oldest is None:
                continue
            due = oldest + self._timeout_s
            if due <= now:
                self._flush(i)
            else:
                next_due = due - now if next_due is None else min(next_due, due - now)
        return next_due

    # -- events -----------------------------------------------------------------------------
    def broadcast_event(self, event: Any) -> None:
        self.flush_all()
        for sub in self._subs:
            sub.add(event, self._cancelled)

    def has_room(self) -> bool:
        """Every subpartition can take a batch without waiting (a hint, read without locks)."""
        return not any(getattr(sub, "full", False) for sub in self._subs)

    def wait_for_room(self, timeout: float) -> None:
        """Wait up to ``timeout`` for room in a full subpartition (counted as back-pressure)."""
        self._backpressure.begin()
        try:
            for sub in self._subs:
                if getattr(sub, "full", False):
                    sub.wait_for_room(timeout)
                    break
        finally:
            self._backpressure.end()

    def send_restored(self, index: int, element: Any) -> None:
        """Send an element of the restored in-flight output of subpartition ``index``."""
        self._subs[index].add(element, self._cancelled)

    def broadcast_priority(self, barrier: Any) -> list[list[Any]]:
        """Send an unaligned checkpoint's ``barrier`` ahead of every subpartition's queued
        output; returns, per subpartition, what it overtook: the queued elements, then the
        batches not flushed yet (they follow the barrier: the task's in-flight output)."""
        overtaken = []
        for i, sub in enumerate(self._subs):
            if hasattr(sub, "add_priority"):
                queued = sub.add_priority(barrier)
            else:  # a blocking partition has no consumer yet: the barrier goes in order
                sub.add(barrier, self._cancelled)
                queued = []
            overtaken.append(queued + list(self._pending[i]))
        return overtaken

    def emit_watermark(self, watermark: Watermark) -> None:
        self.broadcast_event(watermark)

    def finish(self) -> None:
        self.broadcast_event(END_OF_PARTITION)
