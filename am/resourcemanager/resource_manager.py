"""The ResourceManager shell: owns the SlotManager core on its main thread, talks to
TaskExecutors over Thrift, and to its resource driver for processes / containers.

JobMasters (in this process) call ``request_slot`` / ``free_allocation``; TaskExecutors call
``register_task_executor`` / ``heartbeat_from_task_executor`` over RPC. Losses (heartbeat
timeout, process exit) are reported to the affected JobMasters through ``listeners``.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from dataclasses import dataclass
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from yarnflow.am.resourcemanager.drivers.base import ResourceDriver
from yarnflow.am.resourcemanager.gateway import JobMasterListener
from yarnflow.am.resourcemanager.spark_cluster import LOCAL, SparkCluster
from yarnflow.am.resourcemanager.slotmanager.slot_manager import (
    Action,
    AllocateSlot,
    AllocationFailed,
    ReleaseWorker,
    SlotManager,
    SlotManagerSettings,
    SlotRequest,
    StartWorkers,
    TaskExecutorLost,
)
from yarnflow.common.clock import SystemClock
from yarnflow.common.config import Configuration, Options, taskexecutor_cores
from yarnflow.common.security import internal_credentials
from yarnflow.common.errors import InvalidRequestError, RefusedError, RpcError
from yarnflow.common.ids import AllocationID, JobID, ResourceID
from yarnflow.common.messages import (MemoryStatus, RegistrationResponse, ResourceProfile, SlotReport,
                                      TaskExecutorRegistration)
from yarnflow.common.rpc.endpoint import MainThreadExecutor, RpcEndpoint, fenced, rpc
from yarnflow.common.rpc.gateways import RemoteTaskExecutorGateway

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlotView:
    index: int
    state: str  # FREE | PENDING | ALLOCATED
    job_id: JobID | None


@dataclass(frozen=True)
class TaskExecutorDetails:
    """A registered TaskExecutor as the REST API shows it."""

    registration: TaskExecutorRegistration
    slots: list[SlotView]
    last_heartbeat_epoch_ms: int
    memory: MemoryStatus | None = None


class ResourceManager(RpcEndpoint):
    """Fenced by the leader session id (``fencing_token``): TaskExecutors learn it when they register."""

    def __init__(self, config: Configuration, driver: ResourceDriver, fencing_token: str = "") -> None:
        self.fencing_token = fencing_token or uuid.uuid4().hex
        self._config = config
        self._driver = driver
        self._rpc_timeout = config[Options.RPC_TIMEOUT]
        self._tls = internal_credentials(config)
        self._heartbeat_ms = config[Options.HEARTBEAT_INTERVAL]
        settings = SlotManagerSettings(
            slots_per_worker=config[Options.NUM_SLOTS], min_slots=config[Options.MIN_SLOTS],
            max_slots=config[Options.MAX_SLOTS], heartbeat_timeout_ms=config[Options.HEARTBEAT_TIMEOUT],
            pending_allocation_timeout_ms=max(config[Options.RPC_TIMEOUT], 2 * self._heartbeat_ms),
            idle_timeout_ms=config[Options.TM_IDLE_TIMEOUT],
            silent_worker_grace_ms=config[Options.TM_REGISTRATION_TIMEOUT],
            worker_slot_profile=ResourceProfile(taskexecutor_cores(config) / config[Options.NUM_SLOTS],
                                                config[Options.TM_MEMORY] // (1 << 20) // config[Options.NUM_SLOTS]))
        self.slot_manager = SlotManager(SystemClock(), settings)
        self._max_slots = settings.max_slots  # what scale_to may go up to
        self._main = MainThreadExecutor("resourcemanager")
        super().__init__("ResourceManager", self._main)
        self._io = ThreadPoolExecutor(8, thread_name_prefix="rm-io")
        self._gateways: dict[ResourceID, RemoteTaskExecutorGateway] = {}
        #: registered TaskExecutor -> the worker the driver started it in (a slot process's worker)
        self._worker_of: dict[ResourceID, ResourceID] = {}
        self._listeners: dict[JobID, JobMasterListener] = {}
        self._started = False
        self._previous_workers = False
        #: Spark's standalone master and workers for Spark stages, when the driver can run them
        self.spark: SparkCluster | None = None
        if hasattr(driver, "start_spark_master"):
            defaults = {k: v for k, v in config.to_strings().items() if k.startswith("spark.")}
            self.spark = SparkCluster(driver, SystemClock(), defaults, config[Options.SPARK_IDLE_TIMEOUT])  # type: ignore[arg-type]

    # -- lifecycle --------------------------------------------------------------------------
    def start(self, rpc_address: str, recover_previous_workers: bool = False) -> None:
        """Serve as the leader at ``rpc_address``. ``recover_previous_workers``: a previous
        leader's TaskExecutors are expected to register, so no worker is started for
        ``resourcemanager.previous-worker.recovery.timeout``."""
        self._main.start()
        self._driver.start(rpc_address, self._on_worker_terminated)
        self._previous_workers = recover_previous_workers
        if recover_previous_workers:
            timeout = self._config[Options.PREVIOUS_WORKER_RECOVERY_TIMEOUT]
            self._main.call(self.slot_manager.recover_previous_workers, timeout)
            log.info("waiting up to %d ms for the previous leader's TaskExecutors before starting any", timeout)
        self._main.call(self._start)

    def _start(self) -> None:
        self._started = True
        self._apply(self.slot_manager.ensure_min_resources())
        self._main.schedule(self._heartbeat_ms, self._check_timeouts)

    def suspend(self) -> None:
        """Give up leadership without stopping the workers (another ResourceManager takes
        over the driver and the TaskExecutors, which re-register with it)."""
        log.info("ResourceManager %s suspended", self.fencing_token)
        self._main.stop()
        self._io.shutdown(wait=False, cancel_futures=True)
        for gw in self._gateways.values():
            gw.close()

    def stop(self) -> None:
        try:
            self._main.call(self._disconnect_all, timeout=10)
        except Exception:  # noqa: BLE001
            log.debug("disconnecting TaskExecutors", exc_info=True)
        if self.spark is not None:
            try:
                self._main.call(self.spark.stop, timeout=10)
            except Exception:  # noqa: BLE001 - the driver's stop ends what it started anyway
                log.debug("stopping the Spark daemons", exc_info=True)
        self._driver.stop()
        self._main.stop()
        self._io.shutdown(wait=False, cancel_futures=True)
        for gw in self._gateways.values():
            gw.close()

    def _disconnect_all(self) -> None:
        for _rid, gw in self._gateways.items():
            self._io.submit(self._quietly, gw.disconnect_resource_manager, self.fencing_token,
                            "shutdown of the AppMaster")

    @staticmethod
    def _quietly(fn: Callable[..., object], *args: object) -> None:
        try:
            fn(*args)
        except RpcError:
            pass

    # -- listeners (JobMasters) -------------------------------------------------------------
    def register_job_master(self, job_id: JobID, listener: JobMasterListener) -> None:
        self._main.execute(self._listeners.__setitem__, job_id, listener)

    def unregister_job_master(self, job_id: JobID) -> None:
        self._main.execute(self._unregister_job_master, job_id)

    def _unregister_job_master(self, job_id: JobID) -> None:
        self._listeners.pop(job_id, None)
        for aid, req in list(self.slot_manager.pending.items()):
            if req.job_id == job_id:
                self.slot_manager.cancel_request(aid)

    # -- calls from JobMasters --------------------------------------------------------------
    def request_slot(self, request: SlotRequest) -> None:
        self._main.execute(lambda: self._apply(self.slot_manager.request_slot(request)))

    def cancel_slot_request(self, allocation_id: AllocationID) -> None:
        """The JobMaster no longer needs this pending request."""
        self._main.execute(self.slot_manager.cancel_request, allocation_id)

    def free_allocation(self, allocation_id: AllocationID) -> None:
        self._main.execute(lambda: self._apply(self.slot_manager.free_allocation(allocation_id)))

    def task_executor_info(self, resource_id: ResourceID) -> TaskExecutorRegistration | None:
        def lookup() -> TaskExecutorRegistration | None:
            te = self.slot_manager.task_executors.get(resource_id)
            return te.registration if te else None

        return self._main.call(lookup)

    def overview(self) -> tuple[int, int, int]:
        """(registered TaskExecutors, total slots, free slots)."""
        sm = self.slot_manager
        return self._main.call(lambda: (len(sm.task_executors), sm.total_slots(), sm.free_slot_count()))

    def scale_to(self, workers: int) -> int:
        """Run ``workers`` TaskExecutors from now on (``SlotManager.scale_to``); answers it.
        Raises InvalidRequestError above ``slotmanager.number-of-slots.max``."""
        def scale() -> int:
            try:
                actions = self.slot_manager.scale_to(workers, self._max_slots)
            except ValueError as exc:
                raise InvalidRequestError(str(exc)) from None
            log.info("scaling the cluster to %d TaskExecutors", workers)
            self._apply(actions)
            return workers

        return self._main.call(scale)

    def expects_previous_workers(self) -> bool:
        return self._previous_workers

    def task_executors_holding(self, job_id: JobID) -> list[tuple[TaskExecutorRegistration, list[AllocationID]]]:
        def holding() -> list[tuple[TaskExecutorRegistration, list[AllocationID]]]:
            out = []
            for te in self.slot_manager.task_executors.values():
                slots = [s.allocation_id for s in te.slots if s.job_id == job_id and s.allocation_id is not None]
                if te.reported and slots:
                    out.append((te.registration, slots))
            return out

        return self._main.call(holding)

    def slots_for_job(self, job_id: JobID) -> tuple[int, int]:
        """(slots ``job_id`` could use now, slots of workers being started): the SlotManager's."""
        return self._main.call(lambda: self.slot_manager.slots_for_job(job_id))

    def task_executor_details(self) -> list[TaskExecutorDetails]:
        """Every registered TaskExecutor with its slots, for the REST API and metrics."""
        sm = self.slot_manager

        def read() -> list[TaskExecutorDetails]:
            now_mono, now_epoch = sm.clock.monotonic_ms(), int(time.time() * 1000)
            return [TaskExecutorDetails(te.registration,
                                        [SlotView(s.index, s.state.value, s.job_id) for s in te.slots],
                                        now_epoch - (now_mono - te.last_heartbeat_ms), te.memory)
                    for te in sm.task_executors.values()]

        return self._main.call(read)

    def worker_pids(self) -> dict[ResourceID, int]:
        return self._driver.worker_pids()

    # -- ResourceManagerService (TaskExecutors, over RPC; on the main thread) --------------------
    @rpc
    def register_task_executor(self, registration: TaskExecutorRegistration) -> RegistrationResponse:
        registration_id = uuid.uuid4().hex
        actions = self.slot_manager.register(registration, registration_id)
        # losses first (they drop the old connection), then the new connection, then the rest
        self._apply([a for a in actions if isinstance(a, TaskExecutorLost)])
        self._worker_of[registration.resource_id] = registration.worker_id
        old = self._gateways.pop(registration.resource_id, None)
        if old is not None:
            old.close()
        self._gateways[registration.resource_id] = RemoteTaskExecutorGateway(registration.rpc_address,
                                                                             self._rpc_timeout, tls=self._tls)
        self._apply([a for a in actions if not isinstance(a, TaskExecutorLost)])
        return RegistrationResponse(True, self.fencing_token, registration_id, self._heartbeat_ms)

    @fenced()
    def heartbeat_from_task_executor(self, registration_id: str, report: SlotReport) -> None:
        actions = self.slot_manager.heartbeat(registration_id, report)
        if actions is None:
            raise RefusedError(f"unknown registration {registration_id}: register again")
        self._apply(actions)

    @fenced()
    def disconnect_task_executor(self, resource_id: ResourceID, reason: str) -> None:
        self._apply(self.slot_manager.unregister(resource_id, f"TaskExecutor disconnected: {reason}"))

    @fenced()
    def request_spark_master(self, settings: dict[str, str]) -> str:
        """See ``spark_cluster``: the master's URL, ``LOCAL`` or ``""`` (ask again)."""
        mode = settings.get(Options.SPARK_EXECUTORS.key) or self._config[Options.SPARK_EXECUTORS]
        if mode == "taskexecutor" or (mode == "auto" and not getattr(self._driver, "spark_in_containers", False)):
            return LOCAL
        if self.spark is None:
            raise RefusedError("this AppMaster's resource driver cannot start Spark daemons: set "
                               "spark-stages.executors to taskexecutor, or spark.master to a Spark master")
        try:
            return self.spark.request({k: v for k, v in settings.items() if k.startswith("spark.")})
        except ValueError as exc:
            raise RefusedError(str(exc)) from None

    # -- driver callbacks -------------------------------------------------------------------
    def _on_worker_terminated(self, resource_id: ResourceID, reason: str) -> None:
        def handle() -> None:
            self._apply(self.slot_manager.worker_terminated(resource_id, reason))

        self._main.execute(handle)

    def _check_timeouts(self) -> None:
        self._apply(self.slot_manager.check_timeouts())
        if self.spark is not None:
            self.spark.check()
        self._main.schedule(self._heartbeat_ms, self._check_timeouts)

    # -- actions ----------------------------------------------------------------------------
    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, AllocateSlot):
                self._allocate(action)
            elif isinstance(action, TaskExecutorLost):
                gw = self._gateways.pop(action.resource_id, None)
                if gw is not None:
                    gw.close()
                for listener in list(self._listeners.values()):
                    listener.on_task_executor_lost(action.resource_id, action.reason)
                worker = self._worker_of.pop(action.resource_id, action.resource_id)
                if action.stop_worker and action.stop_after_ms:
                    log.info("TaskExecutor %s is stopped in %d ms unless it registers again (it may be cut off "
                             "by the network)", action.resource_id, action.stop_after_ms)
                    self._main.schedule(action.stop_after_ms, functools.partial(self._stop_if_still_away, action, worker))
                elif action.stop_worker:
                    self._stop_worker(worker, action.reason)
            elif isinstance(action, StartWorkers):
                for _ in range(action.count):
                    self._start_worker()
            elif isinstance(action, ReleaseWorker):
                gw = self._gateways.pop(action.resource_id, None)
                self._worker_of.pop(action.resource_id, None)
                log.info("releasing TaskExecutor %s: %s", action.resource_id, action.reason)
                if action.resource_id in self._driver.worker_pids() or gw is None:
                    if gw is not None:
                        gw.close()
                    self._io.submit(self._driver.stop_worker, action.resource_id)
                else:  # started by an earlier leader's driver: it is told to go
                    self._io.submit(self._release_adopted, gw, action.reason)
            elif isinstance(action, AllocationFailed):
                requester = self._listeners.get(action.request.job_id)
                if requester is not None:
                    requester.on_allocation_failed(action.request.allocation_id, action.reason)

    def _stop_if_still_away(self, lost: TaskExecutorLost, worker: ResourceID) -> None:
        """(main thread) The grace of a silent TaskExecutor ended: stop its worker unless it
        registered again meanwhile."""
        if lost.resource_id in self.slot_manager.task_executors:
            log.info("TaskExecutor %s came back: kept", lost.resource_id)
            return
        log.info("stopping TaskExecutor %s: it did not come back (%s)", lost.resource_id, lost.reason)
        self._stop_worker(worker, lost.reason)

    def _stop_worker(self, worker: ResourceID, reason: str) -> None:
        """(main thread) Stop a worker (off the main thread: a live one may take seconds to stop),
        and unregister its other slot processes."""
        self._io.submit(self._driver.stop_worker, worker)
        for sibling in [r for r, w in self._worker_of.items() if w == worker]:
            self._apply(self.slot_manager.unregister(sibling, f"its worker {worker} is stopped: {reason}"))

    def _release_adopted(self, gw: RemoteTaskExecutorGateway, reason: str) -> None:
        try:
            gw.disconnect_resource_manager(self.fencing_token, f"shutdown: released ({reason})")
        except RpcError as exc:
            log.debug("releasing a TaskExecutor: %s", exc)
        finally:
            gw.close()

    def _start_worker(self) -> None:
        try:
            self._driver.start_worker()
        except Exception as exc:  # noqa: BLE001
            log.error("could not start a TaskExecutor: %s", exc)
            self._main.schedule(1000, lambda: self._apply(self.slot_manager.worker_start_failed()))

    def _allocate(self, action: AllocateSlot) -> None:
        gw = self._gateways.get(action.resource_id)
        req = action.request
        if gw is None:
            self._apply(self.slot_manager.allocation_failed(action.resource_id, action.slot_index,
                                                            req.allocation_id, req))
            return

        def call() -> None:
            try:
                gw.request_slot(self.fencing_token, action.slot_index, req.job_id, req.allocation_id, req.profile,
                                req.jobmaster_address, req.jobmaster_token)
            except RpcError as exc:
                log.warning("TaskExecutor %s did not take slot %d for %s: %s", action.resource_id,
                            action.slot_index, req.allocation_id, exc)
                self._main.execute(lambda: self._apply(self.slot_manager.allocation_failed(
                    action.resource_id, action.slot_index, req.allocation_id, req)))

        self._io.submit(call)
