"""The JobMaster shell's side of taking over running tasks after a change of leader (the core's
side, and the whole story, is ``reconciliation.py``): while the core reconciles, every 100 ms
the shell asks the ResourceManager which registered TaskExecutors hold slots of the job, and
calls ``reconnectJob`` on each one it has not heard from yet (with the ResourceManager's token,
which the TaskExecutor registered under, and this JobMaster's address and token); each report
goes to the core. After ``resourcemanager.previous-worker.recovery.timeout`` the core decides
with what it has.

A mixin of ``JobMaster``; the attributes it uses are declared below.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from yarnflow.am.jobmaster.job_master_core import JobMasterCore
from yarnflow.am.jobmaster.splits import SplitEnumerator
from yarnflow.am.resourcemanager.gateway import ResourceManagerGateway
from yarnflow.common.errors import RpcError
from yarnflow.common.ids import JobID, ResourceID
from yarnflow.common.messages import TaskExecutorRegistration
from yarnflow.common.rpc.endpoint import MainThreadExecutor

__all__ = ["TaskTakeover"]

log = logging.getLogger(__name__)

_POLL_MS = 100


class TaskTakeover:
    # -- what the JobMaster provides
    job_id: JobID
    core: JobMasterCore
    splits: SplitEnumerator | None
    fencing_token: str
    _rm: ResourceManagerGateway
    _main: MainThreadExecutor
    _io: ThreadPoolExecutor
    _address: str
    _gateway: Callable[[str], Any]
    _execute: Callable[..., None]

    def _begin_takeover(self, timeout_ms: int, late_ms: int) -> None:
        """(main thread) The core reconciles: find the TaskExecutors and ask them. Until
        ``late_ms`` from now, a TaskExecutor that registers late with slots of the job this
        JobMaster does not know is asked too: its tasks are cancelled and those slots freed."""
        self._asked: set[ResourceID] = set()
        self._late_until = time.monotonic() + late_ms / 1000
        if self.splits is not None:
            splits = self.splits
            self.core.on_attempt_adopted = lambda ex, task: splits.adopt(
                ex.attempt_id, str(task.vertex_id), [(t.split_id, t.last_checkpoint_id) for t in task.taken_splits])
        self._main.schedule(timeout_ms, lambda: self._execute(self.core.reconciliation_timed_out))
        self._poll_task_executors()

    def _poll_task_executors(self) -> None:
        reconciling = self.core.reconciling
        if (not reconciling and time.monotonic() > self._late_until) or self.core.is_terminal:
            return
        try:
            holders = self._rm.task_executors_holding(self.job_id)
        except Exception as exc:  # noqa: BLE001 - the ResourceManager is stopping: the next round
            log.debug("asking the ResourceManager for the job's TaskExecutors failed: %s", exc)
            holders = []
        known = self.core.slots.pool.slots
        for registration, allocations in holders:
            if registration.resource_id in self._asked:
                continue
            if reconciling or any(a not in known for a in allocations):
                self._asked.add(registration.resource_id)
                self._io.submit(self._reconnect, registration)
        self._main.schedule(_POLL_MS, self._poll_task_executors)

    def _reconnect(self, registration: TaskExecutorRegistration) -> None:
        """(an I/O thread)"""
        rid = registration.resource_id
        try:
            report = self._gateway(registration.rpc_address).reconnect_job(
                self._rm.fencing_token, self.job_id, self._address, self.fencing_token)
        except RpcError as exc:
            log.info("job %s: %s did not reconnect (asked again): %s", self.job_id, rid, exc)
            self._main.execute(self._asked.discard, rid)
            return
        self._execute(self.core.task_executor_reconnected, rid, registration.rpc_address, registration.data_address,
                      report)
