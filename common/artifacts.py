"""The job artifact store: the contract between the client that stores a job artifact and the
processes that read it (the TaskExecutors for operator chains, the JobMaster for split
enumeration).

An artifact is a zip, content-addressed by sha256, stored once at
``<storage dir>/artifacts/<sha256>.zip`` (``store_artifact``). Inside it, ``chain_entry`` holds
a vertex's pickled operator chain, ``source_entry`` a dynamic-split source alone, and ``src/``
the user's job file. ``ArtifactCache`` fetches an artifact once per content hash, checks the
hash, unpacks it locally and loads entries from it.

The store is the AppMaster's (its storage dir, in high-availability storage when HA is on);
TaskExecutors see no other host's files and fetch an artifact from the JobMaster of its job
(Flink's BlobServer: ``JobMasterService.readArtifact``, in ``READ_CHUNK`` pieces), into a cache
the TaskExecutors of one host share (Flink's BlobCache). Each unpacked artifact holds a manifest
of its files' sizes and CRC-32s, checked at every use (a corrupt entry is fetched again), and one
marker per process using it (``.yarnflow-users/<pid>``): the last TaskExecutor of the host to
stop using it (its job left) deletes it. The cache's processes serialise fetches and deletions
with a ``flock`` on the cache folder."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import shutil
import sys
import threading
import time
import zipfile
import zlib
from collections.abc import Callable, Collection, Iterator
from typing import Any

import cloudpickle
import fsspec
import psutil

from yarnflow.common.config import Configuration, Options
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


def leaves_folder(name: str) -> bool:
    """Whether a zip member's path would unpack outside its folder: absolute, a drive, or ``..``."""
    parts = name.replace("\\", "/").split("/")
    return name.startswith(("/", "\\")) or ".." in parts or bool(parts and parts[0].endswith(":"))


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


def _tree_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, f)) for folder, _, files in os.walk(root) for f in files)


#: reads ``length`` bytes of an artifact from ``offset`` (fewer at its end): the blob service
ArtifactReader = Callable[[int, int], bytes]
READ_CHUNK = 4 << 20
MANIFEST = ".yarnflow-manifest.json"  # (in an unpacked artifact: each file's size and CRC-32)
USERS = ".yarnflow-users"  # (in an unpacked artifact: one empty file per process using it, by pid)


@contextlib.contextmanager
def _host_lock(directory: str) -> Iterator[None]:
    """An exclusive lock on the cache folder, held across the processes of the host (the
    TaskExecutors sharing the cache) while one fetches, checks or deletes."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _damage(target: str) -> str | None:
    """What is wrong with an unpacked artifact (a file missing, or of another size or CRC-32
    than its manifest says), or None."""
    try:
        with open(os.path.join(target, MANIFEST), encoding="utf-8") as fh:
            manifest = json.load(fh)
        for name, (size, crc) in manifest.items():
            path = os.path.join(target, name)
            if os.path.getsize(path) != size:
                return f"{name} has {os.path.getsize(path)} bytes, not {size}"
            with open(path, "rb") as fh:
                if zlib.crc32(fh.read()) != crc:
                    return f"{name} does not have its CRC-32"
    except (OSError, ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _mark_user(target: str) -> None:
    os.makedirs(os.path.join(target, USERS), exist_ok=True)
    with open(os.path.join(target, USERS, str(os.getpid())), "w"):
        pass


def _unmark_user(target: str) -> bool:
    """Drop this process's use; True when no live process on the host uses it any more."""
    users = os.path.join(target, USERS)
    with contextlib.suppress(OSError):
        os.remove(os.path.join(users, str(os.getpid())))
    try:
        others = os.listdir(users)
    except OSError:
        return True
    return not any(name.isdigit() and psutil.pid_exists(int(name)) for name in others)


def _discard(target: str) -> None:
    """Delete an unpacked artifact: renamed away first, so no reader finds it half deleted."""
    doomed = f"{target}.{os.getpid()}.deleted"
    try:
        os.replace(target, doomed)
    except OSError:
        return
    shutil.rmtree(doomed, ignore_errors=True)


def chain_entry(vertex_id: str) -> str:
    """A vertex's pickled operator chain."""
    return f"chains/{vertex_id}.pkl"


def source_entry(vertex_id: str) -> str:
    """The source operator alone (for split enumeration in the JobMaster)."""
    return f"sources/{vertex_id}.pkl"


class ArtifactCache:
    """Artifacts unpacked under a local ``directory``, one subdirectory per content hash; safe
    to share between threads. Every method raises ``ArtifactError`` when the artifact cannot be
    fetched or lacks the entry asked for: the task (or split request) that needed it fails.

    Bounded (Flink's BlobCache cleanup): after each fetch, the artifacts least recently used are
    deleted until the unpacked ones take at most ``max_bytes`` (0: no bound), and ``clean_up``
    deletes those unused for ``ttl_s``; an artifact that ``in_use()`` names (the jobs with tasks
    here: their helper modules may still be imported from it) is never deleted."""

    def __init__(self, directory: str, max_bytes: int = 0, ttl_s: float = 0.0,
                 in_use: Callable[[], Collection[str]] = frozenset) -> None:
        self._dir = directory
        self._lock = threading.Lock()
        self._max_bytes = max_bytes
        self._ttl_s = ttl_s
        self._in_use = in_use
        #: sha256 -> (last use, monotonic s; unpacked bytes)
        self._entries: dict[str, tuple[float, int]] = {}
        os.makedirs(directory, exist_ok=True)

    @classmethod
    def bounded(cls, config: Configuration, work_dir: str, in_use: Callable[[], Collection[str]]) -> ArtifactCache:
        """A TaskExecutor's cache, bounded by ``blob.cache.max-size`` and
        ``blob.service.cleanup.interval``; ``in_use``: the artifacts of its running tasks. In
        ``blob.storage.directory``; by default, in a YARN container, under the application's
        local folder of the host (``$LOCAL_DIRS``: the TaskExecutors of the application on one
        host share it), else under ``work_dir``."""
        directory = config[Options.BLOB_STORAGE_DIR]
        if not directory and os.environ.get("LOCAL_DIRS") and os.environ.get("CONTAINER_ID"):
            directory = os.path.join(os.environ["LOCAL_DIRS"].split(",")[0], "yarnflow-artifacts")
        return cls(directory or os.path.join(work_dir, "artifacts"), config[Options.BLOB_CACHE_MAX_SIZE],
                   config[Options.BLOB_CLEANUP_INTERVAL] / 1000.0, in_use)

    @property
    def cached_bytes(self) -> int:
        with self._lock:
            return sum(size for _, size in self._entries.values())

    def cached(self) -> list[str]:
        """The content hashes of the artifacts unpacked here."""
        with self._lock:
            return sorted(self._entries)

    def clean_up(self) -> list[str]:
        """Delete the artifacts unused for ``ttl_s`` (and not in use); returns their hashes."""
        if not self._ttl_s:
            return []
        with self._lock:
            now = time.monotonic()
            return self._evict(lambda sha, used: now - used >= self._ttl_s)

    def _evict(self, should: Callable[[str, float], bool], keep: str = "") -> list[str]:
        """(Under the lock.) Delete, least recently used first, the artifacts not in use (nor
        ``keep``) for which ``should(sha, last_use)`` holds; stops at the first that does not."""
        pinned = {*self._in_use(), keep}
        gone = []
        for sha, (used, _) in sorted(self._entries.items(), key=lambda item: item[1][0]):
            if sha in pinned:
                continue
            if not should(sha, used):
                break
            target = os.path.join(self._dir, sha)
            del self._entries[sha]
            if _unmark_user(target):  # (else another process on the host still uses it: it stays)
                _discard(target)
                gone.append(sha)
        if gone:
            log.info("deleted %d cached job artifacts (%s)", len(gone), ", ".join(g[:12] for g in gone))
        return gone

    def _bound(self, keep: str) -> None:
        """(Under the lock.) Keep the cache within ``max_bytes`` (``keep``, just fetched, stays)."""
        if self._max_bytes:
            self._evict(lambda sha, used: sum(s for _, s in self._entries.values()) > self._max_bytes, keep)

    def fetch(self, uri: str, sha256: str, read: ArtifactReader | None = None) -> str:
        """The local directory the artifact is unpacked into. Fetched when not here, or when a
        file unpacked before no longer matches the manifest written with it (corrupt: logged,
        fetched again): through ``read(offset, length)`` (the AppMaster's blob service) or,
        without it, from ``uri``. The artifact's bytes are checked against ``sha256``."""
        target = os.path.join(self._dir, sha256)
        with self._lock, _host_lock(self._dir):
            if os.path.isdir(target):  # (unpacked before, maybe by another process on this host)
                problem = _damage(target)
                if problem is None:
                    known = self._entries.get(sha256)
                    self._entries[sha256] = (time.monotonic(), known[1] if known else _tree_bytes(target))
                    _mark_user(target)
                    return target
                log.warning("the cached job artifact %s is corrupt (%s): fetching it again", sha256[:12], problem)
                _discard(target)
            data = self._download(uri, sha256, read)
            tmp = f"{target}.{os.getpid()}-{threading.get_ident()}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                with zipfile.ZipFile(io.BytesIO(data)) as zf:
                    self._check_members(uri, zf)
                    zf.extractall(tmp)
                    manifest = {info.filename: [info.file_size, info.CRC] for info in zf.infolist()
                                if not info.is_dir()}
            except zipfile.BadZipFile as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                raise ArtifactError(f"job artifact {uri} is not a valid zip: {exc}") from exc
            with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as fh:
                json.dump(manifest, fh)
            os.replace(tmp, target)
            _mark_user(target)
            log.info("fetched job artifact %s (%d bytes%s)", uri, len(data), " from the AppMaster" if read else "")
            now = time.monotonic()
            self._entries[sha256] = (now, _tree_bytes(target))
            if self._ttl_s:  # the ones unused for the cleanup interval go first
                self._evict(lambda sha, used: now - used >= self._ttl_s, keep=sha256)
            self._bound(keep=sha256)
            return target

    def _download(self, uri: str, sha256: str, read: ArtifactReader | None) -> bytes:
        try:
            if read is None:
                with fsspec.open(uri, "rb") as fh:
                    data = fh.read()
            else:
                chunks = []
                offset = 0
                while True:
                    chunk = read(offset, READ_CHUNK)
                    chunks.append(chunk)
                    offset += len(chunk)
                    if len(chunk) < READ_CHUNK:
                        break
                data = b"".join(chunks)
        except (OSError, ValueError) as exc:
            raise ArtifactError(f"cannot fetch the job artifact {uri}: {exc}") from exc
        digest = hashlib.sha256(data).hexdigest()
        if sha256 and digest != sha256:
            raise ArtifactError(f"job artifact {uri} is corrupt: sha256 {digest} != {sha256}")
        return bytes(data)

    def release_unused(self) -> list[str]:
        """Drop this process's use of every artifact none of its tasks uses now; an artifact no
        live process on the host uses any more is deleted (a job that ended leaves nothing).
        Returns the hashes deleted."""
        gone = []
        with self._lock, _host_lock(self._dir):
            pinned = set(self._in_use())
            for sha in [s for s in self._entries if s not in pinned]:
                target = os.path.join(self._dir, sha)
                del self._entries[sha]
                if _unmark_user(target):
                    _discard(target)
                    gone.append(sha)
        if gone:
            log.info("deleted %d job artifacts no job on this host uses (%s)", len(gone),
                     ", ".join(g[:12] for g in gone))
        return gone

    def _check_members(self, uri: str, zf: zipfile.ZipFile) -> None:
        """Refuse an artifact with a path that leaves its folder (absolute, ``..``) or that
        unpacks to more than the whole cache may hold (``blob.cache.max-size``: a zip bomb)."""
        for name in zf.namelist():
            if leaves_folder(name):
                raise ArtifactError(f"job artifact {uri} holds a path outside its folder: {name!r}")
        unpacked = sum(info.file_size for info in zf.infolist())
        if self._max_bytes and unpacked > self._max_bytes:
            raise ArtifactError(f"job artifact {uri} unpacks to {unpacked} bytes, more than the TaskExecutor's "
                                f"artifact cache holds (blob.cache.max-size: {self._max_bytes} bytes)")

    def load_source(self, uri: str, sha256: str, vertex_id: str) -> Any:
        root = self.fetch(uri, sha256)
        try:
            with open(os.path.join(root, source_entry(vertex_id)), "rb") as fh, _LOAD_LOCK:
                return cloudpickle.load(fh)
        except FileNotFoundError:
            raise ArtifactError(f"job artifact {uri} has no source for vertex {vertex_id}") from None

    def chain_file(self, uri: str, sha256: str, vertex_id: str,
                   read: ArtifactReader | None = None) -> tuple[str, str]:
        """Where vertex ``vertex_id``'s operator chain is (fetched if needed, through ``read``
        when given), and the folder of the artifact's helper modules (a task's Python worker
        loads the chain from there)."""
        root = self.fetch(uri, sha256, read)
        return os.path.join(root, chain_entry(vertex_id)), os.path.join(root, "src")

    def load_chain(self, uri: str, sha256: str, vertex_id: str, read: ArtifactReader | None = None) -> list[Any]:
        path, src = self.chain_file(uri, sha256, vertex_id, read)
        if os.path.isdir(src) and src not in sys.path:
            sys.path.append(src)  # helper modules the user's job imports
        try:
            with open(path, "rb") as fh, _LOAD_LOCK:
                chain = cloudpickle.load(fh)
        except FileNotFoundError:
            raise ArtifactError(f"job artifact {uri} has no operator chain for vertex {vertex_id}") from None
        except Exception as exc:
            raise ArtifactError(f"cannot load the operators of vertex {vertex_id} from {uri}: "
                                f"{type(exc).__name__}: {exc}") from exc
        return list(chain)
