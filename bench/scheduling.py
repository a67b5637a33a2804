"""scheduling: build the ExecutionGraph of a two-vertex job (parallelism N each, connected
all-to-all) and deploy it on simulated TaskExecutors (in-process gateways), with the real
JobMaster, SlotPool and region scheduler. A simulated ResourceManager answers every slot
request with an offer from one of N/4 four-slot TaskExecutors. Measures start -> every
subtask's deployment descriptor handed to its TaskExecutor."""

from __future__ import annotations

import threading
import time
from typing import Any

from yarnflow.common.ids import JobID, JobVertexID, ResourceID
from yarnflow.common.messages import JobEdge, JobGraph, JobVertex, SlotOffer, TaskExecutorRegistration
from yarnflow.common.states import Partitioner


class _SimulatedResourceManager:
    def __init__(self, slots_per_te: int = 4) -> None:
        self.jm: Any = None
        self.fencing_token = "simulated-rm"
        self._spt = slots_per_te
        self._n = 0
        self._lock = threading.Lock()
        self._queue: list[Any] = []
        self._cv = threading.Condition()
        self._stop = False
        threading.Thread(target=self._offer_loop, daemon=True).start()

    def register_job_master(self, job_id: str, jm: Any) -> None:
        self.jm = jm

    def request_slot(self, request: Any) -> None:
        with self._cv:
            self._queue.append(request)
            self._cv.notify()

    def _offer_loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                batch, self._queue = self._queue, []
            by_te: dict[ResourceID, list[SlotOffer]] = {}
            for req in batch:
                k = self._n
                self._n += 1
                rid = ResourceID(f"te-sim-{k // self._spt}")
                by_te.setdefault(rid, []).append(SlotOffer(req.allocation_id, k % self._spt))
            for rid, offers in by_te.items():  # as TaskExecutors do: one offer call per TE
                self.jm.offer_slots(self.jm.fencing_token, rid, offers)

    def task_executor_info(self, resource_id: ResourceID) -> TaskExecutorRegistration:
        return TaskExecutorRegistration(resource_id, f"{resource_id}:1", f"{resource_id}:2", self._spt)

    def free_allocation(self, allocation_id: Any) -> None:
        pass

    def cancel_slot_request(self, allocation_id: Any) -> None:
        pass

    def unregister_job_master(self, job_id: Any) -> None:
        pass

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()


class _TestingTaskExecutorGateway:
    """Counts deployments; nothing leaves the process."""

    def __init__(self, on_submit: Any) -> None:
        self._on_submit = on_submit

    def submit_task(self, token: str, tdd: Any) -> None:
        self._on_submit(tdd)

    def close(self) -> None:
        pass


def run_scheduling(subtasks: int = 1000, mode: str = "streaming") -> dict[str, Any]:
    """streaming: one pipelined region, deployed at once; measured until every subtask is
    deployed. batch: a blocking edge, so 2N one-subtask regions; the simulated TaskExecutors
    finish each task at once and the measure runs until the job is FINISHED (every consumer
    region scheduled as its inputs finish, every slot reused)."""
    from yarnflow.am.jobmaster.job_master import JobMaster
    from yarnflow.common.config import Configuration
    from yarnflow.common.messages import TaskExecutionStateUpdate
    from yarnflow.common.states import ExchangeMode, ExecutionState

    batch = mode == "batch"
    src, dst = JobVertexID("source"), JobVertexID("sink")
    jg = JobGraph(JobID.generate(), "scheduling", [
        JobVertex(src, "source", subtasks, max(128, subtasks), ["source"]),
        JobVertex(dst, "sink", subtasks, max(128, subtasks), ["sink"]),
    ], [JobEdge(src, dst, Partitioner.HASH, ExchangeMode.BLOCKING if batch else ExchangeMode.PIPELINED, ["k"])],
        artifact_uri="file:///none", runtime_mode="BATCH" if batch else "STREAMING")
    rm = _SimulatedResourceManager()
    deployed = threading.Event()
    count = [0]
    channels = [0]
    lock = threading.Lock()
    holder: list[Any] = []
    import queue

    finishing: queue.Queue[Any] = queue.Queue()

    def finisher() -> None:  # the simulated tasks: each finishes as soon as it is deployed
        while True:
            tdd = finishing.get()
            if tdd is None:
                return
            jm = holder[0]
            for state in (ExecutionState.RUNNING, ExecutionState.FINISHED):
                jm.update_task_execution_state(jm.fencing_token, TaskExecutionStateUpdate(
                    tdd.job_id, tdd.execution_attempt_id, state))

    threading.Thread(target=finisher, daemon=True).start()

    def on_submit(tdd: Any) -> None:
        with lock:
            count[0] += 1
            channels[0] += sum(len(g.channels) for g in tdd.input_gates)
            if count[0] == 2 * subtasks and not batch:
                deployed.set()
        if batch:
            finishing.put(tdd)

    gateway = _TestingTaskExecutorGateway(on_submit)
    config = Configuration.load({"slot.idle.timeout": "10 min"})
    t0 = time.perf_counter()
    jm = JobMaster(jg, config, rm, "127.0.0.1:1", "file:///tmp/none",  # type: ignore[arg-type]
                   lambda _jm: deployed.set())
    jm._gateway = lambda slot: gateway  # type: ignore[method-assign]  # the simulated TaskExecutors
    jm._collected = lambda: {}  # type: ignore[method-assign]  # no storage in this benchmark
    holder.append(jm)
    jm.start()
    ok = deployed.wait(600)
    seconds = time.perf_counter() - t0
    finishing.put(None)
    jm.stop()
    rm.stop()
    finished = jm.status.name
    return {"name": "scheduling", "mode": mode, "subtasks_per_vertex": subtasks, "deployed": count[0],
            "channels": channels[0], "seconds": round(seconds, 3),
            "target_s_for_1000": 5, "job_status": finished,
            "verified": ok and count[0] == 2 * subtasks and channels[0] == subtasks ** 2
            and (not batch or finished == "FINISHED")}
