"""The TaskExecutor's side of the JobMaster <-> TaskExecutor heartbeat (Flink's).

Every ``heartbeat.interval`` the TaskExecutor sends each job's JobMaster the job's tasks and
slots here, and acts on the answer (the JobMaster's allocated-slot report, see ``core.py``). A
mixin of ``TaskExecutor``, kept in a file of its own to keep each file readable; the
attributes and methods it uses from the TaskExecutor are declared below."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from yarnflow.common.errors import (FencingTokenError, NotFoundError, RpcConnectionError, RpcError, RpcTimeoutError,
                                    UnavailableError)
from yarnflow.common.ids import ExecutionAttemptID, JobID
from yarnflow.common.messages import AllocatedSlotReport
from yarnflow.common.rpc.endpoint import MainThreadExecutor
from yarnflow.common.rpc.gateways import RemoteJobMasterGateway
from yarnflow.worker.taskexecutor.core import SendHeartbeat, TaskExecutorCore

log = logging.getLogger(__name__)

__all__ = ["JobMasterHeartbeats"]


class JobMasterHeartbeats:
    # -- what the TaskExecutor provides
    core: TaskExecutorCore
    tasks: dict[ExecutionAttemptID, Any]
    partitions: Any
    _main: MainThreadExecutor
    _io: ThreadPoolExecutor
    _stopped: threading.Event
    _heartbeat_ms: int
    _jm: Callable[[str, JobID], RemoteJobMasterGateway]
    _carry_out: Callable[[list[Any]], None]

    def _jm_heartbeat_loop(self) -> None:
        while not self._stopped.wait(self._heartbeat_ms / 1000.0):
            try:
                beats = self._main.call(self._jm_heartbeats_due, timeout=10)
            except Exception:  # noqa: BLE001 - stopping, or the main thread is busy: next round
                log.debug("JobMaster heartbeat round skipped", exc_info=True)
                continue
            for beat in beats:
                try:
                    self._io.submit(self._send_jm_heartbeat, beat)
                except RuntimeError:  # the pool is shut down
                    return

    def _jm_heartbeats_due(self) -> list[SendHeartbeat]:
        states = {a: t.state_update() for a, t in self.tasks.items() if not t.state.is_terminal}
        actions = self.core.heartbeats_due(states, self.partitions.partition_ids())
        self._carry_out([a for a in actions if not isinstance(a, SendHeartbeat)])
        return [a for a in actions if isinstance(a, SendHeartbeat)]

    def _send_jm_heartbeat(self, beat: SendHeartbeat) -> None:
        """(an I/O thread)"""
        job_id, address = beat.job_id, beat.address
        report: AllocatedSlotReport | None
        try:
            report = self._main.call(self._jm, address, job_id).heartbeat_from_task_executor(
                beat.token, job_id, beat.payload)
        except (NotFoundError, FencingTokenError) as exc:
            kind = "does not know the job" if isinstance(exc, NotFoundError) else "refused the token"
            reason = f"its JobMaster at {address} {kind}: {exc}"
            self._main.execute(lambda: self._carry_out(self.core.heartbeat_refused(job_id, beat.token, reason)))
            return
        except (RpcConnectionError, RpcTimeoutError, UnavailableError) as exc:
            log.warning("heartbeat to the JobMaster of job %s at %s failed: %s", job_id, address, exc)
            self._main.execute(self.core.heartbeat_failed, job_id)
            return
        except RpcError as exc:  # it answered, with an error of its own: alive, but no report
            log.warning("the JobMaster of job %s at %s failed to handle a heartbeat: %s", job_id, address, exc)
            report = None
        except Exception:  # a bug here must not stop this job's heartbeats for good
            log.exception("heartbeat to the JobMaster of job %s failed", job_id)
            self._main.execute(self.core.heartbeat_failed, job_id)
            return
        self._main.execute(lambda: self._carry_out(self.core.heartbeat_answered(beat, report)))
