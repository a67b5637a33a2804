"""A client written against Flink's documented REST API (``rest_v1_dispatcher.yml``: its paths,
field names, casing and status codes), run against a real local cluster (issue 32): a
checkpointed streaming job that takes a savepoint and is then stopped with one, a job that
fails after restoring from a checkpoint, and the cluster's own paths. The client reads only
what Flink's API has; what it gets is checked against what the job did."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.harness import wait_until
from tests.integration.test_rest_api import cluster  # noqa: F401 - the fixture
from tests.rest import generator_job, submit, wait_flowing

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

STATES = {"CREATED", "SCHEDULED", "DEPLOYING", "RUNNING", "FINISHED", "CANCELING", "CANCELED", "FAILED",
          "RECONCILING", "INITIALIZING"}


class FlinkRestClient:
    """What a script written for Flink's REST API does, and nothing of yarnflow's own."""

    def __init__(self, base: str) -> None:
        self.base = base

    def get(self, path: str, **params: str) -> Any:
        r = requests.get(self.base + path, params=params, timeout=10)
        assert r.status_code == 200, (path, r.status_code, r.text)
        return r.json()

    def status(self, path: str, method: str = "GET", **kw: Any) -> int:
        return requests.request(method, self.base + path, timeout=10, **kw).status_code

    def wait_operation(self, path: str) -> dict[str, Any]:
        """Poll an asynchronous operation (savepoint, stop, disposal) until COMPLETED."""
        def done() -> dict[str, Any] | None:
            answer = self.get(path)
            return answer if answer["status"]["id"] == "COMPLETED" else None
        return wait_until(done, 60, f"{path} never completed", interval_s=0.2)

    def metric(self, path: str, name: str) -> float:
        [entry] = self.get(path, get=name)
        assert entry["id"] == name and isinstance(entry["value"], str)
        return float(entry["value"])


def test_a_flink_client_follows_a_checkpointed_job_through_savepoint_stop_and_disposal(
        cluster: Any, tmp_path: Path) -> None:  # noqa: F811
    flink = FlinkRestClient(cluster.web)
    job_id = submit(cluster, generator_job(str(tmp_path / "out")), "flink-client",
                    {"execution.checkpointing.interval": "300 ms", "spark.ssl.keyPassword": "hunter2"})
    wait_flowing(cluster.web, job_id)
    assert flink.get(f"/jobs/{job_id}/status") == {"status": "RUNNING"}
    assert {"id": job_id, "status": "RUNNING"} in flink.get("/jobs")["jobs"]

    details = flink.get(f"/jobs/{job_id}")
    assert details["status-counts"]["RUNNING"] == len(details["vertices"]) and set(details["status-counts"]) == STATES
    for v in details["vertices"]:
        assert v["tasks"]["RUNNING"] == v["parallelism"] == 2 and v["maxParallelism"] >= 2
    source = details["vertices"][0]["id"]

    # the vertex, one subtask, its attempt, per TaskExecutor
    vertex = flink.get(f"/jobs/{job_id}/vertices/{source}")
    assert vertex["maxParallelism"] == details["vertices"][0]["maxParallelism"]
    sub = flink.get(f"/jobs/{job_id}/vertices/{source}/subtasks/1")
    assert sub["subtask"] == 1 and sub["status"] == "RUNNING" and sub["duration"] > 0 and sub["end-time"] == -1
    assert flink.get(f"/jobs/{job_id}/vertices/{source}/subtasks/1/attempts/{sub['attempt']}")["subtask"] == 1
    assert flink.status(f"/jobs/{job_id}/vertices/{source}/subtasks/1/attempts/{sub['attempt'] + 1}") == 404
    assert flink.status(f"/jobs/{job_id}/vertices/{source}/subtasks/2") == 404
    assert flink.status(f"/jobs/{job_id}/vertices/{source}/subtasks/x") == 400
    times = flink.get(f"/jobs/{job_id}/vertices/{source}/subtasktimes")["subtasks"]
    assert [t["subtask"] for t in times] == [0, 1]
    assert all(0 < t["timestamps"]["DEPLOYING"] <= t["timestamps"]["RUNNING"] and t["timestamps"]["FINISHED"] == 0
               for t in times)
    assert sub["start-time"] == times[1]["timestamps"]["DEPLOYING"]
    per_tm = flink.get(f"/jobs/{job_id}/vertices/{source}/taskmanagers")["taskmanagers"]
    assert sum(tm["status-counts"]["RUNNING"] for tm in per_tm) == 2

    # metrics, as Flink's metric queries answer them
    ids = {m["id"] for m in flink.get(f"/jobs/{job_id}/vertices/{source}/metrics")}
    assert {"0.numRecordsOut", "1.numRecordsOutPerSecond", "0.busyTimeMsPerSecond"} <= ids
    # (wait_flowing saw the vertex's records; each subtask's own come with its TaskExecutor's next heartbeat)
    out0 = wait_until(lambda: flink.metric(f"/jobs/{job_id}/vertices/{source}/metrics", "0.numRecordsOut") or None,
                      15, "subtask 0 never reported records out")
    assert out0 > 0 and flink.metric(f"/jobs/{job_id}/vertices/{source}/subtasks/0/metrics", "numRecordsOut") >= out0
    [total] = flink.get(f"/jobs/{job_id}/vertices/{source}/subtasks/metrics", get="numRecordsOut", agg="sum,max")
    assert set(total) == {"id", "sum", "max"} and total["sum"] >= total["max"] > 0
    [only_one] = flink.get(f"/jobs/{job_id}/vertices/{source}/subtasks/metrics", get="numRecordsOut", subtasks="1")
    assert only_one["sum"] == only_one["max"] == only_one["min"]
    # the rate-limited source waits most of each second: idle, not busy (it showed 1,000 ms/s busy)
    wait_until(lambda: flink.metric(f"/jobs/{job_id}/vertices/{source}/metrics", "0.idleTimeMsPerSecond") > 500, 15,
               "the rate-limited source is not idle most of the time")
    wait_until(lambda: flink.metric(f"/jobs/{job_id}/metrics", "numberOfCompletedCheckpoints") >= 2, 30,
               "no checkpoints counted")
    assert flink.metric(f"/jobs/{job_id}/metrics", "uptime") > 0
    [restarts] = flink.get("/jobs/metrics", get="numRestarts", jobs=job_id)
    assert restarts["sum"] == 0
    [memory] = flink.get("/taskmanagers/metrics", get="Status.Memory.Used", agg="max")
    assert memory["max"] > 10 << 20
    [cpu] = flink.get("/taskmanagers/metrics", get="Status.Process.CPU.Load", agg="max")
    assert 0 <= cpu["max"] < 4  # (cores: the TaskExecutors run a rate-limited job)
    assert flink.metric("/jobmanager/metrics", "taskSlotsTotal") == 4
    assert flink.metric("/jobmanager/metrics", "Status.Process.Memory.RSS") > 10 << 20

    # configuration: the job's, its checkpoints', the cluster's (secrets hidden)
    assert flink.get(f"/jobs/{job_id}/config")["execution-config"]["job-parallelism"] == 2
    cp_config = flink.get(f"/jobs/{job_id}/checkpoints/config")
    assert (cp_config["mode"], cp_config["interval"]) == ("EXACTLY_ONCE", 300)
    job_config = {e["key"]: e["value"] for e in flink.get(f"/jobs/{job_id}/jobmanager/config")}
    assert job_config["spark.ssl.keyPassword"] == "******" and job_config["execution.checkpointing.interval"]
    assert "hunter2" not in requests.get(f"{cluster.web}/jobs/{job_id}/config", timeout=10).text
    assert any(e["key"] == "rest.port" for e in flink.get("/jobmanager/config"))

    # a savepoint: its trigger, its status, then in the checkpoint statistics
    trigger = requests.post(f"{cluster.web}/jobs/{job_id}/savepoints",
                            json={"target-directory": str(tmp_path / "sp"), "cancel-job": False}, timeout=10)
    assert trigger.status_code == 202
    location = flink.wait_operation(f"/jobs/{job_id}/savepoints/{trigger.json()['request-id']}")["operation"]["location"]
    stats = wait_until(lambda: (lambda s: s if s["latest"]["savepoint"] else None)(flink.get(f"/jobs/{job_id}/checkpoints")),
                       10, "the savepoint is not in the checkpoint statistics")
    assert stats["latest"]["savepoint"]["external_path"] == location and stats["latest"]["savepoint"]["is_savepoint"]
    completed = stats["latest"]["completed"]
    assert completed["is_savepoint"] is False and completed["external_path"].endswith(f"chk-{completed['id']}")
    subtasks = sum(v["parallelism"] for v in details["vertices"])
    assert completed["num_subtasks"] == completed["num_acknowledged_subtasks"] == subtasks
    assert any(h["discarded"] for h in stats["history"] if h["status"] == "COMPLETED")  # older ones subsumed
    one = flink.get(f"/jobs/{job_id}/checkpoints/details/{completed['id']}")
    assert (one["id"], one["status"]) == (completed["id"], "COMPLETED")
    assert {vid: t["num_acknowledged_subtasks"] for vid, t in one["tasks"].items()} == {
        v["id"]: v["parallelism"] for v in details["vertices"]}
    per_subtask = flink.get(f"/jobs/{job_id}/checkpoints/details/{completed['id']}/subtasks/{source}")
    assert [r["index"] for r in per_subtask["subtasks"]] == [0, 1]
    assert all(r["status"] == "completed" and r["ack_timestamp"] >= completed["trigger_timestamp"]
               and r["state_size"] >= 0 for r in per_subtask["subtasks"])
    assert per_subtask["num_acknowledged_subtasks"] == per_subtask["num_subtasks"] == 2
    # Flink's per-subtask figures: sync/async time, start delay (trigger to first barrier), and their summary
    assert all(0 <= r["start_delay"] <= r["end_to_end_duration"] and r["checkpoint"]["sync"] >= 0
               and r["checkpoint"]["async"] >= 0 for r in per_subtask["subtasks"])
    summary = per_subtask["summary"]
    assert summary["start_delay"]["min"] <= summary["start_delay"]["avg"] <= summary["start_delay"]["max"] == max(
        r["start_delay"] for r in per_subtask["subtasks"])
    assert completed["start_delay"] >= summary["start_delay"]["max"]  # (the checkpoint's: its slowest task's)
    assert flink.status(f"/jobs/{job_id}/checkpoints/details/999999") == 404
    assert flink.get(f"/jobs/{job_id}/execution-result") == {"status": {"id": "IN_PROGRESS"}}
    assert flink.get(f"/jobs/{job_id}/accumulators")["user-task-accumulators"] == []
    assert flink.get(f"/jobs/{job_id}/vertices/{source}/accumulators")["user-accumulators"] == []
    assert [s["subtask"] for s in flink.get(f"/jobs/{job_id}/vertices/{source}/subtasks/accumulators")["subtasks"]] \
        == [0, 1]

    # stop with a savepoint: the job FINISHES, its result says SUCCEEDED
    stop = requests.post(f"{cluster.web}/jobs/{job_id}/stop",
                         json={"targetDirectory": str(tmp_path / "stop"), "drain": False}, timeout=10)
    assert stop.status_code == 202
    stopped_at = flink.wait_operation(f"/jobs/{job_id}/savepoints/{stop.json()['request-id']}")["operation"]["location"]
    assert stopped_at.startswith(str(tmp_path / "stop")) or str(tmp_path / "stop") in stopped_at
    wait_until(lambda: flink.get(f"/jobs/{job_id}/status")["status"] == "FINISHED", 30, "the stopped job did not finish")
    result = flink.get(f"/jobs/{job_id}/execution-result")
    assert result["status"]["id"] == "COMPLETED"
    assert result["job-execution-result"]["application-status"] == "SUCCEEDED"
    assert result["job-execution-result"]["net-runtime"] > 0
    assert flink.status(f"/jobs/{job_id}/stop", "POST", json={}) == 409  # it has ended
    ended = flink.get(f"/jobs/{job_id}/vertices/{source}/subtasks/0")
    assert ended["status"] == "FINISHED" and ended["end-time"] >= ended["start-time"] > 0
    assert ended["duration"] == ended["end-time"] - ended["start-time"]
    # an ended job's rates are zero, its totals stay (the last heartbeat's rates were shown)
    for v in flink.get(f"/jobs/{job_id}")["vertices"]:
        m = v["metrics"]
        assert m["read-records"] + m["write-records"] > 0 and v["status"] == "FINISHED"
        assert m["read-records-per-second"] == m["write-records-per-second"] == m["busy-time-ms-per-second"] == 0

    # disposal: the first savepoint goes; a folder that is no savepoint is refused
    folder = location.removeprefix("file://")
    assert os.path.isdir(folder)
    disposal = requests.post(f"{cluster.web}/savepoint-disposal", json={"savepoint-path": location}, timeout=10)
    assert disposal.status_code == 202
    done = flink.wait_operation(f"/savepoint-disposal/{disposal.json()['request-id']}")
    assert done["operation"] is None and not os.path.exists(folder)
    (tmp_path / "plain").mkdir()
    refused = requests.post(f"{cluster.web}/savepoint-disposal", json={"savepoint-path": str(tmp_path / "plain")},
                            timeout=10)
    failed = flink.wait_operation(f"/savepoint-disposal/{refused.json()['request-id']}")
    assert "no savepoint" in failed["operation"]["failure-cause"]["stack-trace"] and (tmp_path / "plain").is_dir()


def test_a_flink_client_reads_a_failed_jobs_restore_result_and_exceptions(cluster: Any, tmp_path: Path) -> None:  # noqa: F811
    flink = FlinkRestClient(cluster.web)
    job_id = submit(cluster, generator_job(str(tmp_path / "out"), fail_after=3000), "fails",
                    {"execution.checkpointing.interval": "200 ms", "restart-strategy.type": "fixed-delay",
                     "restart-strategy.fixed-delay.attempts": "1", "restart-strategy.fixed-delay.delay": "100 ms"})
    wait_until(lambda: flink.get(f"/jobs/{job_id}/status")["status"] == "FAILED", 60, "the job did not fail")
    result = flink.get(f"/jobs/{job_id}/execution-result")["job-execution-result"]
    assert result["application-status"] == "FAILED" and "boom at row" in result["failure-cause"]["stack-trace"]
    stats = flink.get(f"/jobs/{job_id}/checkpoints")
    assert stats["counts"]["restored"] == 1  # restored once, from its latest checkpoint, then failed again
    restored = stats["latest"]["restored"]
    assert restored["id"] >= 1 and restored["is_savepoint"] is False and restored["restore_timestamp"] > 0
    entries = flink.get(f"/jobs/{job_id}/exceptions")["exceptionHistory"]["entries"]
    registered = {tm["id"] for tm in flink.get("/taskmanagers")["taskmanagers"]}
    assert entries and all(e["taskManagerId"] in registered for e in entries), entries
    assert flink.get(f"/jobs/{job_id}")["status-counts"]["FAILED"] >= 1


def test_the_appmasters_logs_thread_dump_and_shutdown(cluster: Any) -> None:  # noqa: F811
    flink = FlinkRestClient(cluster.web)
    logs = flink.get("/jobmanager/logs")["logs"]
    assert logs and all(set(entry) == {"name", "size", "mtime"} for entry in logs)
    text = requests.get(f"{cluster.web}/jobmanager/logs/{logs[0]['name']}", timeout=10)
    assert text.status_code == 200 and "REST API and web UI at" in text.text
    assert flink.status("/jobmanager/logs/..%2F..%2Fetc%2Fpasswd") == 404
    tm = flink.get("/taskmanagers")["taskmanagers"][0]["id"]
    [tm_log] = flink.get(f"/taskmanagers/{tm}/logs")["logs"]
    assert "registered" in requests.get(f"{cluster.web}/taskmanagers/{tm}/logs/{tm_log['name']}", timeout=10).text
    assert flink.status("/taskmanagers/" + "0" * 32 + "/logs") == 404
    threads = {t["threadName"] for t in flink.get("/jobmanager/thread-dump")["threadInfos"]}
    assert "rest-server" in threads
    assert flink.status("/cluster", "DELETE") == 200
    wait_until(lambda: cluster.proc.poll() is not None, 30, "the cluster did not shut down")
    assert cluster.proc.returncode == 0
    # the access log: plain lines (werkzeug's own were coloured with ANSI codes in the log file),
    # changes and errors at INFO, answered GETs at DEBUG
    text = Path(cluster.log_path).read_text(errors="replace")
    assert "\x1b[" not in text
    assert '"DELETE /cluster HTTP/1.1" 200' in text
    assert '"GET /jobmanager/thread-dump HTTP/1.1" 200' not in text  # answered GETs: DEBUG (the UI polls)
    assert '"GET /taskmanagers/' + "0" * 32 + '/logs HTTP/1.1" 404' in text


def test_a_windowed_jobs_watermarks_lateness_and_accumulated_times(cluster: Any, tmp_path: Path) -> None:  # noqa: F811
    from tests.integration.test_cancel_race import _windowed

    flink = FlinkRestClient(cluster.web)
    job_id = submit(cluster, _windowed(str(tmp_path / "out")), "watermarked", {"execution.checkpointing.interval": "300 ms"})
    details = wait_flowing(cluster.web, job_id)
    source, window = (v["id"] for v in details["vertices"])
    marks = wait_until(lambda: (lambda w: w if len(w) == 2 else None)(
        flink.get(f"/jobs/{job_id}/vertices/{window}/watermarks")), 20, "the window subtasks show no watermark")
    assert {m["id"] for m in marks} == {"0.currentInputWatermark", "1.currentInputWatermark"}
    first = min(int(m["value"]) for m in marks)
    wait_until(lambda: min(int(m["value"]) for m in flink.get(f"/jobs/{job_id}/vertices/{window}/watermarks")) > first,
               20, "the watermark does not advance")
    out_wm = flink.metric(f"/jobs/{job_id}/vertices/{source}/metrics", "0.currentOutputWatermark")
    assert out_wm >= first - 1000 and flink.metric(f"/jobs/{job_id}/vertices/{source}/metrics", "0.watermarkLag") > 0
    assert flink.metric(f"/jobs/{job_id}/vertices/{window}/metrics", "0.numLateRecordsDropped") == 0  # in order
    m = flink.get(f"/jobs/{job_id}")["vertices"][1]["metrics"]
    assert m["accumulated-busy-time"] + m["accumulated-idle-time"] > 0 and m["num-late-records-dropped"] == 0
    requests.patch(f"{cluster.web}/jobs/{job_id}?mode=cancel", timeout=10)
