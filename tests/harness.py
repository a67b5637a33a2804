"""What tests share to drive the runtime: ``wait_until`` for conditions reached by other
threads or processes, and ``OperatorHarness`` to run one operator step by step.

``OperatorHarness`` sets an operator up with a ``RuntimeContext`` whose processing-time clock is
the harness's ``now`` (moved only by the test), feeds it batches, watermarks, processing-time
ticks and end-of-input, and records everything it emits, in order, in a ``RecordingOutput``::

    h = OperatorHarness(KeyedAggregate(["k"], [("v", "sum")]), runtime_mode="BATCH")
    h.batch([{"k": "a", "v": 1}])
    h.finish()
    assert h.rows() == [{"k": "a", "v": 1}]

Each feeding call returns the events that call produced (and appends them to ``steps``), so a
test can check what one input caused. Events are tuples: ``("data", batch)``,
``("side", tag, batch)``, ``("wm", timestamp)`` and ``("idle", is_idle)``.
"""

from __future__ import annotations

import collections

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa

from yarnflow.worker.operators.base import Operator, RuntimeContext
from yarnflow.worker.elements import Watermark, WatermarkStatus

__all__ = ["OperatorHarness", "RecordingOutput", "runtime_context", "wait_until"]

T = TypeVar("T")

Event = tuple[Any, ...]


class ServerProcess:
    """A server a test starts (``start``, the subclass's) and kills by pid: ``stop`` SIGKILLs it
    (its clients see the connection drop at once), ``restart`` starts it again on the same port
    and data."""

    _process: Any = None

    def start(self) -> None:
        raise NotImplementedError

    def _launch(self, command: list[str], log_path: Any, probe: Callable[[], None], what: str,
                timeout: float, **popen: Any) -> None:
        """Start ``command`` (output to ``log_path``) and wait until ``probe()`` stops raising;
        RuntimeError with the log's end when the process exits or ``timeout`` passes first."""
        import subprocess

        with open(log_path, "ab") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, **popen)
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"{what} exited {self._process.returncode} at start:\n{self.log_tail()}")
            try:
                probe()
                return
            except Exception:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{what} did not answer within {timeout} s:\n{self.log_tail()}") from None
                time.sleep(0.1)

    def log_tail(self, lines: int = 30) -> str:
        raise NotImplementedError

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        if process is not None:
            process.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (another process may take it before it is used)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_keyed_lines(folder: Any, files: int, rows: int, keys: int) -> collections.Counter[str]:
    """Text files ``part-<f>.txt`` in ``folder`` (made) of ``rows`` lines "k<n> <file> <row>" in
    all; returns each key's count (what a keyed count over them ends at)."""
    import pathlib

    src = pathlib.Path(folder)
    src.mkdir()
    expected: collections.Counter[str] = collections.Counter()
    per_file = rows // files
    for f in range(files):
        names = [f"k{(f * per_file + r) % keys}" for r in range(per_file)]
        expected.update(names)
        (src / f"part-{f}.txt").write_text("".join(f"{k} {f} {r}\n" for r, k in enumerate(names)))
    return expected


def wait_until(predicate: Callable[[], T], timeout_s: float, message: str | Callable[[], str],
               interval_s: float = 0.05) -> T:
    """Call ``predicate`` until it returns something truthy, and return that.

    Raises AssertionError with ``message`` (a string, or a function called then to describe the
    state at the timeout) when ``timeout_s`` passes first. The predicate is tried once more at
    the deadline, so a slow machine does not fail a condition that just came true."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            break
        time.sleep(interval_s)
    value = predicate()
    if value:
        return value
    text = message() if callable(message) else message
    raise AssertionError(f"after {timeout_s:g} s: {text}")


def runtime_context(*, now: Callable[[], int] = lambda: 0, job_id: str = "j", task_name: str = "t",
                    subtask_index: int = 0, parallelism: int = 1, max_parallelism: int = 128,
                    attempt_number: int = 0, **fields: Any) -> RuntimeContext:
    """A RuntimeContext for one subtask with test defaults; ``now`` is its processing-time clock
    and ``fields`` sets any other RuntimeContext field (runtime_mode, batch_size, ...)."""
    return RuntimeContext(job_id=job_id, task_name=task_name, subtask_index=subtask_index,
                          parallelism=parallelism, max_parallelism=max_parallelism,
                          attempt_number=attempt_number, clock=now, **fields)


class RecordingOutput:
    """An Output that keeps everything it is given, in order (see the module docstring)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def collect(self, batch: pa.RecordBatch) -> None:
        assert isinstance(batch, pa.RecordBatch), f"an operator emitted a {type(batch).__name__}"
        self.events.append(("data", batch))

    def collect_side(self, tag: str, batch: pa.RecordBatch) -> None:
        assert isinstance(batch, pa.RecordBatch), f"an operator emitted a {type(batch).__name__}"
        self.events.append(("side", tag, batch))

    def emit_watermark(self, watermark: Watermark) -> None:
        self.events.append(("wm", watermark.timestamp))

    def emit_status(self, status: WatermarkStatus) -> None:
        self.events.append(("idle", status.idle))

    @property
    def batches(self) -> list[pa.RecordBatch]:
        """The main output's batches."""
        return [e[1] for e in self.events if e[0] == "data"]

    def rows(self) -> list[dict[str, Any]]:
        return [r for b in self.batches for r in b.to_pylist()]

    def side_rows(self, tag: str) -> list[dict[str, Any]]:
        return [r for e in self.events if e[0] == "side" and e[1] == tag for r in e[2].to_pylist()]

    def watermarks(self) -> list[int]:
        return [e[1] for e in self.events if e[0] == "wm"]

    def trace(self) -> list[Any]:
        """Main-output rows, ``("wm", ts)`` and ``("idle", bool)`` in emission order (no side output)."""
        out: list[Any] = []
        for e in self.events:
            if e[0] == "data":
                out.extend(e[1].to_pylist())
            elif e[0] in ("wm", "idle"):
                out.append(e)
        return out

    def take(self) -> list[pa.RecordBatch]:
        """The main output's batches since the last ``take``/``clear``; forgets every event."""
        batches = self.batches
        self.clear()
        return batches

    def clear(self) -> None:
        self.events.clear()


class OperatorHarness:
    """Runs one operator step by step with a manual processing-time clock.

    ``now`` is the clock's reading (ms); ``batch(..., now=)`` and ``tick(now)`` set it, and may
    set it to any value, as a test of processing time needs. ``context`` overrides fields of the
    RuntimeContext (subtask_index, parallelism, runtime_mode, batch_size, job_storage_dir,
    split_provider, ...). ``schema`` types the rows that ``batch`` turns into a RecordBatch.
    The operator is set up and opened at once unless ``open=False``."""

    def __init__(self, op: Operator, *, now: int = 0, schema: pa.Schema | None = None, open: bool = True,
                 **context: Any) -> None:
        self.op = op
        self.now = now
        self.schema = schema
        self.out = RecordingOutput()
        self.ctx = runtime_context(now=lambda: self.now, **context)
        self.steps: list[list[Event]] = []
        op.setup(self.ctx, self.out)
        if open:
            op.open()

    def _step(self, fn: Callable[[], Any]) -> list[Event]:
        start = len(self.out.events)
        fn()
        events = self.out.events[start:]
        self.steps.append(events)
        return events

    # -- input -------------------------------------------------------------------------------

    def batch(self, rows: Sequence[dict[str, Any]] | pa.RecordBatch, now: int | None = None,
              input_index: int = 0) -> list[Event]:
        """Feed ``rows`` (a RecordBatch, or rows typed by ``schema``), at processing time ``now``."""
        if now is not None:
            self.now = now
        batch = rows if isinstance(rows, pa.RecordBatch) else pa.RecordBatch.from_pylist(list(rows), schema=self.schema)
        return self._step(lambda: self.op.process_batch(batch, input_index))

    def watermark(self, watermark: int | Watermark, input_index: int = 0) -> list[Event]:
        wm = watermark if isinstance(watermark, Watermark) else Watermark(watermark)
        return self._step(lambda: self.op.process_watermark(wm, input_index))

    def tick(self, now: int | None = None) -> list[Event]:
        """A processing-time callback at ``now`` (the current reading when None)."""
        if now is not None:
            self.now = now
        at = self.now
        return self._step(lambda: self.op.on_processing_time(at))

    def advance(self, ms: int) -> list[Event]:
        """Move the clock ``ms`` forward and deliver a processing-time callback."""
        return self.tick(self.now + ms)

    def end_input(self, input_index: int = 0) -> list[Event]:
        return self._step(lambda: self.op.end_input(input_index))

    def finish(self) -> list[Event]:
        return self._step(self.op.finish)

    def close(self) -> None:
        self.op.close()

    def run(self, cancelled: Callable[[], bool] = lambda: False) -> OperatorHarness:
        """Run a source to its end (or until ``cancelled``) and close it; returns the harness,
        so ``OperatorHarness(source).run().rows()`` reads what it emitted."""
        try:
            self._step(lambda: self.op.run(cancelled))  # type: ignore[attr-defined]
        finally:
            self.op.close()
        return self

    # -- output ------------------------------------------------------------------------------

    @property
    def events(self) -> list[Event]:
        return self.out.events

    @property
    def batches(self) -> list[pa.RecordBatch]:
        return self.out.batches

    def rows(self) -> list[dict[str, Any]]:
        return self.out.rows()

    def side_rows(self, tag: str) -> list[dict[str, Any]]:
        return self.out.side_rows(tag)

    def watermarks(self) -> list[int]:
        return self.out.watermarks()

    def trace(self) -> list[Any]:
        return self.out.trace()

    def take(self) -> list[pa.RecordBatch]:
        return self.out.take()

    def clear(self) -> None:
        self.out.clear()


def assert_upsert_counts(out: Any, expected: Mapping[str, int]) -> None:
    """A keyed count's committed upsert stream in the Parquet folder ``out`` (columns ``k``,
    ``n``): each key's running totals committed once each, ending at its count in ``expected``."""
    import pyarrow.dataset as pads

    table = pads.dataset(str(out), format="parquet").to_table()
    per_key: dict[str, list[int]] = {}
    for k, n in zip(table["k"].to_pylist(), table["n"].to_pylist()):
        per_key.setdefault(k, []).append(n)
    for k, totals in per_key.items():
        assert len(totals) == len(set(totals)), f"{k}: a running total was committed twice"
        assert max(totals) == expected[k], f"{k}: {max(totals)} counted, {expected[k]} expected"
    assert set(per_key) == set(expected)


@contextlib.contextmanager
def frozen_then_one_killed(processes: Sequence[Any]) -> Iterator[None]:
    """SIGSTOP every process (no task can acknowledge a checkpoint: the latest completed one
    stays the latest while the body runs), then resume all but the first and SIGKILL it, so the
    job restores from a checkpoint the body may have tampered with."""
    for p in processes:
        p.send_signal(signal.SIGSTOP)
    try:
        time.sleep(0.5)
        yield
    finally:
        for p in processes[1:]:
            p.send_signal(signal.SIGCONT)
        processes[0].send_signal(signal.SIGKILL)


class CheckpointRecorder:
    """Watches a checkpoints folder while a job runs (every 20 ms, on a thread) and keeps what a
    test reads of its checkpoints afterwards, since an ended job's checkpoints are deleted
    (``execution.checkpointing.externalized-checkpoint-retention``; always when it FINISHED):
    each completed checkpoint's ``_metadata`` (``docs``: {checkpoint id: doc}), every shared
    file seen (``shared``), and the Arrow tables of the state files named in ``tables``, read as
    soon as their checkpoint completes (``files``: {path: table}; ``rocksdb`` manifests also with
    the canonical tables of the SST files they reference, in ``canonical``: {path: [(name,
    batch)]}, as those files go when no retained checkpoint references them)."""

    def __init__(self, root: Any, tables: Sequence[str] = ()) -> None:
        import pathlib
        import threading

        self._root = pathlib.Path(root)
        self._tables = set(tables)
        self.docs: dict[int, dict[str, Any]] = {}
        self.shared: set[str] = set()
        self.files: dict[str, pa.Table] = {}
        self.canonical: dict[str, list[tuple[str, pa.RecordBatch]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="checkpoint-recorder", daemon=True)

    def __enter__(self) -> CheckpointRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.poll()

    def poll(self) -> None:
        import json

        from yarnflow.common.rocksdb_snapshot import CorruptStateFileError, native_to_canonical

        self.shared.update(str(p) for p in self._root.glob("*/shared/*"))
        for meta in self._root.glob("*/chk-*/_metadata"):
            try:
                doc = json.loads(meta.read_text())
                if doc["checkpoint_id"] in self.docs:
                    continue
                named = {f["path"].removeprefix("file://"): f["name"] for st in doc["subtasks"].values()
                         for f in st["files"] if f["name"] in self._tables}
                files = {path: pa.ipc.open_file(path).read_all() for path in named}
                canonical = {path: list(native_to_canonical(files[path])) for path, name in named.items()
                             if name == "rocksdb"}
            except (OSError, ValueError, KeyError, pa.ArrowInvalid, CorruptStateFileError):
                continue  # deleted (subsumed) while read, or not complete yet: the next look decides
            self.files.update(files)
            self.canonical.update(canonical)
            self.docs[doc["checkpoint_id"]] = doc

    def latest(self) -> dict[str, Any]:
        return self.docs[max(self.docs)]


def savepoint_after_a_checkpoint(cli: Any, address: str, target: str) -> tuple[str, str]:
    """(job id, savepoint URL): the cluster's latest job, savepointed into ``target`` through the
    CLI once it runs with a completed checkpoint."""
    import json

    def running_with_checkpoint() -> str | None:
        listed = cli.run("list", "-a", address, "--json", check=True).stdout.splitlines()
        job = json.loads(listed[-1])["id"] if listed else None
        info = cli.run("info", "-a", address, job, check=True).stdout if job else ""
        return job if "RUNNING" in info and "COMPLETED" in info else None
    job = str(wait_until(running_with_checkpoint, 60, "the job never ran with a completed checkpoint", interval_s=0.2))
    [path] = cli.run("savepoint", "-a", address, job, target, check=True).stdout.split()
    return job, path
