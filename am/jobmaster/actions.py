"""What the JobMaster core asks its shell to do (frozen dataclasses; no behaviour).

The core never does I/O: each event it handles returns a list of these, which the shell
carries out (RPCs to the ResourceManager and TaskExecutors) in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from yarnflow.am.resourcemanager.slotmanager.slot_manager import SlotRequest
from yarnflow.common.ids import AllocationID, ExecutionAttemptID, ResourceID
from yarnflow.common.messages import TaskDeploymentDescriptor
from yarnflow.common.states import JobStatus


@dataclass(frozen=True)
class RequestSlot:
    """Ask the ResourceManager for a slot."""

    request: SlotRequest


@dataclass(frozen=True)
class CancelSlotRequest:
    """The ResourceManager should stop looking for this allocation."""

    allocation_id: AllocationID


@dataclass(frozen=True)
class ReturnAllocation:
    """Tell the ResourceManager the job no longer holds this allocation."""

    allocation_id: AllocationID


@dataclass(frozen=True)
class FreeSlot:
    """Tell the TaskExecutor holding the slot to free it (after ReturnAllocation)."""

    allocation_id: AllocationID
    resource_id: ResourceID
    rpc_address: str
    reason: str


@dataclass(frozen=True)
class DeployTask:
    """Submit a task; the shell reports the outcome with ``deploy_succeeded`` / ``deploy_failed``."""

    attempt_id: ExecutionAttemptID
    resource_id: ResourceID
    rpc_address: str
    tdd: TaskDeploymentDescriptor


@dataclass(frozen=True)
class CancelTask:
    """Cancel a task; the shell reports a failed call with ``cancel_call_failed``."""

    attempt_id: ExecutionAttemptID
    resource_id: ResourceID
    rpc_address: str


@dataclass(frozen=True)
class ReleasePartitions:
    """Delete blocking partitions on a TaskExecutor (all of the job's when the list is empty)."""

    resource_id: ResourceID
    rpc_address: str
    partition_ids: tuple[str, ...]


@dataclass(frozen=True)
class JobReachedTerminalState:
    """The job ended: the shell builds the result and tells the Dispatcher."""

    status: JobStatus




@dataclass(frozen=True)
class TriggerTaskCheckpoint:
    """Start checkpoint ``checkpoint_id`` at a task (a source, or a task whose inputs all
    finished); the shell reports a failed call with ``checkpoint_trigger_failed``."""

    attempt_id: ExecutionAttemptID
    resource_id: ResourceID
    rpc_address: str
    checkpoint_id: int
    timestamp_ms: int
    exactly_once: bool
    stop: str = ""  # "stop" / "drain": the savepoint of stop-with-savepoint
    aligned_timeout_ms: int = -1  # unaligned checkpoints (see CheckpointBarrier)


@dataclass(frozen=True)
class NotifyTaskCheckpoint:
    """Tell a task that a checkpoint completed (``completed``) or was aborted."""

    attempt_id: ExecutionAttemptID
    resource_id: ResourceID
    rpc_address: str
    checkpoint_id: int
    completed: bool


@dataclass(frozen=True)
class WriteCheckpointMetadata:
    """Write ``chk-<n>/_metadata`` (atomically, last); the shell reports the outcome with
    ``checkpoint_metadata_written`` / ``checkpoint_metadata_failed``."""

    checkpoint_id: int
    metadata: dict[str, object]


@dataclass(frozen=True)
class DiscardCheckpointFiles:
    """Delete ``chk-<n>/`` (a checkpoint aborted, or no longer retained), and the files of the
    shared folder that no retained checkpoint references any more."""

    checkpoint_id: int
    shared_files: tuple[str, ...] = ()


CheckpointIO = Union[TriggerTaskCheckpoint, NotifyTaskCheckpoint, WriteCheckpointMetadata, DiscardCheckpointFiles]

Action = Union[RequestSlot, CancelSlotRequest, ReturnAllocation, FreeSlot, DeployTask, CancelTask,
               ReleasePartitions, JobReachedTerminalState, TriggerTaskCheckpoint, NotifyTaskCheckpoint,
               WriteCheckpointMetadata, DiscardCheckpointFiles]
