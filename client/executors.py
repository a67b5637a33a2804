"""Running a compiled job: on a cluster at an address (session), or on an embedded local
cluster started for it. ``current_context()`` is what ``env.execute()`` uses: the CLI sets
one; a plain ``python job.py`` gets a local one."""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

import pyarrow as pa

from yarnflow.common.config import Configuration, Options
from yarnflow.common.errors import (InvalidRequestError, JobDefinitionError, JobFailedError, RefusedError,
                                    RemoteTraceback, RpcTimeoutError, UnavailableError, YarnflowError)
from yarnflow.common.ha import ha_enabled
from yarnflow.common.ids import JobID
from yarnflow.common.messages import ErrorInfo, JobResult, JobStatusInfo, VertexStatus
from yarnflow.common.rpc.gateways import RemoteDispatcherGateway
from yarnflow.common.states import ExecutionState, JobStatus
from yarnflow.connection import ClusterConnection
from yarnflow.common.yarn import FIXED_JOB_IDS_VAR, RESUME_VAR
from yarnflow.compiler import CompiledJob, compile_job
from yarnflow.packaging import build_artifact, upload_artifact
from yarnflow.common.collect import read_collected
from yarnflow.common.tracebacks import SEPARATORS, user_frames, user_traceback

if TYPE_CHECKING:
    from yarnflow.common.messages import JobGraph
    from yarnflow.datastream import StreamExecutionEnvironment

log = logging.getLogger(__name__)


@dataclass
class JobExecutionResult:
    job_id: JobID
    job_name: str
    status: JobStatus
    duration_ms: int
    storage_dir: str
    collect_uids: list[str] = field(default_factory=list)
    _tables: dict[str, pa.Table | None] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)  # where file sinks wrote
    printed: bool = False  # rows were printed on stdout (print sinks)
    collect_names: dict[str, str] = field(default_factory=dict)  # sink uid -> the name the user gave it

    def collected(self, name: str | None = None) -> pa.Table | None:
        """The rows of a ``collect()`` / ``print()`` sink, by the name given to it
        (``collect(name=...)``) or its uid; the only one when ``name`` is None. None for a
        sink that received no rows. Raises KeyError for a name the job has no sink of (or
        that two of its sinks share: name them apart) and ValueError, without a name, when
        the job has several."""
        if name is None:
            if len(self.collect_uids) != 1:
                raise ValueError(f"the job has {len(self.collect_uids)} collect sinks: name one of "
                                 f"{self._known()}")
            return self._tables.get(self.collect_uids[0])
        if name in self.collect_uids:
            return self._tables.get(name)
        uids = [uid for uid in self.collect_uids if self.collect_names.get(uid) == name]
        if len(uids) != 1:
            raise KeyError(f"the job has {'no collect sink' if not uids else f'{len(uids)} collect sinks'} named "
                           f"{name!r}: {self._known()}")
        return self._tables.get(uids[0])

    def _known(self) -> str:
        return ", ".join(f"{self.collect_names.get(u, u)!r} ({u})" for u in self.collect_uids) or "none"


class Progress:
    """Shows a running job's state on stderr: a live line on a terminal, changes otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._console: Any = None
        self._live: Any = None
        self._last = ""
        if enabled:
            from rich.console import Console

            self._console = Console(stderr=True)

    def render(self, info: JobStatusInfo) -> str:
        parts = []
        for v in info.vertices:
            counts = {s: n for s, n in v.state_counts.items() if n}
            states = ", ".join(f"{n} {s.name}" for s, n in sorted(counts.items()))
            rates = _rates(v)
            parts.append(f"{v.name} [{states}]{rates}")
        elapsed = ((info.end_time_ms or int(time.time() * 1000)) - info.start_time_ms) / 1000
        checkpoint = f" checkpoint {info.latest_completed_checkpoint_id}" if info.latest_completed_checkpoint_id else ""
        return f"job {info.name} {info.status.name} {elapsed:.1f}s{checkpoint} :: " + " | ".join(parts)

    def update(self, info: JobStatusInfo) -> None:
        if not self.enabled:
            return
        line = self.render(info)
        if self._console.is_terminal:
            if self._live is None:
                from rich.live import Live
                from rich.text import Text

                self._live = Live(Text(line), console=self._console, refresh_per_second=8, transient=False)
                self._live.start()
            else:
                from rich.text import Text

                self._live.update(Text(line))
        else:
            key = f"{info.status.name} {info.latest_completed_checkpoint_id} {[v.state_counts for v in info.vertices]}"
            if key != self._last:
                self._console.print(line, soft_wrap=True, highlight=False)
                self._last = key

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def _rates(v: VertexStatus) -> str:
    """`` in N/s out N/s``: the vertex's records per second, as its TaskExecutors measured them
    (the figures of the REST API and Prometheus); empty before any came."""
    if not v.subtask_metrics:
        return ""
    rate_in = sum(m.records_in_per_second for m in v.subtask_metrics)
    rate_out = sum(m.records_out_per_second for m in v.subtask_metrics)
    shown = [f"{label} {_per_second(rate)}" for label, rate in (("in", rate_in), ("out", rate_out)) if rate]
    return (" " + " ".join(shown)) if shown else ""


def _per_second(rate: float) -> str:
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if rate >= scale:
            return f"{rate / scale:.1f}{suffix}/s"
    return f"{rate:.0f}/s"


def _progress_enabled() -> bool:
    return os.environ.get("YARNFLOW_PROGRESS", "1") != "0"


#: how long ``yarnflow run`` interrupted by Ctrl-C waits for the job it cancels to end
CANCEL_WAIT_S = 30.0


class ClusterContext:
    """Runs jobs on the cluster at ``address``, or (empty address, ZooKeeper high availability
    configured) on whichever AppMaster leads the cluster, following it across failovers.
    ``detached``: return once the cluster accepted the job (its result says CREATED)."""

    def __init__(self, address: str, conf: Mapping[str, str] | None = None, job_file: str | None = None,
                 progress: bool | None = None, detached: bool = False) -> None:
        self.address = address
        self.detached = detached
        self.conf = dict(conf or {})
        self.config = Configuration.load(self.conf)
        self.job_file = job_file
        self.progress = _progress_enabled() if progress is None else progress
        self.submitted: list[JobID] = []
        self.results: list[JobExecutionResult] = []
        #: the job a Ctrl-C cancelled and the state it ended in (if it ended in time)
        self.interrupted: tuple[JobID, JobStatus | None] | None = None

    @property
    def default_parallelism(self) -> int:
        return self.config[Options.PARALLELISM]

    @property
    def max_parallelism(self) -> int:
        return self.config[Options.MAX_PARALLELISM]

    @property
    def runtime_mode(self) -> str:
        return self.config[Options.RUNTIME_MODE]

    def connect(self) -> ClusterConnection:
        return ClusterConnection(self.config, self.address, self.config[Options.CLIENT_TIMEOUT])

    def _artifact_upload(self) -> str:
        """How the job artifact reaches the cluster (``client.artifact-upload``)."""
        return str(self.config[Options.ARTIFACT_UPLOAD])

    def execute(self, env: StreamExecutionEnvironment, job_name: str,
                job: CompiledJob | None = None) -> JobExecutionResult:
        """Compile the pipeline (unless ``job`` is its compiled form already), submit it and
        follow it to its end (or only submit it, detached)."""
        job = job or compile_job(env, job_name)
        conn = self.connect()
        try:
            info = conn.call(lambda gw: gw.cluster_info(), "clusterInfo")
            job = upload_artifact(job, self.job_file, info.storage_dir, info.web_url,
                                  self._artifact_upload(), conn.rest_access())
            jg = job.job_graph
            jg.config.update({**self.conf, **jg.config})  # (what the compiler decided stays)
            resume_from_retained_checkpoint(jg, {**self.config.to_strings(), **jg.config}, info.storage_dir)
            restore_from_checkpoint(jg.config)

            def submit(gw: RemoteDispatcherGateway) -> JobID:
                try:
                    return gw.submit_job(jg)
                except RefusedError:
                    if conn.follows_leader:  # submitted before the leader changed: recovered by the new one
                        return jg.job_id
                    if os.environ.get(FIXED_JOB_IDS_VAR):  # application mode, run again after an AppMaster
                        print(f"job {jg.job_id} was submitted by an earlier run of main() and recovered: "
                              "following it", file=sys.stderr)  # failure: the recovered job is this one
                        return jg.job_id
                    raise
                except InvalidRequestError as exc:
                    if "does not exist" not in str(exc):
                        raise
                    # the artifact (content-addressed, stored once) was deleted as the last job using
                    # it ended, between storing and submitting: store it again
                    upload_artifact(job, self.job_file, info.storage_dir, info.web_url,
                                    self._artifact_upload(), conn.rest_access())
                    return gw.submit_job(jg)

            job_id = conn.call(submit, "submitJob")
            self.submitted.append(job_id)
            print(f"Submitted job {job_name} ({job_id}) to {conn.address}", file=sys.stderr)
            if self.detached:
                outcome = JobExecutionResult(job_id, job_name, JobStatus.CREATED, 0, "")
                self.results.append(outcome)
                return outcome
            return self.follow(conn, job, job_id, job_name, info.storage_dir)
        finally:
            conn.close()

    def follow(self, conn: ClusterConnection, job: CompiledJob, job_id: JobID, job_name: str,
               storage_dir: str) -> JobExecutionResult:
        """Wait for the submitted job's result (showing progress), read what it collected, and
        raise JobFailedError when it failed or was cancelled."""
        result = self._wait(conn, job_id)
        storage = f"{storage_dir}/jobs/{job_id}"
        tables = {uid: read_collected(storage, uid) for uid in job.collect_sinks}
        outcome = JobExecutionResult(job_id, job_name, result.status, result.end_time_ms - result.start_time_ms,
                                     storage, list(job.collect_sinks), tables, list(job.file_sinks),
                                     any(s.print_rows for s in job.collect_sinks.values()),
                                     {uid: s.name for uid, s in job.collect_sinks.items()})
        self.results.append(outcome)
        if result.status == JobStatus.FAILED:
            cause = result.failure_cause
            error = JobFailedError(f"job {job_name} ({job_id}) failed: "
                                   f"{cause.headline() if cause else 'unknown cause'}", cause)
            shown = user_traceback(cause.traceback) if cause is not None else ""  # (info shows it whole)
            raise error from (RemoteTraceback(shown) if shown else None)
        if result.status == JobStatus.CANCELED:
            raise JobFailedError(f"job {job_name} ({job_id}) was canceled")
        printed = [(uid, sink) for uid, sink in job.collect_sinks.items() if sink.print_rows]
        for uid, sink in printed:
            if len(printed) > 1:
                print(f"# {sink.name}")
            print_table(tables.get(uid))
        return outcome

    def _wait(self, conn: ClusterConnection, job_id: JobID) -> JobResult:
        progress = Progress(self.progress)
        try:
            while True:
                try:
                    result = conn.call(lambda gw: gw.request_job_result(job_id, 200), "requestJobResult")
                except (UnavailableError, RpcTimeoutError):
                    progress.update(conn.call(lambda gw: gw.get_job(job_id), "getJob"))
                    continue
                try:  # the final figures, when the cluster is still there: a yarn-per-job
                    progress.update(conn.call(lambda gw: gw.get_job(job_id), "getJob"))
                except YarnflowError:  # application may end as soon as its result was fetched
                    pass
                return result
        except KeyboardInterrupt:
            progress.close()
            print(f"\ncancelling job {job_id} ... (Ctrl-C again: leave it cancelling)", file=sys.stderr)
            conn.drop_gateway()  # (the interrupted call's answer must not be read as the cancel's)
            self.interrupted = (job_id, None)
            conn.call(lambda gw: gw.cancel_job(job_id), "cancelJob")
            deadline = time.monotonic() + CANCEL_WAIT_S
            while time.monotonic() < deadline:
                try:
                    result = conn.call(lambda gw: gw.request_job_result(job_id, 500), "requestJobResult")
                except (UnavailableError, RpcTimeoutError):
                    continue
                self.interrupted = (job_id, result.status)
                break
            raise
        finally:
            progress.close()


def print_table(table: pa.Table | None) -> None:
    if table is None or table.num_rows == 0:
        print("(no rows)")
        return
    print("\t".join(table.column_names))
    for batch in table.to_batches():
        for row in zip(*(col.to_pylist() for col in batch.columns)):
            print("\t".join("" if v is None else str(v) for v in row))


def resume_from_retained_checkpoint(jg: JobGraph, config: Mapping[str, str], storage_dir: str) -> None:
    """Application mode, run again after its AppMaster died without high availability: a job
    (the same fixed id as in the earlier run) starts from its latest retained checkpoint, when
    its checkpoint folder holds one (as ``run -s <job's checkpoint folder>``)."""
    from yarnflow.am.checkpoint.savepoints import SavepointError, resume_point

    if not os.environ.get(RESUME_VAR) or jg.config.get(Options.SAVEPOINT_PATH.key):
        return
    try:
        savepoint = resume_point(config, storage_dir, jg.job_id)
    except SavepointError as exc:
        raise JobDefinitionError(str(exc)) from None
    if savepoint:
        print(f"job {jg.job_id} resumes from its latest retained checkpoint (the savepoint {savepoint} written "
              "from it)", file=sys.stderr)
        jg.config[Options.SAVEPOINT_PATH.key] = savepoint


def restore_from_checkpoint(config: dict[str, str]) -> None:
    """A job started from a retained checkpoint (``run -s <chk folder>``, or the job's checkpoint
    folder for its latest) starts from a savepoint written from it here, beside it: the same
    mapping by uid and rescaling as a savepoint's, and the checkpoint stays as it was (the new job
    never deletes what another job's checkpoint holds). Raises JobDefinitionError when that
    checkpoint cannot become a savepoint (``savepoint_of_checkpoint`` says when)."""
    from yarnflow.am.checkpoint.savepoints import SavepointError, savepoint_of_checkpoint

    path = config.get(Options.SAVEPOINT_PATH.key, "")
    if not path:
        return
    try:
        savepoint = savepoint_of_checkpoint(path)
    except SavepointError as exc:
        raise JobDefinitionError(f"cannot start from the checkpoint at {path}: {exc}") from None
    if savepoint is not None:
        print(f"{path} is a retained checkpoint: starting from the savepoint {savepoint} written from it",
              file=sys.stderr)
        config[Options.SAVEPOINT_PATH.key] = savepoint


class LocalContext(ClusterContext):
    """Starts an embedded local cluster for each ``execute`` and stops it afterwards: ``slots``
    per TaskExecutor (default ``taskmanager.numberOfTaskSlots``, 1) and ``taskexecutors`` of
    them (default: as many as the job's slots need, so a job at parallelism 4 gets 4 processes
    of one slot: per-row Python code then runs on as many cores as it has subtasks).

    ``prestarted`` (``yarnflow run``): the first execute's cluster, made by
    ``local_cluster.prestarted`` with its TaskExecutor processes already loading while the job
    file runs; it takes them when it starts, and starts more if the job needs more. ``close()``
    stops it when the job file never used it."""

    def __init__(self, taskexecutors: int | None = None, slots: int | None = None,
                 conf: Mapping[str, str] | None = None, job_file: str | None = None,
                 progress: bool | None = None, prestarted: Any = None) -> None:
        super().__init__("", conf, job_file, progress)
        self.taskexecutors = taskexecutors
        self.slots = slots
        self.cluster: Any = None
        self._prestarted = prestarted

    def _artifact_upload(self) -> str:
        """An embedded cluster's storage is a folder of this machine: the client writes the
        artifact there itself (no HTTP upload to its own AppMaster), unless told otherwise."""
        return super()._artifact_upload() if self.config.is_set(Options.ARTIFACT_UPLOAD) else "storage"

    def _new_cluster(self) -> Any:
        from yarnflow.local_cluster import LocalCluster

        # the AppMaster on this process's threads (one process fewer), unless it must be able to
        # fail over (high availability): then it runs as a process of its own
        in_process = not ha_enabled(self.config)
        return LocalCluster(self.taskexecutors or 1, self.slots, self.conf, appmaster_in_process=in_process)

    def execute(self, env: StreamExecutionEnvironment, job_name: str,
                job: CompiledJob | None = None) -> JobExecutionResult:
        job = compile_job(env, job_name)  # fail on a bad pipeline before starting the cluster
        cluster, self._prestarted = self._prestarted or self._new_cluster(), None
        if not self.taskexecutors:  # one per slot the job needs, at the slots per TaskExecutor it settled on
            cluster.taskexecutors = max(1, -(-job.num_slots // cluster.slots))
        self.cluster = cluster
        try:
            cluster.start(wait_for_taskexecutors=False)
            self.address = cluster.address
            return super().execute(env, job_name, job)  # (compiled once: its warnings said once)
        except BaseException:
            cluster.keep_work_dir = True
            print(f"cluster logs kept in {os.path.join(cluster.work_dir, 'log')}", file=sys.stderr)
            raise
        finally:
            cluster.stop()

    def close(self) -> None:
        """Stop the TaskExecutors started ahead that no job used (the job file ran no job)."""
        cluster, self._prestarted = self._prestarted, None
        if cluster is not None:
            cluster.stop()


class YarnPerJobContext(ClusterContext):
    """Each ``execute`` submits a YARN application for the job (``--target yarn-per-job``): its
    AppMaster runs the job shipped with it and ends the application with the job. Attached (the
    default) the client follows the job to its end; ``detached`` it returns once YARN accepted
    the application."""

    def __init__(self, conf: Mapping[str, str] | None = None, job_file: str | None = None,
                 progress: bool | None = None, detached: bool = False) -> None:
        super().__init__("", conf, job_file, progress, detached)
        self.applications: list[str] = []

    def execute(self, env: StreamExecutionEnvironment, job_name: str,
                job: CompiledJob | None = None) -> JobExecutionResult:
        from yarnflow.common.rpc.serialization import message_to_bytes
        from yarnflow.yarn import ApplicationLocator, Submission, skein_client, submit_application

        job = job or compile_job(env, job_name)
        jg = job.job_graph
        jg.config.update({**self.conf, **jg.config})  # (what the compiler decided stays)
        restore_from_checkpoint(jg.config)
        client = skein_client(self.config)
        app_id = submit_application(self.config, Submission(job_name, message_to_bytes(jg),
                                                            build_artifact(job, self.job_file), self.detached),
                                    client)
        self.applications.append(app_id)
        self.submitted.append(jg.job_id)
        print(f"Submitted job {job_name} ({jg.job_id}) as YARN application {app_id}", file=sys.stderr)
        if self.detached:
            outcome = JobExecutionResult(jg.job_id, job_name, JobStatus.CREATED, 0, "")
            self.results.append(outcome)
            return outcome
        locator = ApplicationLocator(app_id, client)
        self.conf["yarn.application.id"] = app_id
        self.config = self.config.with_overrides({"yarn.application.id": app_id})
        try:
            conn = self.connect()
        except KeyboardInterrupt:
            print(f"\nkilling YARN application {app_id} ...", file=sys.stderr)
            locator.kill()
            raise
        try:
            info = conn.call(lambda gw: gw.cluster_info(), "clusterInfo")
            return self.follow(conn, job, jg.job_id, job_name, info.storage_dir)
        finally:
            conn.close()
            report = locator.wait_final(10.0)
            if report is not None:
                lines = (report.diagnostics or "").strip().splitlines()
                why = f": {lines[-1]}" if lines and str(report.final_status) != "SUCCEEDED" else ""
                print(f"YARN application {app_id} {report.state} (final status {report.final_status}){why}",
                      file=sys.stderr)


_context: ClusterContext | None = None


def current_context() -> ClusterContext:
    global _context
    if _context is None:
        _context = LocalContext()
    return _context


def set_context(ctx: ClusterContext | None) -> None:
    global _context
    _context = ctx


def describe_failure(cause: ErrorInfo | None) -> str:
    return cause.describe() if cause else "unknown cause"


def show_job_failures_briefly() -> None:
    """Have Python report an uncaught ``JobFailedError`` (``python JOB.py`` whose job failed)
    with the user's frames only, the remote ones first, as the CLI does: not yarnflow's client
    and task frames around them. Other exceptions are reported as before. Installed once, by
    ``env.execute()`` when it raises one."""
    previous = sys.excepthook
    if getattr(previous, "_yarnflow", False):
        return

    def hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        if not isinstance(exc, JobFailedError):
            previous(exc_type, exc, tb)
            return
        text = ""
        if isinstance(exc.__cause__, RemoteTraceback):
            text = f"{exc.__cause__.text.rstrip()}\n\n{SEPARATORS[0]}\n\n"
        frames = "".join(traceback.format_list(user_frames(tb)))
        sys.stderr.write(f"{text}Traceback (most recent call last):\n{frames}"
                         f"{exc_type.__module__}.{exc_type.__qualname__}: {exc}\n")

    hook._yarnflow = True  # type: ignore[attr-defined]
    sys.excepthook = hook


__all__ = ["JobExecutionResult", "ClusterContext", "LocalContext", "YarnPerJobContext", "current_context",
           "set_context",
           "ExecutionState"]
