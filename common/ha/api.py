"""The high-availability services' contracts (Flink's HighAvailabilityServices), implemented by
``embedded.py`` (``high-availability.type: none``: one AppMaster, nothing survives it) and
``zookeeper/`` (``zookeeper``: leader election and pointers in ZooKeeper, bulky data in
``high-availability.storageDir``).

Leadership is per cluster: the AppMaster that wins the election leads the Dispatcher, the
ResourceManager and every JobMaster, under one leader session id (the fencing token every
follower checks). The stores hold what a new leader needs to go on with every job that has no
result yet: its JobGraph (with the job artifact's URI), the pointers to its retained completed
checkpoints and its checkpoint id counter. Every write to a store is fenced: it succeeds only
while the writer still holds the leadership it was granted (``NotLeaderError`` otherwise), so a
deposed AppMaster can change nothing.

Callbacks (``grant_leadership``, ``revoke_leadership``, a retrieval listener) run on a service
thread, one at a time and in order; they must not block for long.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from yarnflow.common.messages import JobGraph, JobResult

__all__ = [
    "CheckpointIDCounter",
    "CompletedCheckpointStore",
    "HighAvailabilityServices",
    "JobGraphStore",
    "JobResultEntry",
    "JobResultStore",
    "LeaderContender",
    "LeaderElection",
    "LeaderInformation",
    "LeaderRetrieval",
]


@dataclass(frozen=True)
class LeaderInformation:
    """Who leads: the RPC address (HOST:PORT) of the leading AppMaster and its leader session
    id (the fencing token)."""

    address: str
    session_id: str


class LeaderContender(Protocol):
    """The AppMaster, as a contender for the cluster's leadership."""

    def grant_leadership(self, session_id: str) -> None:
        """This contender now leads, under ``session_id`` (new for every grant). It starts its
        components with that token and then calls ``LeaderElection.confirm_leadership``."""

    def revoke_leadership(self) -> None:
        """This contender no longer leads (another won, the ZooKeeper session was lost or
        suspended): it stops acting as leader at once. A later grant may follow."""


class LeaderElection(Protocol):
    def start(self, contender: LeaderContender) -> None:
        """Join the election; ``contender`` is called back on grant and revoke."""

    def confirm_leadership(self, session_id: str, address: str) -> None:
        """Publish ``address`` and ``session_id`` as the leader's, if this contender still leads
        under ``session_id`` (nothing happens otherwise)."""

    def has_leadership(self, session_id: str) -> bool:
        """True while this contender leads under ``session_id``. With ZooKeeper this asks the
        server (one round trip), so a contender paused past its session timeout learns it lost."""

    def stop(self) -> None:
        """Leave the election (giving up leadership if held; no revoke callback follows)."""


class LeaderRetrieval(Protocol):
    def start(self, listener: Callable[[LeaderInformation | None], None]) -> None:
        """Call ``listener`` with the current leader (None: no leader known) now and on every
        change, until ``stop``."""

    def stop(self) -> None: ...


class JobGraphStore(Protocol):
    """JobGraphs of the jobs to recover (Flink's JobGraphStore): a job is added when it is
    submitted and removed once its result is in the JobResultStore."""

    def put(self, job_graph: JobGraph) -> None:
        """Store ``job_graph`` (replacing any with its id). Raises NotLeaderError."""

    def get(self, job_id: str) -> JobGraph:
        """Raises NotFoundError for an unknown job, and HighAvailabilityError when the stored
        JobGraph cannot be read."""

    def job_ids(self) -> list[str]: ...

    def remove(self, job_id: str) -> None:
        """Forget the job (nothing happens for an unknown one). Raises NotLeaderError."""


class CompletedCheckpointStore(Protocol):
    """Pointers to one job's retained completed checkpoints (Flink's CompletedCheckpointStore):
    checkpoint id -> the URL of its ``_metadata``."""

    def add(self, checkpoint_id: int, metadata_url: str) -> None:
        """Raises NotLeaderError."""

    def remove(self, checkpoint_id: int) -> None:
        """Raises NotLeaderError; nothing happens for an unknown id."""

    def checkpoints(self) -> list[tuple[int, str]]:
        """(checkpoint id, metadata URL), oldest first."""

    def clear(self) -> None:
        """Forget every pointer (the job ended). Raises NotLeaderError."""


class CheckpointIDCounter(Protocol):
    """One job's checkpoint ids: never repeated, also across leaders."""

    def get_and_increment(self) -> int:
        """The next id (the first is 1). Raises NotLeaderError."""

    def current(self) -> int:
        """The id the next ``get_and_increment`` returns."""

    def remove(self) -> None:
        """The job ended. Raises NotLeaderError."""


@dataclass(frozen=True)
class JobResultEntry:
    """A job that reached a globally terminal state. ``result`` is what clients fetch."""

    result: JobResult
    created_ms: int
    fetched: bool = False
    extra: dict[str, str] = field(default_factory=dict)


class JobResultStore(Protocol):
    """Results of ended jobs (Flink's JobResultStore): a new leader never runs a job that has
    one again. An entry is removed once a client fetched it, or after the retention time."""

    def put(self, entry: JobResultEntry) -> None:
        """Raises NotLeaderError."""

    def get(self, job_id: str) -> JobResultEntry | None: ...

    def job_ids(self) -> list[str]: ...

    def mark_fetched(self, job_id: str) -> None:
        """A client has the result. Raises NotLeaderError."""

    def remove(self, job_id: str) -> None:
        """Raises NotLeaderError; nothing happens for an unknown job."""


class HighAvailabilityServices(Protocol):
    """One per process. The election is for AppMasters; retrieval is for everyone that follows
    the leader (TaskExecutors, clients, standby AppMasters)."""

    kind: str  # "none" | "zookeeper"

    def leader_election(self) -> LeaderElection: ...

    def leader_retrieval(self) -> LeaderRetrieval: ...

    def job_graph_store(self) -> JobGraphStore: ...

    def job_result_store(self) -> JobResultStore: ...

    def checkpoint_store(self, job_id: str) -> CompletedCheckpointStore: ...

    def checkpoint_id_counter(self, job_id: str) -> CheckpointIDCounter: ...

    def request_cluster_shutdown(self) -> None:
        """Mark the cluster as shut down, so standbys exit instead of taking over. Raises
        NotLeaderError."""

    def cluster_shut_down(self) -> bool:
        """True once ``request_cluster_shutdown`` was called (by any leader)."""

    def start_anew(self) -> bool:
        """Forget that an earlier cluster of this id was shut down, when none of its AppMasters
        leads (a new session starting under the id of one that was stopped); True when there
        was such a mark. Raises HighAvailabilityError when an AppMaster leads now."""

    def on_cluster_shutdown(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (once) when the cluster is marked shut down."""

    def close(self) -> None:
        """Release connections and threads (an AppMaster's leadership ends with it)."""
