"""How a JobMaster starts a job from where it was: a new leader's recovery from the job's
retained checkpoints, a new job's start from a savepoint, and the savepoints it takes on request
(``trigger_savepoint``, also stop-with-savepoint).

A mixin of ``JobMaster``, not a component: it uses the JobMaster's core, checkpoint storage and
stores, and its main thread; it is kept in its own file only to keep each file readable. The
attributes and methods it uses are declared below."""

from __future__ import annotations

import logging
import time
from typing import Any
from concurrent.futures import Future

from yarnflow.am.checkpoint.savepoints import SavepointError, read_savepoint, restore_metadata
from yarnflow.am.checkpoint.storage import (
    CheckpointNotReadableError,
    CheckpointStorage,
    check_state_files,
    read_metadata_url,
)
from yarnflow.am.jobmaster.job_master_core import JobMasterCore
from yarnflow.am.jobmaster.splits import SplitEnumerator
from yarnflow.common.errors import RefusedError, UnavailableError
from yarnflow.common.ha.api import CompletedCheckpointStore
from yarnflow.common.ids import JobID
from yarnflow.common.messages import JobGraph
from yarnflow.common.rpc.endpoint import MainThreadExecutor, settle

log = logging.getLogger(__name__)


class SavepointsAndRecovery:
    job_id: JobID
    job_graph: JobGraph
    core: JobMasterCore
    splits: SplitEnumerator | None
    _main: MainThreadExecutor
    _checkpoints: CheckpointStorage
    _checkpoint_store: CompletedCheckpointStore
    _allow_non_restored: bool
    _savepoint_path: str
    _checkpoint_timeout_ms: int
    #: checkpoint id -> (target folder, the savepoint's URL once written)
    _savepoints: dict[int, tuple[str, Future[str]]]
    #: the checkpoints among them that stop the job (stop-with-savepoint)
    _stop_savepoints: set[int]
    #: the savepoints asked for and not yet settled
    _savepoint_requests: set[Future[str]]

    def _recover_checkpoints(self) -> None:
        """A new leader takes over the job: the retained checkpoints whose metadata and state
        files can be read become restorable (an unreadable one is skipped, logged); the split
        enumerator starts from its part of the latest. Called before the main thread runs."""
        checkpoints = self.core.checkpoints
        if checkpoints is None:
            log.info("job %s recovered; it takes no checkpoints, so it starts from the beginning", self.job_id)
            return
        readable: list[tuple[int, dict[str, Any]]] = []
        for checkpoint_id, url in self._checkpoint_store.checkpoints():
            try:
                metadata = read_metadata_url(url, checkpoint_id)
                check_state_files(metadata)
            except CheckpointNotReadableError as exc:
                log.warning("job %s: retained checkpoint %d is skipped: %s", self.job_id, checkpoint_id, exc)
                continue
            readable.append((checkpoint_id, metadata))
        for checkpoint_id, metadata in readable:
            checkpoints.recover(checkpoint_id, metadata)
        if readable:
            latest_id, latest = readable[-1]
            if self.splits is not None and isinstance(latest.get("split_enumerator"), dict):
                self.splits.restore(latest["split_enumerator"])
            log.info("job %s recovered with %d retained checkpoints; it resumes from checkpoint %d", self.job_id,
                     len(readable), latest_id)
        elif self._savepoint_path:  # started from a savepoint (run -s, or rescaled) before its first checkpoint
            log.info("job %s recovered without a completed checkpoint: it starts from its savepoint %s again",
                     self.job_id, self._savepoint_path)
            self._restore_savepoint(self._savepoint_path)
        else:
            log.info("job %s recovered without a completed checkpoint, so it starts from the beginning", self.job_id)

    def _restore_savepoint(self, path: str) -> None:
        """A new job that starts from a savepoint: its state, mapped to this JobGraph by operator
        uid, becomes the job's first retained checkpoint (written into the job's checkpoint
        folder and recorded, so a new leader recovers it too; its state files stay in the
        savepoint), the enumerator hands out the savepoint's remaining splits, and later
        checkpoint ids follow the savepoint's. Called before the main thread runs."""
        checkpoints = self.core.checkpoints
        if checkpoints is None:
            raise SavepointError("a job started from a savepoint must take checkpoints: set "
                                 "execution.checkpointing.interval (a STREAMING job)")
        savepoint = read_savepoint(path)
        metadata = restore_metadata(savepoint, self.job_graph, self._allow_non_restored)
        checkpoint_id = int(metadata["checkpoint_id"])
        try:
            url = self._checkpoints.write_metadata(checkpoint_id, metadata)
            self._checkpoint_store.add(checkpoint_id, url)
        except OSError as exc:
            raise SavepointError(f"cannot record the savepoint as the job's first checkpoint: {exc}") from exc
        checkpoints.recover(checkpoint_id, metadata)
        checkpoints.coordinator.skip_ids_through(checkpoint_id)
        if self.splits is not None and metadata["split_enumerator"]:
            self.splits.restore(metadata["split_enumerator"])
        log.info("job %s starts from savepoint %s (checkpoint %d of job %s)", self.job_id, savepoint["_folder"],
                 checkpoint_id, savepoint.get("job_id"))

    # -- savepoints -----------------------------------------------------------------------------
    def trigger_checkpoint(self, timeout_s: float | None = None) -> Future[str]:
        """Take a checkpoint now, as a savepoint would be taken (at once, aligned, its failure not
        counted against the job) but not copied anywhere: a Future of its metadata URL once it
        completed (a rescale goes through it)."""
        return self.trigger_savepoint("", timeout_s)

    def trigger_savepoint(self, target_dir: str, timeout_s: float | None = None, stop: str = "") -> Future[str]:
        """Take a checkpoint now and copy it into a new savepoint folder under ``target_dir``.
        Answers at once (on any thread) with a Future of the folder's URL; it fails with
        RefusedError when the job takes no checkpoints or has ended, UnavailableError when the
        checkpoint could not start or failed. ``stop`` ("stop" / "drain"): stop-with-savepoint,
        the job's tasks end once it completed. The work is done on the main thread: a periodic
        checkpoint in progress is waited out by a timer, not by a blocked thread."""
        result: Future[str] = Future()
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self._checkpoint_timeout_ms / 1000 + 30)
        self._savepoint_requests.add(result)
        result.add_done_callback(self._savepoint_requests.discard)
        self._main.execute(self._savepoint_attempt, target_dir, stop, deadline, result)
        return result

    def _savepoint_attempt(self, target_dir: str, stop: str, deadline: float, result: Future[str]) -> None:
        """On the main thread: start the savepoint's checkpoint, or try again in 100 ms."""
        try:
            started = self._start_savepoint(target_dir, stop)
        except Exception as exc:  # noqa: BLE001 - the caller learns it
            settle(result, exc)
            return
        if isinstance(started, int):
            self._savepoints[started][1].add_done_callback(lambda done: settle(result, done))
            self._savepoint_watch(started, deadline, result)
        elif started.startswith("refused:") or time.monotonic() > deadline:
            settle(result, RefusedError(started.removeprefix("refused:").strip()))
        else:  # a periodic checkpoint is in progress: start ours once it is done
            self._main.schedule(100, lambda: self._savepoint_attempt(target_dir, stop, deadline, result))

    def _savepoint_watch(self, checkpoint_id: int, deadline: float, result: Future[str]) -> None:
        """On the main thread, every 200 ms until the savepoint is settled: fail it when its
        checkpoint failed or took too long; then forget it."""
        if not result.done():
            failure = self._checkpoint_failure(checkpoint_id)
            if failure:
                settle(result, UnavailableError(f"the savepoint failed: checkpoint {checkpoint_id} {failure}"))
            elif time.monotonic() > deadline:
                settle(result, UnavailableError(f"the savepoint (checkpoint {checkpoint_id}) did not complete in time"))
            else:
                self._main.schedule(200, lambda: self._savepoint_watch(checkpoint_id, deadline, result))
                return
        self._savepoints.pop(checkpoint_id, None)
        self._stop_savepoints.discard(checkpoint_id)

    def _fail_savepoint_requests(self, reason: str) -> None:
        """The JobMaster stops: every savepoint still asked for fails (nothing will settle it)."""
        for request in list(self._savepoint_requests):
            settle(request, UnavailableError(reason))

    def _start_savepoint(self, target_dir: str, stop: str = "") -> int | str:
        """On the main thread: the id of the checkpoint started for a savepoint, or why not
        ("refused: ..." when it never will)."""
        checkpoints = self.core.checkpoints
        if checkpoints is None:
            return (f"refused: job {self.job_id} takes no checkpoints: savepoints need a STREAMING job with "
                    "execution.checkpointing.interval set")
        if self.core.is_terminal:
            return f"refused: job {self.job_id} has ended ({self.core.status.name})"
        if stop and not checkpoints.coordinator.settings.exactly_once:
            return (f"refused: job {self.job_id} checkpoints AT_LEAST_ONCE: stop-with-savepoint needs "
                    "execution.checkpointing.mode EXACTLY_ONCE (aligned barriers end every input)")
        if stop and checkpoints.coordinator.stopping is not None:
            return f"refused: job {self.job_id} is already stopping with a savepoint"
        checkpoint_id = checkpoints.coordinator.trigger(savepoint=True, stop=stop)
        if checkpoint_id is None:
            return "a checkpoint could not start now: not every task is running"
        self._savepoints[checkpoint_id] = (target_dir, Future())
        checkpoints.coordinator.pending[checkpoint_id].savepoint = bool(target_dir)
        if stop:
            self._stop_savepoints.add(checkpoint_id)
        if target_dir:
            log.info("job %s: checkpoint %d is a savepoint into %s", self.job_id, checkpoint_id, target_dir)
        else:
            log.info("job %s: checkpoint %d was asked for", self.job_id, checkpoint_id)
        return checkpoint_id

    def _checkpoint_failure(self, checkpoint_id: int) -> str:
        checkpoints = self.core.checkpoints
        if checkpoints is None:
            return "was aborted: the job ended"
        for stats in checkpoints.coordinator.history:
            if stats.checkpoint_id == checkpoint_id and stats.failure is not None:
                return f"failed: {stats.failure.name.lower().replace('_', ' ')} {stats.failure_detail}".rstrip()
        return ""
