"""The AppMaster's REST API and web UI (Flink's WebMonitorEndpoint), served by Flask on a
werkzeug server thread of the AppMaster, beside the Dispatcher.

Paths and JSON shapes are Flink's (``views.py``), under ``/`` and ``/v1/``; the OpenAPI document
is ``/v1/openapi.json``; the web UI is ``/`` (static files of ``am/web/``). Every error is JSON
``{"errors": [...]}``: 400 for a malformed id or body, 404 for an unknown job, vertex,
TaskExecutor or trigger, 409 for a job that already ended, 503 while this AppMaster stands by
(naming the leader) or the cluster is not ready. A standby answers ``/config`` and the UI's
files too, so the UI can say who leads.

Authentication (``rest.authentication``; docs/security.md): with a token, every path but the
login page (``/login``) and the UI's static files (``/web/...``: no data) needs the cluster's
REST token, as ``Authorization: Bearer <token>``, as the password of HTTP basic, or in the
cookie the login page sets; without it a browser asking for the UI is sent to the login page
and everything else gets 401 JSON. ``security.ssl.rest.enabled`` serves it all over HTTPS.

Savepoints are asynchronous as in Flink: ``POST /jobs/:jobid/savepoints`` answers at once with a
``request-id``; the savepoint is taken on a small pool, and ``GET .../savepoints/:triggerid``
reports IN_PROGRESS, then COMPLETED with the savepoint's location or its failure cause."""

from __future__ import annotations

import collections
import json
import logging
import re
import socket
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from flask import Flask, Response, jsonify, request, send_from_directory
from werkzeug.exceptions import HTTPException
from werkzeug.serving import BaseWSGIServer, make_server

from yarnflow.am.logs import read_job_logs
from yarnflow.am.rest import views
from yarnflow.am.rest.api_error import ApiError
from yarnflow.am.rest.archive import JobArchivist
from yarnflow.am.rest.access_log import AccessLogHandler
from yarnflow.am.rest.openapi import openapi_document
from yarnflow.common.addresses import rest_advertised_address, rest_bind_address
from yarnflow.common.config import Options
from yarnflow.common.errors import (
    FencingTokenError,
    InvalidRequestError,
    NotFoundError,
    RefusedError,
    RpcError,
    UnavailableError,
)
from yarnflow.common.ids import JobID
from yarnflow.common.spark_reports import read_spark_reports
from yarnflow.common.metrics import bind_first_free
from yarnflow.am.rest.job_api import JobApi, ask_stop_mode, is_trigger_id
from yarnflow.am.rest.flamegraph import ThreadInfoApi
from yarnflow.am.rest.jars import JarApi
from yarnflow.am.rest.metrics_api import MetricsApi
from yarnflow.am.rest.auth import bad_storage_path, https_context, install_token_check, json_depth, rest_auth_token
from yarnflow.am.rest.uploads import UploadError, receive_artifact
from yarnflow.common.metrics import metrics_address
from yarnflow.common.version import __version__

if TYPE_CHECKING:
    from yarnflow.am.appmaster import AppMaster
    from yarnflow.am.dispatcher.dispatcher import Dispatcher

log = logging.getLogger(__name__)

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
_JOB_ID = re.compile(r"[0-9a-fA-F]{32}")
#: savepoint triggers remembered for their status
MAX_TRIGGERS = 100


_RPC_STATUS: list[tuple[type[Exception], int]] = [
    (NotFoundError, 404), (InvalidRequestError, 400), (RefusedError, 409), (FencingTokenError, 503),
    (UnavailableError, 503), (RpcError, 500),
]


class RestServer:
    def __init__(self, am: AppMaster) -> None:
        self.appmaster = am
        self.configuration = am.config
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="rest-savepoint")
        #: trigger id -> (its job, or None for a savepoint disposal; the operation)
        self._triggers: collections.OrderedDict[str, tuple[JobID | None, Future[Any]]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.url = ""
        self._token = rest_auth_token(self.configuration, am.tls)
        self._https = https_context(self.configuration, am.tls)
        self.job_api = JobApi(self)
        self.thread_api = ThreadInfoApi(self)
        self.app = self._make_app()
        self._archivist: JobArchivist | None = None
        if self.configuration[Options.ARCHIVE_DIR]:  # ended jobs archived for the history server
            archivist = self._archivist = JobArchivist(self.app, self.configuration[Options.ARCHIVE_DIR], self._token)
            am.on_granted.append(lambda dispatcher, _session: dispatcher.on_job_ended.append(archivist.archive))

    def flush_archives(self, timeout_s: float) -> None:
        if self._archivist is not None:
            self._archivist.flush(timeout_s)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> RestServer:
        host = rest_bind_address(self.configuration)
        server, _ = bind_first_free(self.configuration[Options.REST_PORT], lambda port: self._bind(host, port), "REST API")
        self._server = server
        port = server.port
        shown = rest_advertised_address(self.configuration)
        self.url = f"{'https' if self._https is not None else 'http'}://{shown}:{port}"
        # (polled every 50 ms, not every 0.5 s: stop() waits for the next poll)
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="rest-server", daemon=True)
        self._thread.start()
        log.info("REST API and web UI at %s", self.url)
        return self

    def _bind(self, host: str, port: int) -> BaseWSGIServer:
        """A server on ``host:port``; OSError when the port is taken. (The socket is bound here:
        werkzeug's own bind exits the process when the port is in use.)"""
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
            return make_server(host, sock.getsockname()[1], self.app, threaded=True, fd=sock.fileno(),
                               ssl_context=self._https, request_handler=AccessLogHandler)
        finally:
            sock.close()  # the server holds a duplicate of it

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.thread_api.stop()

    # -- helpers ---------------------------------------------------------------------------------
    def dispatcher(self) -> Dispatcher:
        dispatcher = self.appmaster.dispatcher
        if dispatcher is None:
            raise ApiError(503, self.appmaster.standby_message())
        return dispatcher

    @staticmethod
    def _job_id(jobid: str) -> JobID:
        if not _JOB_ID.fullmatch(jobid):
            raise ApiError(400, f"{jobid!r} is not a job id (32 hexadecimal characters)")
        return JobID(jobid.lower())

    def job_status(self, jobid: str) -> Any:
        dispatcher = self.dispatcher()
        return dispatcher.ask(dispatcher.get_job, self._job_id(jobid))

    def vertex_status(self, jobid: str, vertexid: str) -> tuple[Any, Any]:
        if not _JOB_ID.fullmatch(vertexid):
            raise ApiError(400, f"{vertexid[:100]!r} is not a vertex id (32 hexadecimal characters)")
        info = self.job_status(jobid)
        for v in info.vertices:
            if str(v.vertex_id) == vertexid:
                return info, v
        raise ApiError(404, f"job {jobid} has no vertex {vertexid}")

    def job_graph(self, job_id: str) -> Any:
        dispatcher = self.dispatcher()
        return dispatcher.ask(dispatcher.job_graph, JobID(job_id))

    def body(self) -> dict[str, Any]:
        data = request.get_data()
        if not data:
            return {}
        limit = self.configuration[Options.REST_MAX_JSON_DEPTH]
        if json_depth(data) > limit:  # (json would recurse until it gave up: a 500)
            raise ApiError(400, f"the request body nests deeper than {limit} levels (rest.server.max-json-depth)")
        try:  # whatever the content type says, as Flink's REST does (curl -d sends a form's)
            body = json.loads(data)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return body

    # -- the application -------------------------------------------------------------------------
    def _make_app(self) -> Flask:
        app = Flask("yarnflow.am.rest", static_folder=str(WEB_DIR), static_url_path="/web")
        app.json.sort_keys = False  # type: ignore[attr-defined]

        def route(rule: str, fn: Callable[..., Any], methods: tuple[str, ...] = ("GET",)) -> None:
            for prefix in ("", "/v1"):
                app.add_url_rule(prefix + rule, f"{prefix}{fn.__qualname__}", fn, methods=list(methods))

        @app.errorhandler(ApiError)
        def api_error(exc: ApiError) -> tuple[Response, int]:
            return jsonify(errors=[str(exc)]), exc.status

        @app.errorhandler(HTTPException)
        def http_error(exc: HTTPException) -> tuple[Response, int]:
            return jsonify(errors=[exc.description or exc.name]), exc.code or 500

        @app.errorhandler(RpcError)
        def rpc_error(exc: RpcError) -> tuple[Response, int]:
            status = next(code for kind, code in _RPC_STATUS if isinstance(exc, kind))
            if status == 500:
                log.warning("REST %s %s failed: %s", request.method, request.path, exc)
            return jsonify(errors=[str(exc)]), status

        @app.errorhandler(Exception)
        def internal_error(exc: Exception) -> tuple[Response, int]:
            log.exception("REST %s %s failed", request.method, request.path)
            return jsonify(errors=[f"internal error: {type(exc).__name__}: {exc}"]), 500

        if self._token:
            install_token_check(app, self._token, secure=self._https is not None)

        @app.after_request
        def no_cache(response: Response) -> Response:
            response.headers["Cache-Control"] = "no-store"
            return response

        app.add_url_rule("/", "index", lambda: send_from_directory(WEB_DIR, "index.html"))
        route("/openapi.json", self.openapi)
        for rule, fn, methods in (
                ("/config", self.config, ("GET",)), ("/overview", self.overview, ("GET",)),
                ("/jobs", self.jobs, ("GET",)), ("/jobs/overview", self.jobs_overview, ("GET",)),
                ("/jobs/<jobid>", self.job, ("GET",)), ("/jobs/<jobid>", self.cancel, ("PATCH",)),
                ("/jobs/<jobid>/plan", self.plan, ("GET",)),
                ("/jobs/<jobid>/exceptions", self.exceptions, ("GET",)),
                ("/jobs/<jobid>/checkpoints", self.checkpoints, ("GET",)),
                ("/jobs/<jobid>/spark", self.spark, ("GET",)),
                ("/jobs/<jobid>/vertices/<vertexid>", self.vertex, ("GET",)),
                ("/jobs/<jobid>/vertices/<vertexid>/backpressure", self.backpressure, ("GET",)),
                ("/jobs/<jobid>/savepoints", self.trigger_savepoint, ("POST",)),
                ("/jobs/<jobid>/savepoints/<triggerid>", self.savepoint_status, ("GET",)),
                ("/jobs/<jobid>/rescaling", self.trigger_rescaling, ("PATCH",)),
                ("/jobs/<jobid>/rescaling/<triggerid>", self.rescaling_status, ("GET",)),
                ("/jobs/<jobid>/logs", self.job_logs, ("GET",)),
                ("/taskmanagers", self.taskmanagers, ("GET",)),
                ("/taskmanagers", self.scale_taskmanagers, ("PATCH",)),
                ("/taskmanagers/<tmid>", self.taskmanager, ("GET",)),
                ("/metrics/prometheus-targets", self.prometheus_targets, ("GET",)),
                ("/artifacts", self.upload_artifact, ("POST",))):
            route(rule, fn, methods)
        for more, handler, verbs in (self.job_api.routes() + MetricsApi(self).routes() + JarApi(self).routes()
                                     + self.thread_api.routes()):
            route(more, handler, verbs)
        return app

    # -- handlers --------------------------------------------------------------------------------
    def openapi(self) -> Response:
        return jsonify(openapi_document())

    def config(self) -> Response:
        return jsonify({"refresh-interval": 3000, "timezone-name": "UTC", "timezone-offset": 0,
                        "flink-version": __version__, "flink-revision": f"yarnflow {__version__}",
                        "features": {"web-submit": self.configuration[Options.WEB_SUBMIT], "web-cancel": True, "web-rescale": False,
                                     "web-history": False},
                        "cluster-id": self.appmaster.cluster_id, "leader": self.appmaster.is_leader})

    def all_jobs(self) -> list[Any]:
        dispatcher = self.dispatcher()
        return dispatcher.ask(dispatcher.list_jobs)

    def overview(self) -> Response:
        dispatcher = self.dispatcher()
        info = dispatcher.ask(dispatcher.cluster_info)
        return jsonify({"taskmanagers": info.registered_taskexecutors, "slots-total": info.total_slots,
                        "slots-available": info.free_slots, **views.overview_counts(self.all_jobs()),
                        "flink-version": __version__, "flink-commit": f"yarnflow {__version__}"})

    def jobs(self) -> Response:
        return jsonify(jobs=[{"id": str(j.job_id), "status": j.status.name} for j in self.all_jobs()])

    def jobs_overview(self) -> Response:
        return jsonify(jobs=[views.job_overview(j) for j in reversed(self.all_jobs())])

    def job(self, jobid: str) -> Response:
        info = self.job_status(jobid)
        graph = self.job_graph(info.job_id)
        details = views.job_details(info, graph)
        details["checkpointing"] = self._checkpointing(graph)
        return jsonify(details)

    def _checkpointing(self, graph: Any) -> bool:
        return graph is None or int(self.configuration.with_overrides(graph.config)[Options.CHECKPOINT_INTERVAL]) > 0

    def cancel(self, jobid: str) -> tuple[Response, int]:
        mode = request.args.get("mode", "cancel").lower()
        if mode == "stop":  # stop-with-savepoint into state.savepoints.dir
            return ask_stop_mode(self.job_api, jobid)
        if mode != "cancel":
            raise ApiError(400, f"mode {mode!r} is not supported: use mode=cancel or mode=stop")
        dispatcher = self.dispatcher()
        dispatcher.ask(dispatcher.cancel_job, self._job_id(jobid))
        return jsonify({}), 202

    def plan(self, jobid: str) -> Response:
        info = self.job_status(jobid)
        return jsonify(views.plan(info, self.job_graph(info.job_id)))

    def exceptions(self, jobid: str) -> Response:
        return jsonify(views.exceptions(self.job_status(jobid)))

    def checkpoints(self, jobid: str) -> Response:
        info = self.job_status(jobid)
        if not self._checkpointing(self.job_graph(info.job_id)):
            raise ApiError(404, f"job {jobid} takes no checkpoints (execution.checkpointing.interval is not set)")
        return jsonify(views.checkpoints(info))

    def spark(self, jobid: str) -> Response:
        """The job's Spark stages: application, master, executors, Spark jobs and stages of the
        last run (yarnflow's own endpoint; Flink has no Spark)."""
        info = self.job_status(jobid)
        return jsonify({"stages": read_spark_reports(self.appmaster.storage_dir, str(info.job_id))})

    def vertex(self, jobid: str, vertexid: str) -> Response:
        info, v = self.vertex_status(jobid, vertexid)
        graph = self.job_graph(info.job_id)
        max_par = next((jv.max_parallelism for jv in graph.vertices if jv.vertex_id == v.vertex_id), -1) \
            if graph is not None else -1
        return jsonify(views.subtasks(info, v, max_par))

    def backpressure(self, jobid: str, vertexid: str) -> Response:
        return jsonify(views.backpressure(self.vertex_status(jobid, vertexid)[1]))

    def trigger_savepoint(self, jobid: str) -> tuple[Response, int]:
        body = self.body()
        target = body.get("target-directory")
        cancel_job = body.get("cancel-job", False)
        if target is not None and not isinstance(target, str):
            raise ApiError(400, "target-directory must be a string")
        if target:
            why = bad_storage_path(target)
            if why:
                raise ApiError(400, f"target-directory {target[:200]!r}: {why}")
        if not isinstance(cancel_job, bool):
            raise ApiError(400, "cancel-job must be true or false")
        info = self.job_status(jobid)
        if info.status.is_globally_terminal:
            raise ApiError(409, f"job {jobid} already ended {info.status.name}")
        graph = self.job_graph(info.job_id)
        config = self.configuration.with_overrides(graph.config if graph is not None else {})
        if not target and not config[Options.SAVEPOINTS_DIR]:
            raise ApiError(400, "no savepoint folder: give target-directory or set state.savepoints.dir")
        dispatcher = self.dispatcher()
        job_id = info.job_id

        def take() -> str:
            path = dispatcher.ask(dispatcher.trigger_savepoint, job_id, target or "", timeout=None)
            if cancel_job:
                dispatcher.ask(dispatcher.cancel_job, job_id)
            return path

        return self.trigger(job_id, take)

    def trigger_rescaling(self, jobid: str) -> tuple[Response, int]:
        """Flink's ``PATCH /jobs/:jobid/rescaling?parallelism=N``: the rescale runs on the pool
        (``Dispatcher.rescale_job``); its status under the answered ``request-id``."""
        raw = request.args.get("parallelism", "")
        if not raw.isdigit() or int(raw) < 1:
            raise ApiError(400, "parallelism must be a positive integer (?parallelism=N)")
        info = self.job_status(jobid)
        if info.status.is_globally_terminal:
            raise ApiError(409, f"job {jobid} already ended {info.status.name}")
        dispatcher, job_id, parallelism = self.dispatcher(), info.job_id, int(raw)
        return self.trigger(job_id, lambda: dispatcher.ask(dispatcher.rescale_job, job_id, parallelism, timeout=None))

    def trigger(self, job_id: JobID | None, work: Any) -> tuple[Response, int]:
        trigger_id = uuid.uuid4().hex
        with self._lock:
            self._triggers[trigger_id] = (job_id, self._pool.submit(work))
            while len(self._triggers) > MAX_TRIGGERS:
                self._triggers.popitem(last=False)
        return jsonify({"request-id": trigger_id}), 202

    def savepoint_status(self, jobid: str, triggerid: str) -> Response:
        return self.operation_status(jobid, triggerid, "savepoint", lambda path: {"location": path})

    def rescaling_status(self, jobid: str, triggerid: str) -> Response:
        return self.operation_status(jobid, triggerid, "rescaling", lambda parallelism: {"parallelism": parallelism})

    def operation_status(self, jobid: str | None, triggerid: str, what: str, done: Any) -> Response:
        job_id = self._job_id(jobid) if jobid is not None else None
        if not is_trigger_id(triggerid):
            raise ApiError(400, f"{triggerid[:100]!r} is not a trigger id (32 hexadecimal characters)")
        with self._lock:
            entry = self._triggers.get(triggerid)
        if entry is None or entry[0] != job_id:
            raise ApiError(404, f"no {what} trigger {triggerid}" + (f" for job {jobid}" if jobid else ""))
        future = entry[1]
        if not future.done():
            return jsonify({"status": {"id": "IN_PROGRESS"}, "operation": None})
        exc = future.exception()
        if exc is not None:
            return jsonify({"status": {"id": "COMPLETED"}, "operation": {"failure-cause": {
                "class": type(exc).__name__, "stack-trace": str(exc), "serialized-throwable": None}}})
        return jsonify({"status": {"id": "COMPLETED"}, "operation": done(future.result())})

    def job_logs(self, jobid: str) -> Response:
        job_id = self._job_id(jobid)
        self.job_status(jobid)  # 404 for a job this cluster does not know
        te = request.args.get("taskexecutor", "")
        try:
            found = read_job_logs(self.appmaster.work_dir, job_id, te)
        except KeyError:
            raise ApiError(404, f"no log of TaskExecutor {te} on this AppMaster's host") from None
        return jsonify(logs=[{"source": source, "lines": lines} for source, lines in found.items()])

    def task_executors(self) -> list[dict[str, Any]]:
        rm = self.appmaster.rm
        if rm is None:
            raise ApiError(503, self.appmaster.standby_message())
        return [views_taskmanager(entry) for entry in rm.task_executor_details()]

    def taskmanagers(self) -> Response:
        return jsonify(taskmanagers=[{k: v for k, v in tm.items() if k != "allocatedSlots"}
                                     for tm in self.task_executors()])

    def scale_taskmanagers(self) -> Response:
        """``PATCH /taskmanagers?count=N`` (yarnflow's own, ``yarnflow session scale``): the cluster
        runs N TaskExecutors from now on (``Dispatcher.scale_session``)."""
        raw = request.args.get("count", "")
        if not raw.isdigit():
            raise ApiError(400, "count must be a whole number of TaskExecutors (?count=N)")
        dispatcher = self.dispatcher()
        return jsonify(taskmanagers=dispatcher.ask(dispatcher.scale_session, int(raw)))

    def upload_artifact(self) -> Response:
        """A job artifact streamed by a client that cannot write the storage dir (``uploads.py``)."""
        dispatcher = self.dispatcher()
        storage = dispatcher.ask(dispatcher.cluster_info).storage_dir
        try:
            uri, sha256, size = receive_artifact(request.stream, request.content_length,
                                                 request.args.get("sha256", ""), storage,
                                                 self.configuration[Options.REST_MAX_CONTENT_LENGTH])
        except UploadError as exc:
            raise ApiError(exc.status, str(exc)) from None
        return jsonify({"uri": uri, "sha256": sha256, "size": size}), 201  # type: ignore[return-value]

    def prometheus_targets(self) -> Response:
        """``http_sd_configs`` (or a ``file_sd_configs`` file written from it) for a Prometheus
        that scrapes this cluster: every process's metrics address, as it registers."""
        appmaster = metrics_address(self.appmaster.metrics, self.appmaster.address)
        return jsonify(prometheus_targets(self.appmaster.cluster_id, appmaster, self.task_executors()))

    def taskmanager(self, tmid: str) -> Response:
        for tm in self.task_executors():
            if tm["id"] == tmid:
                return jsonify(tm)
        raise ApiError(404, f"no TaskExecutor {tmid} is registered")


def prometheus_targets(cluster_id: str, appmaster: str, task_executors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Prometheus's HTTP (and file-based) service discovery document: the metrics endpoints of
    the AppMaster and of every registered TaskExecutor, labelled with the cluster's id."""
    groups = [{"targets": [appmaster], "labels": {"cluster_id": cluster_id, "component": "jobmanager"}}
              if appmaster else None]
    groups += [{"targets": [tm["metricsAddress"]], "labels": {"cluster_id": cluster_id, "component": "taskmanager",
                                                              "tm_id": tm["id"]}}
               for tm in task_executors if tm.get("metricsAddress")]
    return [g for g in groups if g is not None]


def memory_view(memory: Any) -> dict[str, Any] | None:
    """A TaskExecutor's ``MemoryStatus`` (its memory watchdog's last measurement) in REST."""
    if memory is None:
        return None
    return {"used": memory.used_bytes, "peak": memory.peak_bytes, "limit": memory.limit_bytes,
            "arrow": memory.arrow_bytes, "managedTotal": memory.managed_total_bytes,
            "managedUsed": memory.managed_used_bytes, "rocksdb": memory.rocksdb_bytes, "level": memory.level,
            "cpuLoad": memory.cpu_load}


def views_taskmanager(entry: Any) -> dict[str, Any]:
    """Flink's TaskManagerInfo (with ``allocatedSlots``) from a ResourceManager's
    ``TaskExecutorDetails``."""
    reg = entry.registration
    profile = reg.slot_profile
    free = sum(1 for s in entry.slots if s.job_id is None)
    resource = {"cpuCores": profile.cpu_cores * reg.num_slots, "taskHeapMemory": profile.memory_mb * reg.num_slots,
                "taskOffHeapMemory": 0, "managedMemory": 0, "networkMemory": 0, "extendedResources": {}}
    free_resource = {**resource, "cpuCores": profile.cpu_cores * free, "taskHeapMemory": profile.memory_mb * free}
    host = reg.rpc_address.rsplit(":", 1)[0]
    return {"id": str(reg.resource_id), "path": reg.rpc_address, "worker": str(reg.worker_id),
            "dataPort": int(reg.data_address.rsplit(":", 1)[1]) if ":" in reg.data_address else -1,
            "jmxPort": -1, "timeSinceLastHeartbeat": entry.last_heartbeat_epoch_ms,
            "slotsNumber": reg.num_slots, "freeSlots": free, "totalResource": resource,
            "freeResource": free_resource,
            "hardware": {"cpuCores": int(profile.cpu_cores * reg.num_slots) or 1,
                         "physicalMemory": profile.memory_mb * reg.num_slots * (1 << 20), "freeMemory": 0,
                         "managedMemory": 0},
            "host": reg.hostname or host, "pid": reg.pid, "dataAddress": reg.data_address,
            "metricsAddress": reg.metrics_address or None,
            "memory": memory_view(entry.memory),
            "allocatedSlots": [{"index": s.index, "jobId": str(s.job_id) if s.job_id else None,
                                "state": s.state, "resource": {"cpuCores": profile.cpu_cores,
                                                               "taskHeapMemory": profile.memory_mb}}
                               for s in entry.slots]}
