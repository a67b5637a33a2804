"""State enums, each with its transitions and terminal states (values match the Thrift IDL).

ExecutionState (one attempt of one subtask), as in Flink::

    CREATED -> SCHEDULED -> DEPLOYING -> INITIALIZING -> RUNNING -> FINISHED
       |           |            |             |            |
       +-----------+------------+-------------+------------+--> CANCELING -> CANCELED
       +-----------+------------+-------------+------------+--> FAILED
    (CANCELING may still end FAILED or FINISHED when the task reports so first.)
    CREATED -> RECONCILING -> DEPLOYING | INITIALIZING | RUNNING | FINISHED  (a new leader takes
    over an attempt that kept running), or -> CANCELED / FAILED (it is restarted)

JobStatus::

    INITIALIZING -> CREATED -> RUNNING -> FINISHED
                       |          |--> FAILING -> FAILED | RESTARTING
                       |          |--> CANCELLING -> CANCELED
                       +--> CANCELLING / FAILED            RESTARTING -> RUNNING | FAILING
    (a global failure during a restart's backoff fails the job: RESTARTING -> FAILING)
    every state that is not globally terminal --> SUSPENDED: this AppMaster lost the
    leadership; the job goes on under the new leader (so SUSPENDED is not globally terminal)
"""

from __future__ import annotations

import enum

from yarnflow.common.errors import IllegalStateTransition


class ExecutionState(enum.IntEnum):
    CREATED = 0
    SCHEDULED = 1
    DEPLOYING = 2
    INITIALIZING = 3
    RUNNING = 4
    FINISHED = 5
    CANCELING = 6
    CANCELED = 7
    FAILED = 8
    #: a new JobMaster leader asks the TaskExecutors whether the task still runs (Flink's)
    RECONCILING = 9

    @property
    def is_terminal(self) -> bool:
        return self in (ExecutionState.FINISHED, ExecutionState.CANCELED, ExecutionState.FAILED)

    def can_move_to(self, target: ExecutionState) -> bool:
        return target in _EXECUTION_TRANSITIONS[self]

    def check_move_to(self, target: ExecutionState, what: str = "execution") -> None:
        if not self.can_move_to(target):
            raise IllegalStateTransition(f"{what}: illegal transition {self.name} -> {target.name}")


_E = ExecutionState
_EXECUTION_TRANSITIONS: dict[ExecutionState, frozenset[ExecutionState]] = {
    _E.CREATED: frozenset({_E.SCHEDULED, _E.RECONCILING, _E.CANCELED, _E.FAILED}),
    # reconciled (Flink's RECONCILING -> INITIALIZING | RUNNING | FINISHED | CANCELED | FAILED): the
    # task runs on in its reported state (one still deploying on its TaskExecutor is INITIALIZING),
    # or it is restarted (CANCELED); CANCELING: a cancel while reconciling cancels the task where it
    # runs, as Flink's Execution.cancel does from any state in which a task may run
    _E.RECONCILING: frozenset({_E.INITIALIZING, _E.RUNNING, _E.FINISHED, _E.CANCELING, _E.CANCELED, _E.FAILED}),
    _E.SCHEDULED: frozenset({_E.DEPLOYING, _E.CANCELED, _E.FAILED}),
    # FINISHED from DEPLOYING or INITIALIZING: Flink's Execution.markFinished takes a task that
    # ended before its earlier updates came (a quick task's FINISHED may be the first one seen)
    _E.DEPLOYING: frozenset({_E.INITIALIZING, _E.FINISHED, _E.CANCELING, _E.FAILED}),
    _E.INITIALIZING: frozenset({_E.RUNNING, _E.FINISHED, _E.CANCELING, _E.FAILED}),
    _E.RUNNING: frozenset({_E.FINISHED, _E.CANCELING, _E.FAILED}),
    # a task that finishes while it is being cancelled ends CANCELED (Flink's markFinished)
    _E.CANCELING: frozenset({_E.CANCELED, _E.FAILED}),
    _E.FINISHED: frozenset(),
    _E.CANCELED: frozenset(),
    _E.FAILED: frozenset(),
}


class JobStatus(enum.IntEnum):
    INITIALIZING = 0
    CREATED = 1
    RUNNING = 2
    FAILING = 3
    FAILED = 4
    CANCELLING = 5
    CANCELED = 6
    FINISHED = 7
    RESTARTING = 8
    SUSPENDED = 9

    @property
    def is_globally_terminal(self) -> bool:
        return self in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED)

    def can_move_to(self, target: JobStatus) -> bool:
        return target in _JOB_TRANSITIONS[self]

    def check_move_to(self, target: JobStatus, what: str = "job") -> None:
        if not self.can_move_to(target):
            raise IllegalStateTransition(f"{what}: illegal transition {self.name} -> {target.name}")


#: a task as its TaskExecutor runs it (``worker/task.py``): deployed, its chain built, running,
#: and one outcome (a cancelled task ends CANCELED whatever it was doing; the JobMaster's view of
#: the same attempt, with SCHEDULED and CANCELING, is ``ExecutionState``'s table above)
TASK_TRANSITIONS: dict[ExecutionState, frozenset[ExecutionState]] = {
    _E.CREATED: frozenset({_E.DEPLOYING}),
    _E.SCHEDULED: frozenset({_E.DEPLOYING}),
    _E.DEPLOYING: frozenset({_E.INITIALIZING, _E.CANCELED, _E.FAILED}),
    _E.INITIALIZING: frozenset({_E.RUNNING, _E.CANCELED, _E.FAILED}),
    _E.RUNNING: frozenset({_E.FINISHED, _E.CANCELED, _E.FAILED}),
    _E.CANCELING: frozenset({_E.CANCELED}),
    _E.RECONCILING: frozenset(),  # (the JobMaster's only)
    _E.FINISHED: frozenset(),
    _E.CANCELED: frozenset(),
    _E.FAILED: frozenset(),
}

_J = JobStatus
_JOB_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    _J.INITIALIZING: frozenset({_J.CREATED, _J.FAILED, _J.CANCELED, _J.SUSPENDED}),
    _J.CREATED: frozenset({_J.RUNNING, _J.CANCELLING, _J.FAILING, _J.FAILED, _J.CANCELED, _J.SUSPENDED}),
    _J.RUNNING: frozenset({_J.FINISHED, _J.FAILING, _J.CANCELLING, _J.RESTARTING, _J.SUSPENDED}),
    _J.FAILING: frozenset({_J.FAILED, _J.RESTARTING, _J.CANCELLING, _J.SUSPENDED}),
    _J.RESTARTING: frozenset({_J.RUNNING, _J.CREATED, _J.CANCELLING, _J.FAILING, _J.FAILED, _J.SUSPENDED}),
    _J.CANCELLING: frozenset({_J.CANCELED, _J.FAILED, _J.SUSPENDED}),
    _J.FINISHED: frozenset(),
    _J.FAILED: frozenset(),
    _J.CANCELED: frozenset(),
    _J.SUSPENDED: frozenset(),
}


class Partitioner(enum.IntEnum):
    """How records reach the consumers of an exchange (Flink's partitioners; see the IDL)."""

    FORWARD = 0
    HASH = 1
    REBALANCE = 2
    BROADCAST = 3
    SHUFFLE = 4
    RESCALE = 5
    GLOBAL = 6
    CUSTOM = 7

    @property
    def deterministic(self) -> bool:
        """Whether a producer run again sends each record to the same consumer (a blocking
        exchange's consumers then need not all run again)."""
        return self not in (Partitioner.REBALANCE, Partitioner.SHUFFLE, Partitioner.RESCALE)


class ExchangeMode(enum.IntEnum):
    """How a JobEdge's records reach its consumers: PIPELINED as they are produced; BLOCKING
    written to the producer TaskExecutor's disk and read once the producer finished;
    BLOCKING_PERSISTENT likewise, but written to the job's storage dir (fsspec), so the result
    outlives the producer's TaskExecutor (a Spark stage's inputs and output: its files are in
    storage already, and losing the driver's TaskExecutor must not re-run the upstream)."""

    PIPELINED = 0
    BLOCKING = 1
    BLOCKING_PERSISTENT = 2

    @property
    def is_blocking(self) -> bool:
        return self != ExchangeMode.PIPELINED
