"""The TaskExecutor's view of the JobMasters it serves: a pure core (no I/O, no threads).

Flink's JobTable and JobLeaderService in one small table. Per job it keeps:

* the **JobMaster connection** (address, fencing token, last contact), made by ``requestSlot``
  and closed when the job has nothing left here, or when its JobMaster is gone (it answered
  NOT_FOUND or FENCING to a heartbeat, or was silent for ``heartbeat.timeout``);
* the **fencing token** the job's JobMaster was last known by, kept after the connection is
  closed, so a call from a deposed JobMaster is refused even when its slot or task is gone;
* whether the connection is **orphaned**: the AppMaster leader changed and the job's tasks run
  on (``high-availability.keep-running-tasks``) until the new leader's JobMaster reconnects
  (``reconnect``), for at most the orphan timeout (then the job is given up here);
* the **final updates not yet acknowledged**: a task's FINISHED / CANCELED / FAILED update is
  kept until a direct ``updateTaskExecutionState`` or a heartbeat carrying it succeeds, so an
  update lost in transit reaches the JobMaster with the next heartbeat.

The table also remembers which job recently ended tasks and freed allocations belonged to
(bounded), to fence ``cancelTask`` / ``freeSlot`` calls that name only an attempt or an
allocation.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from yarnflow.common.clock import Clock
from yarnflow.common.ids import AllocationID, ExecutionAttemptID, JobID
from yarnflow.common.messages import TaskExecutionStateUpdate

log = logging.getLogger(__name__)

_RETIRED_CAPACITY = 8192


@dataclass
class JobMasterConnection:
    job_id: JobID
    address: str
    token: str
    last_contact_ms: int
    unacknowledged: dict[ExecutionAttemptID, TaskExecutionStateUpdate] = field(default_factory=dict)
    #: the leader changed then (monotonic ms): waiting for the job's new JobMaster; None: connected
    orphaned_since_ms: int | None = None


class JobTable:
    def __init__(self, clock: Clock, heartbeat_timeout_ms: int, orphan_timeout_ms: int = 0) -> None:
        self._clock = clock
        self._timeout_ms = heartbeat_timeout_ms
        self._orphan_timeout_ms = orphan_timeout_ms
        self._connections: dict[JobID, JobMasterConnection] = {}
        self._tokens: dict[JobID, str] = {}
        self._retired: collections.OrderedDict[str, JobID] = collections.OrderedDict()

    # -- connections ----------------------------------------------------------------------------
    def connect(self, job_id: JobID, address: str, token: str) -> JobMasterConnection:
        """The JobMaster named by a slot request. A new token or address replaces the old
        connection (a new JobMaster leader for the job); its unacknowledged updates go with
        it, as they were meant for the old JobMaster."""
        conn = self._connections.get(job_id)
        if conn is None or conn.token != token or conn.address != address:
            if conn is not None:
                log.info("job %s: JobMaster %s (token %s) replaces %s (token %s)", job_id, address, token,
                         conn.address, conn.token)
            conn = self._connections[job_id] = JobMasterConnection(job_id, address, token, self._clock.monotonic_ms())
        self._tokens[job_id] = token
        return conn

    def orphan_all(self) -> list[JobID]:
        """The AppMaster leader changed: every job's connection waits for its new JobMaster
        (the orphan timeout counts from now)."""
        for job_id in self._connections:
            self.orphan(job_id)
        return sorted(self._connections)

    def orphan(self, job_id: JobID) -> None:
        conn = self._connections.get(job_id)
        if conn is not None:
            conn.orphaned_since_ms = self._clock.monotonic_ms()

    def reconnect(self, job_id: JobID, address: str, token: str) -> JobMasterConnection:
        """The job's new JobMaster took over the connection: calls about the job must carry its
        token from now on; the final updates not yet acknowledged are for it now."""
        conn = self._connections.get(job_id)
        if conn is None:
            conn = self._connections[job_id] = JobMasterConnection(job_id, address, token, self._clock.monotonic_ms())
        elif conn.token != token or conn.address != address:
            log.info("job %s: JobMaster %s (token %s) takes over from %s (token %s)", job_id, address, token,
                     conn.address, conn.token)
        conn.address, conn.token = address, token
        conn.orphaned_since_ms = None
        conn.last_contact_ms = self._clock.monotonic_ms()
        self._tokens[job_id] = token
        return conn

    def connection(self, job_id: JobID) -> JobMasterConnection | None:
        return self._connections.get(job_id)

    def connections(self) -> list[JobMasterConnection]:
        return list(self._connections.values())

    def disconnect(self, job_id: JobID) -> JobMasterConnection | None:
        """Close the job's connection, dropping its unacknowledged updates (nobody will take
        them). The job's token is kept for fencing."""
        return self._connections.pop(job_id, None)

    def heard_from(self, job_id: JobID, token: str) -> bool:
        """A call to the job's JobMaster (with ``token``) was answered; False when that is no
        longer the job's connection."""
        conn = self._connections.get(job_id)
        if conn is None or conn.token != token:
            return False
        conn.last_contact_ms = self._clock.monotonic_ms()
        return True

    def silent_ms(self, conn: JobMasterConnection) -> int:
        return self._clock.monotonic_ms() - conn.last_contact_ms

    def timed_out(self) -> list[JobMasterConnection]:
        """The connections whose JobMaster answered nothing for longer than heartbeat.timeout,
        and the orphaned ones no new JobMaster took over within the orphan timeout."""
        now = self._clock.monotonic_ms()
        return [c for c in self._connections.values()
                if (now - c.orphaned_since_ms > self._orphan_timeout_ms if c.orphaned_since_ms is not None
                    else now - c.last_contact_ms > self._timeout_ms)]

    # -- fencing -------------------------------------------------------------------------------
    def token_of(self, job_id: JobID) -> str | None:
        return self._tokens.get(job_id)

    def expected_token(self, job_id: JobID | None, holder_token: str | None = None) -> str | frozenset[str] | None:
        """The JobMaster token a call about ``job_id`` must carry (for the TaskExecutor's fenced
        RPCs, ``RpcEndpoint``): the token of the job's JobMaster. With no job (the call named an
        attempt or allocation this table does not know), the current token of any job.
        ``holder_token``: the token the slot or task the call names was given; it must be that
        one too (None: the call can carry no valid token)."""
        current = self._tokens.get(job_id) if job_id is not None else None
        if current is None:
            known = frozenset(self._tokens.values())
            return known if holder_token is None else known & {holder_token}
        if holder_token is not None and holder_token != current:
            return None
        return current

    def retire(self, key: AllocationID | ExecutionAttemptID, job_id: JobID) -> None:
        """Remember the job of an ended task or freed slot, for fencing later calls naming it."""
        self._retired[key] = job_id
        self._retired.move_to_end(key)
        while len(self._retired) > _RETIRED_CAPACITY:
            self._retired.popitem(last=False)

    def job_of(self, key: AllocationID | ExecutionAttemptID) -> JobID | None:
        return self._retired.get(key)

    # -- final task updates ---------------------------------------------------------------------
    def task_ended(self, update: TaskExecutionStateUpdate) -> None:
        """Keep ``update`` (terminal) until the JobMaster acknowledges it."""
        conn = self._connections.get(update.job_id)
        if conn is None:
            log.debug("final update of %s for job %s without a JobMaster connection", update.execution_attempt_id,
                      update.job_id)
            return
        conn.unacknowledged[update.execution_attempt_id] = update
        self.retire(update.execution_attempt_id, update.job_id)

    def acknowledged(self, job_id: JobID, attempt_ids: Iterable[ExecutionAttemptID]) -> None:
        conn = self._connections.get(job_id)
        if conn is not None:
            for a in attempt_ids:
                conn.unacknowledged.pop(a, None)

    def unacknowledged(self, job_id: JobID) -> list[TaskExecutionStateUpdate]:
        conn = self._connections.get(job_id)
        return list(conn.unacknowledged.values()) if conn is not None else []


def slots_to_free(offered_active: Iterable[AllocationID], listed: Iterable[AllocationID]) -> set[AllocationID]:
    """Flink's allocated-slot report: of the job's slots that were ACTIVE when the heartbeat
    was sent, those the JobMaster no longer lists. (A slot whose offer was still in flight is
    not judged: the JobMaster may not have seen it yet.)"""
    return set(offered_active) - set(listed)
