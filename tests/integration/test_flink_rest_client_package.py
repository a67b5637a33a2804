"""A Flink REST client from PyPI (``flink-rest-client``, written for Flink, used unchanged) against
a local session with ``rest.authentication: none`` (issue 50): every call it makes, each checked
against what the cluster ran. Where it gets an error, Flink answers the same: the checkpoint
views of a job that takes no checkpoints are 404, and rescaling answers 202 (Flink's
AsynchronousOperationTriggerMessageHeaders) where the client expects 200."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pyarrow.dataset as pads
import pytest
import requests
from flink_rest_client import FlinkRestClient
from flink_rest_client.common import RestException

from tests.harness import wait_until
from tests.rest import generator_job, submit, wait_flowing

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240),
              # the client leaves the uploaded file open (its code, not ours)
              pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]

JOB = textwrap.dedent("""\
    import argparse
    import yarnflow

    args = argparse.ArgumentParser()
    args.add_argument("--input")
    args.add_argument("--output")
    a = args.parse_args()
    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    (env.read_text(a.input).map(lambda r: {"word": r["line"].split()[0], "n": 1})
        .key_by("word").sum("n").sink_to_parquet(a.output))
    env.execute("uploaded by a Flink client")
""")


@pytest.fixture
def session(local_cluster: Any) -> Iterator[tuple[Any, FlinkRestClient]]:
    c = local_cluster(taskexecutors=2, slots=2, rest__port="0", rest__authentication="none")
    host, port = c.web_url().split("//")[1].split(":")
    yield c, FlinkRestClient.get(host=host, port=int(port))


def _counts(out: Path) -> dict[str, int]:
    table = pads.dataset(str(out), format="parquet").to_table().to_pylist()
    return {r["word"]: r["n"] for r in table}


def _finished(flink: FlinkRestClient, job_id: str) -> bool:
    return bool(flink.jobs.get(job_id)["state"] == "FINISHED")


def test_jar_calls_upload_a_job_file_plan_run_and_delete_it(session: Any, tmp_path: Path) -> None:
    _, flink = session
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("apple 1\npear 2\napple 3\n")
    (tmp_path / "job.py").write_text(JOB)

    # the client uploads under the multipart field "file" (Flink takes whatever the field's name)
    uploaded = flink.jars.upload(str(tmp_path / "job.py"))
    assert uploaded["status"] == "success"
    jar_id = Path(uploaded["filename"]).name
    assert [j["id"] for j in flink.jars.all()["files"]] == [jar_id]
    plan = flink.jars.get_plan(jar_id)
    assert any("parquet" in n["description"] for n in plan["nodes"]), plan
    assert not (tmp_path / "out").exists()  # a plan runs nothing
    job_id = flink.jars.run(jar_id, arguments={"input": tmp_path / "in", "output": tmp_path / "out"})
    wait_until(lambda: _finished(flink, job_id), 60, "the uploaded job did not finish")
    assert _counts(tmp_path / "out") == {"apple": 2, "pear": 1}
    assert flink.jars.delete(jar_id) is True
    assert flink.jars.all()["files"] == []

    again = flink.jars.upload_and_run(str(tmp_path / "job.py"),
                                      arguments={"input": tmp_path / "in", "output": tmp_path / "again"})
    wait_until(lambda: _finished(flink, again), 60, "the job uploaded and run in one call did not finish")
    assert _counts(tmp_path / "again") == {"apple": 2, "pear": 1}


def details_of(flink: FlinkRestClient, job_id: str, vertex_id: str) -> Any:
    return flink.jobs.get_vertex(job_id, vertex_id).details()


def _status(exc: pytest.ExceptionInfo[RestException]) -> int:
    return int(str(exc.value).split("(")[1].split(")")[0])


def test_every_cluster_job_vertex_and_subtask_call_on_running_jobs(session: Any, tmp_path: Path) -> None:
    cluster, flink = session
    web = cluster.web_url()
    checkpointed = submit(cluster, generator_job(str(tmp_path / "a")), "checkpointed",
                          {"execution.checkpointing.interval": "300 ms"})
    plain = submit(cluster, generator_job(str(tmp_path / "b")), "plain")
    wait_flowing(web, checkpointed)
    wait_flowing(web, plain)

    # the cluster
    overview = flink.overview()
    assert (overview["taskmanagers"], overview["slots-total"], overview["jobs-running"]) == (2, 4, 2)
    assert flink.jobmanager.config()["rest.authentication"] == "none" and flink.config()["flink-version"]
    assert flink.datasets() == []
    [log] = flink.jobmanager.logs()
    assert "AppMaster" in flink.jobmanager.get_log(log["name"])
    assert flink.jobmanager.get_log("jobmanager.log") == flink.jobmanager.get_log(log["name"])
    assert "AppMaster" in flink.jobmanager.get_log("jobmanager.out")  # (a local AppMaster writes both to one file)
    assert flink.jobmanager.metric_names() and isinstance(flink.jobmanager.metrics(), dict)

    tm_ids = flink.taskmanagers.taskmanager_ids()
    assert len(tm_ids) == 2 == len(flink.taskmanagers.all())
    assert flink.taskmanagers.metric_names() and isinstance(flink.taskmanagers.metrics(), dict)
    for tm in tm_ids:
        assert flink.taskmanagers.get(tm)["id"] == tm
        [tm_log] = flink.taskmanagers.get_logs(tm)
        assert tm_log["size"] > 0
        assert isinstance(flink.taskmanagers.get_metrics(tm), dict)
        assert any("Thread" in name or "main" in name for name in flink.taskmanagers.get_thread_dump(tm))

    # the jobs
    assert sorted(flink.jobs.job_ids()) == sorted([checkpointed, plain])
    assert {j["jid"]: j["name"] for j in flink.jobs.overview()} == {checkpointed: "checkpointed", plain: "plain"}
    assert flink.jobs.metric_names() and isinstance(flink.jobs.metrics(), dict)
    wait_until(lambda: flink.jobs.get_checkpoint_ids(checkpointed), 30, "no checkpoint completed")
    for job_id in (checkpointed, plain):
        assert flink.jobs.get(job_id)["state"] == "RUNNING"
        assert flink.jobs.get_config(job_id)["jid"] == job_id
        assert flink.jobs.get_exceptions(job_id)["exceptionHistory"]["entries"] == []
        assert isinstance(flink.jobs.get_metrics(job_id), dict)
        vertex_ids = flink.jobs.get_vertex_ids(job_id)
        assert [n["id"] for n in flink.jobs.get_plan(job_id)["nodes"]] == vertex_ids
        assert flink.jobs.get_accumulators(job_id)["user-task-accumulators"] == []
        for vertex_id in vertex_ids:
            vertex = flink.jobs.get_vertex(job_id, vertex_id)
            assert vertex.details()["id"] == vertex_id and vertex.details()["parallelism"] == 2
            assert vertex.backpressure()["status"] in ("ok", "deprecated")
            names = vertex.metric_names()
            assert names and isinstance(vertex.metrics(), dict)
            # Flink's ids: <subtask>.<metric> and <subtask>.<operator>.<metric>, never an empty part
            assert not any(".." in n or n.startswith(".") or n.endswith(".") for n in names), names
            operator = details_of(flink, job_id, vertex_id)["name"].split(" -> ")[0]
            assert f"0.{operator}.numRecordsOut" in names, names
            assert [t["subtask"] for t in vertex.subtasktimes()["subtasks"]] == [0, 1]
            assert vertex.taskmanagers()["id"] == vertex_id
            assert isinstance(vertex.watermarks(), list)
            sub = vertex.subtasks
            assert sub.subtask_ids() == [0, 1]
            assert [s["subtask"] for s in sub.accumulators()["subtasks"]] == [0, 1]
            assert sub.metric_names() and isinstance(sub.metrics(), dict)
            for i in (0, 1):
                assert sub.get(i)["status"] == "RUNNING"
                assert sub.get_attempt(i)["subtask"] == i
                acc = sub.get_attempt_accumulators(i)
                assert (acc["subtask"], acc["attempt"], acc["user-accumulators"]) == (i, 0, [])
        assert flink.jobs.get_execution_result(job_id)["status"]["id"] == "IN_PROGRESS"

    # checkpoints: the views of the checkpointed job; 404 for the other, as Flink answers
    assert flink.jobs.get_checkpointing_configuration(checkpointed)["interval"] == 300
    assert flink.jobs.get_checkpoints(checkpointed)["counts"]["completed"] >= 1
    latest = flink.jobs.get_checkpoint_ids(checkpointed)[-1]
    details = flink.jobs.get_checkpoint_details(checkpointed, latest, show_subtasks=True)
    assert details["id"] == latest and details["status"] == "COMPLETED"
    for call in (flink.jobs.get_checkpointing_configuration, flink.jobs.get_checkpoints,
                 flink.jobs.get_checkpoint_ids):
        with pytest.raises(RestException) as no_checkpoints:
            call(plain)
        assert _status(no_checkpoints) == 404

    # operations: rescaling answers 202 with a trigger id, as Flink does (the client expects 200)
    with pytest.raises(RestException) as rescaling:
        flink.jobs.rescale(plain, 1)
    assert _status(rescaling) == 202
    # a JSON body is read whatever its content type says (curl -d sends a form's), as Flink reads it
    curl_d = requests.post(f"{web}/jobs/{checkpointed}/savepoints", timeout=10,
                           data=json.dumps({"target-directory": str(tmp_path / "curl"), "cancel-job": False}),
                           headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert curl_d.status_code == 202, curl_d.text
    wait_until(lambda: requests.get(f"{web}/jobs/{checkpointed}/savepoints/{curl_d.json()['request-id']}",
                                    timeout=10).json()["status"]["id"] == "COMPLETED", 60, "no savepoint")
    assert len(list((tmp_path / "curl").iterdir())) == 1
    savepoint = flink.jobs.create_savepoint(checkpointed, str(tmp_path / "savepoints"))
    done = wait_until(lambda: savepoint.status if savepoint.status["status"]["id"] == "COMPLETED" else None, 60,
                      "the savepoint never completed")
    assert Path(done["operation"]["location"].removeprefix("file://")).is_dir()
    stop = flink.jobs.stop(checkpointed, str(tmp_path / "stopped"))
    stopped = wait_until(lambda: stop.status if stop.status["status"]["id"] == "COMPLETED" else None, 60,
                         "stop-with-savepoint never completed")
    assert Path(stopped["operation"]["location"].removeprefix("file://")).is_dir()
    wait_until(lambda: _finished(flink, checkpointed), 30, "the stopped job did not finish")
    assert flink.jobs.get_execution_result(checkpointed)["status"]["id"] == "COMPLETED"
    assert flink.jobs.terminate(plain) is True
    wait_until(lambda: flink.jobs.get(plain)["state"] == "CANCELED", 30, "the job was not cancelled")
