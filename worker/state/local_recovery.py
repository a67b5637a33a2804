"""Task-local recovery (Flink's ``state.backend.local-recovery``): a TaskExecutor keeps a copy of
its tasks' latest snapshots on its own disk, and a task restored on it (a region failover after
another task failed, a job restart that kept its slots) reads its state from there instead of
the checkpoint storage, falling back to the storage for any file whose copy is missing or
corrupt.

Layout, under the TaskExecutor's work dir (the base of ``localdir.set_default_base``)::

    yarnflow-local-state/<job id>/<vertex id>-<subtask>/index.json   checkpoint -> remote URL -> copy
    yarnflow-local-state/<job id>/<vertex id>-<subtask>/files/<sha256>  the copies, by content

A copy is made as the snapshot is written (the state files are written here first and uploaded
from here; a RocksDB snapshot's SST files are hard-linked: they are immutable) and recorded with
its size and sha256 under the checkpoint and the URL the task acknowledged. A checkpoint's
entries go when a later one completes or when it is aborted, and the files no entry names with
them. A restore looks each file up by checkpoint and URL; a copy whose size or sha256 no longer
matches is not used (the storage's file is read instead, and counted as such).

``reading_from(state, stats)`` makes a task's copies visible, on its own thread, to the reads of
its restore (``read_task_state``, ``read_channel_state``, a RocksDB backend's ``restore_native``):
each asks ``local_copy(checkpoint id, url)``, and every file read is counted in ``stats``, from
the copies or from the storage. Every method is thread-safe (the snapshot writer's thread writes,
the task's thread restores and confirms)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

__all__ = ["LOCAL_STATE_DIR", "ReadStats", "TaskLocalState", "local_copy", "reading_from", "record_read",
           "release_job"]

log = logging.getLogger(__name__)

LOCAL_STATE_DIR = "yarnflow-local-state"


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


class TaskLocalState:
    """The copies of one subtask's snapshots on this TaskExecutor (see the module docstring)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._files = os.path.join(folder, "files")
        self._index_path = os.path.join(folder, "index.json")
        self._lock = threading.Lock()
        os.makedirs(self._files, exist_ok=True)
        try:
            with open(self._index_path) as fh:
                raw = json.load(fh)
            self._index: dict[int, dict[str, dict[str, Any]]] = {int(k): v for k, v in raw.items()}
        except (OSError, ValueError):
            self._index = {}

    @classmethod
    def of(cls, base: str, job_id: str, vertex_id: str, subtask_index: int) -> TaskLocalState:
        """The subtask's copies: one object per folder in this process, so that the attempt that
        restores and one still writing a snapshot share one index."""
        folder = os.path.join(base, LOCAL_STATE_DIR, job_id, f"{vertex_id}-{subtask_index}")
        with _REGISTRY_LOCK:
            state = _REGISTRY.get(folder)
            if state is None:
                state = _REGISTRY[folder] = cls(folder)
            return state

    # -- keeping copies (the snapshot writer's thread) -----------------------------------------------
    def keep(self, checkpoint_id: int, url: str, source: str, link: bool = False,
             sha256: str | None = None) -> None:
        """Keep a copy of the local file ``source``, whose content ``url`` holds now, for
        checkpoint ``checkpoint_id``: hard-linked (``link``: an immutable file) or copied."""
        digest = sha256 or sha256_file(source)
        target = os.path.join(self._files, digest)
        if not os.path.exists(target):
            tmp = f"{target}.{uuid.uuid4().hex[:8]}"
            try:
                if link:
                    os.link(source, tmp)
                else:
                    shutil.copyfile(source, tmp)
            except OSError:  # (another filesystem than the source's: a link is not possible)
                shutil.copyfile(source, tmp)
            os.replace(tmp, target)
        self._record(checkpoint_id, url, digest)

    def temp_file(self) -> str:
        """A path to write a state file at before ``keep`` takes it (moved, not copied)."""
        return os.path.join(self._files, f"new-{uuid.uuid4().hex}")

    def keep_written(self, checkpoint_id: int, url: str, written: str) -> None:
        """Keep ``written`` (a ``temp_file`` the writer wrote and uploaded) as the copy of ``url``."""
        digest = sha256_file(written)
        target = os.path.join(self._files, digest)
        os.replace(written, target)
        self._record(checkpoint_id, url, digest)

    def _record(self, checkpoint_id: int, url: str, digest: str) -> None:
        """The copy ``files/<digest>`` holds ``url`` of checkpoint ``checkpoint_id``."""
        size = os.path.getsize(os.path.join(self._files, digest))
        with self._lock:
            self._index.setdefault(checkpoint_id, {})[url] = {"sha256": digest, "size": size}
            self._save()

    # -- retention (the task's thread, in order with its snapshots) ----------------------------------
    def confirmed(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: the copies of earlier ones go."""
        with self._lock:
            for old in [c for c in self._index if c < checkpoint_id]:
                del self._index[old]
            self._collect()

    def aborted(self, checkpoint_id: int) -> None:
        with self._lock:
            if self._index.pop(checkpoint_id, None) is not None:
                self._collect()

    # -- reading (the task's thread, while it restores) ----------------------------------------------
    def copy_of(self, checkpoint_id: int, url: str) -> str | None:
        """The verified local copy of ``url`` for the checkpoint, or None (none kept, or one
        whose size or sha256 no longer matches: corrupt)."""
        with self._lock:
            entry = self._index.get(checkpoint_id, {}).get(url)
        if entry is None:
            return None
        path = os.path.join(self._files, entry["sha256"])
        try:
            if os.path.getsize(path) != entry["size"] or sha256_file(path) != entry["sha256"]:
                log.warning("the local copy of %s (checkpoint %d) is corrupt: reading the checkpoint storage's",
                            url, checkpoint_id)
                return None
        except OSError:
            log.warning("the local copy of %s (checkpoint %d) is gone: reading the checkpoint storage's", url,
                        checkpoint_id)
            return None
        return path

    def checkpoints(self) -> list[int]:
        with self._lock:
            return sorted(self._index)

    def _save(self) -> None:
        tmp = f"{self._index_path}.{uuid.uuid4().hex[:8]}"
        with open(tmp, "w") as fh:
            json.dump({str(k): v for k, v in self._index.items()}, fh)
        os.replace(tmp, self._index_path)

    def _collect(self) -> None:
        """Remove the copies no checkpoint's entry names (under the lock)."""
        self._save()
        wanted = {e["sha256"] for entries in self._index.values() for e in entries.values()}
        for name in os.listdir(self._files):
            if name not in wanted and not name.startswith("new-"):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self._files, name))


_REGISTRY: dict[str, TaskLocalState] = {}
_REGISTRY_LOCK = threading.Lock()


def release_job(base: str, job_id: str) -> None:
    """The job left this TaskExecutor (its last slot here was freed): its copies go."""
    folder = os.path.join(base, LOCAL_STATE_DIR, job_id)
    with _REGISTRY_LOCK:
        for key in [k for k in _REGISTRY if k.startswith(folder + os.sep)]:
            del _REGISTRY[key]
    shutil.rmtree(folder, ignore_errors=True)


@dataclass
class ReadStats:
    """The state files a restore read: from this TaskExecutor's copies, or from the storage."""

    local_files: int = 0
    local_bytes: int = 0
    remote_files: int = 0
    remote_bytes: int = 0

    def describe(self) -> str:
        return (f"{self.local_files} files ({self.local_bytes} bytes) read locally, {self.remote_files} files "
                f"({self.remote_bytes} bytes) from the checkpoint storage")


class _Reading(threading.local):
    state: TaskLocalState | None = None
    stats: ReadStats | None = None
    checkpoint_id = 0


_reading = _Reading()


@contextlib.contextmanager
def reading_from(state: TaskLocalState | None, checkpoint_id: int, stats: ReadStats) -> Iterator[ReadStats]:
    """While the calling thread restores checkpoint ``checkpoint_id``: ``local_copy`` answers from
    ``state`` (None: local recovery is off), and reads are counted in ``stats``."""
    _reading.state, _reading.checkpoint_id, _reading.stats = state, checkpoint_id, stats
    try:
        yield stats
    finally:
        _reading.state, _reading.stats, _reading.checkpoint_id = None, None, 0


def local_copy(url: str) -> str | None:
    """The local copy of the state file ``url`` the current restore may read instead, or None."""
    state = _reading.state
    return state.copy_of(_reading.checkpoint_id, url) if state is not None else None


def record_read(size: int, local: bool) -> None:
    """Count a state file the current restore read (no restore under way: nothing counted)."""
    stats = _reading.stats
    if stats is None:
        return
    if local:
        stats.local_files += 1
        stats.local_bytes += size
    else:
        stats.remote_files += 1
        stats.remote_bytes += size
