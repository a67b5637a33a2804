"""The history server (issue 32, Flink's HistoryServer): jobs run by `yarnflow run` on embedded
clusters (per-job clusters: each ends with its job) are archived into jobmanager.archive.fs.dir;
`yarnflow history-server` serves them after those clusters are gone, with the same REST answers
and the same web UI; a job archived later is picked up while it runs."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.harness import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def _job(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


GOOD = """\
    import sys
    import yarnflow
    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.from_collection({"v": list(range(500))}).map(lambda r: {"v": r["v"] + 1}).sink_to_parquet(sys.argv[1])
    env.execute("archived ok")
"""
BAD = """\
    import yarnflow
    def boom(r):
        if r["v"] == 7:
            raise ValueError("archived boom")
        return r
    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.from_collection({"v": list(range(50))}).map(boom).print()
    env.execute("archived failure")
"""


def test_ended_per_job_clusters_jobs_are_served_by_the_history_server(cli: Any, tmp_path: Path) -> None:
    archive = f"file://{tmp_path / 'archive'}"
    ok = cli.run("run", "-p", "2", "-D", f"jobmanager.archive.fs.dir={archive}", _job(tmp_path, "good", GOOD),
                 str(tmp_path / "out"))
    assert ok.returncode == 0, ok.stderr
    good_id = re.search(r"\(([0-9a-f]{32})\)", ok.stderr).group(1)
    server = cli.start("history-server", "-D", f"historyserver.archive.fs.dir={archive}", "-D",
                       "historyserver.web.port=0", "-D", "historyserver.archive.fs.refresh-interval=200 ms")
    line = server.stdout.readline()
    url = re.search(r"at (http://\S+)", line).group(1)
    assert "(1 archived jobs)" in line

    def get(path: str) -> Any:
        r = requests.get(url + path, timeout=10)
        assert r.status_code == 200, (path, r.status_code, r.text)
        return r.json()

    [job] = get("/jobs/overview")["jobs"]
    assert (job["jid"], job["name"], job["state"]) == (good_id, "archived ok", "FINISHED")
    details = get(f"/jobs/{good_id}")
    assert details["state"] == "FINISHED" and details["status-counts"]["FINISHED"] == len(details["vertices"])
    [vertex] = details["vertices"]
    assert vertex["parallelism"] == 2 and vertex["tasks"]["FINISHED"] == 2 and vertex["status"] == "FINISHED"
    assert len(get(f"/jobs/{good_id}/vertices/{vertex['id']}")["subtasks"]) == 2
    assert get(f"/jobs/{good_id}/vertices/{vertex['id']}/subtasks/1")["status"] == "FINISHED"
    assert get(f"/jobs/{good_id}/execution-result")["job-execution-result"]["application-status"] == "SUCCEEDED"
    assert get(f"/v1/jobs/{good_id}/plan")["plan"]["nodes"][0]["parallelism"] == 2
    assert get("/config")["features"] == {"web-submit": False, "web-cancel": False, "web-history": True}
    assert "yarnflow" in requests.get(url + "/", timeout=10).text  # the same web UI
    assert requests.get(f"{url}/jobs/{'0' * 32}", timeout=10).status_code == 404
    assert requests.patch(f"{url}/jobs/{good_id}?mode=cancel", timeout=10).status_code == 405

    # a second per-job cluster's job, failing, is archived while the history server runs
    bad = cli.run("run", "-D", f"jobmanager.archive.fs.dir={archive}", _job(tmp_path, "bad", BAD))
    assert bad.returncode == 1
    bad_id = re.search(r"\(([0-9a-f]{32})\)", bad.stderr).group(1)
    wait_until(lambda: len(get("/jobs/overview")["jobs"]) == 2, 20, "the new archive was not picked up")
    assert get("/overview")["jobs-failed"] == 1 and get("/overview")["jobs-finished"] == 1
    exceptions = get(f"/jobs/{bad_id}/exceptions")
    assert "archived boom" in exceptions["root-exception"]
    assert {e["id"]: e["status"] for e in get("/jobs")["jobs"]} == {good_id: "FINISHED", bad_id: "FAILED"}
    # the archive is Flink's format: a list of paths and their answers
    doc = json.loads((tmp_path / "archive" / bad_id).read_text())
    assert {e["path"] for e in doc["archive"]} >= {f"/jobs/{bad_id}", f"/jobs/{bad_id}/exceptions", "/jobs/overview"}
