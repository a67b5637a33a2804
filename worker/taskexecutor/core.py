"""The TaskExecutor's core: its slots, deployed tasks, JobMaster connections and their
heartbeats, and which token each call must carry, as a pure state machine (Flink's
TaskExecutor without its RPC and threads). Events come in as method calls on the main thread;
what must happen outside (offer a slot, start or cancel a task, release partitions, send a
heartbeat, close a connection) comes out as actions (``actions.py``) that the shell,
``task_executor.py``, carries out. Time comes from the injected clock (the JobTable's
heartbeat timeouts), so tests drive it without sockets or sleeps.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from yarnflow.common.errors import NotFoundError
from yarnflow.common.ids import AllocationID, ExecutionAttemptID, JobID, ResourceID
from yarnflow.common.messages import (
    AllocatedSlotReport,
    SlotOffer,
    TaskDeploymentDescriptor,
    TaskExecutionStateUpdate,
    TaskExecutorHeartbeatPayload,
)
from yarnflow.common.rpc.endpoint import UNFENCED, Expected
from yarnflow.worker.taskexecutor.job_table import JobTable, slots_to_free
from yarnflow.worker.taskexecutor.slot_table import SlotState, SlotTable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OfferSlot:
    job_id: JobID
    address: str  # the JobMaster's
    token: str
    offer: SlotOffer


@dataclass(frozen=True)
class StartTask:
    tdd: TaskDeploymentDescriptor
    address: str  # its JobMaster's, and the token to use there
    token: str
    slot_index: int


@dataclass(frozen=True)
class CancelTask:
    attempt_id: ExecutionAttemptID
    watch: bool = True  # end the TaskExecutor if it does not stop within task.cancellation.timeout


@dataclass(frozen=True)
class ReleasePartitions:
    """The job's result partitions here: those named (all when none are), or only its
    pipelined ones (blocking partitions stay until its JobMaster releases them)."""

    job_id: JobID
    partition_ids: frozenset[str] = frozenset()
    pipelined_only: bool = False

    def covers(self, partition_id: str) -> bool:
        return partition_id.startswith(f"{self.job_id}.") and (
            not self.partition_ids or partition_id in self.partition_ids)


@dataclass(frozen=True)
class SendHeartbeat:
    job_id: JobID
    address: str
    token: str
    payload: TaskExecutorHeartbeatPayload
    active: frozenset[AllocationID]  # the job's slots that were ACTIVE when it was sent


@dataclass(frozen=True)
class CloseJobMasterConnection:
    job_id: JobID


Action = OfferSlot | StartTask | CancelTask | ReleasePartitions | SendHeartbeat | CloseJobMasterConnection


class TaskExecutorCore:
    def __init__(self, resource_id: ResourceID, slots: SlotTable, jobs: JobTable, keep_tasks: bool = False) -> None:
        self.resource_id = resource_id
        #: a leader change (or a JobMaster silent for heartbeat.timeout) orphans the job's tasks
        #: instead of cancelling them: a new leader's JobMaster may take them over
        self.keep_tasks = keep_tasks
        self.slots = slots
        self.jobs = jobs
        #: the tasks deployed here and not yet ended
        self.tasks: dict[ExecutionAttemptID, TaskDeploymentDescriptor] = {}
        self.rm_token = ""
        self.registration_id = ""
        self._heartbeats_in_flight: set[JobID] = set()

    # -- the ResourceManager ----------------------------------------------------------------------
    def registered(self, token: str, registration_id: str) -> None:
        self.rm_token, self.registration_id = token, registration_id

    def registration_lost(self) -> None:
        """The ResourceManager does not know this TaskExecutor (any more): register again."""
        self.registration_id = ""

    def leader_changed(self, keep_tasks: bool = False) -> list[Action]:
        """Another AppMaster leads, and this TaskExecutor registers anew. The old leader's
        JobMasters are deposed: with ``keep_tasks`` the jobs' tasks run on and wait (orphaned)
        for the new leader's JobMaster of their job to take them over (``reconnect_job``), for
        at most the JobTable's orphan timeout; without, everything of those jobs goes here
        (the new leader restarts them)."""
        actions: list[Action] = []
        jobs = sorted({*(c.job_id for c in self.jobs.connections()),
                       *(s.job_id for s in self.slots.slots if s.job_id is not None)})
        if keep_tasks:
            orphaned = set(self.jobs.orphan_all())
            batch = {tdd.job_id for tdd in self.tasks.values() if tdd.runtime_mode == "BATCH"}
            for job_id in jobs:
                if job_id in orphaned and job_id not in batch:
                    log.info("job %s: its tasks here run on, waiting for the new leader's JobMaster", job_id)
                else:  # a BATCH job starts again from its inputs; slots without a connection: nobody takes them
                    actions += self.job_master_gone(job_id, "the AppMaster that led its job lost the leadership")
            self._heartbeats_in_flight.clear()
        else:
            for job_id in jobs:
                actions += self.job_master_gone(job_id, "the AppMaster that led its job lost the leadership")
        self.rm_token = self.registration_id = ""
        return actions

    def reconnect_job(self, job_id: JobID, address: str, token: str) -> list[TaskDeploymentDescriptor]:
        """The job's JobMaster at ``address`` (a new leader's) takes over the job's slots and
        tasks here: their calls now carry ``token``. Returns the job's running tasks. Raises
        NotFoundError when nothing of the job is here (any more)."""
        slots = [s for s in self.slots.slots if s.job_id == job_id and s.allocation_id is not None]
        conn = self.jobs.connection(job_id)
        if not slots and conn is None:
            raise NotFoundError(f"TaskExecutor {self.resource_id} holds nothing of job {job_id}")
        self.jobs.reconnect(job_id, address, token)
        for slot in slots:
            slot.jobmaster_address, slot.jobmaster_token = address, token
        tasks = []
        for attempt_id, tdd in list(self.tasks.items()):
            if tdd.job_id == job_id:
                tdd = self.tasks[attempt_id] = dataclasses.replace(tdd, jobmaster_fencing_token=token)
                tasks.append(tdd)
        self._heartbeats_in_flight.discard(job_id)
        log.info("job %s: the JobMaster at %s took over %d slots and %d tasks here", job_id, address, len(slots),
                 len(tasks))
        return tasks

    def orphaned(self, job_id: JobID) -> bool:
        conn = self.jobs.connection(job_id)
        return conn is not None and conn.orphaned_since_ms is not None

    # -- which token a call must carry (RpcEndpoint's token_of) ------------------------------------
    def rm_token_expected(self) -> Expected:
        return self.rm_token or None

    def slot_token(self, allocation_id: AllocationID) -> Expected:
        slot = self.slots.get(allocation_id)
        if slot is None:
            return self.jobs.expected_token(self.jobs.job_of(allocation_id))
        return self.jobs.expected_token(slot.job_id, slot.jobmaster_token)

    def task_token(self, attempt_id: ExecutionAttemptID) -> Expected:
        tdd = self.tasks.get(attempt_id)
        if tdd is None:
            return self.jobs.expected_token(self.jobs.job_of(attempt_id))
        return self.jobs.expected_token(tdd.job_id, tdd.jobmaster_fencing_token)

    def deployment_token(self, tdd: TaskDeploymentDescriptor) -> Expected:
        slot = self.slots.get(tdd.allocation_id)
        if slot is not None and slot.job_id != tdd.job_id:
            return None
        return self.jobs.expected_token(tdd.job_id, slot.jobmaster_token if slot is not None else None)

    def job_token(self, job_id: JobID) -> Expected:
        """A job this TaskExecutor never served has nothing here to protect: not fenced."""
        return self.jobs.expected_token(job_id) if self.jobs.token_of(job_id) is not None else UNFENCED

    # -- slots ------------------------------------------------------------------------------------
    def slot_requested(self, slot_index: int, job_id: JobID, allocation_id: AllocationID, address: str,
                       token: str) -> list[Action]:
        """The ResourceManager's slot request: reserve the slot and offer it to the job's JobMaster."""
        if not self.slots.allocate(slot_index, job_id, allocation_id, address, token):
            return []  # the same request again
        self.jobs.connect(job_id, address, token)
        log.info("slot %d allocated to %s of job %s", slot_index, allocation_id, job_id)
        slot = self.slots.get(allocation_id)
        assert slot is not None
        return [OfferSlot(job_id, address, token, SlotOffer(allocation_id, slot_index, slot.profile,
                                                            self.registration_id))]

    def offer_answered(self, offer: SlotOffer, accepted: bool) -> list[Action]:
        if self.slots.get(offer.allocation_id) is None:
            return []  # freed meanwhile
        if accepted:
            self.slots.mark_active(offer.allocation_id)
            return []
        log.info("slot offer %s declined: freeing it", offer.allocation_id)
        return self.free_slot(offer.allocation_id, "its offer was declined")

    def free_slot(self, allocation_id: AllocationID, reason: str) -> list[Action]:
        """Cancel the slot's tasks and free it; with the job's last slot go its pipelined
        partitions (blocking ones stay until the JobMaster releases them)."""
        slot = self.slots.get(allocation_id)
        if slot is None:
            return []
        job_id = slot.job_id
        actions: list[Action] = [CancelTask(a) for a in sorted(slot.tasks) if a in self.tasks]
        self.slots.free(allocation_id)
        if job_id is not None:
            self.jobs.retire(allocation_id, job_id)
        log.info("freed slot of %s (%s)", allocation_id, reason)
        if job_id is not None and job_id not in self.slots.jobs():
            actions.append(ReleasePartitions(job_id, pipelined_only=True))
        return actions

    # -- tasks ------------------------------------------------------------------------------------
    def deploy(self, tdd: TaskDeploymentDescriptor) -> list[Action]:
        slot = self.slots.get(tdd.allocation_id)
        if slot is None:
            raise NotFoundError(f"no slot for allocation {tdd.allocation_id} on {self.resource_id}")
        if tdd.execution_attempt_id in self.tasks:
            return []  # the same deployment again: it runs
        self.slots.mark_active(tdd.allocation_id)  # (the offer's answer may still be on its way)
        self.slots.add_task(tdd.allocation_id, tdd.execution_attempt_id)
        self.tasks[tdd.execution_attempt_id] = tdd
        return [StartTask(tdd, slot.jobmaster_address, slot.jobmaster_token, slot.index)]

    def task_ended(self, update: TaskExecutionStateUpdate) -> None:
        """A task's final update: its slot may free; the update is kept until acknowledged."""
        self.jobs.task_ended(update)
        self.tasks.pop(update.execution_attempt_id, None)
        self.slots.remove_task(update.execution_attempt_id)

    def cancel_task(self, attempt_id: ExecutionAttemptID) -> list[Action]:
        if attempt_id not in self.tasks:
            log.debug("cancel of unknown task %s ignored", attempt_id)
            return []
        return [CancelTask(attempt_id)]

    def running(self, attempt_id: ExecutionAttemptID, call: str) -> TaskDeploymentDescriptor:
        tdd = self.tasks.get(attempt_id)
        if tdd is None:
            raise NotFoundError(f"{call}: task {attempt_id} is not running on TaskExecutor {self.resource_id}")
        return tdd

    def release_partitions(self, job_id: JobID, partition_ids: Iterable[str]) -> list[Action]:
        """Blocking partitions are released by the JobMaster when no consumer needs them."""
        if self.jobs.token_of(job_id) is None:
            log.debug("releasePartitions of job %s, unknown here, ignored", job_id)
            return []
        return [ReleasePartitions(job_id, frozenset(partition_ids))]

    # -- JobMaster heartbeats ---------------------------------------------------------------------
    def heartbeats_due(self, states: Mapping[ExecutionAttemptID, TaskExecutionStateUpdate],
                       partition_ids: Iterable[str]) -> list[Action]:
        """One heartbeat per connected job that still has slots, tasks, partitions or final
        updates here; jobs with none are disconnected, silent JobMasters are given up.
        ``states``: the current state of each task still running; ``partition_ids``: the
        result partitions held here."""
        actions: list[Action] = []
        for conn in self.jobs.timed_out():
            if conn.orphaned_since_ms is None and self.keep_tasks and not any(
                    tdd.job_id == conn.job_id and tdd.runtime_mode == "BATCH" for tdd in self.tasks.values()):
                log.info("job %s: its JobMaster at %s did not answer for %.1f s (heartbeat.timeout): its tasks run "
                         "on, waiting for a new leader's JobMaster", conn.job_id, conn.address,
                         self.jobs.silent_ms(conn) / 1000)
                self.jobs.orphan(conn.job_id)
                continue
            if conn.orphaned_since_ms is not None:
                reason = ("no JobMaster of the new AppMaster leader took it over within "
                          "resourcemanager.previous-worker.recovery.timeout")
            else:
                reason = (f"its JobMaster at {conn.address} did not answer for "
                          f"{self.jobs.silent_ms(conn) / 1000:.1f} s (heartbeat.timeout)")
            actions += self.job_master_gone(conn.job_id, reason)
        held = list(partition_ids)
        for conn in self.jobs.connections():
            job_id = conn.job_id
            if conn.orphaned_since_ms is not None:
                continue  # nobody to send it to until the new leader's JobMaster takes over
            slots = [s for s in self.slots.slots if s.job_id == job_id and s.allocation_id is not None]
            tasks = [a for a, tdd in self.tasks.items() if tdd.job_id == job_id]
            unacked = self.jobs.unacknowledged(job_id)
            if not (slots or tasks or unacked or any(p.startswith(f"{job_id}.") for p in held)):
                log.info("job %s has nothing left on this TaskExecutor: disconnecting from its JobMaster", job_id)
                actions += self._disconnect(job_id)
                continue
            if job_id in self._heartbeats_in_flight:
                continue
            finals = {u.execution_attempt_id: u for u in unacked}
            # a task that just ended is reported by its final update (with its error), not here
            executions = [states[a] for a in tasks if a in states and a not in finals
                          and not states[a].state.is_terminal] + list(finals.values())
            payload = TaskExecutorHeartbeatPayload(self.resource_id, executions,
                                                   [s.allocation_id for s in slots if s.allocation_id is not None])
            active = frozenset(s.allocation_id for s in slots
                               if s.state == SlotState.ACTIVE and s.allocation_id is not None)
            self._heartbeats_in_flight.add(job_id)
            actions.append(SendHeartbeat(job_id, conn.address, conn.token, payload, active))
        return actions

    def heartbeat_failed(self, job_id: JobID) -> None:
        """No answer (the next round tries again; heartbeat.timeout judges the silence)."""
        self._heartbeats_in_flight.discard(job_id)

    def heartbeat_refused(self, job_id: JobID, token: str, reason: str) -> list[Action]:
        """The JobMaster answered NOT_FOUND or FENCING: it is gone, unless a newer one took over."""
        self._heartbeats_in_flight.discard(job_id)
        conn = self.jobs.connection(job_id)
        if conn is None or conn.token != token:
            return []
        return self.job_master_gone(job_id, reason)

    def heartbeat_answered(self, heartbeat: SendHeartbeat, report: AllocatedSlotReport | None) -> list[Action]:
        """Its allocated-slot report (None: it answered with an error of its own, alive but no
        report): an ACTIVE slot of the job it no longer lists is freed."""
        job_id = heartbeat.job_id
        self._heartbeats_in_flight.discard(job_id)
        if not self.jobs.heard_from(job_id, heartbeat.token) or report is None:
            return []
        self.jobs.acknowledged(job_id, [u.execution_attempt_id for u in heartbeat.payload.executions
                                        if u.state.is_terminal])
        actions: list[Action] = []
        for allocation_id in sorted(slots_to_free(heartbeat.active, report.allocation_ids)):
            slot = self.slots.get(allocation_id)
            if slot is None or slot.state != SlotState.ACTIVE or slot.job_id != job_id:
                continue
            log.info("freeing slot %d (%s) of job %s: its JobMaster no longer lists it", slot.index,
                     allocation_id, job_id)
            actions += self.free_slot(allocation_id, "not in the JobMaster's allocated-slot report")
        return actions

    def job_master_gone(self, job_id: JobID, reason: str) -> list[Action]:
        """The job's JobMaster is gone: cancel the job's tasks, free its slots, release its
        partitions and forget its final updates."""
        log.info("job %s: freeing its slots, tasks and partitions here: %s", job_id, reason)
        actions = self._disconnect(job_id)
        for slot in list(self.slots.slots):
            if slot.job_id == job_id and slot.allocation_id is not None:
                actions += self.free_slot(slot.allocation_id, reason)
        cancelled = {a.attempt_id for a in actions if isinstance(a, CancelTask)}
        actions += [CancelTask(a, watch=False) for a, tdd in sorted(self.tasks.items())
                    if tdd.job_id == job_id and a not in cancelled]
        actions.append(ReleasePartitions(job_id))
        return actions

    def _disconnect(self, job_id: JobID) -> list[Action]:
        self.jobs.disconnect(job_id)
        return [CloseJobMasterConnection(job_id)]
