"""JobMaster: runs one job. It owns the job's ExecutionGraph on its main thread, asks the
ResourceManager for one slot per execution slot sharing group, accepts the TaskExecutors'
slot offers, deploys every subtask once all slots are there (streaming: eager scheduling),
follows task state updates, and ends the job FINISHED, FAILED (with its root cause) or
CANCELED. There is no restart yet: the first failure fails the job (restart-strategy none).
"""

from __future__ import annotations

import logging
import posixpath
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import fsspec

from yarnflow.am.jobmaster.splits import SplitEnumerator
from yarnflow.worker.artifacts import ArtifactCache
from yarnflow.am.jobmaster.execution_graph import Execution, ExecutionGraph, LogicalSlot, slot_sharing_groups
from yarnflow.am.resourcemanager.resource_manager import ResourceManager
from yarnflow.am.resourcemanager.slotmanager.slot_manager import SlotRequest
from yarnflow.common.clock import SystemClock
from yarnflow.common.config import Configuration, Options
from yarnflow.common.errors import FencingTokenError, NotFoundError, RpcError
from yarnflow.common.ids import AllocationID, JobVertexID, ResourceID
from yarnflow.common.messages import (
    ErrorInfo,
    JobGraph,
    JobResult,
    JobStatusInfo,
    ResourceProfile,
    SlotOffer,
    SplitResponse,
    TaskExecutionStateUpdate,
)
from yarnflow.common.rpc.endpoint import MainThreadExecutor
from yarnflow.common.rpc.gateways import RemoteTaskExecutorGateway
from yarnflow.common.states import ExecutionState, JobStatus

log = logging.getLogger(__name__)

CANCEL_TIMEOUT_MS = 15_000


class JobMaster:
    def __init__(self, job_graph: JobGraph, config: Configuration, rm: ResourceManager, address: str,
                 job_storage_dir: str, on_terminal: Callable[[JobMaster], None],
                 artifacts: ArtifactCache | None = None) -> None:
        self.splits = SplitEnumerator(artifacts, job_graph.artifact_uri, job_graph.artifact_sha256) \
            if artifacts is not None else None
        self.job_id = job_graph.job_id
        self.job_graph = job_graph
        self.fencing_token = uuid.uuid4().hex
        self.graph = ExecutionGraph(job_graph)
        self.status = JobStatus.INITIALIZING
        self.failure_cause: ErrorInfo | None = None
        self.start_time_ms = SystemClock().now_ms()
        self.end_time_ms = 0
        self.all_running_time_ms = 0
        self.result: JobResult | None = None
        self._config = config
        self._task_config = config.with_overrides(job_graph.config).to_strings()
        self._rm = rm
        self._address = address
        self._storage = job_storage_dir
        self._on_terminal = on_terminal
        self._rpc_timeout = config[Options.RPC_TIMEOUT]
        self._main = MainThreadExecutor(f"jobmaster-{self.job_id[:8]}")
        self._io = ThreadPoolExecutor(4, thread_name_prefix=f"jm-io-{self.job_id[:8]}")
        self._groups = slot_sharing_groups(job_graph)
        self._group_of: dict[AllocationID, int] = {}
        self._slots: dict[AllocationID, LogicalSlot] = {}
        self._gateways: dict[ResourceID, RemoteTaskExecutorGateway] = {}
        self._deployed = False

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._main.start()
        self._rm.register_job_master(self.job_id, self)
        self._main.execute(self._start_scheduling)

    def _start_scheduling(self) -> None:
        self._set_status(JobStatus.CREATED)
        self._set_status(JobStatus.RUNNING)
        log.info("job %s (%s): requesting %d slots for %d subtasks", self.job_graph.name, self.job_id,
                 len(self._groups), len(self.graph.all_vertices()))
        for index, _group in enumerate(self._groups):
            allocation_id = AllocationID.generate()
            self._group_of[allocation_id] = index
            self._rm.request_slot(SlotRequest(self.job_id, allocation_id, self._profile_of(index),
                                              self._address, self.fencing_token))
        for ex in self.graph.current_executions():
            ex.transition(ExecutionState.SCHEDULED)
        self._main.schedule(self._config[Options.SLOT_REQUEST_TIMEOUT], self._check_slot_timeout)

    def _profile_of(self, group_index: int) -> ResourceProfile:
        cpu = mem = 0.0
        for vid, _ in self._groups[group_index]:
            res = self.job_graph.vertex(vid).resources
            cpu, mem = cpu + res.cpu_cores, mem + res.memory_mb
        return ResourceProfile(cpu, int(mem))

    def _check_slot_timeout(self) -> None:
        if not self._deployed and self.status == JobStatus.RUNNING:
            self._fail(ErrorInfo("NoResourceAvailableError",
                                 f"could not get {len(self._groups)} slots within slot.request.timeout "
                                 f"(got {len(self._slots)})"))

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

    # -- queries ----------------------------------------------------------------------------
    def status_info(self) -> JobStatusInfo:
        return self._main.call(self._status_info)

    def _status_info(self) -> JobStatusInfo:
        return JobStatusInfo(self.job_id, self.job_graph.name, self.status, self.start_time_ms, self.end_time_ms,
                             self.graph.vertex_statuses(), self.failure_cause, self.all_running_time_ms)

    # -- slots ------------------------------------------------------------------------------
    def offer_slots(self, token: str, resource_id: ResourceID, offers: list[SlotOffer]) -> list[SlotOffer]:
        info = self._rm.task_executor_info(resource_id)
        return self._main.call(self._offer_slots, token, resource_id, info, offers)

    def _offer_slots(self, token: str, resource_id: ResourceID, info, offers: list[SlotOffer]) -> list[SlotOffer]:  # type: ignore[no-untyped-def]
        if token != self.fencing_token:
            raise FencingTokenError(f"slot offer for job {self.job_id} with a stale JobMaster token")
        if info is None or self.status != JobStatus.RUNNING:
            return []
        accepted = []
        for offer in offers:
            index = self._group_of.get(offer.allocation_id)
            if index is None:
                continue
            if offer.allocation_id not in self._slots:
                self._slots[offer.allocation_id] = LogicalSlot(offer.allocation_id, resource_id, info.rpc_address,
                                                               info.data_address)
                for vid, sub in self._groups[index]:
                    self.graph.vertices[JobVertexID(vid)].subtasks[sub].current.slot = self._slots[offer.allocation_id]
            accepted.append(offer)
        if len(self._slots) == len(self._groups) and not self._deployed:
            self._main.execute(self._deploy_all)
        return accepted

    def on_allocation_failed(self, allocation_id: AllocationID, reason: str) -> None:
        self._main.execute(self._fail, ErrorInfo("NoResourceAvailableError", reason))

    # -- deployment -------------------------------------------------------------------------
    def _gateway(self, slot: LogicalSlot) -> RemoteTaskExecutorGateway:
        gw = self._gateways.get(slot.resource_id)
        if gw is None:
            gw = self._gateways[slot.resource_id] = RemoteTaskExecutorGateway(slot.rpc_address, self._rpc_timeout)
        return gw

    def _deploy_all(self) -> None:
        if self._deployed or self.status != JobStatus.RUNNING:
            return
        self._deployed = True
        log.info("job %s: all %d slots there, deploying %d subtasks", self.job_id, len(self._slots),
                 len(self.graph.all_vertices()))
        for ex in self.graph.current_executions():
            self._deploy(ex)

    def _deploy(self, ex: Execution) -> None:
        assert ex.slot is not None
        ex.transition(ExecutionState.DEPLOYING)
        tdd = self.graph.deployment_descriptor(ex, self.job_graph.artifact_uri, self.job_graph.artifact_sha256,
                                               self.fencing_token, self._task_config, self._storage)
        gw = self._gateway(ex.slot)

        def submit() -> None:
            try:
                gw.submit_task(self.fencing_token, tdd)
            except RpcError as exc:
                self._main.execute(self._on_deploy_failed, ex, exc)

        self._io.submit(submit)

    def _on_deploy_failed(self, ex: Execution, exc: RpcError) -> None:
        if self.graph.is_current(ex) and not ex.state.is_terminal:
            self._execution_failed(ex, ErrorInfo.from_exception(exc, f"deploying {ex.vertex.name}"))

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
            self._execution_failed(ex, update.error or ErrorInfo("UnknownError", "task failed without a cause"))
            return True
        if not ex.state.can_move_to(target):
            log.debug("%s: ignoring %s -> %s", ex.vertex.name, ex.state.name, target.name)
            return False
        ex.transition(target)
        if not self.all_running_time_ms and target in (ExecutionState.RUNNING, ExecutionState.FINISHED) and all(
                e.state in (ExecutionState.RUNNING, ExecutionState.FINISHED) for e in self.graph.current_executions()):
            self.all_running_time_ms = SystemClock().now_ms()
        self._check_job()
        return True

    def request_split(self, token: str, vertex_id: str, subtask_index: int, attempt_id: str) -> SplitResponse:
        if token != self.fencing_token:
            raise FencingTokenError("split request with a stale JobMaster token")
        ex = self.graph.execution(attempt_id)
        if ex is None or not self.graph.is_current(ex) or self.splits is None:
            raise NotFoundError(f"no current execution {attempt_id} in job {self.job_id}")
        return self.splits.request(vertex_id, subtask_index)

    def on_task_executor_lost(self, resource_id: ResourceID, reason: str) -> None:
        self._main.execute(self._task_executor_lost, resource_id, reason)

    def _task_executor_lost(self, resource_id: ResourceID, reason: str) -> None:
        lost = [aid for aid, s in self._slots.items() if s.resource_id == resource_id]
        if not lost:
            return
        for aid in lost:
            del self._slots[aid]
        gw = self._gateways.pop(resource_id, None)
        if gw is not None:
            gw.close()
        error = ErrorInfo("TaskExecutorLostError", f"TaskExecutor {resource_id} was lost: {reason}",
                          location=f"TaskExecutor {resource_id}")
        for ex in self.graph.current_executions():
            if ex.slot is not None and ex.slot.resource_id == resource_id and not ex.state.is_terminal:
                ex.slot = None
                self._execution_failed(ex, error)
        if self.status == JobStatus.RUNNING and not self._deployed:
            self._fail(error)

    def _execution_failed(self, ex: Execution, error: ErrorInfo) -> None:
        if ex.state.is_terminal:
            return
        ex.failure = error
        ex.state = ExecutionState.FAILED
        log.info("job %s: %s failed: %s", self.job_id, ex.vertex.name, error.describe())
        self._fail(error)
        self._check_job()

    # -- job outcome ------------------------------------------------------------------------
    def cancel(self) -> None:
        self._main.execute(self._cancel)

    def _cancel(self) -> None:
        if self.status.is_globally_terminal or self.status in (JobStatus.CANCELLING, JobStatus.FAILING):
            return
        self._set_status(JobStatus.CANCELLING)
        self._cancel_executions()
        self._check_job()

    def _fail(self, cause: ErrorInfo) -> None:
        if self.status not in (JobStatus.RUNNING, JobStatus.CREATED):
            return
        self.failure_cause = cause
        self._set_status(JobStatus.FAILING)
        self._cancel_executions()
        self._check_job()

    def _cancel_executions(self) -> None:
        for ex in self.graph.current_executions():
            if ex.state.is_terminal:
                continue
            if ex.state in (ExecutionState.CREATED, ExecutionState.SCHEDULED) or ex.slot is None:
                ex.state = ExecutionState.CANCELED
                continue
            ex.state = ExecutionState.CANCELING
            gw, attempt = self._gateway(ex.slot), ex.attempt_id

            def cancel(gw: RemoteTaskExecutorGateway = gw, ex: Execution = ex) -> None:
                try:
                    gw.cancel_task(self.fencing_token, ex.attempt_id)
                except RpcError as exc:
                    log.info("cancelling %s failed (%s): counting it as canceled", ex.vertex.name, exc)
                    self._main.execute(self._force_canceled, ex)

            self._io.submit(cancel)
        self._main.schedule(CANCEL_TIMEOUT_MS, self._cancel_timeout)

    def _force_canceled(self, ex: Execution) -> None:
        if not ex.state.is_terminal:
            ex.state = ExecutionState.CANCELED
            self._check_job()

    def _cancel_timeout(self) -> None:
        pending = [ex for ex in self.graph.current_executions() if not ex.state.is_terminal]
        if pending and not self.status.is_globally_terminal:
            log.warning("job %s: %d tasks did not confirm their cancellation in time", self.job_id, len(pending))
            for ex in pending:
                ex.state = ExecutionState.CANCELED
            self._check_job()

    def _check_job(self) -> None:
        if self.status == JobStatus.RUNNING and self.graph.all_finished():
            self._set_status(JobStatus.FINISHED)
        elif self.status == JobStatus.FAILING and self.graph.all_terminal():
            self._set_status(JobStatus.FAILED)
        elif self.status == JobStatus.CANCELLING and self.graph.all_terminal():
            self._set_status(JobStatus.CANCELED)
        else:
            return
        self._terminated()

    def _terminated(self) -> None:
        self.end_time_ms = SystemClock().now_ms()
        for aid, slot in list(self._slots.items()):
            gw = self._gateway(slot)
            self._io.submit(self._free_slot, gw, aid)
            self._rm.free_allocation(aid)
        self._slots.clear()
        self._rm.unregister_job_master(self.job_id)
        collected = self._collected() if self.status == JobStatus.FINISHED else {}
        self.result = JobResult(self.job_id, self.status, self.start_time_ms, self.end_time_ms,
                                self.failure_cause, collected)
        log.info("job %s (%s) ended %s after %.1f s%s", self.job_graph.name, self.job_id, self.status.name,
                 (self.end_time_ms - self.start_time_ms) / 1000,
                 f": {self.failure_cause.describe()}" if self.failure_cause else "")
        self._on_terminal(self)

    def _free_slot(self, gw: RemoteTaskExecutorGateway, allocation_id: AllocationID) -> None:
        try:
            gw.free_slot(self.fencing_token, allocation_id, f"job {self.job_id} ended {self.status.name}")
        except RpcError as exc:
            log.debug("freeing %s: %s", allocation_id, exc)

    def _collected(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        try:
            fs, root = fsspec.core.url_to_fs(f"{self._storage.rstrip('/')}/collect")
            if not fs.exists(root):
                return out
            for d in fs.ls(root, detail=False):
                files = [fs.unstrip_protocol(f) for f in sorted(fs.ls(d, detail=False))
                         if not posixpath.basename(f).startswith(".")]
                out[posixpath.basename(d)] = files
        except OSError as exc:
            log.warning("listing collected results of %s: %s", self.job_id, exc)
        return out
