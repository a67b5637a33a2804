"""The stores in ZooKeeper (Flink's ZooKeeperStateHandleStore and friends). ZooKeeper holds
small values and pointers; a JobGraph, the one bulky value, is a file under
``<storageDir>/jobgraphs/`` with a new name for every write (written to a temporary name, then
renamed), so a deposed leader can never overwrite what the pointer of the current one names.

Every write goes through ``Fence.fenced_commit`` (one transaction with the check of the
leader's latch node): a process that does not lead gets NotLeaderError and changes nothing,
also for a write that would change nothing (removing an unknown job). Reads are not fenced.
A write that races another write of the same node (a version or existence conflict) is
tried again on the values read anew."""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any, Protocol, cast

import fsspec
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError

from yarnflow.common.errors import HighAvailabilityError, NotFoundError
from yarnflow.common.ha.api import JobResultEntry
from yarnflow.common.ha.zookeeper.client import Stat, Transaction, ZooKeeperClient, ZooKeeperPaths
from yarnflow.common.messages import JobGraph, JobResult
from yarnflow.common.rpc.serialization import message_from_bytes, message_to_bytes

__all__ = [
    "Fence",
    "ZooKeeperCheckpointIDCounter",
    "ZooKeeperCompletedCheckpointStore",
    "ZooKeeperJobGraphStore",
    "ZooKeeperJobResultStore",
    "write_cluster_shutdown",
]

log = logging.getLogger(__name__)

_CONFLICTS = (NodeExistsError, NoNodeError, BadVersionError, NotEmptyError)
_ATTEMPTS = 50


class Fence(Protocol):
    def require_leadership(self, what: str) -> None: ...

    def fenced_commit(self, what: str, build: Callable[[Transaction], None]) -> list[object]: ...


class _Store:
    def __init__(self, zk: ZooKeeperClient, paths: ZooKeeperPaths, fence: Fence) -> None:
        self._zk = zk
        self._paths = paths
        self._fence = fence

    def _write(self, what: str, plan: Callable[[], Callable[[Transaction], None]]) -> list[object]:
        """``plan()`` reads what it needs and returns the operations; they are committed fenced,
        and planned again after a conflict. Returns the results of the operations."""
        self._fence.require_leadership(what)
        for _ in range(_ATTEMPTS):
            results = self._fence.fenced_commit(what, plan())
            failed = [r for r in results if isinstance(r, Exception)]
            if not failed:
                return results
            if not any(isinstance(r, _CONFLICTS) for r in failed):
                raise HighAvailabilityError(f"{what} failed in ZooKeeper: {failed}")
        raise HighAvailabilityError(f"{what}: gave up after {_ATTEMPTS} conflicting concurrent writes")

    def _put_ops(self, path: str, data: bytes) -> Callable[[Transaction], None]:
        """Create ``path`` (and its missing ancestors) holding ``data``, or overwrite it."""
        stat = self._zk.exists(path)
        missing = self._zk.missing_ancestors(path) if stat is None else []

        def build(tx: Transaction) -> None:
            if stat is not None:
                tx.set_data(path, data, version=stat.version)
                return
            for ancestor in missing:
                tx.create(ancestor, b"")
            tx.create(path, data)
        return build

    def _delete_ops(self, path: str, *, with_children: bool = False) -> Callable[[Transaction], None]:
        """Delete ``path`` (and its children) if it is there; nothing but the check otherwise."""
        stat = self._zk.exists(path)
        children = self._zk.children(path) if stat is not None and with_children else []

        def build(tx: Transaction) -> None:
            for child in children:
                tx.delete(f"{path}/{child}")
            if stat is not None:
                tx.delete(path, version=stat.version)
        return build

    def _read_json(self, path: str) -> tuple[dict[str, Any], Stat] | None:
        found = self._zk.get(path)
        if found is None:
            return None
        try:
            value = json.loads(found[0].decode())
            if not isinstance(value, dict):
                raise ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError) as exc:
            raise HighAvailabilityError(f"the ZooKeeper node {path} holds no valid entry: {exc}") from None
        return value, found[1]


# -- JobGraphs ---------------------------------------------------------------------------------

class ZooKeeperJobGraphStore(_Store):
    def __init__(self, zk: ZooKeeperClient, paths: ZooKeeperPaths, fence: Fence, storage_dir: str) -> None:
        super().__init__(zk, paths, fence)
        self._blob_dir = f"{storage_dir.rstrip('/')}/jobgraphs"

    def put(self, job_graph: JobGraph) -> None:
        """The JobGraph goes to a new file, then the pointer to it (fenced); the file it replaces
        is deleted. Raises NotLeaderError (and leaves no new file) when this process does not lead."""
        job_id = str(job_graph.job_id)
        path = self._paths.job_graph(job_id)
        self._fence.require_leadership(f"storing the JobGraph of job {job_id}")
        old = self._pointer(job_id, path)
        url = f"{self._blob_dir}/{job_id}-{uuid.uuid4().hex}.jobgraph"
        _write_blob(url, message_to_bytes(job_graph))
        pointer = json.dumps({"path": url}).encode()
        try:
            self._write(f"storing the JobGraph of job {job_id}", lambda: self._put_ops(path, pointer))
        except BaseException:
            _delete_blob(url)
            raise
        if old is not None and old != url:
            _delete_blob(old)

    def get(self, job_id: str) -> JobGraph:
        path = self._paths.job_graph(job_id)
        url = self._pointer(job_id, path)
        if url is None:
            raise NotFoundError(f"no JobGraph of job {job_id} is stored")
        try:
            data = _read_blob(url)
        except FileNotFoundError:
            raise HighAvailabilityError(
                f"the JobGraph of job {job_id} cannot be read: {url} (named by {path}) is missing") from None
        except OSError as exc:
            raise HighAvailabilityError(f"the JobGraph of job {job_id} cannot be read from {url}: {exc}") from None
        try:
            return message_from_bytes(JobGraph, data)
        except ValueError as exc:
            raise HighAvailabilityError(f"the JobGraph of job {job_id} in {url} is corrupt: {exc}") from None

    def job_ids(self) -> list[str]:
        return self._zk.children(self._paths.job_graphs)

    def remove(self, job_id: str) -> None:
        path = self._paths.job_graph(job_id)
        try:
            url = self._pointer(job_id, path)
        except HighAvailabilityError:
            url = None  # a bad pointer goes all the same
        self._write(f"removing the JobGraph of job {job_id}", lambda: self._delete_ops(path))
        if url is not None:
            _delete_blob(url)

    def _pointer(self, job_id: str, path: str) -> str | None:
        found = self._read_json(path)
        if found is None:
            return None
        url = found[0].get("path")
        if not isinstance(url, str) or not url:
            raise HighAvailabilityError(f"the JobGraph pointer of job {job_id} ({path}) names no file")
        return url


def _write_blob(url: str, data: bytes) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    directory, name = path.rsplit("/", 1)
    tmp = f"{directory}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        fs.makedirs(directory, exist_ok=True)
        with fs.open(tmp, "wb") as fh:
            fh.write(data)
        fs.mv(tmp, path)
    except OSError as exc:
        _delete_blob(tmp, fs)
        raise HighAvailabilityError(f"cannot write {url}: {exc}") from None


def _read_blob(url: str) -> bytes:
    fs, path = fsspec.core.url_to_fs(url)
    with fs.open(path, "rb") as fh:
        return cast(bytes, fh.read())


def _delete_blob(url: str, fs: Any = None) -> None:
    try:
        if fs is None:
            fs, url = fsspec.core.url_to_fs(url)
        fs.rm(url)
    except (OSError, ValueError) as exc:
        log.debug("could not delete %s: %s", url, exc)


# -- checkpoints -------------------------------------------------------------------------------

class ZooKeeperCompletedCheckpointStore(_Store):
    def __init__(self, zk: ZooKeeperClient, paths: ZooKeeperPaths, fence: Fence, job_id: str) -> None:
        super().__init__(zk, paths, fence)
        self._job_id = str(job_id)
        self._dir = paths.checkpoints(self._job_id)

    def add(self, checkpoint_id: int, metadata_url: str) -> None:
        path = self._paths.checkpoint(self._job_id, checkpoint_id)
        self._write(f"adding checkpoint {checkpoint_id} of job {self._job_id}",
                    lambda: self._put_ops(path, metadata_url.encode()))

    def remove(self, checkpoint_id: int) -> None:
        path = self._paths.checkpoint(self._job_id, checkpoint_id)
        self._write(f"removing checkpoint {checkpoint_id} of job {self._job_id}", lambda: self._delete_ops(path))

    def checkpoints(self) -> list[tuple[int, str]]:
        found: list[tuple[int, str]] = []
        for name in self._zk.children(self._dir):
            if not name.isdigit():
                continue
            entry = self._zk.get(f"{self._dir}/{name}")
            if entry is not None:  # else removed since the listing
                found.append((int(name), entry[0].decode()))
        return sorted(found)

    def clear(self) -> None:
        self._write(f"removing the checkpoints of job {self._job_id}",
                    lambda: self._delete_ops(self._dir, with_children=True))


class ZooKeeperCheckpointIDCounter(_Store):
    """The next id, as text, in ``checkpoint-counter/<job>``: a new leader goes on from it."""

    def __init__(self, zk: ZooKeeperClient, paths: ZooKeeperPaths, fence: Fence, job_id: str) -> None:
        super().__init__(zk, paths, fence)
        self._job_id = str(job_id)
        self._path = paths.counter(self._job_id)

    def get_and_increment(self) -> int:
        taken: list[int] = []

        def plan() -> Callable[[Transaction], None]:
            current, stat = self._read()
            taken[:] = [current]
            value = str(current + 1).encode()
            missing = self._zk.missing_ancestors(self._path) if stat is None else []

            def build(tx: Transaction) -> None:
                if stat is not None:
                    tx.set_data(self._path, value, version=stat.version)
                    return
                for ancestor in missing:
                    tx.create(ancestor, b"")
                tx.create(self._path, value)
            return build

        self._write(f"taking a checkpoint id of job {self._job_id}", plan)
        return taken[0]

    def current(self) -> int:
        return self._read()[0]

    def remove(self) -> None:
        self._write(f"removing the checkpoint id counter of job {self._job_id}", lambda: self._delete_ops(self._path))

    def _read(self) -> tuple[int, Stat | None]:
        found = self._zk.get(self._path)
        if found is None:
            return 1, None
        try:
            value = int(found[0].decode())
        except (ValueError, UnicodeDecodeError):
            raise HighAvailabilityError(f"the checkpoint id counter {self._path} holds no number: "
                                        f"{found[0][:50]!r}") from None
        return value, found[1]


# -- job results -------------------------------------------------------------------------------

class ZooKeeperJobResultStore(_Store):
    """``job-results/<job>``: JSON with the JobResult (base64 of its Thrift bytes),
    created_ms, fetched and extra."""

    def put(self, entry: JobResultEntry) -> None:
        job_id = str(entry.result.job_id)
        data = _entry_bytes(entry)
        path = self._paths.job_result(job_id)
        self._write(f"storing the result of job {job_id}", lambda: self._put_ops(path, data))

    def get(self, job_id: str) -> JobResultEntry | None:
        path = self._paths.job_result(job_id)
        found = self._read_json(path)
        return None if found is None else _entry(path, found[0])

    def job_ids(self) -> list[str]:
        return self._zk.children(self._paths.job_results)

    def mark_fetched(self, job_id: str) -> None:
        """Nothing happens for an unknown job (besides the check that this process leads)."""
        path = self._paths.job_result(job_id)

        def plan() -> Callable[[Transaction], None]:
            found = self._read_json(path)
            if found is None:
                return lambda tx: None
            entry = _entry(path, found[0])
            data = _entry_bytes(JobResultEntry(entry.result, entry.created_ms, True, dict(entry.extra)))
            version = found[1].version
            return lambda tx: tx.set_data(path, data, version=version)

        self._write(f"marking the result of job {job_id} fetched", plan)

    def remove(self, job_id: str) -> None:
        path = self._paths.job_result(job_id)
        self._write(f"removing the result of job {job_id}", lambda: self._delete_ops(path))


def _entry_bytes(entry: JobResultEntry) -> bytes:
    return json.dumps({
        "result": base64.b64encode(message_to_bytes(entry.result)).decode("ascii"),
        "created_ms": int(entry.created_ms),
        "fetched": bool(entry.fetched),
        "extra": {str(k): str(v) for k, v in entry.extra.items()},
    }).encode()


def _entry(path: str, value: dict[str, Any]) -> JobResultEntry:
    try:
        result = message_from_bytes(JobResult, base64.b64decode(value["result"], validate=True))
        extra = value.get("extra") or {}
        if not isinstance(extra, dict):
            raise ValueError("extra is not an object")
        return JobResultEntry(result, int(value["created_ms"]), bool(value.get("fetched", False)),
                              {str(k): str(v) for k, v in extra.items()})
    except (KeyError, TypeError, ValueError) as exc:
        raise HighAvailabilityError(f"the job result in {path} cannot be read: {exc}") from None


# -- cluster shutdown --------------------------------------------------------------------------

def write_cluster_shutdown(zk: ZooKeeperClient, paths: ZooKeeperPaths, fence: Fence) -> None:
    """Create the shutdown marker (fenced; nothing more happens when it is there)."""
    store = _Store(zk, paths, fence)

    def plan() -> Callable[[Transaction], None]:
        if zk.exists(paths.shutdown) is not None:
            return lambda tx: None
        missing = zk.missing_ancestors(paths.shutdown)

        def build(tx: Transaction) -> None:
            for ancestor in missing:
                tx.create(ancestor, b"")
            tx.create(paths.shutdown, b"")
        return build

    store._write("marking the cluster shut down", plan)
