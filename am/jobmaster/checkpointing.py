"""The JobMaster's checkpointing (pure; part of the JobMaster core).

It runs the job's ``CheckpointCoordinator`` and turns its decisions into JobMaster actions
(trigger at tasks, write ``_metadata``, notify, discard), keeps which files of which subtask
belong to each completed checkpoint, and picks the state a restarted subtask restores:

- the latest completed checkpoint that is not known to be unreadable (a restore that found
  it unreadable marks it so, and the next restart takes the previous retained one);
- a subtask that had finished when the checkpoint was taken restores as finished (it emits
  nothing again);
- no completed checkpoint yet: start from nothing; completed ones that all proved unreadable:
  the job fails rather than silently starting over.

Which tasks take part (Flink's FLIP-147): every RUNNING task acknowledges; FINISHED tasks are
left out and recorded as finished; the trigger goes to the running tasks whose upstream tasks
have all finished (the sources, and tasks whose inputs all ended). No trigger while any task
is neither RUNNING nor FINISHED.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from yarnflow.am.checkpoint.coordinator import (
    CheckpointAction,
    CheckpointCoordinator,
    CheckpointIDCounter,
    CheckpointPlan,
    CheckpointSettings,
    CheckpointStats,
    DiscardCheckpoint,
    FailJobOnCheckpoints,
    FinalizeCheckpoint,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    TimerService,
    TriggerCheckpoint,
)
from yarnflow.am.checkpoint.shared import SharedStateRegistry
from yarnflow.am.jobmaster.actions import (
    Action,
    DiscardCheckpointFiles,
    NotifyTaskCheckpoint,
    TriggerTaskCheckpoint,
    WriteCheckpointMetadata,
)
from yarnflow.am.jobmaster.execution_graph import Execution, ExecutionGraph
from yarnflow.am.scheduler.regions import SubtaskId
from yarnflow.common.clock import Clock
from yarnflow.common.config import Configuration, Options
from yarnflow.common.ids import ExecutionAttemptID, JobVertexID
from yarnflow.common.keygroups import union_state
from yarnflow.common.messages import CheckpointInfo, JobGraph, OperatorStateFile, TaskRestore, TaskStateSnapshot
from yarnflow.common.states import ExecutionState

log = logging.getLogger(__name__)

METADATA_VERSION = 1
HISTORY_SHOWN = 10


@dataclass(frozen=True)
class SubtaskState:
    files: tuple[OperatorStateFile, ...]
    finished: bool


def checkpoint_settings(config: Configuration) -> CheckpointSettings | None:
    """The job's checkpoint settings; None when checkpointing is off."""
    interval = int(config[Options.CHECKPOINT_INTERVAL])
    if interval <= 0:
        return None
    return CheckpointSettings(
        interval_ms=interval, timeout_ms=int(config[Options.CHECKPOINT_TIMEOUT]),
        min_pause_ms=int(config[Options.CHECKPOINT_MIN_PAUSE]),
        max_concurrent=int(config[Options.CHECKPOINT_MAX_CONCURRENT]),
        tolerable_failures=int(config[Options.CHECKPOINT_TOLERABLE_FAILURES]),
        num_retained=int(config[Options.CHECKPOINT_NUM_RETAINED]),
        exactly_once=str(config[Options.CHECKPOINT_MODE]) == "EXACTLY_ONCE",
        unaligned=bool(config[Options.CHECKPOINT_UNALIGNED]),
        aligned_timeout_ms=int(config[Options.ALIGNED_CHECKPOINT_TIMEOUT]))


class JobCheckpoints:
    def __init__(self, job_graph: JobGraph, graph: ExecutionGraph, settings: CheckpointSettings, clock: Clock,
                 timers: TimerService, sid_of: Callable[[Execution], SubtaskId],
                 ids: CheckpointIDCounter | None = None) -> None:
        self._job_graph = job_graph
        self._graph = graph
        self._sid_of = sid_of
        self.coordinator = CheckpointCoordinator(settings, clock, timers, self._plan, ids)
        self._upstream: dict[str, list[JobVertexID]] = {str(v.vertex_id): [] for v in job_graph.vertices}
        for edge in job_graph.edges:
            self._upstream[str(edge.target_vertex_id)].append(edge.source_vertex_id)
        self._finished_at_plan: frozenset[SubtaskId] = frozenset()
        self._finished_at: dict[int, frozenset[SubtaskId]] = {}
        self._states: dict[int, dict[SubtaskId, SubtaskState]] = {}   # completed (and finalizing) ones
        self.unreadable: set[int] = set()
        #: which retained checkpoints reference each file of the shared folder (incremental ones)
        self.shared = SharedStateRegistry()
        self.ever_completed = False
        #: a final checkpoint was wanted (``task_finished``) while another was pending
        self._final_wanted = False
        #: set by the core: fails the job (too many failed checkpoints)
        #: too many checkpoints failed: (reason, the tasks that held the last one up)
        self.on_fail_job: Callable[[str, tuple[ExecutionAttemptID, ...]], None] = lambda reason, culprits: None

    # -- plan ---------------------------------------------------------------------------------------
    def _plan(self) -> CheckpointPlan | None:
        acknowledge: set[ExecutionAttemptID] = set()
        finished: set[SubtaskId] = set()
        running: list[Execution] = []
        for ex in self._graph.current_executions():
            if ex.state == ExecutionState.FINISHED or (ex.restore is not None and ex.restore.finished):
                finished.add(self._sid_of(ex))  # a subtask restored as finished only drains
            elif ex.state == ExecutionState.RUNNING:
                acknowledge.add(ex.attempt_id)
                running.append(ex)
            else:
                return None  # deploying, restarting, cancelling: try again next time
        if not running:
            return None
        trigger = tuple(ex.attempt_id for ex in running
                        if all(self._sid_of(sub.current) in finished
                               for up in self._upstream[str(ex.vertex.job_vertex.vertex_id)]
                               for sub in self._graph.vertices[up].subtasks))
        if not trigger:
            return None
        self._finished_at_plan = frozenset(finished)
        return CheckpointPlan(trigger, frozenset(acknowledge), len(finished))

    # -- events ----------------------------------------------------------------------------------
    def acknowledge(self, ex: Execution, checkpoint_id: int, snapshot: TaskStateSnapshot) -> bool:
        return self.coordinator.acknowledge(checkpoint_id, ex.attempt_id, (self._sid_of(ex), tuple(snapshot.files)),
                                            snapshot.size_bytes, snapshot.alignment_ms, snapshot.unaligned,
                                            snapshot.inflight_bytes, snapshot.sync_ms, snapshot.async_ms,
                                            snapshot.start_delay_ms)

    def task_finished(self, ex: Execution) -> None:
        """A task reached FINISHED: pending checkpoints waiting for it count it as finished.
        When that leaves a running task whose upstream tasks have all finished (its input is
        ending, and a two-phase sink in it waits for a final checkpoint to commit), a
        checkpoint is triggered now rather than at the next interval, so a bounded job does
        not wait up to an interval to end (min-pause and max-concurrent still apply); when one
        is pending, as soon as that one ends (``checkpoint_ended``)."""
        self.coordinator.acknowledge_finished(ex.attempt_id, (self._sid_of(ex), None))
        for checkpoint_id in sorted(self.coordinator.pending):
            # tasks the pending checkpoint waits for whose inputs have now all ended: their
            # barrier may never come (``ex`` may have finished before its snapshot), so they
            # are triggered directly, as the plan triggers such tasks
            awaiting = self.coordinator.awaiting(checkpoint_id)
            self.coordinator.trigger_tasks(checkpoint_id, [
                e.attempt_id for e in self._graph.current_executions()
                if e.attempt_id in awaiting and e.state == ExecutionState.RUNNING and self._inputs_ended(e)])
        if self._an_input_ended():
            self._final_wanted = bool(self.coordinator.pending)
            if not self._final_wanted:
                self.coordinator.trigger()

    def checkpoint_ended(self) -> None:
        """A checkpoint completed or was aborted: if a final checkpoint was wanted meanwhile
        (the pending one may have been triggered before the input ended, so it does not count as
        final for the tasks waiting), it starts now, not at the next interval."""
        if self._final_wanted and not self.coordinator.pending and self._an_input_ended():
            self._final_wanted = False
            self.coordinator.trigger()

    def _an_input_ended(self) -> bool:
        return any(ex.state == ExecutionState.RUNNING and self._inputs_ended(ex)
                   for ex in self._graph.current_executions())

    def _inputs_ended(self, ex: Execution) -> bool:
        """``ex`` has inputs, and every task upstream of it finished."""
        upstream = self._upstream[str(ex.vertex.job_vertex.vertex_id)]
        return bool(upstream) and all(sub.current.state == ExecutionState.FINISHED
                                      for up in upstream for sub in self._graph.vertices[up].subtasks)

    def drain(self, address_of: Callable[[ExecutionAttemptID], tuple[str, str] | None]) -> list[Action]:
        """The coordinator's decisions as JobMaster actions; ``address_of(attempt)`` gives the
        (resource id, rpc address) of a live task, None when it is gone."""
        out: list[Action] = []
        for action in self.coordinator.drain_actions():
            out.extend(self._translate(action, address_of))
        return out

    def _translate(self, action: CheckpointAction,
                   address_of: Callable[[ExecutionAttemptID], tuple[str, str] | None]) -> list[Action]:
        if isinstance(action, TriggerCheckpoint):
            self._finished_at.setdefault(action.checkpoint_id, self._finished_at_plan)  # not again for trigger_tasks
            out: list[Action] = []
            for attempt in action.tasks:
                where = address_of(attempt)
                if where is not None:
                    out.append(TriggerTaskCheckpoint(attempt, where[0], where[1],  # type: ignore[arg-type]
                                                     action.checkpoint_id, action.timestamp_ms, action.exactly_once,
                                                     action.stop, action.aligned_timeout_ms))
            return out
        if isinstance(action, FinalizeCheckpoint):
            states: dict[SubtaskId, SubtaskState] = {}
            for handle in action.state_handles.values():
                sid, files = cast(tuple[SubtaskId, "tuple[OperatorStateFile, ...] | None"], handle)
                states[sid] = SubtaskState(files or (), files is None)  # None: it had finished
            for sid in self._finished_at.get(action.checkpoint_id, frozenset()):
                states[sid] = SubtaskState((), True)
            self._states[action.checkpoint_id] = states
            self.shared.register(action.checkpoint_id, (f for st in states.values() for f in st.files))
            return [WriteCheckpointMetadata(action.checkpoint_id, self._metadata(action.checkpoint_id, states))]
        if isinstance(action, (NotifyCheckpointComplete, NotifyCheckpointAborted)):
            completed = isinstance(action, NotifyCheckpointComplete)
            if completed:
                self.ever_completed = True
            out = []
            for attempt in action.tasks:
                where = address_of(attempt)
                if where is not None:
                    out.append(NotifyTaskCheckpoint(attempt, where[0], where[1],  # type: ignore[arg-type]
                                                    action.checkpoint_id, completed))
            return out
        if isinstance(action, DiscardCheckpoint):
            self._states.pop(action.checkpoint_id, None)
            self._finished_at.pop(action.checkpoint_id, None)
            return [DiscardCheckpointFiles(action.checkpoint_id, self.shared.unregister(action.checkpoint_id))]
        if isinstance(action, FailJobOnCheckpoints):
            self.on_fail_job(action.reason, action.culprits)
            return []
        raise TypeError(f"unknown checkpoint action {action!r}")  # pragma: no cover

    def _metadata(self, checkpoint_id: int, states: dict[SubtaskId, SubtaskState]) -> dict[str, object]:
        return {
            "version": METADATA_VERSION, "job_id": str(self._job_graph.job_id), "checkpoint_id": checkpoint_id,
            "subtasks": {f"{sid.vertex_id}#{sid.index}": {
                "finished": st.finished,
                "files": [{"operator_index": f.operator_index, "name": f.name, "path": f.path,
                           "size_bytes": f.size_bytes} for f in st.files]}
                for sid, st in sorted(states.items())},
            # what a restore into another JobGraph (a savepoint's) maps state by: operator uids
            "vertices": {str(v.vertex_id): {"name": v.name, "parallelism": v.parallelism,
                                            "max_parallelism": v.max_parallelism,
                                            "operator_uids": list(v.operator_uids)}
                         for v in self._job_graph.vertices}}

    # -- restore -----------------------------------------------------------------------------------
    def recover(self, checkpoint_id: int, metadata: dict[str, object]) -> None:
        """Take over a completed checkpoint of an earlier leader (its ``_metadata``, already
        read and checked), oldest first: it becomes restorable like one completed here.

        Raises ValueError when ``metadata`` is not a checkpoint's metadata."""
        try:
            subtasks = cast("dict[str, dict[str, Any]]", metadata["subtasks"])
            states: dict[SubtaskId, SubtaskState] = {}
            for key, entry in subtasks.items():
                vertex, _, index = key.rpartition("#")
                files = tuple(OperatorStateFile(int(f["operator_index"]), str(f["name"]), str(f["path"]),
                                                int(f["size_bytes"])) for f in entry["files"])
                states[SubtaskId(JobVertexID(vertex), int(index))] = SubtaskState(files, bool(entry["finished"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"checkpoint {checkpoint_id}: not a checkpoint's metadata ({exc!r})") from None
        self._states[checkpoint_id] = states
        self.shared.register(checkpoint_id, (f for st in states.values() for f in st.files))
        self.coordinator.add_recovered(checkpoint_id, state_size=sum(f.size_bytes for st in states.values()
                                                                    for f in st.files))
        self.ever_completed = True

    def finished_before(self, checkpoint_id: int) -> frozenset[SubtaskId]:
        """The subtasks that had finished when checkpoint ``checkpoint_id`` was triggered (they
        are in it as finished), while it is pending or retained."""
        return self._finished_at.get(checkpoint_id) or frozenset(self.finished_in(checkpoint_id))

    def finished_in(self, checkpoint_id: int) -> set[SubtaskId]:
        """The subtasks that had finished when checkpoint ``checkpoint_id`` was taken."""
        return {sid for sid, st in self._states.get(checkpoint_id, {}).items() if st.finished}

    def restore_point(self) -> CheckpointStats | None:
        """The latest completed checkpoint not known to be unreadable."""
        for stats in reversed(self.coordinator.completed):
            if stats.checkpoint_id not in self.unreadable:
                return stats
        return None

    def restore_for(self, checkpoint_id: int, sid: SubtaskId) -> TaskRestore:
        """What subtask ``sid`` restores: its own files, and every subtask's union-list state
        (Flink: every subtask gets all of it, on every restore)."""
        states = self._states.get(checkpoint_id, {})
        st = states.get(sid)
        unions = [f for other, o in sorted(states.items()) if other.vertex_id == sid.vertex_id
                  for f in o.files if union_state(f.name)]
        if st is None:
            return TaskRestore(checkpoint_id, unions, False)
        return TaskRestore(checkpoint_id, [f for f in st.files if not union_state(f.name)] + unions, st.finished)

    def mark_unreadable(self, checkpoint_id: int) -> None:
        self.unreadable.add(checkpoint_id)
        log.warning("checkpoint %d cannot be read: restores fall back to an older one", checkpoint_id)

    def nothing_left_to_restore(self) -> bool:
        """Checkpoints completed, yet every retained one proved unreadable."""
        return self.ever_completed and self.restore_point() is None

    # -- queries -----------------------------------------------------------------------------------
    def infos(self) -> list[CheckpointInfo]:
        out = []
        for stats in self.coordinator.history[-HISTORY_SHOWN:]:
            failure = ""
            if stats.failure is not None:
                failure = stats.failure.value + (f" ({stats.failure_detail})" if stats.failure_detail else "")
            elif stats.checkpoint_id in self.unreadable:
                failure = "unreadable at restore"
            out.append(CheckpointInfo(stats.checkpoint_id, stats.status.value, stats.trigger_time_ms,
                                      self.coordinator.elapsed_ms(stats), stats.state_size, stats.alignment_ms, failure,
                                      stats.unaligned, stats.inflight_bytes, stats.num_subtasks,
                                      stats.num_acknowledged, stats.savepoint, stats.external_path, stats.discarded,
                                      stats.start_delay_ms))
        return out

    def latest_completed_id(self) -> int:
        latest = self.coordinator.latest_completed
        return latest.checkpoint_id if latest is not None else 0
