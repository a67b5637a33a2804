"""Task: one deployed subtask attempt, on a thread of its own.

It builds the subtask's result partitions, input gate and operator chain from its
TaskDeploymentDescriptor, runs the StreamTask, and reports each state change
(INITIALIZING, RUNNING, then FINISHED / CANCELED / FAILED with the error).

Checkpoints: the TaskExecutor puts triggers and notifications into the task's ``mailbox``; the
StreamTask takes them on the task thread. Snapshots are written and acknowledged through the
``CheckpointResponder`` the TaskExecutor gives (its JobMaster). A task deployed with a
``restore`` reads its state files and hands them to its operators before they open."""

from __future__ import annotations

import functools
import logging
import pickle
import threading
import time
from typing import Any, Callable, Sequence

from yarnflow.common import logs
from yarnflow.common.config import Options
from yarnflow.common.config_types import parse_buffer_timeout_ms, parse_duration_ms, parse_size_bytes
from yarnflow.common.messages import (ErrorInfo, SplitResponse, TakenSplit, TaskDeploymentDescriptor,
                                      TaskExecutionStateUpdate)
from yarnflow.common.lifecycle import Lifecycle
from yarnflow.common.states import TASK_TRANSITIONS, ExecutionState
from yarnflow.common.artifacts import ArtifactCache, ArtifactReader
from yarnflow.worker.memory.manager import MemoryBudget, MemoryManager
from yarnflow.worker.memory.rocksdb_memory import slot_rocksdb_memory
from yarnflow.worker.memory.spill import SpillFiles
from yarnflow.worker.spark import MasterProvider
from yarnflow.worker.network.client import DataClient
from yarnflow.worker.network.debloat import BufferDebloater
from yarnflow.worker.operators.base import RuntimeContext
from yarnflow.worker.pyworker import PythonWorker, offloadable
from yarnflow.worker.runtime.checkpoints import (
    CheckpointResponder,
    Mailbox,
    NotifyCheckpoint,
    SnapshotWriter,
    TriggerCheckpoint,
    ChannelState,
    StateRestoreError,
    read_channel_state,
    read_task_state,
)
from yarnflow.worker.key_assignment import own_key_groups
from yarnflow.worker.network.gate import InputChannel, InputGate, IteratorChannel, LocalInputChannel, SequenceChannel
from yarnflow.common.states import ExchangeMode, Partitioner
from yarnflow.worker.network.partition import ResultPartitionManager, read_stored, stored_partition_url
from yarnflow.worker.runtime.stream_task import StreamTask, TaskCancelledError
from yarnflow.worker.runtime.writer import RecordWriter
from yarnflow.worker.metrics import TaskMetricGroup
from yarnflow.worker.state.local_recovery import ReadStats, TaskLocalState, reading_from
from yarnflow.worker.state.localdir import default_base, release_attempt

log = logging.getLogger(__name__)


def _knock_on(exc: BaseException) -> bool:
    """The task failed because an input's producer ended first (it released the partition, or its
    TaskExecutor is gone): the consequence of another task's end (often a cancel under way)."""
    from yarnflow.common.errors import RpcConnectionError
    from yarnflow.worker.network.blocking import PartitionReleasedError
    from yarnflow.worker.network.flight import PartitionNotFoundError

    return isinstance(exc, (PartitionReleasedError, PartitionNotFoundError)) or (
        isinstance(exc, RpcConnectionError) and "cannot read partition" in str(exc))


class Task:
    def __init__(self, tdd: TaskDeploymentDescriptor, *, resource_id: str, artifacts: ArtifactCache,
                 partitions: ResultPartitionManager, data_client: DataClient,
                 on_state: Callable[[TaskExecutionStateUpdate], object], location: str,
                 request_split: Callable[[int], SplitResponse] | None = None,
                 checkpoints: CheckpointResponder | None = None,
                 memory: MemoryManager | None = None, slot_index: int = 0,
                 spill_roots: Sequence[str] | None = None,
                 spark_master: MasterProvider | None = None,
                 read_artifact: ArtifactReader | None = None) -> None:
        """``request_split(last_checkpoint_id)`` asks the JobMaster for this source subtask's next
        split; ``read_artifact(offset, length)`` reads the job's artifact from the AppMaster's
        blob service (None: from its URI); ``checkpoints`` receives its acknowledgements and declines. Operators that use
        managed memory take their budgets from ``memory``'s slot ``slot_index``; spill files go
        under ``spill_roots`` (one ``yarnflow-spill`` folder per tmp dir)."""
        self._memory = memory
        self._slot_index = slot_index
        self._spark_master = spark_master
        self.spill = SpillFiles(spill_roots, str(tdd.execution_attempt_id)) if spill_roots else SpillFiles()
        self._request_split = request_split
        #: every split this task took from the enumerator, with the last barrier it had emitted
        #: then (booked by the TaskExecutor as it takes it: a new leader's JobMaster is told)
        self.taken_splits: list[TakenSplit] = []
        self._responder = checkpoints
        #: checkpoint calls for the task thread
        self.mailbox = Mailbox()
        self._snapshot_writer: SnapshotWriter | None = None
        self.tdd = tdd
        self.attempt_id = tdd.execution_attempt_id
        self._life = Lifecycle(f"task {tdd.display_name} ({tdd.execution_attempt_id})", TASK_TRANSITIONS,
                               ExecutionState.DEPLOYING)
        self._resource_id = resource_id
        self._artifacts = artifacts
        self._read_artifact = read_artifact
        self._partitions = partitions
        self._data_client = data_client
        self._on_state = on_state
        self._location = f"{location} / {tdd.display_name}"
        self._cancelled = threading.Event()
        self._external_failure: BaseException | None = None
        self._gate: InputGate | None = None
        self._stream_task: StreamTask | None = None
        self._python_worker: PythonWorker | None = None
        self._io_metrics = tdd.config.get(Options.TASK_IO_METRICS.key, "true").lower() != "false"
        #: the task's figures (Flink's TaskIOMetricGroup), read by heartbeats and Prometheus
        self.metrics = TaskMetricGroup(tdd.task_name, tdd.subtask_index, str(tdd.job_id), (),
                                       job_name=tdd.job_name, attempt=tdd.attempt_number)
        self.metrics.spilled_bytes = lambda: self.spill.spilled_bytes
        if memory is not None:
            owner = str(tdd.execution_attempt_id)
            self.metrics.managed_memory = lambda: memory.owner_usage(owner)
        self._thread = threading.Thread(target=self._run, name=f"task {tdd.display_name}", daemon=True)

    # -- control ----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def fail_externally(self, error: BaseException) -> bool:
        """Fail the task with ``error`` from outside (Flink's failExternally; the memory
        watchdog): it stops as a cancelled task does and reports FAILED with ``error``. False
        when it had ended or was failed or cancelled already."""
        if self.state.is_terminal or self._cancelled.is_set():
            return False
        self._external_failure = error
        self.cancel()
        return True

    def cancel(self) -> None:
        if self.state.is_terminal or self._cancelled.is_set():
            return
        log.info("cancelling %s (%s)", self.tdd.display_name, self.attempt_id)
        self._cancelled.set()
        if self._gate is not None:
            self._gate.cancel()
        for rpd in self.tdd.result_partitions:
            self._partitions.release(rpd.partition_id)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def thread(self) -> threading.Thread:
        """The task's own thread (what its flame graph samples)."""
        return self._thread

    @property
    def python_worker(self) -> PythonWorker | None:
        """The task's Python worker, where its per-row functions run once started (or None)."""
        return self._python_worker

    # -- run --------------------------------------------------------------------------------
    def state_update(self, error: ErrorInfo | None = None) -> TaskExecutionStateUpdate:
        """The task's current state and record counts, as its TaskExecutor reports them."""
        st = self._stream_task
        return TaskExecutionStateUpdate(self.tdd.job_id, self.attempt_id, self.state, error,
                                        records_in=st.records_in if st else 0,
                                        records_out=st.tail.records_out if st else 0,
                                        metrics=self.metrics.snapshot())

    @property
    def state(self) -> ExecutionState:
        return self._life.state

    def _report(self, state: ExecutionState, error: ErrorInfo | None = None) -> None:
        self._life.move(state)
        self._on_state(self.state_update(error))

    def _run(self) -> None:
        tdd = self.tdd
        logs.bind_job(tdd.job_id)
        try:
            self._report(ExecutionState.INITIALIZING)
            self._stream_task = self._build()
            if self._cancelled.is_set():
                raise TaskCancelledError("cancelled before it ran")
            if self._gate is not None:
                self._gate.start()
            self._report(ExecutionState.RUNNING)
            self._stream_task.invoke()
            if self._cancelled.is_set():
                raise TaskCancelledError("cancelled")
            if self._snapshot_writer is not None:
                self._snapshot_writer.close(wait=True)  # its last acknowledgements go before FINISHED
            log.info("%s finished", tdd.display_name)
            self._report(ExecutionState.FINISHED)
        except BaseException as exc:  # noqa: BLE001 - every outcome is reported
            if self._external_failure is not None:
                log.warning("%s failed: %s", tdd.display_name, self._external_failure)
                self._report(ExecutionState.FAILED, ErrorInfo.from_exception(self._external_failure, self._location))
            elif self._cancelled.is_set():
                log.info("%s canceled", tdd.display_name)
                self._report(ExecutionState.CANCELED)
            else:
                if _knock_on(exc):  # another task's end, not this one's fault: one line (the JobMaster has it all)
                    log.info("%s failed: %s", tdd.display_name, exc)
                else:
                    log.warning("%s failed: %s", tdd.display_name, exc, exc_info=True)
                self._report(ExecutionState.FAILED, ErrorInfo.from_exception(exc, self._location))
                for rpd in tdd.result_partitions:
                    self._partitions.release(rpd.partition_id)
        finally:
            if self._snapshot_writer is not None:
                self._snapshot_writer.close(wait=False)
            if self._gate is not None:
                self._gate.cancel()
            if self._python_worker is not None:
                self._python_worker.close()
            logs.unbind_job()
            release_attempt(tdd.config, str(tdd.execution_attempt_id))  # RocksDB working files
            self.spill.remove()
            if self._memory is not None:
                self._memory.release_owner(str(tdd.execution_attempt_id))

    def _build(self) -> StreamTask:
        tdd = self.tdd
        conf = tdd.config
        batch_size = int(conf.get(Options.BATCH_SIZE.key, "65536"))
        capacity = int(conf.get(Options.BUFFERS_PER_CHANNEL.key, "8"))
        buffer_timeout = parse_buffer_timeout_ms(conf.get(Options.BUFFER_TIMEOUT.key, "100 ms"))
        chain = self._artifacts.load_chain(tdd.artifact_uri, tdd.artifact_sha256, tdd.vertex_id, self._read_artifact)
        cancelled = self._cancelled.is_set
        writers = []
        for rpd in tdd.result_partitions:
            if rpd.exchange_mode == ExchangeMode.BLOCKING_PERSISTENT:
                partition: Any = self._partitions.create_stored(rpd.partition_id, rpd.num_subpartitions,
                                                                stored_partition_url(tdd.job_storage_dir,
                                                                                     rpd.partition_id))
            elif rpd.exchange_mode == ExchangeMode.BLOCKING:
                partition = self._partitions.create_blocking(rpd.partition_id, rpd.num_subpartitions)
            else:
                partition = self._partitions.create(rpd.partition_id, rpd.num_subpartitions, capacity)
            writer = RecordWriter(partition, rpd.partitioner, rpd.key_columns, rpd.consumer_max_parallelism,
                                  batch_size, buffer_timeout, cancelled, tdd.subtask_index, rpd.output_tag,
                                  io_metrics=self._io_metrics, producer_parallelism=tdd.parallelism)
            if rpd.partitioner == Partitioner.CUSTOM:  # (partition_custom's operator ends the producer's chain)
                writer.custom = next((op.channels for op in reversed(chain) if hasattr(op, "channels")), None)
            writers.append(writer)
        channel_inputs: list[int] = []
        channels = []
        for g in tdd.input_gates:
            for ch in g.channels:
                channel_inputs.append(g.input_index)
                channels.append((ch, g.subpartitions, g.exchange_mode))
        debloat = Options.DEBLOAT_ENABLED.convert(conf.get(Options.DEBLOAT_ENABLED.key, "true"))
        if channels:
            gate = InputGate(len(channels), capacity, io_metrics=self._io_metrics or debloat,
                             floating_buffers=int(conf.get(Options.FLOATING_BUFFERS.key, "8")))
            exclusive = int(conf.get(Options.EXCLUSIVE_BUFFERS.key, "2"))
            for i, (ch, subs, mode) in enumerate(channels):
                if len(subs) == 1:
                    gate.set_channel(i, self._channel(gate, ch, subs[0], mode, exclusive))
                else:  # a range of the producer's subpartitions, one after another
                    gate.set_channel(i, SequenceChannel(subs, functools.partial(self._channel, gate, ch, mode=mode,
                                                                                exclusive_buffers=exclusive)))
            self._gate = gate
        restore = tdd.restore
        local_state = None
        if tdd.checkpoint_dir and Options.LOCAL_RECOVERY.convert(conf.get(Options.LOCAL_RECOVERY.key, "false")):
            local_state = TaskLocalState.of(default_base(), str(tdd.job_id), str(tdd.vertex_id), tdd.subtask_index)
        if self._responder is not None:
            self._snapshot_writer = SnapshotWriter(tdd.checkpoint_dir, str(tdd.vertex_id), tdd.subtask_index,
                                                   tdd.attempt_number, self._responder, tdd.display_name, local_state)
        self._restore_reads = ReadStats()
        with reading_from(local_state, restore.checkpoint_id if restore is not None else 0, self._restore_reads):
            inflight = (read_channel_state(restore) if restore is not None and not restore.finished
                        else ChannelState())
        restored_inputs = dict(inflight.inputs)
        for vertex_input, batches in sorted(inflight.rescaled_inputs.items()):
            first = channel_inputs.index(vertex_input) if vertex_input in channel_inputs else None
            if first is None:
                raise StateRestoreError(f"{tdd.display_name}: the checkpoint holds in-flight input of input "
                                        f"{vertex_input}, which this task does not have")
            keys = next(g.key_columns for g in tdd.input_gates if g.input_index == vertex_input)
            kept = [b for b in (own_key_groups(b, keys, tdd.max_parallelism, tdd.parallelism, tdd.subtask_index)
                                if keys else b for b in batches) if b.num_rows]
            restored_inputs.setdefault(first, []).extend(kept)
        if inflight:
            log.info("%s replays the in-flight data of unaligned checkpoint %d (%d input channels, %d outputs; "
                     "rescaled: %d inputs, %d outputs)", tdd.display_name, restore.checkpoint_id if restore else 0,
                     len(inflight.inputs), len(inflight.outputs), len(inflight.rescaled_inputs),
                     len(inflight.rescaled_outputs))
        unaligned = Options.CHECKPOINT_UNALIGNED.convert(conf.get(Options.CHECKPOINT_UNALIGNED.key, "false"))
        debloater = None
        if self._gate is not None:
            self._gate.watch_priority = unaligned
            if debloat:
                segment = parse_size_bytes(conf.get(Options.SEGMENT_SIZE.key, "1 mb"))
                debloater = BufferDebloater(
                    parse_duration_ms(conf.get(Options.DEBLOAT_TARGET.key, "1 s")) / 1000.0,
                    self._gate.network_buffers(), segment,
                    min(segment, parse_size_bytes(conf.get(Options.MIN_SEGMENT_SIZE.key, "256 b"))),
                    int(conf.get(Options.DEBLOAT_THRESHOLD.key, "25")) / 100.0,
                    int(conf.get(Options.DEBLOAT_SAMPLES.key, "20")))
        st = StreamTask(chain, self._gate, channel_inputs, writers, cancelled, tdd.display_name,
                        mailbox=self.mailbox, snapshots=self._snapshot_writer,
                        restored_finished=restore is not None and restore.finished, io_metrics=self._io_metrics,
                        slicing=unaligned and tdd.checkpoint_dir != "", restored_inputs=restored_inputs,
                        restored_outputs=inflight.outputs, rescaled_outputs=inflight.rescaled_outputs,
                        debloater=debloater,
                        debloat_period_s=parse_duration_ms(conf.get(Options.DEBLOAT_PERIOD.key, "200 ms")) / 1000.0)
        self.metrics.operator_names = [op.name for op in chain]
        self.metrics.attach(st)
        # splits taken before the first new barrier are in no checkpoint after the restored one
        st.last_barrier_id = restore.checkpoint_id if restore is not None else 0
        base: dict[str, Any] = dict(job_id=tdd.job_id, task_name=tdd.task_name, subtask_index=tdd.subtask_index,
                                    parallelism=tdd.parallelism, max_parallelism=tdd.max_parallelism,
                                    attempt_number=tdd.attempt_number, attempt_id=str(tdd.execution_attempt_id),
                                    runtime_mode=tdd.runtime_mode,
                                    job_storage_dir=tdd.job_storage_dir, config=dict(conf), batch_size=batch_size,
                                    checkpointing=tdd.checkpoint_dir != "",
                                    restored_checkpoint_id=restore.checkpoint_id if restore is not None else 0,
                                    cancelled=self._cancelled.is_set)
        head = chain[0]
        if getattr(head, "dynamic_splits", False) and self._request_split is not None:
            base["split_provider"] = self._next_split
        if any(map(offloadable, chain)) and conf.get(Options.PYTHON_EXECUTION_MODE.key, "process") == "process":
            chain_file, src_dir = self._artifacts.chain_file(tdd.artifact_uri, tdd.artifact_sha256, tdd.vertex_id,
                                                             self._read_artifact)
            self._python_worker = base["python_worker"] = PythonWorker(
                chain_file, src_dir, chain, {k: v for k, v in base.items() if not callable(v)}, tdd.display_name,
                self._cancelled.is_set,
                parse_duration_ms(conf.get(Options.PYTHON_WORKER_START_AFTER.key, "200 ms")) / 1000.0)
        st.wire(lambda op: RuntimeContext(**base, memory=self._budget(op), spill=self.spill,
                                          rocksdb_memory=self._rocksdb_memory,
                                          spark_master=self._spark_master))
        if restore is not None and not restore.finished:
            log.info("%s restores checkpoint %d (%d state files)", tdd.display_name, restore.checkpoint_id,
                     len(restore.files))
            with reading_from(local_state, restore.checkpoint_id, self._restore_reads) as reads:
                for op, tables in zip(chain, read_task_state(restore, len(chain))):
                    op.initialize_state(tables)
            log.info("%s restored checkpoint %d: %s%s", tdd.display_name, restore.checkpoint_id, reads.describe(),
                     "" if local_state is not None else " (state.backend.local-recovery is off)")
        return st

    def _budget(self, op: Any) -> MemoryBudget:
        """``op``'s managed memory: its fraction (set when the job was compiled) of the slot's, for
        an operator that uses it; none for the others (run outside a TaskExecutor: unbounded)."""
        if self._memory is None:
            return MemoryBudget.unlimited()
        if not getattr(op, "uses_managed_memory", False):
            return MemoryBudget(0)
        return self._memory.budget(self._slot_index, float(getattr(op, "memory_fraction", 1.0)),
                                   str(self.attempt_id), f"{op.name} in {self.tdd.display_name}")

    def _rocksdb_memory(self) -> Any:
        if self._memory is None:
            return None
        return slot_rocksdb_memory(self._memory, self._slot_index, str(self.attempt_id), self.tdd.config)

    # -- checkpoints ------------------------------------------------------------------------
    def trigger_checkpoint(self, checkpoint_id: int, timestamp_ms: int, exactly_once: bool, stop: str = "",
                           aligned_timeout_ms: int = -1) -> None:
        self.mailbox.put(TriggerCheckpoint(checkpoint_id, timestamp_ms, exactly_once, stop, aligned_timeout_ms))

    def notify_checkpoint(self, checkpoint_id: int, complete: bool) -> None:
        self.mailbox.put(NotifyCheckpoint(checkpoint_id, complete))
        if self._snapshot_writer is not None:  # (task-local recovery keeps the copies of the latest only)
            self._snapshot_writer.checkpoint_ended(checkpoint_id, complete)

    def _next_split(self) -> Any:
        """The payload of this source subtask's next split, or None when there are no more."""
        assert self._request_split is not None
        st = self._stream_task
        assert st is not None
        delay = 0.05
        while not self._cancelled.is_set():
            resp = self._request_split(st.last_barrier_id)
            if resp.split is not None:
                return pickle.loads(resp.split.payload)
            if resp.no_more_splits:
                return None
            # none right now, more may come; meanwhile checkpoints go on (between two splits)
            waited_until = time.monotonic() + delay
            while time.monotonic() < waited_until and not self._cancelled.is_set():
                if st.mailbox:
                    st.process_mail()
                time.sleep(min(0.05, max(0.0, waited_until - time.monotonic())))
            delay = min(delay * 2, 1.0)
        return None

    def _channel(self, gate: InputGate, ch: Any, subpartition: int, mode: ExchangeMode,
                 exclusive_buffers: int) -> InputChannel:
        if mode == ExchangeMode.BLOCKING_PERSISTENT:  # from the job's storage dir, wherever the producer is
            url = stored_partition_url(self.tdd.job_storage_dir, ch.partition_id)
            return IteratorChannel(lambda: read_stored(url, subpartition))
        if ch.producer_resource_id == self._resource_id:
            return LocalInputChannel(self._partitions, ch.partition_id, subpartition)
        return self._data_client.channel(ch.producer_data_address, ch.partition_id, subpartition,
                                         ch.producer_resource_id, exclusive_buffers=exclusive_buffers,
                                         pool=gate.pool, lock=gate.credit_lock)
