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
from typing import Any, Callable, Iterator

import pyarrow as pa

from yarnflow.common.errors import UnavailableError
from yarnflow.common.ids import ResultPartitionID
from yarnflow.worker.elements import END_OF_PARTITION, EndOfPartition

log = logging.getLogger(__name__)


class PartitionReleasedError(Exception):
    """The partition was released (its task was cancelled or the job ended).

    ``partition_id`` names it when a reader asked for it (None when its own producer hit the
    release); a consumer failing with it reports the partition as unavailable."""

    def __init__(self, message: str, partition_id: str | None = None) -> None:
        super().__init__(message)
        self.partition_id: ResultPartitionID | None = ResultPartitionID(partition_id) if partition_id else None


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


class _SubpartitionHandle:
    """The producer's handle on one subpartition of a partition written to files (blocking or
    stored), which takes each element by index."""

    def __init__(self, partition: BlockingResultPartition | StoredResultPartition, index: int) -> None:
        self._partition = partition
        self._index = index

    def add(self, element: Any, cancelled: Callable[[], bool] = lambda: False, block: bool = True) -> None:
        self._partition.add(self._index, element)


def _close_all(writers: list[Any], files: list[Any]) -> None:
    """Close what a released partition still had open (errors do not matter any more)."""
    for w, f in zip(writers, files):
        try:
            if w is not None:
                w.close()
            if f is not None:
                f.close()
        except (OSError, pa.ArrowException):
            pass


class BlockingResultPartition:
    """A blocking result partition: written by the producer to the TaskExecutor's local disk
    (one Arrow IPC file per subpartition) and served, any number of times, once the producer
    has finished. It lives until the JobMaster releases it (or the job ends)."""

    def __init__(self, partition_id: ResultPartitionID, num_subpartitions: int, directory: str) -> None:
        self.partition_id = partition_id
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self._lock = threading.Lock()
        self._writers: list[Any] = [None] * num_subpartitions
        self._sinks: list[Any] = [None] * num_subpartitions
        self._done = [False] * num_subpartitions
        self.finished = threading.Event()
        self.released = False
        self.subpartitions = [_SubpartitionHandle(self, i) for i in range(num_subpartitions)]
        self.bytes_written = 0

    def _path(self, index: int) -> str:
        return os.path.join(self.directory, f"{index}.arrow")

    def _open(self, index: int) -> Any:
        """A new file for subpartition ``index``'s batches."""
        return pa.OSFile(self._path(index), "wb")

    def _ended(self, index: int) -> None:
        """Subpartition ``index``'s file is complete (and closed)."""

    def add(self, index: int, element: Any) -> None:
        if self.released:
            raise PartitionReleasedError(f"partition {self.partition_id} released")
        if isinstance(element, pa.RecordBatch):
            writer = self._writers[index]
            if writer is None:
                self._sinks[index] = self._open(index)
                writer = self._writers[index] = pa.ipc.new_stream(self._sinks[index], element.schema)
            writer.write_batch(element)
            self.bytes_written += element.nbytes
        elif isinstance(element, EndOfPartition):
            if self._writers[index] is not None:
                self._writers[index].close()
                self._sinks[index].close()
                self._writers[index] = self._sinks[index] = None
                self._ended(index)
            with self._lock:
                self._done[index] = True
                if all(self._done):
                    self.finished.set()
        # watermarks are not kept: a blocking consumer sees its inputs end (MAX watermark)

    def read(self, index: int) -> Iterator[Any]:
        """The subpartition's batches, then its end of partition."""
        if not self.finished.is_set():
            raise PartitionReleasedError(f"partition {self.partition_id} is not finished", self.partition_id)
        path = self._path(index)
        if os.path.exists(path):
            try:
                # read, not memory-mapped: a mapped file's pages stay in the reader's resident
                # memory until it is closed, so a consumer's memory grew with the partition
                with pa.OSFile(path, "rb") as source:
                    yield from pa.ipc.open_stream(source)
            except FileNotFoundError:
                raise PartitionReleasedError(f"partition {self.partition_id} released", self.partition_id) from None
        yield END_OF_PARTITION

    def release(self) -> None:
        self.released = True
        _close_all(self._writers, self._sinks)
        shutil.rmtree(self.directory, ignore_errors=True)


class StoredResultPartition(BlockingResultPartition):
    """A BLOCKING_PERSISTENT result partition: each subpartition an Arrow IPC file in the job's
    storage dir (``<job storage>/partitions/<partition id>/<i>.arrow``, any fsspec filesystem),
    written under a temporary name and renamed when the subpartition ends. Consumers read the
    files themselves (``read_stored``), after the producer finished, from any process: the
    result outlives the producer's TaskExecutor. Released (deleted) when the JobMaster releases
    it or the producer's attempt fails; a TaskExecutor that stops leaves it be."""

    def __init__(self, partition_id: ResultPartitionID, num_subpartitions: int, url: str) -> None:
        import fsspec

        self.url = url.rstrip("/")
        self._fs, self._root = fsspec.core.url_to_fs(self.url)
        self._fs.makedirs(self._root, exist_ok=True)
        super().__init__(partition_id, num_subpartitions, tempfile.gettempdir())  # no local folder is used
        if not num_subpartitions:
            self.finished.set()

    def _open(self, index: int) -> Any:
        return self._fs.open(f"{self._root}/_{index}.arrow.tmp", "wb")

    def _ended(self, index: int) -> None:
        self._fs.mv(f"{self._root}/_{index}.arrow.tmp", f"{self._root}/{index}.arrow")

    def read(self, index: int) -> Iterator[Any]:
        """Subpartition ``index``, as consumers read it (``read_stored``)."""
        return read_stored(self.url, index)

    def release(self, delete: bool = True) -> None:
        self.released = True
        _close_all(self._writers, self._sinks)
        if delete:
            try:
                self._fs.rm(self._root, recursive=True)
            except FileNotFoundError:
                pass


def stored_partition_url(job_storage_dir: str, partition_id: str) -> str:
    """Where a BLOCKING_PERSISTENT partition is stored."""
    return f"{job_storage_dir.rstrip('/')}/partitions/{partition_id}"


def read_stored(url: str, index: int) -> Iterator[Any]:
    """Subpartition ``index`` of the stored partition at ``url``: its batches, then its end (no
    file: the producer sent it nothing)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url.rstrip("/"))
    path = f"{root}/{index}.arrow"
    if fs.exists(path):
        with fs.open(path, "rb") as fh:
            yield from pa.ipc.open_stream(fh)
    elif not fs.exists(root):
        raise PartitionReleasedError(f"stored partition {url} does not exist", url.rstrip("/").rsplit("/", 1)[-1])
    yield END_OF_PARTITION


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
