"""Checkpoints on a real TaskExecutor (issue 8, the task side), driven over real Thrift by a
hand-written JobMaster double: a triggered source task writes its chain's state as Arrow IPC
files under ``chk-<n>/`` and acknowledges them; a checkpoint dir it cannot write to declines
the checkpoint (and the task goes on); notifications reach the operators; a stale token is
refused; a task restores its state before it opens, restored as finished it emits nothing, and
an unreadable state file fails it naming the file. Barriers cross Arrow Flight in order."""

from __future__ import annotations

import dataclasses
import io
import threading
import time
import zipfile
from collections.abc import Iterator
from typing import Any, Callable

import cloudpickle
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from tests.harness import wait_until
from tests.remote_doubles import RemoteTestbed, te_with_doubles
from yarnflow.common.artifacts import chain_entry, store_artifact
from yarnflow.common.errors import FencingTokenError, NotFoundError
from yarnflow.common.ids import ExecutionAttemptID, JobID, JobVertexID, ResultPartitionID
from yarnflow.common.messages import (
    SplitResponse,
    TaskDeploymentDescriptor,
    TaskRestore,
    TaskStateSnapshot,
)
from yarnflow.common.states import ExecutionState
from yarnflow.worker.network.client import DataClient
from yarnflow.worker.network.flight import DataServer
from yarnflow.worker.operators.base import Operator
from yarnflow.worker.operators.sources import GeneratorSource
from yarnflow.worker.elements import END_OF_PARTITION, CheckpointBarrier, Watermark
from yarnflow.worker.network.partition import ResultPartitionManager

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

#: what the counting operators of this process saw (the TaskExecutor runs in this process)
EVENTS: list[tuple[Any, ...]] = []


class RowCounter(Operator):
    """Counts the rows that pass; its state is the count."""

    def __init__(self) -> None:
        super().__init__("counter")
        self.rows = 0

    def open(self) -> None:
        EVENTS.append(("open", self.ctx.attempt_number, self.rows, self.ctx.restored_checkpoint_id,
                       self.ctx.checkpointing))

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        self.rows += batch.num_rows
        self.output.collect(batch)

    def snapshot_state(self, checkpoint_id: int) -> dict[str, pa.Table]:
        return {"count": pa.table({"rows": pa.array([self.rows], pa.int64())})}

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        EVENTS.append(("restore", self.ctx.attempt_number, sorted(state)))
        if "count" in state:
            self.rows = state["count"].column("rows")[0].as_py()

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        EVENTS.append(("complete", self.ctx.attempt_number, checkpoint_id))

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        EVENTS.append(("aborted", self.ctx.attempt_number, checkpoint_id))


def _rows(start: int, n: int) -> dict[str, list[int]]:
    return {"x": list(range(start, start + n))}


class CheckpointingJobMaster:
    """The JobMaster double's checkpoint side: records acknowledgements and declines."""

    def __init__(self, bed: RemoteTestbed) -> None:
        self.jm = bed.jm
        self.acks: dict[int, TaskStateSnapshot] = {}
        self.declines: dict[int, str] = {}
        self.split_requests: list[int] = []
        self.lock = threading.Lock()
        # the Thrift handler of the double calls these on the AppMaster double
        bed.appmaster.acknowledge_checkpoint = self.acknowledge_checkpoint  # type: ignore[attr-defined]
        bed.appmaster.decline_checkpoint = self.decline_checkpoint  # type: ignore[attr-defined]
        bed.appmaster.request_split = self.request_split  # type: ignore[method-assign]

    def _check(self, token: str, job_id: JobID) -> None:
        if job_id != self.jm.job_id:
            raise NotFoundError(f"no running job {job_id}")
        if token != self.jm.token:
            raise FencingTokenError("stale JobMaster token")

    def acknowledge_checkpoint(self, token: str, job_id: JobID, attempt_id: ExecutionAttemptID,
                               checkpoint_id: int, snapshot: TaskStateSnapshot) -> None:
        self._check(token, job_id)
        with self.lock:
            self.acks[checkpoint_id] = snapshot

    def decline_checkpoint(self, token: str, job_id: JobID, attempt_id: ExecutionAttemptID, checkpoint_id: int,
                           reason: str) -> None:
        self._check(token, job_id)
        with self.lock:
            self.declines[checkpoint_id] = reason

    def request_split(self, token: str, job_id: JobID, vertex_id: JobVertexID, subtask_index: int,
                      attempt_id: ExecutionAttemptID, last_checkpoint_id: int = 0) -> SplitResponse:
        self.split_requests.append(last_checkpoint_id)
        return SplitResponse(no_more_splits=True)


@pytest.fixture
def bed() -> Iterator[RemoteTestbed]:
    EVENTS.clear()
    with te_with_doubles() as testbed:
        yield testbed


@pytest.fixture
def deploy(bed: RemoteTestbed, tmp_path: Any) -> Callable[..., TaskDeploymentDescriptor]:
    """``deploy(chain, checkpoint_dir=..., restore=None, attempt_number=0)``: a 1-task job on slot 0."""
    alloc = bed.allocate(0)

    def go(chain: list[Operator], checkpoint_dir: str = f"file://{tmp_path}/checkpoints/job",
           restore: TaskRestore | None = None, attempt_number: int = 0) -> TaskDeploymentDescriptor:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            zf.writestr(chain_entry("v-1"), cloudpickle.dumps(chain))
        uri, sha = store_artifact(buf.getvalue(), str(tmp_path / "storage"))
        bed.jm.artifacts[sha] = uri  # (served by the JobMaster's blob service)
        tdd = TaskDeploymentDescriptor(bed.jm.job_id, JobVertexID("v-1"), "src", ExecutionAttemptID.generate(), 0,
                                       attempt_number, 1, 128, alloc, uri, sha, jobmaster_fencing_token=bed.jm.token,
                                       checkpoint_dir=checkpoint_dir, restore=restore)
        bed.te_gateway.submit_task(bed.jm.token, tdd)
        return tdd

    return go


def states(bed: RemoteTestbed, tdd: TaskDeploymentDescriptor) -> list[ExecutionState]:
    return [u.state for u in list(bed.jm.updates) if u.execution_attempt_id == tdd.execution_attempt_id]


def unbounded_chain() -> list[Operator]:
    return [GeneratorSource(_rows, count=None, rate_per_s=500), RowCounter()]


def read(path: str) -> pa.Table:
    import fsspec

    with fsspec.open(path, "rb") as fh:
        return ipc.open_file(pa.PythonFile(fh, mode="r")).read_all()


def test_a_triggered_source_task_writes_its_state_and_acknowledges(bed: RemoteTestbed, deploy: Any,
                                                                   tmp_path: Any) -> None:
    jm = CheckpointingJobMaster(bed)
    tdd = deploy(unbounded_chain())
    wait_until(lambda: ExecutionState.RUNNING in states(bed, tdd), 15, lambda: f"not running: {bed.jm.updates}")
    wait_until(lambda: any(e[0] == "open" for e in EVENTS), 5, "the chain did not open")
    time.sleep(0.2)  # some rows pass first
    bed.te_gateway.trigger_checkpoint(bed.jm.token, tdd.execution_attempt_id, 1, int(time.time() * 1000), True)
    snapshot = wait_until(lambda: jm.acks.get(1), 10, lambda: f"no acknowledgement; declines: {jm.declines}")
    assert snapshot.async_ms >= 0 and snapshot.sync_ms >= 0 and snapshot.alignment_ms == 0
    by_op = {(f.operator_index, f.name): f for f in snapshot.files}
    count = by_op[(1, "count")]
    assert count.path == f"file://{tmp_path}/checkpoints/job/chk-1/v-1-0-0/op1-count.arrow"
    assert count.size_bytes == (tmp_path / "checkpoints" / "job" / "chk-1" / "v-1-0-0" / "op1-count.arrow").stat(
    ).st_size
    assert read(count.path).column("rows")[0].as_py() > 0
    for f in snapshot.files:  # whatever the source keeps, it is readable where it is said to be
        assert read(f.path).num_rows >= 0 and f.path.endswith(f"/op{f.operator_index}-{f.name}.arrow")
    # a second checkpoint covers more rows; notifications reach the operators on the task thread
    bed.te_gateway.trigger_checkpoint(bed.jm.token, tdd.execution_attempt_id, 2, int(time.time() * 1000), True)
    second = wait_until(lambda: jm.acks.get(2), 10, "no acknowledgement of checkpoint 2")
    rows2 = read(next(f.path for f in second.files if f.name == "count")).column("rows")[0].as_py()
    assert rows2 >= read(count.path).column("rows")[0].as_py()
    bed.te_gateway.notify_checkpoint_complete(bed.jm.token, tdd.execution_attempt_id, 2)
    bed.te_gateway.notify_checkpoint_aborted(bed.jm.token, tdd.execution_attempt_id, 3)
    wait_until(lambda: ("complete", 0, 2) in EVENTS and ("aborted", 0, 3) in EVENTS, 5,
               lambda: f"notifications not delivered: {EVENTS}")
    assert states(bed, tdd) == [ExecutionState.INITIALIZING, ExecutionState.RUNNING]
    assert jm.declines == {}


def test_a_checkpoint_dir_that_cannot_be_written_declines(bed: RemoteTestbed, deploy: Any, tmp_path: Any) -> None:
    jm = CheckpointingJobMaster(bed)
    (tmp_path / "a-file").write_text("not a folder")
    tdd = deploy(unbounded_chain(), checkpoint_dir=f"file://{tmp_path}/a-file/job")
    wait_until(lambda: ExecutionState.RUNNING in states(bed, tdd), 15, lambda: f"not running: {bed.jm.updates}")
    bed.te_gateway.trigger_checkpoint(bed.jm.token, tdd.execution_attempt_id, 1, 0, True)
    reason = wait_until(lambda: jm.declines.get(1), 10, lambda: f"no decline; acks: {jm.acks}")
    assert "writing the state" in reason
    time.sleep(0.3)
    assert states(bed, tdd) == [ExecutionState.INITIALIZING, ExecutionState.RUNNING]  # the task goes on
    assert jm.acks == {}


def test_checkpoint_calls_are_fenced_and_name_a_running_task(bed: RemoteTestbed, deploy: Any) -> None:
    CheckpointingJobMaster(bed)
    tdd = deploy(unbounded_chain())
    wait_until(lambda: ExecutionState.RUNNING in states(bed, tdd), 15, lambda: f"not running: {bed.jm.updates}")
    attempt = tdd.execution_attempt_id
    with pytest.raises(FencingTokenError):
        bed.te_gateway.trigger_checkpoint("stale-token", attempt, 1, 0, True)
    with pytest.raises(FencingTokenError):
        bed.te_gateway.notify_checkpoint_complete("stale-token", attempt, 1)
    with pytest.raises(FencingTokenError):
        bed.te_gateway.notify_checkpoint_aborted("stale-token", attempt, 1)
    with pytest.raises(NotFoundError):
        bed.te_gateway.trigger_checkpoint(bed.jm.token, ExecutionAttemptID.generate(), 1, 0, True)
    bed.te_gateway.cancel_task(bed.jm.token, attempt)
    wait_until(lambda: ExecutionState.CANCELED in states(bed, tdd), 10, "not canceled")
    wait_until(lambda: attempt not in bed.te.tasks, 5, "the task is still listed")
    with pytest.raises(FencingTokenError):  # also once the task is gone
        bed.te_gateway.notify_checkpoint_complete("stale-token", attempt, 1)
    with pytest.raises(NotFoundError):
        bed.te_gateway.notify_checkpoint_complete(bed.jm.token, attempt, 1)


def test_a_task_restores_its_state_before_it_opens(bed: RemoteTestbed, deploy: Any, tmp_path: Any) -> None:
    jm = CheckpointingJobMaster(bed)
    first = deploy(unbounded_chain())
    wait_until(lambda: ExecutionState.RUNNING in states(bed, first), 15, "not running")
    time.sleep(0.2)
    bed.te_gateway.trigger_checkpoint(bed.jm.token, first.execution_attempt_id, 1, 0, True)
    snapshot = wait_until(lambda: jm.acks.get(1), 10, "no acknowledgement")
    saved = read(next(f.path for f in snapshot.files if f.name == "count")).column("rows")[0].as_py()
    bed.te_gateway.cancel_task(bed.jm.token, first.execution_attempt_id)
    wait_until(lambda: ExecutionState.CANCELED in states(bed, first), 10, "not canceled")

    second = deploy(unbounded_chain(), restore=TaskRestore(1, list(snapshot.files)), attempt_number=1)
    wait_until(lambda: ExecutionState.RUNNING in states(bed, second), 15, lambda: f"not running: {bed.jm.updates}")
    wait_until(lambda: any(e[0] == "open" and e[1] == 1 for e in EVENTS), 5, "the restored chain did not open")
    restored = [e for e in EVENTS if e[1] == 1]
    assert restored[0] == ("restore", 1, ["count"])
    assert restored[1] == ("open", 1, saved, 1, True)  # state in place before open()
    bed.te_gateway.cancel_task(bed.jm.token, second.execution_attempt_id)
    wait_until(lambda: ExecutionState.CANCELED in states(bed, second), 10, "not canceled")

    bad = dataclasses.replace(snapshot.files[-1], path=f"file://{tmp_path}/nowhere/op1-count.arrow")
    third = deploy(unbounded_chain(), restore=TaskRestore(1, [bad]), attempt_number=2)
    wait_until(lambda: ExecutionState.FAILED in states(bed, third), 15, "a task with an unreadable file ran")
    [failed] = [u for u in bed.jm.updates if u.execution_attempt_id == third.execution_attempt_id
                and u.state == ExecutionState.FAILED]
    assert failed.error is not None and "nowhere/op1-count.arrow" in failed.error.message


def test_a_task_restored_as_finished_emits_nothing_and_finishes(bed: RemoteTestbed, deploy: Any) -> None:
    CheckpointingJobMaster(bed)
    tdd = deploy(unbounded_chain(), restore=TaskRestore(4, [], finished=True))
    wait_until(lambda: ExecutionState.FINISHED in states(bed, tdd), 15, lambda: f"not finished: {bed.jm.updates}")
    assert not any(e[0] == "open" for e in EVENTS)  # the source never ran
    [done] = [u for u in bed.jm.updates if u.state == ExecutionState.FINISHED]
    assert done.records_out == 0


def test_barriers_cross_flight_in_order_with_the_data(tmp_path: Any) -> None:
    manager = ResultPartitionManager(str(tmp_path / "partitions"))
    server = DataServer("127.0.0.1", manager)
    client = DataClient()
    try:
        pid = ResultPartitionID("job.p0")
        partition = manager.create(pid, 1, 16)
        sub = partition.subpartitions[0]
        batch = pa.record_batch({"x": [1, 2]})
        sent = [CheckpointBarrier(1, 10, True), batch, Watermark(5), CheckpointBarrier(2, 20, False), batch,
                END_OF_PARTITION]
        for element in sent:
            sub.add(element)
        got: list[Any] = []
        client.open(server.address, pid, 0).run(lambda el: got.append(el) is None)
        assert [type(e).__name__ for e in got] == [type(e).__name__ for e in sent]
        assert got[0] == sent[0] and got[3] == sent[3] and got[1].equals(batch)
    finally:
        manager.close()
        client.close()
        server.shutdown()
