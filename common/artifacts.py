"""The job artifact store: the contract between the client that stores a job artifact and the
processes that read it (the TaskExecutors for operator chains, the JobMaster for split
enumeration).

An artifact is a zip, content-addressed by sha256, stored once at
``<storage dir>/artifacts/<sha256>.zip`` (``store_artifact``). Inside it, ``chain_entry`` holds
a vertex's pickled operator chain, ``source_entry`` a dynamic-split source alone, and ``src/``
the user's job file. ``ArtifactCache`` fetches an artifact once per content hash, checks the
hash, unpacks it locally and loads entries from it."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import shutil
import sys
import threading
import zipfile
from typing import Any

import cloudpickle
import fsspec

from yarnflow.common.errors import YarnflowError

log = logging.getLogger(__name__)


class ArtifactError(YarnflowError, IOError):
    """The job artifact is missing, corrupt or does not hold what the task needs."""


#: Unpickling an operator chain imports the modules it names. Two task threads doing that at
#: once can meet in a package whose ``__init__`` imports its own submodules: Python's per-module
#: import locks then hand one thread a partially initialised module (ImportError "partially
#: initialized module" or KeyError from pickle). One process-wide lock makes every load import
#: alone; loads are short (a few ms), so tasks starting together barely wait.
_LOAD_LOCK = threading.RLock()


def artifact_uri(storage_dir: str, sha256: str) -> str:
    """Where the artifact with content hash ``sha256`` lives under ``storage_dir``."""
    return f"{storage_dir.rstrip('/')}/artifacts/{sha256}.zip"


def store_artifact(data: bytes, storage_dir: str) -> tuple[str, str]:
    """Store the zipped artifact ``data`` under ``storage_dir`` unless an artifact with the same
    content is already there; returns ``(uri, sha256)``. The write goes to a temporary file that
    is renamed into place, so a reader never sees a partial artifact. Filesystem errors
    (``OSError``) propagate: the job cannot be submitted without its artifact."""
    digest = hashlib.sha256(data).hexdigest()
    uri = artifact_uri(storage_dir, digest)
    fs, path = fsspec.core.url_to_fs(uri)
    if not fs.exists(path):
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with fs.open(tmp, "wb") as fh:
            fh.write(data)
        fs.mv(tmp, path)
    return uri, digest


def chain_entry(vertex_id: str) -> str:
    """A vertex's pickled operator chain."""
    return f"chains/{vertex_id}.pkl"


def source_entry(vertex_id: str) -> str:
    """The source operator alone (for split enumeration in the JobMaster)."""
    return f"sources/{vertex_id}.pkl"


class ArtifactCache:
    """Artifacts unpacked under a local ``directory``, one subdirectory per content hash; safe
    to share between threads. Every method raises ``ArtifactError`` when the artifact cannot be
    fetched or lacks the entry asked for: the task (or split request) that needed it fails."""

    def __init__(self, directory: str) -> None:
        self._dir = directory
        self._lock = threading.Lock()
        os.makedirs(directory, exist_ok=True)

    def fetch(self, uri: str, sha256: str) -> str:
        """The local directory the artifact ``uri`` is unpacked into (fetched if needed)."""
        target = os.path.join(self._dir, sha256)
        with self._lock:
            if os.path.isdir(target):
                return target
            try:
                with fsspec.open(uri, "rb") as fh:
                    data = fh.read()
            except (OSError, ValueError) as exc:
                raise ArtifactError(f"cannot fetch the job artifact {uri}: {exc}") from exc
            digest = hashlib.sha256(data).hexdigest()
            if sha256 and digest != sha256:
                raise ArtifactError(f"job artifact {uri} is corrupt: sha256 {digest} != {sha256}")
            tmp = target + ".tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                with zipfile.ZipFile(io.BytesIO(data)) as zf:
                    zf.extractall(tmp)
            except zipfile.BadZipFile as exc:
                raise ArtifactError(f"job artifact {uri} is not a valid zip: {exc}") from exc
            os.replace(tmp, target)
            log.info("fetched job artifact %s (%d bytes)", uri, len(data))
            return target

    def load_source(self, uri: str, sha256: str, vertex_id: str) -> Any:
        root = self.fetch(uri, sha256)
        try:
            with open(os.path.join(root, source_entry(vertex_id)), "rb") as fh, _LOAD_LOCK:
                return cloudpickle.load(fh)
        except FileNotFoundError:
            raise ArtifactError(f"job artifact {uri} has no source for vertex {vertex_id}") from None

    def load_chain(self, uri: str, sha256: str, vertex_id: str) -> list[Any]:
        root = self.fetch(uri, sha256)
        src = os.path.join(root, "src")
        if os.path.isdir(src) and src not in sys.path:
            sys.path.append(src)  # helper modules the user's job imports
        path = os.path.join(root, chain_entry(vertex_id))
        try:
            with open(path, "rb") as fh, _LOAD_LOCK:
                chain = cloudpickle.load(fh)
        except FileNotFoundError:
            raise ArtifactError(f"job artifact {uri} has no operator chain for vertex {vertex_id}") from None
        except Exception as exc:
            raise ArtifactError(f"cannot load the operators of vertex {vertex_id} from {uri}: "
                                f"{type(exc).__name__}: {exc}") from exc
        return list(chain)
