"""Messages: frozen dataclasses that mirror the Thrift IDL one to one.

Each has ``to_thrift()`` and ``from_thrift()`` (``message_base.Message``: the conversion is
driven by the field annotations), so a message is declared once. The rest of the code sees only
these classes, never the generated types.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

from yarnflow.common import ids
from yarnflow.common.message_base import Message
from yarnflow.common.rpc.gen.yarnflow_rpc import ttypes
from yarnflow.common.states import ExchangeMode, ExecutionState, JobStatus, Partitioner

# ---- shared --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ResourceProfile(Message):
    _thrift = ttypes.ResourceProfile
    cpu_cores: float = 0.0
    memory_mb: int = 0

    def fits_in(self, other: ResourceProfile) -> bool:
        """True when a request of this profile can run in a slot of profile ``other``.
        A zero field means 'unspecified' and matches anything."""
        return ((self.cpu_cores == 0 or self.cpu_cores <= other.cpu_cores or other.cpu_cores == 0)
                and (self.memory_mb == 0 or self.memory_mb <= other.memory_mb or other.memory_mb == 0))


ResourceProfile.UNKNOWN = ResourceProfile()  # type: ignore[attr-defined]


@dataclass(frozen=True)
class ErrorInfo(Message):
    _thrift = ttypes.ErrorInfo
    error_class: str
    message: str
    traceback: str = ""
    location: str | None = None
    unavailable_partition: ids.ResultPartitionID | None = None

    @classmethod
    def from_exception(cls, exc: BaseException, location: str | None = None) -> ErrorInfo:
        """The ErrorInfo of ``exc``. An exception with a ``partition_id`` attribute (the data
        plane's partition errors) names the partition it could not read in
        ``unavailable_partition``."""
        # an error whose message says it all (a Spark stage's) leaves its traceback to the log
        tb = ("".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
              if getattr(exc, "show_traceback", True) else "")
        partition = getattr(exc, "partition_id", None)
        return cls(type(exc).__name__, str(exc), tb, location,
                   ids.ResultPartitionID(partition) if isinstance(partition, str) and partition else None)

    def describe(self) -> str:
        where = f" [{self.location}]" if self.location else ""
        return f"{self.error_class}: {self.message}{where}"

    def headline(self) -> str:
        """``describe()`` for a user: without the class name where the message says it all
        (a user function's error names the function and what it raised)."""
        if self.error_class in SELF_DESCRIBING_ERRORS:
            where = f" [{self.location}]" if self.location else ""
            return f"{self.message}{where}"
        return self.describe()


#: failures whose message needs no class name in front of it
SELF_DESCRIBING_ERRORS = frozenset({"UserFunctionError", "SourceReadError"})


# ---- JobGraph ------------------------------------------------------------------------------

@dataclass(frozen=True)
class JobVertex(Message):
    _thrift = ttypes.JobVertex
    vertex_id: ids.JobVertexID
    name: str
    parallelism: int
    max_parallelism: int
    operator_names: list[str] = field(default_factory=list)
    slot_sharing_group: str = "default"
    resources: ResourceProfile = field(default_factory=ResourceProfile)
    is_source: bool = False
    is_sink: bool = False
    operator_uids: list[str] = field(default_factory=list)
    #: BATCH jobs with execution.batch.adaptive.auto-parallelism.enabled: the parallelism is
    #: decided when the vertex's producers have finished, from the bytes they wrote for it,
    #: between 1 and ``parallelism`` (which is then its max parallelism too: the number of
    #: subpartitions its producers write)
    dynamic_parallelism: bool = False


@dataclass(frozen=True)
class JobEdge(Message):
    _thrift = ttypes.JobEdge
    source_vertex_id: ids.JobVertexID
    target_vertex_id: ids.JobVertexID
    partitioner: Partitioner
    exchange_mode: ExchangeMode = ExchangeMode.PIPELINED
    key_columns: list[str] = field(default_factory=list)
    input_index: int = 0
    output_tag: str = ""


@dataclass(frozen=True)
class JobGraph(Message):
    _thrift = ttypes.JobGraph
    job_id: ids.JobID
    name: str
    vertices: list[JobVertex]
    edges: list[JobEdge]
    artifact_uri: str = ""
    artifact_sha256: str = ""
    config: dict[str, str] = field(default_factory=dict)
    runtime_mode: str = "STREAMING"

    def vertex(self, vertex_id: str) -> JobVertex:
        for v in self.vertices:
            if v.vertex_id == vertex_id:
                return v
        raise KeyError(vertex_id)

    def inputs_of(self, vertex_id: str) -> list[JobEdge]:
        return [e for e in self.edges if e.target_vertex_id == vertex_id]

    def outputs_of(self, vertex_id: str) -> list[JobEdge]:
        return [e for e in self.edges if e.source_vertex_id == vertex_id]

    def validate(self) -> None:
        """Raises ``InvalidRequestError`` naming the problem when the graph is malformed."""
        from yarnflow.common.errors import InvalidRequestError

        if not self.vertices:
            raise InvalidRequestError("the JobGraph has no vertices")
        seen: set[str] = set()
        for v in self.vertices:
            if v.vertex_id in seen:
                raise InvalidRequestError(f"duplicate vertex id {v.vertex_id}")
            if v.parallelism < 1 or v.max_parallelism < v.parallelism:
                raise InvalidRequestError(
                    f"vertex {v.name!r}: parallelism {v.parallelism} must be between 1 and its "
                    f"max parallelism {v.max_parallelism}")
            seen.add(v.vertex_id)
        order = {v.vertex_id: i for i, v in enumerate(self.vertices)}
        parallelism = {v.vertex_id: v.parallelism for v in self.vertices}  # (lookups in O(1): a big graph)
        for e in self.edges:
            if e.source_vertex_id not in order or e.target_vertex_id not in order:
                raise InvalidRequestError(f"edge {e.source_vertex_id}->{e.target_vertex_id} names an unknown vertex")
            if order[e.source_vertex_id] >= order[e.target_vertex_id]:
                raise InvalidRequestError("the JobGraph's vertices are not in topological order")
            if e.partitioner == Partitioner.FORWARD and \
                    parallelism[e.source_vertex_id] != parallelism[e.target_vertex_id]:
                raise InvalidRequestError("a forward edge must connect vertices of equal parallelism")
            if e.partitioner == Partitioner.HASH and not e.key_columns:
                raise InvalidRequestError("a hash edge needs key columns")


# ---- Dispatcher ----------------------------------------------------------------------------

#: a watermark not yet known (Flink's Long.MIN_VALUE)
NO_WATERMARK = -(2**63)


@dataclass(frozen=True)
class TaskMetrics(Message):
    """A subtask's I/O figures: totals since its attempt started, rates over the last seconds."""

    _thrift = ttypes.TaskMetrics
    records_in: int = 0
    records_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    records_in_per_second: float = 0.0
    records_out_per_second: float = 0.0
    bytes_in_per_second: float = 0.0
    bytes_out_per_second: float = 0.0
    busy_ms_per_second: float = 0.0
    backpressured_ms_per_second: float = 0.0
    idle_ms_per_second: float = 0.0
    operator_records_in: list[int] = field(default_factory=list)
    operator_records_out: list[int] = field(default_factory=list)
    managed_memory_bytes: int = 0
    managed_memory_used: int = 0
    managed_memory_peak: int = 0
    spilled_bytes: int = 0
    inflight_bytes_peak: int = 0
    operator_paths: list[str] = field(default_factory=list)
    result_bytes: list[int] = field(default_factory=list)  # per result partition, in the task's output order
    input_watermark: int = NO_WATERMARK
    output_watermark: int = NO_WATERMARK
    late_records_dropped: int = 0
    busy_ms_total: int = 0
    backpressured_ms_total: int = 0
    idle_ms_total: int = 0
    operator_gauges: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointCounts(Message):
    _thrift = ttypes.CheckpointCounts
    completed: int = 0
    failed: int = 0
    in_progress: int = 0


@dataclass(frozen=True)
class VertexStatus(Message):
    _thrift = ttypes.VertexStatus
    vertex_id: ids.JobVertexID
    name: str
    parallelism: int
    state_counts: dict[ExecutionState, int] = field(default_factory=dict)
    subtask_attempts: list[int] = field(default_factory=list)
    subtask_locations: list[str] = field(default_factory=list)
    subtask_states: list[ExecutionState] = field(default_factory=list)
    subtask_metrics: list[TaskMetrics] = field(default_factory=list)
    subtask_timestamps: list[dict[ExecutionState, int]] = field(default_factory=list)


@dataclass(frozen=True)
class FailureEntry(Message):
    _thrift = ttypes.FailureEntry
    timestamp_ms: int
    task: str
    error: ErrorInfo
    restarted_subtasks: int = 0
    restored_checkpoint_id: int = 0


@dataclass(frozen=True)
class CheckpointInfo(Message):
    _thrift = ttypes.CheckpointInfo
    checkpoint_id: int
    status: str
    trigger_time_ms: int
    duration_ms: int = 0
    size_bytes: int = 0
    alignment_ms: int = 0
    failure: str = ""
    unaligned: bool = False
    inflight_bytes: int = 0
    num_subtasks: int = 0
    num_acknowledged: int = 0
    is_savepoint: bool = False
    external_path: str = ""
    discarded: bool = False
    start_delay_ms: int = 0


@dataclass(frozen=True)
class JobStatusInfo(Message):
    _thrift = ttypes.JobStatusInfo
    job_id: ids.JobID
    name: str
    status: JobStatus
    start_time_ms: int
    end_time_ms: int = 0
    vertices: list[VertexStatus] = field(default_factory=list)
    failure_cause: ErrorInfo | None = None
    all_running_time_ms: int = 0
    failure_history: list[FailureEntry] = field(default_factory=list)
    restart_strategy: str = ""
    checkpoints: list[CheckpointInfo] = field(default_factory=list)
    latest_completed_checkpoint_id: int = 0
    num_restarts: int = 0
    checkpoint_counts: CheckpointCounts = field(default_factory=CheckpointCounts)
    scaling: str = ""  # the adaptive scheduler's: "parallelism 2, desired 4: <why it waits>"


@dataclass(frozen=True)
class JobResult(Message):
    _thrift = ttypes.JobResult
    job_id: ids.JobID
    status: JobStatus
    start_time_ms: int
    end_time_ms: int
    failure_cause: ErrorInfo | None = None
    collected: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterInfo(Message):
    _thrift = ttypes.ClusterInfo
    cluster_id: str
    storage_dir: str
    version: str
    registered_taskexecutors: int
    total_slots: int
    free_slots: int
    target: str = "local"
    leader_session_id: str = ""
    web_url: str = ""


# ---- ResourceManager -----------------------------------------------------------------------

@dataclass(frozen=True)
class SlotStatus(Message):
    _thrift = ttypes.SlotStatus
    slot_index: int
    profile: ResourceProfile = field(default_factory=ResourceProfile)
    allocation_id: ids.AllocationID | None = None
    job_id: ids.JobID | None = None


@dataclass(frozen=True)
class MemoryStatus(Message):
    """A TaskExecutor's memory as its watchdog last measured it (``worker/memory/watchdog.py``)."""

    _thrift = ttypes.MemoryStatus
    used_bytes: int = 0
    peak_bytes: int = 0
    limit_bytes: int = 0
    arrow_bytes: int = 0
    managed_total_bytes: int = 0
    managed_used_bytes: int = 0
    rocksdb_bytes: int = 0
    level: str = "ok"
    cpu_load: float = 0.0


@dataclass(frozen=True)
class SlotReport(Message):
    _thrift = ttypes.SlotReport
    slots: list[SlotStatus] = field(default_factory=list)
    blocking_partitions: int = 0
    memory: MemoryStatus | None = None


@dataclass(frozen=True)
class TaskExecutorRegistration(Message):
    _thrift = ttypes.TaskExecutorRegistration
    resource_id: ids.ResourceID
    rpc_address: str
    data_address: str
    num_slots: int
    slot_profile: ResourceProfile = field(default_factory=ResourceProfile)
    pid: int = 0
    hostname: str = ""
    metrics_address: str = ""  # host:port of its Prometheus endpoint ("": no metrics reporter)
    #: the worker the driver started (a process group or YARN container) this TaskExecutor is one
    #: slot process of ("": the TaskExecutor is the worker; taskmanager.slot-processes)
    container_id: str = ""

    @property
    def worker_id(self) -> ids.ResourceID:
        return ids.ResourceID(self.container_id) if self.container_id else self.resource_id


@dataclass(frozen=True)
class RegistrationResponse(Message):
    _thrift = ttypes.RegistrationResponse
    accepted: bool
    fencing_token: str = ""
    registration_id: str = ""
    heartbeat_interval_ms: int = 0
    reason: str = ""


# ---- JobMaster -----------------------------------------------------------------------------

@dataclass(frozen=True)
class SlotOffer(Message):
    _thrift = ttypes.SlotOffer
    allocation_id: ids.AllocationID
    slot_index: int
    profile: ResourceProfile = field(default_factory=ResourceProfile)
    #: the TaskExecutor's registration at the ResourceManager when the slot was allocated: a
    #: JobMaster tells a TaskExecutor that registered again (a partition healed) from a stale one
    registration_id: str = ""


@dataclass(frozen=True)
class TaskExecutionStateUpdate(Message):
    _thrift = ttypes.TaskExecutionStateUpdate
    job_id: ids.JobID
    execution_attempt_id: ids.ExecutionAttemptID
    state: ExecutionState
    error: ErrorInfo | None = None
    records_in: int = 0
    records_out: int = 0
    metrics: TaskMetrics | None = None


@dataclass(frozen=True)
class TakenSplit(Message):
    _thrift = ttypes.TakenSplit
    split_id: str
    last_checkpoint_id: int = 0


@dataclass(frozen=True)
class ReconciledTask(Message):
    """A task a TaskExecutor kept running across a change of the AppMaster leader."""

    _thrift = ttypes.ReconciledTask
    execution_attempt_id: ids.ExecutionAttemptID
    vertex_id: ids.JobVertexID
    subtask_index: int
    attempt_number: int
    state: ExecutionState
    allocation_id: ids.AllocationID
    last_acknowledged_checkpoint: int = 0
    taken_splits: list[TakenSplit] = field(default_factory=list)
    restored_checkpoint: int = 0


@dataclass(frozen=True)
class JobReconnectReport(Message):
    """What a TaskExecutor holds of a job, for the job's new JobMaster."""

    _thrift = ttypes.JobReconnectReport
    resource_id: ids.ResourceID
    slots: list[SlotOffer] = field(default_factory=list)
    tasks: list[ReconciledTask] = field(default_factory=list)
    final_updates: list[TaskExecutionStateUpdate] = field(default_factory=list)


@dataclass(frozen=True)
class SourceSplit(Message):
    _thrift = ttypes.SourceSplit
    split_id: str
    payload: bytes = b""


@dataclass(frozen=True)
class SplitResponse(Message):
    _thrift = ttypes.SplitResponse
    split: SourceSplit | None = None
    no_more_splits: bool = False


@dataclass(frozen=True)
class TaskExecutorHeartbeatPayload(Message):
    """What a TaskExecutor tells a job's JobMaster every heartbeat: its tasks of the job (current
    state, plus final updates not yet acknowledged) and the slots it holds for the job."""

    _thrift = ttypes.TaskExecutorHeartbeatPayload
    resource_id: ids.ResourceID
    executions: list[TaskExecutionStateUpdate] = field(default_factory=list)
    allocation_ids: list[ids.AllocationID] = field(default_factory=list)


@dataclass(frozen=True)
class ThreadInfo(Message):
    """A thread of a process and its stack (thread dumps)."""

    _thrift = ttypes.ThreadInfo
    name: str
    ident: int = 0
    daemon: bool = False
    cpu_seconds: float = -1.0
    frames: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ThreadInfoSample(Message):
    """``count`` identical samples of a subtask's thread (flame graphs)."""

    _thrift = ttypes.ThreadInfoSample
    subtask_index: int
    on_cpu: bool
    frames: list[str] = field(default_factory=list)
    count: int = 1


# the messages of a task's deployment and checkpoints live in messages_tasks.py
from yarnflow.common.messages_tasks import (  # noqa: E402 - re-exported
    SHARED_STATE_FILE as SHARED_STATE_FILE,
    OperatorStateFile as OperatorStateFile,
    TaskStateSnapshot as TaskStateSnapshot,
    TaskRestore as TaskRestore,
    AllocatedSlotReport as AllocatedSlotReport,
    InputChannelDescriptor as InputChannelDescriptor,
    InputGateDescriptor as InputGateDescriptor,
    ResultPartitionDescriptor as ResultPartitionDescriptor,
    TaskDeploymentDescriptor as TaskDeploymentDescriptor,
)


ALL_MESSAGES: tuple[type[Message], ...] = tuple(
    obj for obj in list(globals().values())
    if isinstance(obj, type) and issubclass(obj, Message) and obj is not Message
)
