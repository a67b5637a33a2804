"""Where RocksDB state backends keep their working files, and their removal when a task ends.

``state.backend.rocksdb.localdir`` (default: the TaskExecutor's work dir, set once by it with
``set_default_base``; else the system's temp dir) holds ``yarnflow-rocksdb/<attempt id>/``, one
folder per task attempt, with one folder per backend in it. The task calls ``release_attempt``
when it ends, whatever the outcome: its backends are closed and the attempt's folder removed.

A TaskExecutor killed with SIGKILL cannot do that. Each attempt's folder therefore names its
owner, and each new attempt's first backend removes the attempt folders beside its own whose
owner process is gone (``workdirs.remove_orphans``): a shared ``state.backend.rocksdb.localdir``
does not fill up with the state of TaskExecutors that died.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import uuid
from typing import TYPE_CHECKING, Any

from yarnflow.worker import workdirs

if TYPE_CHECKING:
    from yarnflow.worker.state.rocksdb import RocksDBKeyedStateBackend

log = logging.getLogger(__name__)

__all__ = ["attempt_dir", "default_base", "new_rocksdb_backend", "release_attempt", "remove_orphans",
           "set_default_base"]

LOCALDIR_KEY = "state.backend.rocksdb.localdir"
_default_base: str | None = None
_lock = threading.Lock()
_open: dict[str, list[RocksDBKeyedStateBackend]] = {}


def set_default_base(path: str) -> None:
    """The TaskExecutor's work dir: where backends go when the config names no localdir."""
    global _default_base
    _default_base = path


def default_base() -> str:
    """The TaskExecutor's work dir (the system's temp dir outside a TaskExecutor)."""
    return _default_base or tempfile.gettempdir()


def attempt_dir(config: dict[str, Any], attempt_id: str) -> str:
    base = str(config.get(LOCALDIR_KEY) or "") or _default_base or tempfile.gettempdir()
    return os.path.join(base, "yarnflow-rocksdb", attempt_id or f"local-{os.getpid()}")


def new_rocksdb_backend(config: dict[str, Any], attempt_id: str, name: str, max_parallelism: int,
                        key_group_range: range, incremental: bool, memory: Any = None) -> RocksDBKeyedStateBackend:
    """A RocksDB backend in a folder of its own under the attempt's folder, released with it."""
    from yarnflow.worker.state.rocksdb import RocksDBKeyedStateBackend

    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40]
    attempt = attempt_dir(config, attempt_id)
    if not os.path.exists(os.path.join(attempt, workdirs.OWNER_FILE)):  # a new attempt: clean up after dead ones
        remove_orphans(os.path.dirname(attempt))
    workdirs.claim(attempt)
    folder = os.path.join(attempt, f"{safe}-{uuid.uuid4().hex[:8]}")
    backend = RocksDBKeyedStateBackend(max_parallelism, key_group_range, folder, incremental, memory)
    with _lock:
        _open.setdefault(attempt_id, []).append(backend)
    return backend


def release_attempt(config: dict[str, Any], attempt_id: str) -> None:
    """Close the backends of task attempt ``attempt_id`` and remove its working files."""
    with _lock:
        backends = _open.pop(attempt_id, [])
    for backend in backends:
        try:
            backend.close()
        except Exception:  # noqa: BLE001 - the folder goes below anyway
            log.warning("closing the RocksDB state backend in %s failed", backend.local_dir, exc_info=True)
    folder = attempt_dir(config, attempt_id)
    if os.path.isdir(folder):
        shutil.rmtree(folder, ignore_errors=True)
        log.info("removed the RocksDB working files of %s at %s", attempt_id, folder)


def remove_orphans(root: str) -> list[str]:
    """Remove the attempt folders under ``root`` (a ``yarnflow-rocksdb`` folder) whose owner
    process has died; returns them. Folders without an owner file are left alone."""
    return workdirs.remove_orphans(root, "RocksDB working files")
