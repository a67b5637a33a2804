"""JobMaster: runs one job (Flink's JobMaster + DefaultScheduler).

It owns the job's ExecutionGraph on its main thread and schedules it region by region: a
pipelined region is deployed once every blocking input it reads is finished (streaming jobs,
with only pipelined edges, thus deploy everything at once; batch jobs run region after region,
so a job with more subtasks than slots still completes). Slots come from the SlotPool, which
keeps released slots idle for ``slot.idle.timeout`` so restarted tasks go back to them, and
from the ResourceManager.

On a task failure the failover strategy (full / region) names the subtasks to restart and
the restart strategy decides whether and when; every failure goes into the failure history.
The job ends FINISHED, CANCELED, or FAILED with its root cause.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Hashable

from yarnflow.am.jobmaster.execution_graph import Execution, ExecutionGraph, LogicalSlot, region_sharing_groups
from yarnflow.am.jobmaster.slotpool.slot_pool import PoolSlotState, SlotPool
from yarnflow.am.jobmaster.splits import SplitEnumerator
from yarnflow.am.resourcemanager.resource_manager import ResourceManager
from yarnflow.am.resourcemanager.slotmanager.slot_manager import SlotRequest
from yarnflow.am.scheduler.failover import PartitionUnavailable, make_failover_strategy
from yarnflow.am.scheduler.regions import PipelinedRegion, SubtaskId, compute_pipelined_regions, regions_by_subtask
from yarnflow.am.scheduler.restart import make_restart_strategy
from yarnflow.common.clock import SystemClock
from yarnflow.common.collect import list_collected
from yarnflow.common.config import Configuration, Options
from yarnflow.common.errors import FencingTokenError, NotFoundError, RpcError
from yarnflow.common.ids import AllocationID, JobVertexID, ResourceID
from yarnflow.common.messages import (
    ErrorInfo,
    FailureEntry,
    JobGraph,
    JobResult,
    JobStatusInfo,
    ResourceProfile,
    SlotOffer,
    SplitResponse,
    TaskExecutionStateUpdate,
    VertexStatus,
)
from yarnflow.common.rpc.endpoint import MainThreadExecutor
from yarnflow.common.rpc.gateways import RemoteTaskExecutorGateway
from yarnflow.common.states import ExecutionState, JobStatus
from yarnflow.common.artifacts import ArtifactCache

log = logging.getLogger(__name__)

CANCEL_TIMEOUT_MS = 15_000
_PARTITION_RE = re.compile(r"partition ([0-9a-f]+)\.([0-9a-f]+)\.(\d+)")
_CLOCK = SystemClock()


class JobMaster:
    def __init__(self, job_graph: JobGraph, config: Configuration, rm: ResourceManager, address: str,
                 job_storage_dir: str, on_terminal: Callable[[JobMaster], None],
                 artifacts: ArtifactCache | None = None) -> None:
        self.job_id = job_graph.job_id
        self.job_graph = job_graph
        self.fencing_token = uuid.uuid4().hex
        self.graph = ExecutionGraph(job_graph)
        self.status = JobStatus.INITIALIZING
        self.failure_cause: ErrorInfo | None = None
        self.failure_history: list[FailureEntry] = []
        self.start_time_ms = _CLOCK.now_ms()
        self.end_time_ms = 0
        self.all_running_time_ms = 0
        self.result: JobResult | None = None
        self.splits = SplitEnumerator.from_artifact(artifacts, job_graph.artifact_uri, job_graph.artifact_sha256) \
            if artifacts is not None else None
        job_config = config.with_overrides(job_graph.config)
        self._config = job_config
        self._task_config = job_config.to_strings()
        self._rm = rm
        self._address = address
        self._storage = job_storage_dir
        self._on_terminal = on_terminal
        self._rpc_timeout = config[Options.RPC_TIMEOUT]
        self._idle_timeout = job_config[Options.SLOT_IDLE_TIMEOUT]
        self._main = MainThreadExecutor(f"jobmaster-{self.job_id[:8]}")
        self._io = ThreadPoolExecutor(4, thread_name_prefix=f"jm-io-{self.job_id[:8]}")
        self._gateways: dict[ResourceID, RemoteTaskExecutorGateway] = {}
        # scheduling state
        self.regions = compute_pipelined_regions(job_graph)
        self._region_of = regions_by_subtask(self.regions)
        self._failover = make_failover_strategy(job_config[Options.FAILOVER_STRATEGY], job_graph)
        self.restart_strategy = make_restart_strategy(job_config.to_strings())
        self.pool = SlotPool()
        self._scheduled: set[int] = set()            # region ids deployed or waiting for slots
        self._group_slots: dict[Hashable, AllocationID] = {}
        self._region_groups: dict[int, list[tuple[Hashable, list[SubtaskId]]]] = {
            r.region_id: self._sharing_groups(r) for r in self.regions}
        self._previous_slot: dict[SubtaskId, AllocationID] = {}
        self._lost: set[ResourceID] = set()
        self._seen_tes: dict[ResourceID, str] = {}  # every TaskExecutor that ran a task (rpc address)
        self._restart_pending: set[SubtaskId] = set()
        self._restart_scheduled = False
        self._released_regions: set[int] = set()     # regions whose blocking outputs were released
        self._waiting_groups: dict[int, set[Hashable]] = {}  # region id -> groups without a slot yet
        self._deployed: set[int] = set()  # scheduled regions whose tasks were handed out
        # counters per blocking exchange (a group of producer regions read by a group of consumer
        # regions), so a region finishing costs O(its exchanges), even for all-to-all edges
        self._finished_regions: set[int] = set()
        self._done_in_region = {r.region_id: 0 for r in self.regions}  # FINISHED subtasks per region
        exchanges = {id(x): x for r in self.regions for x in r.produced_exchanges}
        self._x_producers_left = {k: len({p.region_id for p in x.producer_regions}) for k, x in exchanges.items()}
        self._x_consumers_left = {k: len({c.region_id for c in x.consumer_regions}) for k, x in exchanges.items()}
        self._inputs_waiting = {r.region_id: len({id(x) for x in r.consumed_exchanges
                                                  if r not in x.producer_regions}) for r in self.regions}
        self._all_running: set[SubtaskId] = set()  # subtasks whose current attempt ran

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._main.start()
        self._rm.register_job_master(self.job_id, self)
        self._main.execute(self._start_scheduling)

    def _start_scheduling(self) -> None:
        self._set_status(JobStatus.CREATED)
        self._set_status(JobStatus.RUNNING)
        log.info("job %s (%s): %d subtasks in %d pipelined regions, %s failover, restart %s", self.job_graph.name,
                 self.job_id, len(self.graph.all_vertices()), len(self.regions),
                 self._config[Options.FAILOVER_STRATEGY], self.restart_strategy.describe())
        self._schedule()
        self._rm_token = self._rm.fencing_token
        self._main.schedule(self._config[Options.HEARTBEAT_INTERVAL], self._check_resource_manager)
        self._main.schedule(max(1000, min(self._idle_timeout, 10_000)), self._check_idle_slots)
        self._main.schedule(self._config[Options.SLOT_REQUEST_TIMEOUT], self._check_slot_timeout)

    def stop(self) -> None:
        self._main.stop()
        self._io.shutdown(wait=False, cancel_futures=True)
        for gw in self._gateways.values():
            gw.close()

    def _set_status(self, status: JobStatus) -> None:
        if self.status != status:
            self.status.check_move_to(status, f"job {self.job_id}")
            log.info("job %s (%s) %s -> %s", self.job_graph.name, self.job_id, self.status.name, status.name)
            self.status = status

    # -- helpers ----------------------------------------------------------------------------
    def _ev(self, s: SubtaskId) -> Any:
        return self.graph.vertices[JobVertexID(s.vertex_id)].subtasks[s.index]

    def _sid(self, ex: Execution) -> SubtaskId:
        return SubtaskId(ex.vertex.job_vertex.vertex_id, ex.vertex.subtask_index)

    def _sharing_groups(self, region: PipelinedRegion) -> list[tuple[Hashable, list[SubtaskId]]]:
        return region_sharing_groups(self.job_graph, region)

    def _profile(self, members: list[SubtaskId]) -> ResourceProfile:
        cpu = mem = 0.0
        for s in members:
            res = self.job_graph.vertex(s.vertex_id).resources
            cpu, mem = cpu + res.cpu_cores, mem + res.memory_mb
        return ResourceProfile(cpu, int(mem))

    def _gateway(self, slot: LogicalSlot) -> RemoteTaskExecutorGateway:
        gw = self._gateways.get(slot.resource_id)
        if gw is None:
            gw = self._gateways[slot.resource_id] = RemoteTaskExecutorGateway(slot.rpc_address, self._rpc_timeout)
        return gw

    def _region_finished(self, region: PipelinedRegion) -> bool:
        return region.region_id in self._finished_regions

    def _mark_finished(self, region: PipelinedRegion) -> list[int]:
        """Book a finished region; returns consumer regions whose inputs are now all there."""
        self._finished_regions.add(region.region_id)
        ready = []
        for x in region.produced_exchanges:
            self._x_producers_left[id(x)] -= 1
            if self._x_producers_left[id(x)] == 0:
                for c in x.consumer_regions:
                    if c is not region:
                        self._inputs_waiting[c.region_id] -= 1
                        if self._inputs_waiting[c.region_id] == 0:
                            ready.append(c.region_id)
        for x in region.consumed_exchanges:
            if region in x.producer_regions:
                continue
            self._x_consumers_left[id(x)] -= 1
            if self._x_consumers_left[id(x)] == 0:
                self._release_exchange(x)
        return ready

    def _mark_unfinished(self, region: PipelinedRegion) -> None:
        rid = region.region_id
        self._done_in_region[rid] = 0
        if rid not in self._finished_regions:
            return
        self._finished_regions.discard(rid)
        for x in region.produced_exchanges:
            if self._x_producers_left[id(x)] == 0:
                for c in x.consumer_regions:
                    if c is not region:
                        self._inputs_waiting[c.region_id] += 1
            self._x_producers_left[id(x)] += 1
        for x in region.consumed_exchanges:
            if region not in x.producer_regions:
                self._x_consumers_left[id(x)] += 1

    def _result_available(self, s: SubtaskId) -> bool:
        ex = self._ev(s).current
        return ex.state == ExecutionState.FINISHED and ex.slot is not None and ex.slot.resource_id not in self._lost \
            and self._region_of[s].region_id not in self._released_regions

    # -- scheduling -------------------------------------------------------------------------
    def _schedule(self, candidates: Any = None) -> None:
        """Deploy the regions (all, or the ``candidates`` ids) whose blocking inputs are all
        finished."""
        if self.status != JobStatus.RUNNING:
            return
        for region in (self.regions if candidates is None else (self.regions[r] for r in sorted(candidates))):
            if region.region_id in self._scheduled or self._region_finished(region):
                continue
            if self._inputs_waiting[region.region_id]:
                continue
            if any(s in self._restart_pending for s in region.subtasks):
                continue
            self._scheduled.add(region.region_id)
            for group, members in self._region_groups[region.region_id]:
                preferred = next((self._previous_slot[s] for s in members if s in self._previous_slot), None)
                allocation_id, ready = self.pool.acquire(group, preferred)
                self._group_slots[group] = allocation_id
                for s in members:
                    self._ev(s).current.transition(ExecutionState.SCHEDULED)
                if not ready:
                    self._rm.request_slot(SlotRequest(self.job_id, allocation_id, self._profile(members),
                                                      self._address, self.fencing_token))
            self._deploy_if_ready(region)

    def _slot_of_group(self, group: Hashable) -> LogicalSlot | None:
        allocation_id = self._group_slots.get(group)
        slot = self.pool.slots.get(allocation_id) if allocation_id else None
        if slot is None or slot.state != PoolSlotState.IN_USE or slot.resource_id is None:
            return None
        return LogicalSlot(slot.allocation_id, slot.resource_id, slot.rpc_address, slot.data_address)

    def _deploy_if_ready(self, region: PipelinedRegion) -> None:
        if region.region_id in self._deployed:
            return
        groups = self._region_groups[region.region_id]
        waiting = self._waiting_groups.get(region.region_id)
        if waiting is None:
            waiting = self._waiting_groups[region.region_id] = {g for g, _ in groups}
        for g in list(waiting):  # only the groups not seen with a slot yet are looked at
            if self._slot_of_group(g) is not None:
                waiting.discard(g)
            else:
                return
        slots = [(self._slot_of_group(g), members) for g, members in groups]
        if any(slot is None for slot, _ in slots):  # a slot went away meanwhile: look again next time
            self._waiting_groups.pop(region.region_id, None)
            return
        self._waiting_groups.pop(region.region_id, None)
        self._deployed.add(region.region_id)
        for slot, members in slots:
            for s in members:
                ex = self._ev(s).current
                if ex.state == ExecutionState.SCHEDULED:
                    ex.slot = slot
        for _slot, members in slots:
            for s in members:
                ex = self._ev(s).current
                if ex.state == ExecutionState.SCHEDULED:
                    self._deploy(ex)

    def _deploy(self, ex: Execution) -> None:
        assert ex.slot is not None
        ex.transition(ExecutionState.DEPLOYING)
        self._seen_tes[ex.slot.resource_id] = ex.slot.rpc_address
        try:
            tdd = self.graph.deployment_descriptor(ex, self.job_graph.artifact_uri, self.job_graph.artifact_sha256,
                                                   self.fencing_token, self._task_config, self._storage)
        except LookupError as exc:
            self._task_failed(ex, ErrorInfo.from_exception(exc, f"deploying {ex.vertex.name}"))
            return
        gw = self._gateway(ex.slot)

        def submit() -> None:
            try:
                gw.submit_task(self.fencing_token, tdd)
            except RpcError as exc:
                self._main.execute(self._on_deploy_failed, ex, exc)

        self._io.submit(submit)

    def _on_deploy_failed(self, ex: Execution, exc: RpcError) -> None:
        if self.graph.is_current(ex) and not ex.state.is_terminal:
            self._task_failed(ex, ErrorInfo.from_exception(exc, f"deploying {ex.vertex.name}"))

    # -- slots ------------------------------------------------------------------------------
    def offer_slots(self, token: str, resource_id: ResourceID, offers: list[SlotOffer]) -> list[SlotOffer]:
        info = self._rm.task_executor_info(resource_id)
        return self._main.call(self._offer_slots, token, resource_id, info, offers)

    def _offer_slots(self, token: str, resource_id: ResourceID, info: Any, offers: list[SlotOffer]) -> list[SlotOffer]:
        if token != self.fencing_token:
            raise FencingTokenError(f"slot offer for job {self.job_id} with a stale JobMaster token")
        if info is None or self.status.is_globally_terminal or self.status in (JobStatus.FAILING,
                                                                                JobStatus.CANCELLING):
            return []
        accepted = [o for o in offers
                    if self.pool.offer(o.allocation_id, resource_id, info.rpc_address, info.data_address)]
        regions = {owner[0] for o in accepted if isinstance(owner := self.pool.owner_of(o.allocation_id), tuple)}
        if regions:
            self._main.execute(self._deploy_ready_regions, regions)
        return accepted

    def _deploy_ready_regions(self, region_ids: set[int] | None = None) -> None:
        if self.status != JobStatus.RUNNING:
            return
        for rid in sorted(region_ids if region_ids is not None else self._scheduled - self._deployed):
            if rid in self._scheduled:
                self._deploy_if_ready(self.regions[rid])

    def _release_region_slots(self, region: PipelinedRegion) -> None:
        now = _CLOCK.monotonic_ms()
        for group, _ in self._region_groups[region.region_id]:
            allocation_id = self._group_slots.pop(group, None)
            if allocation_id is not None and self.pool.release(allocation_id, now):
                self._rm.cancel_slot_request(allocation_id)
        self._hand_idle_slots_to_waiting_groups()

    def _hand_idle_slots_to_waiting_groups(self) -> None:
        """A group still waiting for the RM takes an idle slot instead (and the RM request is
        cancelled), so slots freed by finished regions are reused at once."""
        idle = self.pool.idle_count()
        if not idle:
            return
        waiting = []
        for s in self.pool.pending():  # as many as there are idle slots
            if s.owner is not None and self._group_slots.get(s.owner) == s.allocation_id:
                waiting.append((s.owner, s.allocation_id))
                if len(waiting) == idle:
                    break
        moved: set[int] = set()
        for group, pending in waiting:
            self.pool.release(pending, 0)
            self._rm.cancel_slot_request(pending)
            allocation_id, _ = self.pool.acquire(group)
            self._group_slots[group] = allocation_id
            if isinstance(group, tuple):
                moved.add(group[0])
        if moved:
            self._deploy_ready_regions(moved)

    def _check_resource_manager(self) -> None:
        """A new ResourceManager leader knows nothing of this job: register again and repeat
        the slot requests still waiting (Flink's JobMaster reconnecting to the RM)."""
        if self.status.is_globally_terminal:
            return
        token = self._rm.fencing_token
        if token != self._rm_token:
            self._rm_token = token
            pending = self.pool.in_state(PoolSlotState.PENDING)
            log.info("job %s: the ResourceManager changed; reconnecting and asking again for %d slots",
                     self.job_id, len(pending))
            self._rm.register_job_master(self.job_id, self)
            by_alloc = {a: g for g, a in self._group_slots.items()}
            for slot in pending:
                group = by_alloc.get(slot.allocation_id)
                members = next((m for g, m in self._region_groups.get(group[0], []) if g == group), []) \
                    if isinstance(group, tuple) else []
                self._rm.request_slot(SlotRequest(self.job_id, slot.allocation_id, self._profile(members),
                                                  self._address, self.fencing_token))
        self._main.schedule(self._config[Options.HEARTBEAT_INTERVAL], self._check_resource_manager)

    def _check_idle_slots(self) -> None:
        for slot in self.pool.expired(_CLOCK.monotonic_ms(), self._idle_timeout):
            self._free_slot(slot.allocation_id, slot.resource_id, slot.rpc_address, "idle")
        if not self.status.is_globally_terminal:
            self._main.schedule(max(1000, min(self._idle_timeout, 10_000)), self._check_idle_slots)

    def _free_slot(self, allocation_id: AllocationID, resource_id: ResourceID | None, rpc_address: str,
                   why: str) -> None:
        self._rm.free_allocation(allocation_id)
        if resource_id is None or resource_id in self._lost:
            return
        gw = self._gateway(LogicalSlot(allocation_id, resource_id, rpc_address, ""))

        def call() -> None:
            try:
                gw.free_slot(self.fencing_token, allocation_id, f"job {self.job_id}: {why}")
            except RpcError as exc:
                log.debug("freeing %s: %s", allocation_id, exc)

        self._io.submit(call)

    def _check_slot_timeout(self) -> None:
        waiting = self.pool.in_state(PoolSlotState.PENDING)
        running = any(ex.state in (ExecutionState.DEPLOYING, ExecutionState.INITIALIZING, ExecutionState.RUNNING)
                      for ex in self.graph.current_executions())
        if waiting and not running and self.status == JobStatus.RUNNING:
            self._fail(ErrorInfo("NoResourceAvailableError",
                                 f"{len(waiting)} slots did not come within slot.request.timeout "
                                 f"({self._config[Options.SLOT_REQUEST_TIMEOUT]} ms) and no task was running"))
        elif not self.status.is_globally_terminal:
            self._main.schedule(self._config[Options.SLOT_REQUEST_TIMEOUT], self._check_slot_timeout)

    def on_allocation_failed(self, allocation_id: AllocationID, reason: str) -> None:
        self._main.execute(self._fail, ErrorInfo("NoResourceAvailableError", reason))

    # -- queries ----------------------------------------------------------------------------
    def status_info(self) -> JobStatusInfo:
        return self._main.call(self._status_info)

    def _status_info(self) -> JobStatusInfo:
        statuses = []
        for vid, ejv in self.graph.vertices.items():
            counts: dict[ExecutionState, int] = {}
            for ev in ejv.subtasks:
                counts[ev.current.state] = counts.get(ev.current.state, 0) + 1
            statuses.append(VertexStatus(vid, ejv.job_vertex.name, ejv.job_vertex.parallelism, counts,
                                         [ev.current.attempt_number for ev in ejv.subtasks],
                                         [str(ev.current.slot.resource_id) if ev.current.slot else ""
                                          for ev in ejv.subtasks]))
        return JobStatusInfo(self.job_id, self.job_graph.name, self.status, self.start_time_ms, self.end_time_ms,
                             statuses, self.failure_cause, self.all_running_time_ms, list(self.failure_history),
                             self.restart_strategy.describe())

    def request_split(self, token: str, vertex_id: str, subtask_index: int, attempt_id: str) -> SplitResponse:
        if token != self.fencing_token:
            raise FencingTokenError("split request with a stale JobMaster token")
        ex = self.graph.execution(attempt_id)
        if ex is None or not self.graph.is_current(ex) or self.splits is None:
            raise NotFoundError(f"no current execution {attempt_id} in job {self.job_id}")
        return self.splits.request(vertex_id, subtask_index, attempt_id)

    # -- task state -------------------------------------------------------------------------
    def update_task_execution_state(self, token: str, update: TaskExecutionStateUpdate) -> bool:
        return self._main.call(self._update_state, token, update)

    def _update_state(self, token: str, update: TaskExecutionStateUpdate) -> bool:
        if token != self.fencing_token:
            raise FencingTokenError("task state update with a stale JobMaster token")
        ex = self.graph.execution(update.execution_attempt_id)
        if ex is None or not self.graph.is_current(ex) or ex.state.is_terminal:
            log.debug("stale update %s for %s ignored", update.state.name, update.execution_attempt_id)
            return False
        ex.records_in, ex.records_out = update.records_in, update.records_out
        target = update.state
        if target == ExecutionState.FAILED:
            self._task_failed(ex, update.error or ErrorInfo("UnknownError", "task failed without a cause"))
            return True
        if target == ExecutionState.CANCELED or ex.state == ExecutionState.CANCELING:
            if target.is_terminal:
                ex.state = ExecutionState.CANCELED if target != ExecutionState.FINISHED else target
                self._on_terminal_execution(ex)
            return True
        if not ex.state.can_move_to(target):
            log.debug("%s: ignoring %s -> %s", ex.vertex.name, ex.state.name, target.name)
            return False
        ex.transition(target)
        if not self.all_running_time_ms and target in (ExecutionState.RUNNING, ExecutionState.FINISHED):
            self._all_running.add(self._sid(ex))
            if len(self._all_running) == len(self._region_of):
                self.all_running_time_ms = _CLOCK.now_ms()
        if target == ExecutionState.FINISHED:
            self._on_finished(ex)
        return True

    def _on_finished(self, ex: Execution) -> None:
        region = self._region_of[self._sid(ex)]
        self._done_in_region[region.region_id] += 1
        if self._done_in_region[region.region_id] < len(region.subtasks):
            return
        self._release_region_slots(region)
        self._scheduled.discard(region.region_id)
        self._deployed.discard(region.region_id)
        ready = self._mark_finished(region)
        if len(self._finished_regions) == len(self.regions):
            self._finish_job(JobStatus.FINISHED)
            return
        self._schedule(ready)

    def _release_exchange(self, exchange: Any) -> None:
        """Every consumer region has finished reading this exchange: release its partitions."""
        by_te: dict[ResourceID, list[str]] = defaultdict(list)
        for s in exchange.producers:
            ex = self._ev(s).current
            if ex.slot is None or ex.slot.resource_id in self._lost:
                continue
            by_te[ex.slot.resource_id].append(str(ex.partition_id(exchange.edge_index)))
        for region in exchange.producer_regions:
            if all(self._x_consumers_left[id(x)] == 0 for x in region.produced_exchanges):
                self._released_regions.add(region.region_id)
        for rid, pids in by_te.items():
            self._release_partitions(rid, pids)

    def _release_partitions(self, resource_id: ResourceID, partition_ids: list[str]) -> None:
        address = self._seen_tes.get(resource_id)
        if address is None or resource_id in self._lost:
            return
        gw = self._gateway(LogicalSlot(AllocationID("none"), resource_id, address, ""))

        def call() -> None:
            try:
                gw.release_partitions(self.job_id, partition_ids)
            except RpcError as exc:
                log.debug("releasing partitions on %s: %s", resource_id, exc)

        self._io.submit(call)

    def on_task_executor_lost(self, resource_id: ResourceID, reason: str) -> None:
        self._main.execute(self._task_executor_lost, resource_id, reason)

    def _task_executor_lost(self, resource_id: ResourceID, reason: str) -> None:
        self._lost.add(resource_id)
        lost_slots = self.pool.lost(resource_id)
        gw = self._gateways.pop(resource_id, None)
        if gw is not None:
            gw.close()
        error = ErrorInfo("TaskExecutorLostError", f"TaskExecutor {resource_id} was lost: {reason}",
                          location=f"TaskExecutor {resource_id}")
        affected = [ex for ex in self.graph.current_executions()
                    if ex.slot is not None and ex.slot.resource_id == resource_id and not ex.state.is_terminal]
        for ex in affected:
            if not ex.state.is_terminal:  # an earlier failure's restart may have settled it
                self._task_failed(ex, error)
        if lost_slots and not affected:
            log.info("job %s: lost %d idle slots on %s", self.job_id, len(lost_slots), resource_id)
        # groups whose slot vanished before deployment ask again
        for group, allocation_id in list(self._group_slots.items()):
            if allocation_id in {s.allocation_id for s in lost_slots}:
                del self._group_slots[group]
        self._reacquire_missing_groups()

    def _reacquire_missing_groups(self) -> None:
        if self.status != JobStatus.RUNNING:
            return
        for region in self.regions:
            if region.region_id not in self._scheduled:
                continue
            for group, members in self._region_groups[region.region_id]:
                if group in self._group_slots:
                    continue
                if not all(self._ev(s).current.state == ExecutionState.SCHEDULED for s in members):
                    continue
                allocation_id, ready = self.pool.acquire(group)
                self._group_slots[group] = allocation_id
                if not ready:
                    self._rm.request_slot(SlotRequest(self.job_id, allocation_id, self._profile(members),
                                                      self._address, self.fencing_token))
            self._deploy_if_ready(region)

    # -- failover ---------------------------------------------------------------------------
    def _cause_of(self, error: ErrorInfo) -> PartitionUnavailable | None:
        """A consumer that could not read a blocking partition names it; its producer's result
        is then known to be unavailable."""
        text = f"{error.message}\n{error.traceback}"
        m = _PARTITION_RE.search(text)
        if not m or error.error_class not in ("PartitionNotFoundError", "RpcConnectionError",
                                              "PartitionReleasedError"):
            return None
        producer = self.graph.execution(m.group(2))
        if producer is None:
            return None
        return PartitionUnavailable(self._sid(producer), error.message)

    def _task_failed(self, ex: Execution, error: ErrorInfo) -> None:
        if ex.state.is_terminal:
            return
        was_canceling = ex.state == ExecutionState.CANCELING
        ex.failure = error
        ex.state = ExecutionState.FAILED
        sid = self._sid(ex)
        if was_canceling or sid in self._restart_pending or self.status != JobStatus.RUNNING:
            self._on_terminal_execution(ex)  # a consequence of a failover or cancel under way
            return
        log.info("job %s: %s failed: %s", self.job_id, ex.vertex.name, error.describe())
        now = _CLOCK.now_ms()
        cause = self._cause_of(error)
        self.restart_strategy.notify_failure(_CLOCK.monotonic_ms())
        if not self.restart_strategy.can_restart():
            self.failure_history.append(FailureEntry(now, ex.vertex.name, error, 0))
            self._fail(error)
            return
        to_restart = self._failover.tasks_to_restart(
            sid, cause, lambda s: self._ev(s).current.state == ExecutionState.FINISHED,
            lambda s: self._result_available(s) and not (cause is not None and cause.producer == s))
        self.failure_history.append(FailureEntry(now, ex.vertex.name, error, len(to_restart)))
        log.info("job %s: restarting %d subtasks (%s)", self.job_id, len(to_restart), self.restart_strategy.describe())
        if len(to_restart) == len(self.graph.all_vertices()):
            self._set_status(JobStatus.RESTARTING)
        self._restart_pending |= to_restart
        for s in to_restart:
            self._cancel_execution(self._ev(s).current)
        self._maybe_restart()

    def _on_terminal_execution(self, ex: Execution) -> None:
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
        self._main.schedule(self.restart_strategy.backoff_ms(), lambda: self._restart(pending))

    def _restart(self, subtasks: set[SubtaskId]) -> None:
        self._restart_scheduled = False
        if self.status not in (JobStatus.RUNNING, JobStatus.RESTARTING):
            return
        regions = {self._region_of[s].region_id: self._region_of[s] for s in subtasks}
        for region in regions.values():
            self._release_region_slots(region)
            self._scheduled.discard(region.region_id)
            self._released_regions.discard(region.region_id)
            self._deployed.discard(region.region_id)
            self._mark_unfinished(region)
        for s in subtasks:
            ev = self._ev(s)
            old = ev.current
            if old.slot is not None and old.slot.resource_id not in self._lost:
                self._previous_slot[s] = old.slot.allocation_id
            if self.splits is not None:  # a replaced attempt's splits are read again by the new one
                self.splits.return_splits(old.attempt_id)
            self.graph.new_attempt(ev)
            self._all_running.discard(s)
            self._restart_pending.discard(s)
        if self.status == JobStatus.RESTARTING:
            self._set_status(JobStatus.RUNNING)
        log.info("job %s: restarted %d subtasks", self.job_id, len(subtasks))
        self._schedule(set(regions))
        self._maybe_restart()  # failures that came during the backoff

    def _cancel_execution(self, ex: Execution) -> None:
        if ex.state.is_terminal:
            return
        if ex.state in (ExecutionState.CREATED, ExecutionState.SCHEDULED) or ex.slot is None \
                or ex.slot.resource_id in self._lost:
            ex.state = ExecutionState.CANCELED
            return
        ex.state = ExecutionState.CANCELING
        gw = self._gateway(ex.slot)

        def cancel() -> None:
            try:
                gw.cancel_task(self.fencing_token, ex.attempt_id)
            except RpcError as exc:
                log.info("cancelling %s failed (%s): counting it as canceled", ex.vertex.name, exc)
                self._main.execute(self._force_canceled, ex)

        self._io.submit(cancel)
        self._main.schedule(CANCEL_TIMEOUT_MS, lambda: self._force_canceled(ex))

    def _force_canceled(self, ex: Execution) -> None:
        if not ex.state.is_terminal and self.graph.is_current(ex):
            log.warning("%s did not confirm its cancellation in time", ex.vertex.name)
            ex.state = ExecutionState.CANCELED
            self._on_terminal_execution(ex)

    # -- job outcome ------------------------------------------------------------------------
    def cancel(self) -> None:
        self._main.execute(self._cancel)

    def _cancel(self) -> None:
        if self.status.is_globally_terminal or self.status in (JobStatus.CANCELLING, JobStatus.FAILING):
            return
        self._set_status(JobStatus.CANCELLING)
        self._restart_pending.clear()
        for ex in self.graph.current_executions():
            self._cancel_execution(ex)
        self._check_job()

    def _fail(self, cause: ErrorInfo) -> None:
        if self.status not in (JobStatus.RUNNING, JobStatus.CREATED, JobStatus.RESTARTING):
            return
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
        self.end_time_ms = _CLOCK.now_ms()
        for slot in self.pool.all():
            if slot.state == PoolSlotState.PENDING:
                self._rm.cancel_slot_request(slot.allocation_id)
                self._rm.free_allocation(slot.allocation_id)
            else:
                self._free_slot(slot.allocation_id, slot.resource_id, slot.rpc_address, f"ended {status.name}")
            self.pool.remove(slot.allocation_id)
        for rid in list(self._seen_tes):
            self._release_partitions(rid, [])
        self._rm.unregister_job_master(self.job_id)
        collected = self._collected() if status == JobStatus.FINISHED else {}
        self.result = JobResult(self.job_id, status, self.start_time_ms, self.end_time_ms, self.failure_cause,
                                collected)
        log.info("job %s (%s) ended %s after %.1f s%s", self.job_graph.name, self.job_id, status.name,
                 (self.end_time_ms - self.start_time_ms) / 1000,
                 f": {self.failure_cause.describe()}" if self.failure_cause else "")
        self._on_terminal(self)

    def _collected(self) -> dict[str, list[str]]:
        return list_collected(self._storage)
