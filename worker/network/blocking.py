"""Result partitions written to files: blocking partitions on the TaskExecutor's disk (BATCH
exchanges) and stored ones in the job's storage dir (BLOCKING_PERSISTENT), served any number of
times once their producer finished; and the error of a released partition."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from typing import Any, Callable, Iterator

import pyarrow as pa

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
