"""The operator contract, shared by every operator in a chain."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

import pyarrow as pa

from yarnflow.common.errors import YarnflowError
from yarnflow.worker.memory.manager import MemoryBudget
from yarnflow.worker.memory.spill import SpillFiles
from yarnflow.worker.spark import MasterProvider
from yarnflow.worker.elements import Watermark
from yarnflow.worker.state.tables import Snapshot


#: see ``Operator.gauges``
Gauge = tuple[str, tuple[tuple[str, str], ...], str, float]

class UserFunctionError(YarnflowError):
    """A user function raised; the message names the operator, the cause is chained."""


class TaskCancelledError(YarnflowError):
    """Raised inside the task thread when the task was cancelled."""


#: how long a slice of rows given to a per-row user function should take (``Operator.row_slices``)
ROW_SLICE_SECONDS = 0.05
_FIRST_SLICE_ROWS = 64


@dataclass
class RuntimeContext:
    """What an operator may know about the subtask it runs in."""

    job_id: str
    task_name: str
    subtask_index: int
    parallelism: int
    max_parallelism: int
    attempt_number: int
    runtime_mode: str = "STREAMING"
    job_storage_dir: str = ""
    config: dict[str, str] = field(default_factory=dict)
    batch_size: int = 65536
    clock: Callable[[], int] = field(default=lambda: int(time.time() * 1000))  # processing time, ms
    #: for sources with dynamic splits: the next split's payload, or None when there are no more
    split_provider: Callable[[], Any] | None = None
    #: checkpoints are on (STREAMING job with execution.checkpointing.interval set): sinks then
    #: commit on notify_checkpoint_complete instead of at finish
    checkpointing: bool = False
    #: the checkpoint this attempt restored from (0: it started from nothing)
    restored_checkpoint_id: int = 0
    #: the attempt's ExecutionAttemptID: unique, also across JobMasters (attempt numbers start
    #: again at 0 when a new leader recovers a job)
    attempt_id: str = ""
    #: the task was cancelled (operators calling a user function per row check it between slices)
    cancelled: Callable[[], bool] = field(default=lambda: False)
    #: this operator's share of its slot's managed memory (joins, aggregations and sorts keep
    #: their working data in it and spill the rest; unbounded outside a TaskExecutor)
    memory: MemoryBudget = field(default_factory=MemoryBudget.unlimited)
    #: the slot's shared RocksDB memory (``worker/memory/rocksdb_memory.py``), made when the first
    #: RocksDB backend of the slot asks; None outside a TaskExecutor or when the job turned it off
    rocksdb_memory: Callable[[], Any] = field(default=lambda: None)
    #: the task attempt's spill files (removed when the task ends)
    spill: SpillFiles = field(default_factory=SpillFiles)
    #: asks the AppMaster where a Spark stage's Spark runs (its Spark master's URL, or "local");
    #: None outside a TaskExecutor
    spark_master: MasterProvider | None = None
    #: the task's Python worker process (``worker/pyworker``), where its stateless per-row
    #: operators send batches; None on the task thread only (``python.execution-mode: thread``)
    python_worker: Any = None

    @property
    def is_batch(self) -> bool:
        return self.runtime_mode == "BATCH"


class Output(Protocol):
    def collect(self, batch: pa.RecordBatch) -> None:
        """Emit ``batch`` on the main output."""

    def collect_side(self, tag: str, batch: pa.RecordBatch) -> None:
        """Emit ``batch`` on the side output ``tag`` (dropped when nothing consumes it)."""

    def emit_watermark(self, watermark: Watermark) -> None: ...


class Operator:
    """Base of all operators. Lifecycle: setup -> open -> process_* -> end_input -> finish -> close.

    ``close`` runs whatever happened (also after a failure or a cancel); ``finish`` only after
    all input has been processed, and is where buffered results are emitted."""

    kind = "operator"
    #: set to a period in ms to get ``on_processing_time`` calls from the task thread
    processing_time_interval_ms: int | None = None
    _slice_rows = _FIRST_SLICE_ROWS  # rows per slice of ``row_slices``, as the function's pace says

    def __init__(self, name: str | None = None, uid: str | None = None) -> None:
        self.name = name or self.kind
        self.uid = uid or ""
        self.ctx: RuntimeContext
        self.output: Output

    def execution_path(self) -> str:
        """How its user function runs (vectorised, per row and why), for ``yarnflow info``; ""
        for an operator without one to describe."""
        return ""

    def row_slices(self, n: int) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` slices of ``range(n)`` (a batch's rows, or its keys) for a loop that
        calls a user function per row: between two slices a cancelled task stops (raises
        TaskCancelledError), so a slow function (a remote call per row) does not hold a cancel
        back for a whole batch. A slice is sized to take about ``ROW_SLICE_SECONDS`` at the pace
        the function has shown, so a fast one gets a whole batch at a time after its first one."""
        start, size = 0, self._slice_rows
        while start < n:
            stop = min(n, start + size)
            began = time.perf_counter()
            yield start, stop
            took = time.perf_counter() - began
            if took > 0:
                size = max(1, min(1 << 22, int((stop - start) / took * ROW_SLICE_SECONDS)))
            self._slice_rows = size
            if stop < n and self.ctx.cancelled():
                raise TaskCancelledError(f"{self.name} was cancelled")
            start = stop

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        self.ctx = ctx
        self.output = output

    def open(self) -> None:
        pass

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        self.output.collect(batch)

    def process_watermark(self, watermark: Watermark, input_index: int = 0) -> None:
        self.output.emit_watermark(watermark)

    def end_input(self, input_index: int = 0) -> None:
        pass

    def on_processing_time(self, now_ms: int) -> None:
        """Called on the task thread about every ``processing_time_interval_ms`` (when set)."""

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass

    # -- checkpoints -------------------------------------------------------------------------
    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        """Called on the task thread when checkpoint ``checkpoint_id`` is taken, before any
        operator's ``snapshot_state`` and before the barrier goes downstream (Flink's
        prepareSnapshotPreBarrier): what it emits now is in that checkpoint's span."""

    def snapshot_state(self, checkpoint_id: int) -> Snapshot:
        """The operator's state at a checkpoint barrier, as named Arrow tables (written as
        Arrow IPC files under ``chk-<n>/``). Called on the task thread between two elements,
        with every earlier element processed: return a consistent copy (Arrow data is
        immutable; copy mutable Python structures), because the task writes the tables in the
        background while processing goes on; or an ``AsyncSnapshot`` whose tables are made on
        the writer's thread from a view the operator froze now (keyed state backends do that).
        Stateless operators return ``{}``."""
        return {}

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        """Restore from a checkpoint: called after ``setup`` and before ``open`` with the
        tables ``snapshot_state`` returned (``{}`` when the checkpoint has none for it)."""

    @property
    def needs_final_checkpoint(self) -> bool:
        """True for an operator that commits on checkpoints (a two-phase sink): after ``finish``
        its task stays RUNNING until a checkpoint taken after the end of input completes."""
        return False

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Every task has the checkpoint: commit what it covers (two-phase sinks). Called on
        the task thread."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """That checkpoint will never complete. Called on the task thread."""

    def gauges(self) -> list[Gauge]:
        """A connector's own figures, as Flink's metric groups name them: ``(group, ((key,
        value), ...), metric, value)``, e.g. ``("KafkaSourceReader", (("topic", "t"),
        ("partition", "0")), "currentOffset", 41.0)``. Read from a metrics thread: return what
        the task thread recorded, never touch a client library from here."""
        return []

    def call_user(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call a user function; its error is re-raised naming this operator."""
        try:
            return fn(*args)
        except Exception as exc:
            raise self.user_error(fn, exc) from exc

    def user_error(self, fn: Callable[..., Any], exc: Exception) -> UserFunctionError:
        """The error ``call_user`` raises for ``exc`` from ``fn``: per-row loops call the user
        function inline (no wrapper call per row) and raise this ``from exc``."""
        return UserFunctionError(f"user function {getattr(fn, '__name__', fn)!s} in operator '{self.name}' "
                                 f"raised {type(exc).__name__}: {exc}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class TwoInputOperator(Operator):
    """An operator with inputs 0 and 1; its watermark is the minimum of its inputs'."""

    kind = "two_input"

    def __init__(self, name: str | None = None, uid: str | None = None) -> None:
        super().__init__(name, uid)
        self._input_wm = [-(2**63), -(2**63)]
        self._ended = [False, False]
        self.current_watermark = -(2**63)

    def process_watermark(self, watermark: Watermark, input_index: int = 0) -> None:
        self._input_wm[input_index] = max(self._input_wm[input_index], watermark.timestamp)
        self._advance()

    def end_input(self, input_index: int = 0) -> None:
        self._ended[input_index] = True
        self._advance()

    def _advance(self) -> None:
        live = [wm for wm, ended in zip(self._input_wm, self._ended) if not ended]
        new = min(live) if live else 2**63 - 1
        if new > self.current_watermark:
            self.current_watermark = new
            self.on_watermark(new)

    def on_watermark(self, timestamp: int) -> None:
        self.output.emit_watermark(Watermark(timestamp))


class SourceOperator(Operator):
    """The head of a source chain: ``run`` emits batches into ``self.output`` until done.

    A source with dynamic splits returns them from ``enumerate_splits`` (called once, in the
    JobMaster) and reads them from ``self.ctx.split_provider`` as it asks for work."""

    kind = "source"
    bounded = True
    dynamic_splits = False
    #: time spent in ``pause`` (waiting, not working): the task's idle time, as an input gate's
    #: wait is a task's with inputs
    idle_ns = 0

    def run(self, cancelled: Callable[[], bool]) -> None:
        raise NotImplementedError

    def pause(self, seconds: float) -> None:
        """Wait ``seconds`` (a rate limit, an empty poll): counted as idle, not busy, time."""
        started = time.perf_counter_ns()
        time.sleep(seconds)
        self.idle_ns += time.perf_counter_ns() - started

    def enumerate_splits(self) -> list[tuple[str, Any]]:
        """``(split id, payload)`` pairs; payloads must pickle."""
        raise NotImplementedError

    def estimated_bytes(self) -> int | None:
        """About how much memory the source's rows take, for the compiler's choice of a join
        strategy (None: unknown). Called in the client, at compile time."""
        return None
