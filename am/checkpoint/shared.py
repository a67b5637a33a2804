"""The shared folder of incremental checkpoints: which retained checkpoint uses which file.

An incremental checkpoint (RocksDB state backend, ``execution.checkpointing.incremental``)
uploads only the SST files that are new since the previous one, into
``<checkpoint dir>/shared/``, and references the unchanged ones there. Its tasks acknowledge each
shared file they reference as a state file named ``SHARED_STATE_FILE``, so the checkpoint's
``_metadata`` lists them. ``SharedStateRegistry`` (pure: the JobMaster core's) counts, per shared
file, the retained checkpoints that reference it: it learns a checkpoint when it completes (or
from its ``_metadata`` when a new leader recovers the job) and forgets it when it is discarded,
returning the files no retained checkpoint references any more; only those are deleted
(``delete_shared_files``, in the shell). A file that a checkpoint uploaded but that never
completed is referenced by nobody and is not deleted here.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable

import fsspec

from yarnflow.common.messages import SHARED_STATE_FILE, OperatorStateFile

log = logging.getLogger(__name__)

__all__ = ["SHARED_STATE_FILE", "SharedStateRegistry", "delete_shared_files", "is_shared"]


def is_shared(f: OperatorStateFile | dict[str, object]) -> bool:
    name = f.name if isinstance(f, OperatorStateFile) else f.get("name")
    return name == SHARED_STATE_FILE


class SharedStateRegistry:
    """Reference counts of shared files over the retained checkpoints."""

    def __init__(self) -> None:
        self._counts: collections.Counter[str] = collections.Counter()
        self._by_checkpoint: dict[int, frozenset[str]] = {}

    def register(self, checkpoint_id: int, files: Iterable[OperatorStateFile]) -> None:
        """Checkpoint ``checkpoint_id`` is retained and references the shared ones of ``files``."""
        if checkpoint_id in self._by_checkpoint:
            return
        paths = frozenset(f.path for f in files if is_shared(f))
        self._by_checkpoint[checkpoint_id] = paths
        self._counts.update(paths)

    def unregister(self, checkpoint_id: int) -> tuple[str, ...]:
        """Checkpoint ``checkpoint_id`` is discarded: the shared files nobody references now."""
        gone = []
        for path in sorted(self._by_checkpoint.pop(checkpoint_id, frozenset())):
            self._counts[path] -= 1
            if self._counts[path] <= 0:
                del self._counts[path]
                gone.append(path)
        return tuple(gone)

    def references(self, path: str) -> int:
        return self._counts.get(path, 0)

    def __len__(self) -> int:
        return len(self._counts)


def delete_shared_files(paths: Iterable[str]) -> None:
    """Delete ``paths`` (shared files no retained checkpoint references); I/O, shells only."""
    for url in paths:
        try:
            fs, path = fsspec.core.url_to_fs(url)
            fs.rm(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not delete the shared checkpoint file %s: %s", url, exc)
