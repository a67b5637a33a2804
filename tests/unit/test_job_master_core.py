"""The JobMaster core driven by hand: events in, actions out, a manual clock and timers. No
sockets, threads or sleeps. Each control-plane failure path gets its case here."""

from __future__ import annotations


from typing import Any

import pytest

from yarnflow.am.jobmaster.actions import (
    CancelSlotRequest,
    CancelTask,
    DeployTask,
    FreeSlot,
    JobReachedTerminalState,
    ReleasePartitions,
    RequestSlot,
    ReturnAllocation,
)
from yarnflow.am.jobmaster.job_master_core import JobMasterCore
from yarnflow.common.clock import ManualClock, ManualTimerService
from yarnflow.common.config import Configuration
from yarnflow.common.errors import IllegalStateTransition
from yarnflow.common.ids import JobID, JobVertexID, ResourceID
from yarnflow.common.messages import (
    ErrorInfo,
    JobEdge,
    JobGraph,
    JobVertex,
    ResourceProfile,
    SlotOffer,
    TaskExecutionStateUpdate,
)
from yarnflow.common.states import ExchangeMode, ExecutionState, JobStatus, Partitioner

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

S = ExecutionState
JOB = JobID("job-core")


def vertex(name: str, parallelism: int, *, source: bool = False, memory_mb: int = 0) -> JobVertex:
    return JobVertex(JobVertexID(f"v-{name}"), name, parallelism, 128, [name], "default",
                     ResourceProfile(0, memory_mb), is_source=source)


def pipeline(parallelism: int = 2, mode: str = "STREAMING") -> JobGraph:
    """src --hash--> sink, pipelined (one region) or blocking (BATCH: two regions)."""
    src, sink = vertex("src", parallelism, source=True), vertex("sink", parallelism)
    exchange = ExchangeMode.BLOCKING if mode == "BATCH" else ExchangeMode.PIPELINED
    return JobGraph(JOB, "pipeline", [src, sink],
                    [JobEdge(src.vertex_id, sink.vertex_id, Partitioner.HASH, exchange, ["k"])],
                    artifact_uri="file:///job.zip", runtime_mode=mode)


_KEYS = {"restart_strategy_type": "restart-strategy.type",
         "restart_strategy_fixed_delay_attempts": "restart-strategy.fixed-delay.attempts",
         "restart_strategy_fixed_delay_delay": "restart-strategy.fixed-delay.delay",
         "jobmanager_execution_failover_strategy": "jobmanager.execution.failover-strategy",
         "slot_idle_timeout": "slot.idle.timeout", "heartbeat_timeout": "heartbeat.timeout",
         "execution_checkpointing_interval": "execution.checkpointing.interval"}


class Driver:
    """A JobMasterCore with a manual clock, a manual timer service and a fake cluster: slot
    requests are answered by ``offer_all`` from TaskExecutors te-0, te-1, ..."""

    def __init__(self, job_graph: JobGraph, **conf: str) -> None:
        self.clock = ManualClock(1_000_000)
        self.timers = ManualTimerService(self.clock)
        settings = {"slot.request.timeout": "10 s", "heartbeat.interval": "1 s", "heartbeat.timeout": "10 min",
                    "slot.idle.timeout": "60 s"}
        settings.update({_KEYS[k]: v for k, v in conf.items()})
        self.config = Configuration.load(settings)
        self.core = JobMasterCore(job_graph, self.config, "127.0.0.1:1", "jm-token", "file:///tmp/job",
                                  self.clock, self.timers)
        self.actions: list[Any] = []
        self.offered = 0

    def drain(self) -> list[Any]:
        new = self.core.drain_actions()
        self.actions.extend(new)
        return new

    def start(self) -> list[Any]:
        self.core.start()
        return self.drain()

    def advance(self, ms: int) -> list[Any]:
        self.timers.advance(ms)
        return self.drain()

    def of(self, kind: type, actions: list[Any] | None = None) -> list[Any]:
        return [a for a in (self.actions if actions is None else actions) if isinstance(a, kind)]

    def open_requests(self) -> list[Any]:
        cancelled = {a.allocation_id for a in self.of(CancelSlotRequest)}
        offered = getattr(self, "_offered_ids", set())
        return [a.request for a in self.of(RequestSlot)
                if a.request.allocation_id not in cancelled and a.request.allocation_id not in offered]

    def offer_all(self, te: str | None = None, profile: ResourceProfile | None = None) -> list[Any]:
        self._offered_ids = getattr(self, "_offered_ids", set())
        for request in self.open_requests():
            rid = ResourceID(te or f"te-{self.offered}")
            self.core.slots_offered(rid, f"{rid}:6000", f"{rid}:7000",
                                    [SlotOffer(request.allocation_id, 0, profile or ResourceProfile(1.0, 1024))])
            self._offered_ids.add(request.allocation_id)
            self.offered += 1
        return self.drain()

    def report(self, deploy: DeployTask, state: ExecutionState, error: ErrorInfo | None = None) -> bool:
        applied = self.core.task_state_changed(TaskExecutionStateUpdate(JOB, deploy.attempt_id, state, error))
        self.drain()
        return applied

    def run_all(self, deploys: list[DeployTask]) -> None:
        for d in deploys:
            self.report(d, S.RUNNING)

    def current_deploys(self) -> list[DeployTask]:
        """The latest DeployTask of every current attempt."""
        current = {ex.attempt_id for ex in self.core.graph.current_executions()}
        return [d for d in self.of(DeployTask) if d.attempt_id in current]

    def execution(self, deploy: DeployTask) -> Any:
        return self.core.graph.execution(deploy.attempt_id)


def started(job_graph: JobGraph, **conf: str) -> tuple[Driver, list[DeployTask]]:
    d = Driver(job_graph, **conf)
    d.start()
    deploys = d.of(DeployTask, d.offer_all())
    d.run_all(deploys)
    return d, deploys


# ---- 1. slot.request.timeout is the age of each request ----------------------------------------

def test_a_restart_shortly_before_the_first_timeout_gets_its_own_full_timeout() -> None:
    d = Driver(pipeline(1), restart_strategy_type="fixed-delay", restart_strategy_fixed_delay_attempts="3",
               restart_strategy_fixed_delay_delay="0 ms")
    d.start()
    d.run_all(d.of(DeployTask, d.offer_all()))
    d.advance(9_000)                      # the slot came at once; 9 s later its TaskExecutor dies
    d.core.task_executor_lost(ResourceID("te-0"), "killed")
    d.drain()
    d.advance(0)                          # restart after the 0 ms backoff: a new request
    assert len(d.open_requests()) == 1
    d.advance(1_500)                      # 10.5 s after the job started: the old periodic check fired here
    assert d.core.status == JobStatus.RUNNING
    assert len(d.core.failures.history()) == 1
    d.advance(8_400)                      # 9.9 s after the new request: still waiting
    assert d.core.status == JobStatus.RUNNING and len(d.core.failures.history()) == 1
    d.advance(200)                        # 10.1 s: that request timed out, and no later
    history = d.core.failures.history()
    assert len(history) == 2 and history[-1].error.error_class == "NoResourceAvailableError"
    assert "slot.request.timeout (10000 ms)" in history[-1].error.message


def test_a_request_never_met_fails_the_job_after_exactly_the_timeout_without_restarts() -> None:
    d = Driver(pipeline(2))
    d.start()
    d.advance(9_999)
    assert d.core.status == JobStatus.RUNNING
    d.advance(1)
    d.advance(0)
    assert d.core.status == JobStatus.FAILED
    assert d.core.failure_cause is not None and d.core.failure_cause.error_class == "NoResourceAvailableError"
    assert any(isinstance(a, JobReachedTerminalState) for a in d.actions)
    # its requests were withdrawn from the ResourceManager
    requested = {a.request.allocation_id for a in d.of(RequestSlot)}
    assert requested <= {a.allocation_id for a in d.of(CancelSlotRequest)}


def test_a_batch_request_waiting_for_the_jobs_own_busy_slot_does_not_time_out() -> None:
    """src (2) -> sink (2) BATCH on a cluster of one slot: the second source subtask waits
    for the first one's slot, however long that takes."""
    d = Driver(pipeline(2, "BATCH"))
    d.start()
    first = d.open_requests()[0]
    d.core.slots_offered(ResourceID("te-0"), "te-0:6000", "te-0:7000",
                         [SlotOffer(first.allocation_id, 0, ResourceProfile(1.0, 1024))])
    d._offered_ids = {first.allocation_id}
    (deploy,) = d.of(DeployTask, d.drain())
    d.report(deploy, S.RUNNING)
    d.advance(35_000)                     # 3.5 timeouts: the other request waits on the job's own slot
    assert d.core.status == JobStatus.RUNNING and not d.core.failures.history()
    d.report(deploy, S.FINISHED)          # its slot goes to the waiting subtask at once
    (second,) = [a for a in d.of(DeployTask) if a.attempt_id != deploy.attempt_id]
    assert second.tdd.allocation_id == deploy.tdd.allocation_id


# ---- 2. JobMaster <-> TaskExecutor heartbeat ----------------------------------------------------

def test_a_finished_update_lost_in_transit_is_applied_from_the_next_heartbeat() -> None:
    d, deploys = started(pipeline(1))
    by_te: dict[ResourceID, list[DeployTask]] = {}
    for dep in deploys:
        by_te.setdefault(dep.resource_id, []).append(dep)
    for rid, deps in by_te.items():  # the direct FINISHED updates never arrived
        held = d.core.task_executor_heartbeat(
            rid, [TaskExecutionStateUpdate(JOB, dep.attempt_id, S.FINISHED) for dep in deps],
            [dep.tdd.allocation_id for dep in deps])
        d.drain()
        assert held == [] or set(held) <= {dep.tdd.allocation_id for dep in deps}
    assert d.core.status == JobStatus.FINISHED


def test_a_silent_task_executor_is_lost_to_the_job_after_heartbeat_timeout() -> None:
    d, deploys = started(pipeline(1), restart_strategy_type="fixed-delay",
                         restart_strategy_fixed_delay_delay="0 ms", heartbeat_timeout="5 s")
    rid = deploys[0].resource_id
    for _ in range(8):  # heartbeats keep it alive
        d.advance(1_000)
        d.core.task_executor_heartbeat(rid, [TaskExecutionStateUpdate(JOB, x.attempt_id, S.RUNNING)
                                             for x in deploys], [deploys[0].tdd.allocation_id])
    assert all(d.execution(x).state == S.RUNNING for x in deploys)
    d.advance(5_000)
    assert d.execution(deploys[0]).state == S.RUNNING  # silent for 5 s: not yet
    d.advance(1_000)
    states = {d.execution(x).state for x in deploys}   # then it went silent for > 5 s
    assert S.FAILED in states and all(state.is_terminal for state in states)
    assert "no heartbeat" in d.core.failures.history()[0].error.message
    assert d.core.task_executor_heartbeat(rid, [], [deploys[0].tdd.allocation_id]) == []  # it frees its slots


def test_a_task_missing_from_two_heartbeats_in_a_row_is_failed() -> None:
    d, deploys = started(pipeline(1), restart_strategy_type="fixed-delay", restart_strategy_fixed_delay_delay="0 ms")
    rid = deploys[0].resource_id
    d.core.task_executor_heartbeat(rid, [], [deploys[0].tdd.allocation_id])
    d.drain()
    assert all(d.execution(x).state == S.RUNNING for x in deploys)  # once may be a race
    d.core.task_executor_heartbeat(rid, [], [deploys[0].tdd.allocation_id])
    d.drain()
    assert d.core.failures.history()[0].error.error_class == "TaskLostError"


def test_an_old_attempt_still_running_on_a_task_executor_is_cancelled() -> None:
    d, deploys = started(pipeline(1), restart_strategy_type="fixed-delay", restart_strategy_fixed_delay_delay="0 ms")
    d.report(deploys[0], S.FAILED, ErrorInfo("ValueError", "boom"))
    old = deploys[0]
    d.core.task_executor_heartbeat(old.resource_id, [TaskExecutionStateUpdate(JOB, old.attempt_id, S.RUNNING)], [])
    cancels = [a for a in d.of(CancelTask, d.drain()) if a.attempt_id == old.attempt_id]
    assert cancels, "a zombie attempt must be cancelled"


# ---- 3. allocated-slot report ----------------------------------------------------------------

def test_the_heartbeat_answer_lists_only_the_slots_the_job_holds_there() -> None:
    d, deploys = started(pipeline(1, "BATCH"), slot_idle_timeout="2 s")
    src = next(x for x in deploys if x.tdd.task_name == "src")
    held = d.core.task_executor_heartbeat(src.resource_id, [], [src.tdd.allocation_id])
    assert held == [src.tdd.allocation_id]
    d.report(src, S.FINISHED)              # the slot goes back to the pool (idle), still held
    sink = next(x for x in d.of(DeployTask) if x.tdd.task_name == "sink")
    d.report(sink, S.RUNNING)
    d.report(sink, S.FINISHED)
    assert d.core.status == JobStatus.FINISHED
    assert d.core.task_executor_heartbeat(src.resource_id, [], [src.tdd.allocation_id]) == []
    assert src.tdd.allocation_id in {a.allocation_id for a in d.of(ReturnAllocation)}


# ---- 4. a failed or timed-out deployment is cancelled ---------------------------------------------

def test_a_failed_deploy_call_cancels_the_attempt_on_its_task_executor() -> None:
    d = Driver(pipeline(1))
    d.start()
    (deploy, *_rest) = d.of(DeployTask, d.offer_all())
    d.core.deploy_failed(deploy.attempt_id, ErrorInfo("RpcTimeoutError", "submitTask timed out"))
    cancels = d.of(CancelTask, d.drain())
    assert deploy.attempt_id in {c.attempt_id for c in cancels}
    assert d.execution(deploy).state == S.FAILED
    assert d.core.status in (JobStatus.FAILING, JobStatus.FAILED)


def test_a_task_executor_unreachable_for_a_deployment_is_lost_to_the_job_and_not_used_again() -> None:
    """Its process is gone: every restart would otherwise deploy to its slots again until the
    heartbeat timeout, and fail, using up the restart strategy's attempts."""
    d = Driver(pipeline(2), restart_strategy_type="fixed-delay", restart_strategy_fixed_delay_delay="100 ms",
               restart_strategy_fixed_delay_attempts="2")
    d.start()
    deploys = d.of(DeployTask, d.offer_all(te="te-a"))
    d.core.deploy_failed(deploys[0].attempt_id, ErrorInfo("RpcConnectionError", "cannot reach te-a:6000"))
    d.drain()
    [failure] = d.core.failures.history()
    assert failure.error.error_class == "TaskExecutorLostError" and "could not be reached" in failure.error.message
    assert all(d.execution(x).state.is_terminal for x in deploys)
    assert not [a for a in d.of(CancelTask) if a.resource_id == ResourceID("te-a")]  # nothing sent there
    d.advance(100)                                     # the restart asks for new slots
    assert d.open_requests()
    offer = d.open_requests()[0]
    assert d.core.slots_offered(ResourceID("te-a"), "te-a:6000", "te-a:7000",
                                [SlotOffer(offer.allocation_id, 0, ResourceProfile(1.0, 1024))]) == []
    again = d.of(DeployTask, d.offer_all(te="te-b"))
    assert again and {x.resource_id for x in again} == {ResourceID("te-b")}
    assert d.core.status == JobStatus.RUNNING and len(d.core.failures.history()) == 1


def _te_1_lost_by_heartbeats() -> tuple[Driver, list[Any]]:
    """A job on te-0 and te-1 (registration reg-1); te-1 lost by its heartbeats, the region
    restarted (its new slot request open)."""
    d = Driver(pipeline(2), restart_strategy_type="fixed-delay", restart_strategy_fixed_delay_delay="100 ms")
    d.start()
    first = d.open_requests()
    for i, request in enumerate(first):
        d.core.slots_offered(ResourceID(f"te-{i}"), f"te-{i}:6000", f"te-{i}:7000",
                             [SlotOffer(request.allocation_id, 0, ResourceProfile(1.0, 1024), "reg-1")])
    d._offered_ids = {r.allocation_id for r in first}  # type: ignore[attr-defined]
    d.run_all(d.of(DeployTask, d.drain()))
    d.core.task_executor_lost(ResourceID("te-1"), "no heartbeat for 3001 ms")
    for cancel in d.of(CancelTask, d.drain()):  # the region's tasks on te-0 end
        d.core.task_state_changed(TaskExecutionStateUpdate(JOB, cancel.attempt_id, S.CANCELED))
    d.drain()
    d.advance(100)
    return d, first


def test_a_lost_task_executor_that_registered_again_is_used_again_and_a_stale_one_is_not() -> None:
    """A TaskExecutor cut off past the heartbeat timeout is lost to the job; when the partition
    heals it registers at the ResourceManager again, and the slots it offers under that new
    registration are taken. Offers under the registration the job lost stay declined, unless
    they are for a request the job waits for now (see the next test)."""
    d, first = _te_1_lost_by_heartbeats()
    [request] = d.open_requests()
    stale = SlotOffer(first[1].allocation_id, 0, ResourceProfile(1.0, 1024), "reg-1")  # (the slot it lost)
    assert d.core.slots_offered(ResourceID("te-1"), "te-1:6000", "te-1:7000", [stale]) == []
    fresh = SlotOffer(request.allocation_id, 0, ResourceProfile(1.0, 1024), "reg-2")
    assert d.core.slots_offered(ResourceID("te-1"), "te-1:6000", "te-1:7000", [fresh]) == [fresh]
    redeployed = d.of(DeployTask, d.drain())
    assert ResourceID("te-1") in {x.resource_id for x in redeployed}  # (and te-0, whose slot the job kept)


def test_a_task_executor_lost_by_heartbeats_that_offers_a_slot_the_job_waits_for_is_used_again() -> None:
    """The partition healed before the ResourceManager missed the TaskExecutor: it is still
    registered there under the registration the job lost, and the ResourceManager gives its
    slot to the job's new request. Declining it would leave that request met at the
    ResourceManager and empty here (the job waited for ever); it is taken."""
    d, _ = _te_1_lost_by_heartbeats()
    [request] = d.open_requests()
    same = SlotOffer(request.allocation_id, 0, ResourceProfile(1.0, 1024), "reg-1")
    assert d.core.slots_offered(ResourceID("te-1"), "te-1:6000", "te-1:7000", [same]) == [same]
    assert ResourceID("te-1") in {x.resource_id for x in d.of(DeployTask, d.drain())}


# ---- 5. transitions go through the tables ----------------------------------------------------------

def test_a_global_failure_during_a_restart_backoff_fails_the_job() -> None:
    d, deploys = started(pipeline(2), restart_strategy_type="fixed-delay",
                         restart_strategy_fixed_delay_delay="5 s", jobmanager_execution_failover_strategy="full")
    d.report(deploys[0], S.FAILED, ErrorInfo("ValueError", "boom"))
    for x in deploys[1:]:
        d.report(x, S.CANCELED)
    assert d.core.status == JobStatus.RESTARTING
    d.core.allocation_failed(deploys[0].tdd.allocation_id, "no TaskExecutor can hold a slot that large")
    d.drain()
    assert d.core.status == JobStatus.FAILED
    assert d.core.failure_cause is not None and "that large" in d.core.failure_cause.message
    d.advance(6_000)                       # the backoff timer fires on a failed job: nothing happens
    assert d.core.status == JobStatus.FAILED


@pytest.mark.parametrize("interval, restarts", [("10 s", True), ("", False)])
def test_with_no_restart_strategy_set_a_job_that_takes_checkpoints_restarts_and_one_that_does_not_fails(
        interval: str, restarts: bool) -> None:
    d, deploys = started(pipeline(1), execution_checkpointing_interval=interval)
    d.report(deploys[0], S.FAILED, ErrorInfo("ConnectionError", "its TaskExecutor's container was preempted"))
    for x in deploys[1:]:
        d.report(x, S.CANCELED)
    assert (d.core.status != JobStatus.FAILED, d.core.failures.restarts) == (restarts, int(restarts))
    assert "exponential-delay" in d.core.failures.describe() if restarts else d.core.status == JobStatus.FAILED


def test_failures_that_were_knock_on_effects_of_a_lost_container_name_it_as_their_cause() -> None:
    d, deploys = started(pipeline(2), restart_strategy_type="fixed-delay", restart_strategy_fixed_delay_attempts="5",
                         restart_strategy_fixed_delay_delay="1 s")
    victim = d.execution(deploys[0]).slot.resource_id
    reader = next(x for x in deploys if d.execution(x).slot.resource_id != victim)
    d.report(reader, S.FAILED, ErrorInfo("PartitionReleasedError", "subpartition released"))
    d.clock.advance(2_000)
    d.core.task_executor_lost(victim, "container container_1_0001_01_000002 failed: Container killed on "
                                      "request. Exit code is 137")
    d.drain()
    [first, *_] = d.core.failures.history()
    assert first.error.error_class == "TaskExecutorLostError"
    assert "Exit code is 137" in first.error.message and f"TaskExecutor {victim}" in first.error.message
    assert "seen first by" in first.error.message and "PartitionReleasedError: subpartition released" in first.error.message


def test_a_producers_own_failure_explains_the_knock_on_failure_its_consumer_reported_first() -> None:
    d, deploys = started(pipeline(2), restart_strategy_type="fixed-delay", restart_strategy_fixed_delay_attempts="5")
    producer = next(x for x in deploys if x.tdd.task_name == "src")
    consumer = next(x for x in deploys if x.tdd.task_name == "sink")
    wrapped = ErrorInfo("UserFunctionError", "user function in operator 'sum' raised",
                        "Traceback ...\nyarnflow.common.errors.PartitionReleasedError: subpartition p.0/0 was released\n")
    d.report(consumer, S.FAILED, wrapped)  # it arrives first: the producer released its partitions as it failed
    d.report(producer, S.FAILED, ErrorInfo("RuntimeError", "boom at row 3000", "Traceback ...\nRuntimeError: boom\n"))
    [entry] = d.core.failures.history()
    assert entry.error.error_class == "RuntimeError" and entry.error.message.startswith("boom at row 3000 (seen first")
    assert "boom" in entry.error.traceback and "UserFunctionError" in entry.error.message


def test_a_canceled_tasks_report_explains_nothing() -> None:
    d, deploys = started(pipeline(2), restart_strategy_type="fixed-delay", restart_strategy_fixed_delay_attempts="5")
    producer = next(x for x in deploys if x.tdd.task_name == "src")
    consumer = next(x for x in deploys if x.tdd.task_name == "sink")
    d.report(consumer, S.FAILED, ErrorInfo("PartitionReleasedError", "subpartition released"))
    d.report(producer, S.FAILED, ErrorInfo("TaskCancelledError", "cancelled"))
    assert [e.error.error_class for e in d.core.failures.history()] == ["PartitionReleasedError"]


def test_a_lost_container_does_not_take_the_blame_for_a_failure_of_the_users_code() -> None:
    d, deploys = started(pipeline(2), restart_strategy_type="fixed-delay", restart_strategy_fixed_delay_attempts="5")
    victim = d.execution(deploys[0]).slot.resource_id
    other = next(x for x in deploys if d.execution(x).slot.resource_id != victim)
    d.report(other, S.FAILED, ErrorInfo("ValueError", "bad row"))
    d.core.task_executor_lost(victim, "container c2 failed")
    d.drain()
    assert d.core.failures.history()[0].error.describe() == "ValueError: bad row"


def test_an_illegal_transition_raises_instead_of_being_applied() -> None:
    d, deploys = started(pipeline(1))
    ex = d.execution(deploys[0])
    with pytest.raises(IllegalStateTransition):
        ex.transition(S.SCHEDULED)
    assert ex.state == S.RUNNING


def test_a_task_that_finishes_while_it_is_cancelled_ends_canceled() -> None:
    """Flink's Execution.markFinished (issue 51): FINISHED after the cancel was sent is CANCELED."""
    d, deploys = started(pipeline(1))
    d.core.cancel()
    d.drain()
    assert {d.execution(dep).state for dep in deploys} == {S.CANCELING}
    assert d.report(deploys[0], S.FINISHED) is True
    assert d.execution(deploys[0]).state == S.CANCELED
    d.report(deploys[1], S.CANCELED)
    assert d.core.status == JobStatus.CANCELED


def test_a_running_update_while_deploying_passes_through_initializing() -> None:
    """A heartbeat carries a task's latest state: RUNNING may come without the INITIALIZING before
    it, which the attempt passes through (no DEPLOYING -> RUNNING, issue 51)."""
    d = Driver(pipeline(1))
    d.start()
    deploys = d.of(DeployTask, d.offer_all())
    assert d.report(deploys[0], S.RUNNING) is True
    ex = d.execution(deploys[0])
    assert ex.state == S.RUNNING and S.INITIALIZING in ex.timestamps


def test_a_task_canceled_on_its_own_is_a_failure_not_a_silent_state_change() -> None:
    d, deploys = started(pipeline(1))
    d.report(deploys[0], S.CANCELED)
    assert d.core.status == JobStatus.FAILING
    d.report(deploys[1], S.CANCELED)      # the other task confirms its cancellation
    assert d.core.status == JobStatus.FAILED
    assert d.core.failure_cause is not None and d.core.failure_cause.error_class == "TaskCanceledError"


# ---- 6. a lost blocking partition is named by a typed id --------------------------------------------

def test_a_consumer_naming_an_unavailable_partition_restarts_its_producer() -> None:
    d, deploys = started(pipeline(1, "BATCH"), restart_strategy_type="fixed-delay",
                         restart_strategy_fixed_delay_delay="0 ms")
    src = next(x for x in deploys if x.tdd.task_name == "src")
    d.report(src, S.FINISHED)
    sink = next(x for x in d.of(DeployTask) if x.tdd.task_name == "sink")
    d.report(sink, S.RUNNING)
    partition = src.tdd.result_partitions[0].partition_id
    error = ErrorInfo("PartitionNotFoundError", "gone", unavailable_partition=partition)
    d.report(sink, S.FAILED, error)
    d.advance(0)
    assert d.core.graph.vertices[JobVertexID("v-src")].subtasks[0].current.attempt_number == 1
    assert d.core.graph.vertices[JobVertexID("v-sink")].subtasks[0].current.attempt_number == 1


def test_partition_text_in_a_message_alone_restarts_only_the_consumer() -> None:
    d, deploys = started(pipeline(1, "BATCH"), restart_strategy_type="fixed-delay",
                         restart_strategy_fixed_delay_delay="0 ms")
    src = next(x for x in deploys if x.tdd.task_name == "src")
    d.report(src, S.FINISHED)
    sink = next(x for x in d.of(DeployTask) if x.tdd.task_name == "sink")
    d.report(sink, S.RUNNING)
    text = f"could not read partition {src.tdd.result_partitions[0].partition_id}"
    d.report(sink, S.FAILED, ErrorInfo("PartitionNotFoundError", text))
    d.advance(0)
    assert d.core.graph.vertices[JobVertexID("v-src")].subtasks[0].current.attempt_number == 0


def test_a_stored_result_outlives_its_lost_task_executor() -> None:
    """src -BLOCKING_PERSISTENT-> sink (a Spark stage's inputs): the source finished on te-0,
    which is then lost while the sink runs elsewhere; the sink's failure restarts the sink only,
    since the source's result is in the job's storage dir. With a plain BLOCKING edge the lost
    TaskExecutor's result goes with it, and the source runs again."""
    for mode, source_runs_again in ((ExchangeMode.BLOCKING_PERSISTENT, False), (ExchangeMode.BLOCKING, True)):
        src, sink = vertex("src", 1, source=True), vertex("sink", 1)
        g = JobGraph(JOB, "stored", [src, sink], [JobEdge(src.vertex_id, sink.vertex_id, Partitioner.HASH, mode, ["k"])],
                     artifact_uri="file:///job.zip", runtime_mode="BATCH")
        d, deploys = started(g, restart_strategy_type="fixed-delay", restart_strategy_fixed_delay_delay="0 ms")
        [first] = deploys
        d.report(first, S.FINISHED)
        d.offer_all()
        sink_deploy = next(x for x in d.of(DeployTask) if x.tdd.task_name == "sink")
        assert sink_deploy.tdd.input_gates[0].exchange_mode == mode  # the consumer knows where to read
        d.report(sink_deploy, S.RUNNING)
        producer_te = d.execution(first).slot.resource_id
        d.core.task_executor_lost(producer_te, "its container was killed")
        d.drain()
        d.report(sink_deploy, S.FAILED, ErrorInfo("RuntimeError", "the driver died"))
        d.advance(0)
        attempts = d.core.graph.vertices[src.vertex_id].subtasks[0].current.attempt_number
        assert attempts == (1 if source_runs_again else 0), mode


# ---- 7. slot sharing across regions in STREAMING jobs -------------------------------------------

def test_two_independent_streaming_pipelines_share_parallelism_many_slots() -> None:
    a_src, a_sink = vertex("a-src", 2, source=True), vertex("a-sink", 2)
    b_src, b_sink = vertex("b-src", 2, source=True), vertex("b-sink", 2)
    jg = JobGraph(JOB, "two", [a_src, a_sink, b_src, b_sink],
                  [JobEdge(a_src.vertex_id, a_sink.vertex_id, Partitioner.HASH, ExchangeMode.PIPELINED, ["k"]),
                   JobEdge(b_src.vertex_id, b_sink.vertex_id, Partitioner.HASH, ExchangeMode.PIPELINED, ["k"])],
                  artifact_uri="file:///job.zip", runtime_mode="STREAMING")
    d = Driver(jg)
    d.start()
    assert len(d.core.regions) == 2
    assert len(d.of(RequestSlot)) == 2
    deploys = d.of(DeployTask, d.offer_all())
    assert len(deploys) == 8 and len({x.tdd.allocation_id for x in deploys}) == 2


def test_region_failover_keeps_a_slot_shared_with_a_running_region() -> None:
    a, b = vertex("a", 1, source=True), vertex("b", 1, source=True)
    jg = JobGraph(JOB, "two", [a, b], [], artifact_uri="file:///job.zip", runtime_mode="STREAMING")
    d, deploys = started(jg, restart_strategy_type="fixed-delay", restart_strategy_fixed_delay_delay="0 ms")
    failed, other = deploys
    d.report(failed, S.FAILED, ErrorInfo("ValueError", "boom"))
    d.advance(0)
    assert d.execution(other).state == S.RUNNING
    redeployed = [x for x in d.of(DeployTask) if x.tdd.task_name == failed.tdd.task_name][-1]
    assert redeployed.tdd.allocation_id == other.tdd.allocation_id
    assert len(d.of(RequestSlot)) == 1 and not d.of(CancelSlotRequest)


# ---- 8. resource profiles hold for pooled and restarted slots ------------------------------------

def test_a_pooled_slot_too_small_for_the_next_region_is_not_reused() -> None:
    small, big = vertex("small", 1, source=True, memory_mb=200), vertex("big", 1, memory_mb=900)
    jg = JobGraph(JOB, "sizes", [small, big],
                  [JobEdge(small.vertex_id, big.vertex_id, Partitioner.FORWARD, ExchangeMode.BLOCKING)],
                  artifact_uri="file:///job.zip", runtime_mode="BATCH")
    d = Driver(jg)
    d.start()
    (first,) = d.of(DeployTask, d.offer_all(profile=ResourceProfile(1.0, 512)))
    d.report(first, S.RUNNING)
    d.report(first, S.FINISHED)
    (request,) = d.open_requests()           # the idle 512 MB slot does not fit 900 MB
    assert request.profile.memory_mb == 900
    (second,) = d.of(DeployTask, d.offer_all(profile=ResourceProfile(1.0, 1024)))
    assert second.tdd.allocation_id != first.tdd.allocation_id


def test_a_pooled_slot_that_fits_is_reused_without_asking_the_resource_manager() -> None:
    first_v, second_v = vertex("first", 1, source=True, memory_mb=200), vertex("second", 1, memory_mb=300)
    jg = JobGraph(JOB, "sizes", [first_v, second_v],
                  [JobEdge(first_v.vertex_id, second_v.vertex_id, Partitioner.FORWARD, ExchangeMode.BLOCKING)],
                  artifact_uri="file:///job.zip", runtime_mode="BATCH")
    d = Driver(jg)
    d.start()
    (first,) = d.of(DeployTask, d.offer_all(profile=ResourceProfile(1.0, 512)))
    d.report(first, S.FINISHED)
    assert not d.open_requests()
    (second,) = [x for x in d.of(DeployTask) if x.attempt_id != first.attempt_id]
    assert second.tdd.allocation_id == first.tdd.allocation_id


def test_a_slot_idle_for_slot_idle_timeout_goes_back_and_is_freed_unless_its_task_executor_is_lost() -> None:
    small, big = vertex("small", 1, source=True, memory_mb=200), vertex("big", 1, memory_mb=900)
    jg = JobGraph(JOB, "sizes", [small, big],
                  [JobEdge(small.vertex_id, big.vertex_id, Partitioner.FORWARD, ExchangeMode.BLOCKING)],
                  artifact_uri="file:///job.zip", runtime_mode="BATCH")
    d = Driver(jg, slot_idle_timeout="2 s")
    d.start()
    (first,) = d.of(DeployTask, d.offer_all(te="te-a", profile=ResourceProfile(1.0, 512)))
    d.report(first, S.FINISHED)              # its slot is too small for "big": idle in the pool
    idle = first.tdd.allocation_id
    assert not [a for a in d.advance(1_000) if getattr(a, "allocation_id", None) == idle]
    back = [a for a in d.advance(1_500) if getattr(a, "allocation_id", None) == idle]
    assert {type(a) for a in back} == {ReturnAllocation, FreeSlot}
    assert next(a for a in back if isinstance(a, FreeSlot)).resource_id == ResourceID("te-a")

    d2 = Driver(jg, slot_idle_timeout="2 s")
    d2.start()
    (first,) = d2.of(DeployTask, d2.offer_all(te="te-a", profile=ResourceProfile(1.0, 512)))
    d2.report(first, S.FINISHED)
    d2.core.task_executor_lost(ResourceID("te-a"), "its container exited")
    d2.drain()
    back = [a for a in d2.advance(3_000) if getattr(a, "allocation_id", None) == first.tdd.allocation_id]
    assert not [a for a in back if isinstance(a, FreeSlot)], "nothing is sent to a lost TaskExecutor"


def test_a_new_resource_manager_is_asked_again_for_every_open_request() -> None:
    d = Driver(pipeline(2))
    first = d.of(RequestSlot, d.start())
    assert first
    d.core.resource_manager_changed()
    again = d.of(RequestSlot, d.drain())
    assert sorted(str(a.request.allocation_id) for a in again) == sorted(str(a.request.allocation_id) for a in first)
    d.offer_all()
    d.core.resource_manager_changed()
    assert not d.of(RequestSlot, d.drain())  # all met: nothing to ask for


def test_tasks_missing_from_two_reports_fail_once_not_once_each() -> None:
    """Both subtasks of a region run on one TaskExecutor and are missing from its reports: the
    first fails, which cancels the second, and a canceling task is not missing: one failure."""
    d, deploys = started(pipeline(1), restart_strategy_type="fixed-delay", restart_strategy_fixed_delay_delay="1 s")
    assert len({x.resource_id for x in deploys}) == 1 and len(deploys) == 2
    rid = deploys[0].resource_id
    for _ in range(2):
        d.core.task_executor_heartbeat(rid, [], [deploys[0].tdd.allocation_id])
        d.drain()
    assert [f.error.error_class for f in d.core.failures.history()] == ["TaskLostError"]
    assert sorted(d.execution(x).state.name for x in deploys) == ["CANCELING", "FAILED"]


# ---- job outcome and bookkeeping ----------------------------------------------------------------

def test_a_batch_job_releases_read_partitions_and_returns_its_slots_when_it_finishes() -> None:
    d, deploys = started(pipeline(2, "BATCH"))
    for x in [x for x in deploys if x.tdd.task_name == "src"]:
        d.report(x, S.FINISHED)
    sinks = [x for x in d.of(DeployTask) if x.tdd.task_name == "sink"]
    assert len(sinks) == 2
    for x in sinks:
        d.report(x, S.RUNNING)
        d.report(x, S.FINISHED)
    assert d.core.status == JobStatus.FINISHED
    released = [p for a in d.of(ReleasePartitions) for p in a.partition_ids]
    assert len(released) == 2
    returned = {a.allocation_id for a in d.of(ReturnAllocation)}
    assert {x.tdd.allocation_id for x in d.of(DeployTask)} <= returned
    assert d.of(FreeSlot)


def test_failure_history_is_bounded() -> None:
    d, deploys = started(pipeline(1), restart_strategy_type="fixed-delay", restart_strategy_fixed_delay_attempts="100",
                         restart_strategy_fixed_delay_delay="0 ms")
    for i in range(40):
        running = [x for x in d.current_deploys() if d.execution(x).state in (S.DEPLOYING, S.RUNNING)]
        if not running:
            d.offer_all()
            running = d.current_deploys()
        d.report(running[0], S.FAILED, ErrorInfo("ValueError", f"boom {i}"))
        for x in d.current_deploys():
            if d.execution(x).state == S.CANCELING:
                d.report(x, S.CANCELED)
        d.advance(0)
    history = d.core.failures.history()
    assert d.core.failures.total_failures == 40
    assert len(history) == 16 and history[-1].error.message == "boom 39"
