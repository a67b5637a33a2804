"""Messages of a task's deployment and of its checkpoints (``TaskDeploymentDescriptor``, its
gates and partitions, state files and snapshots): as ``messages.py``'s, frozen dataclasses that
mirror the Thrift IDL, re-exported by ``messages.py`` (split off for its size)."""

from __future__ import annotations

from dataclasses import dataclass, field

from yarnflow.common import ids
from yarnflow.common.message_base import Message
from yarnflow.common.rpc.gen.yarnflow_rpc import ttypes
from yarnflow.common.states import ExchangeMode, Partitioner

# ---- checkpoints -----------------------------------------------------------------------------

@dataclass(frozen=True)
class OperatorStateFile(Message):
    """One file (Arrow IPC, any fsspec URL) of one operator's state in a checkpoint."""

    _thrift = ttypes.OperatorStateFile
    operator_index: int
    name: str
    path: str
    size_bytes: int = 0


#: ``OperatorStateFile.name`` of a file in the job's shared checkpoint folder that a checkpoint
#: references (a RocksDB SST file of an incremental checkpoint; not an Arrow file)
SHARED_STATE_FILE = "@shared"


@dataclass(frozen=True)
class TaskStateSnapshot(Message):
    """What a task acknowledges for a checkpoint."""

    _thrift = ttypes.TaskStateSnapshot
    files: list[OperatorStateFile] = field(default_factory=list)
    alignment_ms: int = 0
    sync_ms: int = 0
    async_ms: int = 0
    unaligned: bool = False
    inflight_bytes: int = 0
    start_delay_ms: int = 0

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)


@dataclass(frozen=True)
class TaskRestore(Message):
    """The state a task starts from: its subtask's files in a completed checkpoint."""

    _thrift = ttypes.TaskRestore
    checkpoint_id: int
    files: list[OperatorStateFile] = field(default_factory=list)
    finished: bool = False  # the subtask had finished by then: it emits nothing and ends


@dataclass(frozen=True)
class AllocatedSlotReport(Message):
    """The JobMaster's answer to a heartbeat: the slots it holds on that TaskExecutor."""

    _thrift = ttypes.AllocatedSlotReport
    allocation_ids: list[ids.AllocationID] = field(default_factory=list)


# ---- TaskExecutor --------------------------------------------------------------------------

@dataclass(frozen=True)
class InputChannelDescriptor(Message):
    _thrift = ttypes.InputChannelDescriptor
    partition_id: ids.ResultPartitionID
    producer_resource_id: ids.ResourceID
    producer_data_address: str


@dataclass(frozen=True)
class InputGateDescriptor(Message):
    _thrift = ttypes.InputGateDescriptor
    input_index: int
    channels: list[InputChannelDescriptor]
    subpartition_index: int = 0
    exchange_mode: ExchangeMode = ExchangeMode.PIPELINED
    #: > 0: the consumer reads subpartitions ``[subpartition_index, subpartition_end)`` of each
    #: channel, one after another (a consumer whose parallelism was decided at run time)
    subpartition_end: int = 0
    #: a keyed (hash-partitioned) input's key columns: in-flight rows of a rescaled unaligned
    #: checkpoint go to the subtask owning their key group
    key_columns: list[str] = field(default_factory=list)

    @property
    def subpartitions(self) -> range:
        return range(self.subpartition_index, max(self.subpartition_end, self.subpartition_index + 1))


@dataclass(frozen=True)
class ResultPartitionDescriptor(Message):
    _thrift = ttypes.ResultPartitionDescriptor
    partition_id: ids.ResultPartitionID
    num_subpartitions: int
    partitioner: Partitioner
    key_columns: list[str] = field(default_factory=list)
    exchange_mode: ExchangeMode = ExchangeMode.PIPELINED
    consumer_max_parallelism: int = 128
    output_tag: str = ""


@dataclass(frozen=True)
class TaskDeploymentDescriptor(Message):
    _thrift = ttypes.TaskDeploymentDescriptor
    job_id: ids.JobID
    vertex_id: ids.JobVertexID
    task_name: str
    execution_attempt_id: ids.ExecutionAttemptID
    subtask_index: int
    attempt_number: int
    parallelism: int
    max_parallelism: int
    allocation_id: ids.AllocationID
    artifact_uri: str
    artifact_sha256: str
    input_gates: list[InputGateDescriptor] = field(default_factory=list)
    result_partitions: list[ResultPartitionDescriptor] = field(default_factory=list)
    jobmaster_fencing_token: str = ""
    config: dict[str, str] = field(default_factory=dict)
    runtime_mode: str = "STREAMING"
    job_storage_dir: str = ""
    checkpoint_dir: str = ""
    restore: TaskRestore | None = None
    job_name: str = ""

    @property
    def display_name(self) -> str:
        return f"{self.task_name} ({self.subtask_index + 1}/{self.parallelism})"
