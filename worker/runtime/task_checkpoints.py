"""A task's checkpoints, on its own thread (the part of ``StreamTask`` that takes them): the
mail the TaskExecutor leaves (triggers, notifications), barriers aligned or not, snapshots of
the chain handed to the ``SnapshotSink``, the snapshots deferred until the chain finished,
stop-with-savepoint, and the final checkpoint a finished task waits for (FLIP-147).

A mixin of ``StreamTask``, not a component: it reads and changes the task's own loop state on
the task thread, and is kept in its own file only to keep each file readable. What it uses of
the task is declared below (the unaligned part is ``unaligned.py``'s)."""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

from yarnflow.common.errors import YarnflowError
from yarnflow.worker.elements import MAX_WATERMARK, CheckpointBarrier, EndOfPartition
from yarnflow.worker.network.gate import ChannelError
from yarnflow.worker.operators.base import Operator, SourceOperator
from yarnflow.worker.runtime.barriers import AlignerAction, Decline, InflightComplete, Snapshot
from yarnflow.worker.runtime.checkpoints import (
    Mailbox,
    NotifyCheckpoint,
    TriggerCheckpoint,
    check_snapshot,
    release_all,
)
from yarnflow.worker.runtime.outputs import WriterOutput
from yarnflow.worker.runtime.unaligned import Inflight, UnalignedCheckpoints
from yarnflow.worker.runtime.writer import RecordWriter
from yarnflow.worker.state.tables import Snapshot as StateSnapshot

__all__ = ["StopWithSavepointError", "TaskCheckpoints"]

log = logging.getLogger(__name__)


class StopWithSavepointError(YarnflowError):
    """The savepoint of a stop-with-savepoint was aborted: the stopping task fails, so the job
    restarts from its latest checkpoint and runs on."""


class TaskCheckpoints(UnalignedCheckpoints):
    # -- what the task provides
    chain: list[Operator]
    writers: list[RecordWriter]
    tail: WriterOutput
    mailbox: Mailbox
    last_barrier_id: int
    _held: collections.deque[tuple[int, Any]]
    _direct: set[int]
    _deferred: list[tuple[CheckpointBarrier, int]]
    _input_ended: bool
    _chain_finished: bool
    _stop: tuple[int, str] | None
    _stop_completed: bool

    def _check_cancelled(self) -> None:
        raise NotImplementedError  # StreamTask's

    def _finish_chain(self) -> None:
        raise NotImplementedError  # StreamTask's

    def process_mail(self) -> None:
        """Take the mailbox's checkpoint calls (on the task thread, between two elements)."""
        for mail in self.mailbox.drain():
            if isinstance(mail, TriggerCheckpoint):
                self._on_trigger(mail)
            elif isinstance(mail, NotifyCheckpoint):
                self._notify(mail)

    def _on_trigger(self, mail: TriggerCheckpoint) -> None:
        barrier = CheckpointBarrier(mail.checkpoint_id, mail.timestamp_ms, mail.exactly_once, mail.stop,
                                    mail.aligned_timeout_ms)
        if self._aligner is None:
            if barrier.checkpoint_id > self.last_barrier_id:
                if self._input_ended and not self._chain_finished:
                    self._deferred.append((barrier, 0))  # taken once the chain has finished
                else:
                    self._take_checkpoint(barrier, 0, unaligned=barrier.unaligned_at(time.time() * 1000))
        else:
            self._direct.add(barrier.checkpoint_id)
            self._apply(self._aligner.on_trigger(barrier))

    def _notify(self, mail: NotifyCheckpoint) -> None:
        for op in self.chain:
            if mail.complete:
                op.notify_checkpoint_complete(mail.checkpoint_id)
            else:
                op.notify_checkpoint_aborted(mail.checkpoint_id)
        if self._stop is not None and mail.checkpoint_id == self._stop[0]:
            if mail.complete:
                self._stop_completed = True
            elif self._stop[1] == "drain":  # its input ended already: there is no going back
                raise StopWithSavepointError(f"{self.name}: the savepoint of stop-with-savepoint --drain "
                                             f"(checkpoint {mail.checkpoint_id}) was aborted; the job restarts "
                                             "from its latest checkpoint")
            else:
                log.warning("%s: the savepoint of stop-with-savepoint (checkpoint %d) was aborted: the task "
                            "goes on", self.name, mail.checkpoint_id)
                self._stop = None

    def _await_stop(self) -> bool:
        """Stopped with a savepoint: wait until it completes (True) or is aborted (False: the
        task goes on)."""
        checkpoint_id, mode = self._stop or (0, "")
        log.info("%s: stopped (%s), waiting for savepoint %d to complete", self.name, mode, checkpoint_id)
        while not self._stop_completed and self._stop is not None:
            self._check_cancelled()
            for w in self.writers:
                w.flush_if_due()
            if self.mailbox.wait(0.1):
                self.process_mail()
        if self._stop_completed:
            log.info("%s: savepoint %d complete, the task ends", self.name, checkpoint_id)
        return self._stop_completed

    def _drain_for_stop(self) -> None:
        """Stop-with-savepoint with drain: end the input now (its barriers aligned, nothing but
        the end of the partitions follows): every timer and window fires, the chain finishes."""
        head = self.chain[0]
        if isinstance(head, SourceOperator):
            head.process_watermark(MAX_WATERMARK)
        else:  # the maximum watermark came from upstream, before the barriers
            for inp in sorted(set(self.channel_inputs)):
                head.end_input(inp)
        self._finish_chain()
        self._chain_finished = True

    def _apply(self, actions: list[AlignerAction], channel: int | None = None) -> None:
        """``channel``: the one whose barrier caused ``actions`` (an unaligned snapshot's first)."""
        for action in actions:
            if isinstance(action, InflightComplete):
                self._complete_unaligned(action)
                continue
            if isinstance(action, Snapshot) and action.unaligned:
                self._take_checkpoint(action.barrier, action.alignment_ms, unaligned=True, channel=channel)
            elif isinstance(action, Snapshot) and action.at_end and action.barrier.checkpoint_id in self._direct \
                    and not self._chain_finished:
                # a direct trigger that completed because every input ended: its snapshot is
                # taken once the chain has finished too (after ``finish`` emitted the last
                # results), so it is the final checkpoint a two-phase sink waits for. (When a
                # channel delivered the barrier, its upstream snapshotted there: the snapshot is
                # taken now, at that cut, or the upstream would replay rows it already covers.)
                self._deferred.append((action.barrier, action.alignment_ms))
            elif isinstance(action, Snapshot):
                self._take_checkpoint(action.barrier, action.alignment_ms)
            elif isinstance(action, Decline):
                inflight = self._inflight
                if inflight is not None and inflight.barrier.checkpoint_id == action.checkpoint_id:
                    self._inflight = None  # superseded before its in-flight data was complete
                    release_all(inflight.snapshots)
                self._decline(action.checkpoint_id, action.reason)
            # either way, the blocked channels go on, oldest element first
            self._held.extend(self._replay)
            self._replay, self._held = self._held, collections.deque()

    def _take_checkpoint(self, barrier: CheckpointBarrier, alignment_ms: int, unaligned: bool = False,
                         channel: int | None = None) -> None:
        """Snapshot the chain, forward the barrier, hand the snapshot to the writer. A failed
        snapshot declines the checkpoint; the barrier still goes on so consumers do not wait.

        ``unaligned``: the barrier overtakes the queued output, which is kept as the task's
        in-flight output; a task with inputs then records its in-flight input (``Inflight``)
        until every barrier came, and hands the snapshot over then (``_complete_unaligned``)."""
        checkpoint_id = barrier.checkpoint_id
        if barrier.stop and self._stop is None:
            self._stop = (checkpoint_id, barrier.stop)
            if barrier.stop == "drain" and not self._chain_finished:
                self._drain_for_stop()
        started = time.monotonic()
        # Flink's start delay: from the trigger to the first barrier here (the alignment since then
        # is not part of it); wall clocks of two hosts: never below 0
        start_delay_ms = max(0, int(time.time() * 1000 - barrier.timestamp_ms) - alignment_ms)
        snapshots: list[StateSnapshot] = []
        failed = False
        for op in self.chain:  # head first: what one emits reaches the next before its snapshot
            op.prepare_snapshot_pre_barrier(checkpoint_id)
        for op in self.chain:
            try:
                snapshots.append(check_snapshot(op, op.snapshot_state(checkpoint_id)))
            except Exception as exc:  # noqa: BLE001 - declines the checkpoint, the task goes on
                log.warning("%s: snapshot of %s for checkpoint %d failed", self.name, op, checkpoint_id,
                            exc_info=True)
                self._decline(checkpoint_id, f"snapshot of operator '{op.name}' in {self.name} failed: "
                                             f"{type(exc).__name__}: {exc}")
                failed = True
                break
        sync_ms = int(round((time.monotonic() - started) * 1000))
        if unaligned:
            outputs = {(w, i): overtaken for w, writer in enumerate(self.writers)
                       for i, overtaken in enumerate(writer.broadcast_priority(barrier)) if overtaken}
            self.last_barrier_id = max(self.last_barrier_id, checkpoint_id)
            if failed:
                release_all(snapshots)
            self._inflight = Inflight(barrier, [] if failed else snapshots, alignment_ms, sync_ms, outputs,
                                      start_delay_ms)
            self._failed_unaligned = failed
            if self._aligner is None or not self._aligner.unaligned:  # no input (left) to record
                if channel is not None and self.gate is not None:
                    self._inflight.inputs[channel] = self._ahead_of_barrier(
                        channel, self.gate.overtaken_by(channel, checkpoint_id))
                self._complete_unaligned(InflightComplete(checkpoint_id, 0))
            else:  # completes with the aligner's InflightComplete (maybe the next action)
                self._overtake_all(channel)
            return
        self.tail.broadcast_barrier(barrier)
        self.last_barrier_id = max(self.last_barrier_id, checkpoint_id)
        if not failed and self._snapshots is not None:
            self._snapshots.submit(checkpoint_id, snapshots, alignment_ms, sync_ms, start_delay_ms=start_delay_ms)
        else:
            release_all(snapshots)

    def _take_deferred(self) -> int:
        """Take the snapshots deferred until the chain finished; the id of the first (0: none)."""
        deferred, self._deferred = self._deferred, []
        first = 0
        for barrier, alignment_ms in deferred:
            if barrier.checkpoint_id > self.last_barrier_id:
                # unaligned, if the checkpoint is: the barrier overtakes the output still queued
                self._take_checkpoint(barrier, alignment_ms, unaligned=barrier.unaligned_at(time.time() * 1000))
                first = first or barrier.checkpoint_id
        return first

    def _await_final_checkpoint(self, first: int = 0) -> None:
        """Flink's FLIP-147: the chain has finished and a two-phase sink in it has staged its
        last rows; the task stays RUNNING until a checkpoint taken from now on completes and
        commits them. The output partitions stay open meanwhile, so that checkpoint's barrier
        still reaches the tasks downstream. (The task is triggered directly: as a source, or
        once its upstream tasks have finished.)"""
        # ``first``: the first checkpoint taken after the end of input (0: none yet)
        log.info("%s: input ended, waiting for a final checkpoint to commit", self.name)
        while True:
            self._check_cancelled()
            for w in self.writers:
                w.flush_if_due()
            if not self.mailbox.wait(0.1):
                continue
            for mail in self.mailbox.drain():
                if isinstance(mail, TriggerCheckpoint):
                    before = self.last_barrier_id
                    self._on_trigger(mail)
                    if not first and self.last_barrier_id > before:
                        first = self.last_barrier_id
                elif isinstance(mail, NotifyCheckpoint):
                    self._notify(mail)
                    if mail.complete and first and mail.checkpoint_id >= first:
                        log.info("%s: final checkpoint %d complete", self.name, mail.checkpoint_id)
                        return

    def _decline(self, checkpoint_id: int, reason: str) -> None:
        if self._snapshots is not None:
            self._snapshots.decline(checkpoint_id, reason)

    def _run_finished(self) -> None:
        """Restored as finished: emit nothing, drain the inputs (their producers finished too),
        end the partitions. Checkpoints cannot be taken here: they are declined."""
        declined: set[int] = set()

        def decline(checkpoint_id: int) -> None:
            if checkpoint_id not in declined:
                declined.add(checkpoint_id)
                self._decline(checkpoint_id, f"{self.name} was restored as finished and is ending")

        remaining = len(self.channel_inputs)
        while True:
            self._check_cancelled()
            for mail in self.mailbox.drain():
                if isinstance(mail, TriggerCheckpoint):
                    decline(mail.checkpoint_id)
            if not remaining:
                break
            assert self.gate is not None
            polled = self.gate.poll(0.5)
            if polled is None:
                continue
            element = polled[1]
            if isinstance(element, EndOfPartition):
                remaining -= 1
            elif isinstance(element, CheckpointBarrier):
                decline(element.checkpoint_id)
            elif isinstance(element, ChannelError):
                raise element.error
        for w in self.writers:
            w.finish()
