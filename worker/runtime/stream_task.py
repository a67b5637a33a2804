"""StreamTask: drives one subtask's operator chain from its input gate (or its source) to its
record writers. Runs on the task's own thread.

Checkpoints (see ``barriers.py`` for alignment): between two elements the task takes the mail
the TaskExecutor left in its ``Mailbox`` (triggers, notifications). A source task takes its
snapshot at the next ``_source_tick`` after a trigger; a task with inputs when its barriers are
aligned (or, after a direct trigger, when all its inputs ended). Taking a snapshot means: every
operator's ``snapshot_state``, head first; then the barrier goes to every subpartition, after
all output so far; then the tables are written and acknowledged in the background
(``SnapshotWriter``). Elements held back on blocked channels are replayed, in order, before the
gate is polled again.

Input selection (BATCH jobs, Flink's ``InputSelectable``): a two-input head operator with an
``input_selection()`` method names the input to read next (a hash join: its build side until it
has ended); the task then polls only that input's channels, and the other input's wait in
their partitions. Side inputs: an operator chained after the head may take inputs of the
vertex's own (``vertex_inputs``: vertex input -> the operator's input; a broadcast join chained
to its probe side's source); those are read to their end before the head runs, so the
operator has its build side before the first probe row.

Stop-with-savepoint (Flink's FLIP-34, with FLIP-147's final checkpoint): the JobMaster triggers
the savepoint at the sources with a stop mode. A source takes its snapshot and stops reading;
with "drain" it first ends its input (the maximum watermark fires every timer and window, and
its chain finishes). The barrier carries the mode downstream: a task takes its snapshot when it
is aligned (with "drain", after finishing its chain) and from then on lets event time stand
still and does not end its input when its partitions end: without drain, windows and timers
stay in the savepoint, unfired. Every task then waits until the savepoint completes (sinks commit on that
notification) and ends; if it is aborted instead the task fails, and the job restarts from its
latest checkpoint; without drain, the tasks go on instead: the sources read on from where they
stopped (their state did not change) and the job runs as before."""

from __future__ import annotations

import collections
import logging
import time
from typing import Any, Callable, Sequence

import pyarrow as pa

from yarnflow.worker.network.debloat import BufferDebloater
from yarnflow.worker.operators.base import Operator, SourceOperator, TaskCancelledError
from yarnflow.worker.runtime.barriers import BarrierAligner
from yarnflow.worker.runtime.checkpoints import (
    Mailbox,
)
from yarnflow.worker.elements import (
    ACTIVE,
    IDLE,
    MAX_WATERMARK,
    CheckpointBarrier,
    EndOfPartition,
    Watermark,
    WatermarkStatus,
)
from yarnflow.worker.network.gate import ChannelError, InputGate
from yarnflow.worker.runtime.outputs import ChainOutput, WatermarkValve, WriterOutput
from yarnflow.worker.runtime.task_checkpoints import StopWithSavepointError, TaskCheckpoints
from yarnflow.worker.runtime.unaligned import Inflight, SnapshotSink
from yarnflow.worker.runtime.writer import RecordWriter

log = logging.getLogger(__name__)

#: a batch whose processing would take longer than this is processed in slices, between which
#: the task looks for an unaligned checkpoint's barrier and for mail
SLICE_TARGET_S = 0.02
#: the first slice while the task's pace is not known yet (a function taking a millisecond a row
#: would otherwise hold a 65,536-row batch, and every barrier behind it, for a minute)
FIRST_SLICE_ROWS = 64
#: the smallest slice once the pace is known
MIN_SLICE_ROWS = 4
#: without unaligned checkpoints, a batch whose processing would take longer than this is still
#: processed in slices, so the task's record counters (and the rates shown from them) move with
#: the records processed: a function taking a millisecond a row read 0 records/s for a minute,
#: then a whole batch at once. Long enough that no vectorised operator is ever sliced.
PROGRESS_SLICE_S = 0.25
#: the smallest of those slices
MIN_PROGRESS_SLICE_ROWS = 64


class StreamTask(TaskCheckpoints):
    def __init__(self, chain: Sequence[Operator], gate: InputGate | None, channel_inputs: Sequence[int],
                 writers: Sequence[RecordWriter], cancelled: Callable[[], bool], name: str,
                 mailbox: Mailbox | None = None, snapshots: SnapshotSink | None = None,
                 restored_finished: bool = False, io_metrics: bool = True, slicing: bool = False,
                 restored_inputs: dict[int, list[Any]] | None = None,
                 restored_outputs: dict[tuple[int, int], list[Any]] | None = None,
                 rescaled_outputs: dict[int, list[pa.RecordBatch]] | None = None,
                 debloater: BufferDebloater | None = None, debloat_period_s: float = 0.2) -> None:
        self.chain = list(chain)
        #: buffer debloating: each ``debloat_period_s`` the gate's buffer size follows the
        #: bytes the task takes per busy second (``network/debloat.py``)
        self._debloater = debloater if gate is not None else None
        self._debloat_period_s = debloat_period_s
        self._debloat_mark = (0.0, 0, 0)  # (time, bytes taken, gate idle ns) at the period's start
        #: unaligned checkpoints: slow batches are processed in slices (``SLICE_TARGET_S``)
        self._slicing = slicing
        #: slices for the counters' sake (``PROGRESS_SLICE_S``), when the task keeps metrics
        self._progress_slices = io_metrics and gate is not None
        #: seconds the chain takes per input row (smoothed; None: not measured yet)
        self._per_row_s: float | None = None
        if slicing:  # the task waits for room in its outputs between elements, never inside one
            for w in writers:
                w.blocking = False
        self._inflight: Inflight | None = None
        self._failed_unaligned = False
        #: ``_pull_ahead`` has channels to take more from as it arrives
        self._pulling = False
        #: channels whose end of partition ``_pull_ahead`` took: it waits in ``_replay``
        self._pulled_end: set[int] = set()
        #: in-flight data of the unaligned checkpoint restored: replayed, in order, first
        self._restored_inputs = restored_inputs or {}
        self._restored_outputs = restored_outputs or {}
        #: other subtasks' in-flight output of a checkpoint taken at another parallelism: sent
        #: again through each writer's partitioner, before anything new
        self._rescaled_outputs = rescaled_outputs or {}
        self._io_metrics = io_metrics
        self._count_bytes = io_metrics or self._debloater is not None
        self.bytes_in = 0
        self._chain_outputs: list[ChainOutput] = []
        self.gate = gate
        self.channel_inputs = list(channel_inputs)
        self.writers = list(writers)
        self.cancelled = cancelled
        self.name = name
        self.records_in = 0
        self.tail = WriterOutput(writers)
        self._timed: list[Operator] = []  # (wire: an operator may ask for timers once set up)
        self._next_timer = 0.0
        self._idle_out = False
        self.valves: dict[int, WatermarkValve] = {}
        self.mailbox = mailbox if mailbox is not None else Mailbox()
        if gate is not None:
            self.mailbox.on_mail = gate.wakeup
        self._snapshots = snapshots
        #: restored from a checkpoint taken after this subtask had finished: it emits nothing
        self.restored_finished = restored_finished
        #: the last checkpoint barrier this task emitted (0: none)
        self.last_barrier_id = 0
        self._aligner = BarrierAligner(len(self.channel_inputs)) if gate is not None else None
        #: elements of blocked channels, held back in arrival order until their checkpoint is taken
        self._held: collections.deque[tuple[int, Any]] = collections.deque()
        #: held elements released, processed before the gate is polled again
        self._replay: collections.deque[tuple[int, Any]] = collections.deque()
        #: checkpoints triggered directly (the task's upstream finished), and snapshots waiting
        #: for the chain to finish (see ``_apply``)
        self._direct: set[int] = set()
        self._deferred: list[tuple[CheckpointBarrier, int]] = []
        self._input_ended = False
        self._chain_finished = False
        #: the stop-with-savepoint this task took its snapshot for: (checkpoint id, "stop" | "drain")
        self._stop: tuple[int, str] | None = None
        self._stop_completed = False
        #: vertex inputs that an operator after the head takes: input -> (operator, its input)
        self._side_routes: dict[int, tuple[Operator, int]] = {
            vin: (op, oin) for op in self.chain[1:] for vin, oin in getattr(op, "vertex_inputs", {}).items()}

    def wire(self, ctx_for: Callable[[Operator], Any]) -> None:
        self._chain_outputs = [ChainOutput(nxt, self.tail) for nxt in self.chain[1:]]
        outputs: list[ChainOutput | WriterOutput] = [*self._chain_outputs, self.tail]
        for op, out in zip(self.chain, outputs):
            op.setup(ctx_for(op), out)
        self._timed = [op for op in self.chain if op.processing_time_interval_ms]

    def operator_records(self) -> tuple[list[int], list[int]]:
        """Records into and out of each operator of the chain, head first (a source head has
        none in)."""
        outs = [out.records_out for out in self._chain_outputs] + [self.tail.records_out]
        head_in = 0 if isinstance(self.chain[0], SourceOperator) else self.records_in
        return [head_in, *outs[:-1]], outs

    def operator_paths(self) -> list[str]:
        """How each operator of the chain runs its user function (``Operator.execution_path``)."""
        return [op.execution_path() for op in self.chain]

    def invoke(self) -> None:
        if self.restored_finished:
            self._run_finished()
            return
        opened: list[Operator] = []
        try:
            for op in reversed(self.chain):
                op.open()
                opened.append(op)
            for (writer, index), elements in sorted(self._restored_outputs.items()):
                # the in-flight output of the restored unaligned checkpoint goes out first
                for element in elements:
                    self.writers[writer].send_restored(index, element)
            for writer, batches in sorted(self._rescaled_outputs.items()):
                for batch in batches:
                    self.writers[writer].emit(batch)
            head = self.chain[0]
            if self._side_routes:
                self._read_side_inputs()
            if isinstance(head, SourceOperator):
                head.run(self._source_tick)
                while self._stop is not None and not self._await_stop():
                    head.run(self._source_tick)  # the stop's savepoint failed: read on
                self._check_cancelled()
                self._input_ended = True
                self.process_mail()  # a trigger that came as the source ended: taken after the chain finished
                if head.bounded and self._stop is None:
                    head.process_watermark(MAX_WATERMARK)
            else:
                self._run_input_loop(head)
                self.process_mail()
            if self._stop is None:  # stopped: without drain the chain never finishes; with drain it did
                self._finish_chain()
            self._chain_finished = True
            first = self._take_deferred()
            if self._stop is not None and not self._await_stop():
                raise StopWithSavepointError(f"{self.name}: the savepoint of stop-with-savepoint was aborted after "
                                             "its input ended; the job restarts from its latest checkpoint")
            if self._stop is not None:
                pass  # stopped: the savepoint was its final checkpoint
            elif any(op.needs_final_checkpoint for op in self.chain):
                self._await_final_checkpoint(first)
            for w in self.writers:
                w.finish()
        finally:
            for op in opened:
                try:
                    op.close()
                except Exception:  # noqa: BLE001 - closing must not hide the real error
                    log.warning("%s: closing %s failed", self.name, op, exc_info=True)
            for mail in self.mailbox.drain():
                log.debug("%s: %s after the task's work ended ignored", self.name, mail)

    def _await_room(self) -> None:
        """(Unaligned checkpoints.) Wait until every output can take a batch, taking mail
        meanwhile: a back-pressured task takes a checkpoint between two elements instead of
        waiting inside one for its consumers (Flink's output availability)."""
        if not self._slicing:
            return
        while not self.cancelled():
            full = next((w for w in self.writers if not w.has_room()), None)
            if full is None or (self.gate is not None and self.gate.has_priority()):
                return  # (a barrier that overtakes is taken at once: it sends nothing but itself)
            if self.mailbox:
                self.process_mail()
            full.wait_for_room(0.01)

    def _source_tick(self) -> bool:
        """Called by a source between batches: take mail (checkpoints), flush due output, fire
        processing time; True when the task was cancelled and the source should stop."""
        self._await_room()
        if not self.cancelled():
            if self.mailbox:
                self.process_mail()
            for w in self.writers:
                w.flush_if_due()
            if self._stop is None:
                self._fire_processing_time()
        return self.cancelled() or self._stop is not None

    # -- processing -------------------------------------------------------------------------
    def _fire_processing_time(self) -> float | None:
        if not self._timed:
            return None
        now = time.monotonic()
        if now >= self._next_timer:
            for op in self._timed:
                op.on_processing_time(op.ctx.clock())
            self._next_timer = now + min(op.processing_time_interval_ms or 100 for op in self._timed) / 1000.0
        return max(0.0, self._next_timer - time.monotonic())

    def _check_cancelled(self) -> None:
        if self.cancelled():
            raise TaskCancelledError(f"{self.name} was cancelled")

    def _finish_chain(self) -> None:
        for i, op in enumerate(self.chain):
            if i > 0:
                op.end_input(int(getattr(op, "chain_input", 0)))
            op.finish()

    def _read_side_inputs(self) -> None:
        """Read the inputs that operators after the head take (``_side_routes``) to their end,
        before the head runs (BATCH jobs: their exchanges are blocking, and no checkpoints are
        taken)."""
        gate = self.gate
        assert gate is not None
        channels = frozenset(ch for ch, inp in enumerate(self.channel_inputs) if inp in self._side_routes)
        remaining = {i: sum(1 for inp in self.channel_inputs if inp == i) for i in self._side_routes}
        while any(remaining.values()):
            self._check_cancelled()
            polled = gate.poll(0.5, channels)
            if polled is None:
                continue
            ch, element = polled
            inp = self.channel_inputs[ch]
            op, op_input = self._side_routes[inp]
            if isinstance(element, pa.RecordBatch):
                self.records_in += element.num_rows
                if self._count_bytes:
                    self.bytes_in += element.nbytes
                op.process_batch(element, op_input)
            elif isinstance(element, EndOfPartition):
                remaining[inp] -= 1
                if remaining[inp] == 0:
                    op.process_watermark(MAX_WATERMARK, op_input)
                    op.end_input(op_input)
            elif isinstance(element, ChannelError):
                raise element.error
            # watermarks, idleness: a bounded input's event time is complete at its end;
            # barriers: BATCH jobs take no checkpoints

    def _selected_channels(self, head: Operator, remaining: dict[int, int]) -> frozenset[int] | None:
        """The channels of the input the head operator selects (None: any input)."""
        select = getattr(head, "input_selection", None)
        if select is None:
            return None
        wanted = select()
        if wanted is None or not remaining.get(wanted):
            return None
        return self._input_channels[wanted]

    def _run_input_loop(self, head: Operator) -> None:
        gate, aligner = self.gate, self._aligner
        if gate is None:  # an operator with no input of its own (a Spark stage reading only files)
            return
        assert aligner is not None
        inputs = sorted(set(self.channel_inputs) - set(self._side_routes))
        self._input_channels = {i: frozenset(ch for ch, inp in enumerate(self.channel_inputs) if inp == i)
                                for i in inputs}
        valves = {i: WatermarkValve(sorted(self._input_channels[i])) for i in inputs}
        self.valves = valves  # (their watermarks are the task's currentInputWatermark)
        remaining = {i: len(self._input_channels[i]) for i in inputs}
        timeout: float | None = None
        for ch, elements in sorted(self._restored_inputs.items()):  # a restored unaligned checkpoint's
            self._replay.extend((ch, e) for e in elements)  # in-flight input, before anything new
        while any(remaining.values()) or self._replay:
            self._check_cancelled()
            if self.mailbox:
                self.process_mail()
            if aligner.timeout_in() == 0:
                self._apply(aligner.on_timeout())
            if self._inflight is not None and aligner.pending is not None:
                self._pull_ahead(aligner.pending.checkpoint_id in self._direct)
            else:
                self._pulling = False
            self._await_room()
            if self._replay and not gate.has_priority():
                polled: tuple[int, Any] | None = self._replay.popleft()
            else:
                selected = self._selected_channels(head, remaining)
                wait = timeout if timeout is not None else 0.5
                polled = gate.poll(wait) if selected is None else gate.poll(wait, selected)
            if polled is not None:
                ch, element = polled
                inp = self.channel_inputs[ch]
                if aligner.is_blocked(ch) and not isinstance(element, ChannelError):
                    self._held.append(polled)
                elif self._stop is not None and isinstance(element, (Watermark, WatermarkStatus)):
                    # stopped with a savepoint: event time stands still (the savepoint holds the
                    # windows and timers); records still count: they come only when the
                    # savepoint failed and the sources read on, before this task heard of it
                    pass
                elif isinstance(element, pa.RecordBatch):
                    self._process_batch(head, ch, inp, element)
                elif isinstance(element, Watermark):
                    self._record(ch, element)
                    wm = valves[inp].on_watermark(ch, element.timestamp)
                    if wm is not None:
                        head.process_watermark(Watermark(wm), inp)
                elif isinstance(element, WatermarkStatus):
                    self._record(ch, element)
                    wm = valves[inp].on_status(ch, element.idle)
                    if wm is not None:
                        head.process_watermark(Watermark(wm), inp)
                    self._propagate_idleness(valves)
                elif isinstance(element, CheckpointBarrier):
                    pending = aligner.pending
                    if (self._inflight is not None and pending is not None and aligner.is_recording(ch)
                            and element.checkpoint_id == pending.checkpoint_id):
                        self._barrier_came(ch, gate.overtaken_by(ch, element.checkpoint_id))
                    self._apply(aligner.on_barrier(ch, element), ch)
                elif isinstance(element, EndOfPartition) and self._stop is not None:
                    self._pulled_end.discard(ch)
                    remaining[inp] -= 1  # no watermark, no end of input: the savepoint holds the rest
                    self._apply(aligner.on_end_of_partition(ch))
                elif isinstance(element, EndOfPartition):
                    self._pulled_end.discard(ch)
                    remaining[inp] -= 1
                    wm = valves[inp].on_end(ch)
                    if wm is not None and remaining[inp]:
                        head.process_watermark(Watermark(wm), inp)
                    if remaining[inp] == 0:
                        if valves[inp].current < MAX_WATERMARK.timestamp:
                            # the input ended (also a blocking one, which keeps no watermarks):
                            # event time is complete for it
                            valves[inp].current = MAX_WATERMARK.timestamp
                            head.process_watermark(MAX_WATERMARK, inp)
                        head.end_input(inp)
                    self._apply(aligner.on_end_of_partition(ch))
                elif isinstance(element, ChannelError):
                    raise element.error
            timeout = self._fire_processing_time() if self._stop is None else None
            for w in self.writers:
                due = w.flush_if_due()
                if due is not None:
                    timeout = due if timeout is None else min(timeout, due)
            switch = aligner.timeout_in()
            if switch is not None:
                timeout = switch if timeout is None else min(timeout, switch)
            if self._debloater is not None:
                self._debloat()

    def _debloat(self) -> None:
        """Once a period: measure, and announce a new buffer size to the channels if it changed."""
        gate, debloater = self.gate, self._debloater
        assert gate is not None and debloater is not None
        now = time.monotonic()
        since, taken, idle_ns = self._debloat_mark
        if now - since < self._debloat_period_s:
            return
        self._debloat_mark = (now, self.bytes_in, gate.idle_ns)
        if since == 0.0:
            return  # the first period starts now
        busy_s = now - since - (gate.idle_ns - idle_ns) / 1e9
        size = debloater.on_period(self.bytes_in - taken, busy_s)
        if size is not None:
            log.debug("%s: %.0f bytes/s busy: buffers of %d bytes", self.name, debloater.throughput or 0, size)
            gate.set_buffer_size(size)

    def _process_batch(self, head: Operator, channel: int, inp: int, batch: pa.RecordBatch) -> None:
        """Hand ``batch`` to the head operator; with slicing, one slice (``_slice_size``), the
        rest going back to the front of ``_replay``: the loop comes round between two slices,
        where it takes an unaligned checkpoint's barrier, mail (a direct trigger), an aligned
        checkpoint turning unaligned, due output and processing time."""
        rows = batch.num_rows
        n = self._slice_size(rows)
        part = batch if n == rows else batch.slice(0, n)
        self._record(channel, part)
        self.records_in += n
        if self._count_bytes:
            self.bytes_in += part.nbytes
        timed = self._slicing or self._progress_slices
        if timed:  # (the time spent waiting for room in blocking outputs is not the chain's pace)
            waited = 0 if self._slicing else sum(w.backpressured_ns for w in self.writers)
            started = time.perf_counter()
        head.process_batch(part, inp)
        if timed:
            took = time.perf_counter() - started
            if not self._slicing:
                took -= (sum(w.backpressured_ns for w in self.writers) - waited) / 1e9
            sample = max(0.0, took) / n
            old = self._per_row_s
            self._per_row_s = sample if old is None else old + 0.5 * (sample - old)
        if n < rows:
            self._replay.appendleft((channel, batch.slice(n)))

    def _slice_size(self, rows: int) -> int:
        """How many of the ``rows`` left of a batch to process next: all of them without
        slicing, or when they take less than ``SLICE_TARGET_S`` at the pace measured; else what
        takes that long; a few while the pace is not known."""
        if self._slicing:
            target, smallest = SLICE_TARGET_S, MIN_SLICE_ROWS
        elif self._progress_slices:
            target, smallest = PROGRESS_SLICE_S, MIN_PROGRESS_SLICE_ROWS
        else:
            return rows
        per_row = self._per_row_s
        if per_row is None:
            return min(rows, FIRST_SLICE_ROWS)
        if per_row * rows <= target:
            return rows
        return min(rows, max(smallest, int(target / per_row)))

    @property
    def input_watermark(self) -> int:
        """currentInputWatermark: the least watermark of its inputs (i64 min before any came)."""
        valves = list(self.valves.values())
        return min(v.current for v in valves) if valves else -(2**63)

    def _propagate_idleness(self, valves: dict[int, WatermarkValve]) -> None:
        idle = all(v.all_idle for v in valves.values())
        if idle != self._idle_out:
            self._idle_out = idle
            self.tail.emit_status(IDLE if idle else ACTIVE)
