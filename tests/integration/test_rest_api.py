"""The REST API (Flink's paths and JSON shapes) and the Prometheus endpoints of a real local
cluster: one AppMaster, two TaskExecutor processes, a STREAMING job that runs until cancelled.
The figures the REST API shows are the ones the TaskExecutors measure and export."""

from __future__ import annotations

import errno
import os
import random
import socket
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import wait_until
from tests.rest import RATE, generator_job, get, scrape, submit, wait_flowing
from yarnflow.common.metrics import bind_first_free, free_port_range

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CHECKPOINTED = {"execution.checkpointing.interval": "300 ms"}


@pytest.fixture
def cluster(local_cluster: Any) -> Any:
    low, high = free_port_range(8, random.randint(20000, 60000))
    c = local_cluster(taskexecutors=2, slots=2, rest__port="0", metrics__reporter__prom__port=f"{low}-{high}")
    c.web = c.web_url()
    c.prom_ports = range(low, high + 1)
    return c


def test_a_running_job_in_flinks_shapes(cluster: Any, tmp_path: Path) -> None:
    web = cluster.web
    assert web.startswith("http://127.0.0.1:")
    job_id = submit(cluster, generator_job(str(tmp_path / "out")), "generated", CHECKPOINTED)
    details = wait_flowing(web, job_id)

    overview = get(f"{web}/overview")
    assert (overview["taskmanagers"], overview["slots-total"], overview["jobs-running"]) == (2, 4, 1)
    assert overview["slots-available"] == 2  # slot sharing: 2 subtasks of each vertex in 2 slots
    assert get(f"{web}/jobs") == {"jobs": [{"id": job_id, "status": "RUNNING"}]}
    [entry] = get(f"{web}/v1/jobs/overview")["jobs"]  # every path also under /v1
    assert (entry["jid"], entry["name"], entry["state"]) == (job_id, "generated", "RUNNING")
    assert entry["tasks"]["running"] == entry["tasks"]["total"] == 4

    assert (details["jid"], details["state"], details["job-type"]) == (job_id, "RUNNING", "STREAMING")
    source, sink = details["vertices"]
    # the keyed sum's per-batch pre-aggregation is chained to the source (planner.plan_streaming)
    assert source["name"] == "generator -> identity -> sum(v) (local)" and sink["name"] == "sum(v) -> parquet_sink"
    assert [v["parallelism"] for v in details["vertices"]] == [2, 2]
    assert source["metrics"]["read-records"] == 0 and source["metrics"]["write-records"] > 0
    assert sink["metrics"]["read-records"] > 0 and sink["metrics"]["read-bytes"] > 0
    # the generator is limited to RATE rows per second over its subtasks; one partial per key
    # (7 keys) and batch leaves the vertex (the operator-level rates below show RATE)
    assert 0 < source["metrics"]["write-records-per-second"] < RATE * 0.5
    assert source["metrics"]["backpressure-level"] == "ok"
    # the sink's task waits for the slow source most of each second (once the window left its start-up)
    wait_until(lambda: get(f"{web}/jobs/{job_id}")["vertices"][1]["metrics"]["idle-time-ms-per-second"] > 500, 20,
               "the sink's task never showed as idle")

    nodes = get(f"{web}/jobs/{job_id}/plan")["plan"]["nodes"]
    assert [n["id"] for n in nodes] == [source["id"], sink["id"]]
    assert nodes[1]["inputs"] == [{"num": 0, "id": source["id"], "ship_strategy": "HASH", "exchange": "pipelined"}]

    subtasks = get(f"{web}/jobs/{job_id}/vertices/{sink['id']}")["subtasks"]
    assert [s["status"] for s in subtasks] == ["RUNNING", "RUNNING"]
    assert {s["taskmanager-id"] for s in subtasks} <= {tm["id"] for tm in get(f"{web}/taskmanagers")["taskmanagers"]}
    assert sum(s["metrics"]["read-records"] for s in subtasks) > 0
    assert get(f"{web}/jobs/{job_id}/vertices/{source['id']}/backpressure")["backpressure-level"] == "ok"

    checkpoints = wait_until(lambda: (c := get(f"{web}/jobs/{job_id}/checkpoints"))["counts"]["completed"] and c,
                             30, "no checkpoint completed")
    assert checkpoints["latest"]["completed"]["status"] == "COMPLETED"
    assert checkpoints["history"][0]["id"] >= checkpoints["latest"]["completed"]["id"]
    assert get(f"{web}/jobs/{job_id}/exceptions")["exceptionHistory"]["entries"] == []

    tms = get(f"{web}/taskmanagers")["taskmanagers"]
    assert len(tms) == 2 and sum(t["slotsNumber"] for t in tms) == 4 and sum(t["freeSlots"] for t in tms) == 2
    one = get(f"{web}/taskmanagers/{tms[0]['id']}")
    assert [s["jobId"] for s in one["allocatedSlots"]].count(job_id) == 2 - tms[0]["freeSlots"]
    # what its memory watchdog measured, in its last heartbeat (an idle TaskExecutor is ~100 MB)
    memory = wait_until(lambda: get(f"{web}/taskmanagers/{tms[0]['id']}")["memory"], 10, "no memory reported")
    assert memory["limit"] == 1 << 30 and memory["level"] == "ok"  # taskmanager.memory.process.size, the default
    assert 50 << 20 < memory["used"] <= memory["peak"] < memory["limit"] and memory["managedTotal"] == 1 << 28

    # Prometheus: where to scrape is in REST (each TaskExecutor's metricsAddress, and a service
    # discovery document a Prometheus reads with http_sd_configs), every address once
    groups = get(f"{web}/metrics/prometheus-targets")
    targets = {g["labels"]["component"] + "/" + g["labels"].get("tm_id", ""): g["targets"] for g in groups}
    assert set(targets) == {"jobmanager/", *(f"taskmanager/{t['id']}" for t in tms)}
    assert all(g["labels"]["cluster_id"] for g in groups)
    assert {targets[f"taskmanager/{t['id']}"][0] for t in tms} == {t["metricsAddress"] for t in tms}
    addresses = [a for g in groups for a in g["targets"]]
    # (each in the configured range and listening; another process may listen in the range too)
    ports = {int(a.rsplit(":", 1)[1]) for a in addresses}
    assert len(set(addresses)) == 3 and len(ports) == 3
    assert all(port in cluster.prom_ports and _listening(port) for port in ports), (ports, cluster.prom_ports)
    # the AppMaster's cluster and job figures, the TaskExecutors' task and operator figures
    scraped = [scrape(f"http://{address}/metrics") for address in addresses]
    am = [m for m in scraped if "yarnflow_jobmanager_taskSlotsTotal" in m]
    tes = [m for m in scraped if "yarnflow_taskmanager_job_task_busyTimeMsPerSecond" in m]
    assert len(am) == 1 and len(tes) == 2
    assert am[0]["yarnflow_jobmanager_taskSlotsTotal"] == [({}, 4.0)]
    assert am[0]["yarnflow_jobmanager_numRegisteredTaskManagers"] == [({}, 2.0)]
    assert am[0]["yarnflow_jobmanager_Status_Process_Memory_RSS"][0][1] > 10 << 20
    assert 0 <= am[0]["yarnflow_jobmanager_Status_Process_CPU_Load"][0][1] < 8
    assert am[0]["yarnflow_jobmanager_job_numRestarts"] == [({"job_id": job_id, "job_name": "generated"}, 0.0)]
    [(_, completed)] = am[0]["yarnflow_jobmanager_job_numberOfCompletedCheckpoints"]
    assert completed >= 1
    # the checkpoints' durations: a histogram over every one (issue 55), its buckets cumulative
    buckets = [(labels["le"], v) for labels, v in am[0]["yarnflow_jobmanager_job_checkpointDurationSeconds_bucket"]]
    [(_, count)] = am[0]["yarnflow_jobmanager_job_checkpointDurationSeconds_count"]
    assert buckets[-1] == ("+Inf", count) and count >= completed - 1  # (a scrape apart)
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)
    assert am[0]["yarnflow_jobmanager_job_checkpointDurationSeconds_sum"][0][1] > 0
    # Flink's counters are counters: rate() is right across a restart (issue 55)
    types = {f.name: f.type for m in [requests.get(f"http://{a}/metrics", timeout=10).text for a in addresses]
             for f in text_string_to_metric_families(m)}
    assert types["yarnflow_taskmanager_job_task_numRecordsIn"] == "counter"
    assert types["yarnflow_taskmanager_job_task_operator_numRecordsOut"] == "counter"
    assert types["yarnflow_taskmanager_job_task_busyTimeMsPerSecond"] == "gauge"
    assert types["yarnflow_jobmanager_job_checkpointDurationSeconds"] == "histogram"
    out = [v for m in tes for labels, v in m["yarnflow_taskmanager_job_task_operator_numRecordsOut_total"]
           if labels["operator_name"] == "identity" and labels["job_id"] == job_id]
    rates = [v for m in tes for labels, v in m["yarnflow_taskmanager_job_task_operator_numRecordsOutPerSecond"]
             if labels["operator_name"] == "identity" and labels["job_id"] == job_id]
    assert len(out) == 2 and all(v > 0 for v in out)
    # Flink's label names: the job's name, the host, the attempt, an operator id
    [labels] = [labels for m in tes for labels, _ in m["yarnflow_taskmanager_job_task_operator_numRecordsOut_total"]
                if labels["operator_name"] == "identity" and labels["subtask_index"] == "0"]
    assert (labels["job_name"], labels["task_attempt_num"], labels["host"]) == ("generated", "0", socket.gethostname())
    assert labels["operator_id"].endswith("#1")  # identity, after the generator in its chain
    assert RATE * 0.5 < sum(rates) < RATE * 1.5
    for m in tes:
        [(_, limit)] = m["yarnflow_taskmanager_Status_Process_Memory_Limit"]
        [(_, used)] = m["yarnflow_taskmanager_Status_Process_Memory_Used"]
        assert limit == 1 << 30 and 0 < used < limit and m["yarnflow_taskmanager_Status_Process_Memory_Level"][0][1] == 0
        for name in ("busyTimeMsPerSecond", "backPressuredTimeMsPerSecond", "idleTimeMsPerSecond"):
            assert all(0 <= v <= 1000 for _, v in m[f"yarnflow_taskmanager_job_task_{name}"])

    # cancel through the REST API, as Flink's clients do
    response = requests.patch(f"{web}/jobs/{job_id}?mode=cancel", timeout=10)
    assert response.status_code == 202 and response.json() == {}
    wait_until(lambda: get(f"{web}/jobs/{job_id}")["state"] == "CANCELED", 30, "the job was not cancelled")
    assert get(f"{web}/overview")["jobs-cancelled"] == 1
    ended = requests.patch(f"{web}/jobs/{job_id}?mode=cancel", timeout=10)
    assert ended.status_code == 409 and "already ended CANCELED" in ended.json()["errors"][0]
    # an ended job keeps its figures and plan
    final = get(f"{web}/jobs/{job_id}")
    assert final["vertices"][1]["metrics"]["read-records"] > 0 and final["plan"]["nodes"]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_savepoints_are_triggered_and_reported_asynchronously(cluster: Any, tmp_path: Path) -> None:
    web = cluster.web
    job_id = submit(cluster, generator_job(str(tmp_path / "out")), "savepointed", CHECKPOINTED)
    wait_flowing(web, job_id)
    target = tmp_path / "savepoints"
    response = requests.post(f"{web}/jobs/{job_id}/savepoints", json={"target-directory": str(target)}, timeout=10)
    assert response.status_code == 202
    trigger = response.json()["request-id"]

    def done() -> dict[str, Any] | None:
        status = get(f"{web}/jobs/{job_id}/savepoints/{trigger}")
        return status if status["status"]["id"] == "COMPLETED" else None
    status = wait_until(done, 60, "the savepoint never completed", interval_s=0.2)
    location = status["operation"]["location"]
    assert location.startswith(f"file://{target}") or location.startswith(str(target)), location
    assert os.path.exists(os.path.join(location.removeprefix("file://"), "_metadata"))
    # cancel-job: a savepoint, then the job is cancelled
    second = requests.post(f"{web}/jobs/{job_id}/savepoints", json={"target-directory": str(target),
                                                                    "cancel-job": True}, timeout=10).json()
    wait_until(lambda: get(f"{web}/jobs/{job_id}/savepoints/{second['request-id']}")["status"]["id"] == "COMPLETED",
               60, "the savepoint with cancel-job never completed")
    wait_until(lambda: get(f"{web}/jobs/{job_id}")["state"] == "CANCELED", 30, "cancel-job did not cancel the job")
    late = requests.post(f"{web}/jobs/{job_id}/savepoints", json={"target-directory": str(target)}, timeout=10)
    assert late.status_code == 409


def test_rescaling_is_triggered_and_reported_asynchronously(cluster: Any, tmp_path: Path) -> None:
    """Flink's ``PATCH /jobs/:id/rescaling?parallelism=N`` and its status: a bad parallelism is a
    400; the job's own parallelism completes at once; a generator source's per-subtask position
    cannot go to another parallelism, so that rescale completes with the reason as its failure
    cause and the job runs on (the rescales that do happen: tests/integration/test_rescaling.py)."""
    web = cluster.web
    job_id = submit(cluster, generator_job(str(tmp_path / "out")), "rescaled", CHECKPOINTED)
    wait_flowing(web, job_id)
    for bad in ("", "?parallelism=0", "?parallelism=two"):
        response = requests.patch(f"{web}/jobs/{job_id}/rescaling{bad}", timeout=10)
        assert response.status_code == 400 and "positive integer" in response.json()["errors"][0]

    def status(parallelism: int) -> dict[str, Any]:
        response = requests.patch(f"{web}/jobs/{job_id}/rescaling?parallelism={parallelism}", timeout=10)
        assert response.status_code == 202
        trigger = response.json()["request-id"]
        return wait_until(lambda: (lambda s: s if s["status"]["id"] == "COMPLETED" else None)(
            get(f"{web}/jobs/{job_id}/rescaling/{trigger}")), 90, "the rescaling never completed", interval_s=0.2)
    assert status(2)["operation"] == {"parallelism": 2}
    refused = status(3)["operation"]["failure-cause"]
    assert "operator 'source'" in refused["stack-trace"] and "runs on at its parallelism" in refused["stack-trace"]
    wait_until(lambda: get(f"{web}/jobs/{job_id}")["state"] == "RUNNING", 30, "the job did not run on")
    assert {v["parallelism"] for v in get(f"{web}/jobs/{job_id}")["vertices"]} == {2}
    assert requests.get(f"{web}/jobs/{job_id}/rescaling/{'0' * 32}", timeout=10).status_code == 404


def test_a_failing_job_shows_its_exceptions(cluster: Any, tmp_path: Path) -> None:
    web = cluster.web
    job_id = submit(cluster, generator_job(str(tmp_path / "out"), fail_after=3000), "failing",
                    {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": "1",
                     "restart-strategy.fixed-delay.delay": "100 ms"})
    wait_until(lambda: get(f"{web}/jobs/{job_id}")["state"] == "FAILED", 60, "the job did not fail")
    exceptions = get(f"{web}/jobs/{job_id}/exceptions")
    assert "boom at row" in exceptions["root-exception"]
    entries = exceptions["exceptionHistory"]["entries"]
    assert len(entries) == 2  # the failure that restarted, then the one that failed the job
    assert all("boom at row" in e["stacktrace"] for e in entries), entries
    assert entries[0]["timestamp"] >= entries[1]["timestamp"]  # newest first
    details = get(f"{web}/jobs/{job_id}")
    assert details["num-restarts"] == 1 and details["vertices"][0]["status"] == "FAILED"
    assert get(f"{web}/overview")["jobs-failed"] == 1
    # no checkpoints in this job: a 404 naming why
    missing = requests.get(f"{web}/jobs/{job_id}/checkpoints", timeout=10)
    assert missing.status_code == 404 and "takes no checkpoints" in missing.json()["errors"][0]


@pytest.mark.parametrize("method, path, body, status, message", [
    ("GET", "/jobs/not-a-job", None, 400, "not a job id"),
    ("GET", "/jobs/" + "0" * 32, None, 404, "no job"),
    ("GET", "/jobs/" + "0" * 32 + "/exceptions", None, 404, "no job"),
    ("PATCH", "/jobs/" + "0" * 32 + "?mode=pause", None, 400, "mode 'pause' is not supported"),
    ("PATCH", "/jobs/" + "0" * 32 + "?mode=stop", None, 404, "no job"),
    ("POST", "/jobs/" + "0" * 32 + "/savepoints", "[1, 2]", 400, "must be a JSON object"),
    ("POST", "/jobs/" + "0" * 32 + "/savepoints", "{not json", 400, "must be a JSON object"),
    ("POST", "/jobs/" + "0" * 32 + "/savepoints", '{"cancel-job": "yes"}', 400, "cancel-job must be"),
    ("POST", "/jobs/" + "0" * 32 + "/savepoints", '{"target-directory": 5}', 400, "target-directory must be"),
    # issue 31: a 100,000-deep body was a 500 with a traceback in the AppMaster's log
    ("POST", "/jobs/" + "0" * 32 + "/savepoints", '{"target-directory": "relative/dir"}', 400, "absolute path"),
    ("POST", "/jobs/" + "0" * 32 + "/savepoints", '{"target-directory": "/tmp/sp/../../etc"}', 400, "'..'"),
    ("POST", "/jobs/" + "0" * 32 + "/savepoints", '{"target-directory": "/tmp/a\\u0000b"}', 400, "control character"),
    pytest.param("POST", "/jobs/" + "0" * 32 + "/savepoints", "[" * 100_000 + "]" * 100_000, 400,
                 "nests deeper than 64", id="json-100000-deep"),
    pytest.param("POST", "/jobs/" + "0" * 32 + "/savepoints", '{"a": ' * 65 + "1" + "}" * 65, 400,
                 "rest.server.max-json-depth", id="json-65-deep"),
    ("GET", "/jobs/" + "0" * 32 + "/savepoints/nope", None, 400, "not a trigger id"),
    ("GET", "/jobs/" + "0" * 32 + "/savepoints/" + "a" * 32, None, 404, "no savepoint trigger"),
    ("GET", "/savepoint-disposal/" + "a" * 32, None, 404, "no savepoint disposal trigger"),
    ("POST", "/savepoint-disposal", '{"savepoint-path": "rel"}', 400, "absolute path"),
    ("POST", "/savepoint-disposal", "{}", 400, "savepoint-path must name"),
    ("GET", "/jobs/" + "0" * 32 + "/checkpoints/details/x", None, 400, "not a checkpoint id"),
    ("GET", "/jobs/" + "0" * 32 + "/vertices/nope/subtasks/0", None, 400, "not a vertex id"),
    ("GET", "/jobs/metrics?get=numRestarts&agg=median", None, 400, "unknown aggregation"),
    ("POST", "/jobs/" + "0" * 32 + "/stop", '{"drain": "yes"}', 400, "drain must be"),
    ("GET", "/taskmanagers/nope", None, 404, "no TaskExecutor nope"),
    ("GET", "/no/such/path", None, 404, "not found"),
    ("DELETE", "/jobs", None, 405, "not allowed"),
])
def test_bad_ids_and_bodies_get_json_errors(cluster: Any, method: str, path: str, body: str | None, status: int,
                                            message: str) -> None:
    response = requests.request(method, cluster.web + path, data=body, timeout=10,
                                headers={"Content-Type": "application/json"} if body else {})
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/json"
    assert message in response.json()["errors"][0].lower() or message in response.json()["errors"][0]
    with open(cluster.log_path, errors="replace") as log:
        assert "Traceback" not in log.read()


def test_a_bad_job_or_vertex_on_a_running_job(cluster: Any, tmp_path: Path) -> None:
    web = cluster.web
    job_id = submit(cluster, generator_job(str(tmp_path / "out")), "running")
    wait_flowing(web, job_id)
    assert requests.get(f"{web}/jobs/{job_id}/vertices/nope", timeout=10).status_code == 400  # not an id
    assert requests.get(f"{web}/jobs/{job_id}/vertices/{'0' * 32}", timeout=10).status_code == 404
    # no savepoint folder given and none configured: refused before anything starts
    refused = requests.post(f"{web}/jobs/{job_id}/savepoints", json={}, timeout=10)
    assert refused.status_code == 400 and "state.savepoints.dir" in refused.json()["errors"][0]
    assert requests.get(f"{web}/jobs/{job_id.upper()}", timeout=10).json()["jid"] == job_id
    requests.patch(f"{web}/jobs/{job_id}", timeout=10)  # mode defaults to cancel
    wait_until(lambda: get(f"{web}/jobs/{job_id}")["state"] == "CANCELED", 30, "the job was not cancelled")


def test_the_first_free_port_of_a_range_else_any() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    bound: list[int] = []

    def bind(p: int) -> Any:
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            s.close()
            raise
        bound.append(s.getsockname()[1])
        return s

    try:
        sock, asked = bind_first_free((port, port + 1), bind, "test")
        assert asked == bound[-1] == port + 1 or asked == 0  # port + 1 may be taken by someone else
        sock.close()
        sock, asked = bind_first_free((port, port), bind, "test")  # the whole range is taken: any port
        assert asked == 0 and bound[-1] not in (0, port)
        sock.close()

        def refused(p: int) -> Any:
            raise OSError(errno.EADDRNOTAVAIL, "cannot assign requested address")
        with pytest.raises(OSError):
            bind_first_free((port, port + 1), refused, "test")
    finally:
        taken.close()


def test_a_taken_rest_port_moves_the_rest_api_to_the_next_free_one(local_cluster: Any) -> None:
    low, high = free_port_range(2, random.randint(20000, 60000))
    taken = socket.socket()
    taken.bind(("127.0.0.1", low))
    taken.listen()
    try:
        c = local_cluster(taskexecutors=1, slots=1, rest__port=f"{low}-{high}")
        assert c.web_url() == f"http://127.0.0.1:{high}"
        assert get(f"{c.web_url()}/overview")["taskmanagers"] == 1
    finally:
        taken.close()


def test_a_jobs_configuration_shows_what_it_runs_with(cluster: Any, tmp_path: Path) -> None:
    """A job submitted without a runtime mode or a parallelism in its configuration (AUTOMATIC
    mode, the parallelism set in its code) showed `execution.runtime-mode AUTOMATIC` and
    `parallelism.default 1` while it ran STREAMING at parallelism 2 (issue 55)."""
    import yarnflow
    from yarnflow import executors

    ctx = executors.ClusterContext(cluster.address, {"execution.checkpointing.interval": "1 s"}, progress=False,
                                   detached=True)
    executors.set_context(ctx)
    try:
        env = yarnflow.StreamExecutionEnvironment()
        env.set_parallelism(2)
        generator_job(str(tmp_path / "out"))(env)  # an unbounded source: AUTOMATIC runs it STREAMING
        job_id = str(env.execute("effective").job_id)
    finally:
        executors.set_context(None)
    try:
        config = {e["key"]: e["value"] for e in get(f"{cluster.web}/jobs/{job_id}/jobmanager/config")}
        assert config["execution.runtime-mode"] == "STREAMING" and config["parallelism.default"] == "2"
        assert config["execution.checkpointing.interval"] == "1 s"
        assert get(f"{cluster.web}/jobs/{job_id}/config")["execution-config"]["execution-mode"] == "STREAMING"
    finally:
        requests.patch(f"{cluster.web}/jobs/{job_id}?mode=cancel", timeout=10)
