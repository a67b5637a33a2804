"""The JobMaster core: one job's scheduling, slots, failover and task bookkeeping, as a pure
state machine (Flink's DefaultScheduler with its ExecutionSlotAllocator and failure handling).

Events come in as method calls (task state updates, slot offers, deployment outcomes,
TaskExecutor heartbeats and losses, timers, cancel); what must happen outside goes out as
actions (``actions.py``), collected until the shell calls ``drain_actions()``. Time comes from
an injected clock and timers from an injected timer service, so unit tests drive it without
sockets, threads or sleeps.

Scheduling is by pipelined region: a region is deployed once every blocking input it reads is
complete (``RegionProgress``); its subtasks get slots by slot sharing group
(``SlotAssignment``); a failed subtask is handled by ``FailureHandler`` (failover strategy,
restart strategy, failure history). Every state change goes through the transition tables of
``ExecutionState`` / ``JobStatus``; an illegal one raises ``IllegalStateTransition``, which the
shell turns into a visible job failure.

Its parts: ``SlotRequests`` (asking the ResourceManager for slots, their timeout, giving
them back), ``JobTaskExecutors`` (where the job's TaskExecutors are, their heartbeats, the lost
ones), ``JobCheckpoints`` (STREAMING jobs' checkpoints), ``job_metrics`` (the status report)
the ``TaskFailover`` mixin (a failed task's restart: cancel, backoff, new attempts), the
``TaskExecutorEvents`` mixin (heartbeats and losses of the job's TaskExecutors), the
``JobOutcome`` and ``CheckpointEvents`` mixins (how the job ends; the tasks' checkpoint events)
and ``AutoParallelism`` (the adaptive batch scheduler's decisions).

Timeouts (each measured from its own start):
- ``slot.request.timeout`` and ``slot.idle.timeout``: see ``slot_requests.py``;
- ``heartbeat.timeout``: a TaskExecutor holding the job's slots that has not heartbeated to
  this JobMaster for that long is lost to the job;
- cancellation: see ``task_failover.py``.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable

from yarnflow.am.jobmaster.actions import (
    Action,
    CancelSlotRequest,
    CancelTask,
    DeployTask,
    ReleasePartitions,
)
from yarnflow.am.checkpoint.coordinator import CheckpointIDCounter, TimerService
from yarnflow.am.jobmaster.checkpointing import JobCheckpoints, checkpoint_settings
from yarnflow.am.jobmaster.execution_graph import Execution, ExecutionGraph, ExecutionVertex, LogicalSlot
from yarnflow.am.jobmaster.failure_handler import FailureHandler
from yarnflow.am.jobmaster.job_metrics import checkpoint_summary, vertex_statuses
from yarnflow.am.jobmaster.slot_assignment import SlotAssignment
from yarnflow.am.jobmaster.slot_requests import SlotRequests
from yarnflow.am.jobmaster.task_executors import JobTaskExecutors
from yarnflow.am.jobmaster.task_executor_events import TaskExecutorEvents
from yarnflow.am.jobmaster.task_failover import TaskFailover
from yarnflow.am.jobmaster.job_outcome import CheckpointEvents, JobOutcome
from yarnflow.am.jobmaster.reconciliation import Reconciliation
from yarnflow.am.scheduler.failover import make_failover_strategy
from yarnflow.am.jobmaster.auto_parallelism import AutoParallelism
from yarnflow.am.scheduler.region_progress import RegionProgress
from yarnflow.am.scheduler.regions import BlockingExchange, PipelinedRegion, SubtaskId, compute_pipelined_regions
from yarnflow.am.scheduler.restart import make_restart_strategy, max_memory_failures
from yarnflow.common.clock import Clock
from yarnflow.common.config import Configuration, Options
from yarnflow.common.ids import AllocationID, ExecutionAttemptID, JobVertexID, ResourceID
from yarnflow.common.messages import (
    ErrorInfo,
    JobGraph,
    JobStatusInfo,
    SlotOffer,
    TaskExecutionStateUpdate,
)
from yarnflow.common.states import ExchangeMode, ExecutionState, JobStatus

log = logging.getLogger(__name__)

#: the error class of a deployment refused because the checkpoint it restores cannot be read
CHECKPOINT_NOT_READABLE = "CheckpointNotReadableError"
#: the error class of a call whose peer could not be reached (common/errors.py RpcConnectionError)
UNREACHABLE = "RpcConnectionError"


class JobMasterCore(JobOutcome, CheckpointEvents, TaskFailover, TaskExecutorEvents, Reconciliation):
    def __init__(self, job_graph: JobGraph, config: Configuration, address: str, fencing_token: str,
                 storage_dir: str, clock: Clock, timers: TimerService, checkpoint_dir: str = "",
                 checkpoint_ids: CheckpointIDCounter | None = None) -> None:
        self.job_id = job_graph.job_id
        self.job_graph = job_graph
        self.fencing_token = fencing_token
        self.graph = ExecutionGraph(job_graph)
        self.status = JobStatus.INITIALIZING
        self.failure_cause: ErrorInfo | None = None
        self._clock = clock
        self._timers = timers
        self.start_time_ms = clock.now_ms()
        self.end_time_ms = 0
        self.all_running_time_ms = 0
        self._config = config
        self._task_config = config.to_strings()
        self._address = address
        self._storage = storage_dir
        self._heartbeat_interval: int = config[Options.HEARTBEAT_INTERVAL]
        self._heartbeat_timeout: int = config[Options.HEARTBEAT_TIMEOUT]
        self.regions = compute_pipelined_regions(job_graph)
        self._region_of = {s: r for r in self.regions for s in r.subtasks}
        #: vertices whose every output goes to the job's storage dir: their results outlive their
        #: TaskExecutor
        outputs: dict[str, list[ExchangeMode]] = defaultdict(list)
        for e in job_graph.edges:
            outputs[str(e.source_vertex_id)].append(e.exchange_mode)
        self._persistent_output = {v for v, modes in outputs.items()
                                   if all(m == ExchangeMode.BLOCKING_PERSISTENT for m in modes)}
        self.progress = RegionProgress(self.regions)
        self.auto = AutoParallelism(self.graph, config)
        self.slots = SlotAssignment(job_graph, self.regions, streaming=job_graph.runtime_mode != "BATCH")
        self.task_executors = JobTaskExecutors()
        self.requests = SlotRequests(self.job_id, address, fencing_token, config, self.slots, self.task_executors,
                                     clock, timers, self._emit, lambda: self.status, self._slot_request_timed_out)
        # called with (old execution, its new attempt, the checkpoint id the new one restores or 0)
        self.on_attempt_replaced: Callable[[Execution, Execution, int], object] | None = None
        settings = checkpoint_settings(config) if job_graph.runtime_mode != "BATCH" else None
        self.failures = FailureHandler(make_failover_strategy(config[Options.FAILOVER_STRATEGY], job_graph),
                                       make_restart_strategy(self._task_config, checkpointing=settings is not None),
                                       clock, max_memory_failures=max_memory_failures(self._task_config))
        self.checkpoints: JobCheckpoints | None = None
        self._checkpoint_dir = ""
        if settings is not None:
            self.checkpoints = JobCheckpoints(job_graph, self.graph, settings, clock, timers, self._sid,
                                              checkpoint_ids)
            self.checkpoints.on_fail_job = self._checkpoints_failed
            self._checkpoint_dir = checkpoint_dir
        self._out: list[Action] = []
        self._scheduled: set[int] = set()      # regions deployed or waiting for slots
        self._deployed: set[int] = set()       # scheduled regions whose tasks were handed out
        self._waiting_groups: dict[int, set[Hashable]] = {}
        self._restart_pending: set[SubtaskId] = set()
        self._restart_scheduled = False
        self._all_running: set[SubtaskId] = set()
        self._init_reconciliation()

    # -- plumbing -------------------------------------------------------------------------------
    def drain_actions(self) -> list[Action]:
        if self.checkpoints is not None:
            while more := self.checkpoints.drain(self._address_of):
                self._out.extend(more)
        out, self._out = self._out, []
        return out

    def _address_of(self, attempt_id: ExecutionAttemptID) -> tuple[ResourceID, str] | None:
        ex = self.graph.execution(attempt_id)
        if ex is None or not self.graph.is_current(ex) or ex.state.is_terminal or ex.slot is None \
                or not self.task_executors.reachable(ex.slot.resource_id):
            return None
        return ex.slot.resource_id, ex.slot.rpc_address

    def _emit(self, action: Action) -> None:
        self._out.append(action)

    def _now(self) -> int:
        return self._clock.monotonic_ms()

    def _ev(self, s: SubtaskId) -> ExecutionVertex:
        return self.graph.vertices[JobVertexID(s.vertex_id)].subtasks[s.index]

    @staticmethod
    def _sid(ex: Execution) -> SubtaskId:
        return SubtaskId(ex.vertex.job_vertex.vertex_id, ex.vertex.subtask_index)

    def _set_status(self, status: JobStatus) -> None:
        if self.status != status:
            self.status.check_move_to(status, f"job {self.job_id}")
            log.info("job %s (%s) %s -> %s", self.job_graph.name, self.job_id, self.status.name, status.name)
            self.status = status

    @property
    def is_terminal(self) -> bool:
        return self.status.is_globally_terminal

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, reconcile: bool = False) -> None:
        """Schedule the job. When checkpoints recovered from an earlier leader are known
        (``checkpoints.recover``), every subtask starts from the latest of them. ``reconcile``
        (a new leader, a STREAMING job): first take over the tasks the TaskExecutors kept
        running (``reconciliation.py``); only what is not taken over starts again."""
        self._set_status(JobStatus.CREATED)
        self._set_status(JobStatus.RUNNING)
        log.info("job %s (%s): %d subtasks in %d pipelined regions, %s failover, restart %s", self.job_graph.name,
                 self.job_id, len(self.graph.all_vertices()), len(self.regions),
                 self._config[Options.FAILOVER_STRATEGY], self.failures.describe())
        point = self.checkpoints.restore_point() if self.checkpoints is not None else None
        if point is not None and self.checkpoints is not None:
            for ex in self.graph.current_executions():
                ex.restore = self.checkpoints.restore_for(point.checkpoint_id, self._sid(ex))
            self.failures.note_restore(point.checkpoint_id)
            log.info("job %s resumes from checkpoint %d", self.job_id, point.checkpoint_id)
        if reconcile and self.job_graph.runtime_mode != "BATCH":
            self.begin_reconciliation()
        else:
            self._schedule()
            self._start_checkpointing()
        self.requests.start()
        self._timers.schedule(self._heartbeat_interval, self._check_heartbeats)

    def _start_checkpointing(self) -> None:
        if self.checkpoints is not None:
            self.checkpoints.coordinator.start()

    # -- scheduling -----------------------------------------------------------------------------
    def _schedule(self, candidates: Iterable[int] | None = None) -> None:
        """Deploy the regions (all, or the ``candidates`` ids) whose blocking inputs are complete."""
        if self.status != JobStatus.RUNNING:
            return
        regions = self.regions if candidates is None else [self.regions[r] for r in sorted(candidates)]
        for region in regions:
            rid = region.region_id
            if rid in self._scheduled or rid in self.progress.finished or not self.progress.inputs_ready(region):
                continue
            if any(s in self._restart_pending for s in region.subtasks):
                continue
            if self.auto.undecided and self._decide_parallelism(region):
                continue
            self._scheduled.add(rid)
            for s in region.subtasks:
                self._ev(s).current.transition(ExecutionState.SCHEDULED)
            for request in self.slots.acquire_for_region(region, self._now()):
                self.requests.request(request)
            self._deploy_if_ready(region)

    def _decide_parallelism(self, region: PipelinedRegion) -> bool:
        """Decide the parallelism of the region's vertices that wait for it (adaptive batch);
        True when the region itself is left out. (In BATCH jobs every edge is blocking: each
        region is one subtask, so a region is left out whole.)"""
        for ev in self.auto.decide(region):
            left_out = self._region_of[SubtaskId(str(ev.job_vertex.vertex_id), ev.subtask_index)]
            if self.progress.subtask_finished(left_out):
                ready, released = self.progress.mark_finished(left_out)
                for exchange in released:
                    self._release_exchange(exchange)
                self._schedule(ready)
        return all(s in self.auto.retired for s in region.subtasks)

    def _deploy_if_ready(self, region: PipelinedRegion) -> None:
        rid = region.region_id
        if rid in self._deployed:
            return
        groups = self.slots.groups_of(rid)
        waiting = self._waiting_groups.get(rid)
        if waiting is None:
            waiting = self._waiting_groups[rid] = {g for g, _ in groups}
        for g in list(waiting):  # only the groups not seen with a slot yet are looked at
            if self.slots.slot_of(g) is None:
                return
            waiting.discard(g)
        placed = [(self.slots.slot_of(g), members) for g, members in groups]
        self._waiting_groups.pop(rid, None)
        if any(slot is None for slot, _ in placed):  # a slot went away meanwhile: look again later
            return
        self._deployed.add(rid)
        for slot, members in placed:
            for s in members:
                ex = self._ev(s).current
                if ex.state == ExecutionState.SCHEDULED:
                    ex.slot = slot
        for _slot, members in placed:
            for s in members:
                ex = self._ev(s).current
                if ex.state == ExecutionState.SCHEDULED:
                    self._deploy(ex)

    def _deploy(self, ex: Execution) -> None:
        slot = ex.slot
        assert slot is not None
        ex.transition(ExecutionState.DEPLOYING)
        self.task_executors.used(slot.resource_id, slot.rpc_address)
        try:
            tdd = self.graph.deployment_descriptor(ex, self.job_graph.artifact_uri, self.job_graph.artifact_sha256,
                                                   self.fencing_token, self._task_config, self._storage,
                                                   self._checkpoint_dir)
        except LookupError as exc:
            self._task_failed(ex, ErrorInfo.from_exception(exc, f"deploying {ex.vertex.name}"))
            return
        self._emit(DeployTask(ex.attempt_id, slot.resource_id, slot.rpc_address, tdd))

    def deploy_failed(self, attempt_id: ExecutionAttemptID, error: ErrorInfo) -> None:
        """The submit call failed or timed out. The task may still have started on the
        TaskExecutor (a timeout): it is cancelled there, whatever happens to the attempt.

        A TaskExecutor that could not be reached at all (its process is gone: it had offered
        its slots to this job) is lost to the job at once, as after a missed heartbeat: its slots
        are not used again, or every restart until ``heartbeat.timeout`` would deploy there and
        fail again, using up the restart strategy's attempts."""
        ex = self.graph.execution(attempt_id)
        if ex is None:
            return
        if error.error_class == CHECKPOINT_NOT_READABLE and ex.restore is not None and self.checkpoints is not None:
            self.checkpoints.mark_unreadable(ex.restore.checkpoint_id)
            self.failures.global_failure(error)
        if error.error_class == UNREACHABLE and ex.slot is not None and self.graph.is_current(ex):
            self.task_executor_lost(ex.slot.resource_id, f"it could not be reached to deploy {ex.vertex.name} "
                                                         f"({error.message})", unreachable=True)
        if ex.slot is not None and self.task_executors.reachable(ex.slot.resource_id):
            self._emit(CancelTask(ex.attempt_id, ex.slot.resource_id, ex.slot.rpc_address))
        if self.graph.is_current(ex) and not ex.state.is_terminal:
            self._task_failed(ex, error)

    def _checkpoints_failed(self, reason: str, culprits: tuple[ExecutionAttemptID, ...]) -> None:
        """More checkpoints failed in a row than tolerated: as Flink's CheckpointFailureManager,
        a failover the restart strategy governs, not the job's end. The tasks that held the last
        checkpoint up fail (their regions restart: a data link cut between two hosts stalls the
        barriers, and nothing else notices); with none to blame, the job fails."""
        error = ErrorInfo("CheckpointFailureError", reason)
        failing = [ex for a in culprits if (ex := self.graph.execution(a)) is not None
                   and self.graph.is_current(ex) and not ex.state.is_terminal]
        if not failing:
            self.fail_globally(error)
            return
        for ex in failing:
            if ex.slot is not None and self.task_executors.reachable(ex.slot.resource_id):
                self._emit(CancelTask(ex.attempt_id, ex.slot.resource_id, ex.slot.rpc_address))
            self._task_failed(ex, error)

    # -- slots ----------------------------------------------------------------------------------
    def slots_offered(self, resource_id: ResourceID, rpc_address: str, data_address: str,
                      offers: list[SlotOffer]) -> list[SlotOffer]:
        """A TaskExecutor offers slots the ResourceManager allocated to this job; returns the
        ones accepted (the TaskExecutor frees the others)."""
        if self.status.is_globally_terminal or self.status in (JobStatus.FAILING, JobStatus.CANCELLING):
            return []
        if resource_id in self.task_executors.lost:
            # fresh: it registered at the ResourceManager again (a partition healed, say), or,
            # lost by its heartbeats only, it offers a slot the ResourceManager allocated for a
            # request this job still waits for (the partition healed before the ResourceManager
            # missed it, so its registration is the one the job lost; declining would leave the
            # request met at the ResourceManager and empty here). Stale: a slot asked for before
            # the loss, or any offer of one the job could not call (a one-way partition)
            back = resource_id not in self.task_executors.unreachable
            fresh = [o for o in offers if self.task_executors.registered_again(resource_id, o.registration_id)
                     or (back and self.slots.pool.is_pending(o.allocation_id))]
            if not fresh:
                log.info("job %s: declining slots of %s, lost to this job", self.job_id, resource_id)
                return []
            log.info("job %s: TaskExecutor %s, lost before, offers slots for what the job asks now: they are "
                     "taken", self.job_id, resource_id)
            self.task_executors.came_back(resource_id)
            offers = fresh
        self.task_executors.registration(resource_id, offers)
        accepted = [o for o in offers
                    if self.slots.pool.offer(o.allocation_id, resource_id, rpc_address, data_address, o.profile)]
        if accepted:
            self.task_executors.offered_slots(resource_id, rpc_address, self._now())
        regions: set[int] = set()
        for o in accepted:
            regions |= self.slots.regions_of(o.allocation_id)
        self._deploy_ready_regions(regions)
        return accepted

    def _deploy_ready_regions(self, region_ids: Iterable[int]) -> None:
        if self.status != JobStatus.RUNNING:
            return
        for rid in sorted(region_ids):
            if rid in self._scheduled:
                self._deploy_if_ready(self.regions[rid])

    def _release_region_slots(self, region: PipelinedRegion) -> None:
        remember = [(s, ex.slot.allocation_id) for s in region.subtasks
                    if (ex := self._ev(s).current).slot is not None and self.task_executors.reachable(ex.slot.resource_id)]
        for allocation_id in self.slots.release_region(region, self._now(), remember):
            self._emit(CancelSlotRequest(allocation_id))
        self._waiting_groups.pop(region.region_id, None)
        cancelled, moved = self.slots.hand_idle_slots_to_waiting_groups()
        for allocation_id in cancelled:
            self._emit(CancelSlotRequest(allocation_id))
        self._deploy_ready_regions(moved)

    def _slot_request_timed_out(self, allocation_id: AllocationID, error: ErrorInfo) -> None:
        """A slot request was not met in time: the first subtask waiting for it fails."""
        regions = self.slots.regions_of(allocation_id)
        waiting = [self._ev(s).current for rid in sorted(regions) for s in sorted(self.regions[rid].subtasks)
                   if self._ev(s).current.state == ExecutionState.SCHEDULED]
        if waiting:
            self._task_failed(waiting[0], error)

    def allocation_failed(self, allocation_id: AllocationID, reason: str) -> None:
        """The ResourceManager cannot ever meet a request (no slot is that large)."""
        self.fail_globally(ErrorInfo("NoResourceAvailableError", reason))

    def resource_manager_changed(self) -> None:
        """A new ResourceManager leader knows nothing of this job's requests: repeat them."""
        self.requests.ask_again()

    # -- task states ----------------------------------------------------------------------------
    def deploy_succeeded(self, attempt_id: ExecutionAttemptID) -> None:
        log.debug("%s accepted by its TaskExecutor", attempt_id)

    def task_state_changed(self, update: TaskExecutionStateUpdate) -> bool:
        """A task reports its state (directly or in a heartbeat). Stale updates (an old
        attempt, an execution already terminal, a step back) are ignored: False."""
        if self.reconciling:  # applied once the attempts are known
            self.hold_update(update)
            return True
        ex = self.graph.execution(update.execution_attempt_id)
        if ex is None or not self.graph.is_current(ex) or ex.state.is_terminal:
            log.debug("stale update %s for %s ignored", update.state.name, update.execution_attempt_id)
            return False
        ex.records_in, ex.records_out = update.records_in, update.records_out
        ex.metrics = update.metrics or ex.metrics
        target = update.state
        if target == ex.state:
            return False
        if target == ExecutionState.FAILED:
            self._task_failed(ex, update.error or ErrorInfo("UnknownError", "task failed without a cause"))
            return True
        if ex.state == ExecutionState.CANCELING:
            if target in (ExecutionState.CANCELED, ExecutionState.FINISHED):
                # finished while it was being cancelled: CANCELED (Flink's Execution.markFinished)
                ex.transition(ExecutionState.CANCELED)
                self._on_terminal_execution()
                return True
            log.debug("%s: %s while CANCELING ignored", ex.vertex.name, target.name)
            return False
        if target == ExecutionState.CANCELED:  # canceled without being asked to: a failure
            self._task_failed(ex, ErrorInfo("TaskCanceledError", "the task was canceled on its TaskExecutor "
                                                                 "without the JobMaster asking",
                                            location=str(ex.slot.resource_id) if ex.slot else None))
            return True
        if ex.state == ExecutionState.DEPLOYING and target == ExecutionState.RUNNING:
            # its INITIALIZING update was not seen (a heartbeat carries a task's latest state): it passed it
            ex.transition(ExecutionState.INITIALIZING)
        if not ex.state.can_move_to(target):
            log.debug("%s: ignoring %s -> %s", ex.vertex.name, ex.state.name, target.name)
            return False
        ex.transition(target)
        if not self.all_running_time_ms and target in (ExecutionState.RUNNING, ExecutionState.FINISHED):
            self._all_running.add(self._sid(ex))
            if len(self._all_running) == len(self._region_of) - len(self.auto.retired):
                self.all_running_time_ms = self._clock.now_ms()
        if target == ExecutionState.FINISHED:
            if self.checkpoints is not None:
                self.checkpoints.task_finished(ex)
            self._on_finished(ex)
        return True

    def _on_finished(self, ex: Execution) -> None:
        region = self._region_of[self._sid(ex)]
        if not self.progress.subtask_finished(region):
            return
        self._scheduled.discard(region.region_id)
        self._deployed.discard(region.region_id)
        self._release_region_slots(region)
        ready, released = self.progress.mark_finished(region)
        for exchange in released:
            self._release_exchange(exchange)
        if self.progress.all_finished():
            self._finish_job(JobStatus.FINISHED)
            return
        self._schedule(ready)

    def _release_exchange(self, exchange: BlockingExchange) -> None:
        """Every consumer region has finished reading this exchange: release its partitions."""
        by_te: dict[ResourceID, list[str]] = defaultdict(list)
        for s in exchange.producers:
            ex = self._ev(s).current
            if ex.slot is not None and self.task_executors.reachable(ex.slot.resource_id):
                by_te[ex.slot.resource_id].append(str(ex.partition_id(exchange.edge_index)))
        for rid, pids in by_te.items():
            if rid in self.task_executors.address:
                self._emit(ReleasePartitions(rid, self.task_executors.address[rid], tuple(pids)))

    def _result_available(self, s: SubtaskId) -> bool:
        """A finished subtask's output can still be read: its TaskExecutor is reachable and it
        was not released, or it is all in the job's storage dir (BLOCKING_PERSISTENT)."""
        ex = self._ev(s).current
        if ex.state != ExecutionState.FINISHED or self._region_of[s].region_id in self.progress.released:
            return False
        if s.vertex_id in self._persistent_output:
            return True
        return ex.slot is not None and self.task_executors.reachable(ex.slot.resource_id)

    # -- queries --------------------------------------------------------------------------------
    def status_info(self) -> JobStatusInfo:
        checkpoints, latest, counts = checkpoint_summary(self.checkpoints)
        return JobStatusInfo(self.job_id, self.job_graph.name, self.status, self.start_time_ms, self.end_time_ms,
                             vertex_statuses(self.graph), self.failure_cause, self.all_running_time_ms,
                             self.failures.history(), self.failures.describe(), checkpoints, latest,
                             self.failures.restarts, counts, scaling=self.auto.describe())

    def is_current_attempt(self, attempt_id: str) -> bool:
        ex = self.graph.execution(attempt_id)
        return ex is not None and self.graph.is_current(ex)

    def slot_of(self, attempt_id: str) -> LogicalSlot | None:
        ex = self.graph.execution(attempt_id)
        return ex.slot if ex is not None else None
