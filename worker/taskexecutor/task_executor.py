"""The TaskExecutor shell: registers with the ResourceManager, heartbeats, keeps the slot
table, offers slots to JobMasters, runs tasks and reports their states.

Every ``heartbeat.interval`` it also sends each job's JobMaster a heartbeat (Flink's JobMaster
<-> TaskExecutor heartbeat) with the job's tasks and slots here, and acts on the answer (the
JobMaster's allocated-slot report): an ACTIVE slot of the job that the JobMaster no longer lists
is freed; a JobMaster that answers NOT_FOUND or FENCING, or that stays silent for
``heartbeat.timeout``, is gone, and the job's slots, tasks and partitions here are freed.
A task's final update is kept until the JobMaster acknowledges it (see ``job_table``).

Fencing: calls from a JobMaster (submitTask, cancelTask, freeSlot, releasePartitions,
triggerCheckpoint, notifyCheckpointComplete/Aborted) must carry the token of the job's JobMaster as last named by a slot request; any other token is
refused, also once the slot or the task is gone.

State lives on the main thread (``MainThreadExecutor``); blocking calls to the AppMaster run
on helper threads and post their outcome back. When no ResourceManager has answered for
``taskmanager.registration.timeout`` the TaskExecutor shuts itself down: it never lingers as
an orphan after its AppMaster is gone.

Leader retrieval (``common/ha``): the TaskExecutor follows the cluster's leader (with ZooKeeper
HA it is looked up there; otherwise it is ``rm_address``). When another AppMaster becomes leader,
everything of the old leader's jobs here goes (tasks cancelled, slots freed, partitions
released: their JobMasters are deposed and the new leader restarts the jobs from their
checkpoints) and the TaskExecutor registers with the new ResourceManager.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from yarnflow.common.clock import SystemClock
from yarnflow.common.config import Configuration, Options
from yarnflow.common.ha import HighAvailabilityServices, LeaderInformation, create_ha_services
from yarnflow.common.errors import (FencingTokenError, NotFoundError, RefusedError, RpcConnectionError, RpcError,
                                    RpcTimeoutError, UnavailableError)
from yarnflow.common.ids import AllocationID, ExecutionAttemptID, JobID, ResourceID
from yarnflow.common.messages import (
    AllocatedSlotReport,
    ResourceProfile,
    SlotOffer,
    SlotReport,
    TaskDeploymentDescriptor,
    TaskExecutionStateUpdate,
    TaskStateSnapshot,
    TaskExecutorHeartbeatPayload,
    TaskExecutorRegistration,
)
from yarnflow.common.rpc.endpoint import UNFENCED, Expected, MainThreadExecutor, RpcEndpoint, fenced, rpc
from yarnflow.common.rpc.gateways import (
    TASK_EXECUTOR,
    RemoteJobMasterGateway,
    RemoteResourceManagerGateway,
    TaskExecutorServiceHandler,
    job_master_service,
)
from yarnflow.common.rpc.server import RpcServer
from yarnflow.common.artifacts import ArtifactCache
from yarnflow.worker.memory.manager import MemoryManager, managed_memory_bytes
from yarnflow.worker.memory.spill import remove_orphan_spills, spill_roots
from yarnflow.worker.metrics import start_task_executor_metrics
from yarnflow.worker.network.client import DataClient
from yarnflow.worker.network.flight import DataServer
from yarnflow.worker.network.partition import ResultPartitionManager
from yarnflow.worker.state.localdir import set_default_base
from yarnflow.worker.task import Task
from yarnflow.worker.taskexecutor.job_table import JobMasterConnection, JobTable, slots_to_free
from yarnflow.worker.taskexecutor.slot_table import SlotState, SlotTable
from yarnflow.worker.taskexecutor.spark_masters import SparkMasters

log = logging.getLogger(__name__)


def _rm_token(te: TaskExecutor, *args: object) -> Expected:
    return te._rm_token or None


def _slot_token(te: TaskExecutor, allocation_id: AllocationID, *args: object) -> Expected:
    slot = te.slots.get(allocation_id)
    if slot is None:
        return te.jobs.expected_token(te.jobs.job_of(allocation_id))
    return te.jobs.expected_token(slot.job_id, slot.jobmaster_token)


def _task_token(te: TaskExecutor, attempt_id: ExecutionAttemptID, *args: object) -> Expected:
    task = te.tasks.get(attempt_id)
    if task is None:
        return te.jobs.expected_token(te.jobs.job_of(attempt_id))
    return te.jobs.expected_token(task.tdd.job_id, task.tdd.jobmaster_fencing_token)


def _deployment_token(te: TaskExecutor, tdd: TaskDeploymentDescriptor) -> Expected:
    slot = te.slots.get(tdd.allocation_id)
    if slot is not None and slot.job_id != tdd.job_id:
        return None
    return te.jobs.expected_token(tdd.job_id, slot.jobmaster_token if slot is not None else None)


def _job_token(te: TaskExecutor, job_id: JobID, *args: object) -> Expected:
    """A job this TaskExecutor never served has nothing here to protect: not fenced."""
    return te.jobs.expected_token(job_id) if te.jobs.token_of(job_id) is not None else UNFENCED


class TaskExecutor(RpcEndpoint):
    def __init__(self, config: Configuration, resource_id: ResourceID, rm_address: str, work_dir: str,
                 ha: HighAvailabilityServices | None = None) -> None:
        self.config = config
        self.resource_id = resource_id
        self._rm_address = rm_address
        self._ha = ha or create_ha_services(config, leader_address=rm_address)
        self._retrieval = self._ha.leader_retrieval()
        self._leader_session = ""
        self._old_rms: list[RemoteResourceManagerGateway] = []
        self._rpc_timeout = config[Options.RPC_TIMEOUT]
        self._registration_timeout_ms = config[Options.TM_REGISTRATION_TIMEOUT]
        self._heartbeat_ms = config[Options.HEARTBEAT_INTERVAL]
        self.jobs = JobTable(SystemClock(), config[Options.HEARTBEAT_TIMEOUT])
        self._jm_heartbeats_in_flight: set[JobID] = set()
        host = config[Options.TM_HOST]
        num_slots = config[Options.NUM_SLOTS]
        profile = ResourceProfile(config[Options.TM_CPU] / num_slots,
                                  config[Options.TM_MEMORY] // (1 << 20) // num_slots)
        self.slots = SlotTable(num_slots, profile)
        self._main = MainThreadExecutor(f"taskexecutor-{resource_id}")
        super().__init__(f"TaskExecutor {resource_id}", self._main)
        self._io = ThreadPoolExecutor(4, thread_name_prefix="te-io")
        self._updates = ThreadPoolExecutor(1, thread_name_prefix="te-updates")  # keeps per-task order
        self.partitions = ResultPartitionManager(os.path.join(work_dir, "partitions"))
        self._data_server = DataServer(host, self.partitions, segment_size=config[Options.SEGMENT_SIZE])
        self._data_client = DataClient()
        self._artifacts = ArtifactCache(os.path.join(work_dir, "artifacts"))
        set_default_base(work_dir)  # RocksDB state backends work here unless the job names a localdir
        self.memory = MemoryManager(managed_memory_bytes(config), num_slots)
        self.spill_roots = spill_roots(config[Options.TMP_DIRS], work_dir)
        remove_orphan_spills(self.spill_roots)  # of TaskExecutors that were killed
        self._rpc = RpcServer(host, 0, {TASK_EXECUTOR: TaskExecutorServiceHandler(self).processor()},
                              name=f"taskexecutor-{resource_id}")
        self._rm: RemoteResourceManagerGateway | None = (RemoteResourceManagerGateway(rm_address, self._rpc_timeout)
                                                         if rm_address else None)  # None: no leader known yet
        self._jms: dict[tuple[str, JobID], RemoteJobMasterGateway] = {}
        self.tasks: dict[ExecutionAttemptID, Task] = {}
        self._rm_token = ""
        self._registration_id = ""
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
        self._retrieval.start(self._on_leader)
        threading.Thread(target=self._heartbeat_loop, name="te-heartbeat", daemon=True).start()
        threading.Thread(target=self._jm_heartbeat_loop, name="te-jm-heartbeat", daemon=True).start()
        self.metrics_endpoint = start_task_executor_metrics(self)
        log.info("TaskExecutor %s started: rpc %s, data %s, %d slots, %.0f MB of managed memory (%.0f MB a slot), "
                 "spill files in %s", self.resource_id, self._rpc.address, self._data_server.address, self._num_slots,
                 self.memory.total_bytes / 2**20, self.memory.slot_bytes / 2**20, ", ".join(self.spill_roots))
        return self

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def shutdown(self, reason: str) -> None:
        if self._stopped.is_set():
            return
        self.exit_reason = reason
        log.info("TaskExecutor %s shutting down: %s", self.resource_id, reason)
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
        for job_id in sorted({*(c.job_id for c in self.jobs.connections()),
                              *(s.job_id for s in self.slots.slots if s.job_id is not None)}):
            self._job_master_gone(job_id, "the AppMaster that led its job lost the leadership")
        self._leader_session = leader.session_id
        if not same_address:
            if self._rm is not None:
                self._old_rms.append(self._rm)
            self._rm = RemoteResourceManagerGateway(leader.address, self._rpc_timeout)
            self._rm_address = leader.address
        self._rm_token = ""
        self._registration_id = ""
        self._last_rm_contact = time.monotonic()
        self._rm_changed.set()

    def _registration(self) -> TaskExecutorRegistration:
        return TaskExecutorRegistration(self.resource_id, self._rpc.address, self._data_server.address,
                                        self._num_slots, self._profile, os.getpid(), socket.gethostname())

    def _heartbeat_loop(self) -> None:
        """Register, then heartbeat; gives up after the registration timeout without contact."""
        while not self._stopped.is_set():
            rm = self._rm
            try:
                if rm is None:
                    raise UnavailableError("no leader is known yet")
                if not self._registration_id:
                    while self._old_rms:  # gateways of earlier leaders: nobody uses them any more
                        self._old_rms.pop().close()
                    resp = rm.register_task_executor(self._registration())
                    if not resp.accepted:
                        raise RefusedError(resp.reason)
                    self._main.call(self._on_registered, resp.fencing_token, resp.registration_id)
                    log.info("registered at the ResourceManager %s", self._rm_address)
                    self._last_rm_contact = time.monotonic()
                    continue  # report the slots at once: the ResourceManager hands them out only after that
                else:
                    report = self._main.call(self._slot_report)
                    rm.heartbeat_from_task_executor(self._rm_token, self._registration_id, report)
                self._last_rm_contact = time.monotonic()
            except (RefusedError, FencingTokenError, NotFoundError) as exc:
                log.info("ResourceManager does not know this TaskExecutor (%s): registering again", exc)
                self._registration_id = ""
                self._last_rm_contact = time.monotonic()
                continue
            except (RpcError, UnavailableError) as exc:
                silent_ms = (time.monotonic() - self._last_rm_contact) * 1000
                log.warning("cannot reach the ResourceManager at %s for %.0f ms: %s", self._rm_address,
                            silent_ms, exc)
                if silent_ms > self._registration_timeout_ms:
                    threading.Thread(target=self.shutdown, name="te-shutdown", daemon=True, args=(
                        f"no ResourceManager answered for {silent_ms / 1000:.1f} s "
                        f"(taskmanager.registration.timeout)",)).start()
                    return
            if self._rm_changed.wait(self._heartbeat_ms / 1000.0):
                self._rm_changed.clear()

    def _slot_report(self) -> SlotReport:
        report = self.slots.report()
        return SlotReport(report.slots, len(self.partitions.blocking_partitions()))

    def _on_registered(self, token: str, registration_id: str) -> None:
        self._rm_token, self._registration_id = token, registration_id

    # -- TaskExecutorService (over RPC, on the main thread; fenced by RpcEndpoint) -------------
    @fenced(_rm_token)
    def request_slot(self, slot_index: int, job_id: JobID, allocation_id: AllocationID, profile: ResourceProfile,
                     jobmaster_address: str, jobmaster_token: str) -> None:
        if self.slots.allocate(slot_index, job_id, allocation_id, jobmaster_address, jobmaster_token):
            self.jobs.connect(job_id, jobmaster_address, jobmaster_token)
            log.info("slot %d allocated to %s of job %s", slot_index, allocation_id, job_id)
            slot = self.slots.get(allocation_id)
            assert slot is not None
            offer = SlotOffer(allocation_id, slot_index, slot.profile)
            self._io.submit(self._offer, job_id, jobmaster_address, jobmaster_token, offer)

    def _jm(self, address: str, job_id: JobID) -> RemoteJobMasterGateway:
        """The gateway to the JobMaster of ``job_id`` at ``address`` (its own service there)."""
        gw = self._jms.get((address, job_id))
        if gw is None:
            gw = self._jms[(address, job_id)] = RemoteJobMasterGateway(address, self._rpc_timeout,
                                                                       service=job_master_service(job_id))
        return gw

    def _disconnect_job(self, job_id: JobID) -> None:
        self.jobs.disconnect(job_id)
        for key in [k for k in self._jms if k[1] == job_id]:
            self._jms.pop(key).close()

    def _offer(self, job_id: JobID, address: str, token: str, offer: SlotOffer) -> None:
        try:
            accepted = self._main.call(self._jm, address, job_id).offer_slots(token, job_id, self.resource_id, [offer])
        except RpcError as exc:
            log.warning("offering slot %s to the JobMaster of %s failed: %s", offer.allocation_id, job_id, exc)
            accepted = []
        else:
            self._main.execute(self.jobs.heard_from, job_id, token)
        self._main.execute(self._on_offer_result, offer, bool(accepted))

    def _on_offer_result(self, offer: SlotOffer, accepted: bool) -> None:
        slot = self.slots.get(offer.allocation_id)
        if slot is None:
            return  # freed meanwhile
        if accepted:
            self.slots.mark_active(offer.allocation_id)
        else:
            log.info("slot offer %s declined: freeing it", offer.allocation_id)
            self._free_slot_now(offer.allocation_id, "its offer was declined")

    @fenced(_deployment_token)
    def submit_task(self, tdd: TaskDeploymentDescriptor) -> None:
        slot = self.slots.get(tdd.allocation_id)
        if slot is None:
            raise NotFoundError(f"no slot for allocation {tdd.allocation_id} on {self.resource_id}")
        if tdd.execution_attempt_id in self.tasks:
            return  # duplicate: already running
        self.slots.mark_active(tdd.allocation_id)  # (the offer's answer may still be on its way)
        self.slots.add_task(tdd.allocation_id, tdd.execution_attempt_id)
        address, token = slot.jobmaster_address, slot.jobmaster_token
        task = Task(tdd, resource_id=self.resource_id, artifacts=self._artifacts, partitions=self.partitions,
                    data_client=self._data_client,
                    on_state=lambda u: self._updates.submit(self._send_update, address, token, u),
                    location=f"TaskExecutor {self.resource_id} (pid {os.getpid()} on {socket.gethostname()})",
                    request_split=lambda last_checkpoint_id: self._main.call(self._jm, address, tdd.job_id).request_split(
                        token, tdd.job_id, tdd.vertex_id, tdd.subtask_index, tdd.execution_attempt_id,
                        last_checkpoint_id),
                    checkpoints=_JobMasterResponder(self, address, token, tdd.job_id, tdd.execution_attempt_id),
                    memory=self.memory, slot_index=slot.index, spill_roots=self.spill_roots,
                    spark_master=self.spark_masters)
        self.tasks[tdd.execution_attempt_id] = task
        log.info("deploying %s (%s)", tdd.display_name, tdd.execution_attempt_id)
        task.start()

    def _send_update(self, address: str, token: str, update: TaskExecutionStateUpdate) -> None:
        """Report a state change (on the updates thread, in order). A final update is kept
        until acknowledged: when every try here fails, the next heartbeat carries it."""
        if update.state.is_terminal:
            self._main.execute(self._task_done, update)
        for attempt in range(3):
            if self._stopped.is_set():
                return
            try:
                self._main.call(self._jm, address, update.job_id).update_task_execution_state(token, update)
            except (FencingTokenError, NotFoundError) as exc:
                # a definite answer: that JobMaster does not want it (the heartbeat will tell
                # whether the job is gone)
                log.debug("JobMaster ignored %s: %s", update.state.name, exc)
            except RpcError as exc:
                log.warning("reporting %s of %s failed (try %d): %s", update.state.name,
                            update.execution_attempt_id, attempt + 1, exc)
                time.sleep(0.2 * (attempt + 1))
                continue
            else:
                self._main.execute(self.jobs.heard_from, update.job_id, token)
            if update.state.is_terminal:
                self._main.execute(self.jobs.acknowledged, update.job_id, [update.execution_attempt_id])
            return
        if update.state.is_terminal:
            log.info("%s of %s not delivered: the next heartbeat to the JobMaster of job %s carries it",
                     update.state.name, update.execution_attempt_id, update.job_id)

    def _task_done(self, update: TaskExecutionStateUpdate) -> None:
        self.jobs.task_ended(update)
        self.tasks.pop(update.execution_attempt_id, None)
        self.slots.remove_task(update.execution_attempt_id)

    @fenced(_task_token)
    def cancel_task(self, attempt_id: ExecutionAttemptID) -> None:
        task = self.tasks.get(attempt_id)
        if task is None:
            log.debug("cancel of unknown task %s ignored", attempt_id)
            return
        task.cancel()
        self._watch_cancellation(task)

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

    @fenced(_slot_token)
    def free_slot(self, allocation_id: AllocationID, reason: str) -> None:
        self._free_slot_now(allocation_id, reason)

    def _free_slot_now(self, allocation_id: AllocationID, reason: str) -> None:
        """Cancel the slot's tasks and free it; with the job's last slot go its pipelined
        partitions (blocking ones stay until the JobMaster releases them)."""
        slot = self.slots.get(allocation_id)
        if slot is None:
            return
        job_id = slot.job_id
        for attempt in list(slot.tasks):
            task = self.tasks.get(attempt)
            if task is not None:
                task.cancel()
                self._watch_cancellation(task)
        self.slots.free(allocation_id)
        if job_id is not None:
            self.jobs.retire(allocation_id, job_id)
        log.info("freed slot of %s (%s)", allocation_id, reason)
        if job_id is not None and job_id not in self.slots.jobs():
            self.partitions.release_all(lambda pid: pid.startswith(f"{job_id}."), blocking=False)

    @fenced(_task_token)
    def trigger_checkpoint(self, attempt_id: ExecutionAttemptID, checkpoint_id: int, timestamp_ms: int,
                           exactly_once: bool, stop: str = "", aligned_timeout_ms: int = -1) -> None:
        """Hand checkpoint ``checkpoint_id`` to the task (its mailbox). NotFoundError when the
        attempt is not running here."""
        self._running(attempt_id, f"triggerCheckpoint {checkpoint_id}").trigger_checkpoint(
            checkpoint_id, timestamp_ms, exactly_once, stop, aligned_timeout_ms)

    @fenced(_task_token)
    def notify_checkpoint_complete(self, attempt_id: ExecutionAttemptID, checkpoint_id: int) -> None:
        self._running(attempt_id, f"notifyCheckpointComplete {checkpoint_id}").notify_checkpoint(
            checkpoint_id, complete=True)

    @fenced(_task_token)
    def notify_checkpoint_aborted(self, attempt_id: ExecutionAttemptID, checkpoint_id: int) -> None:
        self._running(attempt_id, f"notifyCheckpointAborted {checkpoint_id}").notify_checkpoint(
            checkpoint_id, complete=False)

    def _running(self, attempt_id: ExecutionAttemptID, call: str) -> Task:
        task = self.tasks.get(attempt_id)
        if task is None:
            raise NotFoundError(f"{call}: task {attempt_id} is not running on TaskExecutor {self.resource_id}")
        return task

    @fenced(_job_token)
    def release_partitions(self, job_id: JobID, partition_ids: list[str]) -> None:
        """Blocking partitions are released by the JobMaster when no consumer needs them."""
        if self.jobs.token_of(job_id) is None:
            log.debug("releasePartitions of job %s, unknown here, ignored", job_id)
            return
        prefix = f"{job_id}."
        wanted = set(partition_ids)
        self.partitions.release_all(lambda pid: pid.startswith(prefix) and (not wanted or pid in wanted))

    # -- JobMaster heartbeats ---------------------------------------------------------------
    def _jm_heartbeat_loop(self) -> None:
        while not self._stopped.wait(self._heartbeat_ms / 1000.0):
            try:
                beats = self._main.call(self._jm_heartbeats_due, timeout=10)
            except Exception:  # noqa: BLE001 - stopping, or the main thread is busy: next round
                log.debug("JobMaster heartbeat round skipped", exc_info=True)
                continue
            for conn, payload, active in beats:
                try:
                    self._io.submit(self._send_jm_heartbeat, conn.job_id, conn.address, conn.token, payload, active)
                except RuntimeError:  # the pool is shut down
                    return

    def _jm_heartbeats_due(self) -> list[tuple[JobMasterConnection, TaskExecutorHeartbeatPayload, set[AllocationID]]]:
        """One heartbeat per connected job that still has slots, tasks, partitions or final
        updates here; jobs with none are disconnected, silent JobMasters are given up."""
        for conn in self.jobs.timed_out():
            self._job_master_gone(conn.job_id, f"its JobMaster at {conn.address} did not answer for "
                                               f"{self.jobs.silent_ms(conn) / 1000:.1f} s (heartbeat.timeout)")
        beats = []
        for conn in self.jobs.connections():
            job_id = conn.job_id
            slots = [s for s in self.slots.slots if s.job_id == job_id and s.allocation_id is not None]
            tasks = [t for t in self.tasks.values() if t.tdd.job_id == job_id]
            unacked = self.jobs.unacknowledged(job_id)
            prefix = f"{job_id}."
            has_partitions = any(pid.startswith(prefix) for pid in self.partitions.partition_ids())
            if not (slots or tasks or unacked or has_partitions):
                log.info("job %s has nothing left on this TaskExecutor: disconnecting from its JobMaster", job_id)
                self._disconnect_job(job_id)
                continue
            if job_id in self._jm_heartbeats_in_flight:
                continue
            finals = {u.execution_attempt_id: u for u in unacked}
            # a task that just ended is reported by its final update (with its error), not here
            executions = [t.state_update() for t in tasks
                          if not t.state.is_terminal and t.attempt_id not in finals] + list(finals.values())
            payload = TaskExecutorHeartbeatPayload(self.resource_id, executions,
                                                   [s.allocation_id for s in slots if s.allocation_id is not None])
            active = {s.allocation_id for s in slots if s.state == SlotState.ACTIVE and s.allocation_id is not None}
            self._jm_heartbeats_in_flight.add(job_id)
            beats.append((conn, payload, active))
        return beats

    def _send_jm_heartbeat(self, job_id: JobID, address: str, token: str, payload: TaskExecutorHeartbeatPayload,
                           active: set[AllocationID]) -> None:
        try:
            report = self._main.call(self._jm, address, job_id).heartbeat_from_task_executor(token, job_id, payload)
        except (NotFoundError, FencingTokenError) as exc:
            kind = "does not know the job" if isinstance(exc, NotFoundError) else "refused the token"
            self._main.execute(self._on_jm_heartbeat_refused, job_id, token,
                               f"its JobMaster at {address} {kind}: {exc}")
            return
        except (RpcConnectionError, RpcTimeoutError, UnavailableError) as exc:
            log.warning("heartbeat to the JobMaster of job %s at %s failed: %s", job_id, address, exc)
            self._main.execute(self._jm_heartbeat_done, job_id)
            return
        except RpcError as exc:  # it answered, with an error of its own: alive, but no report
            log.warning("the JobMaster of job %s at %s failed to handle a heartbeat: %s", job_id, address, exc)
            self._main.execute(self._on_jm_heartbeat_answered, job_id, token, payload, active, None)
            return
        except Exception:  # a bug here must not stop this job's heartbeats for good
            log.exception("heartbeat to the JobMaster of job %s failed", job_id)
            self._main.execute(self._jm_heartbeat_done, job_id)
            return
        self._main.execute(self._on_jm_heartbeat_answered, job_id, token, payload, active, report)

    def _jm_heartbeat_done(self, job_id: JobID) -> None:
        self._jm_heartbeats_in_flight.discard(job_id)

    def _on_jm_heartbeat_refused(self, job_id: JobID, token: str, reason: str) -> None:
        self._jm_heartbeat_done(job_id)
        conn = self.jobs.connection(job_id)
        if conn is None or conn.token != token:
            return  # a newer JobMaster took over meanwhile
        self._job_master_gone(job_id, reason)

    def _on_jm_heartbeat_answered(self, job_id: JobID, token: str, payload: TaskExecutorHeartbeatPayload,
                                  active: set[AllocationID], report: AllocatedSlotReport | None) -> None:
        self._jm_heartbeat_done(job_id)
        if not self.jobs.heard_from(job_id, token) or report is None:
            return
        self.jobs.acknowledged(job_id, [u.execution_attempt_id for u in payload.executions if u.state.is_terminal])
        for allocation_id in sorted(slots_to_free(active, report.allocation_ids)):
            slot = self.slots.get(allocation_id)
            if slot is None or slot.state != SlotState.ACTIVE or slot.job_id != job_id:
                continue
            log.info("freeing slot %d (%s) of job %s: its JobMaster no longer lists it", slot.index,
                     allocation_id, job_id)
            self._free_slot_now(allocation_id, "not in the JobMaster's allocated-slot report")

    def _job_master_gone(self, job_id: JobID, reason: str) -> None:
        """The job's JobMaster is gone: cancel the job's tasks, free its slots, release its
        partitions and forget its final updates."""
        log.info("job %s: freeing its slots, tasks and partitions here: %s", job_id, reason)
        self._disconnect_job(job_id)
        for slot in list(self.slots.slots):
            if slot.job_id == job_id and slot.allocation_id is not None:
                self._free_slot_now(slot.allocation_id, reason)
        for task in list(self.tasks.values()):
            if task.tdd.job_id == job_id:
                task.cancel()
        self.partitions.release_all(lambda pid: pid.startswith(f"{job_id}."))

    @fenced(_rm_token)
    def disconnect_resource_manager(self, reason: str) -> None:
        if reason.startswith("shutdown"):
            threading.Thread(target=self.shutdown, args=(f"the ResourceManager asked: {reason}",),
                             daemon=True).start()
        else:
            self._registration_id = ""

    @rpc
    def ping(self) -> str:
        return "pong"


class _JobMasterResponder:
    """A task's checkpoint answers, to its JobMaster (called on the task's writer thread)."""

    def __init__(self, te: TaskExecutor, address: str, token: str, job_id: JobID,
                 attempt_id: ExecutionAttemptID) -> None:
        self._te, self._address, self._token = te, address, token
        self._job_id, self._attempt_id = job_id, attempt_id

    def _gateway(self) -> RemoteJobMasterGateway:
        return self._te._main.call(self._te._jm, self._address, self._job_id)

    def acknowledge(self, checkpoint_id: int, snapshot: TaskStateSnapshot) -> None:
        self._gateway().acknowledge_checkpoint(self._token, self._job_id, self._attempt_id, checkpoint_id, snapshot)

    def decline(self, checkpoint_id: int, reason: str) -> None:
        self._gateway().decline_checkpoint(self._token, self._job_id, self._attempt_id, checkpoint_id, reason)
