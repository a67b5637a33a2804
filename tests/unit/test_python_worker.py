"""A task's Python worker process (worker/pyworker): real worker processes, forked by the fork
server, running the operators of a chain file as a task's thread would. What comes out (rows,
order, schema, errors) is exactly what the task thread gives; a worker killed with SIGKILL fails
the task naming the signal; a cancel stops a function that never returns; a worker that cannot
load its chain leaves the task on its own thread; and a worker starts only when another task of
the process runs per-row functions too."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import cloudpickle
import psutil
import pyarrow as pa
import pytest

from tests.harness import wait_until
from yarnflow.worker.elements import Watermark
from yarnflow.worker.operators.base import RuntimeContext, TaskCancelledError, UserFunctionError
from yarnflow.worker.operators.transforms import RowFilter, RowFlatMap, RowMap, SchemaMismatchError
from yarnflow.worker.pyworker import PythonWorker, PythonWorkerError
from yarnflow.worker.pyworker.handle import RemoteTraceback

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

PER_ROW = {"python.row-functions.vectorize": "false"}


class Recorded:
    """An operator's output: batches and watermarks in the order they came."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def collect(self, batch: pa.RecordBatch) -> None:
        self.events.append(batch)

    def collect_side(self, tag: str, batch: pa.RecordBatch) -> None:
        raise AssertionError("no side outputs here")

    def emit_watermark(self, watermark: Watermark) -> None:
        self.events.append(watermark)

    def rows(self) -> list[dict[str, Any]]:
        return [r for e in self.events if isinstance(e, pa.RecordBatch) for r in e.to_pylist()]


def shout(row: dict[str, Any]) -> dict[str, Any]:
    return {"word": row["word"].strip().title(), "n": len(row["word"])}


def not_seven(row: dict[str, Any]) -> bool:
    return not row["word"].endswith("7")


def pairs(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"word": w, "n": i} for i, w in enumerate(row["word"].split())]


def fails_on_x(row: dict[str, Any]) -> dict[str, Any]:
    if row["word"] == "x":
        raise ValueError(f"no x please (row {row})")
    return {"word": row["word"]}


def sleeps(row: dict[str, Any]) -> dict[str, Any]:
    time.sleep(3600)
    return row


def text(n: int, start: int = 0) -> pa.RecordBatch:
    return pa.record_batch({"word": [f" w{i} é{i % 7} " for i in range(start, start + n)]})


def _chain(tmp_path, ops: list[Any]) -> tuple[str, str]:
    path = tmp_path / "chain"
    path.write_bytes(cloudpickle.dumps(ops))
    return str(path), str(tmp_path / "src")


def _context() -> dict[str, Any]:
    return dict(job_id="j", task_name="t", subtask_index=0, parallelism=1, max_parallelism=128, attempt_number=0,
                config=dict(PER_ROW))


def _open(op: Any, worker: PythonWorker | None) -> Recorded:
    out = Recorded()
    op.setup(RuntimeContext(**_context(), python_worker=worker), out)
    op.open()
    return out


def _worker(tmp_path, chain: list[Any], cancelled=lambda: False) -> PythonWorker:
    chain_file, src = _chain(tmp_path, chain)
    return PythonWorker(chain_file, src, chain, _context(), "test task", cancelled, start_after_s=0.0)


def _started(worker: PythonWorker) -> PythonWorker:
    worker._start()
    wait_until(worker.ready, 30, "the Python worker never became ready", interval_s=0.01)
    return worker


@pytest.fixture
def workers():
    made: list[PythonWorker] = []
    yield made
    for w in made:
        w.close()
        assert w.pid is None or not psutil.pid_exists(w.pid) or psutil.Process(w.pid).status() == "zombie"


@pytest.mark.parametrize(("make", "batches"), [
    (lambda: RowMap(shout, "shout"), [text(3), text(1000, 3), text(5, 2000)]),
    (lambda: RowFilter(not_seven, "keep"), [text(40), text(700, 40)]),
    (lambda: RowFlatMap(pairs, "pairs"), [text(10), pa.record_batch({"word": ["a b c", "", "d"]})]),
], ids=["map", "filter", "flat_map"])
def test_the_worker_gives_what_the_task_thread_gives(tmp_path, workers, make, batches):
    here_op = make()
    here = _open(here_op, None)
    for b in batches:
        here_op.process_batch(b)

    op = make()
    worker = _worker(tmp_path, [op])
    workers.append(worker)
    out = _open(op, worker)
    op.process_batch(batches[0])  # on the task thread: fixes the output schema, the worker follows it
    _started(worker)
    for b in batches[1:]:
        op.process_batch(b)
    op.process_watermark(Watermark(42))  # what was sent comes out before the watermark
    assert out.events[-1] == Watermark(42)
    assert out.rows() == here.rows()
    assert worker.batches == len(batches) - 1
    assert "batches in its task's Python worker" in op.execution_path()
    schemas = {e.schema for e in out.events if isinstance(e, pa.RecordBatch)}
    assert len(schemas) == 1


def test_answers_come_later_and_in_order_and_a_flush_takes_them_all(tmp_path, workers):
    op = RowMap(shout, "shout")
    worker = _started(_worker(tmp_path, [op]))
    workers.append(worker)
    out = _open(op, worker)
    for i in range(5):
        op.process_batch(text(100, i * 100))
        assert len(out.events) <= i  # at most one batch waits in the worker
    op.finish()
    assert [r["word"] for r in out.rows()] == [f"W{i} É{i % 7}" for i in range(500)]


def test_a_user_error_in_the_worker_is_the_one_the_task_thread_raises(tmp_path, workers):
    batch = pa.record_batch({"word": ["a", "x", "b"]})
    here_op = RowMap(fails_on_x, "picky")
    _open(here_op, None)
    with pytest.raises(UserFunctionError) as here:
        here_op.process_batch(batch)

    op = RowMap(fails_on_x, "picky")
    worker = _started(_worker(tmp_path, [op]))
    workers.append(worker)
    _open(op, worker)
    op.process_batch(batch)
    with pytest.raises(UserFunctionError) as there:
        op.finish()
    assert str(there.value) == str(here.value)
    assert "operator 'picky'" in str(there.value) and "no x please" in str(there.value)
    assert isinstance(there.value.__cause__, RemoteTraceback)
    assert "in fails_on_x" in str(there.value.__cause__)  # the user's own frame, from the worker


def test_a_schema_mismatch_in_the_worker_is_raised_as_such(tmp_path, workers):
    def varies(row):
        return {"v": 1} if row["word"] == "a" else {"v": "text"}

    op = RowMap(varies, "varies")
    worker = _started(_worker(tmp_path, [op]))
    workers.append(worker)
    _open(op, worker)
    op.process_batch(pa.record_batch({"word": ["a"]}))
    op.process_batch(pa.record_batch({"word": ["b"]}))
    with pytest.raises(SchemaMismatchError, match="varies"):
        op.finish()


def test_a_sigkilled_worker_fails_the_task_naming_the_signal(tmp_path, workers):
    op = RowMap(sleeps, "sleepy")
    worker = _started(_worker(tmp_path, [op]))
    workers.append(worker)
    _open(op, worker)
    op.process_batch(text(1))
    threading.Timer(0.3, os.kill, (worker.pid, signal.SIGKILL)).start()
    with pytest.raises(PythonWorkerError, match="killed by SIGKILL") as failed:
        op.finish()
    assert "operator 'sleepy'" in str(failed.value)


def test_a_cancel_stops_a_function_that_never_returns(tmp_path, workers):
    cancelled = threading.Event()
    op = RowMap(sleeps, "sleepy")
    worker = _started(_worker(tmp_path, [op], cancelled.is_set))
    workers.append(worker)
    pid = worker.pid
    _open(op, worker)
    op.process_batch(text(1))
    threading.Timer(0.3, cancelled.set).start()
    began = time.monotonic()
    with pytest.raises(TaskCancelledError):
        op.finish()
    assert time.monotonic() - began < 5
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


def test_a_worker_that_cannot_load_its_chain_leaves_the_task_on_its_thread(tmp_path, workers, caplog):
    op = RowMap(shout, "shout")
    worker = PythonWorker(str(tmp_path / "no-such-chain"), "", [op], _context(), "test task", lambda: False, 0.0)
    workers.append(worker)
    out = _open(op, worker)
    worker._start()
    wait_until(lambda: not worker.ready() and worker._state == "failed", 30, "the worker's failure was never noticed",
               interval_s=0.01)
    op.process_batch(text(3))
    assert [r["word"] for r in out.rows()] == ["W0 É0", "W1 É1", "W2 É2"]
    assert "could not start" in caplog.text and "no-such-chain" in caplog.text


def test_a_worker_starts_only_when_another_task_runs_per_row_functions_too(tmp_path, workers):
    alone = _worker(tmp_path, [RowMap(shout, "a")])
    workers.append(alone)
    alone._start_after_s = 0.1
    alone.spent(0.5)
    assert alone._state == "idle"  # nothing to share the GIL with: the task keeps its thread
    other = _worker(tmp_path, [RowMap(shout, "b")])
    workers.append(other)
    other._start_after_s = 10.0
    other.spent(0.05)  # another task runs per-row functions now, under its own threshold
    assert other._state == "idle"
    alone.spent(0.01)
    assert alone._state == "starting"
    wait_until(alone.ready, 30, "the worker never became ready", interval_s=0.01)
