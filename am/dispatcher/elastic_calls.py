"""The Dispatcher's calls that save, move and resize running work: savepoints, stop with a
savepoint, rescaling a job by hand and scaling a session (a mixin of ``Dispatcher``, on its
main thread like every call of it)."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING

from yarnflow.common.config import Configuration, Options
from yarnflow.common.errors import InvalidRequestError
from yarnflow.common.ids import JobID
from yarnflow.common.rpc.endpoint import fenced

if TYPE_CHECKING:
    from yarnflow.am.dispatcher.rescaling import Rescales
    from yarnflow.am.jobmaster.job_master import JobMaster
    from yarnflow.am.resourcemanager.resource_manager import ResourceManager

log = logging.getLogger(__name__)


class ElasticCalls:
    _config: Configuration
    _rescales: Rescales
    _rm: ResourceManager

    def _running_job(self, job_id: JobID) -> JobMaster:
        raise NotImplementedError  # the Dispatcher's

    @fenced()
    def trigger_savepoint(self, job_id: JobID, target_dir: str, stop: str = "") -> Future[str]:
        """A savepoint of the running job into a new folder under ``target_dir`` (default:
        ``state.savepoints.dir``); answers its URL once written. ``stop``: see
        ``stop_with_savepoint``."""
        jm = self._running_job(job_id)
        target = target_dir or str(self._config.with_overrides(jm.job_graph.config)[Options.SAVEPOINTS_DIR])
        if not target:
            raise InvalidRequestError("no savepoint folder: give one (yarnflow savepoint JOB_ID DIR) or set "
                                      "state.savepoints.dir")
        log.info("%s of job %s into %s", f"stop-with-savepoint ({stop})" if stop else "savepoint", job_id, target)
        return jm.trigger_savepoint(target, stop=stop)

    @fenced()
    def stop_with_savepoint(self, job_id: JobID, target_dir: str, drain: bool) -> Future[str]:
        """Stop the running job with a savepoint (its sources stop; with ``drain`` every timer
        and window fires first); answers the savepoint's URL once it is complete, after which
        the job's tasks end and it reaches FINISHED."""
        return self.trigger_savepoint(job_id, target_dir, stop="drain" if drain else "stop")

    @fenced()
    def rescale_job(self, job_id: JobID, parallelism: int) -> Future[int]:
        """Rescale the running job (``rescaling.py``); answers the new parallelism once it runs
        (for the adaptive scheduler, also the parallelism the job grows back to)."""
        return self._rescales.start(self._running_job(job_id), parallelism, desired=parallelism)

    @fenced()
    def scale_session(self, taskexecutors: int) -> int:
        """The cluster runs ``taskexecutors`` TaskExecutors from now on (``yarnflow session
        scale``): YARN containers or local processes are started or released
        (``SlotManager.scale_to``); jobs with the adaptive scheduler or in reactive mode follow."""
        if taskexecutors < 0:
            raise InvalidRequestError(f"a cluster cannot run {taskexecutors} TaskExecutors")
        return self._rm.scale_to(taskexecutors)
