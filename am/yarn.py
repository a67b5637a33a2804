"""The AppMaster in a YARN container (``python -m yarnflow.am --target yarn``), through skein.

The client's ApplicationSpec (``yarnflow.yarn``) runs this as the application's master script,
with the configuration shipped beside it and, for a per-job application, the job's JobGraph and
artifact. Here:

- ``YarnApplication`` wraps the application's skein ApplicationClient: the leading AppMaster
  publishes its RPC address in the application's key-value store (``ADDRESS_KEY``; clients
  look it up there), reports progress, and ends the application with a final status and
  diagnostics.
- The attempt number comes from the container's YARN id. A second attempt (the first AppMaster
  container died) goes on only with ZooKeeper high availability, where it leads the cluster of
  the same id and recovers every job from ZooKeeper; without it the application fails saying why
  (the jobs' state died with the container).
- ``run_per_job`` is a per-job application's life: submit the job shipped with it (or find it
  recovered, or ended already, on a later attempt), report progress, and end the application
  with the job's outcome (FINISHED -> SUCCEEDED, CANCELED -> KILLED, FAILED -> FAILED with the
  failure cause as diagnostics). As Flink's MiniDispatcher in attached mode, it waits for the
  client to fetch the result before it ends (at most ``client.timeout``); ``--detached`` does not.
- A session application ends SUCCEEDED when a client stops it, FAILED with the reason when the
  cluster cannot go on (e.g. more than ``yarn.maximum-failed-containers`` failed containers).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from yarnflow.am.checkpoint.savepoints import resume_point
from yarnflow.common.artifacts import store_artifact
from yarnflow.common.config import Configuration, Options
from yarnflow.common.errors import RefusedError, UnavailableError, YarnflowError
from yarnflow.common.ha import ha_enabled
from yarnflow.common.messages import JobGraph
from yarnflow.common.rpc.serialization import message_from_bytes
from yarnflow.common.states import ExecutionState, JobStatus
from yarnflow.common.kerberos import TicketRenewal
from yarnflow.common.yarn import (ADDRESS_KEY, FIXED_JOB_IDS_VAR, MAIN_ERR, MAIN_OUT, RESUME_VAR, TLS_KEY,
                                  application_config, container_attempt)

if TYPE_CHECKING:
    from yarnflow.am.appmaster import AppMaster

__all__ = ["YarnApplication", "load_job", "run", "run_application_main", "run_per_job"]

log = logging.getLogger(__name__)

#: the route and link name of the web UI among the application's (skein's) web UI pages
WEB_UI_ROUTE = "yarnflow"
WEB_UI_LINK = "yarnflow web UI"
#: the lines of a failed application main()'s error output that become the application's diagnostics
MAIN_ERROR_LINES = 40
_FINAL = {JobStatus.FINISHED: "SUCCEEDED", JobStatus.CANCELED: "KILLED", JobStatus.FAILED: "FAILED"}


class YarnApplication:
    """``app``: the application's skein ApplicationClient."""

    def __init__(self, app: Any, container_id: str | None = None) -> None:
        self.app = app
        self.id = str(getattr(app, "id", "") or os.environ.get("SKEIN_APPLICATION_ID", ""))
        self.attempt = container_attempt(container_id if container_id is not None
                                         else os.environ.get("CONTAINER_ID", ""))
        self._finished = False
        self._lock = threading.Lock()

    def publish_address(self, address: str, tls: bool = False) -> None:
        self.app.kv[TLS_KEY] = b"mutual" if tls else b"off"  # before the address: a client reads it after
        self.app.kv[ADDRESS_KEY] = address.encode()
        log.info("published the AppMaster address %s in application %s", address, self.id)

    def publish_web_ui(self, url: str) -> None:
        """The web UI as a page of the application's web UI (skein's), which YARN's
        ResourceManager links as the application's tracking URL. A new leader's replaces the old."""
        if not url:
            return
        try:
            if any(page.route == WEB_UI_ROUTE for page in self.app.ui.get_pages()):
                self.app.ui.remove_page(WEB_UI_ROUTE)
            self.app.ui.add_page(WEB_UI_ROUTE, url, link_name=WEB_UI_LINK)
            log.info("the web UI %s is the page '%s' of application %s", url, WEB_UI_ROUTE, self.id)
        except Exception as exc:  # noqa: BLE001 - the UI link is a convenience; the cluster works without it
            log.warning("could not link the web UI %s from YARN: %s", url, exc)

    def set_progress(self, fraction: float) -> None:
        try:
            self.app.set_progress(min(1.0, max(0.0, fraction)))
        except Exception:  # noqa: BLE001 - progress is cosmetic
            log.debug("setting the progress failed", exc_info=True)

    def finish(self, final_status: str, diagnostics: str = "") -> None:
        """End the application (once): SUCCEEDED, FAILED or KILLED, with diagnostics."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
        log.info("ending application %s: %s%s", self.id, final_status, f" ({diagnostics})" if diagnostics else "")
        try:
            self.app.shutdown(final_status, diagnostics or None)
        except Exception:  # noqa: BLE001 - YARN ends it anyway when the AppMaster exits
            log.warning("could not report the final status to YARN", exc_info=True)

    @property
    def finished(self) -> bool:
        return self._finished


def load_job(job_graph_file: str, artifact_file: str, storage_dir: str) -> JobGraph:
    """The per-job application's JobGraph, its artifact stored in ``storage_dir``."""
    with open(job_graph_file, "rb") as fh:
        job_graph = message_from_bytes(JobGraph, fh.read())
    with open(artifact_file, "rb") as fh:
        uri, digest = store_artifact(fh.read(), storage_dir)
    return dataclasses.replace(job_graph, artifact_uri=uri, artifact_sha256=digest)


class PerJob:
    """The job of a per-job application: submitted to each new leader's Dispatcher before the
    leadership is published (``on_granted``), so a client never finds the cluster without its
    job; a recovered job (a later attempt, with high availability) is not submitted again."""

    def __init__(self, job_graph: JobGraph) -> None:
        self.job_graph = job_graph
        self.error: YarnflowError | None = None

    def on_granted(self, dispatcher: Any, token: str) -> None:
        jg = self.job_graph
        dispatcher.drop_fetched_results = False  # a later attempt must find the result, not run it again
        try:
            dispatcher.ask(dispatcher.submit_job, jg)
            log.info("job %s (%s) submitted", jg.name, jg.job_id)
        except RefusedError:
            log.info("job %s was recovered (or has ended already): not submitted again", jg.job_id)
        except UnavailableError as exc:  # the leadership went meanwhile: the next grant submits it
            log.warning("job %s not submitted: %s", jg.job_id, exc)
        except YarnflowError as exc:
            self.error = exc


def run_per_job(am: AppMaster, yarn: YarnApplication, per_job: PerJob, *, attached: bool,
                fetch_timeout_s: float) -> None:
    """Report the job's progress once this AppMaster leads, and end the application with the
    job's outcome (returns when it did, or when the AppMaster stopped)."""
    job_graph = per_job.job_graph
    job_id = job_graph.job_id
    while not am.wait(0):
        dispatcher = am.dispatcher
        if per_job.error is not None:
            yarn.finish("FAILED", f"job {job_graph.name} could not be submitted: {per_job.error}")
            am.end_cluster()
            return
        if dispatcher is None:
            time.sleep(0.1)
            continue
        result = dispatcher.job_result(job_id, 1.0)
        if result is None:
            yarn.set_progress(_progress(dispatcher, job_graph))
            continue
        yarn.set_progress(1.0)
        if attached and not dispatcher.wait_result_fetched(job_id, fetch_timeout_s):
            log.warning("no client fetched the result of job %s within %.0f s", job_id, fetch_timeout_s)
        if am.shutdown_reason:  # the cluster failed (e.g. too many failed containers): the job's end follows
            yarn.finish("FAILED", am.shutdown_reason)
        else:
            cause = result.failure_cause.describe() if result.failure_cause is not None else ""
            yarn.finish(_FINAL.get(result.status, "FAILED"), cause or f"job {job_graph.name} {result.status.name}")
        am.end_cluster()
        return


def run_application_main(am: AppMaster, yarn: YarnApplication, main_file: str, main_args: list[str],
                         resume: bool = False) -> None:
    """Application mode: once this AppMaster leads, run the job file's ``main()`` as a client
    of this very cluster (``yarnflow run --target remote`` in a process of its own, in the job's
    unpacked folder), and end the application with it: SUCCEEDED when ``main()``
    returned (its jobs ended), FAILED with the end of its error output (the traceback, or the
    failed job's cause) when it did not. Stopping the AppMaster stops ``main()``.

    The jobs of ``main()`` get fixed ids (``JobID.fixed`` of the application id), as Flink's
    application mode fixes them: an attempt after an AppMaster failure runs ``main()`` again,
    and each ``execute()`` finds its job again, recovered by this leader with high availability
    (the client follows it), or, without (``resume``), started from its latest retained
    checkpoint."""
    while am.dispatcher is None:
        if am.wait(0.2):
            return
    # in the job's unpacked folder: the files shipped beside the job file are where they were to it
    folder = os.path.dirname(os.path.abspath(main_file))
    cmd = [sys.executable, "-m", "yarnflow", "run", "--target", "remote", "--address", am.address, "--no-progress",
           os.path.basename(main_file), *main_args]
    log.info("application mode: running %s in %s", " ".join(cmd[3:]), folder)
    # its output goes to files YARN aggregates with the container's logs: the client prints them
    logs = (os.environ.get("LOG_DIRS") or "").split(",")[0] or os.getcwd()
    with open(os.path.join(logs, MAIN_OUT), "w") as out:
        env = {**os.environ, FIXED_JOB_IDS_VAR: yarn.id, **({RESUME_VAR: "1"} if resume else {})}
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True, errors="replace", cwd=folder,
                                env=env)
    errors = open(os.path.join(logs, MAIN_ERR), "w")  # noqa: SIM115 - closed by the relay when main() ends
    tail: collections.deque[str] = collections.deque(maxlen=MAIN_ERROR_LINES)

    def relay() -> None:  # its error output goes to this container's log and main.err, its end to the diagnostics
        assert proc.stderr is not None
        with errors:
            for line in proc.stderr:
                sys.stderr.write(line)
                errors.write(line)
                errors.flush()
                tail.append(line.rstrip("\n"))

    reader = threading.Thread(target=relay, name="application-main-stderr", daemon=True)
    reader.start()
    while proc.poll() is None:
        if am.wait(0.5):  # the cluster stops under it (killed, or a client shut it down)
            proc.terminate()
            break
    code = proc.wait()
    reader.join(10)
    name = os.path.basename(main_file)
    if code == 0:
        yarn.set_progress(1.0)
        yarn.finish("SUCCEEDED", f"main() of {name} returned")
    elif not yarn.finished:
        yarn.finish("FAILED", f"main() of {name} failed (exit status {code}):\n" + "\n".join(tail))
    am.end_cluster()


def _progress(dispatcher: Any, job_graph: JobGraph) -> float:
    """The share of the job's subtasks that finished (at least 0.1 once it runs)."""
    try:
        info = dispatcher.ask(dispatcher.get_job, job_graph.job_id)
    except Exception:  # noqa: BLE001 - cosmetic
        return 0.1
    total = sum(v.parallelism for v in info.vertices) or 1
    done = sum(v.state_counts.get(ExecutionState.FINISHED, 0) for v in info.vertices)
    return max(0.1, done / total)


def run(args: argparse.Namespace, config: Configuration, app: Any = None) -> int:
    """The AppMaster's life in its YARN container. ``app``: the skein ApplicationClient
    (default: the current application's, from the container's SKEIN_* environment)."""
    from yarnflow.am.appmaster import AppMaster
    from yarnflow.am.resourcemanager.drivers.skein import SkeinDriver
    from yarnflow.common.process import shutdown_on_signals

    if app is None:
        import skein

        app = skein.ApplicationClient.from_current()
    yarn = YarnApplication(app)
    TicketRenewal.in_container(config)  # (with a shipped keytab: Kerberos tickets renewed from it)
    restarted = yarn.attempt > 1 and not ha_enabled(config)  # (with HA the new leader recovers the jobs)
    if restarted and not (args.job_graph or args.application):
        reason = (f"AppMaster attempt {yarn.attempt} of application {yarn.id}: the previous AppMaster container "
                  "died, and without high availability (high-availability.type: zookeeper) the session's jobs "
                  "died with it, so nothing can be recovered")
        log.error(reason)
        yarn.finish("FAILED", reason)
        return 1
    config = application_config(config, yarn.id)
    work_dir = os.path.abspath(args.work_dir or "appmaster")
    driver = SkeinDriver(config, app)
    try:
        am = AppMaster(config, yarn.id, "yarn", driver=driver, work_dir=work_dir)
    except YarnflowError as exc:
        yarn.finish("FAILED", f"the AppMaster could not start: {exc}")
        raise
    driver.on_fatal = am.fail
    if am.storage_dir.startswith("file://"):
        log.warning("job data is stored in the AppMaster's container (%s): TaskExecutors on other hosts cannot "
                    "write collected results or checkpoints (without execution.checkpointing.dir) there; set "
                    "yarn.staging-directory (or high-availability.storageDir) to a shared filesystem (hdfs://...) "
                    "on a multi-host cluster (job artifacts need none: the AppMaster serves them)", am.storage_dir)
    if restarted:
        log.info("AppMaster attempt %d: without high availability the previous attempt's jobs start again, each "
                 "from its latest retained checkpoint (in execution.checkpointing.dir) where it has one",
                 yarn.attempt)
    elif yarn.attempt > 1:
        log.info("AppMaster attempt %d: recovering the cluster's jobs through ZooKeeper", yarn.attempt)
    am.on_leadership.append(lambda: yarn.publish_address(am.address, am.tls is not None))
    am.on_leadership.append(lambda: yarn.publish_web_ui(am.web_url))

    def on_shutdown(cluster_ends: bool, reason: str) -> None:
        if cluster_ends:
            yarn.finish("FAILED" if reason else "SUCCEEDED", reason or "the cluster was shut down")

    am.on_shutdown.append(on_shutdown)
    per_job = None
    if args.job_graph:
        try:
            job_graph = load_job(args.job_graph, args.artifact, am.storage_dir)
            if restarted:  # the same job (its id shipped with the application) from where it was
                job_graph.config[Options.SAVEPOINT_PATH.key] = (job_graph.config.get(Options.SAVEPOINT_PATH.key)
                                                                or resume_point(job_graph.config, am.storage_dir,
                                                                                job_graph.job_id))
            per_job = PerJob(job_graph)
        except (YarnflowError, OSError) as exc:
            yarn.finish("FAILED", f"the job shipped with the application cannot be loaded: {exc}")
            raise
        am.on_granted.append(per_job.on_granted)
    shutdown_on_signals(lambda _reason: am.shutdown())
    am.start()
    print(f"yarnflow AppMaster of application {yarn.id} (attempt {yarn.attempt}) listening on {am.address}",
          flush=True)
    if args.application:
        threading.Thread(target=run_application_main, name="application-main", daemon=True, args=(
            am, yarn, args.application, json.loads(args.application_args), restarted)).start()
    if per_job is not None:
        runner = threading.Thread(target=run_per_job, name="per-job", daemon=True, kwargs=dict(
            am=am, yarn=yarn, per_job=per_job, attached=not args.detached,
            fetch_timeout_s=config[Options.CLIENT_TIMEOUT] / 1000.0))
        runner.start()
    while not am.wait(1.0):
        pass
    # the shutdown runs on; its listeners end the application with its final status: exiting before
    # they did would end it as skein's default ("Application driver completed successfully")
    am.wait_finished(30.0)
    return 1 if am.shutdown_reason else 0
