"""The adaptive scheduler and reactive mode (Flink's ``jobmanager.scheduler: adaptive`` and
``scheduler-mode: reactive``), for the Dispatcher.

A job with the adaptive scheduler runs at the parallelism the cluster's slots allow, up to its
desired parallelism (``jobmanager.adaptive-scheduler.desired-parallelism``: by default the one
it was submitted with; in reactive mode its max parallelism, so it takes every slot). Every
``CHECK_MS`` the Dispatcher compares each such job's parallelism with the slots it could use
(the ResourceManager's free slots and its own, on TaskExecutors that reported):

- fewer than it runs at (a TaskExecutor was lost, or its slots never came): when no worker is
  being started for ``resource-stabilization-timeout`` (0 in reactive mode), or workers are
  being started but do not come within ``resource-wait-timeout``, the job is cancelled and runs
  on under the same id at the parallelism of the slots it has, from its latest completed
  checkpoint (``Rescales.restart_from_checkpoint``: keyed state dealt by key group, source
  splits and pending sink files as a savepoint's, so nothing is lost or repeated);
- at least ``min-parallelism-increase`` more, below its desired parallelism, with every task
  running and ``scaling-interval.min`` since its last rescale (none before its first: a reactive
  job takes a session's slots as soon as it runs): it is rescaled up through a checkpoint taken
  then, as ``yarnflow rescale`` does.

Only the vertices at the job's parallelism change (``rescaling.py``). A job whose state cannot
move to another parallelism (a collection source) is not tried again after it was refused once.

Flink decides all this inside its JobMaster (the AdaptiveScheduler's states WaitingForResources,
Executing, Restarting); here one JobMaster runs one parallelism and the Dispatcher replaces it,
which reuses the savepoint rescaling that is tested end to end, at the cost of a new JobMaster
(~0.5 s) per rescale.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from yarnflow.am.dispatcher.rescaling import RescaleRefused, Rescales, job_parallelism
from yarnflow.common.config import Configuration, Options
from yarnflow.common.ids import JobID
from yarnflow.common.rpc.endpoint import MainThreadExecutor
from yarnflow.common.states import ExecutionState, JobStatus

if TYPE_CHECKING:
    from yarnflow.am.jobmaster.job_master import JobMaster
    from yarnflow.am.resourcemanager.resource_manager import ResourceManager

log = logging.getLogger(__name__)

CHECK_MS = 250


@dataclass
class _Watch:
    """What the scheduler knows of one adaptive job."""

    desired: int
    short_since_ms: int | None = None  # since when it has had fewer usable slots than it runs at
    last_rescale_ms: int | None = None  # None: not rescaled yet (the first growth need not wait)
    refused: str = ""  # a rescale was refused for good: the job stays at its parallelism
    reason: str = ""   # why it is not at its desired parallelism (for its status and the logs)


class AdaptiveScaling:
    """On the Dispatcher's main thread: ``running`` is its map of running JobMasters."""

    def __init__(self, config: Configuration, rm: ResourceManager, rescales: Rescales,
                 running: Mapping[JobID, JobMaster], main: MainThreadExecutor) -> None:
        self._config = config
        self._rm = rm
        self._rescales = rescales
        self._running = running
        self._main = main
        self._jobs: dict[JobID, _Watch] = {}
        self._configs: dict[JobID, tuple[JobMaster, Configuration | None]] = {}
        self._failing = ""
        self._main.schedule(CHECK_MS, self._tick)

    def reason(self, job_id: JobID) -> str:
        watch = self._jobs.get(job_id)
        return watch.reason if watch is not None else ""

    def _tick(self) -> None:
        try:
            self._check_all()
            self._failing = ""
        except Exception as exc:  # noqa: BLE001 - the scheduler must keep checking (logged once a kind)
            if repr(exc) != self._failing:
                log.warning("the adaptive scheduler's check failed: %r", exc, exc_info=True)
            self._failing = repr(exc)
        if not self._main.stopped:
            self._main.schedule(CHECK_MS, self._tick)

    def _config_of(self, job_id: JobID, jm: JobMaster) -> Configuration | None:
        """The job's configuration when it is adaptive or reactive, else None (worked out once
        per JobMaster: a session may run many jobs, checked 4 times a second)."""
        cached = self._configs.get(job_id)
        if cached is None or cached[0] is not jm:
            config = self._config.with_overrides(jm.job_graph.config)
            elastic = config[Options.SCHEDULER_MODE] == "reactive" or config[Options.SCHEDULER] == "adaptive"
            cached = self._configs[job_id] = (jm, config if elastic else None)
        return cached[1]

    def _check_all(self) -> None:
        for job_id in [j for j in self._jobs if j not in self._running and not self._rescales.busy(j)]:
            del self._jobs[job_id]  # ended
        for job_id in [j for j in self._configs if j not in self._running]:
            del self._configs[job_id]
        for job_id, jm in list(self._running.items()):
            config = self._config_of(job_id, jm)
            if config is None:
                continue
            reactive = config[Options.SCHEDULER_MODE] == "reactive"
            if self._rescales.busy(job_id):
                continue
            watch = self._jobs.get(job_id)
            if watch is None:
                watch = self._jobs[job_id] = _Watch(self._desired(config, jm, reactive))
            if not watch.refused:
                self._check(jm, watch, config, reactive)
            jm.scaling = (f"{'reactive' if reactive else 'adaptive'}: parallelism {job_parallelism(jm.job_graph)}, "
                          f"desired {watch.desired}" + (f"; {watch.reason}" if watch.reason else ""))

    @staticmethod
    def _desired(config: Configuration, jm: JobMaster, reactive: bool) -> int:
        current = job_parallelism(jm.job_graph)
        at_job_parallelism = [v for v in jm.job_graph.vertices if v.parallelism == current]
        ceiling = min(v.max_parallelism for v in at_job_parallelism)
        if reactive:
            return ceiling
        return min(ceiling, config[Options.ADAPTIVE_DESIRED] or current)

    @staticmethod
    def _now() -> int:
        return int(time.monotonic() * 1000)

    def _check(self, jm: JobMaster, watch: _Watch, config: Configuration, reactive: bool) -> None:
        current = job_parallelism(jm.job_graph)
        usable, coming = self._rm.slots_for_job(jm.job_id)
        now = self._now()
        if usable < current:
            if watch.short_since_ms is None:
                watch.short_since_ms = now
                log.info("job %s runs at parallelism %d; %d slots can be used now%s", jm.job_id, current, usable,
                         f", {coming} are being started" if coming else "")
            waited = now - watch.short_since_ms
            patience = (config[Options.ADAPTIVE_RESOURCE_WAIT] if coming
                        else 0 if reactive else config[Options.ADAPTIVE_STABILIZATION])
            watch.reason = (f"short of slots: {usable} of {current}" +
                            (f", waiting for {coming} being started" if coming else ""))
            if usable >= 1 and waited >= patience:
                self._rescale(jm, watch, usable, down=True)
            return
        watch.short_since_ms = None
        target = min(usable, watch.desired)
        if target <= current:
            watch.reason = "" if current >= watch.desired else f"waiting for slots to grow to {watch.desired}"
            return
        if target - current < config[Options.ADAPTIVE_MIN_INCREASE]:
            watch.reason = (f"{target - current} more slots: below "
                            f"jobmanager.adaptive-scheduler.min-parallelism-increase")
            return
        if watch.last_rescale_ms is not None and now - watch.last_rescale_ms < config[Options.ADAPTIVE_SCALING_INTERVAL]:
            watch.reason = "slots to grow: waiting for jobmanager.adaptive-scheduler.scaling-interval.min"
            return
        info = jm.status_info()
        if info.status != JobStatus.RUNNING or any(
                n for v in info.vertices for state, n in v.state_counts.items() if state != ExecutionState.RUNNING
                and state != ExecutionState.FINISHED):
            watch.reason = "slots to grow: waiting for every task to run"
            return
        if any(v.state_counts.get(ExecutionState.FINISHED) for v in info.vertices):
            watch.reason = "not rescaled up: part of the job has finished"
            return
        self._rescale(jm, watch, target, down=False)

    def _rescale(self, jm: JobMaster, watch: _Watch, parallelism: int, down: bool) -> None:
        current = job_parallelism(jm.job_graph)
        watch.last_rescale_ms, watch.short_since_ms = self._now(), None
        watch.reason = f"rescaling from {current} to {parallelism}"
        if down:
            log.warning("job %s: %s slots can be used, it runs at %d: it runs on at parallelism %d from its latest "
                        "checkpoint (the adaptive scheduler)", jm.job_id, parallelism, current, parallelism)
            answer = self._rescales.restart_from_checkpoint(jm, parallelism)
        else:
            log.info("job %s: %d slots can be used: rescaling it from %d to %d through a checkpoint (the adaptive "
                     "scheduler)", jm.job_id, parallelism, current, parallelism)
            try:
                answer = self._rescales.start(jm, parallelism)
            except Exception as exc:  # noqa: BLE001 - refused at once (no checkpoints): not tried again
                self._refused(jm.job_id, watch, str(exc))
                return
        job_id = jm.job_id
        answer.add_done_callback(lambda done: self._main.execute(self._answered, job_id, watch, done))

    def _answered(self, job_id: JobID, watch: _Watch, done: Future[int]) -> None:
        exc = done.exception()
        if exc is None:
            watch.reason = ""
            watch.last_rescale_ms = self._now()
        elif isinstance(exc, RescaleRefused):
            self._refused(job_id, watch, str(exc))  # its state cannot move: not again
        else:
            watch.reason = f"the last rescale failed: {exc}"

    @staticmethod
    def _refused(job_id: JobID, watch: _Watch, why: str) -> None:
        watch.refused = watch.reason = f"cannot be rescaled: {why}"
        log.warning("job %s stays at its parallelism: %s", job_id, why)
