"""Where RocksDB state backends keep their working files, and their removal when a task ends.

``state.backend.rocksdb.localdir`` (default: the TaskExecutor's work dir, set once by it with
``set_default_base``; else the system's temp dir) holds ``yarnflow-rocksdb/<attempt id>/``, one
folder per task attempt, with one folder per backend in it. The task calls ``release_attempt``
when it ends, whatever the outcome: its backends are closed and the attempt's folder removed.

A TaskExecutor killed with SIGKILL cannot do that. Each attempt's folder therefore names its
owner (``owner.json``: the process id and its start time), and each new attempt's first
backend removes the attempt folders beside its own whose owner process is gone
(``remove_orphans``): a shared ``state.backend.rocksdb.localdir`` does not fill up with the
state of TaskExecutors that died.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import uuid
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from yarnflow.worker.state.rocksdb import RocksDBKeyedStateBackend

log = logging.getLogger(__name__)

__all__ = ["attempt_dir", "new_rocksdb_backend", "release_attempt", "remove_orphans", "set_default_base"]

LOCALDIR_KEY = "state.backend.rocksdb.localdir"
_default_base: str | None = None
_lock = threading.Lock()
_open: dict[str, list[RocksDBKeyedStateBackend]] = {}
_OWNER = "owner.json"


def set_default_base(path: str) -> None:
    """The TaskExecutor's work dir: where backends go when the config names no localdir."""
    global _default_base
    _default_base = path


def attempt_dir(config: dict[str, Any], attempt_id: str) -> str:
    base = str(config.get(LOCALDIR_KEY) or "") or _default_base or tempfile.gettempdir()
    return os.path.join(base, "yarnflow-rocksdb", attempt_id or f"local-{os.getpid()}")


def new_rocksdb_backend(config: dict[str, Any], attempt_id: str, name: str, max_parallelism: int,
                        key_group_range: range, incremental: bool) -> RocksDBKeyedStateBackend:
    """A RocksDB backend in a folder of its own under the attempt's folder, released with it."""
    from yarnflow.worker.state.rocksdb import RocksDBKeyedStateBackend

    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40]
    attempt = attempt_dir(config, attempt_id)
    if not os.path.exists(os.path.join(attempt, _OWNER)):  # a new attempt: clean up after dead ones first
        remove_orphans(os.path.dirname(attempt))
    _claim(attempt)
    folder = os.path.join(attempt, f"{safe}-{uuid.uuid4().hex[:8]}")
    backend = RocksDBKeyedStateBackend(max_parallelism, key_group_range, folder, incremental)
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


def _this_process() -> dict[str, Any]:
    return {"pid": os.getpid(), "started": psutil.Process().create_time()}


def _claim(attempt: str) -> None:
    """Name this process the owner of the attempt's folder (before anything else is in it)."""
    owner = os.path.join(attempt, _OWNER)
    if not os.path.exists(owner):
        os.makedirs(attempt, exist_ok=True)
        with open(owner, "w") as fh:
            json.dump(_this_process(), fh)


def _alive(owner: dict[str, Any]) -> bool:
    try:
        return abs(psutil.Process(int(owner["pid"])).create_time() - float(owner["started"])) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, TypeError, ValueError):
        return False  # gone, or its pid now belongs to another process


def remove_orphans(root: str) -> list[str]:
    """Remove the attempt folders under ``root`` (a ``yarnflow-rocksdb`` folder) whose owner
    process has died; returns them. Folders without an owner file are left alone."""
    removed: list[str] = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        folder = os.path.join(root, name)
        try:
            with open(os.path.join(folder, _OWNER)) as fh:
                owner = json.load(fh)
        except (OSError, ValueError):
            continue
        if not _alive(owner):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
            log.info("removed the RocksDB working files at %s: their TaskExecutor (pid %s) is gone",
                     folder, owner.get("pid"))
    return removed
