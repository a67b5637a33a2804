"""JobMaster: the shell around one job's ``JobMasterCore`` (Flink's JobMaster).

The core holds all of the job's logic (scheduling, slots, failover, reconciliation); this
shell gives it a main thread (every event runs there), timers, fencing and I/O: it carries
out the core's actions as calls to the ResourceManager (through ``ResourceManagerGateway``)
and to TaskExecutors (RPCs on a small I/O pool, whose outcomes come back as events).

An error inside the core (a bug, such as an illegal state transition) is never swallowed: it
is logged with its traceback and fails the job, visibly, with that error as its cause.

High availability: completed checkpoints are recorded in the job's CompletedCheckpointStore
(after their ``_metadata`` is written) and checkpoint ids come from its CheckpointIDCounter, so
a new leader recovers the job from them (``recover=True``: every subtask starts from the latest
readable retained checkpoint, the split enumerator from its part of it). Before any write to
the storage dir or a store the JobMaster checks it still leads (``is_leader``); when it does
not, or a store refuses a write (NotLeaderError), the job is SUSPENDED here, not failed.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import fsspec

from yarnflow.am.checkpoint.shared import delete_shared_files
from yarnflow.am.jobmaster.job_metrics import checkpoint_subtasks, kept_checkpoint_subtasks
from yarnflow.am.checkpoint.storage import (
    CheckpointNotReadableError,
    CheckpointStorage,
    checkpoints_retained,
    job_checkpoint_dir,
)
from yarnflow.am.jobmaster.actions import (
    Action,
    CancelSlotRequest,
    CancelTask,
    DeployTask,
    DiscardCheckpointFiles,
    FreeSlot,
    JobReachedTerminalState,
    NotifyTaskCheckpoint,
    ReleasePartitions,
    RequestSlot,
    ReturnAllocation,
    TriggerTaskCheckpoint,
    WriteCheckpointMetadata,
)
from yarnflow.am.jobmaster.job_master_core import JobMasterCore
from yarnflow.am.jobmaster.savepointing import SavepointsAndRecovery
from yarnflow.am.jobmaster.splits import SplitEnumerator
from yarnflow.am.jobmaster.takeover import TaskTakeover
from yarnflow.am.resourcemanager.gateway import ResourceManagerGateway
from yarnflow.common import logs
from yarnflow.common.clock import Clock, SystemClock, TimerHandle
from yarnflow.common.collect import list_collected
from yarnflow.common.config import Configuration, Options
from yarnflow.common.security import internal_credentials
from yarnflow.am.checkpoint.savepoints import SavepointError, write_savepoint
from yarnflow.common.errors import (
    FencingTokenError,
    InvalidRequestError,
    NotFoundError,
    NotLeaderError,
    RpcError,
)
from yarnflow.common.ha import EmbeddedHaServices, HighAvailabilityServices, ha_enabled
from yarnflow.common.ids import AllocationID, ExecutionAttemptID, JobID, JobVertexID, ResourceID
from yarnflow.common.messages import (
    AllocatedSlotReport,
    ErrorInfo,
    JobGraph,
    JobResult,
    JobStatusInfo,
    SlotOffer,
    SplitResponse,
    TaskExecutionStateUpdate,
    TaskExecutorHeartbeatPayload,
    TaskStateSnapshot,
)
from yarnflow.common.rpc.endpoint import MainThreadExecutor, RpcEndpoint, fenced
from yarnflow.common.rpc.gateways import JobMasterServiceHandler, RemoteTaskExecutorGateway
from yarnflow.common.rpc.services import TaskExecutorServiceCalls
from yarnflow.common.states import JobStatus

log = logging.getLogger(__name__)
T = TypeVar("T")


#: the calls a JobMaster makes on a TaskExecutor (generated from the IDL)
TaskExecutorGateway = TaskExecutorServiceCalls


class _MainThreadTimers:
    """The core's timer service: timers fire on the JobMaster's main thread, guarded."""

    def __init__(self, jm: JobMaster) -> None:
        self._jm = jm

    def schedule(self, delay_ms: int, fn: Callable[[], None]) -> TimerHandle:
        return self._jm._main.schedule(delay_ms, lambda: self._jm._guarded(fn))


class JobMaster(SavepointsAndRecovery, TaskTakeover, RpcEndpoint):
    """Fenced by a token of its own (``fencing_token``), which its TaskExecutors get with each
    slot request; served as the service ``jobmaster/<job id>`` on the AppMaster's port."""

    def __init__(self, job_graph: JobGraph, config: Configuration, rm: ResourceManagerGateway, address: str,
                 job_storage_dir: str, on_terminal: Callable[[JobMaster], None],
                 artifacts: Any = None, *,
                 task_executor_gateways: Callable[[str], TaskExecutorGateway] | None = None,
                 collect_results: Callable[[], dict[str, list[str]]] | None = None,
                 clock: Clock | None = None, checkpoints_dir: str = "",
                 ha: HighAvailabilityServices | None = None, is_leader: Callable[[], bool] | None = None,
                 recover: bool = False) -> None:
        self.job_id = job_graph.job_id
        self.job_graph = job_graph
        self.fencing_token = uuid.uuid4().hex
        job_config = config.with_overrides(job_graph.config)
        self._rm = rm
        self._on_terminal = on_terminal
        self._storage = job_storage_dir
        self._rpc_timeout = config[Options.RPC_TIMEOUT]
        self._rm_check_ms = job_config[Options.HEARTBEAT_INTERVAL]
        self._heartbeat_timeout_ms = job_config[Options.HEARTBEAT_TIMEOUT]
        #: the adaptive scheduler's view of the job (``JobStatusInfo.scaling``), set by the Dispatcher
        self.scaling = ""
        self._main = MainThreadExecutor(f"jobmaster-{self.job_id[:8]}")
        super().__init__(f"JobMaster of job {self.job_id}", self._main)
        #: its Thrift processor, which the Dispatcher serves while the job runs here
        self.handler = JobMasterServiceHandler(self).processor()
        self._io = ThreadPoolExecutor(4, thread_name_prefix=f"jm-io-{self.job_id[:8]}", initializer=logs.bind_job,
                                      initargs=(self.job_id,))
        self._gateways: dict[str, TaskExecutorGateway] = {}
        tls = internal_credentials(config)
        self._new_gateway = task_executor_gateways or (lambda a: RemoteTaskExecutorGateway(a, self._rpc_timeout,
                                                                                           tls=tls))
        self._collect_results = collect_results or self._list_collected
        base = str(job_config[Options.CHECKPOINT_DIR]) or checkpoints_dir or f"{job_storage_dir.rstrip('/')}/checkpoints"
        self._checkpoints = CheckpointStorage(job_checkpoint_dir(base, self.job_id))
        ha = ha or EmbeddedHaServices()
        self._checkpoint_store = ha.checkpoint_store(self.job_id)
        self._is_leader = is_leader or (lambda: True)
        self._recover = recover
        #: a new leader: first take over the tasks the TaskExecutors kept running (takeover.py)
        self._takeover_ms = job_config[Options.PREVIOUS_WORKER_RECOVERY_TIMEOUT] if (
            recover and ha_enabled(config) and job_config[Options.HA_KEEP_TASKS]
            and rm.expects_previous_workers()) else 0
        self._address = address
        self._savepoint_path = str(job_config[Options.SAVEPOINT_PATH])
        self._allow_non_restored = bool(job_config[Options.SAVEPOINT_IGNORE_UNCLAIMED])
        self._checkpoint_timeout_ms = int(job_config[Options.CHECKPOINT_TIMEOUT])
        self._retention = str(job_config[Options.CHECKPOINT_RETENTION])
        #: checkpoint id -> (target folder, the savepoint's URL once written)
        self._savepoints: dict[int, tuple[str, Future[str]]] = {}
        #: the checkpoints among them that stop the job (stop-with-savepoint)
        self._stop_savepoints: set[int] = set()
        self._savepoint_requests: set[Future[str]] = set()
        self.core = JobMasterCore(job_graph, job_config, address, self.fencing_token, job_storage_dir,
                                  clock or SystemClock(), _MainThreadTimers(self), self._checkpoints.job_dir,
                                  ha.checkpoint_id_counter(self.job_id))
        self.splits = SplitEnumerator.from_artifact(artifacts, job_graph.artifact_uri, job_graph.artifact_sha256) \
            if artifacts is not None else None
        if self.splits is not None:
            splits = self.splits
            self.core.on_attempt_replaced = lambda old, new, restored: splits.return_splits(
                old.attempt_id, restored, new.attempt_id)
        self.result: JobResult | None = None
        self._rm_token = ""

    @property
    def status(self) -> JobStatus:
        return self.core.status

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Raises SavepointError when the job is to start from a savepoint it cannot use."""
        if self._recover:
            self._recover_checkpoints()
        elif self._savepoint_path:
            self._restore_savepoint(self._savepoint_path)
        self._main.start()
        self._main.job = self.job_id  # its log lines carry [job <id>], also those of callers standing in
        self._main.execute(logs.bind_job, self.job_id)
        self._rm.register_job_master(self.job_id, self)
        self._main.execute(self._guarded, self._start)

    def _start(self) -> None:
        self._rm_token = self._rm.fencing_token
        self.core.start(reconcile=bool(self._takeover_ms))
        if self.core.reconciling:  # (TaskExecutors give up unclaimed tasks after this plus heartbeat.timeout)
            self._begin_takeover(self._takeover_ms, self._takeover_ms + self._heartbeat_timeout_ms)
        self._main.schedule(self._rm_check_ms, self._check_resource_manager)

    def suspend(self, reason: str) -> None:
        """This AppMaster lost the leadership: the job is SUSPENDED here (see the core)."""
        self._execute(self.core.suspend, reason)

    def stop(self) -> None:
        self._main.stop()
        self._fail_savepoint_requests(f"the JobMaster of job {self.job_id} stopped")
        self._io.shutdown(wait=False, cancel_futures=True)
        for gw in self._gateways.values():
            gw.close()

    # -- running the core -----------------------------------------------------------------------
    def _guarded(self, fn: Callable[..., T], *args: Any) -> T | None:
        """Run a core event on the main thread and carry out its actions. A core error fails
        the job (and is raised again to an RPC caller by ``_call``)."""
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - a bug in the core must fail the job, not vanish
            self._core_broke(exc, getattr(fn, "__name__", str(fn)))
            raise
        finally:
            self._carry_out(self.core.drain_actions())

    def _core_broke(self, exc: Exception, where: str) -> None:
        if isinstance(exc, (FencingTokenError, NotFoundError)):
            return
        if isinstance(exc, NotLeaderError):
            self.core.suspend(f"a store refused a write: {exc}")
            return
        log.error("job %s: internal error in the JobMaster while handling %s", self.job_id, where, exc_info=exc)
        error = ErrorInfo.from_exception(exc, f"JobMaster of job {self.job_id} ({where})")
        try:
            self.core.fail_globally(error)
        except Exception:  # noqa: BLE001 - its state is broken: end it without its help
            log.exception("job %s: failing the job after an internal error failed too", self.job_id)
            self.core.force_failed(error)

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return self._main.call(self._guarded, fn, *args)  # type: ignore[return-value]

    def _execute(self, fn: Callable[..., Any], *args: Any) -> None:
        def run() -> None:
            try:
                self._guarded(fn, *args)
            except Exception:  # noqa: BLE001 - already logged and turned into a job failure
                pass
        self._main.execute(run)

    def _gateway(self, address: str) -> TaskExecutorGateway:
        gw = self._gateways.get(address)
        if gw is None:
            gw = self._gateways[address] = self._new_gateway(address)
        return gw

    def _carry_out(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, RequestSlot):
                self._rm.request_slot(action.request)
            elif isinstance(action, CancelSlotRequest):
                self._rm.cancel_slot_request(action.allocation_id)
            elif isinstance(action, ReturnAllocation):
                self._rm.free_allocation(action.allocation_id)
            elif isinstance(action, DeployTask):
                self._io.submit(self._submit, self._gateway(action.rpc_address), action)
            elif isinstance(action, CancelTask):
                self._io.submit(self._cancel_task, self._gateway(action.rpc_address), action)
            elif isinstance(action, FreeSlot):
                self._io.submit(self._quietly, "freeing a slot", self._gateway(action.rpc_address).free_slot,
                                self.fencing_token, action.allocation_id, action.reason)
            elif isinstance(action, ReleasePartitions):
                self._io.submit(self._quietly, "releasing partitions",
                                self._gateway(action.rpc_address).release_partitions, self.fencing_token,
                                self.job_id, list(action.partition_ids))
            elif isinstance(action, TriggerTaskCheckpoint):
                self._io.submit(self._trigger_checkpoint, self._gateway(action.rpc_address), action)
            elif isinstance(action, NotifyTaskCheckpoint):
                gw = self._gateway(action.rpc_address)
                notify = gw.notify_checkpoint_complete if action.completed else gw.notify_checkpoint_aborted
                self._io.submit(self._quietly, f"notifying checkpoint {action.checkpoint_id}", notify,
                                self.fencing_token, action.attempt_id, action.checkpoint_id)
            elif isinstance(action, WriteCheckpointMetadata):
                if self.splits is not None:  # the enumerator's part, as of this checkpoint
                    action = WriteCheckpointMetadata(action.checkpoint_id, {
                        **action.metadata, "split_enumerator": self.splits.snapshot(action.checkpoint_id)})
                self._io.submit(self._write_metadata, action)
            elif isinstance(action, DiscardCheckpointFiles):
                self._io.submit(self._discard_checkpoint, action.checkpoint_id, action.shared_files)
            elif isinstance(action, JobReachedTerminalState):
                self._terminated(action.status)
            else:  # pragma: no cover - a new action kind must be carried out here
                raise TypeError(f"unknown JobMaster action {action!r}")

    def _submit(self, gw: TaskExecutorGateway, action: DeployTask) -> None:
        restore = action.tdd.restore
        if restore is not None:
            try:
                self._checkpoints.check_restore(restore)
            except CheckpointNotReadableError as exc:
                log.warning("job %s: %s", self.job_id, exc)
                self._execute(self.core.deploy_failed, action.attempt_id,
                              ErrorInfo.from_exception(exc, f"restoring {action.tdd.display_name}"))
                return
        try:
            gw.submit_task(self.fencing_token, action.tdd)
        except RpcError as exc:
            error = ErrorInfo.from_exception(exc, f"deploying {action.tdd.display_name} to {action.resource_id}")
            self._execute(self.core.deploy_failed, action.attempt_id, error)
        else:
            self._execute(self.core.deploy_succeeded, action.attempt_id)

    def _trigger_checkpoint(self, gw: TaskExecutorGateway, action: TriggerTaskCheckpoint) -> None:
        try:
            gw.trigger_checkpoint(self.fencing_token, action.attempt_id, action.checkpoint_id, action.timestamp_ms,
                                  action.exactly_once, action.stop, action.aligned_timeout_ms)
        except RpcError as exc:
            self._execute(self.core.checkpoint_trigger_failed, action.attempt_id, action.checkpoint_id,
                          ErrorInfo.from_exception(exc))

    def _write_metadata(self, action: WriteCheckpointMetadata) -> None:
        """Write ``_metadata``, then the pointer to it (the checkpoint exists for a new leader
        once both are there). Neither is written by a JobMaster that no longer leads."""
        if not self._is_leader():
            self._lost_leadership(f"checkpoint {action.checkpoint_id} not written")
            return
        try:
            url = self._checkpoints.write_metadata(action.checkpoint_id, action.metadata)
            self._checkpoint_store.add(action.checkpoint_id, url)
            external = posixpath.dirname(url)
            savepoint = self._savepoints.get(action.checkpoint_id)
            if savepoint is not None and not savepoint[0]:  # a checkpoint asked for (trigger_checkpoint)
                savepoint[1].set_result(url)
            elif savepoint is not None:  # copied before the checkpoint completes: no newer one subsumes it meanwhile
                try:
                    external = write_savepoint(savepoint[0], str(self.job_id), action.metadata)
                    savepoint[1].set_result(external)
                except SavepointError as exc:
                    log.warning("job %s: %s", self.job_id, exc)
                    stopping = action.checkpoint_id in self._stop_savepoints
                    savepoint[1].set_exception(exc)
                    if stopping:
                        # no savepoint, no stop: the checkpoint is aborted, the stopping tasks
                        # fail on that and the job restarts from its latest checkpoint
                        self._execute(self.core.checkpoint_metadata_failed, action.checkpoint_id, str(exc))
                        return
        except NotLeaderError as exc:
            self._lost_leadership(f"checkpoint {action.checkpoint_id} not recorded: {exc}")
        except OSError as exc:
            log.warning("job %s: writing the metadata of checkpoint %d failed: %s", self.job_id,
                        action.checkpoint_id, exc)
            self._execute(self.core.checkpoint_metadata_failed, action.checkpoint_id, str(exc))
        else:
            self._execute(self.core.checkpoint_metadata_written, action.checkpoint_id, external)

    def _discard_checkpoint(self, checkpoint_id: int, shared_files: tuple[str, ...] = ()) -> None:
        """Forget the pointer, then delete the files, and the shared files no retained
        checkpoint references any more (a leader only)."""
        if not self._is_leader():
            return
        try:
            self._checkpoint_store.remove(checkpoint_id)
        except NotLeaderError:
            return
        self._checkpoints.discard(checkpoint_id)
        delete_shared_files(shared_files)

    def _lost_leadership(self, what: str) -> None:
        log.warning("job %s: this AppMaster no longer leads: %s", self.job_id, what)
        self.suspend(f"leadership lost ({what})")

    def _cancel_task(self, gw: TaskExecutorGateway, action: CancelTask) -> None:
        try:
            gw.cancel_task(self.fencing_token, action.attempt_id)
        except RpcError as exc:
            self._execute(self.core.cancel_call_failed, action.attempt_id, ErrorInfo.from_exception(exc))

    def _quietly(self, what: str, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except RpcError as exc:
            log.debug("job %s: %s failed: %s", self.job_id, what, exc)

    def _terminated(self, status: JobStatus) -> None:
        if status == JobStatus.SUSPENDED:  # a deposed leader: no calls, nothing written
            self.result = JobResult(self.job_id, status, self.core.start_time_ms, self.core.end_time_ms, None, {})
            self._on_terminal(self)
            return
        self._rm.unregister_job_master(self.job_id)
        collected = self._collect_results() if status == JobStatus.FINISHED else {}
        self.result = JobResult(self.job_id, status, self.core.start_time_ms, self.core.end_time_ms,
                                self.core.failure_cause, collected)
        if self.core.checkpoints is not None and self.checkpoints_to_delete() is not None:
            self.core.checkpoints.coordinator.discard_retained()  # (its history says so from now on)
        self._on_terminal(self)

    @property
    def checkpoint_dir(self) -> str:
        """The job's checkpoint folder (``<checkpoints dir>/<job id>``)."""
        return self._checkpoints.job_dir

    def checkpoints_to_delete(self) -> str | None:
        """The job's checkpoint folder (its ``chk-<n>`` folders and shared files) once it ended in
        a way its retention does not keep (``checkpoints_retained``); None while it runs."""
        if self.result is None or checkpoints_retained(self.result.status, self._retention):
            return None
        return self._checkpoints.job_dir

    def _list_collected(self) -> dict[str, list[str]]:
        return list_collected(self._storage)

    def _check_resource_manager(self) -> None:
        """A new ResourceManager leader knows nothing of this job: register again and repeat
        the slot requests still waiting (Flink's JobMaster reconnecting to the RM)."""
        if self.core.is_terminal:
            return
        token = self._rm.fencing_token
        if token != self._rm_token:
            self._rm_token = token
            self._rm.register_job_master(self.job_id, self)
            self._guarded(self.core.resource_manager_changed)
        self._main.schedule(self._rm_check_ms, self._check_resource_manager)

    # -- JobMasterService (over RPC: its own service, on the main thread, fenced by RpcEndpoint) --
    def _this_job(self, job_id: JobID) -> None:
        if job_id != self.job_id:
            raise NotFoundError(f"the JobMaster of job {self.job_id} got a call for job {job_id}")

    @fenced()
    def offer_slots(self, job_id: JobID, resource_id: ResourceID, offers: list[SlotOffer]) -> list[SlotOffer]:
        self._this_job(job_id)
        info = self._rm.task_executor_info(resource_id)
        if info is None:
            return []
        return self._call(self.core.slots_offered, resource_id, info.rpc_address, info.data_address, offers)

    @fenced()
    def update_task_execution_state(self, update: TaskExecutionStateUpdate) -> bool:
        self._this_job(update.job_id)
        return self._call(self.core.task_state_changed, update)

    @fenced()
    def heartbeat_from_task_executor(self, job_id: JobID, payload: TaskExecutorHeartbeatPayload) -> AllocatedSlotReport:
        self._this_job(job_id)
        held = self._call(self.core.task_executor_heartbeat, payload.resource_id, list(payload.executions),
                          list(payload.allocation_ids))
        return AllocatedSlotReport(list(held))

    @fenced()
    def request_split(self, job_id: JobID, vertex_id: JobVertexID, subtask_index: int, attempt_id: ExecutionAttemptID,
                      last_checkpoint_id: int = 0) -> SplitResponse:
        self._this_job(job_id)
        if self.core.reconciling:  # which splits the running sources hold is not known yet
            return SplitResponse(None, False)
        if self.splits is None or not self.core.is_current_attempt(attempt_id):
            raise NotFoundError(f"no current execution {attempt_id} in job {self.job_id}")
        return self.splits.request(vertex_id, subtask_index, attempt_id, last_checkpoint_id)

    @fenced()
    def read_artifact(self, job_id: JobID, sha256: str, offset: int, length: int) -> bytes:
        """Flink's BlobServer for this job: up to ``length`` bytes (at most 16 MiB) of the job's
        artifact from ``offset``, for the TaskExecutors that run its tasks (they see no other
        host's files). Read from the job's storage (an RPC thread: no state is touched)."""
        self._this_job(job_id)
        if not sha256 or sha256 != self.job_graph.artifact_sha256 or not self.job_graph.artifact_uri:
            raise NotFoundError(f"job {self.job_id} has no artifact {sha256[:12] or '(none)'}")
        if offset < 0 or length < 0:
            raise InvalidRequestError(f"cannot read {length} bytes at offset {offset}")
        try:
            with fsspec.open(self.job_graph.artifact_uri, "rb") as fh:
                fh.seek(offset)
                return bytes(fh.read(min(length, 16 << 20)))
        except OSError as exc:
            raise NotFoundError(f"the artifact of job {self.job_id} cannot be read at "
                                f"{self.job_graph.artifact_uri}: {exc}") from exc

    @fenced()
    def acknowledge_checkpoint(self, job_id: JobID, attempt_id: ExecutionAttemptID, checkpoint_id: int,
                               snapshot: TaskStateSnapshot) -> None:
        self._this_job(job_id)
        self._call(self.core.acknowledge_checkpoint, attempt_id, checkpoint_id, snapshot)

    @fenced()
    def decline_checkpoint(self, job_id: JobID, attempt_id: ExecutionAttemptID, checkpoint_id: int,
                           reason: str) -> None:
        self._this_job(job_id)
        self._call(self.core.decline_checkpoint, attempt_id, checkpoint_id, reason)

    # -- from the ResourceManager and the Dispatcher --------------------------------------------
    def on_task_executor_lost(self, resource_id: ResourceID, reason: str) -> None:
        self._execute(self.core.task_executor_lost, resource_id, reason)

    def on_allocation_failed(self, allocation_id: AllocationID, reason: str) -> None:
        self._execute(self.core.allocation_failed, allocation_id, reason)

    def cancel(self) -> None:
        self._execute(self.core.cancel)

    def status_info(self) -> JobStatusInfo:
        return self._with_scaling(self._main.call(self.core.status_info))

    def checkpoint_subtasks(self, checkpoint_id: int) -> dict[str, list[dict[str, Any]]] | None:
        """Each subtask's part of a recent checkpoint, per vertex (``job_metrics.checkpoint_subtasks``)."""
        return self._main.call(checkpoint_subtasks, self.core, checkpoint_id)

    def checkpoint_durations(self) -> tuple[list[int], int] | None:
        """The completed checkpoints' durations: counts per bucket of
        ``coordinator.DURATION_BUCKETS_MS`` (the last: longer) and their sum in ms; None without
        checkpoints."""
        def read() -> tuple[list[int], int] | None:
            checkpoints = self.core.checkpoints
            if checkpoints is None:
                return None
            return list(checkpoints.coordinator.duration_counts), checkpoints.coordinator.duration_sum_ms
        return self._main.call(read)

    def kept_checkpoint_subtasks_on_main_thread(self) -> dict[int, dict[str, list[dict[str, Any]]]]:
        """(On this JobMaster's main thread, as its job ends) each shown checkpoint's part per
        subtask, for the Dispatcher to keep with the ended job."""
        return kept_checkpoint_subtasks(self.core)

    def status_info_on_main_thread(self) -> JobStatusInfo:
        """``status_info()`` for a caller already on this JobMaster's main thread (the
        Dispatcher's callback for the job's end): no hop, which would wait for itself."""
        return self._with_scaling(self.core.status_info())

    def _with_scaling(self, info: JobStatusInfo) -> JobStatusInfo:
        # ``scaling``: set by the Dispatcher's adaptive scheduler (a str: read and written whole)
        return dataclasses.replace(info, scaling=self.scaling) if self.scaling else info
