"""Flink's REST paths beyond a job's details and its vertices' (issue 32): a job's status,
configuration, checkpoint configuration and one checkpoint's details, its execution result and
accumulators, stop-with-savepoint, one subtask and a vertex per TaskExecutor; the AppMaster's
configuration, log files and thread dump; a TaskExecutor's log files; shutting the cluster
down and disposing of a savepoint. Shapes and status codes are those of Flink's
``rest_v1_dispatcher.yml``: 400 for a malformed id or body, 404 for what does not exist.

Configuration values whose key names a secret (Flink's list: ``password``, ``secret``, ``token``,
...) are shown as ``******``."""

from __future__ import annotations

import os
import re
from collections import Counter
import threading
from typing import TYPE_CHECKING, Any, Callable

from flask import Response, jsonify, request, send_file

from yarnflow.am.logs import log_files, own_output_file
from yarnflow.am.rest import views
from yarnflow.am.rest.api_error import ApiError
from yarnflow.am.rest.auth import bad_storage_path
from yarnflow.common.config import Options
from yarnflow.common.states import ExecutionState, JobStatus
from yarnflow.common.thread_info import stringified, thread_dump

if TYPE_CHECKING:
    from yarnflow.am.rest.server import RestServer

_HEX32 = re.compile(r"[0-9a-fA-F]{32}")
#: parts of a configuration key that mark its value secret (Flink's GlobalConfiguration)
SENSITIVE = ("password", "secret", "fs.azure.account.key", "apikey", "api-key", "auth-params", "service-key",
             "token", "basic-auth", "jaas.config", "http-headers")
HIDDEN = "******"
_APPLICATION_STATUS = {JobStatus.FINISHED: "SUCCEEDED", JobStatus.FAILED: "FAILED", JobStatus.CANCELED: "CANCELED"}


def key_values(config: dict[str, str]) -> list[dict[str, str]]:
    """Flink's ClusterConfigurationInfo: ``[{"key", "value"}]``, sorted, secrets hidden."""
    return [{"key": k, "value": HIDDEN if any(s in k.lower() for s in SENSITIVE) else v}
            for k, v in sorted(config.items())]


#: the names Flink's clients ask for the main log and the standard output by
FLINK_LOG_NAMES = {"jobmanager": ("jobmanager.log", "jobmanager.out"),
                   "taskmanager": ("taskmanager.log", "taskmanager.out")}


def _index(raw: str, what: str) -> int:
    if not raw.isascii() or not raw.isdigit() or int(raw) >= 1 << 63:
        raise ApiError(400, f"{raw[:40]!r} is not a {what} (a non-negative integer)")
    return int(raw)


class JobApi:
    """The handlers; ``routes()`` lists them for the REST server (under ``/`` and ``/v1``)."""

    def __init__(self, rest: RestServer) -> None:
        self._r = rest

    def routes(self) -> list[tuple[str, Callable[..., Any], tuple[str, ...]]]:
        return [
            ("/jobs/<jobid>/status", self.status, ("GET",)),
            ("/jobs/<jobid>/config", self.config, ("GET",)),
            ("/jobs/<jobid>/jobmanager/config", self.job_manager_config, ("GET",)),
            ("/jobs/<jobid>/checkpoints/config", self.checkpoint_config, ("GET",)),
            ("/jobs/<jobid>/checkpoints/details/<checkpointid>", self.checkpoint_details, ("GET",)),
            ("/jobs/<jobid>/checkpoints/details/<checkpointid>/subtasks/<vertexid>", self.checkpoint_subtasks,
             ("GET",)),
            ("/jobs/<jobid>/execution-result", self.execution_result, ("GET",)),
            ("/jobs/<jobid>/accumulators", self.accumulators, ("GET",)),
            ("/jobs/<jobid>/stop", self.stop, ("POST",)),
            ("/jobs/<jobid>/vertices/<vertexid>/subtasks/<index>", self.subtask, ("GET",)),
            ("/jobs/<jobid>/vertices/<vertexid>/subtasks/<index>/attempts/<attempt>", self.attempt, ("GET",)),
            ("/jobs/<jobid>/vertices/<vertexid>/subtasks/<index>/attempts/<attempt>/accumulators",
             self.attempt_accumulators, ("GET",)),
            ("/jobs/<jobid>/vertices/<vertexid>/taskmanagers", self.vertex_taskmanagers, ("GET",)),
            ("/jobs/<jobid>/vertices/<vertexid>/subtasktimes", self.subtask_times, ("GET",)),
            ("/jobs/<jobid>/vertices/<vertexid>/accumulators", self.vertex_accumulators, ("GET",)),
            ("/jobs/<jobid>/vertices/<vertexid>/subtasks/accumulators", self.subtasks_accumulators, ("GET",)),
            ("/jobmanager/config", self.cluster_config, ("GET",)),
            ("/jobmanager/logs", self.job_manager_logs, ("GET",)),
            ("/jobmanager/logs/<name>", self.job_manager_log, ("GET",)),
            ("/jobmanager/log", self.job_manager_main_log, ("GET",)),
            ("/jobmanager/stdout", self.job_manager_stdout, ("GET",)),
            ("/taskmanagers/<tmid>/log", self.task_manager_main_log, ("GET",)),
            ("/taskmanagers/<tmid>/stdout", self.task_manager_stdout, ("GET",)),
            ("/jobmanager/thread-dump", self.thread_dump, ("GET",)),
            ("/taskmanagers/<tmid>/logs", self.task_manager_logs, ("GET",)),
            ("/taskmanagers/<tmid>/logs/<name>", self.task_manager_log, ("GET",)),
            ("/cluster", self.shutdown, ("DELETE",)),
            ("/datasets", self.data_sets, ("GET",)),
            ("/datasets/<datasetid>", self.delete_data_set, ("DELETE",)),
            ("/savepoint-disposal", self.dispose_savepoint, ("POST",)),
            ("/savepoint-disposal/<triggerid>", self.disposal_status, ("GET",)),
        ]

    # -- a job -----------------------------------------------------------------------------------
    def _effective(self, info: Any) -> Any:
        graph = self._r.job_graph(info.job_id)
        return graph, self._r.configuration.with_overrides(graph.config if graph is not None else {})

    def status(self, jobid: str) -> Response:
        return jsonify(status=self._r.job_status(jobid).status.name)

    def config(self, jobid: str) -> Response:
        info = self._r.job_status(jobid)
        graph, config = self._effective(info)
        parallelism = max((v.parallelism for v in graph.vertices), default=config[Options.PARALLELISM]) \
            if graph is not None else config[Options.PARALLELISM]
        return jsonify({"jid": str(info.job_id), "name": info.name, "execution-config": {
            "execution-mode": graph.runtime_mode if graph is not None else "STREAMING",
            "restart-strategy": info.restart_strategy or config[Options.RESTART_STRATEGY],
            "job-parallelism": parallelism, "object-reuse-mode": False,
            "user-config": {e["key"]: e["value"] for e in key_values(dict(graph.config) if graph else {})}}})

    def job_manager_config(self, jobid: str) -> Response:
        return jsonify(key_values(self._effective(self._r.job_status(jobid))[1].to_strings()))

    def checkpoint_config(self, jobid: str) -> Response:
        info = self._r.job_status(jobid)
        _, config = self._effective(info)
        interval = int(config[Options.CHECKPOINT_INTERVAL] or 0)
        if interval <= 0:
            raise ApiError(404, f"checkpointing is not enabled for job {jobid} (execution.checkpointing.interval)")
        retention = config[Options.CHECKPOINT_RETENTION]
        return jsonify({
            "mode": config[Options.CHECKPOINT_MODE], "interval": interval,
            "timeout": config[Options.CHECKPOINT_TIMEOUT], "min_pause": config[Options.CHECKPOINT_MIN_PAUSE],
            "max_concurrent": config[Options.CHECKPOINT_MAX_CONCURRENT],
            "externalization": {"enabled": retention != "NO_EXTERNALIZED_CHECKPOINTS",
                                "delete_on_cancellation": retention != "RETAIN_ON_CANCELLATION"},
            "state_backend": config[Options.STATE_BACKEND], "checkpoint_storage": "FileSystemCheckpointStorage",
            "unaligned_checkpoints": config[Options.CHECKPOINT_UNALIGNED],
            "tolerable_failed_checkpoints": config[Options.CHECKPOINT_TOLERABLE_FAILURES],
            "aligned_checkpoint_timeout": config[Options.ALIGNED_CHECKPOINT_TIMEOUT],
            "checkpoints_after_tasks_finish": True, "state_changelog_enabled": False,
            "checkpoint_storage_path": config[Options.CHECKPOINT_DIR] or None,
            "num_retained": config[Options.CHECKPOINT_NUM_RETAINED]})

    def checkpoint_details(self, jobid: str, checkpointid: str) -> Response:
        info, c = self._checkpoint(jobid, checkpointid)
        entry = views.checkpoint_entry(c)
        subtasks = self._subtasks(info, c.checkpoint_id) or {}
        names = {str(v.vertex_id): v for v in info.vertices}
        entry["tasks"] = {vid: _task_summary(c, vid, rows, names[vid].parallelism if vid in names else len(rows))
                          for vid, rows in subtasks.items()}
        return jsonify(entry)

    def _checkpoint(self, jobid: str, checkpointid: str) -> tuple[Any, Any]:
        wanted = _index(checkpointid, "checkpoint id")
        info = self._r.job_status(jobid)
        for c in info.checkpoints:
            if c.checkpoint_id == wanted:
                return info, c
        raise ApiError(404, f"no statistics of checkpoint {wanted} of job {jobid} (only the latest are kept)")

    def _subtasks(self, info: Any, checkpoint_id: int) -> dict[str, list[dict[str, Any]]] | None:
        dispatcher = self._r.dispatcher()
        return dispatcher.ask(dispatcher.checkpoint_subtasks, info.job_id, checkpoint_id)

    def checkpoint_subtasks(self, jobid: str, checkpointid: str, vertexid: str) -> Response:
        """Flink's TaskCheckpointStatisticsWithSubtaskDetails: each subtask's acknowledgement of
        a recent checkpoint (kept by its JobMaster; an ended job's as they were at its end)."""
        info, v = self._r.vertex_status(jobid, vertexid)
        _, c = self._checkpoint(jobid, checkpointid)
        subtasks = self._subtasks(info, c.checkpoint_id)
        if subtasks is None:
            raise ApiError(404, f"the subtasks' statistics of checkpoint {c.checkpoint_id} of job {jobid} are no "
                                "longer kept (only the latest checkpoints' are)")
        rows = subtasks.get(str(v.vertex_id), [])
        acked = [r for r in rows if r["status"] == "completed"]
        return jsonify({**_task_summary(c, str(v.vertex_id), rows, v.parallelism), "summary": _subtasks_summary(acked),
                        "subtasks": rows})

    def execution_result(self, jobid: str) -> Response:
        info = self._r.job_status(jobid)
        if not info.status.is_globally_terminal:
            return jsonify({"status": {"id": "IN_PROGRESS"}})
        result: dict[str, Any] = {
            "id": str(info.job_id), "application-status": _APPLICATION_STATUS.get(info.status, "UNKNOWN"),
            "accumulator-results": {}, "net-runtime": max(0, (info.end_time_ms or 0) - info.start_time_ms)}
        if info.failure_cause is not None:
            cause = info.failure_cause
            result["failure-cause"] = {"class": cause.error_class, "stack-trace": cause.traceback or cause.describe(),
                                       "serialized-throwable": None}
        return jsonify({"status": {"id": "COMPLETED"}, "job-execution-result": result})

    def accumulators(self, jobid: str) -> Response:
        """yarnflow has no user accumulators: the lists are empty (a Flink client still gets its shape)."""
        self._r.job_status(jobid)
        return jsonify({"job-accumulators": [], "user-task-accumulators": [],
                        "serialized-user-task-accumulators": {}})

    def stop(self, jobid: str) -> tuple[Response, int]:
        """Flink's stop-with-savepoint: ``{"targetDirectory", "drain"}``; its status is that of a
        savepoint (``GET /jobs/:jobid/savepoints/:triggerid``)."""
        body = self._r.body()
        target, drain = body.get("targetDirectory"), body.get("drain", False)
        if target is not None and not isinstance(target, str):
            raise ApiError(400, "targetDirectory must be a string")
        if not isinstance(drain, bool):
            raise ApiError(400, "drain must be true or false")
        return self.stop_job(jobid, target or "", drain)

    def stop_job(self, jobid: str, target: str, drain: bool) -> tuple[Response, int]:
        if target:
            why = bad_storage_path(target)
            if why:
                raise ApiError(400, f"targetDirectory {target[:200]!r}: {why}")
        info = self._r.job_status(jobid)
        if info.status.is_globally_terminal:
            raise ApiError(409, f"job {jobid} already ended {info.status.name}")
        _, config = self._effective(info)
        if not target and not config[Options.SAVEPOINTS_DIR]:
            raise ApiError(400, "no savepoint folder: give targetDirectory or set state.savepoints.dir")
        dispatcher, job_id = self._r.dispatcher(), info.job_id
        return self._r.trigger(job_id, lambda: dispatcher.ask(
            dispatcher.stop_with_savepoint, job_id, target, drain, timeout=None))

    # -- a vertex ----------------------------------------------------------------------------------
    def vertex_index(self, jobid: str, vertexid: str, index: str) -> tuple[Any, Any, int]:
        i = _index(index, "subtask index")
        info, v = self._r.vertex_status(jobid, vertexid)
        if i >= v.parallelism:
            raise ApiError(404, f"vertex {vertexid} has {v.parallelism} subtasks: no subtask {i}")
        return info, v, i

    def subtask(self, jobid: str, vertexid: str, index: str) -> Response:
        return jsonify(views.subtask(*self.vertex_index(jobid, vertexid, index)))

    def _attempt(self, jobid: str, vertexid: str, index: str, attempt: str) -> dict[str, Any]:
        """Only the current attempt is kept: an earlier one is 404."""
        row = views.subtask(*self.vertex_index(jobid, vertexid, index))
        if _index(attempt, "attempt number") != row["attempt"]:
            raise ApiError(404, f"subtask {index} of vertex {vertexid} is at attempt {row['attempt']}: earlier "
                                "attempts are not kept")
        return row

    def attempt(self, jobid: str, vertexid: str, index: str, attempt: str) -> Response:
        return jsonify(self._attempt(jobid, vertexid, index, attempt))

    def attempt_accumulators(self, jobid: str, vertexid: str, index: str, attempt: str) -> Response:
        """Flink's SubtaskExecutionAttemptAccumulatorsInfo (yarnflow has no user accumulators: empty)."""
        row = self._attempt(jobid, vertexid, index, attempt)
        return jsonify({"subtask": row["subtask"], "attempt": row["attempt"],
                        "id": f"{jobid}-{vertexid}-{row['subtask']}-{row['attempt']}", "user-accumulators": []})

    def vertex_accumulators(self, jobid: str, vertexid: str) -> Response:
        """(yarnflow has no user accumulators: Flink's shape, empty)"""
        return jsonify({"id": str(self._r.vertex_status(jobid, vertexid)[1].vertex_id), "user-accumulators": []})

    def subtasks_accumulators(self, jobid: str, vertexid: str) -> Response:
        info, v = self._r.vertex_status(jobid, vertexid)
        rows = [views.subtask(info, v, i) for i in range(v.parallelism)]
        return jsonify({"id": str(v.vertex_id), "parallelism": v.parallelism, "subtasks": [
            {"subtask": r["subtask"], "attempt": r["attempt"], "host": r["host"], "user-accumulators": []}
            for r in rows]})

    def subtask_times(self, jobid: str, vertexid: str) -> Response:
        return jsonify(views.subtasks_times(*self._r.vertex_status(jobid, vertexid)))

    def vertex_taskmanagers(self, jobid: str, vertexid: str) -> Response:
        """Flink's JobVertexTaskManagersInfo: the vertex's subtasks grouped by where they run."""
        info, v = self._r.vertex_status(jobid, vertexid)
        rows = [views.subtask(info, v, i) for i in range(v.parallelism)]
        by_place: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_place.setdefault(row["taskmanager-id"], []).append(row)
        metrics = list(v.subtask_metrics)
        out = []
        for place, group in by_place.items():
            states = Counter(ExecutionState[r["status"]] for r in group)
            out.append({"endpoint": place, "host": group[0]["host"], "taskmanager-id": place,
                        "status": views.aggregate_state(states).name, "start-time": group[0]["start-time"],
                        "end-time": group[0]["end-time"], "duration": group[0]["duration"],
                        "metrics": views.io_metrics(metrics[r["subtask"]] for r in group if r["subtask"] < len(metrics)),
                        "status-counts": views.task_counts(states.items(), upper=True)})
        return jsonify({"id": str(v.vertex_id), "name": v.name, "now": views.now_ms(), "taskmanagers": out})

    # -- the AppMaster and the cluster --------------------------------------------------------------
    def cluster_config(self) -> Response:
        return jsonify(key_values(self._r.configuration.to_strings()))

    def _logs(self, source: str) -> list[str]:
        return [path for name, path in log_files(self._r.appmaster.work_dir).items() if name == source]

    @staticmethod
    def _log_list(paths: list[str]) -> Response:
        out = []
        for path in paths:
            try:
                st = os.stat(path)
            except OSError:
                continue
            out.append({"name": os.path.basename(path), "size": st.st_size, "mtime": int(st.st_mtime * 1000)})
        return jsonify(logs=out)

    def _log_file(self, paths: list[str], name: str) -> Response:
        for path in paths:
            if os.path.basename(path) == name and os.path.isfile(path):
                return send_file(path, mimetype="text/plain", max_age=0)
        raise ApiError(404, f"no log file {name[:100]!r} here")

    def job_manager_logs(self) -> Response:
        return self._log_list(self._logs("appmaster"))

    def job_manager_log(self, name: str) -> Response:
        """A log file by its own name, or by Flink's: ``jobmanager.log`` is the AppMaster's log,
        ``jobmanager.out`` its standard output (scripts written for Flink ask for those)."""
        if name in FLINK_LOG_NAMES["jobmanager"]:
            return self._flink_named("jobmanager", name, self._logs("appmaster"), own_output_file())
        return self._log_file(self._logs("appmaster"), name)

    def job_manager_main_log(self) -> Response:
        return self.job_manager_log("jobmanager.log")

    def job_manager_stdout(self) -> Response:
        return self.job_manager_log("jobmanager.out")

    def _flink_named(self, kind: str, name: str, logs: list[str], output: str | None) -> Response:
        path = logs[0] if name.endswith(".log") and logs else output if name.endswith(".out") else None
        if path is None or not os.path.isfile(path):
            what = "standard output" if name.endswith(".out") else "log"
            raise ApiError(404, f"the {kind}'s {what} does not go to a file here ({name})")
        return send_file(path, mimetype="text/plain", max_age=0)

    def _task_manager(self, tmid: str) -> list[str]:
        if not any(tm["id"] == tmid for tm in self._r.task_executors()):
            raise ApiError(404, f"no TaskExecutor {tmid[:100]} is registered")
        return self._logs(tmid)  # (none: it runs on another host, its logs are YARN's)

    def task_manager_logs(self, tmid: str) -> Response:
        return self._log_list(self._task_manager(tmid))

    def task_manager_log(self, tmid: str, name: str) -> Response:
        """By its own name, or by Flink's (``taskmanager.log``; a local TaskExecutor's standard
        output goes to its log too, so ``taskmanager.out`` is that file as well)."""
        logs = self._task_manager(tmid)
        if name in FLINK_LOG_NAMES["taskmanager"]:
            return self._flink_named("taskmanager", name, logs, logs[0] if logs else None)
        return self._log_file(logs, name)

    def task_manager_main_log(self, tmid: str) -> Response:
        return self.task_manager_log(tmid, "taskmanager.log")

    def task_manager_stdout(self, tmid: str) -> Response:
        return self.task_manager_log(tmid, "taskmanager.out")

    def thread_dump(self) -> Response:
        """Flink's ThreadDumpInfo: every thread of the AppMaster with its stack."""
        return jsonify(threadInfos=[{"threadName": i.name, "stringifiedThreadInfo": stringified(i)}
                                    for i in thread_dump()])

    def shutdown(self) -> Response:
        """``DELETE /cluster``: every job is cancelled and the cluster stops (Flink's ShutdownHandler)."""
        dispatcher = self._r.dispatcher()
        threading.Thread(target=lambda: dispatcher.ask(dispatcher.shutdown_cluster), name="rest-shutdown",
                         daemon=True).start()
        return jsonify({})

    @staticmethod
    def data_sets() -> Response:
        """Flink's ClusterDataSetListResponseBody. yarnflow keeps no cluster data sets (Flink's
        cached intermediate results of batch jobs): always empty."""
        return jsonify(dataSets=[])

    @staticmethod
    def delete_data_set(datasetid: str) -> Response:
        raise ApiError(404, f"no cluster data set {datasetid[:100]} (yarnflow keeps none)")

    def dispose_savepoint(self) -> tuple[Response, int]:
        from yarnflow.am.checkpoint.savepoints import dispose_savepoint
        path = self._r.body().get("savepoint-path")
        if not isinstance(path, str) or not path:
            raise ApiError(400, "savepoint-path must name the savepoint's folder")
        why = bad_storage_path(path)
        if why:
            raise ApiError(400, f"savepoint-path {path[:200]!r}: {why}")
        return self._r.trigger(None, lambda: dispose_savepoint(path) and None)

    def disposal_status(self, triggerid: str) -> Response:
        return self._r.operation_status(None, triggerid, "savepoint disposal", lambda _: None)


def _task_summary(c: Any, vertex_id: str, rows: list[dict[str, Any]], parallelism: int) -> dict[str, Any]:
    """Flink's TaskCheckpointStatistics: one vertex's part of a checkpoint."""
    acked = [r for r in rows if r["status"] == "completed"]
    status = {"COMPLETED": "COMPLETED", "ABORTED": "FAILED"}.get(c.status, "IN_PROGRESS")
    return {"id": c.checkpoint_id, "vertex": vertex_id, "status": status,
            "latest_ack_timestamp": max((r["ack_timestamp"] for r in acked), default=-1),
            "state_size": sum(r["state_size"] for r in acked), "checkpointed_size": sum(r["state_size"] for r in acked),
            "end_to_end_duration": max((r["end_to_end_duration"] for r in acked), default=-1),
            "alignment_buffered": 0, "processed_data": 0,
            "persisted_data": sum(r["alignment"]["persisted"] for r in acked),
            "num_subtasks": parallelism,  # (a subtask finished before it is in it: acknowledged)
            "num_acknowledged_subtasks": len(acked) + sum(1 for r in rows if r["status"] == "finished")}


def _subtasks_summary(acked: list[dict[str, Any]]) -> dict[str, Any]:
    """Flink's summary of a vertex's subtasks in a checkpoint: min, max and average of each figure."""
    def mma(values: list[int]) -> dict[str, int]:
        return {"min": min(values, default=0), "max": max(values, default=0),
                "avg": sum(values) // len(values) if values else 0}

    return {"state_size": mma([r["state_size"] for r in acked]),
            "checkpointed_size": mma([r["checkpointed_size"] for r in acked]),
            "end_to_end_duration": mma([r["end_to_end_duration"] for r in acked]),
            "checkpoint_duration": {"sync": mma([r["checkpoint"]["sync"] for r in acked]),
                                    "async": mma([r["checkpoint"]["async"] for r in acked])},
            "alignment": {"buffered": mma([0 for _ in acked]), "processed": mma([0 for _ in acked]),
                          "persisted": mma([r["alignment"]["persisted"] for r in acked]),
                          "duration": mma([r["alignment"]["duration"] for r in acked])},
            "start_delay": mma([r["start_delay"] for r in acked])}


def is_trigger_id(raw: str) -> bool:
    return bool(_HEX32.fullmatch(raw))


def ask_stop_mode(api: JobApi, jobid: str) -> tuple[Response, int]:
    """``PATCH /jobs/:jobid?mode=stop``: stop-with-savepoint into ``state.savepoints.dir``."""
    return api.stop_job(jobid, request.args.get("targetDirectory", ""), False)
