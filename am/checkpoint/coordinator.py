"""CheckpointCoordinator: one job's checkpoints, as a pure core (Flink's CheckpointCoordinator).

Events in: the periodic trigger timer, acknowledgements and declines from tasks, the outcome
of writing a checkpoint's metadata, task failures. Actions out (collected until
``drain_actions()``): trigger a checkpoint at the source tasks, write the metadata of a
checkpoint every task acknowledged, notify the tasks that a checkpoint completed (sinks then
commit), discard a checkpoint's files, fail the job after too many failed checkpoints.

A checkpoint's life::

    (trigger) PENDING --all tasks acknowledged--> FINALIZING --metadata written--> COMPLETED
                 |                                    |
                 +-- decline / timeout / task failure / subsumed / metadata failed --> ABORTED

Rules, each from Flink:
- at most ``max_concurrent`` checkpoints pending at once; a new one starts no sooner than
  ``min_pause_ms`` after the last one completed (or was aborted);
- a checkpoint that completes subsumes every older pending one (aborted: SUBSUMED) and older
  completed ones beyond ``num_retained`` are discarded;
- ``tolerable_failures`` consecutive failed checkpoints are tolerated; one more fails the
  job. A task failure aborts the pending checkpoints without counting against that limit;
- a trigger is skipped (not a failure) while some task to acknowledge is not running.
"""

from __future__ import annotations

import bisect
import enum
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, Union

from yarnflow.common.clock import Clock, TimerHandle
from yarnflow.common.ids import ExecutionAttemptID
from yarnflow.common.lifecycle import Lifecycle

log = logging.getLogger(__name__)


class CheckpointFailureReason(enum.Enum):
    """Why a checkpoint did not complete (Flink's CheckpointFailureReason)."""

    DECLINED = "a task declined the checkpoint"
    EXPIRED = "the checkpoint expired before every task acknowledged it"
    TASK_FAILURE = "a task failed while the checkpoint was pending"
    TASK_NOT_REACHED = "the trigger did not reach a task (it is likely gone; its failure follows)"
    SUBSUMED = "a later checkpoint completed first"
    FINALIZE_FAILED = "writing the checkpoint's metadata failed"
    JOB_ENDED = "the job ended"

    @property
    def counts_against_tolerance(self) -> bool:
        return self in (CheckpointFailureReason.DECLINED, CheckpointFailureReason.EXPIRED,
                        CheckpointFailureReason.FINALIZE_FAILED)


class CheckpointStatus(enum.Enum):
    PENDING = "PENDING"
    FINALIZING = "FINALIZING"
    COMPLETED = "COMPLETED"
    ABORTED = "ABORTED"


CHECKPOINT_TRANSITIONS: dict[CheckpointStatus, frozenset[CheckpointStatus]] = {
    CheckpointStatus.PENDING: frozenset({CheckpointStatus.FINALIZING, CheckpointStatus.ABORTED}),
    CheckpointStatus.FINALIZING: frozenset({CheckpointStatus.COMPLETED, CheckpointStatus.ABORTED}),
    CheckpointStatus.COMPLETED: frozenset(),
    CheckpointStatus.ABORTED: frozenset(),
}


@dataclass(frozen=True)
class CheckpointSettings:
    interval_ms: int
    timeout_ms: int = 600_000
    min_pause_ms: int = 0
    max_concurrent: int = 1
    tolerable_failures: int = 0
    num_retained: int = 1
    exactly_once: bool = True
    unaligned: bool = False
    aligned_timeout_ms: int = 0


@dataclass(frozen=True)
class CheckpointPlan:
    """Which tasks a checkpoint involves: ``trigger`` get the trigger (the running sources),
    ``acknowledge`` must all acknowledge (every running task; finished ones are left out)."""

    trigger: tuple[ExecutionAttemptID, ...]
    acknowledge: frozenset[ExecutionAttemptID]
    #: subtasks already finished: in the checkpoint as finished, acknowledged from the start
    finished: int = 0


#: checkpoints whose statistics are kept (the counts cover all)
HISTORY_KEPT = 100
#: upper bounds (ms) of the buckets of the completed checkpoints' durations (Prometheus's histogram)
DURATION_BUCKETS_MS = (50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 120_000, 600_000)


class Ack(NamedTuple):
    """One task's acknowledgement of a checkpoint, as the checkpoint's details show it."""

    at_ms: int  # when it came (the AppMaster's clock)
    state_size: int
    alignment_ms: int  # from the task's first barrier to its snapshot (or to the last barrier)
    unaligned: bool
    inflight_bytes: int
    sync_ms: int = 0  # the task paused for its snapshot
    async_ms: int = 0  # the files written in the background
    start_delay_ms: int = 0  # from the trigger to the task's first barrier


@dataclass
class CheckpointStats:
    checkpoint_id: int
    trigger_time_ms: int
    status: CheckpointStatus = CheckpointStatus.PENDING
    end_time_ms: int = 0
    state_size: int = 0
    alignment_ms: int = 0
    start_delay_ms: int = 0  # the longest of any task's
    unaligned: bool = False
    inflight_bytes: int = 0
    failure: CheckpointFailureReason | None = None
    failure_detail: str = ""
    num_subtasks: int = 0  # the job's subtasks: those that must acknowledge it and the finished ones
    num_acknowledged: int = 0  # (a finished subtask counts from the start: it is in as finished)
    savepoint: bool = False  # taken on a user's request into a savepoint folder
    external_path: str = ""  # where it is, once written: its folder (a savepoint's folder)
    discarded: bool = False  # completed, then no longer retained: its files are deleted
    #: the tasks' state handles, until the checkpoint is finalized or aborted (then released)
    acknowledged: dict[ExecutionAttemptID, object] = field(default_factory=dict)
    #: per task that acknowledged, its acknowledgement
    acks: dict[ExecutionAttemptID, Ack] = field(default_factory=dict)
    life: Lifecycle[CheckpointStatus] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.life = Lifecycle(f"checkpoint {self.checkpoint_id}", CHECKPOINT_TRANSITIONS, self.status)

    def move(self, target: CheckpointStatus) -> None:
        """Every status change goes through the table."""
        self.life.move(target)
        self.status = target

    @property
    def duration_ms(self) -> int:
        return self.end_time_ms - self.trigger_time_ms if self.end_time_ms else 0


# ---- actions ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class TriggerCheckpoint:
    checkpoint_id: int
    timestamp_ms: int
    tasks: tuple[ExecutionAttemptID, ...]
    exactly_once: bool
    stop: str = ""  # "stop" / "drain": the savepoint of stop-with-savepoint
    #: -1: aligned (savepoints, unaligned off), 0: unaligned, else after this many ms
    aligned_timeout_ms: int = -1


@dataclass(frozen=True)
class FinalizeCheckpoint:
    """Write ``_metadata`` (atomically, last) from the tasks' state handles, then report with
    ``metadata_written`` or ``metadata_failed``."""

    checkpoint_id: int
    state_handles: dict[ExecutionAttemptID, object]


@dataclass(frozen=True)
class NotifyCheckpointComplete:
    checkpoint_id: int
    tasks: tuple[ExecutionAttemptID, ...]


@dataclass(frozen=True)
class NotifyCheckpointAborted:
    checkpoint_id: int
    tasks: tuple[ExecutionAttemptID, ...]


@dataclass(frozen=True)
class DiscardCheckpoint:
    """Delete the files of a checkpoint no longer retained (or aborted)."""

    checkpoint_id: int


@dataclass(frozen=True)
class FailJobOnCheckpoints:
    """Too many checkpoints failed in a row: the job fails over (Flink's CheckpointFailureManager),
    from the tasks that held the last one up (``culprits``: the ones that declined it, or had not
    acknowledged it when it expired; empty: no task to blame)."""

    reason: str
    culprits: tuple[ExecutionAttemptID, ...] = ()


CheckpointAction = Union[TriggerCheckpoint, FinalizeCheckpoint, NotifyCheckpointComplete, NotifyCheckpointAborted,
                         DiscardCheckpoint, FailJobOnCheckpoints]


class TimerService(Protocol):
    def schedule(self, delay_ms: int, fn: Callable[[], None]) -> TimerHandle: ...


class CheckpointIDCounter(Protocol):
    """Ids never repeat, also across JobMaster leaders (ZooKeeper keeps it in HA mode)."""

    def get_and_increment(self) -> int: ...


class StandaloneCheckpointIDCounter:
    def __init__(self, start: int = 1) -> None:
        self._next = start

    def get_and_increment(self) -> int:
        value = self._next
        self._next += 1
        return value


class CheckpointCoordinator:
    def __init__(self, settings: CheckpointSettings, clock: Clock, timers: TimerService,
                 plan: Callable[[], CheckpointPlan | None],
                 ids: CheckpointIDCounter | None = None) -> None:
        if settings.interval_ms <= 0:
            raise ValueError("checkpoint interval must be positive")
        self.settings = settings
        self._clock = clock
        self._timers = timers
        self._plan = plan
        self._ids = ids or StandaloneCheckpointIDCounter()
        self.pending: dict[int, CheckpointStats] = {}
        self.completed: list[CheckpointStats] = []     # retained, oldest first
        self.history: list[CheckpointStats] = []       # the latest HISTORY_KEPT checkpoints, for ``info``
        self.num_completed = self.num_failed = 0       # all the job's (the history keeps the latest only)
        #: every completed checkpoint's duration, counted per bucket (``DURATION_BUCKETS_MS``, then
        #: the rest) and summed: a histogram over all of them, not only the history's
        self.duration_counts = [0] * (len(DURATION_BUCKETS_MS) + 1)
        self.duration_sum_ms = 0
        self.consecutive_failures = 0
        self._last_end_ms: int | None = None
        self._out: list[CheckpointAction] = []
        self._running = False
        self._timer: TimerHandle | None = None
        self._timeouts: dict[int, TimerHandle] = {}
        self._awaiting: dict[int, set[ExecutionAttemptID]] = {}   # tasks yet to acknowledge
        self._tasks: dict[int, tuple[ExecutionAttemptID, ...]] = {}  # every task of the checkpoint
        self._triggered: dict[int, set[ExecutionAttemptID]] = {}  # tasks the trigger went to
        #: the pending stop-with-savepoint checkpoint and its mode ("stop" / "drain"): no other
        #: checkpoint starts meanwhile (the job ends after it; if it fails, the job restarts)
        self.stopping: tuple[int, str] | None = None
        self._savepoints: set[int] = set()  # ids of the savepoints among the checkpoints

    # -- plumbing ----------------------------------------------------------------------------------
    def drain_actions(self) -> list[CheckpointAction]:
        out, self._out = self._out, []
        return out

    @property
    def latest_completed(self) -> CheckpointStats | None:
        return self.completed[-1] if self.completed else None

    def skip_ids_through(self, checkpoint_id: int) -> None:
        """Later checkpoints get ids above ``checkpoint_id`` (a job restored from a savepoint of
        that id: its state and its sinks' part numbers go on from there)."""
        while self._ids.get_and_increment() < checkpoint_id:
            pass

    # -- periodic trigger --------------------------------------------------------------------------
    def start(self) -> None:
        self.stopping = None  # (re)started: a stop-with-savepoint before does not hold any more
        if not self._running:
            self._running = True
            self._schedule_trigger(self.settings.interval_ms)

    def stop(self, finished: bool = False) -> None:
        """The job ended or is restarting: abort what is pending and trigger no more. A job that
        ``finished`` cleanly leaves no failure behind: a checkpoint its end overtook is dropped
        from the history and not counted as failed (it shows as "Failed 1" otherwise)."""
        self._running = False
        if self._timer is not None:
            self._timer.cancel()
        if not finished:
            self.abort_pending(CheckpointFailureReason.JOB_ENDED)
            return
        for checkpoint_id in sorted(self.pending):
            stats = self.pending[checkpoint_id]
            self._abort(checkpoint_id, CheckpointFailureReason.JOB_ENDED, "the job finished first", counted=False)
            if stats in self.history:
                self.history.remove(stats)

    def elapsed_ms(self, stats: CheckpointStats) -> int:
        """How long ``stats`` took, or has been under way (a pending one: until now)."""
        if stats.status in (CheckpointStatus.PENDING, CheckpointStatus.FINALIZING):
            return max(0, self._clock.now_ms() - stats.trigger_time_ms)
        return stats.duration_ms  # (0 for one recovered from an earlier leader: its duration is not known)

    def discard_retained(self) -> None:
        """The job ended and its checkpoint folder is deleted: every retained checkpoint is gone
        (savepoints are in folders of their own, the user's: they stay)."""
        for stats in self.completed:
            if not stats.savepoint and stats.checkpoint_id not in self._savepoints:
                stats.discarded = True

    def _schedule_trigger(self, delay_ms: int) -> None:
        self._timer = self._timers.schedule(max(0, delay_ms), self._on_trigger_timer)

    def _on_trigger_timer(self) -> None:
        if not self._running:
            return
        self.trigger()
        self._schedule_trigger(self.settings.interval_ms)

    def trigger(self, savepoint: bool = False, stop: str = "") -> int | None:
        """Start a checkpoint now if the rules allow; returns its id, or None when skipped. A
        ``savepoint`` is asked for by a user: it ignores the limit of concurrent checkpoints and
        the minimum pause (as Flink's savepoints do), so it starts as soon as every task runs.
        ``stop`` ("stop" / "drain"): the savepoint of stop-with-savepoint; until it ends no
        other checkpoint starts."""
        now = self._clock.now_ms()
        if self.stopping is not None:
            log.debug("checkpoint skipped: the job is stopping with savepoint %d", self.stopping[0])
            return None
        if len(self.pending) >= self.settings.max_concurrent and not savepoint:
            log.debug("checkpoint skipped: %d pending (max %d)", len(self.pending), self.settings.max_concurrent)
            return None
        if not savepoint and self._last_end_ms is not None and now - self._last_end_ms < self.settings.min_pause_ms:
            log.debug("checkpoint skipped: min pause")
            return None
        plan = self._plan()
        if plan is None or not plan.trigger:
            log.debug("checkpoint skipped: not every task is running")
            return None
        checkpoint_id = self._ids.get_and_increment()
        stats = CheckpointStats(checkpoint_id, now, num_subtasks=len(plan.acknowledge) + plan.finished,
                                num_acknowledged=plan.finished)
        self.pending[checkpoint_id] = stats
        self._remember(stats)
        self._awaiting[checkpoint_id] = set(plan.acknowledge)
        self._tasks[checkpoint_id] = tuple(sorted(plan.acknowledge))
        self._triggered[checkpoint_id] = set(plan.trigger)
        self._timeouts[checkpoint_id] = self._timers.schedule(self.settings.timeout_ms,
                                                              lambda: self._expire(checkpoint_id))
        if savepoint:
            self._savepoints.add(checkpoint_id)
        if stop:
            self.stopping = (checkpoint_id, stop)
        log.info("triggering checkpoint %d (%d tasks to acknowledge)%s", checkpoint_id, len(plan.acknowledge),
                 f", the savepoint of stop-with-savepoint ({stop})" if stop else "")
        s = self.settings
        aligned_timeout_ms = s.aligned_timeout_ms if s.unaligned and s.exactly_once and not savepoint and not stop else -1
        self._out.append(TriggerCheckpoint(checkpoint_id, now, plan.trigger, s.exactly_once, stop, aligned_timeout_ms))
        return checkpoint_id

    # -- acknowledgements --------------------------------------------------------------------------
    def acknowledge(self, checkpoint_id: int, attempt_id: ExecutionAttemptID, state_handle: object,
                    state_size: int = 0, alignment_ms: int = 0, unaligned: bool = False,
                    inflight_bytes: int = 0, sync_ms: int = 0, async_ms: int = 0, start_delay_ms: int = 0) -> bool:
        """A task's snapshot for the checkpoint is written. False for a stale or duplicate one
        (the caller discards the handle's files when the checkpoint is unknown)."""
        stats = self.pending.get(checkpoint_id)
        awaiting = self._awaiting.get(checkpoint_id)
        if stats is None or awaiting is None or stats.status != CheckpointStatus.PENDING:
            log.debug("late acknowledgement of checkpoint %d by %s ignored", checkpoint_id, attempt_id)
            return False
        if attempt_id not in awaiting:
            log.debug("duplicate or unexpected acknowledgement of checkpoint %d by %s", checkpoint_id, attempt_id)
            return False
        awaiting.discard(attempt_id)
        stats.acknowledged[attempt_id] = state_handle
        stats.acks[attempt_id] = Ack(self._clock.now_ms(), state_size, alignment_ms, unaligned, inflight_bytes, sync_ms,
                                     async_ms, start_delay_ms)
        stats.num_acknowledged += 1
        stats.state_size += state_size
        stats.alignment_ms = max(stats.alignment_ms, alignment_ms)
        stats.start_delay_ms = max(stats.start_delay_ms, start_delay_ms)
        stats.unaligned = stats.unaligned or unaligned
        stats.inflight_bytes += inflight_bytes
        if not awaiting:
            stats.move(CheckpointStatus.FINALIZING)
            self._out.append(FinalizeCheckpoint(checkpoint_id, stats.acknowledged))
            stats.acknowledged = {}  # (the handles go on in the action; the stats must not hold them)
        return True

    def decline(self, checkpoint_id: int, attempt_id: ExecutionAttemptID, reason: str) -> None:
        """A task could not take its snapshot. A decline of a checkpoint older than the latest
        triggered one (a task moved on to the newer barrier) counts as subsumed, not failed."""
        if checkpoint_id in self.pending:
            superseded = any(i > checkpoint_id for i in self.pending)
            self._abort(checkpoint_id, CheckpointFailureReason.SUBSUMED if superseded
                        else CheckpointFailureReason.DECLINED, f"{attempt_id}: {reason}", (attempt_id,))

    def trigger_failed(self, checkpoint_id: int, attempt_id: ExecutionAttemptID, detail: str) -> None:
        """The trigger call to a task failed: abort, without counting it as a failed checkpoint
        (the task's own failure, which usually follows, is handled by failover)."""
        if checkpoint_id in self.pending:
            self._abort(checkpoint_id, CheckpointFailureReason.TASK_NOT_REACHED, f"{attempt_id}: {detail}")

    def acknowledge_finished(self, attempt_id: ExecutionAttemptID, handle: object) -> None:
        """A task finished before taking its snapshot of the pending checkpoints: everything it
        emitted reached its consumers before their barriers, so it counts as acknowledged with
        ``handle`` (Flink's FLIP-147)."""
        for checkpoint_id in sorted(self.pending):
            if attempt_id in self._awaiting.get(checkpoint_id, ()):
                self.acknowledge(checkpoint_id, attempt_id, handle)

    def awaiting(self, checkpoint_id: int) -> frozenset[ExecutionAttemptID]:
        """The tasks yet to acknowledge the pending checkpoint ``checkpoint_id``."""
        return frozenset(self._awaiting.get(checkpoint_id, ()))

    def trigger_tasks(self, checkpoint_id: int, tasks: Iterable[ExecutionAttemptID]) -> None:
        """Send the trigger of the pending checkpoint also to ``tasks`` (those it has not gone to
        yet). For a task whose upstream tasks all finished after the checkpoint was triggered:
        one of them may have finished before its snapshot, so its barrier never comes (FLIP-147)."""
        stats = self.pending.get(checkpoint_id)
        sent = self._triggered.get(checkpoint_id)
        if stats is None or sent is None or stats.status != CheckpointStatus.PENDING:
            return
        new = tuple(sorted(t for t in tasks if t not in sent and t in self._awaiting.get(checkpoint_id, ())))
        if new:
            sent.update(new)
            log.info("checkpoint %d: triggering %d more tasks whose inputs all ended", checkpoint_id, len(new))
            stop = self.stopping[1] if self.stopping is not None and self.stopping[0] == checkpoint_id else ""
            self._out.append(TriggerCheckpoint(checkpoint_id, stats.trigger_time_ms, new, self.settings.exactly_once,
                                               stop))

    def _expire(self, checkpoint_id: int) -> None:
        stats = self.pending.get(checkpoint_id)
        if stats is not None and stats.status == CheckpointStatus.PENDING:
            missing = tuple(sorted(self._awaiting.get(checkpoint_id, ())))
            self._abort(checkpoint_id, CheckpointFailureReason.EXPIRED,
                        f"{len(missing)} tasks had not acknowledged after {self.settings.timeout_ms} ms", missing)

    # -- completion --------------------------------------------------------------------------------
    def metadata_written(self, checkpoint_id: int, external_path: str = "") -> None:
        """``_metadata`` exists (in ``external_path``): the checkpoint is complete (its pointer
        may be stored first by the caller in HA mode)."""
        stats = self.pending.pop(checkpoint_id, None)
        if stats is None or stats.status != CheckpointStatus.FINALIZING:
            if stats is None:  # aborted meanwhile (e.g. subsumed): its files must go
                self._out.append(DiscardCheckpoint(checkpoint_id))
            return
        self._cancel_timeout(checkpoint_id)
        stats.move(CheckpointStatus.COMPLETED)
        self.num_completed += 1
        stats.external_path = external_path
        stats.end_time_ms = self._clock.now_ms()
        self._last_end_ms = stats.end_time_ms
        self.duration_counts[bisect.bisect_left(DURATION_BUCKETS_MS, stats.duration_ms)] += 1
        self.duration_sum_ms += stats.duration_ms
        self.consecutive_failures = 0
        tasks = self._tasks.pop(checkpoint_id, ())
        self._awaiting.pop(checkpoint_id, None)
        self._triggered.pop(checkpoint_id, None)
        log.info("checkpoint %d complete: %d bytes in %d ms", checkpoint_id, stats.state_size, stats.duration_ms)
        for older in sorted(i for i in self.pending if i < checkpoint_id):
            self._abort(older, CheckpointFailureReason.SUBSUMED, f"checkpoint {checkpoint_id} completed")
        self.completed.append(stats)
        while len(self.completed) > self.settings.num_retained:
            gone = self.completed.pop(0)
            gone.discarded = True
            self._out.append(DiscardCheckpoint(gone.checkpoint_id))
        self._out.append(NotifyCheckpointComplete(checkpoint_id, tasks))

    def metadata_failed(self, checkpoint_id: int, detail: str) -> None:
        if checkpoint_id in self.pending:
            self._abort(checkpoint_id, CheckpointFailureReason.FINALIZE_FAILED, detail)

    # -- failures ----------------------------------------------------------------------------------
    def abort_pending(self, reason: CheckpointFailureReason, detail: str = "") -> None:
        for checkpoint_id in sorted(self.pending):
            self._abort(checkpoint_id, reason, detail)

    def task_failed(self) -> None:
        """A task failed: nothing pending can complete (Flink aborts them without counting)."""
        self.abort_pending(CheckpointFailureReason.TASK_FAILURE)

    def _abort(self, checkpoint_id: int, reason: CheckpointFailureReason, detail: str,
               culprits: tuple[ExecutionAttemptID, ...] = (), counted: bool = True) -> None:
        stats = self.pending.pop(checkpoint_id, None)
        if stats is None:
            return
        self._cancel_timeout(checkpoint_id)
        stats.move(CheckpointStatus.ABORTED)
        if counted:
            self.num_failed += 1
        stats.acknowledged = {}
        stats.failure, stats.failure_detail = reason, detail
        stats.end_time_ms = self._clock.now_ms()  # (min-pause counts from the last *completed* one, as Flink's)
        tasks = self._tasks.pop(checkpoint_id, ())
        self._awaiting.pop(checkpoint_id, None)
        self._triggered.pop(checkpoint_id, None)
        if self.stopping is not None and self.stopping[0] == checkpoint_id:
            self.stopping = None  # its tasks fail on the abort: the job restarts and runs on
        log.info("checkpoint %d aborted: %s%s", checkpoint_id, reason.value, f" ({detail})" if detail else "")
        self._out.append(NotifyCheckpointAborted(checkpoint_id, tasks))
        self._out.append(DiscardCheckpoint(checkpoint_id))
        if reason.counts_against_tolerance and checkpoint_id not in self._savepoints:
            # (a failed savepoint is the user's to retry: it does not fail the job)
            self.consecutive_failures += 1
            if self.consecutive_failures > self.settings.tolerable_failures:
                self._out.append(FailJobOnCheckpoints(
                    f"{self.consecutive_failures} checkpoints failed in a row, more than "
                    f"execution.checkpointing.tolerable-failed-checkpoints ({self.settings.tolerable_failures}); "
                    f"the last: {reason.value}{f' ({detail})' if detail else ''}", culprits))
                self.consecutive_failures = 0  # (the failover starts the count again)

    def _cancel_timeout(self, checkpoint_id: int) -> None:
        handle = self._timeouts.pop(checkpoint_id, None)
        if handle is not None:
            handle.cancel()

    def add_recovered(self, checkpoint_id: int, trigger_time_ms: int = 0, state_size: int = 0) -> None:
        """A completed checkpoint found in the CompletedCheckpointStore by a new leader (oldest
        first): it is retained and restorable as if this coordinator had completed it."""
        stats = CheckpointStats(checkpoint_id, trigger_time_ms, CheckpointStatus.COMPLETED,
                                end_time_ms=trigger_time_ms, state_size=state_size)
        self.completed.append(stats)
        self._remember(stats)
        self.num_completed += 1

    def _remember(self, stats: CheckpointStats) -> None:
        self.history.append(stats)
        if len(self.history) > HISTORY_KEPT:  # (a job checkpointing every second would hold them all)
            del self.history[0]

    def counts(self) -> tuple[int, int, int]:
        """(completed, failed, in progress) checkpoints of the job so far."""
        return self.num_completed, self.num_failed, len(self.pending)

    def retained_ids(self) -> Iterable[int]:
        return [s.checkpoint_id for s in self.completed]
