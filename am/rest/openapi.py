"""The REST API's OpenAPI 3 document (``GET /v1/openapi.json``): every path, its parameters,
request body and answers, with the JSON schemas of the answers (a test runs schemathesis
against it on a live AppMaster)."""

from __future__ import annotations

from typing import Any

from yarnflow.common.version import __version__

_INT = {"type": "integer"}
_NUM = {"type": "number"}
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_NULLABLE_STR = {"type": ["string", "null"]}
#: a folder named over REST (``auth.bad_storage_path``): an absolute path or a URL, without a
#: control character or a ``..`` component
_FOLDER = {"type": ["string", "null"], "maxLength": 4096,
           "pattern": r"^(?!.*(^|/)\.\.(/|$))(/|[A-Za-z][A-Za-z0-9+.-]*://)[^\x00-\x1f\[\]]*$"}


def _obj(required: list[str], **props: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": props}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


_TASKS = {"type": "object", "additionalProperties": _INT}
_SCHEMAS: dict[str, Any] = {
    "Error": _obj(["errors"], errors={"type": "array", "items": _STR}),
    "Config": _obj(["refresh-interval", "flink-version", "features"], **{
        "refresh-interval": _INT, "timezone-name": _STR, "timezone-offset": _INT, "flink-version": _STR,
        "flink-revision": _STR, "features": {"type": "object"}, "cluster-id": _STR, "leader": _BOOL}),
    "Overview": _obj(["taskmanagers", "slots-total", "slots-available", "jobs-running", "jobs-finished",
                      "jobs-cancelled", "jobs-failed"], **{
        k: _INT for k in ("taskmanagers", "slots-total", "slots-available", "jobs-running", "jobs-finished",
                          "jobs-cancelled", "jobs-failed")}),
    "JobIds": _obj(["jobs"], jobs={"type": "array", "items": _obj(["id", "status"], id=_STR, status=_STR)}),
    "JobDetails": _obj(["jid", "name", "state", "start-time", "end-time", "duration", "tasks"], **{
        "jid": _STR, "name": _STR, "state": _STR, "start-time": _INT, "end-time": _INT, "duration": _INT,
        "last-modification": _INT, "tasks": _TASKS}),
    "JobsOverview": _obj(["jobs"], jobs={"type": "array", "items": _ref("JobDetails")}),
    "IOMetrics": _obj(["read-bytes", "write-bytes", "read-records", "write-records"], **{
        "read-bytes": _INT, "write-bytes": _INT, "read-records": _INT, "write-records": _INT,
        "read-bytes-complete": _BOOL, "write-bytes-complete": _BOOL, "read-records-complete": _BOOL,
        "write-records-complete": _BOOL, "read-records-per-second": _NUM, "write-records-per-second": _NUM,
        "read-bytes-per-second": _NUM, "write-bytes-per-second": _NUM, "busy-time-ms-per-second": _NUM,
        "backpressured-time-ms-per-second": _NUM, "idle-time-ms-per-second": _NUM,
        "managed-memory-bytes": _INT, "managed-memory-peak-bytes": _INT, "spilled-bytes": _INT, "inflight-bytes-peak": _INT,
        "accumulated-busy-time": _INT, "accumulated-backpressured-time": _INT, "accumulated-idle-time": _INT,
        "num-late-records-dropped": _INT,
        "backpressure-level": {"type": "string", "enum": ["ok", "low", "high"]}}),
    "Vertex": _obj(["id", "name", "parallelism", "status", "tasks", "metrics"], **{
        "id": _STR, "name": _STR, "parallelism": _INT, "maxParallelism": _INT, "status": _STR,
        "start-time": _INT, "end-time": _INT, "duration": _INT, "tasks": _TASKS, "metrics": _ref("IOMetrics")}),
    "Plan": _obj(["plan"], plan=_obj(["jid", "name", "nodes"], jid=_STR, name=_STR, type=_STR, nodes={
        "type": "array", "items": _obj(["id", "parallelism", "description", "inputs"], id=_STR, parallelism=_INT,
                                       description=_STR, name=_STR, operator=_STR, operator_strategy=_STR,
                                       optimizer_properties={"type": "object"}, inputs={
                "type": "array", "items": _obj(["num", "id", "ship_strategy"], num=_INT, id=_STR,
                                               ship_strategy=_STR, exchange=_STR)})})),
    "JobDetailsInfo": _obj(["jid", "name", "state", "start-time", "end-time", "duration", "vertices",
                            "status-counts", "plan"], **{
        "jid": _STR, "name": _STR, "isStoppable": _BOOL, "state": _STR, "job-type": _STR, "start-time": _INT,
        "end-time": _INT, "duration": _INT, "now": _INT, "maxParallelism": _INT, "num-restarts": _INT,
        "checkpointing": _BOOL, "scheduler": _STR,
        "timestamps": {"type": "object", "additionalProperties": _INT},
        "vertices": {"type": "array", "items": _ref("Vertex")}, "status-counts": _TASKS,
        "plan": {"type": "object"}}),
    "Subtasks": _obj(["id", "name", "parallelism", "subtasks"], id=_STR, name=_STR, parallelism=_INT, now=_INT,
                     subtasks={"type": "array", "items": _obj(
                         ["subtask", "status", "attempt", "metrics"], subtask=_INT, status=_STR, attempt=_INT,
                         endpoint=_STR, **{"taskmanager-id": _STR, "start-time": _INT, "end-time": _INT,
                                           "duration": _INT, "metrics": _ref("IOMetrics")})}),
    "BackPressure": _obj(["status", "backpressure-level", "subtasks"], **{
        "status": _STR, "backpressure-level": _STR, "end-timestamp": _INT, "subtasks": {"type": "array", "items": _obj(
            ["subtask", "backpressure-level", "ratio"], subtask=_INT, ratio=_NUM, idleRatio=_NUM, busyRatio=_NUM,
            **{"backpressure-level": _STR})}}),
    "Exceptions": _obj(["root-exception", "all-exceptions", "truncated", "exceptionHistory"], **{
        "root-exception": _NULLABLE_STR, "timestamp": {"type": ["integer", "null"]},
        "all-exceptions": {"type": "array", "items": {"type": "object"}}, "truncated": _BOOL,
        "exceptionHistory": _obj(["entries", "truncated"], truncated=_BOOL, entries={"type": "array", "items": _obj(
            ["exceptionName", "stacktrace", "timestamp"], exceptionName=_STR, exceptionMessage=_STR, stacktrace=_STR,
            timestamp=_INT,
            taskName=_NULLABLE_STR, endpoint=_NULLABLE_STR)})}),
    "SparkStages": _obj(["stages"], stages={"type": "array", "items": _obj(["stage", "application_id", "master"], **{
        "stage": _STR, "uid": _STR, "application_id": _STR, "master": _STR, "executors": _INT, "jobs": _INT,
        "stages": _INT, "seconds": _NUM, "output_files": _INT, "attempt": _INT, "driver_pid": _INT,
        "epoch": _INT, "micro_batches": _INT, "input_rows": {"type": "object"},
        "input_files": {"type": "object", "additionalProperties": _INT}})}),
    "Checkpoints": _obj(["counts", "summary", "latest", "history"], counts=_obj(
        ["total", "in_progress", "completed", "failed"], restored=_INT, total=_INT, in_progress=_INT,
        completed=_INT, failed=_INT), summary={"type": "object"}, latest={"type": "object"},
        history={"type": "array", "items": _obj(["id", "status", "trigger_timestamp"], id=_INT, status=_STR,
                                                 trigger_timestamp=_INT, state_size=_INT,
                                                 end_to_end_duration=_INT, is_savepoint=_BOOL, unaligned=_BOOL,
                                                 checkpoint_type=_STR, persisted_data=_INT,
                                                 alignment_duration=_INT, start_delay=_INT)}),
    "TriggerResponse": _obj(["request-id"], **{"request-id": _STR}),
    "ScaledTaskManagers": _obj(["taskmanagers"], taskmanagers=_INT),
    "SavepointStatus": _obj(["status"], status=_obj(["id"], id={"type": "string",
                                                              "enum": ["IN_PROGRESS", "COMPLETED"]}),
                            operation={"type": ["object", "null"]}),
    "Logs": _obj(["logs"], logs={"type": "array", "items": _obj(["source", "lines"], source=_STR, lines={
        "type": "array", "items": _STR})}),
    "TaskManager": _obj(["id", "path", "slotsNumber", "freeSlots"], id=_STR, path=_STR, worker=_STR, dataPort=_INT,
                        slotsNumber=_INT, freeSlots=_INT, timeSinceLastHeartbeat=_INT, metricsAddress=_NULLABLE_STR,
                        memory={"oneOf": [{"type": "null"}, _obj(
                            ["used", "peak", "limit", "level"], used=_INT, peak=_INT, limit=_INT, arrow=_INT,
                            managedTotal=_INT, managedUsed=_INT, rocksdb=_INT, cpuLoad=_NUM,
                            level={"type": "string", "enum": ["ok", "warning", "critical"]})]},
                        hardware={"type": "object"}, allocatedSlots={"type": "array", "items": {"type": "object"}}),
    "TaskManagers": _obj(["taskmanagers"], taskmanagers={"type": "array", "items": _ref("TaskManager")}),
    "Artifact": _obj(["uri", "sha256", "size"], uri=_STR, sha256=_STR, size=_INT),
    "JobStatus": _obj(["status"], status=_STR),
    "JobConfig": _obj(["jid", "name", "execution-config"], jid=_STR, name=_STR, **{"execution-config": _obj(
        ["execution-mode", "restart-strategy", "job-parallelism"], **{
            "execution-mode": _STR, "restart-strategy": _STR, "job-parallelism": _INT, "object-reuse-mode": _BOOL,
            "user-config": {"type": "object", "additionalProperties": _STR}})}),
    "KeyValues": {"type": "array", "items": _obj(["key", "value"], key=_STR, value=_STR)},
    "CheckpointConfig": _obj(["mode", "interval", "timeout", "min_pause", "max_concurrent", "externalization"], **{
        "mode": {"type": "string", "enum": ["EXACTLY_ONCE", "AT_LEAST_ONCE"]}, "interval": _INT, "timeout": _INT,
        "min_pause": _INT, "max_concurrent": _INT, "externalization": _obj(
            ["enabled", "delete_on_cancellation"], enabled=_BOOL, delete_on_cancellation=_BOOL),
        "state_backend": _STR, "checkpoint_storage": _STR, "unaligned_checkpoints": _BOOL,
        "tolerable_failed_checkpoints": _INT, "aligned_checkpoint_timeout": _INT,
        "checkpoints_after_tasks_finish": _BOOL, "state_changelog_enabled": _BOOL,
        "checkpoint_storage_path": _NULLABLE_STR, "num_retained": _INT}),
    "Checkpoint": _obj(["id", "status", "is_savepoint", "trigger_timestamp", "num_subtasks",
                        "num_acknowledged_subtasks"], **{
        "className": _STR, "id": _INT, "status": {"type": "string", "enum": ["IN_PROGRESS", "COMPLETED", "FAILED"]},
        "is_savepoint": _BOOL, "checkpoint_type": _STR, "trigger_timestamp": _INT, "latest_ack_timestamp": _INT,
        "state_size": _INT, "end_to_end_duration": _INT, "num_subtasks": _INT, "num_acknowledged_subtasks": _INT,
        "external_path": _NULLABLE_STR, "discarded": _BOOL, "failure_message": _NULLABLE_STR}),
    "CheckpointSubtasks": _obj(["id", "status", "num_subtasks", "num_acknowledged_subtasks", "subtasks"], **{
        "id": _INT, "vertex": _STR, "status": _STR, "latest_ack_timestamp": _INT, "state_size": _INT,
        "checkpointed_size": _INT, "end_to_end_duration": _INT, "alignment_buffered": _INT, "processed_data": _INT,
        "persisted_data": _INT, "num_subtasks": _INT, "num_acknowledged_subtasks": _INT, "summary": {"type": "object"},
        "subtasks": {"type": "array", "items": _obj(["index", "status"], index=_INT, status=_STR, ack_timestamp=_INT,
                                                    end_to_end_duration=_INT, state_size=_INT, checkpointed_size=_INT,
                                                    unaligned_checkpoint=_BOOL, aborted=_BOOL, start_delay=_INT,
                                                    alignment={"type": "object"}, checkpoint={"type": "object"})}}),
    "VertexAccumulators": _obj(["id", "user-accumulators"], id=_STR, **{"user-accumulators": {"type": "array"}}),
    "AttemptAccumulators": _obj(["subtask", "attempt", "id", "user-accumulators"], subtask=_INT, attempt=_INT, id=_STR,
                                **{"user-accumulators": {"type": "array"}}),
    "DataSets": _obj(["dataSets"], dataSets={"type": "array", "maxItems": 0}),
    "SubtasksAccumulators": _obj(["id", "parallelism", "subtasks"], id=_STR, parallelism=_INT, subtasks={
        "type": "array", "items": _obj(["subtask", "attempt", "user-accumulators"], subtask=_INT, attempt=_INT,
                                       host=_STR, **{"user-accumulators": {"type": "array"}})}),
    "SubtaskTimes": _obj(["id", "name", "subtasks"], id=_STR, name=_STR, now=_INT, subtasks={"type": "array", "items": _obj(
        ["subtask", "duration", "timestamps"], subtask=_INT, host=_STR, duration=_INT,
        timestamps={"type": "object", "additionalProperties": _INT})}),
    "ExecutionResult": _obj(["status"], status=_obj(["id"], id={"type": "string", "enum": ["IN_PROGRESS", "COMPLETED"]}),
                            **{"job-execution-result": _obj(["id", "application-status", "net-runtime"], **{
                                "id": _STR, "application-status": {
                                    "type": "string", "enum": ["SUCCEEDED", "FAILED", "CANCELED", "UNKNOWN"]},
                                "accumulator-results": {"type": "object"}, "net-runtime": _INT,
                                "failure-cause": {"type": "object"}})}),
    "Accumulators": _obj(["job-accumulators", "user-task-accumulators"], **{
        "job-accumulators": {"type": "array"}, "user-task-accumulators": {"type": "array"},
        "serialized-user-task-accumulators": {"type": "object"}}),
    "Subtask": _obj(["subtask", "status", "attempt", "duration", "metrics"], subtask=_INT, status=_STR, attempt=_INT,
                    host=_STR, endpoint=_STR, duration=_INT, start_time=_INT, **{
                        "taskmanager-id": _STR, "start-time": _INT, "end-time": _INT, "metrics": _ref("IOMetrics")}),
    "VertexTaskManagers": _obj(["id", "name", "taskmanagers"], id=_STR, name=_STR, now=_INT, taskmanagers={
        "type": "array", "items": _obj(["taskmanager-id", "status", "status-counts"], endpoint=_STR, host=_STR,
                                       status=_STR, duration=_INT, **{
                                           "taskmanager-id": _STR, "start-time": _INT, "end-time": _INT,
                                           "metrics": _ref("IOMetrics"), "status-counts": _TASKS})}),
    "LogList": _obj(["logs"], logs={"type": "array", "items": _obj(["name", "size", "mtime"], name=_STR, size=_INT,
                                                                    mtime=_INT)}),
    "ThreadDump": _obj(["threadInfos"], threadInfos={"type": "array", "items": _obj(
        ["threadName", "stringifiedThreadInfo"], threadName=_STR, stringifiedThreadInfo=_STR)}),
    "FlameGraph": _obj(["endTimestamp"], endTimestamp=_INT, data={"$ref": "#/components/schemas/FlameGraphNode"}),
    "FlameGraphNode": _obj(["name", "value", "children"], name=_STR, value=_INT, children={
        "type": "array", "items": {"$ref": "#/components/schemas/FlameGraphNode"}}),
    "Metrics": {"type": "array", "items": _obj(["id"], id=_STR, value=_STR)},
    "AggregatedMetrics": {"type": "array", "items": _obj(["id"], id=_STR, min=_NUM, max=_NUM, avg=_NUM, sum=_NUM)},
    "Jars": _obj(["address", "files"], address=_STR, files={"type": "array", "items": _obj(
        ["id", "name", "uploaded", "entry"], id=_STR, name=_STR, uploaded=_INT, entry={"type": "array", "items": _obj(
            ["name"], name=_STR, description=_NULLABLE_STR)})}),
    "JarUploaded": _obj(["filename", "status"], filename=_STR, status={"type": "string", "enum": ["success"]}),
    "JarRun": _obj(["jobid"], jobid=_STR),
    "PrometheusTargets": {"type": "array", "items": _obj(["targets", "labels"], targets={
        "type": "array", "items": _STR}, labels={"type": "object", "additionalProperties": _STR})},
}


def _answers(ok: str | None, code: str = "200", *errors: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if ok is not None:
        out[code] = {"description": "OK", "content": {"application/json": {"schema": _ref(ok)}}}
    else:
        out[code] = {"description": "Accepted", "content": {"application/json": {"schema": {"type": "object"}}}}
    for status in (*errors, 503):
        out[str(status)] = {"description": "error", "content": {"application/json": {"schema": _ref("Error")}}}
    return out


_JOB = {"name": "jobid", "in": "path", "required": True, "description": "32 hex characters",
        "schema": {"type": "string", "pattern": "^[0-9a-fA-F]{32}$"}}
_HEX32 = {"type": "string", "pattern": "^[0-9a-fA-F]{32}$"}
_VERTEX = {"name": "vertexid", "in": "path", "required": True, "description": "32 hex characters", "schema": _HEX32}
_TRIGGER = {"name": "triggerid", "in": "path", "required": True, "description": "32 hex characters", "schema": _HEX32}
_TM = {"name": "tmid", "in": "path", "required": True, "schema": _STR}
_LONG = {"type": "integer", "minimum": 0, "maximum": (1 << 63) - 1}
_INDEX = {"name": "index", "in": "path", "required": True, "schema": _LONG}
_AGG = "(min|max|avg|sum|MIN|MAX|AVG|SUM)"
_SELECT = {"agg": f"^({_AGG}(,{_AGG})*)?$", "subtasks": r"^(\d{1,9}(-\d{1,9})?(,\d{1,9}(-\d{1,9})?)*)?$",
           "parallelism": "^[1-9][0-9]{0,5}$", "allowNonRestoredState": "^(true|false)$",
           "entry-class": r"^[\w./-]+\.py$", "type": "^(FULL|ON_CPU|OFF_CPU)$", "subtaskindex": "^[0-9]{1,9}$"}


_JAR = {"name": "jarid", "in": "path", "required": True, "description": "<32 hex>_<file name>, as uploaded",
        "schema": {"type": "string", "pattern": "^[0-9a-f]{32}_[A-Za-z0-9._-]{1,200}$"}}
_RUN_BODY = {"required": False, "content": {"application/json": {"schema": {"type": "object", "properties": {
    "programArgs": {"type": "string"}, "programArgsList": {"type": "array", "items": {"type": "string"}},
    "parallelism": {"type": "integer", "minimum": 1}, "entryClass": {"type": "string", "pattern": r"^[\w./-]+\.py$"},
    "savepointPath": {"type": "string"}, "allowNonRestoredState": {"type": "boolean"},
    "flinkConfiguration": {"type": "object", "additionalProperties": {"type": "string"}}}}}}}


def _query(*names: str) -> list[dict[str, Any]]:
    return [{"name": n, "in": "query", "required": False,
             "schema": {"type": "string", "pattern": _SELECT[n]} if n in _SELECT else _STR} for n in names]


def _metrics(summary: str, *path: dict[str, Any], aggregated: bool = False, select: str = "") -> dict[str, Any]:
    params = [*path, *_query("get", *(["agg"] if aggregated else []), *([select] if select else []))]
    return _get(summary, "AggregatedMetrics" if aggregated else "Metrics", 400, 404, params=params)


def _get(summary: str, schema: str, *errors: int, params: list[Any] | None = None) -> dict[str, Any]:
    return {"get": {"summary": summary, "parameters": params or [], "responses": _answers(schema, "200", *errors)}}


def openapi_document() -> dict[str, Any]:
    job = [_JOB]
    return {
        "openapi": "3.1.0",
        "info": {"title": "yarnflow REST API (Flink's REST API v1)", "version": __version__},
        "paths": {
            "/config": _get("Web UI configuration", "Config"),
            "/overview": _get("Cluster overview", "Overview"),
            "/jobs": _get("Job ids and states", "JobIds"),
            "/jobs/overview": _get("Every job's overview", "JobsOverview"),
            "/jobs/{jobid}": {
                **_get("A job's details, vertices and their metrics", "JobDetailsInfo", 400, 404, params=job),
                "patch": {"summary": "Cancel the job (mode=stop: stop it with a savepoint)", "parameters": [_JOB, {
                    "name": "mode", "in": "query", "required": False,
                    "schema": {"type": "string", "enum": ["cancel", "stop"]}}],
                    "responses": _answers(None, "202", 400, 404, 409)}},
            "/jobs/{jobid}/plan": _get("The job's dataflow plan", "Plan", 400, 404, params=job),
            "/jobs/{jobid}/exceptions": _get("Root cause and failure history", "Exceptions", 400, 404, params=job),
            "/jobs/{jobid}/checkpoints": _get("Checkpoint statistics", "Checkpoints", 400, 404, params=job),
            "/jobs/{jobid}/spark": _get("The job's Spark stages (yarnflow's own)", "SparkStages", 400, 404, params=job),
            "/jobs/{jobid}/vertices/{vertexid}": _get("The vertex's subtasks", "Subtasks", 400, 404,
                                                       params=[_JOB, _VERTEX]),
            "/jobs/{jobid}/vertices/{vertexid}/backpressure": _get("The vertex's back-pressure", "BackPressure",
                                                                    400, 404, params=[_JOB, _VERTEX]),
            "/jobs/{jobid}/savepoints": {"post": {
                "summary": "Trigger a savepoint (asynchronous)", "parameters": job,
                "requestBody": {"required": False, "content": {"application/json": {"schema": {
                    "type": "object", "properties": {"target-directory": _FOLDER, "cancel-job": _BOOL}}}}},
                "responses": _answers("TriggerResponse", "202", 400, 404, 409)}},
            "/jobs/{jobid}/savepoints/{triggerid}": _get(
                "A savepoint's (or stop-with-savepoint's) status", "SavepointStatus", 400, 404, params=[_JOB, _TRIGGER]),
            "/jobs/{jobid}/rescaling": {"patch": {
                "summary": "Rescale the running job (asynchronous)",
                "parameters": [*job, {"name": "parallelism", "in": "query", "required": True,
                                      "schema": {"type": "integer", "minimum": 1}}],
                "responses": _answers("TriggerResponse", "202", 400, 404, 409)}},
            "/jobs/{jobid}/rescaling/{triggerid}": _get(
                "A rescaling's status", "SavepointStatus", 400, 404, params=[_JOB, _TRIGGER]),
            "/jobs/{jobid}/status": _get("The job's state", "JobStatus", 400, 404, params=job),
            "/jobs/{jobid}/config": _get("The job's execution configuration", "JobConfig", 400, 404, params=job),
            "/jobs/{jobid}/jobmanager/config": _get("The job's effective configuration (secrets hidden)", "KeyValues",
                                                    400, 404, params=job),
            "/jobs/{jobid}/checkpoints/config": _get("The job's checkpointing configuration", "CheckpointConfig",
                                                     400, 404, params=job),
            "/jobs/{jobid}/checkpoints/details/{checkpointid}": _get(
                "One checkpoint's statistics", "Checkpoint", 400, 404, params=[_JOB, {
                    "name": "checkpointid", "in": "path", "required": True, "schema": _LONG}]),
            "/jobs/{jobid}/checkpoints/details/{checkpointid}/subtasks/{vertexid}": _get(
                "Each subtask's part of a recent checkpoint of a running job", "CheckpointSubtasks", 400, 404,
                params=[_JOB, {"name": "checkpointid", "in": "path", "required": True, "schema": _LONG}, _VERTEX]),
            "/jobs/{jobid}/execution-result": _get("The job's result once it ended", "ExecutionResult", 400, 404,
                                                   params=job),
            "/jobs/{jobid}/accumulators": _get("User accumulators (yarnflow has none: empty)", "Accumulators",
                                               400, 404, params=job),
            "/jobs/{jobid}/stop": {"post": {
                "summary": "Stop the job with a savepoint (asynchronous; status under savepoints)", "parameters": job,
                "requestBody": {"required": False, "content": {"application/json": {"schema": {
                    "type": "object", "properties": {"targetDirectory": _FOLDER, "drain": _BOOL}}}}},
                "responses": _answers("TriggerResponse", "202", 400, 404, 409)}},
            "/jobs/{jobid}/vertices/{vertexid}/subtasks/{index}": _get(
                "One subtask's current attempt", "Subtask", 400, 404, params=[_JOB, _VERTEX, _INDEX]),
            "/jobs/{jobid}/vertices/{vertexid}/subtasks/{index}/attempts/{attempt}": _get(
                "One subtask's attempt (the current one only)", "Subtask", 400, 404, params=[
                    _JOB, _VERTEX, _INDEX, {"name": "attempt", "in": "path", "required": True, "schema": _LONG}]),
            "/jobs/{jobid}/vertices/{vertexid}/subtasks/{index}/attempts/{attempt}/accumulators": _get(
                "The user accumulators of a subtask's attempt (yarnflow has none: empty)", "AttemptAccumulators",
                400, 404, params=[_JOB, _VERTEX, _INDEX,
                                  {"name": "attempt", "in": "path", "required": True, "schema": _LONG}]),
            "/datasets": _get("Flink's cluster data sets (yarnflow keeps none: empty)", "DataSets"),
            "/datasets/{datasetid}": {"delete": {"summary": "Delete a cluster data set (there are none)",
                                                 "parameters": [{"name": "datasetid", "in": "path", "required": True,
                                                                 "schema": _STR}],
                                                 "responses": {str(code): {"description": "error", "content": {
                                                     "application/json": {"schema": _ref("Error")}}}
                                                     for code in (404, 503)}}},
            "/jobs/{jobid}/vertices/{vertexid}/accumulators": _get(
                "The vertex's user accumulators (yarnflow has none: empty)", "VertexAccumulators", 400, 404,
                params=[_JOB, _VERTEX]),
            "/jobs/{jobid}/vertices/{vertexid}/subtasks/accumulators": _get(
                "Each subtask's user accumulators (none: empty)", "SubtasksAccumulators", 400, 404,
                params=[_JOB, _VERTEX]),
            "/jobs/{jobid}/vertices/{vertexid}/subtasktimes": _get(
                "When each subtask's current attempt entered each state", "SubtaskTimes", 400, 404,
                params=[_JOB, _VERTEX]),
            "/jobs/{jobid}/vertices/{vertexid}/taskmanagers": _get(
                "The vertex's subtasks per TaskExecutor", "VertexTaskManagers", 400, 404, params=[_JOB, _VERTEX]),
            "/jobs/{jobid}/metrics": _metrics("The job's metrics", _JOB),
            "/jobs/{jobid}/vertices/{vertexid}/metrics": _metrics("The vertex's metrics, per subtask", _JOB, _VERTEX),
            "/jobs/{jobid}/vertices/{vertexid}/subtasks/metrics": _metrics(
                "The vertex's metrics aggregated over subtasks", _JOB, _VERTEX, aggregated=True, select="subtasks"),
            "/jobs/{jobid}/vertices/{vertexid}/watermarks": _get("Each subtask's input watermark", "Metrics",
                                                                 400, 404, params=[_JOB, _VERTEX]),
            "/jobs/{jobid}/vertices/{vertexid}/subtasks/{index}/metrics": _metrics(
                "One subtask's metrics", _JOB, _VERTEX, _INDEX),
            "/jobs/metrics": _metrics("Job metrics aggregated over jobs", aggregated=True, select="jobs"),
            "/jobmanager/metrics": _metrics("The AppMaster's metrics"),
            "/taskmanagers/metrics": _metrics("TaskExecutor metrics aggregated", aggregated=True, select="taskmanagers"),
            "/taskmanagers/{tmid}/metrics": _metrics("One TaskExecutor's metrics", _TM),
            "/jobmanager/config": _get("The cluster's configuration (secrets hidden)", "KeyValues"),
            "/jobmanager/logs": _get("The AppMaster's log files", "LogList"),
            "/jobmanager/thread-dump": _get("The AppMaster's threads and their stacks", "ThreadDump"),
            "/taskmanagers/{tmid}/thread-dump": _get("A TaskExecutor's threads and their stacks", "ThreadDump", 404,
                                                     params=[_TM]),
            "/jobs/{jobid}/vertices/{vertexid}/flamegraph": _get(
                "A flame graph of the vertex's running tasks (endTimestamp -1: none runs, -2: disabled, -3: "
                "sampling, ask again)", "FlameGraph", 400, 404, params=[_JOB, _VERTEX, *_query("type", "subtaskindex")]),
            "/taskmanagers/{tmid}/logs": _get("A TaskExecutor's log files on the AppMaster's host", "LogList", 404,
                                              params=[_TM]),
            "/savepoint-disposal": {"post": {
                "summary": "Delete a savepoint (asynchronous)",
                "requestBody": {"required": True, "content": {"application/json": {"schema": _obj(
                    ["savepoint-path"], **{"savepoint-path": {**_FOLDER, "type": "string", "minLength": 1}})}}},
                "responses": _answers("TriggerResponse", "202", 400)}},
            "/savepoint-disposal/{triggerid}": _get("A savepoint disposal's status", "SavepointStatus", 400, 404,
                                                     params=[_TRIGGER]),
            "/jars": _get("Uploaded job files (Flink's jars: Python job files and zips)", "Jars"),
            "/jars/upload": {"post": {
                "summary": "Upload a job file (.py) or a zip of one with its modules: multipart field jarfile",
                "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": _obj(
                    ["jarfile"], jarfile={"type": "string", "format": "binary"})}}},
                "responses": _answers("JarUploaded", "200", 400, 411, 413)}},
            "/jars/{jarid}": {"delete": {"summary": "Delete an uploaded job file", "parameters": [_JAR],
                                         "responses": _answers(None, "200", 400, 404)}},
            "/jars/{jarid}/plan": {
                **_get("The plan of an uploaded job (its file runs up to execute())", "Plan", 400, 404,
                       params=[_JAR, *_query("programArg", "entry-class", "parallelism")]),
                "post": {"summary": "The plan of an uploaded job, with arguments in the body",
                         "parameters": [_JAR], "requestBody": _RUN_BODY,
                         "responses": _answers("Plan", "200", 400, 404)}},
            "/jars/{jarid}/run": {"post": {
                "summary": "Run an uploaded job: arguments, parallelism, savepoint, configuration",
                "parameters": [_JAR, *_query("programArg", "entry-class", "parallelism", "savepointPath",
                                             "allowNonRestoredState")],
                "requestBody": _RUN_BODY, "responses": _answers("JarRun", "200", 400, 404)}},
            "/cluster": {"delete": {"summary": "Shut the cluster down: its jobs are cancelled",
                                    "responses": _answers(None, "200")}},
            "/jobs/{jobid}/logs": _get("The job's log lines (AppMaster and local TaskExecutors)", "Logs", 400, 404,
                                       params=[_JOB, {"name": "taskexecutor", "in": "query", "required": False,
                                                      "schema": _STR}]),
            "/taskmanagers": {**_get("Registered TaskExecutors", "TaskManagers"), "patch": {
                "summary": "Run this many TaskExecutors from now on (yarnflow session scale)",
                "parameters": [{"name": "count", "in": "query", "required": True,
                                "schema": {"type": "integer", "minimum": 0}}],
                "responses": _answers("ScaledTaskManagers", "200", 400)}},
            "/taskmanagers/{tmid}": _get("One TaskExecutor with its slots", "TaskManager", 404, params=[_TM]),
            "/artifacts": {"post": {
                "summary": "Upload a job artifact (for a client that cannot write the storage dir)",
                "parameters": [{"name": "sha256", "in": "query", "required": True,
                                "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}],
                "requestBody": {"required": True, "content": {"application/octet-stream": {
                    "schema": {"type": "string", "format": "binary"}}}},
                "responses": _answers("Artifact", "201", 400, 411, 413)}},
            "/metrics/prometheus-targets": _get("Every process's Prometheus endpoint (HTTP service discovery)",
                                                "PrometheusTargets"),
        },
        "components": {"schemas": _SCHEMAS},
    }
