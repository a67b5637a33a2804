"""Result partitions on the producer side.

A producer subtask writes into one ``ResultPartition`` per outgoing edge; it has one bounded
``Subpartition`` per consumer subtask (one in all for a forward edge). A consumer pulls its
subpartition, locally or over Arrow Flight, as its own stream: a full subpartition blocks only
the producer's writes into it, which is how back-pressure reaches the producer.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable

import pyarrow as pa

from yarnflow.common.errors import UnavailableError
from yarnflow.common.ids import ResultPartitionID
from yarnflow.worker.runtime.elements import EndOfPartition

log = logging.getLogger(__name__)


class PartitionReleasedError(Exception):
    """The partition was released (its task was cancelled or the job ended)."""


class Subpartition:
    """A bounded FIFO of record batches and events with one producer and one consumer.

    Only record batches count against ``capacity``: events (watermarks, end of partition) are
    always accepted, so a producer can always finish.
    """

    def __init__(self, capacity: int, on_consumed: Callable[[], None] | None = None) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._batches = 0
        self._capacity = capacity
        self._cond = threading.Condition()
        self._released = False
        self._consumed = False
        self._on_consumed = on_consumed
        self.bytes_added = 0

    def add(self, element: Any, cancelled: Callable[[], bool] = lambda: False) -> None:
        is_batch = isinstance(element, pa.RecordBatch)
        with self._cond:
            while is_batch and self._batches >= self._capacity and not self._released:
                if cancelled():
                    raise PartitionReleasedError("task cancelled while waiting for buffer space")
                self._cond.wait(0.2)
            if self._released:
                raise PartitionReleasedError("subpartition released")
            self._items.append(element)
            if is_batch:
                self._batches += 1
                self.bytes_added += element.nbytes
            self._cond.notify_all()

    def take(self, timeout: float | None) -> Any | None:
        """The next element, waiting up to ``timeout`` seconds; None when none came."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._items:
                if self._released:
                    raise PartitionReleasedError("subpartition released")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining if remaining is not None else 0.5)
            element = self._items.popleft()
            if isinstance(element, pa.RecordBatch):
                self._batches -= 1
            self._cond.notify_all()
        if isinstance(element, EndOfPartition) and not self._consumed:
            self._consumed = True
            if self._on_consumed:
                self._on_consumed()
        return element

    def push_back(self, element: Any) -> None:
        """Return an element just taken to the head of the queue (its consumer could not send it)."""
        with self._cond:
            self._items.appendleft(element)
            if isinstance(element, pa.RecordBatch):
                self._batches += 1
            self._cond.notify_all()

    @property
    def consumed(self) -> bool:
        return self._consumed

    def backlog(self) -> int:
        with self._cond:
            return self._batches

    def release(self) -> None:
        with self._cond:
            self._released = True
            self._items.clear()
            self._batches = 0
            self._cond.notify_all()


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

    def __init__(self) -> None:
        self._partitions: dict[str, ResultPartition] = {}
        self._cond = threading.Condition()
        self._closed = False

    def create(self, partition_id: ResultPartitionID, num_subpartitions: int, capacity: int) -> ResultPartition:
        partition = ResultPartition(partition_id, num_subpartitions, capacity, self._consumed)
        with self._cond:
            self._partitions[partition_id] = partition
            self._cond.notify_all()
        return partition

    def _consumed(self, partition: ResultPartition) -> None:
        log.debug("partition %s fully consumed: releasing", partition.partition_id)
        self.release(partition.partition_id)

    def wait_for(self, partition_id: str, timeout: float) -> ResultPartition | None:
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

    def release_all(self, predicate: Callable[[str], bool] = lambda _: True) -> None:
        with self._cond:
            ids = [p for p in self._partitions if predicate(p)]
        for pid in ids:
            self.release(pid)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.release_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._partitions)
