"""How a TaskExecutor's tasks reach their job's JobMaster, and how a new leader's JobMaster
takes them over (``high-availability.keep-running-tasks``).

A task's calls to its JobMaster (state updates, split requests, checkpoint answers) do not
carry a fixed address: each looks up the job's current connection in the JobTable when it is
made. While the connection is orphaned (the AppMaster leader changed and the job's new
JobMaster has not taken over yet):

- a state update is not sent: a final one stays among the unacknowledged updates, which the
  takeover report carries; the others are replaced by the task's state in that report;
- a split request waits for the takeover (the source reads nothing meanwhile);
- a checkpoint acknowledgement or decline is dropped: the checkpoint was the old leader's, and
  the new one never completes it.

``reconnectJob`` is the takeover: called by the new leader's JobMaster, fenced by the new
leader's ResourceManager token (only the leader a TaskExecutor registered with may take its
tasks over), it rebinds the job's slots and tasks to the caller's token and answers with what
the TaskExecutor holds of the job: slots, tasks (attempt, state, the last checkpoint each
acknowledged, the splits each source took) and the final updates not yet acknowledged. From
then on calls of the old leader carry a token nobody accepts.

A mixin of ``TaskExecutor``; the attributes it uses are declared below.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from yarnflow.common.artifacts import ArtifactError, ArtifactReader
from yarnflow.common.errors import (FencingTokenError, NotFoundError, RpcConnectionError, RpcError,
                                    RpcTimeoutError, UnavailableError)
from yarnflow.common.ids import ExecutionAttemptID, JobID
from yarnflow.common.messages import (
    JobReconnectReport,
    ReconciledTask,
    SlotOffer,
    SplitResponse,
    TakenSplit,
    TaskDeploymentDescriptor,
    TaskExecutionStateUpdate,
    TaskStateSnapshot,
)
from yarnflow.common.rpc.endpoint import MainThreadExecutor, fenced
from yarnflow.common.rpc.gateways import RemoteJobMasterGateway
from yarnflow.common.states import ExecutionState
from yarnflow.worker.taskexecutor.core import TaskExecutorCore

log = logging.getLogger(__name__)

__all__ = ["JobMasterLinks", "JobMasterResponder"]

#: how often a call waiting for a job's new JobMaster looks again
_POLL_S = 0.1


class JobMasterLinks:
    # -- what the TaskExecutor provides
    core: TaskExecutorCore
    tasks: dict[ExecutionAttemptID, Any]
    resource_id: Any
    _main: MainThreadExecutor
    _updates: ThreadPoolExecutor
    _stopped: threading.Event
    _jm: Callable[[str, JobID], RemoteJobMasterGateway]
    _task_done: Callable[[TaskExecutionStateUpdate], None]
    #: tasks that ended, as a takeover report names them, until their final update is acknowledged
    _ended: dict[ExecutionAttemptID, ReconciledTask]

    def _link(self, job_id: JobID) -> tuple[str, str] | None:
        """(address, token) of the job's JobMaster now; None while orphaned or once gone."""
        conn = self.core.jobs.connection(job_id)
        if conn is None or conn.orphaned_since_ms is not None:
            return None
        return conn.address, conn.token

    def _gone(self, job_id: JobID) -> bool:
        return self.core.jobs.connection(job_id) is None

    def _wait_for_link(self, job_id: JobID, cancelled: Callable[[], bool] = lambda: False) -> tuple[str, str]:
        """The job's JobMaster, waiting while the connection is orphaned (a leader change);
        raises UnavailableError once the job is gone here, the TaskExecutor stops or ``cancelled()``."""
        logged = False
        while not self._stopped.is_set() and not cancelled():
            link, gone = self._main.call(lambda: (self._link(job_id), self._gone(job_id)))
            if link is not None:
                return link
            if gone:
                break
            if not logged:
                log.info("job %s: waiting for the new leader's JobMaster to take over its tasks", job_id)
                logged = True
            time.sleep(_POLL_S)
        raise UnavailableError(f"job {job_id} has no JobMaster here any more")

    # -- task state updates (the updates thread, in order) ----------------------------------------
    def _send_update(self, update: TaskExecutionStateUpdate) -> None:
        """Report a state change. A final update is kept until acknowledged: when every try
        here fails, the next heartbeat (or the takeover report) carries it."""
        if update.state.is_terminal:
            self._main.execute(self._task_done, update)
        job_id = update.job_id
        for attempt in range(3):
            if self._stopped.is_set():
                return
            link = self._main.call(self._link, job_id)
            if link is None:  # orphaned (the takeover report has it) or gone
                log.debug("%s of %s not sent: job %s has no JobMaster connected", update.state.name,
                          update.execution_attempt_id, job_id)
                return
            address, token = link
            try:
                self._main.call(self._jm, address, job_id).update_task_execution_state(token, update)
            except (FencingTokenError, NotFoundError) as exc:
                # a definite answer: that JobMaster does not want it (the heartbeat will tell
                # whether the job is gone)
                log.debug("JobMaster ignored %s: %s", update.state.name, exc)
            except RpcError as exc:
                log.warning("reporting %s of %s failed (try %d): %s", update.state.name,
                            update.execution_attempt_id, attempt + 1, exc)
                time.sleep(0.2 * (attempt + 1))
                continue
            else:
                self._main.execute(self.core.jobs.heard_from, job_id, token)
            if update.state.is_terminal:
                self._main.execute(self.core.jobs.acknowledged, job_id, [update.execution_attempt_id])
            return
        if update.state.is_terminal:
            log.info("%s of %s not delivered: the next heartbeat to the JobMaster of job %s carries it",
                     update.state.name, update.execution_attempt_id, job_id)

    def _split_requester(self, tdd: TaskDeploymentDescriptor,
                         cancelled: Callable[[], bool]) -> Callable[[int], SplitResponse]:
        """A source task's split requests. A split is the task's once it is booked among the
        task's ``taken_splits`` (on the main thread, so a takeover report has it or the task does
        not get it): only while the job's JobMaster is still the one that handed it out. One
        handed out by a JobMaster deposed meanwhile is dropped (its enumerator is gone; the new
        one still has the split) and the new JobMaster is asked."""
        job_id = tdd.job_id

        def booked(link: tuple[str, str], split: Any, last_checkpoint_id: int) -> bool:
            if self._link(job_id) != link:
                return False
            task = self.tasks.get(tdd.execution_attempt_id)
            if task is not None:
                task.taken_splits.append(TakenSplit(split.split_id, last_checkpoint_id))
            return True

        def request(last_checkpoint_id: int) -> SplitResponse:
            while True:
                link = self._wait_for_link(job_id, cancelled)
                address, token = link
                try:
                    resp = self._main.call(self._jm, address, job_id).request_split(
                        token, job_id, tdd.vertex_id, tdd.subtask_index, tdd.execution_attempt_id,
                        last_checkpoint_id)
                except (RpcConnectionError, RpcTimeoutError, UnavailableError) as exc:
                    if not self.core.keep_tasks:
                        raise
                    # its AppMaster may be failing over: the connection is orphaned (heartbeat.timeout,
                    # or the new leader is known) and waited on, or the job given up
                    log.info("%s: asking for a split failed (asked again): %s", tdd.display_name, exc)
                    time.sleep(_POLL_S * 5)
                    continue
                if resp.split is None or self._main.call(booked, link, resp.split, last_checkpoint_id):
                    return resp
                log.info("%s: split %s from a deposed JobMaster dropped: asking the new one", tdd.display_name,
                         resp.split.split_id)

        return request

    def _artifact_reader(self, tdd: TaskDeploymentDescriptor, cancelled: Callable[[], bool]) -> ArtifactReader:
        """Reads of the job's artifact from its JobMaster (the AppMaster's blob service): this
        host sees no other host's files. Asked again while the JobMaster is failing over."""
        job_id = tdd.job_id

        def read(offset: int, length: int) -> bytes:
            while True:
                try:
                    address, token = self._wait_for_link(job_id, cancelled)
                except UnavailableError as exc:
                    raise ArtifactError(f"cannot fetch the job artifact: {exc}") from exc
                try:
                    return self._main.call(self._jm, address, job_id).read_artifact(
                        token, job_id, tdd.artifact_sha256, offset, length)
                except (RpcConnectionError, RpcTimeoutError, UnavailableError) as exc:
                    if not self.core.keep_tasks:
                        raise ArtifactError(f"cannot fetch the job artifact from the JobMaster at {address}: "
                                            f"{exc}") from exc
                    log.info("%s: fetching the job artifact failed (asked again): %s", tdd.display_name, exc)
                    time.sleep(_POLL_S * 5)
                except RpcError as exc:
                    raise ArtifactError(f"the JobMaster at {address} did not give the job artifact: {exc}") from exc

        return read

    # -- the takeover (RPC, on the main thread) -----------------------------------------------------
    def _reconciled(self, task: Any, state: ExecutionState) -> ReconciledTask:
        tdd = task.tdd
        return ReconciledTask(tdd.execution_attempt_id, tdd.vertex_id, tdd.subtask_index, tdd.attempt_number, state,
                              tdd.allocation_id, getattr(task._responder, "last_acknowledged", 0),
                              list(task.taken_splits), tdd.restore.checkpoint_id if tdd.restore is not None else 0)

    def _remember_ended(self, task: Any, update: TaskExecutionStateUpdate) -> None:
        """(main thread) A task ended: until its final update is acknowledged, a takeover report
        names it too (a source that finished during a failover read its splits to the end:
        the new JobMaster must book them, not hand them out again)."""
        ended = self._ended
        ended[update.execution_attempt_id] = self._reconciled(task, update.state)
        unacked = {u.execution_attempt_id for c in self.core.jobs.connections() for u in c.unacknowledged.values()}
        for attempt_id in [a for a in ended if a not in unacked and a != update.execution_attempt_id]:
            del ended[attempt_id]

    @fenced(lambda te, *args: te.core.rm_token_expected())
    def reconnect_job(self, job_id: JobID, jobmaster_address: str, jobmaster_token: str) -> JobReconnectReport:
        tdds = self.core.reconnect_job(job_id, jobmaster_address, jobmaster_token)
        slots = [SlotOffer(s.allocation_id, s.index, s.profile, self.core.registration_id) for s in self.core.slots.slots
                 if s.job_id == job_id and s.allocation_id is not None]
        tasks = [self._reconciled(task, task.state) for tdd in tdds
                 if (task := self.tasks.get(tdd.execution_attempt_id)) is not None]
        finals = self.core.jobs.unacknowledged(job_id)
        tasks += [self._ended[u.execution_attempt_id] for u in finals if u.execution_attempt_id in self._ended]
        return JobReconnectReport(self.resource_id, slots, tasks, finals)


class JobMasterResponder:
    """A task's checkpoint answers, to its job's JobMaster of the moment (called on the task's
    writer thread). An answer while no JobMaster is connected is dropped (see the module)."""

    def __init__(self, te: Any, job_id: JobID, attempt_id: ExecutionAttemptID) -> None:
        self._te = te
        self._job_id, self._attempt_id = job_id, attempt_id
        #: the last checkpoint this task acknowledged (to a JobMaster that took the answer)
        self.last_acknowledged = 0

    def _gateway(self, what: str, checkpoint_id: int) -> tuple[RemoteJobMasterGateway, str] | None:
        link = self._te._main.call(self._te._link, self._job_id)
        if link is None:
            log.info("%s of checkpoint %d by %s dropped: job %s has no JobMaster connected (the leader changed)",
                     what, checkpoint_id, self._attempt_id, self._job_id)
            return None
        address, token = link
        return self._te._main.call(self._te._jm, address, self._job_id), token

    def acknowledge(self, checkpoint_id: int, snapshot: TaskStateSnapshot) -> None:
        target = self._gateway("acknowledgement", checkpoint_id)
        if target is not None:
            gw, token = target
            gw.acknowledge_checkpoint(token, self._job_id, self._attempt_id, checkpoint_id, snapshot)
            self.last_acknowledged = max(self.last_acknowledged, checkpoint_id)

    def decline(self, checkpoint_id: int, reason: str) -> None:
        target = self._gateway("decline", checkpoint_id)
        if target is not None:
            gw, token = target
            gw.decline_checkpoint(token, self._job_id, self._attempt_id, checkpoint_id, reason)
