"""Result partitions on the producer side.

A producer subtask writes into one ``ResultPartition`` per outgoing edge; it has one bounded
``Subpartition`` per consumer subtask (one in all for a forward edge). A consumer pulls its
subpartition, locally or over Arrow Flight, as its own stream: a full subpartition blocks only
the producer's writes into it, which is how back-pressure reaches the producer.
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import tempfile
import threading
import time
from typing import Any, Callable

import pyarrow as pa

from yarnflow.common.errors import UnavailableError
from yarnflow.common.ids import ResultPartitionID
from yarnflow.worker.elements import EndOfPartition
from yarnflow.worker.network.blocking import (
    BlockingResultPartition,
    PartitionReleasedError,
    StoredResultPartition,
    read_stored,
    stored_partition_url,
)

__all__ = ["BlockingResultPartition", "PartitionReleasedError", "ResultPartition", "ResultPartitionManager",
           "StoredResultPartition", "Subpartition", "read_stored", "stored_partition_url"]

log = logging.getLogger(__name__)


class Subpartition:
    """A bounded FIFO of record batches and events with one producer and one consumer.

    Only record batches count against ``capacity``: events (watermarks, end of partition) are
    always accepted, so a producer can always finish. With buffer debloating its consumer
    announces a buffer size (``set_buffer_size``): the queued batches are then held to
    ``capacity`` buffers of that size too (one batch is always let in, whatever its size), and
    the producer's writer sends batches of about that size.
    """

    def __init__(self, capacity: int, on_consumed: Callable[[], None] | None = None) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._batches = 0
        self._capacity = capacity
        self._cond = threading.Condition(threading.Lock())
        self._released = False
        self._consumed = False
        self._on_consumed = on_consumed
        self._listener: Callable[[], None] | None = None
        self._queued_bytes = 0
        self._max_bytes: int | None = None  # buffer debloating: capacity x the announced size
        #: buffer debloating: the size the consumer asked for (its producer's writer flushes at it)
        self.buffer_size: int | None = None
        #: the producer added its end of partition: what is queued is all that will come
        self.producer_finished = False
        #: an unaligned checkpoint's barrier is at the head (``add_priority``): the next take
        self.priority_head = False
        self.bytes_added = 0

    def set_listener(self, listener: Callable[[], None] | None) -> None:
        """Call ``listener`` (without the subpartition's lock) whenever an element is added or
        the subpartition is released: its consumer's gate, or the connection serving it."""
        self._listener = listener

    def _notify(self) -> None:
        listener = self._listener
        if listener is not None:
            listener()

    def add(self, element: Any, cancelled: Callable[[], bool] = lambda: False, block: bool = True) -> None:
        """Queue ``element``; a batch waits for room unless ``block`` is False (a task that
        waits for room before it processes an element, ``wait_for_room``, never blocks in the
        middle of one: it may go past the capacity by what one element makes)."""
        is_batch = isinstance(element, pa.RecordBatch)
        with self._cond:
            while block and is_batch and self._no_room() and not self._released:
                if cancelled():
                    raise PartitionReleasedError("task cancelled while waiting for buffer space")
                self._cond.wait(0.2)
            if self._released:
                raise PartitionReleasedError("subpartition released")
            self._items.append(element)
            if isinstance(element, EndOfPartition):
                self.producer_finished = True
            if is_batch:
                self._batches += 1
                self._queued_bytes += element.nbytes
                self.bytes_added += element.nbytes
            self._cond.notify_all()
        self._notify()

    def _no_room(self) -> bool:
        m = self._max_bytes
        return self._batches >= self._capacity or (m is not None and self._batches > 0 and self._queued_bytes >= m)

    @property
    def full(self) -> bool:
        """No room for another batch right now (a hint, read without the lock): an ``add``
        would wait, which is back-pressure."""
        return self._no_room()

    def set_buffer_size(self, size: int) -> None:
        """Buffer debloating: the consumer wants ``size``-byte buffers; the queue holds at most
        ``capacity`` of them (in bytes) from now on."""
        with self._cond:
            self.buffer_size = max(1, size)
            self._max_bytes = self._capacity * self.buffer_size
            self._cond.notify_all()

    def take(self, timeout: float | None) -> Any | None:
        """The next element, waiting up to ``timeout`` seconds; None when none came."""
        if timeout == 0 and not self._items and not self._released:
            return None  # (read without the lock: the consumer's poll of an empty channel)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._items:
                if self._released:
                    raise PartitionReleasedError("subpartition released")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining if remaining is not None else 0.5)
            element = self._pop_locked()
        self._after_take(element)
        return element

    def take_head(self, expected: Any, rows: int | None = None) -> Any | None:
        """Take the head if it still is ``expected`` (a sender that peeked at it: a priority
        barrier may have come in front since), or its first ``rows`` rows when it is a larger
        batch: the rest stays at the head, where a barrier that comes now overtakes it (and
        the producer keeps it as in-flight output). None: the head changed."""
        with self._cond:
            if self._released:
                raise PartitionReleasedError("subpartition released")
            if not self._items or self._items[0] is not expected:
                return None
            if rows is not None and isinstance(expected, pa.RecordBatch) and expected.num_rows > rows:
                piece, rest = expected.slice(0, rows), expected.slice(rows)
                self._items[0] = rest
                self._queued_bytes += rest.nbytes - expected.nbytes
                self._cond.notify_all()
                return piece
            element = self._pop_locked()
        self._after_take(element)
        return element

    def _pop_locked(self) -> Any:
        element = self._items.popleft()
        self.priority_head = False
        if isinstance(element, pa.RecordBatch):
            self._batches -= 1
            self._queued_bytes -= element.nbytes
        self._cond.notify_all()
        return element

    def _after_take(self, element: Any) -> None:
        if isinstance(element, EndOfPartition) and not self._consumed:
            self._consumed = True
            if self._on_consumed:
                self._on_consumed()

    def add_priority(self, event: Any) -> list[Any]:
        """Put ``event`` (an unaligned checkpoint's barrier) ahead of everything queued; returns
        what it overtook (the producer's in-flight output, without older barriers)."""
        from yarnflow.worker.elements import CheckpointBarrier

        with self._cond:
            if self._released:
                raise PartitionReleasedError("subpartition released")
            overtaken = [e for e in self._items if not isinstance(e, CheckpointBarrier)]
            self._items.appendleft(event)
            self.priority_head = True
            self._cond.notify_all()
        self._notify()
        return overtaken

    def wait_for_room(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until a batch could be added without waiting."""
        with self._cond:
            if self._no_room() and not self._released:
                self._cond.wait(timeout)
            return not self._no_room() or self._released

    def peek(self) -> Any | None:
        """The next element, left in place (None: there is none)."""
        with self._cond:
            if self._released:
                raise PartitionReleasedError("subpartition released")
            return self._items[0] if self._items else None

    def push_back(self, element: Any) -> None:
        """Return an element just taken to the head of the queue (its consumer could not send it)."""
        with self._cond:
            self._items.appendleft(element)
            if isinstance(element, pa.RecordBatch):
                self._batches += 1
                self._queued_bytes += element.nbytes
            self._cond.notify_all()
        self._notify()

    @property
    def consumed(self) -> bool:
        return self._consumed

    def backlog(self) -> int:
        with self._cond:
            return self._batches

    def backlog_buffers(self, segment_size: int) -> int:
        """The buffers of ``segment_size`` bytes the queued batches take (credit-based flow
        control's backlog)."""
        with self._cond:
            return -(-self._queued_bytes // segment_size) if self._batches else 0

    def release(self) -> None:
        with self._cond:
            self._released = True
            self._items.clear()
            self._batches = 0
            self._queued_bytes = 0
            self._cond.notify_all()
        self._notify()


class ResultPartition:
    def __init__(self, partition_id: ResultPartitionID, num_subpartitions: int, capacity: int,
                 on_all_consumed: Callable[[ResultPartition], None] | None = None) -> None:
        self.partition_id = partition_id
        self._on_all_consumed = on_all_consumed
        self._lock = threading.Lock()
        self._consumed_count = 0
        self.subpartitions = [Subpartition(capacity, self._one_consumed) for _ in range(num_subpartitions)]
        self.released = False

    def _one_consumed(self) -> None:
        with self._lock:
            self._consumed_count += 1
            done = self._consumed_count == len(self.subpartitions)
        if done and self._on_all_consumed:
            self._on_all_consumed(self)

    def release(self) -> None:
        self.released = True
        for sp in self.subpartitions:
            sp.release()


class ResultPartitionManager:
    """The partitions a TaskExecutor currently serves, by id."""

    def __init__(self, directory: str | None = None) -> None:
        self._partitions: dict[str, ResultPartition | BlockingResultPartition | StoredResultPartition] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._own_directory = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix="yarnflow-partitions-")
        #: called once when the partition of that id is created (``peek``'s ``on_created``)
        self._waiters: dict[str, list[Callable[[], None]]] = {}

    def _add(self, partition_id: str, partition: Any) -> None:
        with self._cond:
            self._partitions[partition_id] = partition
            waiters = self._waiters.pop(partition_id, [])
            self._cond.notify_all()
        for waiter in waiters:
            waiter()

    def create_blocking(self, partition_id: ResultPartitionID, num_subpartitions: int) -> BlockingResultPartition:
        partition = BlockingResultPartition(partition_id, num_subpartitions,
                                            os.path.join(self.directory, partition_id))
        self._add(partition_id, partition)
        return partition

    def create_stored(self, partition_id: ResultPartitionID, num_subpartitions: int,
                      url: str) -> StoredResultPartition:
        partition = StoredResultPartition(partition_id, num_subpartitions, url)
        self._add(partition_id, partition)
        return partition

    def partition_ids(self, predicate: Callable[[str], bool] = lambda _: True) -> list[str]:
        with self._cond:
            return [pid for pid in self._partitions if predicate(pid)]

    def blocking_partitions(self) -> list[str]:
        with self._cond:
            return [pid for pid, p in self._partitions.items() if isinstance(p, BlockingResultPartition)]

    def create(self, partition_id: ResultPartitionID, num_subpartitions: int, capacity: int) -> ResultPartition:
        partition = ResultPartition(partition_id, num_subpartitions, capacity, self._consumed)
        self._add(partition_id, partition)
        return partition

    def _consumed(self, partition: ResultPartition) -> None:
        log.debug("partition %s fully consumed: releasing", partition.partition_id)
        self.release(partition.partition_id)

    def peek(self, partition_id: str, on_created: Callable[[], None] | None = None
             ) -> ResultPartition | BlockingResultPartition | StoredResultPartition | None:
        """The partition if it is here now; if not, ``on_created`` is called once it is."""
        with self._cond:
            if self._closed:
                raise UnavailableError("TaskExecutor is shutting down")
            partition = self._partitions.get(partition_id)
            if partition is None and on_created is not None:
                waiters = self._waiters.setdefault(partition_id, [])
                if on_created not in waiters:
                    waiters.append(on_created)
            return partition

    def wait_for(self, partition_id: str, timeout: float
                 ) -> ResultPartition | BlockingResultPartition | StoredResultPartition | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while partition_id not in self._partitions:
                remaining = deadline - time.monotonic()
                if self._closed:
                    raise UnavailableError("TaskExecutor is shutting down")
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            return self._partitions[partition_id]

    def release(self, partition_id: str) -> None:
        with self._cond:
            partition = self._partitions.pop(partition_id, None)
        if partition is not None:
            partition.release()

    def release_all(self, predicate: Callable[[str], bool] = lambda _: True, blocking: bool = True) -> None:
        with self._cond:
            ids = [pid for pid, p in self._partitions.items()
                   if predicate(pid) and (blocking or not isinstance(p, BlockingResultPartition))]
            for pid in [pid for pid in self._waiters if predicate(pid)]:  # readers of a job that ended
                del self._waiters[pid]
        for pid in ids:
            self.release(pid)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            stored = [pid for pid, p in self._partitions.items() if isinstance(p, StoredResultPartition)]
            self._cond.notify_all()
        for pid in stored:  # they outlive this TaskExecutor: its consumers may not have read them yet
            with self._cond:
                partition = self._partitions.pop(pid, None)
            if isinstance(partition, StoredResultPartition):
                partition.release(delete=False)
        self.release_all()
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __len__(self) -> int:
        with self._cond:
            return len(self._partitions)
