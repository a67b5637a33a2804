"""The TaskExecutor shell: registers with the ResourceManager, heartbeats, offers slots to
JobMasters, runs tasks and reports their states. Its state and decisions (slots, deployed
tasks, JobMaster connections, heartbeats, which token a call must carry) are the pure core's,
``core.py``; this shell owns the threads, sockets and Task objects and carries out the core's
actions.

Every ``heartbeat.interval`` it also sends each job's JobMaster a heartbeat (Flink's JobMaster
<-> TaskExecutor heartbeat) with the job's tasks and slots here, and acts on the answer (the
JobMaster's allocated-slot report): an ACTIVE slot of the job that the JobMaster no longer lists
is freed; a JobMaster that answers NOT_FOUND or FENCING, or that stays silent for
``heartbeat.timeout``, is gone, and the job's slots, tasks and partitions here are freed.
A task's final update is kept until the JobMaster acknowledges it (see ``job_table``).

Fencing: calls from a JobMaster (submitTask, cancelTask, freeSlot, releasePartitions,
triggerCheckpoint, notifyCheckpointComplete/Aborted) must carry the token of the job's JobMaster
as last named by a slot request; any other token is refused, also once the slot or the task is
gone (``RpcEndpoint`` checks it, with the token the core expects).

State lives on the main thread (``MainThreadExecutor``); blocking calls to the AppMaster run
on helper threads and post their outcome back. When no ResourceManager has answered for
``taskmanager.registration.timeout`` the TaskExecutor shuts itself down: it never lingers as
an orphan after its AppMaster is gone.

Leader retrieval (``common/ha``): the TaskExecutor follows the cluster's leader (with ZooKeeper
HA it is looked up there; otherwise it is ``rm_address``). When another AppMaster becomes leader
the TaskExecutor registers with the new ResourceManager, and the old leader's JobMasters are
deposed: with ``high-availability.keep-running-tasks`` the jobs' tasks run on until the new
leader's JobMaster of each takes them over (``jm_links.py``); without it (or when none does in
time) everything of those jobs here goes (tasks cancelled, slots freed, partitions released)
and the new leader restarts the jobs from their checkpoints.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from yarnflow.common.clock import SystemClock
from yarnflow.common.config import Configuration, Options, taskexecutor_cores
from yarnflow.common.security import internal_credentials
from yarnflow.common.ha import HighAvailabilityServices, LeaderInformation, create_ha_services, ha_enabled
from yarnflow.common.errors import (FencingTokenError, InvalidRequestError, NotFoundError, RefusedError,
                                    RpcError, UnavailableError)
from yarnflow.common.ids import AllocationID, ExecutionAttemptID, JobID, JobVertexID, ResourceID
from yarnflow.common.memory import release_free_memory
from yarnflow.common.messages import (
    ReconciledTask,
    ResourceProfile,
    SlotReport,
    TaskDeploymentDescriptor,
    TaskExecutionStateUpdate,
    TaskExecutorRegistration,
    ThreadInfo,
    ThreadInfoSample,
)
from yarnflow.common.rpc.endpoint import MainThreadExecutor, RpcEndpoint, fenced, rpc, settle
from yarnflow.common.thread_info import check_request, thread_dump
from yarnflow.common.rpc.gateways import (
    TASK_EXECUTOR,
    RemoteJobMasterGateway,
    RemoteResourceManagerGateway,
    TaskExecutorServiceHandler,
    job_master_service,
)
from yarnflow.common.rpc.limits import RpcLimits
from yarnflow.common.rpc.server import RpcServer
from yarnflow.common.artifacts import ArtifactCache
from yarnflow.worker.memory.manager import MemoryManager, managed_memory_bytes
from yarnflow.worker.memory.rocksdb_memory import rocksdb_usage
from yarnflow.worker.memory.spill import remove_orphan_spills, spill_roots
from yarnflow.worker.memory.watchdog import MemoryWatchdog
from yarnflow.common.metrics import metrics_address
from yarnflow.worker.metrics import start_task_executor_metrics
from yarnflow.worker.network.client import DataClient
from yarnflow.worker.network.flight import DataServer
from yarnflow.worker.network.partition import ResultPartitionManager
from yarnflow.worker.state.local_recovery import release_job as release_local_state
from yarnflow.worker.state.localdir import set_default_base
from yarnflow.worker.task import Task
from yarnflow.worker.taskexecutor.core import (
    Action,
    CancelTask,
    CloseJobMasterConnection,
    OfferSlot,
    ReleasePartitions,
    SendHeartbeat,
    StartTask,
    TaskExecutorCore,
)
from yarnflow.worker.taskexecutor.jm_heartbeats import JobMasterHeartbeats
from yarnflow.worker.taskexecutor.jm_links import JobMasterLinks, JobMasterResponder
from yarnflow.worker.taskexecutor.job_table import JobTable
from yarnflow.worker.taskexecutor.slot_table import SlotTable
from yarnflow.worker.taskexecutor.spark_masters import SparkMasters
from yarnflow.worker.taskexecutor.thread_samples import sample_tasks

log = logging.getLogger(__name__)
#: free memory goes back to the system once no task ran on this TaskExecutor for this long
IDLE_RELEASE_MS = 1000



REGISTRATION_HA_NOTE = (", with high availability at least ZooKeeper's session timeout plus "
                        "resourcemanager.previous-worker.recovery.timeout and the connection timeout")


def takeover_ms(config: Configuration) -> int:
    """How long a new leader can take to appear and take a TaskExecutor back, with ZooKeeper
    high availability: the old leader's session expires
    (``high-availability.zookeeper.client.session-timeout``), the next one connects
    (``.connection-timeout``) and waits ``resourcemanager.previous-worker.recovery.timeout`` for
    the old TaskExecutors. 0 without high availability."""
    if not ha_enabled(config):
        return 0
    return (int(config[Options.ZK_SESSION_TIMEOUT]) + int(config[Options.ZK_CONNECTION_TIMEOUT])
            + int(config[Options.PREVIOUS_WORKER_RECOVERY_TIMEOUT]))


def registration_timeout_ms(config: Configuration) -> int:
    """How long a TaskExecutor goes on without a ResourceManager before it exits
    (``taskmanager.registration.timeout``; with high availability at least ``takeover_ms``:
    exiting sooner would lose the tasks a failover keeps running)."""
    return max(int(config[Options.TM_REGISTRATION_TIMEOUT]), takeover_ms(config))


def orphan_timeout_ms(config: Configuration) -> int:
    """How long the tasks of a job whose JobMaster is gone wait to be taken over by a new
    leader's JobMaster (``resourcemanager.previous-worker.recovery.timeout`` after
    ``heartbeat.timeout``, and with high availability at least ``takeover_ms``)."""
    own = int(config[Options.PREVIOUS_WORKER_RECOVERY_TIMEOUT]) + int(config[Options.HEARTBEAT_TIMEOUT])
    return max(own, takeover_ms(config))


class TaskExecutor(JobMasterHeartbeats, JobMasterLinks, RpcEndpoint):
    def __init__(self, config: Configuration, resource_id: ResourceID, rm_address: str, work_dir: str,
                 ha: HighAvailabilityServices | None = None, container_id: str = "") -> None:
        self.config = config
        self.resource_id = resource_id
        self.container_id = container_id  # the worker it is a slot process of ("": its own worker)
        self._rm_address = rm_address
        self._ha = ha or create_ha_services(config, leader_address=rm_address)
        self._retrieval = self._ha.leader_retrieval()
        self._leader_session = ""
        self._old_rms: list[RemoteResourceManagerGateway] = []
        self._rpc_timeout = config[Options.RPC_TIMEOUT]
        self._registration_timeout_ms = registration_timeout_ms(config)
        self._heartbeat_ms = config[Options.HEARTBEAT_INTERVAL]
        host = config[Options.TM_HOST]
        num_slots = config[Options.NUM_SLOTS]
        profile = ResourceProfile(taskexecutor_cores(config) / num_slots,
                                  config[Options.TM_MEMORY] // (1 << 20) // num_slots)
        #: slots, tasks, JobMaster connections and heartbeats, tokens: the pure core
        #: a new leader's JobMaster may take the tasks over (jm_links.py); until then they run on
        orphan_timeout = orphan_timeout_ms(config)
        self.core = TaskExecutorCore(resource_id, SlotTable(num_slots, profile),
                                     JobTable(SystemClock(), config[Options.HEARTBEAT_TIMEOUT], orphan_timeout),
                                     keep_tasks=ha_enabled(config) and config[Options.HA_KEEP_TASKS])
        self.slots, self.jobs = self.core.slots, self.core.jobs
        self._main = MainThreadExecutor(f"taskexecutor-{resource_id}")
        super().__init__(f"TaskExecutor {resource_id}", self._main)
        self._io = ThreadPoolExecutor(4, thread_name_prefix="te-io")
        self._tasks_ended = 0  # (free memory is released once none ended for IDLE_RELEASE_MS)
        self._updates = ThreadPoolExecutor(1, thread_name_prefix="te-updates")  # keeps per-task order
        self.partitions = ResultPartitionManager(os.path.join(work_dir, "partitions"))
        self._tls = internal_credentials(config)
        self._data_server = DataServer(host, self.partitions, segment_size=config[Options.SEGMENT_SIZE], tls=self._tls)
        self._data_client = DataClient(self._tls)
        self._artifacts = ArtifactCache.bounded(config, work_dir, lambda: {t.tdd.artifact_sha256 for t in list(self.tasks.values())})
        set_default_base(work_dir)  # RocksDB state backends work here unless the job names a localdir
        self.work_dir = work_dir  # (and task-local recovery keeps its copies here)
        self.memory = MemoryManager(managed_memory_bytes(config), num_slots)
        self.watchdog = MemoryWatchdog.from_config(
            f"TaskExecutor {resource_id}", config, fail_tasks=self._fail_tasks, on_stuck=self._memory_stuck,
            parts=lambda: (self.memory.total_bytes, self.memory.used_bytes, rocksdb_usage(self.memory)))
        self.spill_roots = spill_roots(config[Options.TMP_DIRS], work_dir)
        remove_orphan_spills(self.spill_roots)  # of TaskExecutors that were killed
        self._rpc = RpcServer(host, 0, {TASK_EXECUTOR: TaskExecutorServiceHandler(self).processor()},
                              name=f"taskexecutor-{resource_id}", tls=self._tls,
                              limits=RpcLimits.from_config(config))
        self._rm: RemoteResourceManagerGateway | None = (
            RemoteResourceManagerGateway(rm_address, self._rpc_timeout, tls=self._tls)
            if rm_address else None)  # None: no leader known yet
        self._jms: dict[tuple[str, JobID], RemoteJobMasterGateway] = {}
        self.tasks: dict[ExecutionAttemptID, Task] = {}  # the running Task objects of core.tasks
        self._ended: dict[ExecutionAttemptID, ReconciledTask] = {}
        self._last_rm_contact = time.monotonic()
        self._stopped = threading.Event()
        self._rm_changed = threading.Event()  # wakes the registration loop for a new leader at once
        self.exit_reason = ""
        self.fatal = False
        self._num_slots, self._profile = num_slots, profile
        self.metrics_endpoint: Any = None
        #: where this TaskExecutor's Spark stages run Spark (see ``SparkMasters``)
        self.spark_masters = SparkMasters(self)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> TaskExecutor:
        self._rpc.start()
        self._main.start()
        self.metrics_endpoint = start_task_executor_metrics(self)  # before registering: it names it
        self.watchdog.start()
        self._retrieval.start(self._on_leader)
        threading.Thread(target=self._heartbeat_loop, name="te-heartbeat", daemon=True).start()
        threading.Thread(target=self._jm_heartbeat_loop, name="te-jm-heartbeat", daemon=True).start()
        log.info("TaskExecutor %s started: rpc %s, data %s, %d slots, %.0f MB of managed memory (%.0f MB a slot), "
                 "spill files in %s", self.resource_id, self._rpc.address, self._data_server.address, self._num_slots,
                 self.memory.total_bytes / 2**20, self.memory.slot_bytes / 2**20, ", ".join(self.spill_roots))
        if self._num_slots > 1:
            log.info("its %d slots are threads of this process: Python code in them shares one core "
                     "(taskmanager.slot-processes: true runs a process a slot)", self._num_slots)
        return self

    @property
    def credentials(self) -> Any:
        """The cluster's TLS credentials this TaskExecutor holds (None without internal TLS)."""
        return self._tls

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def shutdown(self, reason: str) -> None:
        if self._stopped.is_set():
            return
        self.exit_reason = reason
        log.info("TaskExecutor %s shutting down: %s", self.resource_id, reason)
        self.watchdog.stop()
        try:
            self._main.call(self._cancel_all, timeout=5)
        except Exception:  # noqa: BLE001
            pass
        for task in list(self.tasks.values()):
            task.join(2.0)
        self._rpc.stop()
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.stop()
        self.partitions.close()
        try:
            self._data_server.shutdown()
        except Exception:  # noqa: BLE001
            log.debug("data server shutdown", exc_info=True)
        self._data_client.close()
        from yarnflow.worker.spark import stop_session

        stop_session()  # the SparkSession of this TaskExecutor's Spark stages, if one started
        self._main.stop()
        self._io.shutdown(wait=False, cancel_futures=True)
        self._updates.shutdown(wait=False, cancel_futures=True)
        for stop in (self._retrieval.stop, self._ha.close):
            try:
                stop()
            except Exception:  # noqa: BLE001 - shutting down
                log.debug("stopping leader retrieval", exc_info=True)
        if self._rm is not None:
            self._rm.close()
        for jm in self._jms.values():
            jm.close()
        for old in self._old_rms:
            old.close()
        self._stopped.set()
        self._rm_changed.set()

    def _cancel_all(self) -> None:
        for task in self.tasks.values():
            task.cancel()

    def _memory_stuck(self, why: str) -> None:
        """(the watchdog's thread) Its memory stays at the limit with no task to fail: exit."""
        self.fatal = True
        threading.Thread(target=self.shutdown, name="te-shutdown", daemon=True, args=(why,)).start()

    def _fail_tasks(self, error: BaseException) -> int:
        """(the watchdog's thread) Fail every running task with ``error``; how many were."""
        return int(self._main.call(lambda: sum(t.fail_externally(error) for t in list(self.tasks.values())),
                                   timeout=5))

    # -- ResourceManager connection ---------------------------------------------------------
    def _on_leader(self, leader: LeaderInformation | None) -> None:
        """Leader retrieval's callback (its thread)."""
        if leader is None:
            log.info("no AppMaster leads the cluster at the moment")
        elif not self._stopped.is_set():
            self._main.execute(self._follow_leader, leader)

    def _follow_leader(self, leader: LeaderInformation) -> None:
        same_address = leader.address == self._rm_address
        if same_address and (not self._leader_session or leader.session_id == self._leader_session):
            self._leader_session = leader.session_id or self._leader_session
            return
        log.info("the AppMaster leading the cluster is now %s (session %s); it was %s", leader.address,
                 leader.session_id, self._rm_address)
        self._carry_out(self.core.leader_changed(self.core.keep_tasks))
        self._leader_session = leader.session_id
        if not same_address:
            if self._rm is not None:
                self._old_rms.append(self._rm)
            self._rm = RemoteResourceManagerGateway(leader.address, self._rpc_timeout, tls=self._tls)
            self._rm_address = leader.address
        self._last_rm_contact = time.monotonic()
        self._rm_changed.set()

    def _registration(self) -> TaskExecutorRegistration:
        return TaskExecutorRegistration(self.resource_id, self._rpc.address, self._data_server.address,
                                        self._num_slots, self._profile, os.getpid(), socket.gethostname(),
                                        metrics_address(self.metrics_endpoint, self._rpc.address),
                                        self.container_id)

    def _heartbeat_loop(self) -> None:
        """Register, then heartbeat; gives up after the registration timeout without contact."""
        while not self._stopped.is_set():
            rm = self._rm
            try:
                if rm is None:
                    raise UnavailableError("no leader is known yet")
                if not self.core.registration_id:
                    while self._old_rms:  # gateways of earlier leaders: nobody uses them any more
                        self._old_rms.pop().close()
                    resp = rm.register_task_executor(self._registration())
                    if not resp.accepted:
                        raise RefusedError(resp.reason)
                    self._main.call(self.core.registered, resp.fencing_token, resp.registration_id)
                    log.info("registered at the ResourceManager %s", self._rm_address)
                    self._last_rm_contact = time.monotonic()
                    continue  # report the slots at once: the ResourceManager hands them out only after that
                else:
                    report = self._main.call(self._slot_report)
                    rm.heartbeat_from_task_executor(self.core.rm_token, self.core.registration_id, report)
                self._last_rm_contact = time.monotonic()
            except (RefusedError, FencingTokenError, NotFoundError) as exc:
                log.info("ResourceManager does not know this TaskExecutor (%s): registering again", exc)
                self._main.execute(self.core.registration_lost)
                self._last_rm_contact = time.monotonic()
                continue
            except (RpcError, UnavailableError) as exc:
                silent_ms = (time.monotonic() - self._last_rm_contact) * 1000
                log.warning("cannot reach the ResourceManager at %s for %.0f ms: %s", self._rm_address,
                            silent_ms, exc)
                if silent_ms > self._registration_timeout_ms:
                    threading.Thread(target=self.shutdown, name="te-shutdown", daemon=True, args=(
                        f"no ResourceManager answered for {silent_ms / 1000:.1f} s "
                        f"(taskmanager.registration.timeout{REGISTRATION_HA_NOTE if ha_enabled(self.config) else ''})",
                    )).start()
                    return
            if self._rm_changed.wait(self._heartbeat_ms / 1000.0):
                self._rm_changed.clear()

    def _slot_report(self) -> SlotReport:
        report = self.slots.report()
        return SlotReport(report.slots, len(self.partitions.blocking_partitions()), self.watchdog.status())

    # -- TaskExecutorService (over RPC, on the main thread; fenced by RpcEndpoint) -------------
    @fenced(lambda te, *args: te.core.rm_token_expected())
    def request_slot(self, slot_index: int, job_id: JobID, allocation_id: AllocationID, profile: ResourceProfile,
                     jobmaster_address: str, jobmaster_token: str) -> None:
        self._carry_out(self.core.slot_requested(slot_index, job_id, allocation_id, jobmaster_address,
                                                 jobmaster_token))

    @fenced(lambda te, tdd: te.core.deployment_token(tdd))
    def submit_task(self, tdd: TaskDeploymentDescriptor) -> None:
        self._carry_out(self.core.deploy(tdd))

    @fenced(lambda te, attempt_id, *args: te.core.task_token(attempt_id))
    def cancel_task(self, attempt_id: ExecutionAttemptID) -> None:
        self._carry_out(self.core.cancel_task(attempt_id))

    @fenced(lambda te, allocation_id, *args: te.core.slot_token(allocation_id))
    def free_slot(self, allocation_id: AllocationID, reason: str) -> None:
        self._carry_out(self.core.free_slot(allocation_id, reason))

    @fenced(lambda te, attempt_id, *args: te.core.task_token(attempt_id))
    def trigger_checkpoint(self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp_ms: int,
                           exactly_once: bool, stop: str = "", aligned_timeout_ms: int = -1) -> None:
        """Hand checkpoint ``checkpoint_id`` to the task (its mailbox). NotFoundError when the
        attempt is not running here."""
        self._running(attempt_id, f"triggerCheckpoint {checkpoint_id}").trigger_checkpoint(
            checkpoint_id, timestamp_ms, exactly_once, stop, aligned_timeout_ms)

    @fenced(lambda te, attempt_id, *args: te.core.task_token(attempt_id))
    def notify_checkpoint_complete(self, attempt_id: ExecutionAttemptID, checkpoint_id: int) -> None:
        self._running(attempt_id, f"notifyCheckpointComplete {checkpoint_id}").notify_checkpoint(
            checkpoint_id, complete=True)

    @fenced(lambda te, attempt_id, *args: te.core.task_token(attempt_id))
    def notify_checkpoint_aborted(self, attempt_id: ExecutionAttemptID, checkpoint_id: int) -> None:
        self._running(attempt_id, f"notifyCheckpointAborted {checkpoint_id}").notify_checkpoint(
            checkpoint_id, complete=False)

    def _running(self, attempt_id: ExecutionAttemptID, call: str) -> Task:
        self.core.running(attempt_id, call)
        return self.tasks[attempt_id]

    @fenced(lambda te, job_id, *args: te.core.job_token(job_id))
    def release_partitions(self, job_id: JobID, partition_ids: list[str]) -> None:
        """Blocking partitions are released by the JobMaster when no consumer needs them."""
        self._carry_out(self.core.release_partitions(job_id, partition_ids))

    @fenced(lambda te, *args: te.core.rm_token_expected())
    def disconnect_resource_manager(self, reason: str) -> None:
        if reason.startswith("shutdown"):
            threading.Thread(target=self.shutdown, args=(f"the ResourceManager asked: {reason}",),
                             daemon=True).start()
        else:
            self.core.registration_lost()

    @rpc
    def request_thread_dump(self) -> list[ThreadInfo]:
        return thread_dump()

    @rpc
    def request_thread_info_samples(self, job_id: JobID, vertex_id: JobVertexID, subtasks: list[int],
                                    num_samples: int, delay_ms: int, max_depth: int) -> Future[list[ThreadInfoSample]]:
        """Samples of the threads of the vertex's subtasks running here (Flink's
        requestThreadInfoSamples), taken on a thread of their own: the answer comes later."""
        why = check_request(num_samples, delay_ms, max_depth)
        if why:
            raise InvalidRequestError(why)
        tasks = [t for t in self.tasks.values() if t.tdd.job_id == job_id and t.tdd.vertex_id == vertex_id
                 and t.alive and (not subtasks or t.tdd.subtask_index in subtasks)]
        answer: Future[list[ThreadInfoSample]] = Future()

        def run() -> None:
            try:
                settle(answer, sample_tasks(tasks, num_samples, delay_ms, max_depth, self._stopped.is_set))
            except Exception as exc:  # noqa: BLE001 - the caller's answer
                settle(answer, exc)

        threading.Thread(target=run, name="thread-sampler", daemon=True).start()
        return answer

    @rpc
    def ping(self) -> str:
        return "pong"

    # -- carrying out the core's actions (main thread) --------------------------------------------
    def _carry_out(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, OfferSlot):
                self._io.submit(self._offer, action)
            elif isinstance(action, StartTask):
                self._start_task(action)
            elif isinstance(action, CancelTask):
                task = self.tasks.get(action.attempt_id)
                if task is not None:
                    task.cancel()
                    if action.watch:
                        self._watch_cancellation(task)
            elif isinstance(action, ReleasePartitions):
                self.partitions.release_all(action.covers, blocking=not action.pipelined_only)
                if action.pipelined_only and not action.partition_ids:  # the job's last slot here went
                    release_local_state(self.work_dir, str(action.job_id))
                    self._io.submit(self._artifacts.release_unused)
            elif isinstance(action, SendHeartbeat):
                self._io.submit(self._send_jm_heartbeat, action)
            elif isinstance(action, CloseJobMasterConnection):
                for key in [k for k in self._jms if k[1] == action.job_id]:
                    self._jms.pop(key).close()

    def _jm(self, address: str, job_id: JobID) -> RemoteJobMasterGateway:
        """The gateway to the JobMaster of ``job_id`` at ``address`` (its own service there)."""
        gw = self._jms.get((address, job_id))
        if gw is None:
            gw = self._jms[(address, job_id)] = RemoteJobMasterGateway(address, self._rpc_timeout,
                                                                       service=job_master_service(job_id), tls=self._tls)
        return gw

    def _offer(self, action: OfferSlot) -> None:
        """(an I/O thread)"""
        job_id, token = action.job_id, action.token
        try:
            accepted = self._main.call(self._jm, action.address, job_id).offer_slots(
                token, job_id, self.resource_id, [action.offer])
        except RpcError as exc:
            log.warning("offering slot %s to the JobMaster of %s failed: %s", action.offer.allocation_id, job_id, exc)
            accepted = []
        else:
            self._main.execute(self.jobs.heard_from, job_id, token)
        self._main.execute(lambda: self._carry_out(self.core.offer_answered(action.offer, bool(accepted))))

    def _start_task(self, action: StartTask) -> None:
        tdd = action.tdd
        task = Task(tdd, resource_id=self.resource_id, artifacts=self._artifacts, partitions=self.partitions,
                    data_client=self._data_client,
                    on_state=lambda u: self._updates.submit(self._send_update, u),
                    location=f"TaskExecutor {self.resource_id} (pid {os.getpid()} on {socket.gethostname()})",
                    request_split=self._split_requester(tdd, lambda: task._cancelled.is_set()),
                    read_artifact=self._artifact_reader(tdd, lambda: task._cancelled.is_set()),
                    checkpoints=JobMasterResponder(self, tdd.job_id, tdd.execution_attempt_id),
                    memory=self.memory, slot_index=action.slot_index, spill_roots=self.spill_roots,
                    spark_master=self.spark_masters)
        self.tasks[tdd.execution_attempt_id] = task
        log.info("deploying %s (%s)", tdd.display_name, tdd.execution_attempt_id)
        task.start()

    def _task_done(self, update: TaskExecutionStateUpdate) -> None:
        task = self.tasks.pop(update.execution_attempt_id, None)
        if task is not None:
            self._remember_ended(task, update)
        self.core.task_ended(update)
        if not self.tasks:  # nothing runs here now: what the tasks freed goes back to the system,
            self._tasks_ended += 1  # once no task has run for a while
            self._main.schedule(IDLE_RELEASE_MS, functools.partial(self._release_if_idle, self._tasks_ended))

    def _release_if_idle(self, idle: int) -> None:
        """(main thread) No task started or ended since the last one ended ``IDLE_RELEASE_MS``
        ago: release free memory, on a pool thread. (Right at a task's end, the collection held
        the interpreter for ~25 ms while the task's FINISHED went out and the next region's
        tasks came in: most of a small job's time.)"""
        if not self.tasks and idle == self._tasks_ended:
            self._io.submit(release_free_memory)

    def _watch_cancellation(self, task: Task) -> None:
        """Flink's task cancellation watchdog: a task thread stuck in user code cannot be
        stopped from outside, and it holds its slot; after task.cancellation.timeout the
        TaskExecutor gives up its process so the slot is truly freed (the ResourceManager
        sees the exit and replaces it)."""
        timeout = self.config[Options.TASK_CANCELLATION_TIMEOUT]
        if timeout <= 0:
            return

        def check() -> None:
            if task.alive and not self._stopped.is_set():
                log.error("%s did not stop within %d ms of its cancellation (task.cancellation.timeout): "
                          "ending this TaskExecutor", task.tdd.display_name, timeout)
                self.fatal = True
                threading.Thread(target=self.shutdown, name="te-shutdown", daemon=True, args=(
                    f"{task.tdd.display_name} did not stop after its cancellation",)).start()

        self._main.schedule(timeout, check)
