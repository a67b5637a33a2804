"""Where a job's checkpoints live, on any fsspec filesystem (Flink's CheckpointStorage).

Layout::

    <checkpoints dir>/<job id>/chk-<n>/<vertex>-<subtask>-<attempt>/op<i>-<name>.arrow   task state
    <checkpoints dir>/<job id>/chk-<n>/_metadata                                          written last

``_metadata`` (JSON: which files belong to which subtask, and which subtasks had finished) is
written to a temporary name and renamed, so a checkpoint exists only once all of it does. The
JobMaster writes it; tasks write their state files. Every call does I/O: shells only.
"""

from __future__ import annotations

import json
import logging
import posixpath
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.ipc as ipc

from yarnflow.common.errors import YarnflowError
from yarnflow.common.messages import SHARED_STATE_FILE, TaskRestore
from yarnflow.common.states import JobStatus

log = logging.getLogger(__name__)

METADATA = "_metadata"


class CheckpointNotReadableError(YarnflowError):
    """A checkpoint's metadata or one of its state files is missing or corrupt."""


def checkpoints_retained(status: JobStatus, retention: str) -> bool:
    """Whether a job that ended ``status`` keeps its checkpoints, by
    ``execution.checkpointing.externalized-checkpoint-retention`` (Flink's rules): a FINISHED
    job's go whatever it says, a CANCELED one's stay with RETAIN_ON_CANCELLATION, a FAILED one's
    with DELETE_ON_CANCELLATION or RETAIN_ON_CANCELLATION; a SUSPENDED job's (or one not ended)
    always stay: its next leader restores from them."""
    if status == JobStatus.FINISHED:
        return False
    if status == JobStatus.CANCELED:
        return retention == "RETAIN_ON_CANCELLATION"
    if status == JobStatus.FAILED:
        return retention != "NO_EXTERNALIZED_CHECKPOINTS"
    return True


def job_checkpoint_dir(base: str, job_id: str) -> str:
    return f"{base.rstrip('/')}/{job_id}"


def checkpoint_path(job_dir: str, checkpoint_id: int) -> str:
    return f"{job_dir.rstrip('/')}/chk-{checkpoint_id}"


def read_metadata_url(url: str, checkpoint_id: int) -> dict[str, Any]:
    """The ``_metadata`` at ``url`` (any fsspec URL). Raises CheckpointNotReadableError when it
    is missing, not JSON or the metadata of another checkpoint."""
    try:
        with fsspec.open(url, "r") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise CheckpointNotReadableError(f"checkpoint {checkpoint_id}: cannot read {url}: {exc}") from exc
    if not isinstance(data, dict) or data.get("checkpoint_id") != checkpoint_id:
        raise CheckpointNotReadableError(f"checkpoint {checkpoint_id}: {url} is not its metadata")
    return data


def check_state_files(metadata: dict[str, Any]) -> None:
    """Raise CheckpointNotReadableError unless every state file the metadata names opens as
    Arrow IPC."""
    for subtask in metadata.get("subtasks", {}).values():
        for f in subtask.get("files", ()):
            _check_file(metadata.get("checkpoint_id", 0), f["path"], f.get("name") == SHARED_STATE_FILE)


def _check_file(checkpoint_id: int, url: str, shared: bool = False) -> None:
    """``shared``: a file of the shared folder (not Arrow): it must exist; its content is checked
    by the task that reads it."""
    try:
        fs, path = fsspec.core.url_to_fs(url)
        if shared:
            if not fs.exists(path):
                raise FileNotFoundError(f"shared state file {url} is missing")
            return
        with fs.open(path, "rb") as fh:
            ipc.open_file(pa.PythonFile(fh, mode="r")).schema  # noqa: B018 - reads the footer
    except (OSError, pa.ArrowInvalid, ValueError) as exc:
        raise CheckpointNotReadableError(f"checkpoint {checkpoint_id}: state file {url} cannot be read: {exc}") from exc


class CheckpointStorage:
    def __init__(self, job_dir: str) -> None:
        self.job_dir = job_dir
        self._fs, self._root = fsspec.core.url_to_fs(job_dir)

    def _path(self, checkpoint_id: int) -> str:
        return posixpath.join(self._root, f"chk-{checkpoint_id}")

    def write_metadata(self, checkpoint_id: int, metadata: dict[str, Any]) -> str:
        """Write ``chk-<n>/_metadata`` atomically; returns its URL."""
        folder = self._path(checkpoint_id)
        self._fs.makedirs(folder, exist_ok=True)
        final = posixpath.join(folder, METADATA)
        tmp = posixpath.join(folder, f".{METADATA}.inprogress")
        with self._fs.open(tmp, "w") as fh:
            json.dump(metadata, fh, indent=1, sort_keys=True)
        self._fs.mv(tmp, final)
        return str(self._fs.unstrip_protocol(final))

    def read_metadata(self, checkpoint_id: int) -> dict[str, Any]:
        return read_metadata_url(str(self._fs.unstrip_protocol(posixpath.join(self._path(checkpoint_id), METADATA))),
                                 checkpoint_id)

    def check_restore(self, restore: TaskRestore) -> None:
        """Raise ``CheckpointNotReadableError`` unless the checkpoint's metadata and every state
        file of ``restore`` can be opened as Arrow IPC."""
        self.read_metadata(restore.checkpoint_id)
        for f in restore.files:
            _check_file(restore.checkpoint_id, f.path, f.name == SHARED_STATE_FILE)

    def discard(self, checkpoint_id: int) -> None:
        path = self._path(checkpoint_id)
        try:
            if self._fs.exists(path):
                self._fs.rm(path, recursive=True)
        except OSError as exc:
            log.warning("could not delete checkpoint %d at %s: %s", checkpoint_id, path, exc)
