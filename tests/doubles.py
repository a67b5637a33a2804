"""Hand-written test doubles of the gateways (Flink's Testing*Gateway style): each call is
recorded and can be overridden with a callable. Used by control-plane tests and by
bench/scheduling.py to run a real JobMaster without a cluster."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from yarnflow.am.resourcemanager.slotmanager.slot_manager import SlotRequest
from yarnflow.common.ids import AllocationID, JobID, ResourceID
from yarnflow.common.messages import SlotOffer, TaskDeploymentDescriptor, TaskExecutorRegistration


class TestingResourceManagerGateway:
    """A ResourceManager for one JobMaster. With ``auto_offer`` every slot request is met by an
    offer from simulated TaskExecutors of ``slots_per_te`` slots (``te-sim-0``, ...), sent from
    a thread of its own as a TaskExecutor would, one offer call per TaskExecutor."""

    __test__ = False  # not a pytest class

    def __init__(self, auto_offer: bool = True, slots_per_te: int = 4) -> None:
        self.fencing_token = "testing-rm"
        self.listener: Any = None
        self.requests: list[SlotRequest] = []
        self.cancelled: list[AllocationID] = []
        self.freed: list[AllocationID] = []
        self.registrations = 0
        self.on_request: Callable[[SlotRequest], None] | None = None
        self._auto = auto_offer
        self._spt = slots_per_te
        self._n = 0
        self._queue: list[SlotRequest] = []
        self._cv = threading.Condition()
        self._stopped = False
        if auto_offer:
            threading.Thread(target=self._offer_loop, name="testing-rm", daemon=True).start()

    def register_job_master(self, job_id: JobID, listener: Any) -> None:
        self.listener = listener
        self.registrations += 1

    def unregister_job_master(self, job_id: JobID) -> None:
        pass

    def request_slot(self, request: SlotRequest) -> None:
        self.requests.append(request)
        if self.on_request is not None:
            self.on_request(request)
        if self._auto:
            with self._cv:
                self._queue.append(request)
                self._cv.notify()

    def cancel_slot_request(self, allocation_id: AllocationID) -> None:
        self.cancelled.append(allocation_id)

    def free_allocation(self, allocation_id: AllocationID) -> None:
        self.freed.append(allocation_id)

    def task_executor_info(self, resource_id: ResourceID) -> TaskExecutorRegistration:
        return TaskExecutorRegistration(resource_id, f"{resource_id}:1", f"{resource_id}:2", self._spt)

    def task_executors_holding(self, job_id: JobID) -> list[tuple[TaskExecutorRegistration, list[AllocationID]]]:
        return []  # no earlier leader here

    def expects_previous_workers(self) -> bool:
        return False

    def _offer_loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stopped:
                    self._cv.wait()
                if self._stopped:
                    return
                batch, self._queue = self._queue, []
            by_te: dict[ResourceID, list[SlotOffer]] = {}
            for request in batch:
                k = self._n
                self._n += 1
                rid = ResourceID(f"te-sim-{k // self._spt}")
                by_te.setdefault(rid, []).append(SlotOffer(request.allocation_id, k % self._spt))
            for rid, offers in by_te.items():
                self.listener.rpc_invoke("offer_slots", self.listener.fencing_token, (self.listener.job_id, rid, offers))

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()


@dataclass
class TestingTaskExecutorGateway:
    """Records the calls a JobMaster makes; ``on_submit`` etc. may be replaced to react or fail."""

    __test__ = False

    submitted: list[TaskDeploymentDescriptor] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    freed: list[str] = field(default_factory=list)
    released: list[list[str]] = field(default_factory=list)
    triggered: list[tuple[str, int]] = field(default_factory=list)
    notified: list[tuple[str, int, bool]] = field(default_factory=list)
    on_submit: Callable[[TaskDeploymentDescriptor], None] | None = None
    on_cancel: Callable[[str], None] | None = None
    on_trigger: Callable[[str, int], None] | None = None

    def submit_task(self, token: str, tdd: TaskDeploymentDescriptor) -> None:
        self.submitted.append(tdd)
        if self.on_submit is not None:
            self.on_submit(tdd)

    def cancel_task(self, token: str, attempt_id: Any) -> None:
        self.cancelled.append(str(attempt_id))
        if self.on_cancel is not None:
            self.on_cancel(str(attempt_id))

    def free_slot(self, token: str, allocation_id: AllocationID, reason: str) -> None:
        self.freed.append(str(allocation_id))

    def release_partitions(self, token: str, job_id: str, partition_ids: list[str]) -> None:
        self.released.append(list(partition_ids))

    def trigger_checkpoint(self, token: str, attempt_id: Any, checkpoint_id: int, timestamp_ms: int,
                           exactly_once: bool, stop: str = "", aligned_timeout_ms: int = -1) -> None:
        self.triggered.append((str(attempt_id), checkpoint_id))
        if self.on_trigger is not None:
            self.on_trigger(str(attempt_id), checkpoint_id)

    def notify_checkpoint_complete(self, token: str, attempt_id: Any, checkpoint_id: int) -> None:
        self.notified.append((str(attempt_id), checkpoint_id, True))

    def notify_checkpoint_aborted(self, token: str, attempt_id: Any, checkpoint_id: int) -> None:
        self.notified.append((str(attempt_id), checkpoint_id, False))

    def close(self) -> None:
        pass


def call(endpoint: Any, method: str, token: str | None, *args: Any) -> Any:
    """An RPC on a component in this process, as its Thrift handler makes it (fencing included)."""
    return endpoint.rpc_invoke(method, token, args)
