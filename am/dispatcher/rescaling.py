"""Rescaling a running job by hand (``yarnflow rescale JOB_ID -p N``; Flink's
``PATCH /jobs/:id/rescaling?parallelism=N``).

The job stops at a consistent point through the stop-with-savepoint path (its sources stop, a
savepoint of that checkpoint is written into ``<job's checkpoint folder>/rescale-<k>/``, sinks
commit on its completion, the tasks end), and the Dispatcher, instead of recording the job as
FINISHED, starts a new JobMaster for the same job id with the rescaled JobGraph, which restores
that savepoint as savepoints are restored (keyed state by key-group range, a file source's
splits and a sink's pending files round robin, the split enumerator's unassigned splits as
they were) and takes its checkpoint ids on from it. The savepoint lives with the job's
checkpoints, so the job's checkpoint retention decides when it goes.

Which vertices change: those at the job's parallelism (the largest of its vertices'); one at
another parallelism (a non-parallel source, an operator given its own) keeps it. A changed
vertex must not go above its max parallelism (its key groups).
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING, Callable

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


def rescaled_graph(job_graph: JobGraph, parallelism: int, savepoint: str) -> JobGraph:
    """``job_graph`` at ``parallelism`` (see the module doc), to start from ``savepoint``.
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
    return dataclasses.replace(job_graph, vertices=vertices, config=config)


@dataclasses.dataclass
class _Rescale:
    parallelism: int
    answer: Future[int]
    savepoint: str = ""


class Rescales:
    """The rescales in progress, for the Dispatcher (on its main thread). ``start`` begins one;
    ``take_over`` is asked when a job ends whether a rescale started a new JobMaster for it
    instead (then the end is not the job's)."""

    def __init__(self, config: Configuration, ha: HighAvailabilityServices, run_on_main: Callable[..., None],
                 start: Callable[[JobGraph], None]) -> None:
        self._config = config
        self._ha = ha
        self._run_on_main = run_on_main
        self._start = start
        self._pending: dict[JobID, _Rescale] = {}
        self._count: dict[JobID, int] = {}

    def start(self, jm: JobMaster, parallelism: int) -> Future[int]:
        job_id = jm.job_id
        if job_id in self._pending:
            raise RefusedError(f"job {job_id} is being rescaled already")
        config = self._config.with_overrides(jm.job_graph.config)
        if int(config[Options.CHECKPOINT_INTERVAL]) <= 0:
            raise RefusedError("only a job that takes checkpoints can be rescaled (set "
                               "execution.checkpointing.interval): its state moves through one")
        rescaled_graph(jm.job_graph, parallelism, "")  # refuse what cannot be, before stopping anything
        answer: Future[int] = Future()
        if parallelism == max(v.parallelism for v in jm.job_graph.vertices):
            settle(answer, parallelism)
            return answer
        self._count[job_id] = self._count.get(job_id, 0) + 1
        target = f"{jm.checkpoint_dir.rstrip('/')}/rescale-{self._count[job_id]}"
        rescale = self._pending[job_id] = _Rescale(parallelism, answer)
        log.info("rescaling job %s to parallelism %d: stopping it with a savepoint into %s", job_id, parallelism,
                 target)

        def stopped(done: Future[str]) -> None:  # (any thread)
            self._run_on_main(self._stopped, job_id, rescale, done)

        jm.trigger_savepoint(target, stop="stop").add_done_callback(stopped)
        return answer

    def _stopped(self, job_id: JobID, rescale: _Rescale, done: Future[str]) -> None:
        exc = done.exception()
        if exc is not None:  # the job runs on at its parallelism
            self._pending.pop(job_id, None)
            log.warning("rescaling job %s failed: its stop with a savepoint did not complete: %s", job_id, exc)
            settle(rescale.answer, RefusedError(f"the job could not be stopped at a consistent point ({exc}); it "
                                                "runs on at its parallelism"))
            return
        rescale.savepoint = done.result()

    def take_over(self, jm: JobMaster, status: JobStatus) -> bool:
        """Job ``jm`` ended ``status``: when it is a rescale's stop (FINISHED after its
        savepoint), start the rescaled job and return True; else False (a rescale in progress
        fails with the job's end)."""
        rescale = self._pending.pop(jm.job_id, None)
        if rescale is None:
            return False
        if status != JobStatus.FINISHED or not rescale.savepoint:
            settle(rescale.answer, RefusedError(f"the job ended {status.name} while it was being rescaled"))
            return False
        graph = rescaled_graph(jm.job_graph, rescale.parallelism, rescale.savepoint)
        refused = ""
        try:
            check_savepoint(self._config.with_overrides(graph.config), graph)
        except InvalidRequestError as exc:  # state that cannot go to that parallelism: on at the old one
            refused = str(exc)
            graph = rescaled_graph(jm.job_graph, max(v.parallelism for v in jm.job_graph.vertices), rescale.savepoint)
        try:
            self._ha.job_graph_store().put(graph)  # a next leader recovers the rescaled job,
            self._ha.checkpoint_store(graph.job_id).clear()  # from its savepoint (JobMaster recovery)
            self._start(graph)
        except Exception as exc:  # noqa: BLE001 - the caller learns it; the job's end is then recorded
            settle(rescale.answer, exc)
            return False
        if refused:
            log.warning("job %s cannot be rescaled (%s): it runs on at its parallelism from %s", jm.job_id, refused,
                        rescale.savepoint)
            settle(rescale.answer, RefusedError(f"{refused}; the job runs on at its parallelism"))
        else:
            log.info("job %s runs on at parallelism %d from %s", jm.job_id, rescale.parallelism, rescale.savepoint)
            settle(rescale.answer, rescale.parallelism)
        return True
