"""The calls a JobMaster makes on the ResourceManager (Flink's ResourceManagerGateway, as seen
from a JobMaster). The AppMaster's ``ResourceManager`` implements it in process; tests and
benchmarks use ``tests.doubles.TestingResourceManagerGateway``."""

from __future__ import annotations

from typing import Protocol

from yarnflow.am.resourcemanager.slotmanager.slot_manager import SlotRequest
from yarnflow.common.ids import AllocationID, JobID, ResourceID
from yarnflow.common.messages import TaskExecutorRegistration


class JobMasterListener(Protocol):
    """What the ResourceManager tells a registered JobMaster."""

    def on_task_executor_lost(self, resource_id: ResourceID, reason: str) -> None: ...

    def on_allocation_failed(self, allocation_id: AllocationID, reason: str) -> None: ...


class ResourceManagerGateway(Protocol):
    @property
    def fencing_token(self) -> str:
        """The leader session id of the ResourceManager: a change means a new leader."""
        ...

    def register_job_master(self, job_id: JobID, listener: JobMasterListener) -> None: ...

    def unregister_job_master(self, job_id: JobID) -> None: ...

    def request_slot(self, request: SlotRequest) -> None:
        """Ask for a slot; it arrives as an offer from a TaskExecutor (asynchronously)."""
        ...

    def cancel_slot_request(self, allocation_id: AllocationID) -> None: ...

    def free_allocation(self, allocation_id: AllocationID) -> None:
        """The job no longer holds this allocation."""
        ...

    def task_executor_info(self, resource_id: ResourceID) -> TaskExecutorRegistration | None:
        """Addresses of a registered TaskExecutor; None when it is not (or no longer) known."""
        ...

    def task_executors_holding(self, job_id: JobID) -> list[tuple[TaskExecutorRegistration, list[AllocationID]]]:
        """The registered TaskExecutors whose slot reports name slots of ``job_id`` (after a
        change of leader: those that kept the job's tasks running), with those slots."""
        ...

    def expects_previous_workers(self) -> bool:
        """Whether this ResourceManager leads after another whose TaskExecutors outlive it (they
        register here, their tasks possibly still running)."""
        ...
