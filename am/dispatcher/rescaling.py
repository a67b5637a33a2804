"""Rescaling a running job (``yarnflow rescale JOB_ID -p N``; Flink's
``PATCH /jobs/:id/rescaling?parallelism=N``; the adaptive scheduler's rescales).

Through a checkpoint, not a savepoint (as Flink's adaptive scheduler rescales): the JobMaster
takes a checkpoint at once (``trigger_checkpoint``: a regular checkpoint of the job, started
as a savepoint would be), the job is cancelled once it completed, and the Dispatcher, instead
of recording the job as CANCELED, starts a new JobMaster for the same job id with the rescaled
JobGraph from its latest completed checkpoint (that one, or a later periodic one), made
restorable at the new parallelism beside it (``savepoint_of_checkpoint``: keyed state by
key-group range, a file source's splits and a sink's pending files round robin, the split
enumerator's unassigned splits as they were); it takes its checkpoint ids on from it. What the
job did after that checkpoint is done again, as after a failure: two-phase sinks commit it
once. The adaptive scheduler's rescale after slots were lost cancels at once and runs on from
the latest checkpoint there is (``restart_from_checkpoint``).

Which vertices change: those at the job's parallelism (the largest of its vertices'); one at
another parallelism (a non-parallel source, an operator given its own) keeps it. A changed
vertex must not go above its max parallelism (its key groups).
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING, Callable

from yarnflow.am.checkpoint.savepoints import SavepointError, read_savepoint, savepoint_of_checkpoint
from yarnflow.am.dispatcher.job_data import check_savepoint
from yarnflow.common.config import Configuration, Options
from yarnflow.common.errors import InvalidRequestError, RefusedError
from yarnflow.common.ha import HighAvailabilityServices
from yarnflow.common.ids import JobID
from yarnflow.common.messages import JobGraph
from yarnflow.common.rpc.endpoint import settle
from yarnflow.common.states import JobStatus

if TYPE_CHECKING:
    from yarnflow.am.jobmaster.job_master import JobMaster

log = logging.getLogger(__name__)


def job_parallelism(job_graph: JobGraph) -> int:
    """The job's parallelism: the largest of its vertices' (the one a rescale changes)."""
    return max(v.parallelism for v in job_graph.vertices)


def rescaled_graph(job_graph: JobGraph, parallelism: int, savepoint: str, desired: int | None = None) -> JobGraph:
    """``job_graph`` at ``parallelism`` (see the module doc), to start from ``savepoint`` (none:
    from the start). For the adaptive scheduler it keeps the parallelism the job grows back to
    (``desired``, else the one it had before its first rescale).
    Raises InvalidRequestError when a vertex cannot go there."""
    if parallelism < 1:
        raise InvalidRequestError(f"parallelism must be at least 1, not {parallelism}")
    current = max(v.parallelism for v in job_graph.vertices)
    vertices = []
    for v in job_graph.vertices:
        if v.parallelism == current:
            if parallelism > v.max_parallelism:
                raise InvalidRequestError(f"'{v.name}' has max parallelism {v.max_parallelism} (its key groups): "
                                          f"it cannot run at {parallelism}")
            v = dataclasses.replace(v, parallelism=parallelism)
        vertices.append(v)
    config = {**job_graph.config, Options.SAVEPOINT_PATH.key: savepoint,
              Options.SAVEPOINT_IGNORE_UNCLAIMED.key: "false"}
    if desired is not None:
        config[Options.ADAPTIVE_DESIRED.key] = str(desired)
    elif int(config.get(Options.ADAPTIVE_DESIRED.key) or 0) <= 0:
        config[Options.ADAPTIVE_DESIRED.key] = str(current)
    return dataclasses.replace(job_graph, vertices=vertices, config=config)


class RescaleRefused(RefusedError):
    """The job's state cannot go to that parallelism (a source that cannot be rescaled, ...): it
    runs on at its own."""


@dataclasses.dataclass
class _Rescale:
    parallelism: int
    answer: Future[int]
    savepoint: str = ""
    #: the job was cancelled to rescale (its checkpoint completed, or, the adaptive scheduler's
    #: rescale after slots were lost, at once): it runs on from its latest completed checkpoint
    from_checkpoint: bool = False
    #: a rescale by hand sets the parallelism an adaptive job grows back to
    desired: int | None = None


class Rescales:
    """The rescales in progress, for the Dispatcher (on its main thread). ``start`` begins one;
    ``take_over`` is asked when a job ends whether a rescale started a new JobMaster for it
    instead (then the end is not the job's)."""

    def __init__(self, config: Configuration, ha: HighAvailabilityServices, run_on_main: Callable[..., None],
                 start: Callable[[JobGraph, bool], None]) -> None:
        self._config = config
        self._ha = ha
        self._run_on_main = run_on_main
        self._start = start
        self._pending: dict[JobID, _Rescale] = {}

    def busy(self, job_id: JobID) -> bool:
        return job_id in self._pending

    def forget(self, job_id: JobID) -> None:
        """The job was cancelled by a user: a rescale under way does not run it on."""
        self._pending.pop(job_id, None)

    def restart_from_checkpoint(self, jm: JobMaster, parallelism: int) -> Future[int]:
        """The adaptive scheduler's rescale when the job lost slots: it is cancelled, and runs on
        at ``parallelism`` from its latest completed checkpoint (from the start without one:
        nothing was committed then), as a restart after a failure would at its old parallelism."""
        answer: Future[int] = Future()
        self._pending[jm.job_id] = _Rescale(parallelism, answer, from_checkpoint=True)
        jm.cancel()
        return answer

    def start(self, jm: JobMaster, parallelism: int, desired: int | None = None) -> Future[int]:
        """Rescale ``jm``'s job through a checkpoint taken now (by hand: ``desired`` is the
        parallelism an adaptive job then grows back to, the one asked for)."""
        job_id = jm.job_id
        if job_id in self._pending:
            raise RefusedError(f"job {job_id} is being rescaled already")
        config = self._config.with_overrides(jm.job_graph.config)
        if int(config[Options.CHECKPOINT_INTERVAL]) <= 0:
            raise RefusedError("only a job that takes checkpoints can be rescaled (set "
                               "execution.checkpointing.interval): its state moves through one")
        rescaled_graph(jm.job_graph, parallelism, "")  # refuse what cannot be, before stopping anything
        answer: Future[int] = Future()
        if parallelism == job_parallelism(jm.job_graph):
            settle(answer, parallelism)
            return answer
        rescale = self._pending[job_id] = _Rescale(parallelism, answer, desired=desired)
        log.info("rescaling job %s to parallelism %d through a checkpoint", job_id, parallelism)

        def checkpointed(done: Future[str]) -> None:  # (any thread)
            self._run_on_main(self._checkpointed, jm, rescale, done)

        jm.trigger_checkpoint().add_done_callback(checkpointed)
        return answer

    def _checkpointed(self, jm: JobMaster, rescale: _Rescale, done: Future[str]) -> None:
        if self._pending.get(jm.job_id) is not rescale:  # cancelled by a user meanwhile
            return
        exc = done.exception()
        if exc is not None:  # the job runs on at its parallelism
            self._pending.pop(jm.job_id, None)
            log.warning("rescaling job %s failed: its checkpoint did not complete: %s", jm.job_id, exc)
            settle(rescale.answer, RefusedError(f"the checkpoint to rescale through did not complete ({exc}); the "
                                                "job runs on at its parallelism"))
            return
        log.info("job %s: checkpoint %s taken to rescale through; the job is cancelled and runs on at parallelism %d",
                 jm.job_id, done.result(), rescale.parallelism)
        rescale.from_checkpoint = True
        jm.cancel()

    def take_over(self, jm: JobMaster, status: JobStatus) -> bool:
        """Job ``jm`` ended ``status``: when it is a rescale's (CANCELED for it), start the
        rescaled job and return True; else False (a rescale in progress fails with the job's
        end)."""
        rescale = self._pending.pop(jm.job_id, None)
        if rescale is None:
            return False
        if rescale.from_checkpoint and status == JobStatus.CANCELED:
            try:
                rescale.savepoint = self._latest_checkpoint(jm)
            except Exception as exc:  # noqa: BLE001 - it cannot move: on at its parallelism, recovered
                log.warning("job %s: its latest checkpoint could not be made a savepoint (%s): it runs on at its "
                            "parallelism from that checkpoint", jm.job_id, exc)
                settle(rescale.answer, RefusedError(f"its latest checkpoint could not be read to rescale: {exc}"))
                self._start(jm.job_graph, True)
                return True
        else:
            settle(rescale.answer, RefusedError(f"the job ended {status.name} while it was being rescaled"))
            return False
        graph = rescaled_graph(jm.job_graph, rescale.parallelism, rescale.savepoint, rescale.desired)
        refused = ""
        try:
            if rescale.savepoint:
                check_savepoint(self._config.with_overrides(graph.config), graph)
        except InvalidRequestError as exc:  # state that cannot go to that parallelism: on at the old one
            refused = str(exc)
            graph = rescaled_graph(jm.job_graph, job_parallelism(jm.job_graph), rescale.savepoint, rescale.desired)
        try:
            self._ha.job_graph_store().put(graph)  # a next leader recovers the rescaled job,
            self._ha.checkpoint_store(graph.job_id).clear()  # from its savepoint (JobMaster recovery)
            self._start(graph, False)
        except Exception as exc:  # noqa: BLE001 - the caller learns it; the job's end is then recorded
            settle(rescale.answer, exc)
            return False
        if refused:
            log.warning("job %s cannot be rescaled (%s): it runs on at its parallelism from %s", jm.job_id, refused,
                        rescale.savepoint)
            settle(rescale.answer, RescaleRefused(f"{refused}; the job runs on at its parallelism"))
        else:
            log.info("job %s runs on at parallelism %d from %s", jm.job_id, rescale.parallelism,
                     rescale.savepoint or "the start (it had no completed checkpoint)")
            settle(rescale.answer, rescale.parallelism)
        return True

    def _latest_checkpoint(self, jm: JobMaster) -> str:
        """A savepoint of the cancelled job's latest completed checkpoint (without one, the
        savepoint the job started from, if any: it has committed nothing since)."""
        completed = self._ha.checkpoint_store(jm.job_id).checkpoints()
        started_from = str(jm.job_graph.config.get(Options.SAVEPOINT_PATH.key) or "")
        if started_from and (not completed or completed[-1][0] <= read_savepoint(started_from)["checkpoint_id"]):
            # no checkpoint since the savepoint it started from (recorded as its first checkpoint,
            # with the savepoint's files dealt to this parallelism): that savepoint is the state
            return started_from
        if not completed:
            return ""
        savepoint = savepoint_of_checkpoint(completed[-1][1])
        if savepoint is None:
            raise SavepointError(f"{completed[-1][1]} holds no checkpoint")
        return savepoint
