"""High availability off (``high-availability.type: none``): Flink's embedded/standalone services.

There is one AppMaster: its election grants leadership at once, under a new session id, and
never revokes it. The stores keep their data in memory, so the code that uses them runs the same
way as with ZooKeeper, but nothing survives the process. Retrieval knows only the address it is
given (the CLI's ``--address``, a TaskExecutor's ``--rm-address``) or what the in-process
election published.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

from yarnflow.common.errors import NotFoundError, NotLeaderError
from yarnflow.common.ha.api import JobResultEntry, LeaderContender, LeaderInformation
from yarnflow.common.messages import JobGraph

__all__ = ["EmbeddedHaServices"]


class _Election:
    def __init__(self, services: EmbeddedHaServices) -> None:
        self._services = services
        self._session_id = ""

    def start(self, contender: LeaderContender) -> None:
        """Grants leadership at once, on the calling thread."""
        self._session_id = uuid.uuid4().hex
        contender.grant_leadership(self._session_id)

    def confirm_leadership(self, session_id: str, address: str) -> None:
        if session_id and session_id == self._session_id:
            self._services._publish(LeaderInformation(address, session_id))

    def has_leadership(self, session_id: str) -> bool:
        return bool(session_id) and session_id == self._session_id

    def stop(self) -> None:
        self._session_id = ""
        self._services._publish(None)


class _Retrieval:
    def __init__(self, services: EmbeddedHaServices) -> None:
        self._services = services
        self._listener: Callable[[LeaderInformation | None], None] | None = None

    def start(self, listener: Callable[[LeaderInformation | None], None]) -> None:
        self._listener = listener
        self._services._listeners.append(listener)
        listener(self._services._leader)

    def stop(self) -> None:
        if self._listener in self._services._listeners:
            self._services._listeners.remove(self._listener)


class _Fenced:
    """A store of an EmbeddedHaServices: writes need a granted leadership."""

    def __init__(self, services: EmbeddedHaServices) -> None:
        self._services = services

    def _check(self) -> None:
        if self._services._closed:
            raise NotLeaderError("the high-availability services are closed")


class _JobGraphStore(_Fenced):
    def __init__(self, services: EmbeddedHaServices) -> None:
        super().__init__(services)
        self._graphs: dict[str, JobGraph] = {}

    def put(self, job_graph: JobGraph) -> None:
        self._check()
        self._graphs[str(job_graph.job_id)] = job_graph

    def get(self, job_id: str) -> JobGraph:
        graph = self._graphs.get(str(job_id))
        if graph is None:
            raise NotFoundError(f"no JobGraph of job {job_id} is stored")
        return graph

    def job_ids(self) -> list[str]:
        return sorted(self._graphs)

    def remove(self, job_id: str) -> None:
        self._check()
        self._graphs.pop(str(job_id), None)


class _CheckpointStore(_Fenced):
    def __init__(self, services: EmbeddedHaServices) -> None:
        super().__init__(services)
        self._pointers: dict[int, str] = {}

    def add(self, checkpoint_id: int, metadata_url: str) -> None:
        self._check()
        self._pointers[checkpoint_id] = metadata_url

    def remove(self, checkpoint_id: int) -> None:
        self._check()
        self._pointers.pop(checkpoint_id, None)

    def checkpoints(self) -> list[tuple[int, str]]:
        return sorted(self._pointers.items())

    def clear(self) -> None:
        self._check()
        self._pointers.clear()


class _Counter(_Fenced):
    def __init__(self, services: EmbeddedHaServices) -> None:
        super().__init__(services)
        self._next = 1

    def get_and_increment(self) -> int:
        self._check()
        value, self._next = self._next, self._next + 1
        return value

    def current(self) -> int:
        return self._next

    def remove(self) -> None:
        self._check()


class _JobResultStore(_Fenced):
    def __init__(self, services: EmbeddedHaServices) -> None:
        super().__init__(services)
        self._entries: dict[str, JobResultEntry] = {}

    def put(self, entry: JobResultEntry) -> None:
        self._check()
        self._entries[str(entry.result.job_id)] = entry

    def get(self, job_id: str) -> JobResultEntry | None:
        return self._entries.get(str(job_id))

    def job_ids(self) -> list[str]:
        return sorted(self._entries)

    def mark_fetched(self, job_id: str) -> None:
        self._check()
        entry = self._entries.get(str(job_id))
        if entry is not None:
            self._entries[str(job_id)] = JobResultEntry(entry.result, entry.created_ms, True, entry.extra)

    def remove(self, job_id: str) -> None:
        self._check()
        self._entries.pop(str(job_id), None)


class EmbeddedHaServices:
    """``leader_address``: the leader to report to retrieval listeners until (and unless) an
    in-process election publishes one (a TaskExecutor's ResourceManager address, the CLI's
    ``--address``)."""

    kind = "none"

    def __init__(self, leader_address: str = "") -> None:
        self._lock = threading.Lock()
        self._leader: LeaderInformation | None = LeaderInformation(leader_address, "") if leader_address else None
        self._listeners: list[Callable[[LeaderInformation | None], None]] = []
        self._job_graphs = _JobGraphStore(self)
        self._results = _JobResultStore(self)
        self._checkpoints: dict[str, _CheckpointStore] = {}
        self._counters: dict[str, _Counter] = {}
        self._shutdown = False
        self._shutdown_callbacks: list[Callable[[], None]] = []
        self._closed = False

    def _publish(self, leader: LeaderInformation | None) -> None:
        self._leader = leader
        for listener in list(self._listeners):
            listener(leader)

    def leader_election(self) -> _Election:
        return _Election(self)

    def leader_retrieval(self) -> _Retrieval:
        return _Retrieval(self)

    def job_graph_store(self) -> _JobGraphStore:
        return self._job_graphs

    def job_result_store(self) -> _JobResultStore:
        return self._results

    def checkpoint_store(self, job_id: str) -> _CheckpointStore:
        with self._lock:
            return self._checkpoints.setdefault(str(job_id), _CheckpointStore(self))

    def checkpoint_id_counter(self, job_id: str) -> _Counter:
        with self._lock:
            return self._counters.setdefault(str(job_id), _Counter(self))

    def request_cluster_shutdown(self) -> None:
        self._shutdown = True
        for callback in self._shutdown_callbacks:
            callback()
        self._shutdown_callbacks.clear()

    def cluster_shut_down(self) -> bool:
        return self._shutdown

    def start_anew(self) -> bool:
        was, self._shutdown = self._shutdown, False
        return was

    def on_cluster_shutdown(self, callback: Callable[[], None]) -> None:
        if self._shutdown:
            callback()
        else:
            self._shutdown_callbacks.append(callback)

    def close(self) -> None:
        self._closed = True
        self._listeners.clear()
