"""How ``JobMasterCore`` handles a failed task (Flink's DefaultScheduler failover half): the
failover strategy names the subtasks to restart (``FailureHandler``), they are cancelled,
and once all of them have stopped they restart after the restart strategy's backoff, from
the latest completed checkpoint when the job has one. A task that does not confirm its
cancellation within ``CANCEL_TIMEOUT_MS`` is counted as canceled.

A mixin of the core, not a component: failover reads and changes the same scheduling state
(the regions deployed, the slots, the attempts) in the same event handlers, and it is kept in
its own file only to keep each file readable. The attributes and methods it uses from the core
are declared below."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from yarnflow.am.checkpoint.coordinator import TimerService
from yarnflow.am.jobmaster.actions import Action, CancelTask
from yarnflow.am.jobmaster.auto_parallelism import AutoParallelism
from yarnflow.am.jobmaster.checkpointing import JobCheckpoints
from yarnflow.am.jobmaster.execution_graph import Execution, ExecutionGraph, ExecutionVertex
from yarnflow.am.jobmaster.failure_handler import FailureHandler, explained_by
from yarnflow.am.jobmaster.task_executors import JobTaskExecutors
from yarnflow.am.scheduler.failover import PartitionUnavailable
from yarnflow.am.scheduler.region_progress import RegionProgress
from yarnflow.am.scheduler.regions import PipelinedRegion, SubtaskId
from yarnflow.common.clock import Clock
from yarnflow.common.ids import ExecutionAttemptID, JobID
from yarnflow.common.messages import ErrorInfo
from yarnflow.common.states import ExecutionState, JobStatus

__all__ = ["CANCEL_TIMEOUT_MS", "STATE_RESTORE_ERROR", "TaskFailover", "is_knock_on"]

log = logging.getLogger(__name__)

CANCEL_TIMEOUT_MS = 15_000
#: a task's own failure explains the knock-on failure recorded just before it within this long
KNOCK_ON_WINDOW_MS = 60_000
#: the error class of a task that could not read the state it was to restore
STATE_RESTORE_ERROR = "StateRestoreError"
_PARTITION_ERRORS = ("PartitionNotFoundError", "PartitionReleasedError", "RpcConnectionError")


def is_knock_on(error: ErrorInfo) -> bool:
    """Whether a task's failure may only be the effect of another's: it could not read a
    partition or reach a peer (also as the cause of an error its operator raised)."""
    return error.error_class in _PARTITION_ERRORS or any(f"{name}:" in error.traceback for name in _PARTITION_ERRORS)


class TaskFailover:
    # -- what the core provides
    job_id: JobID
    status: JobStatus
    graph: ExecutionGraph
    progress: RegionProgress
    failures: FailureHandler
    checkpoints: JobCheckpoints | None
    task_executors: JobTaskExecutors
    on_attempt_replaced: Callable[[Execution, Execution, int], object] | None
    _timers: TimerService
    _clock: Clock
    failure_cause: ErrorInfo | None
    _region_of: dict[SubtaskId, PipelinedRegion]
    auto: AutoParallelism
    _scheduled: set[int]
    _deployed: set[int]
    _all_running: set[SubtaskId]
    _restart_pending: set[SubtaskId]
    _restart_scheduled: bool
    _ev: Callable[[SubtaskId], ExecutionVertex]
    _sid: Callable[[Execution], SubtaskId]
    _emit: Callable[[Action], None]
    _set_status: Callable[[JobStatus], None]
    _fail: Callable[[ErrorInfo], None]
    _check_job: Callable[[], None]
    _schedule: Callable[[Iterable[int]], None]
    _release_region_slots: Callable[[PipelinedRegion], None]
    _result_available: Callable[[SubtaskId], bool]

    def _blame_lost_task_executor(self, lost: ErrorInfo, window_ms: int) -> None:
        """A TaskExecutor was lost (``lost`` says why: for a YARN container, its diagnostics):
        the failures of the last ``window_ms`` that were only its knock-on effects (a consumer
        that could no longer read from it, reported before the loss was known) name it as their
        root cause, in the failure history and as the cause of a job failing because of them."""
        self._blame(lost, window_ms)

    def _blame(self, root: ErrorInfo, window_ms: int, latest_only: bool = False) -> None:
        explained = self.failures.blame(root, self._clock.now_ms() - window_ms, is_knock_on, latest_only)
        if explained:
            log.info("job %s: %d earlier failures were knock-on effects of: %s", self.job_id, explained,
                     root.describe())
        if self.status == JobStatus.FAILING and self.failure_cause is not None and is_knock_on(self.failure_cause):
            self.failure_cause = explained_by(root, self.failure_cause)
        final = self.failures.memory_failure(root, self._latest_checkpoint()) if explained else None
        if final is not None:  # the restart under way was for a memory failure: one too many
            self._fail(final)

    def _latest_checkpoint(self) -> int:
        return self.checkpoints.latest_completed_id() if self.checkpoints is not None else 0

    def _cause_of(self, error: ErrorInfo) -> PartitionUnavailable | None:
        """A consumer that could not read a blocking partition names it (a typed
        ResultPartitionID in the error): that producer's result is then unavailable."""
        partition = getattr(error, "unavailable_partition", None)
        if not partition or error.error_class not in _PARTITION_ERRORS:
            return None
        parts = str(partition).split(".")  # <job id>.<producer attempt id>.<edge index>
        producer = self.graph.execution(parts[1]) if len(parts) == 3 else None
        if producer is None:
            return None
        return PartitionUnavailable(self._sid(producer), error.message)

    def _task_failed(self, ex: Execution, error: ErrorInfo) -> None:
        if ex.state.is_terminal:
            return
        was_canceling = ex.state == ExecutionState.CANCELING
        ex.failure = error
        # a task asked to cancel that fails on its way out (its producer was cancelled first and
        # released its input) completes the cancellation, as in Flink: a cancelled job's subtasks
        # all end CANCELED
        ex.transition(ExecutionState.CANCELED if was_canceling else ExecutionState.FAILED)
        if error.error_class == STATE_RESTORE_ERROR and ex.restore is not None and self.checkpoints is not None:
            self.checkpoints.mark_unreadable(ex.restore.checkpoint_id)  # the task could not read its state
        sid = self._sid(ex)
        if was_canceling or sid in self._restart_pending or self.status != JobStatus.RUNNING:
            if not is_knock_on(error) and error.error_class != "TaskCancelledError":
                # its consumers' failures reached this JobMaster first (it released its partitions
                # as it failed): the latest failure recorded was their knock-on, this is its cause
                self._blame(error, KNOCK_ON_WINDOW_MS, latest_only=True)
            self._on_terminal_execution()  # a consequence of a failover or cancel under way
            return
        log.info("job %s: %s failed: %s", self.job_id, ex.vertex.name, error.describe())
        if self.checkpoints is not None:
            self.checkpoints.coordinator.task_failed()
        cause = self._cause_of(error)
        decision = self.failures.task_failed(
            sid, ex.vertex.name, error, cause, lambda s: self._ev(s).current.state == ExecutionState.FINISHED,
            lambda s: self._result_available(s) and not (cause is not None and cause.producer == s),
            self._latest_checkpoint())
        if not decision.can_restart:
            self._fail(decision.error)
            return
        to_restart = decision.to_restart - self.auto.retired  # (never run: past a decided parallelism)
        log.info("job %s: restarting %d subtasks (%s)", self.job_id, len(to_restart), self.failures.describe())
        if len(to_restart) == len(self._region_of) - len(self.auto.retired):
            self._set_status(JobStatus.RESTARTING)
        self._restart_pending |= to_restart
        for s in to_restart:
            self._cancel_execution(self._ev(s).current)
        self._maybe_restart()

    def _on_terminal_execution(self) -> None:
        if self._restart_pending:
            self._maybe_restart()
        self._check_job()

    def _maybe_restart(self) -> None:
        """Once every subtask to restart has stopped, restart them after the backoff (they
        stay in ``_restart_pending``, out of scheduling, until then)."""
        if not self._restart_pending or self._restart_scheduled:
            return
        if not all(self._ev(s).current.state.is_terminal for s in self._restart_pending):
            return
        if self.status not in (JobStatus.RUNNING, JobStatus.RESTARTING):
            return
        self._restart_scheduled = True
        pending = set(self._restart_pending)
        self._timers.schedule(self.failures.restart.backoff_ms(), lambda: self._restart(pending))

    def _restart(self, subtasks: set[SubtaskId]) -> None:
        self._restart_scheduled = False
        if self.status not in (JobStatus.RUNNING, JobStatus.RESTARTING):
            return
        regions = {self._region_of[s].region_id: self._region_of[s] for s in subtasks}
        for region in regions.values():
            self._scheduled.discard(region.region_id)
            self._deployed.discard(region.region_id)
            self._release_region_slots(region)
        self.progress.mark_unfinished(regions.values())
        restore_id = 0
        if self.checkpoints is not None:
            if self.checkpoints.nothing_left_to_restore():
                self._fail(ErrorInfo("CheckpointRestoreError", "no retained checkpoint can be read, so the job "
                                     "cannot resume without losing or repeating data"))
                return
            point = self.checkpoints.restore_point()
            restore_id = point.checkpoint_id if point is not None else 0
        for s in subtasks:
            ev = self._ev(s)
            old = ev.current
            new = self.graph.new_attempt(ev)
            if restore_id and self.checkpoints is not None:
                new.restore = self.checkpoints.restore_for(restore_id, s)
            if self.on_attempt_replaced is not None:
                self.on_attempt_replaced(old, new, restore_id)
            self._all_running.discard(s)
            self._restart_pending.discard(s)
        self.failures.note_restore(restore_id)
        if restore_id:
            log.info("job %s: %d subtasks resume from checkpoint %d", self.job_id, len(subtasks), restore_id)
        if self.status == JobStatus.RESTARTING:
            self._set_status(JobStatus.RUNNING)
        log.info("job %s: restarted %d subtasks", self.job_id, len(subtasks))
        self._schedule(regions)
        self._maybe_restart()  # failures that came during the backoff

    def _cancel_execution(self, ex: Execution) -> None:
        if ex.state.is_terminal:
            return
        if ex.state in (ExecutionState.CREATED, ExecutionState.SCHEDULED):
            ex.transition(ExecutionState.CANCELED)
            return
        ex.transition(ExecutionState.CANCELING)
        if ex.slot is None or not self.task_executors.reachable(ex.slot.resource_id):
            ex.transition(ExecutionState.CANCELED)  # nothing left to cancel there
            return
        self._emit(CancelTask(ex.attempt_id, ex.slot.resource_id, ex.slot.rpc_address))
        self._timers.schedule(CANCEL_TIMEOUT_MS, lambda: self._force_canceled(ex, "did not confirm its "
                                                                                  "cancellation in time"))

    def cancel_call_failed(self, attempt_id: ExecutionAttemptID, error: ErrorInfo) -> None:
        """The cancel call could not reach the TaskExecutor: count the task as canceled (if it
        still runs there, the TaskExecutor's next heartbeat shows it and it is cancelled again,
        or the TaskExecutor is lost to the job)."""
        ex = self.graph.execution(attempt_id)
        if ex is not None:
            self._force_canceled(ex, f"could not be reached to cancel ({error.describe()})")

    def _force_canceled(self, ex: Execution, why: str) -> None:
        if ex.state == ExecutionState.CANCELING and self.graph.is_current(ex):
            log.warning("%s %s: counting it as canceled", ex.vertex.name, why)
            ex.transition(ExecutionState.CANCELED)
            self._on_terminal_execution()
