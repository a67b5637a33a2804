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
from concurrent.futures import Future, wait
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any, Callable

import fsspec

from yarnflow.common.version import __version__
from yarnflow.am.jobmaster.job_master import JobMaster
from yarnflow.am.resourcemanager.resource_manager import ResourceManager
from yarnflow.common.config import Configuration, Options
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
from yarnflow.common.clock import TimerHandle
from yarnflow.common.rpc.endpoint import MainThreadExecutor, RpcEndpoint, fenced, rpc, settle
from yarnflow.common.rpc.gateways import job_master_service
from yarnflow.common.rpc.server import RpcServer
from yarnflow.am.dispatcher.job_data import (check_savepoint, delete_unreferenced_artifact, forget_ended_job,
                                             job_storage_dir, unretained_checkpoints)
from yarnflow.am.dispatcher.adaptive import AdaptiveScaling
from yarnflow.am.dispatcher.elastic_calls import ElasticCalls
from yarnflow.am.dispatcher.rescaling import Rescales
from yarnflow.common.artifacts import ArtifactCache
from yarnflow.common.states import JobStatus

log = logging.getLogger(__name__)


#: (job graph, recover from the latest checkpoint?, called when the job ended here) -> a JobMaster
#: not yet started
JobMasterFactory = Callable[[JobGraph, bool, Callable[[JobMaster], None]], JobMaster]


class Dispatcher(ElasticCalls, RpcEndpoint):
    """Every call runs on its main thread (the ``Dispatcher`` executor), so its state needs no
    lock. What waits (a client for a job's result, a savepoint) is answered with a Future that
    the RPC thread waits for; the main thread is never blocked by it. The AppMaster's own parts
    call it with ``ask`` (REST, the metrics) or the blocking helpers ``job_result`` /
    ``wait_result_fetched`` (the per-job runner), never on its main thread."""

    def __init__(self, config: Configuration, rm: ResourceManager, cluster_id: str, storage_dir: str, target: str,
                 on_shutdown: Callable[[], None], artifacts: ArtifactCache, *,
                 ha: HighAvailabilityServices | None = None, fencing_token: str | None = None,
                 is_leader: Callable[[], bool] | None = None, rpc_server: RpcServer | None = None,
                 job_master_factory: JobMasterFactory | None = None) -> None:
        self._main = MainThreadExecutor("dispatcher")
        super().__init__("Dispatcher", self._main)
        self._rpc_server = rpc_server
        self._new_job_master = job_master_factory or self._default_job_master
        self._ha = ha or EmbeddedHaServices()
        self._is_leader = is_leader or (lambda: True)
        self._retention_ms = config[Options.JOB_RESULT_RETENTION]
        self._suspended: set[JobID] = set()
        self._retention_timer: TimerHandle | None = None
        self._artifacts = artifacts
        self._config = config
        self._rm = rm
        self._cluster_id = cluster_id
        self._storage_dir = storage_dir
        self._target = target
        self._on_shutdown = on_shutdown
        self._running: dict[JobID, JobMaster] = {}
        self._ended: dict[JobID, tuple[JobStatusInfo, JobResult]] = {}
        #: an ended job's checkpoints' parts per subtask, as its JobMaster had them at the end
        self._ended_checkpoints: dict[JobID, dict[int, dict[str, list[dict[str, Any]]]]] = {}
        #: per job known here: settled once it ended here (or was suspended)
        self._done: dict[JobID, Future[None]] = {}
        #: per job: settled once a client fetched its result
        self._fetched: dict[JobID, Future[None]] = {}
        self._rescales = Rescales(config, self._ha, self._main.execute, lambda g, r: self._job_master(g, r).start())
        self.adaptive = AdaptiveScaling(config, rm, self._rescales, self._running, self._main)
        #: clients waiting for a job's result: (their answer, the timer that ends their wait)
        self._result_waiters: dict[JobID, list[tuple[Future[JobResult], TimerHandle]]] = {}
        self.address = ""
        self.web_url = ""  # the REST API and web UI, when served
        #: the JobGraphs of ended jobs (for their plan in the REST API)
        self._graphs: dict[JobID, JobGraph] = {}
        #: called (on the Dispatcher's main thread) with each job that ended FINISHED, FAILED or CANCELED
        self.on_job_ended: list[Callable[[JobID], None]] = []
        self._accepting = True
        self._deposed = False  # it lost the leadership: its main thread ends once its jobs did
        self.fencing_token = fencing_token or LeaderSessionID.generate()
        #: a per-job application keeps its job's result in the JobResultStore after a client
        #: fetched it: a next application attempt must find it rather than run the job again
        self.drop_fetched_results = True
        self._main.start()

    def stop(self, grace_s: float = 1.0) -> None:
        """The Dispatcher is done (its AppMaster stops): jobs still ending get ``grace_s`` to
        record their ends, clients still waiting are answered UNAVAILABLE, the JobMasters left
        are stopped, and its main thread ends."""
        try:
            wait(self._main.call(lambda: [self._done[j] for j in self._running]), grace_s)
            self.ask(self._close)
        except UnavailableError:
            pass  # stopped already
        self._main.stop()

    def _close(self) -> None:
        for waiters in self._result_waiters.values():
            for answer, timer in waiters:
                timer.cancel()
                settle(answer, UnavailableError("the cluster's AppMaster is shutting down"))
        self._result_waiters.clear()
        for jm in self._running.values():
            jm.stop()
        self._main.stop()

    def _retire_when_idle(self) -> None:
        """A deposed or ending Dispatcher's main thread ends once its last job's end is recorded."""
        if not self._accepting and not self._running:
            self._close()

    def rpc_invoke(self, method: str, token: str | None, args: tuple[Any, ...]) -> Any:
        if self._deposed and self._main.stopped:  # a call that found it just before it was replaced
            raise NotLeaderRpcError("this AppMaster no longer leads the cluster: ask the leader")
        return super().rpc_invoke(method, token, args)

    # -- DispatcherService ------------------------------------------------------------------
    @fenced()
    def submit_job(self, job_graph: JobGraph) -> JobID:
        if not self._accepting:
            raise UnavailableError("the cluster is shutting down")
        limit = self._config[Options.MAX_JOB_SUBTASKS]
        subtasks = sum(max(0, v.parallelism) for v in job_graph.vertices)
        if subtasks > limit or len(job_graph.vertices) > limit or len(job_graph.edges) > 4 * limit:
            raise InvalidRequestError(f"the JobGraph is too large: {len(job_graph.vertices)} vertices, "
                                      f"{len(job_graph.edges)} edges, {subtasks} subtasks (at most {limit}: "
                                      f"{Options.MAX_JOB_SUBTASKS.key})")
        job_graph.validate()
        if not job_graph.artifact_uri:
            raise InvalidRequestError("the JobGraph names no job artifact")
        try:
            exists = fsspec.core.url_to_fs(job_graph.artifact_uri)[0].exists(job_graph.artifact_uri)
        except (OSError, ValueError) as exc:
            raise InvalidRequestError(f"cannot check the job artifact {job_graph.artifact_uri}: {exc}") from None
        if not exists:
            raise InvalidRequestError(f"the job artifact {job_graph.artifact_uri} does not exist")
        check_savepoint(self._config.with_overrides(job_graph.config), job_graph)
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

    def _default_job_master(self, job_graph: JobGraph, recover: bool,
                            on_terminal: Callable[[JobMaster], None]) -> JobMaster:
        return JobMaster(job_graph, self._config, self._rm, self.address,
                         job_storage_dir(self._storage_dir, job_graph.job_id), on_terminal, self._artifacts,
                         checkpoints_dir=f"{self._storage_dir.rstrip('/')}/checkpoints", ha=self._ha,
                         is_leader=self._is_leader, recover=recover)

    def _job_master(self, job_graph: JobGraph, recover: bool) -> JobMaster:
        """A JobMaster for ``job_graph``, registered as running and served."""
        jm = self._new_job_master(job_graph, recover, self._job_ended)
        self._running[job_graph.job_id] = jm
        self._done.setdefault(job_graph.job_id, Future())
        self._fetched.setdefault(job_graph.job_id, Future())
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
        return self.ask(self._recover_jobs, timeout=None)

    def _recover_jobs(self) -> list[JobID]:
        results = self._ha.job_result_store()
        graphs = self._ha.job_graph_store()
        for job_id in results.job_ids():
            entry = results.get(job_id)
            if entry is not None:
                self._take_in_result(entry)
        started: list[JobMaster] = []
        for job_id in graphs.job_ids():
            if (ended := results.get(job_id)) is not None:  # its end was recorded, its clean-up maybe not done
                log.info("job %s has a result already: it is not run again", job_id)
                forget_ended_job(self._ha, self._storage_dir, JobID(job_id), unretained_checkpoints(
                    self._ha, self._config, self._storage_dir, JobID(job_id), ended.result.status))
                continue
            try:
                job_graph = graphs.get(job_id)
            except (HighAvailabilityError, NotFoundError) as exc:
                log.error("job %s cannot be recovered: %s", job_id, exc)
                self._fail_unrecoverable(JobID(job_id), exc)
                continue
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
        self._ended[result.job_id] = (info, result)
        self._fetched.setdefault(result.job_id, Future())
        settle(self._done.setdefault(result.job_id, Future()), None)

    def _fail_unrecoverable(self, job_id: JobID, exc: Exception) -> None:
        now = int(time.time() * 1000)
        result = JobResult(job_id, JobStatus.FAILED, now, now, ErrorInfo.from_exception(
            exc, f"recovering job {job_id} after a change of leader"))
        try:
            self._ha.job_result_store().put(JobResultEntry(result, now))
        except NotLeaderError:
            return
        self._take_in_result(JobResultEntry(result, now))
        forget_ended_job(self._ha, self._storage_dir, job_id)

    def suspend_all(self, reason: str) -> None:
        """Leadership lost: every JobMaster is suspended (nothing is written for any job). The
        main thread goes on until each has ended, recording their ends."""
        self.ask(self._suspend_all, reason)

    def _suspend_all(self, reason: str) -> None:
        self._stop_accepting()
        self._deposed = True
        for jm in list(self._running.values()):
            jm.suspend(reason)
        self._retire_when_idle()

    def stop_accepting(self) -> None:
        """The cluster is shutting down: no job is accepted any more."""
        self.ask(self._stop_accepting)

    def _stop_accepting(self) -> None:
        self._accepting = False
        if self._retention_timer is not None:
            self._retention_timer.cancel()

    def _schedule_retention(self) -> None:
        if self._retention_ms and self._accepting:
            self._retention_timer = self._main.schedule(min(self._retention_ms, 60_000), self._expire_results)

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

    def running_artifacts(self) -> set[str]:
        """(any thread) The artifacts of the jobs running here (their split enumerators load
        from them): read from a snapshot of the running jobs (one C-level copy of the dict)."""
        return {jm.job_graph.artifact_sha256 for jm in tuple(self._running.values())}

    @fenced()
    def list_jobs(self) -> list[JobStatusInfo]:
        infos = [info for info, _ in self._ended.values()]
        for jm in self._running.values():
            try:
                infos.append(jm.status_info())
            except UnavailableError:
                pass  # its JobMaster is stopping: its end is recorded next
        return sorted(infos, key=lambda j: j.start_time_ms)

    @fenced()
    def get_job(self, job_id: JobID) -> JobStatusInfo:
        ended = self._ended.get(job_id)
        if ended is not None:
            return ended[0]
        jm = self._running.get(job_id)
        if jm is None:
            if job_id in self._suspended:
                raise NotLeaderRpcError(f"this AppMaster no longer leads job {job_id}: ask the leader")
            raise NotFoundError(f"no job {job_id} on this cluster")
        return jm.status_info()

    def checkpoint_subtasks(self, job_id: JobID, checkpoint_id: int) -> dict[str, list[dict[str, Any]]] | None:
        """A job's subtasks' parts of a recent checkpoint (None: not kept); an ended job's as
        they were at its end."""
        jm = self._running.get(job_id)
        if jm is None:
            return self._ended_checkpoints.get(job_id, {}).get(checkpoint_id)
        return jm.checkpoint_subtasks(checkpoint_id)

    def _running_job(self, job_id: JobID) -> JobMaster:
        """The running job's JobMaster; RefusedError when it ended, NotFoundError when unknown."""
        ended = self._ended.get(job_id)
        if ended is not None:
            raise RefusedError(f"job {job_id} already ended {ended[1].status.name}")
        jm = self._running.get(job_id)
        if jm is None:
            raise NotFoundError(f"no job {job_id} on this cluster")
        return jm

    @fenced()
    def cancel_job(self, job_id: JobID) -> None:
        jm = self._running_job(job_id)
        log.info("cancelling job %s", job_id)
        self._rescales.forget(job_id)  # (the adaptive scheduler's rescale under way does not run it on)
        jm.cancel()

    @fenced()
    def request_job_result(self, job_id: JobID, timeout_ms: int) -> JobResult | Future[JobResult]:
        """The job's result once it ended (UNAVAILABLE after ``timeout_ms`` while it runs); a
        result fetched is then dropped from the JobResultStore (this leader still answers for it)."""
        done = self._done.get(job_id)
        if done is None:
            raise NotFoundError(f"no job {job_id} on this cluster")
        if done.done():
            return self._hand_out_result(job_id)
        answer: Future[JobResult] = Future()

        def expire() -> None:
            waiters = self._result_waiters.get(job_id, [])
            self._result_waiters[job_id] = [w for w in waiters if w[0] is not answer]
            settle(answer, UnavailableError(f"job {job_id} is still running"))

        self._result_waiters.setdefault(job_id, []).append((answer, self._main.schedule(timeout_ms, expire)))
        return answer

    def _hand_out_result(self, job_id: JobID) -> JobResult:
        """The ended job's result, for a client: counted as fetched."""
        if job_id in self._suspended:
            raise NotLeaderRpcError(f"this AppMaster no longer leads job {job_id}: ask the leader")
        result = self._ended[job_id][1]
        settle(self._fetched.setdefault(job_id, Future()), None)
        if self.drop_fetched_results:
            try:
                self._ha.job_result_store().remove(job_id)
            except NotLeaderError:
                pass
        return result

    def job_result(self, job_id: JobID, timeout_s: float) -> JobResult | None:
        """The job's result once it ended (None while it runs, before it is known, or when this
        Dispatcher no longer leads it), for the AppMaster itself: unlike ``request_job_result``
        it counts as no client's fetch. Blocks: not for the main thread."""
        try:
            done = self._main.call(self._done.get, job_id)
            if done is None:
                return None
            done.result(timeout_s)
            return self._main.call(self._result_here, job_id)
        except (FutureTimeoutError, UnavailableError):
            return None

    def _result_here(self, job_id: JobID) -> JobResult | None:
        return None if job_id in self._suspended else self._ended[job_id][1]

    def wait_result_fetched(self, job_id: JobID, timeout_s: float) -> bool:
        """Wait until a client fetched the job's result (``request_job_result``). Blocks: not
        for the main thread."""
        try:
            self._main.call(self._fetched_future, job_id).result(timeout_s)
            return True
        except (FutureTimeoutError, UnavailableError):
            return False

    def _fetched_future(self, job_id: JobID) -> Future[None]:
        return self._fetched.setdefault(job_id, Future())

    @rpc
    def cluster_info(self) -> ClusterInfo:
        tes, total, free = self._rm.overview()
        return ClusterInfo(self._cluster_id, self._storage_dir, __version__, tes, total, free, self._target,
                           self.fencing_token, self.web_url)

    def job_graph(self, job_id: JobID) -> JobGraph | None:
        """The JobGraph of a job this Dispatcher ran or runs (None when unknown here)."""
        jm = self._running.get(job_id)
        return jm.job_graph if jm is not None else self._graphs.get(job_id)

    @fenced()
    def shutdown_cluster(self) -> None:
        log.info("shutdown requested by a client")
        try:
            self._ha.request_cluster_shutdown()  # standbys exit instead of taking over
        except NotLeaderError as exc:
            raise NotLeaderRpcError(f"this AppMaster no longer leads the cluster: {exc}") from None
        self._stop_accepting()
        threading.Thread(target=self._on_shutdown, name="shutdown", daemon=True).start()

    # -- JobMasters -------------------------------------------------------------------------
    def _job_ended(self, jm: JobMaster) -> None:
        """A JobMaster's job ended (called on the JobMaster's main thread): its end is recorded
        on this one."""
        result = jm.result
        assert result is not None
        info = jm.status_info_on_main_thread()
        kept = jm.kept_checkpoint_subtasks_on_main_thread()
        if self._main.in_main_thread():
            self._record_end(jm, result, info, kept)
        else:
            self._main.execute(self._record_end, jm, result, info, kept)

    def _record_end(self, jm: JobMaster, result: JobResult, info: JobStatusInfo,
                    kept: dict[int, dict[str, list[dict[str, Any]]]] | None = None) -> None:
        job_id = jm.job_id
        self._running.pop(job_id, None)
        self._unserve(jm)
        if self._rescales.take_over(jm, result.status):  # a new JobMaster runs the job on, rescaled
            threading.Timer(2.0, jm.stop).start()
            return
        if result.status == JobStatus.SUSPENDED:  # the new leader goes on with it
            self._suspended.add(job_id)
            threading.Timer(0.1, jm.stop).start()
        else:
            try:  # first the result (so no leader runs it again), then the job's other HA data
                self._ha.job_result_store().put(JobResultEntry(result, int(time.time() * 1000),
                                                               extra={"name": info.name}))
            except NotLeaderError as exc:
                log.warning("job %s ended %s, but its result could not be recorded (%s): the leader runs it "
                            "again from its latest checkpoint", job_id, result.status.name, exc)
            else:  # its artifact too, unless a job uses it: on this thread, so no submission slips in between
                if forget_ended_job(self._ha, self._storage_dir, job_id, jm.checkpoints_to_delete()):
                    delete_unreferenced_artifact(self._ha, self._storage_dir, jm.job_graph.artifact_uri)
            self._ended[job_id] = (info, result)
            if kept:
                self._ended_checkpoints[job_id] = kept
            self._graphs[job_id] = jm.job_graph
            threading.Timer(2.0, jm.stop).start()  # let late task updates still get an answer
            for listener in self.on_job_ended:
                listener(job_id)
        settle(self._done.setdefault(job_id, Future()), None)
        for answer, timer in self._result_waiters.pop(job_id, []):
            timer.cancel()
            try:
                settle(answer, self._hand_out_result(job_id))
            except NotLeaderRpcError as exc:
                settle(answer, exc)
        if self._deposed:
            self._retire_when_idle()

    def running_job_masters(self) -> list[JobMaster]:
        return list(self._running.values())

    def cancel_all(self, timeout_s: float) -> None:
        """The cluster ends: every job is cancelled (waiting up to ``timeout_s`` for each)."""
        for done in self.ask(self._cancel_all):
            try:
                done.result(timeout_s)
            except FutureTimeoutError:
                pass

    def _cancel_all(self) -> list[Future[None]]:
        self._stop_accepting()
        for jm in list(self._running.values()):
            jm.cancel()
        return [self._done[j] for j in self._running]
