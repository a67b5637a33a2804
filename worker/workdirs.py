"""Per-attempt working folders that outlive a killed TaskExecutor only until the next one looks.

RocksDB state backends (``state/localdir.py``) and spilling batch operators
(``memory/spill.py``) keep files in one folder per task attempt. The task removes its folder
when it ends, whatever the outcome; a TaskExecutor killed with SIGKILL cannot. So each folder
names its owner (``owner.json``: the process id and its start time), and ``remove_orphans``
removes the folders beside it whose owner process is gone: a shared local dir does not fill up
with the files of TaskExecutors that died."""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Any

import psutil

log = logging.getLogger(__name__)

__all__ = ["claim", "remove_orphans"]

OWNER_FILE = "owner.json"


def _this_process() -> dict[str, Any]:
    return {"pid": os.getpid(), "started": psutil.Process().create_time()}


def claim(folder: str) -> bool:
    """Create ``folder`` and name this process its owner (before anything else is in it); False
    when it was claimed already."""
    owner = os.path.join(folder, OWNER_FILE)
    if os.path.exists(owner):
        return False
    os.makedirs(folder, exist_ok=True)
    with open(owner, "w") as fh:
        json.dump(_this_process(), fh)
    return True


def _alive(owner: dict[str, Any]) -> bool:
    try:
        return abs(psutil.Process(int(owner["pid"])).create_time() - float(owner["started"])) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, TypeError, ValueError):
        return False  # gone, or its pid now belongs to another process


def remove_orphans(root: str, what: str = "working files") -> list[str]:
    """Remove the folders under ``root`` whose owner process has died; returns them. Folders
    without an owner file are left alone."""
    removed: list[str] = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        folder = os.path.join(root, name)
        try:
            with open(os.path.join(folder, OWNER_FILE)) as fh:
                owner = json.load(fh)
        except (OSError, ValueError):
            continue
        if not _alive(owner):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
            log.info("removed the %s at %s: their TaskExecutor (pid %s) is gone", what, folder, owner.get("pid"))
    return removed
