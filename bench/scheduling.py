"""scheduling: build the ExecutionGraph of a two-vertex job (parallelism N each, connected
all-to-all) and deploy it on simulated TaskExecutors (in-process gateways), with the real
JobMaster, SlotPool and region scheduler. The testing ResourceManager gateway answers every
slot request with an offer from one of N/4 four-slot TaskExecutors. Measures start -> every
subtask's deployment descriptor handed to its TaskExecutor."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from yarnflow.common.ids import JobID, JobVertexID
from yarnflow.common.messages import JobEdge, JobGraph, JobVertex
from yarnflow.common.states import Partitioner

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.doubles import TestingResourceManagerGateway, TestingTaskExecutorGateway  # noqa: E402


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
    rm = TestingResourceManagerGateway()
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
                jm.rpc_invoke("update_task_execution_state", jm.fencing_token, (TaskExecutionStateUpdate(
                    tdd.job_id, tdd.execution_attempt_id, state),))

    threading.Thread(target=finisher, daemon=True).start()

    def on_submit(tdd: Any) -> None:
        with lock:
            count[0] += 1
            channels[0] += sum(len(g.channels) for g in tdd.input_gates)
            if count[0] == 2 * subtasks and not batch:
                deployed.set()
        if batch:
            finishing.put(tdd)

    gateway = TestingTaskExecutorGateway(on_submit=on_submit)
    # the simulated TaskExecutors send no heartbeats: keep them from being declared lost
    config = Configuration.load({"slot.idle.timeout": "10 min", "heartbeat.timeout": "1 h"})
    t0 = time.perf_counter()
    jm = JobMaster(jg, config, rm, "127.0.0.1:1", "file:///tmp/none", lambda _jm: deployed.set(),
                   task_executor_gateways=lambda address: gateway, collect_results=dict)
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
