"""The ``TaskExecutorEvents`` mixin of ``JobMasterCore``: a TaskExecutor's heartbeat to the
job (the tasks and slots it reports), the heartbeat check, a TaskExecutor lost to the job, and
the slots asked for again when one vanished before its region was deployed."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable

from yarnflow.am.jobmaster.actions import Action, CancelTask
from yarnflow.am.jobmaster.execution_graph import Execution, ExecutionGraph
from yarnflow.am.jobmaster.slot_assignment import SlotAssignment
from yarnflow.am.jobmaster.slot_requests import SlotRequests
from yarnflow.am.jobmaster.task_executors import JobTaskExecutors
from yarnflow.am.scheduler.regions import PipelinedRegion, SubtaskId
from yarnflow.am.checkpoint.coordinator import TimerService
from yarnflow.common.ids import AllocationID, ExecutionAttemptID, JobID, ResourceID
from yarnflow.common.messages import ErrorInfo, TaskExecutionStateUpdate
from yarnflow.common.states import JobStatus

log = logging.getLogger(__name__)


class TaskExecutorEvents:
    job_id: JobID
    status: JobStatus
    graph: ExecutionGraph
    slots: SlotAssignment
    requests: SlotRequests
    task_executors: JobTaskExecutors
    regions: list[PipelinedRegion]
    _timers: TimerService
    _heartbeat_interval: int
    _heartbeat_timeout: int
    _scheduled: set[int]
    _deployed: set[int]
    _restart_pending: set[SubtaskId]
    _waiting_groups: dict[int, set[Hashable]]
    _now: Callable[[], int]
    _emit: Callable[[Action], None]
    task_state_changed: Callable[[TaskExecutionStateUpdate], bool]
    _task_failed: Callable[[Execution, ErrorInfo], None]
    _blame_lost_task_executor: Callable[[ErrorInfo, int], None]
    _deploy_if_ready: Callable[[PipelinedRegion], None]
    reconciling: bool
    reported_slots: Callable[[ResourceID], list[AllocationID]]

    def task_executor_heartbeat(self, resource_id: ResourceID, executions: list[TaskExecutionStateUpdate],
                                allocation_ids: list[AllocationID]) -> list[AllocationID]:
        """A TaskExecutor reports the job's tasks it runs (terminal ones it could not deliver
        included) and the slots it holds for the job. Missed updates are applied; a task the
        JobMaster believes runs there but that is missing from two reports in a row failed;
        an attempt that is no longer current is cancelled. Returns the slots the job holds on
        that TaskExecutor: the TaskExecutor frees the others."""
        executors = self.task_executors
        if resource_id in executors.lost:
            return []
        executors.heard_from(resource_id, self._now())
        if self.reconciling:  # its tasks are judged once every report is in: it keeps its slots
            return self.reported_slots(resource_id)
        reported: set[ExecutionAttemptID] = set()
        for update in executions:
            reported.add(update.execution_attempt_id)
            ex = self.graph.execution(update.execution_attempt_id)
            if ex is not None and self.graph.is_current(ex) and not ex.state.is_terminal:
                self.task_state_changed(update)
            elif not update.state.is_terminal and resource_id in executors.address:
                log.info("job %s: %s still runs %s, an attempt this job gave up: cancelling it", self.job_id,
                         resource_id, update.execution_attempt_id)
                self._emit(CancelTask(update.execution_attempt_id, resource_id, executors.address[resource_id]))
        for ex in executors.missing_twice(resource_id, self.graph.current_executions(), reported):
            self._task_failed(ex, ErrorInfo("TaskLostError", f"{resource_id} no longer runs this task",
                                            location=f"TaskExecutor {resource_id}"))
        held = self.slots.slots_on(resource_id)
        stray = set(allocation_ids) - set(held)
        if stray:
            log.info("job %s: %s holds %d slots this job does not: it frees them", self.job_id, resource_id,
                     len(stray))
        return held

    def _check_heartbeats(self) -> None:
        if self.status.is_globally_terminal:
            return
        now = self._now()
        holding = {s.resource_id for s in self.slots.pool.slots.values() if s.resource_id is not None}
        holding |= {ex.slot.resource_id for ex in self.graph.current_executions()
                    if ex.slot is not None and not ex.state.is_terminal}
        for rid, silent_ms in self.task_executors.silent(holding, now, self._heartbeat_timeout):
            self.task_executor_lost(rid, f"no heartbeat for {silent_ms} ms (heartbeat.timeout "
                                         f"{self._heartbeat_timeout} ms)")
        self._timers.schedule(self._heartbeat_interval, self._check_heartbeats)

    def task_executor_lost(self, resource_id: ResourceID, reason: str, unreachable: bool = False) -> None:
        if not self.task_executors.mark_lost(resource_id, unreachable):
            return
        self.slots.task_executor_lost(resource_id)
        error = ErrorInfo("TaskExecutorLostError", f"TaskExecutor {resource_id} was lost: {reason}",
                          location=f"TaskExecutor {resource_id}")
        affected = [ex for ex in self.graph.current_executions()
                    if ex.slot is not None and ex.slot.resource_id == resource_id and not ex.state.is_terminal]
        log.info("job %s: TaskExecutor %s lost (%s): %d running tasks affected", self.job_id, resource_id, reason,
                 len(affected))
        self._blame_lost_task_executor(error, self._heartbeat_timeout + self._heartbeat_interval)
        for ex in affected:
            if not ex.state.is_terminal:  # an earlier failure's restart may have settled it
                self._task_failed(ex, error)
        self._reacquire_missing_groups()

    def _reacquire_missing_groups(self) -> None:
        """Scheduled regions not yet deployed whose slot vanished ask again."""
        if self.status != JobStatus.RUNNING:
            return
        for rid in sorted(self._scheduled - self._deployed):
            region = self.regions[rid]
            if any(s in self._restart_pending for s in region.subtasks):
                continue
            self._waiting_groups.pop(rid, None)
            for request in self.slots.reacquire_missing(region, self._now()):
                self.requests.request(request)
            self._deploy_if_ready(region)
