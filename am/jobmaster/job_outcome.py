"""How ``JobMasterCore``'s job ends (cancel, a global failure, a failover that gave up,
suspension when the leadership is lost, the last resort when the core's own state broke) and
what the job's tasks report of checkpoints.

Mixins of the core, not components: they read and change the same state in the same event
handlers, and are kept in their own file only to keep each file readable. The attributes and
methods they use from the core are declared below."""

from __future__ import annotations

import logging
from collections.abc import Callable

from yarnflow.am.jobmaster.actions import (
    Action,
    CancelSlotRequest,
    CancelTask,
    JobReachedTerminalState,
    ReleasePartitions,
    ReturnAllocation,
)
from yarnflow.am.jobmaster.checkpointing import JobCheckpoints
from yarnflow.am.jobmaster.execution_graph import Execution, ExecutionGraph
from yarnflow.am.jobmaster.failure_handler import FailureHandler
from yarnflow.am.jobmaster.slot_assignment import SlotAssignment
from yarnflow.am.jobmaster.slot_requests import SlotRequests
from yarnflow.am.jobmaster.slotpool.slot_pool import PoolSlotState
from yarnflow.am.jobmaster.task_executors import JobTaskExecutors
from yarnflow.am.scheduler.regions import SubtaskId
from yarnflow.common.clock import Clock
from yarnflow.common.ids import ExecutionAttemptID, JobID
from yarnflow.common.messages import ErrorInfo, JobGraph, TaskStateSnapshot
from yarnflow.common.states import JobStatus

__all__ = ["CheckpointEvents", "JobOutcome"]

log = logging.getLogger(__name__)


class JobOutcome:
    # -- what the core provides
    job_id: JobID
    job_graph: JobGraph
    status: JobStatus
    graph: ExecutionGraph
    failures: FailureHandler
    failure_cause: ErrorInfo | None
    checkpoints: JobCheckpoints | None
    task_executors: JobTaskExecutors
    slots: SlotAssignment
    requests: SlotRequests
    start_time_ms: int
    end_time_ms: int
    _clock: Clock
    _out: list[Action]
    _restart_pending: set[SubtaskId]
    _emit: Callable[[Action], None]
    _set_status: Callable[[JobStatus], None]
    _cancel_execution: Callable[[Execution], None]
    reconciling: bool
    finish_reconciliation: Callable[[], None]

    def cancel(self) -> None:
        if self.status.is_globally_terminal or self.status in (JobStatus.CANCELLING, JobStatus.FAILING):
            return
        if self.reconciling:  # take over what is known, to cancel it where it runs
            self.finish_reconciliation()
        self._set_status(JobStatus.CANCELLING)
        self._restart_pending.clear()
        for ex in self.graph.current_executions():
            self._cancel_execution(ex)
        self._check_job()

    def fail_globally(self, error: ErrorInfo) -> None:
        """A failure of the job as a whole (not of one task): the job fails, no restart."""
        if self.status.is_globally_terminal:
            return
        self.failures.global_failure(error)
        if self.status in (JobStatus.FAILING, JobStatus.CANCELLING):
            self.failure_cause = self.failure_cause or error
            return
        self._fail(error)

    def _fail(self, cause: ErrorInfo) -> None:
        if self.status not in (JobStatus.RUNNING, JobStatus.CREATED, JobStatus.RESTARTING):
            return
        if self.reconciling:  # take over what is known, to cancel it where it runs
            self.finish_reconciliation()
        self.failure_cause = cause
        self._set_status(JobStatus.FAILING)
        self._restart_pending.clear()
        for ex in self.graph.current_executions():
            self._cancel_execution(ex)
        self._check_job()

    def _check_job(self) -> None:
        if self.status == JobStatus.FAILING and self.graph.all_terminal():
            self._finish_job(JobStatus.FAILED)
        elif self.status == JobStatus.CANCELLING and self.graph.all_terminal():
            self._finish_job(JobStatus.CANCELED)

    def _finish_job(self, status: JobStatus) -> None:
        self._set_status(status)
        self._end()

    def suspend(self, reason: str) -> None:
        """Leadership of the job is lost (Flink's SUSPENDED): stop at once and call no one (the
        tasks are cancelled by their TaskExecutors, which follow the new leader; nothing is
        written: a deposed JobMaster must not touch the job's checkpoints). The job is not over:
        the leader recovers it. Emits only ``JobReachedTerminalState(SUSPENDED)``."""
        if self.status.is_globally_terminal or self.status == JobStatus.SUSPENDED:
            return
        log.warning("job %s (%s) suspended: %s", self.job_graph.name, self.job_id, reason)
        self._set_status(JobStatus.SUSPENDED)
        self.end_time_ms = self._clock.now_ms()
        if self.checkpoints is not None:
            self.checkpoints.coordinator.stop()
        self._out.clear()  # no discards, notifications, cancels or slot returns from a deposed leader
        self._emit(JobReachedTerminalState(JobStatus.SUSPENDED))

    def force_failed(self, error: ErrorInfo) -> None:
        """Last resort when the core's own state is broken: the job ends FAILED with ``error``,
        its slots are given back and every task it may still have is cancelled. (A suspended
        job is not this leader's to end: its new leader runs it.)"""
        if self.status.is_globally_terminal or self.status == JobStatus.SUSPENDED:
            return
        log.error("job %s: failing it outright: %s", self.job_id, error.describe())
        self.failure_cause = error
        for ex in self.graph.current_executions():
            if not ex.state.is_terminal and ex.slot is not None and self.task_executors.reachable(ex.slot.resource_id):
                self._emit(CancelTask(ex.attempt_id, ex.slot.resource_id, ex.slot.rpc_address))
        if not self.status.can_move_to(JobStatus.FAILED):
            self._set_status(JobStatus.FAILING)  # (RUNNING, RESTARTING: through FAILING, as any failure)
        self._set_status(JobStatus.FAILED)
        self._end()

    def _end(self) -> None:
        self.end_time_ms = self._clock.now_ms()
        if self.checkpoints is not None:
            self.checkpoints.coordinator.stop(finished=self.status == JobStatus.FINISHED)
        pool = self.slots.pool
        for slot in pool.all():
            if slot.state == PoolSlotState.PENDING:
                self._emit(CancelSlotRequest(slot.allocation_id))
                self._emit(ReturnAllocation(slot.allocation_id))
            else:
                self.requests.give_back(slot.allocation_id, slot.resource_id, slot.rpc_address,
                                        f"ended {self.status.name}")
            pool.remove(slot.allocation_id)
        for rid, address in self.task_executors.reachable_addresses().items():
            self._emit(ReleasePartitions(rid, address, ()))
        log.info("job %s (%s) ended %s after %.1f s%s", self.job_graph.name, self.job_id, self.status.name,
                 (self.end_time_ms - self.start_time_ms) / 1000,
                 f": {self.failure_cause.describe()}" if self.failure_cause else "")
        self._emit(JobReachedTerminalState(self.status))


class CheckpointEvents:
    # -- what the core provides
    graph: ExecutionGraph
    checkpoints: JobCheckpoints | None

    def acknowledge_checkpoint(self, attempt_id: ExecutionAttemptID, checkpoint_id: int,
                               snapshot: TaskStateSnapshot) -> bool:
        """A task wrote its state for a checkpoint. False when it does not count (stale)."""
        ex = self.graph.execution(attempt_id)
        if self.checkpoints is None or ex is None or not self.graph.is_current(ex):
            log.debug("acknowledgement of checkpoint %d by %s ignored", checkpoint_id, attempt_id)
            return False
        return self.checkpoints.acknowledge(ex, checkpoint_id, snapshot)

    def decline_checkpoint(self, attempt_id: ExecutionAttemptID, checkpoint_id: int, reason: str) -> None:
        if self.checkpoints is not None:
            self.checkpoints.coordinator.decline(checkpoint_id, attempt_id, reason)
            self.checkpoints.checkpoint_ended()

    def checkpoint_trigger_failed(self, attempt_id: ExecutionAttemptID, checkpoint_id: int, error: ErrorInfo) -> None:
        if error.error_class == "NotFoundError":
            # its TaskExecutor answered that the task is not there: it ended (finished, while the
            # trigger was on its way, or failed). Its state update, coming or come, decides: a
            # finished task counts as acknowledged (FLIP-147), a failed one aborts what is
            # pending. (A bounded job's clean finish showed "Failed 1": this race.)
            log.debug("checkpoint %d did not find %s on its TaskExecutor (it ended): its state update decides",
                      checkpoint_id, attempt_id)
            return
        if self.checkpoints is not None:
            self.checkpoints.coordinator.trigger_failed(checkpoint_id, attempt_id, error.describe())
            self.checkpoints.checkpoint_ended()

    def checkpoint_metadata_written(self, checkpoint_id: int, external_path: str = "") -> None:
        if self.checkpoints is not None:
            self.checkpoints.coordinator.metadata_written(checkpoint_id, external_path)
            self.checkpoints.checkpoint_ended()

    def checkpoint_metadata_failed(self, checkpoint_id: int, detail: str) -> None:
        if self.checkpoints is not None:
            self.checkpoints.coordinator.metadata_failed(checkpoint_id, detail)
            self.checkpoints.checkpoint_ended()
