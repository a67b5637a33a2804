"""Dispatcher: accepts jobs, starts a JobMaster for each, answers list / get / cancel, keeps
the results of ended jobs, and waits for results on behalf of clients.

Fencing: the Dispatcher has a leader session id (``fencing_token``), given to clients by
``cluster_info``; every call that acts on a job or the cluster carries it and is refused with
FencingTokenError when it is another one (a client still talking to a deposed leader). The
check is the endpoint base's (``RpcEndpoint``, the methods marked ``@fenced``); calls from the
AppMaster itself (REST, the per-job entry point) are not fenced.

The Dispatcher only dispatches: each JobMaster is served as a service of its own on the
AppMaster's port (``jobmaster/<job id>``, registered on ``rpc_server`` while the job runs), so
TaskExecutors call it directly.

High availability (``common/ha``): a submitted job's JobGraph goes into the JobGraphStore before
its JobMaster starts. When a job reaches a globally terminal state its result goes into the
JobResultStore, then its JobGraph, checkpoint pointers and checkpoint id counter are removed, and
its intermediate data (stored result partitions, Spark stages' files) deleted; the
result entry goes once a client fetched it, or after ``job-result-store.retention``. A new leader
calls ``recover_jobs``: jobs with a result are not run again (their leftovers are cleaned up),
every other stored job gets a JobMaster that resumes it from its latest checkpoint. On losing the
leadership, ``suspend_all`` suspends every JobMaster and writes nothing."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import fsspec

from yarnflow.common.version import __version__
from yarnflow.am.checkpoint.savepoints import SavepointError, read_savepoint, restore_metadata
from yarnflow.am.jobmaster.job_master import JobMaster
from yarnflow.am.resourcemanager.resource_manager import ResourceManager
from yarnflow.common.config import Configuration
from yarnflow.common.config import Options
from yarnflow.common.errors import (
    HighAvailabilityError,
    InvalidRequestError,
    NotFoundError,
    NotLeaderError,
    NotLeaderRpcError,
    RefusedError,
    UnavailableError,
)
from yarnflow.common.ha import EmbeddedHaServices, HighAvailabilityServices, JobResultEntry
from yarnflow.common.ids import JobID, LeaderSessionID
from yarnflow.common.messages import ClusterInfo, ErrorInfo, JobGraph, JobResult, JobStatusInfo
from yarnflow.common.rpc.endpoint import RpcEndpoint, fenced, rpc
from yarnflow.common.rpc.gateways import job_master_service
from yarnflow.common.rpc.server import RpcServer
from yarnflow.common.artifacts import ArtifactCache
from yarnflow.common.states import JobStatus

log = logging.getLogger(__name__)


#: (job graph, recover from the latest checkpoint?, called when the job ended here) -> a JobMaster
#: not yet started
JobMasterFactory = Callable[[JobGraph, bool, Callable[[JobMaster], None]], JobMaster]


def job_storage_dir(storage_dir: str, job_id: str) -> str:
    return f"{storage_dir.rstrip('/')}/jobs/{job_id}"


#: what an ended job's storage dir holds that nobody reads any more: the stored (BLOCKING_PERSISTENT)
#: result partitions and the Spark stages' input and output files. Its collected rows, Spark
#: reports and checkpoints (by their retention) stay.
INTERMEDIATE_DIRS = ("partitions", "intermediate")


def delete_intermediate_data(job_dir: str) -> None:
    """Delete an ended job's intermediate data (``INTERMEDIATE_DIRS`` under its storage dir, on
    any fsspec filesystem); a failure is logged, never raised."""
    for name in INTERMEDIATE_DIRS:
        url = f"{job_dir.rstrip('/')}/{name}"
        try:
            fs, path = fsspec.core.url_to_fs(url)
            if fs.exists(path):
                fs.rm(path, recursive=True)
                log.info("deleted the ended job's %s", url)
        except Exception:  # noqa: BLE001 - any filesystem's error; the data is only garbage now
            log.warning("could not delete %s", url, exc_info=True)


class Dispatcher(RpcEndpoint):
    """Its RPCs run on the caller's thread (``main_thread`` None): waiting for a job's result or
    a savepoint blocks only that caller; its state is guarded by ``_lock``."""

    def __init__(self, config: Configuration, rm: ResourceManager, cluster_id: str, storage_dir: str, target: str,
                 on_shutdown: Callable[[], None], artifacts: ArtifactCache, *,
                 ha: HighAvailabilityServices | None = None, fencing_token: str | None = None,
                 is_leader: Callable[[], bool] | None = None, rpc_server: RpcServer | None = None,
                 job_master_factory: JobMasterFactory | None = None) -> None:
        super().__init__("Dispatcher", None)
        self._rpc_server = rpc_server
        self._new_job_master = job_master_factory or self._default_job_master
        self._ha = ha or EmbeddedHaServices()
        self._is_leader = is_leader or (lambda: True)
        self._retention_ms = config[Options.JOB_RESULT_RETENTION]
        self._suspended: set[JobID] = set()
        self._retention_timer: threading.Timer | None = None
        self._artifacts = artifacts
        self._config = config
        self._rm = rm
        self._cluster_id = cluster_id
        self._storage_dir = storage_dir
        self._target = target
        self._on_shutdown = on_shutdown
        self._lock = threading.Lock()
        self._done_fetching = threading.Condition(self._lock)
        self._running: dict[JobID, JobMaster] = {}
        self._ended: dict[JobID, tuple[JobStatusInfo, JobResult]] = {}
        self._done: dict[JobID, threading.Event] = {}
        self.address = ""
        self.web_url = ""  # the REST API and web UI, when served
        #: the JobGraphs of ended jobs (for their plan in the REST API)
        self._graphs: dict[JobID, JobGraph] = {}
        self._accepting = True
        self.fencing_token = fencing_token or LeaderSessionID.generate()
        #: a per-job application keeps its job's result in the JobResultStore after a client
        #: fetched it: a next application attempt must find it rather than run the job again
        self.drop_fetched_results = True
        self._fetched: set[JobID] = set()

    # -- DispatcherService ------------------------------------------------------------------
    @fenced()
    def submit_job(self, job_graph: JobGraph) -> JobID:
        if not self._accepting:
            raise UnavailableError("the cluster is shutting down")
        job_graph.validate()
        if not job_graph.artifact_uri:
            raise InvalidRequestError("the JobGraph names no job artifact")
        try:
            exists = fsspec.core.url_to_fs(job_graph.artifact_uri)[0].exists(job_graph.artifact_uri)
        except (OSError, ValueError) as exc:
            raise InvalidRequestError(f"cannot check the job artifact {job_graph.artifact_uri}: {exc}") from None
        if not exists:
            raise InvalidRequestError(f"the job artifact {job_graph.artifact_uri} does not exist")
        self._check_savepoint(job_graph)
        with self._lock:
            if job_graph.job_id in self._running or job_graph.job_id in self._ended:
                raise RefusedError(f"job {job_graph.job_id} was already submitted")
            try:
                self._ha.job_graph_store().put(job_graph)
            except NotLeaderError as exc:
                raise NotLeaderRpcError(f"this AppMaster no longer leads the cluster: {exc}") from None
            jm = self._job_master(job_graph, recover=False)
        log.info("job %s (%s) submitted: %d vertices", job_graph.name, job_graph.job_id, len(job_graph.vertices))
        jm.start()
        return job_graph.job_id

    def _check_savepoint(self, job_graph: JobGraph) -> None:
        """Refuse a job that is to start from a savepoint it cannot use, before it is accepted."""
        config = self._config.with_overrides(job_graph.config)
        path = str(config[Options.SAVEPOINT_PATH])
        if not path:
            return
        try:
            restore_metadata(read_savepoint(path), job_graph, bool(config[Options.SAVEPOINT_IGNORE_UNCLAIMED]))
        except SavepointError as exc:
            raise InvalidRequestError(str(exc)) from None
        if int(config[Options.CHECKPOINT_INTERVAL]) <= 0:
            raise InvalidRequestError("a job started from a savepoint must take checkpoints: set "
                                      "execution.checkpointing.interval (a STREAMING job)")

    @fenced()
    def trigger_savepoint(self, job_id: JobID, target_dir: str, stop: str = "") -> str:
        """A savepoint of the running job into a new folder under ``target_dir`` (default:
        ``state.savepoints.dir``); returns its URL. ``stop``: see ``stop_with_savepoint``."""
        jm = self._running_job(job_id)
        target = target_dir or str(self._config.with_overrides(jm.job_graph.config)[Options.SAVEPOINTS_DIR])
        if not target:
            raise InvalidRequestError("no savepoint folder: give one (yarnflow savepoint JOB_ID DIR) or set "
                                      "state.savepoints.dir")
        log.info("%s of job %s into %s", f"stop-with-savepoint ({stop})" if stop else "savepoint", job_id, target)
        return jm.trigger_savepoint(target, stop=stop)

    @fenced()
    def stop_with_savepoint(self, job_id: JobID, target_dir: str, drain: bool) -> str:
        """Stop the running job with a savepoint (its sources stop; with ``drain`` every timer
        and window fires first); returns the savepoint's URL once it is complete, after which
        the job's tasks end and it reaches FINISHED."""
        return self.trigger_savepoint(job_id, target_dir, stop="drain" if drain else "stop")

    def _default_job_master(self, job_graph: JobGraph, recover: bool,
                            on_terminal: Callable[[JobMaster], None]) -> JobMaster:
        return JobMaster(job_graph, self._config, self._rm, self.address,
                         job_storage_dir(self._storage_dir, job_graph.job_id), on_terminal, self._artifacts,
                         checkpoints_dir=f"{self._storage_dir.rstrip('/')}/checkpoints", ha=self._ha,
                         is_leader=self._is_leader, recover=recover)

    def _job_master(self, job_graph: JobGraph, recover: bool) -> JobMaster:
        """A JobMaster for ``job_graph``, registered as running (call under the lock)."""
        jm = self._new_job_master(job_graph, recover, self._job_ended)
        self._running[job_graph.job_id] = jm
        self._done.setdefault(job_graph.job_id, threading.Event())
        if self._rpc_server is not None:
            self._rpc_server.register(job_master_service(jm.job_id), jm.handler)
        return jm

    def _unserve(self, jm: JobMaster) -> None:
        """The job ended here: its JobMaster's service goes (a TaskExecutor's call is answered
        NOT_FOUND by the AppMaster from now on, and it frees the job's slots)."""
        if self._rpc_server is not None:
            self._rpc_server.unregister(job_master_service(jm.job_id), jm.handler)

    # -- leadership -----------------------------------------------------------------------------
    def recover_jobs(self) -> list[JobID]:
        """As the new leader: take in the results of ended jobs and resume every stored job that
        has none (from its latest checkpoint). Returns the ids of the jobs resumed."""
        results = self._ha.job_result_store()
        graphs = self._ha.job_graph_store()
        for job_id in results.job_ids():
            entry = results.get(job_id)
            if entry is not None:
                self._take_in_result(entry)
        started: list[JobMaster] = []
        for job_id in graphs.job_ids():
            if results.get(job_id) is not None:
                log.info("job %s has a result already: it is not run again", job_id)
                self._clean_up(JobID(job_id))
                continue
            try:
                job_graph = graphs.get(job_id)
            except (HighAvailabilityError, NotFoundError) as exc:
                log.error("job %s cannot be recovered: %s", job_id, exc)
                self._fail_unrecoverable(JobID(job_id), exc)
                continue
            with self._lock:
                if job_graph.job_id in self._running:
                    continue
                started.append(self._job_master(job_graph, recover=True))
            log.info("recovering job %s (%s)", job_graph.name, job_graph.job_id)
        for jm in started:
            jm.start()
        self._schedule_retention()
        return [jm.job_id for jm in started]

    def _take_in_result(self, entry: JobResultEntry) -> None:
        result = entry.result
        info = JobStatusInfo(result.job_id, entry.extra.get("name", ""), result.status, result.start_time_ms,
                             result.end_time_ms, failure_cause=result.failure_cause)
        with self._lock:
            self._ended[result.job_id] = (info, result)
            self._done.setdefault(result.job_id, threading.Event()).set()

    def _fail_unrecoverable(self, job_id: JobID, exc: Exception) -> None:
        now = int(time.time() * 1000)
        result = JobResult(job_id, JobStatus.FAILED, now, now, ErrorInfo.from_exception(
            exc, f"recovering job {job_id} after a change of leader"))
        try:
            self._ha.job_result_store().put(JobResultEntry(result, now))
        except NotLeaderError:
            return
        self._take_in_result(JobResultEntry(result, now))
        self._clean_up(job_id)

    def suspend_all(self, reason: str) -> None:
        """Leadership lost: every JobMaster is suspended (nothing is written for any job)."""
        self._accepting = False
        if self._retention_timer is not None:
            self._retention_timer.cancel()
        for jm in self.running_job_masters():
            jm.suspend(reason)

    def _clean_up(self, job_id: JobID) -> None:
        """Forget the HA data of an ended job (its result stays in the JobResultStore) and delete
        its intermediate data in the job's storage dir (in the background)."""
        try:
            self._ha.job_graph_store().remove(job_id)
            self._ha.checkpoint_store(job_id).clear()
            self._ha.checkpoint_id_counter(job_id).remove()
        except NotLeaderError as exc:
            log.warning("job %s: its JobGraph and checkpoint pointers stay for the next leader: %s", job_id, exc)
            return
        threading.Thread(target=delete_intermediate_data, args=(job_storage_dir(self._storage_dir, job_id),),
                         name=f"clean-up-{job_id}", daemon=True).start()

    def _schedule_retention(self) -> None:
        if not self._retention_ms:
            return
        timer = threading.Timer(min(self._retention_ms, 60_000) / 1000.0, self._expire_results)
        timer.daemon = True
        self._retention_timer = timer
        timer.start()

    def _expire_results(self) -> None:
        """Drop results no client fetched within ``job-result-store.retention``."""
        if not self._accepting or not self._is_leader():
            return
        store = self._ha.job_result_store()
        now = int(time.time() * 1000)
        for job_id in store.job_ids():
            entry = store.get(job_id)
            if entry is not None and entry.created_ms + self._retention_ms <= now:
                try:
                    store.remove(job_id)
                except NotLeaderError:
                    return
                log.info("result of job %s dropped after job-result-store.retention", job_id)
        self._schedule_retention()

    @fenced()
    def list_jobs(self) -> list[JobStatusInfo]:
        with self._lock:
            running = list(self._running.values())
            ended = [info for info, _ in self._ended.values()]
        infos = []
        for jm in running:
            try:
                infos.append(jm.status_info())
            except UnavailableError:
                pass  # ended between the two looks: it is in the ended list next time
        return sorted(infos + ended, key=lambda j: j.start_time_ms)

    @fenced()
    def get_job(self, job_id: JobID) -> JobStatusInfo:
        with self._lock:
            jm = self._running.get(job_id)
            ended = self._ended.get(job_id)
        if ended is not None:
            return ended[0]
        if jm is None:
            if job_id in self._suspended:
                raise NotLeaderRpcError(f"this AppMaster no longer leads job {job_id}: ask the leader")
            raise NotFoundError(f"no job {job_id} on this cluster")
        try:
            return jm.status_info()
        except UnavailableError:
            return self.get_job(job_id)

    def _running_job(self, job_id: JobID) -> JobMaster:
        """The running job's JobMaster; RefusedError when it ended, NotFoundError when unknown."""
        with self._lock:
            jm = self._running.get(job_id)
            ended = self._ended.get(job_id)
        if ended is not None:
            raise RefusedError(f"job {job_id} already ended {ended[1].status.name}")
        if jm is None:
            raise NotFoundError(f"no job {job_id} on this cluster")
        return jm

    @fenced()
    def cancel_job(self, job_id: JobID) -> None:
        jm = self._running_job(job_id)
        log.info("cancelling job %s", job_id)
        jm.cancel()

    @fenced()
    def request_job_result(self, job_id: JobID, timeout_ms: int) -> JobResult:
        """The job's result once it ended; a result fetched is then dropped from the
        JobResultStore (this leader still answers for it)."""
        with self._lock:
            event = self._done.get(job_id)
        if event is None:
            raise NotFoundError(f"no job {job_id} on this cluster")
        if not event.wait(timeout_ms / 1000.0):
            raise UnavailableError(f"job {job_id} is still running")
        with self._lock:
            if job_id in self._suspended:
                raise NotLeaderRpcError(f"this AppMaster no longer leads job {job_id}: ask the leader")
            result = self._ended[job_id][1]
            self._fetched.add(job_id)
            self._done_fetching.notify_all()
        if self.drop_fetched_results:
            try:
                self._ha.job_result_store().remove(job_id)
            except NotLeaderError:
                pass
        return result

    def job_result(self, job_id: JobID, timeout_s: float) -> JobResult | None:
        """The job's result once it ended (None while it runs or before it is known), for the
        AppMaster itself: unlike ``request_job_result`` it counts as no client's fetch."""
        with self._lock:
            event = self._done.get(job_id)
        if event is None or not event.wait(timeout_s):
            return None
        with self._lock:
            if job_id in self._suspended:
                return None
            return self._ended[job_id][1]

    def wait_result_fetched(self, job_id: JobID, timeout_s: float) -> bool:
        """Wait until a client fetched the job's result (``request_job_result``)."""
        with self._lock:
            return self._done_fetching.wait_for(lambda: job_id in self._fetched, timeout_s)

    @rpc
    def cluster_info(self) -> ClusterInfo:
        tes, total, free = self._rm.overview()
        return ClusterInfo(self._cluster_id, self._storage_dir, __version__, tes, total, free, self._target,
                           self.fencing_token, self.web_url)

    def job_graph(self, job_id: JobID) -> JobGraph | None:
        """The JobGraph of a job this Dispatcher ran or runs (None when unknown here)."""
        with self._lock:
            jm = self._running.get(job_id)
            return jm.job_graph if jm is not None else self._graphs.get(job_id)

    @fenced()
    def shutdown_cluster(self) -> None:
        log.info("shutdown requested by a client")
        try:
            self._ha.request_cluster_shutdown()  # standbys exit instead of taking over
        except NotLeaderError as exc:
            raise NotLeaderRpcError(f"this AppMaster no longer leads the cluster: {exc}") from None
        self._accepting = False
        threading.Thread(target=self._on_shutdown, name="shutdown", daemon=True).start()

    # -- JobMasters -------------------------------------------------------------------------
    def _job_ended(self, jm: JobMaster) -> None:
        result = jm.result
        assert result is not None
        info = jm._status_info()  # noqa: SLF001 - called on the JobMaster's own thread
        if result.status == JobStatus.SUSPENDED:  # the new leader goes on with it
            with self._lock:
                self._running.pop(jm.job_id, None)
                self._suspended.add(jm.job_id)
                event = self._done[jm.job_id]
            self._unserve(jm)
            event.set()
            threading.Timer(0.1, jm.stop).start()
            return
        try:  # first the result (so no leader runs it again), then the job's other HA data
            self._ha.job_result_store().put(JobResultEntry(result, int(time.time() * 1000), extra={"name": info.name}))
        except NotLeaderError as exc:
            log.warning("job %s ended %s, but its result could not be recorded (%s): the leader runs it "
                        "again from its latest checkpoint", jm.job_id, result.status.name, exc)
        else:
            self._clean_up(jm.job_id)
        with self._lock:
            self._running.pop(jm.job_id, None)
            self._ended[jm.job_id] = (info, result)
            self._graphs[jm.job_id] = jm.job_graph
            event = self._done[jm.job_id]
        self._unserve(jm)
        event.set()
        threading.Timer(2.0, jm.stop).start()  # let late task updates still get an answer

    def running_job_masters(self) -> list[JobMaster]:
        with self._lock:
            return list(self._running.values())

    def cancel_all(self, timeout_s: float) -> None:
        """The cluster ends: every job is cancelled (waiting up to ``timeout_s`` for each)."""
        if self._retention_timer is not None:
            self._retention_timer.cancel()
        for jm in self.running_job_masters():
            jm.cancel()
        with self._lock:
            events = [self._done[j] for j in self._running]
        for e in events:
            e.wait(timeout_s)
