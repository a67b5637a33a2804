"""A new leader's JobMaster takes over the tasks that kept running (Flink's RECONCILING, which
Flink never uses for streaming jobs): the ``Reconciliation`` mixin of ``JobMasterCore``.

With ``high-availability.keep-running-tasks`` the TaskExecutors keep a job's tasks running when
the AppMaster leader changes. The new leader recovers the job (its JobGraph and latest
completed checkpoint from ZooKeeper) and, for a STREAMING job, its JobMaster starts here instead
of deploying anything:

1. every subtask is RECONCILING; the shell asks each TaskExecutor that holds slots of the job
   (the ResourceManager knows them from their slot reports) to reconnect (``reconnectJob``), and
   hands each report in (``task_executor_reconnected``);
2. once every subtask is reported (or had finished at the latest completed checkpoint: it stays
   FINISHED), or ``resourcemanager.previous-worker.recovery.timeout`` has passed
   (``reconciliation_timed_out``), each subtask's reported attempt is adopted: it runs on
   in its slot, with its attempt id and number, as if this JobMaster had deployed it. An
   attempt counts only when it runs (or finished), sits in the slot its sharing group's other
   members report, and its state includes the latest completed checkpoint (it acknowledged it,
   or restored it);
3. a subtask without such an attempt has failed (``TaskLostError``): the failover strategy
   restarts its region from the latest completed checkpoint, the region's adopted tasks with it;
4. checkpointing goes on with ids from the job's counter in ZooKeeper; the adopted tasks are told
   the latest completed checkpoint is complete (a two-phase sink commits what the old leader's
   lost notification did not), and a checkpoint that was in flight at the failover never
   completes (its acknowledgements are unknown here; the tasks' barriers of the next one
   supersede it).

While reconciling, task updates are held and applied after it; heartbeats are answered with
the slots the TaskExecutor reported (so it frees none of them); split requests get "none yet"
(the enumerator's state is complete only once the sources' reports are in); a report that comes
after the reconciliation names attempts that are not current: they are cancelled and their
slots freed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from yarnflow.am.jobmaster.actions import Action, CancelTask, FreeSlot, NotifyTaskCheckpoint
from yarnflow.am.jobmaster.checkpointing import JobCheckpoints
from yarnflow.am.jobmaster.execution_graph import Execution, ExecutionGraph, ExecutionVertex, LogicalSlot
from yarnflow.am.jobmaster.slot_assignment import SlotAssignment
from yarnflow.am.jobmaster.task_executors import JobTaskExecutors
from yarnflow.am.scheduler.regions import PipelinedRegion, SubtaskId
from yarnflow.common.ids import AllocationID, JobID, ResourceID
from yarnflow.common.messages import ErrorInfo, JobReconnectReport, ReconciledTask, TaskExecutionStateUpdate
from yarnflow.common.states import ExecutionState, JobStatus

__all__ = ["Reconciliation"]

log = logging.getLogger(__name__)

_RUNNING = (ExecutionState.DEPLOYING, ExecutionState.INITIALIZING, ExecutionState.RUNNING)


def _adopted_state(reported: ExecutionState) -> ExecutionState:
    """The state an adopted attempt takes: the one its TaskExecutor reported, but a task still
    deploying there is INITIALIZING (Flink's RECONCILING never goes back to DEPLOYING)."""
    return ExecutionState.INITIALIZING if reported == ExecutionState.DEPLOYING else reported


class _Where:
    """A reported attempt and where it runs."""

    __slots__ = ("task", "slot", "finished")

    def __init__(self, task: ReconciledTask, slot: LogicalSlot, finished: bool) -> None:
        self.task, self.slot, self.finished = task, slot, finished


class Reconciliation:
    # -- what the core provides
    job_id: JobID
    status: JobStatus
    graph: ExecutionGraph
    regions: list[PipelinedRegion]
    slots: SlotAssignment
    task_executors: JobTaskExecutors
    checkpoints: JobCheckpoints | None
    _scheduled: set[int]
    _deployed: set[int]
    _all_running: set[SubtaskId]
    _now: Callable[[], int]
    _emit: Callable[[Action], None]
    _ev: Callable[[SubtaskId], ExecutionVertex]
    _sid: Callable[[Execution], SubtaskId]
    _task_failed: Callable[[Execution, ErrorInfo], None]
    _on_finished: Callable[[Execution], None]
    task_state_changed: Callable[[TaskExecutionStateUpdate], bool]
    _start_checkpointing: Callable[[], None]

    #: called with (adopted execution, its report) for each attempt taken over (the shell books
    #: the source's splits)
    on_attempt_adopted: Callable[[Execution, ReconciledTask], object] | None = None

    def _init_reconciliation(self) -> None:
        self.reconciling = False
        #: resource id -> (rpc address, data address, report)
        self._reports: dict[ResourceID, tuple[str, str, JobReconnectReport]] = {}
        self._held_updates: list[TaskExecutionStateUpdate] = []
        #: what the reconciliation decided (for the status and tests): adopted, restarted subtasks
        self.reconciled: tuple[int, int] | None = None

    def begin_reconciliation(self) -> None:
        self.reconciling = True
        for ex in self.graph.current_executions():
            ex.transition(ExecutionState.RECONCILING)
        log.info("job %s: reconciling: waiting for the TaskExecutors to report the %d subtasks' attempts",
                 self.job_id, len(self.graph.current_executions()))

    def task_executor_reconnected(self, resource_id: ResourceID, rpc_address: str, data_address: str,
                                  report: JobReconnectReport) -> None:
        if not self.reconciling:
            self._reject_late_report(resource_id, rpc_address, report)
            return
        self._reports[resource_id] = (rpc_address, data_address, report)
        self.task_executors.offered_slots(resource_id, rpc_address, self._now())
        log.info("job %s: %s reports %d slots and %d tasks of the job", self.job_id, resource_id, len(report.slots),
                 len(report.tasks))
        if self._everything_reported():
            self.finish_reconciliation()

    def reconciliation_timed_out(self) -> None:
        if self.reconciling:
            log.info("job %s: not every subtask was reported within resourcemanager.previous-worker.recovery"
                     ".timeout", self.job_id)
            self.finish_reconciliation()

    def reported_slots(self, resource_id: ResourceID) -> list[AllocationID]:
        entry = self._reports.get(resource_id)
        return [s.allocation_id for s in entry[2].slots] if entry is not None else []

    def hold_update(self, update: TaskExecutionStateUpdate) -> None:
        self._held_updates.append(update)

    # -- deciding ---------------------------------------------------------------------------------
    def _attempts(self) -> dict[SubtaskId, _Where]:
        """The attempt to adopt per subtask: the latest one reported running or finished.
        Others of the same subtask are cancelled."""
        best: dict[SubtaskId, _Where] = {}
        for resource_id, (rpc, data, report) in sorted(self._reports.items()):
            finals = {u.execution_attempt_id: u for u in report.final_updates}
            for task in report.tasks:
                state = finals[task.execution_attempt_id].state if task.execution_attempt_id in finals else task.state
                if state not in (*_RUNNING, ExecutionState.FINISHED):
                    continue
                sid = SubtaskId(str(task.vertex_id), task.subtask_index)
                where = _Where(task, LogicalSlot(task.allocation_id, resource_id, rpc, data),
                               state == ExecutionState.FINISHED)
                known = best.get(sid)
                if known is None or task.attempt_number > known.task.attempt_number:
                    if known is not None:
                        self._cancel_reported(known)
                    best[sid] = where
                else:
                    self._cancel_reported(where)
        return best

    def _finished_before(self) -> set[SubtaskId]:
        """The subtasks that had finished at the latest completed checkpoint (FLIP-147): no
        TaskExecutor holds them any more, and they need not run again."""
        if self.checkpoints is None or not (latest := self.checkpoints.latest_completed_id()):
            return set()
        return self.checkpoints.finished_in(latest)

    def _everything_reported(self) -> bool:
        reported = {SubtaskId(str(t.vertex_id), t.subtask_index)
                    for _, _, report in self._reports.values() for t in report.tasks} | self._finished_before()
        return all(self._sid(ex) in reported for ex in self.graph.current_executions())

    def _consistent(self, where: _Where, latest: int) -> str:
        """Why the reported attempt cannot be adopted ("" when it can)."""
        task = where.task
        if not where.finished and latest and max(task.last_acknowledged_checkpoint, task.restored_checkpoint) < latest:
            return (f"its state does not include the latest completed checkpoint {latest} (it acknowledged "
                    f"{task.last_acknowledged_checkpoint}, restored {task.restored_checkpoint})")
        return ""

    def finish_reconciliation(self) -> None:
        self.reconciling = False
        if self.status != JobStatus.RUNNING:  # suspended meanwhile: a deposed JobMaster takes nothing over
            self._held_updates = []
            return
        latest = self.checkpoints.latest_completed_id() if self.checkpoints is not None else 0
        found = self._attempts()
        finished_before = self._finished_before()
        known = {self._sid(ex) for ex in self.graph.current_executions()}
        adopted: list[Execution] = []
        lost: list[tuple[Execution, str]] = []
        for sid, stray in sorted(found.items()):
            if sid not in known:  # not a subtask of this job's graph (any more)
                self._cancel_reported(stray)
        held = {(rid, o.allocation_id) for rid, (_, _, report) in self._reports.items() for o in report.slots}
        for region in self.regions:
            groups = self.slots.groups_of(region.region_id)
            for key, members in groups:
                # the group's slot: where its running members run (a finished one's may be freed)
                placed = [found[s] for s in members if s in found
                          and (found[s].slot.resource_id, found[s].slot.allocation_id) in held]
                slot = next((w.slot for w in placed if not w.finished), placed[0].slot if placed else None)
                for s in members:
                    ev = self._ev(s)
                    where = found.get(s)
                    why = "no TaskExecutor reported it running" if where is None else self._consistent(where, latest)
                    if (where is not None and not where.finished and slot is not None
                            and where.slot.allocation_id != slot.allocation_id):
                        why = f"it runs in slot {where.slot.allocation_id}, its sharing group in {slot.allocation_id}"
                    if where is None and s in finished_before:
                        ev.current.transition(ExecutionState.FINISHED)
                        adopted.append(ev.current)
                        continue
                    if where is None:
                        lost.append((ev.current, why))
                        continue
                    ex = self.graph.adopt(ev, where.task.execution_attempt_id, where.task.attempt_number)
                    ex.slot = where.slot if (where.slot.resource_id, where.slot.allocation_id) in held else None
                    self.task_executors.used(where.slot.resource_id, where.slot.rpc_address)
                    ex.transition(ExecutionState.FINISHED if where.finished else _adopted_state(where.task.state))
                    if self.on_attempt_adopted is not None:
                        self.on_attempt_adopted(ex, where.task)
                    if why:
                        lost.append((ex, why))
                    else:
                        adopted.append(ex)
                if slot is not None:
                    self.slots.adopt(region.region_id, key, slot, None)
            self._scheduled.add(region.region_id)
            self._deployed.add(region.region_id)
        self._free_unused_slots(found)
        restarted = len(lost)
        self.reconciled = (len(adopted), restarted)
        log.info("job %s: reconciled: %d subtasks adopted as they run, %d to restart", self.job_id, len(adopted),
                 restarted)
        for ex in adopted:
            sid = self._sid(ex)
            if ex.state in (ExecutionState.RUNNING, ExecutionState.FINISHED):
                self._all_running.add(sid)
            if latest and ex.state in _RUNNING and ex.slot is not None:
                self._emit(NotifyTaskCheckpoint(ex.attempt_id, ex.slot.resource_id, ex.slot.rpc_address, latest,
                                                True))
        self._start_checkpointing()
        for ex in adopted:
            if ex.state == ExecutionState.FINISHED:
                if self.checkpoints is not None:
                    self.checkpoints.task_finished(ex)
                self._on_finished(ex)
        for ex, why in lost:
            if self.status == JobStatus.RUNNING and self.graph.is_current(ex) and not ex.state.is_terminal:
                if ex.slot is not None and ex.state in _RUNNING:  # taken over only to be stopped there
                    self._emit(CancelTask(ex.attempt_id, ex.slot.resource_id, ex.slot.rpc_address))
                self._task_failed(ex, ErrorInfo("TaskLostError", f"{ex.vertex.name} after the change of AppMaster "
                                                                 f"leader: {why}"))
        updates, self._held_updates = self._held_updates, []
        for update in updates:
            self.task_state_changed(update)

    # -- what is not taken over ------------------------------------------------------------------
    def _cancel_reported(self, where: _Where) -> None:
        if not where.finished:
            log.info("job %s: cancelling %s (attempt %d of %s %d), which is not taken over", self.job_id,
                     where.task.execution_attempt_id, where.task.attempt_number, where.task.vertex_id,
                     where.task.subtask_index)
            self._emit(CancelTask(where.task.execution_attempt_id, where.slot.resource_id, where.slot.rpc_address))

    def _free_unused_slots(self, found: dict[SubtaskId, _Where]) -> None:
        used = {s.allocation_id for s in self.slots.pool.slots.values()}
        for resource_id, (rpc, _, report) in sorted(self._reports.items()):
            for offer in report.slots:
                if offer.allocation_id not in used:
                    self._emit(FreeSlot(offer.allocation_id, resource_id, rpc, "not taken over by the new "
                                                                                "leader's JobMaster"))

    def _reject_late_report(self, resource_id: ResourceID, rpc_address: str, report: JobReconnectReport) -> None:
        log.info("job %s: %s reported after the reconciliation: its tasks and slots of the job are given up",
                 self.job_id, resource_id)
        known = self.slots.pool.slots  # (a slot still on its way to this JobMaster is PENDING there)
        for task in report.tasks:
            ex = self.graph.execution(task.execution_attempt_id)
            if ex is None or not self.graph.is_current(ex):
                self._emit(CancelTask(task.execution_attempt_id, resource_id, rpc_address))
        for offer in report.slots:
            if offer.allocation_id not in known:
                self._emit(FreeSlot(offer.allocation_id, resource_id, rpc_address, "reported after the "
                                                                                   "reconciliation"))
