"""Job submission over REST (issue 32, Flink's /jars endpoints) on a real local cluster: a job
file and a zip of a job file with the module it imports are uploaded, listed, planned and run
with arguments, parallelism and configuration keys; their output is exact. Bad uploads and a
job file that fails are clear errors; nothing of them is left."""

from __future__ import annotations

import io
import os
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest
import requests

from tests.harness import wait_until
from tests.integration.test_rest_api import cluster  # noqa: F401 - the fixture
from tests.rest import get

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

JOB = textwrap.dedent("""\
    import sys
    import yarnflow
    from scale import times

    out, n = sys.argv[1], int(sys.argv[2])
    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.from_collection({"v": list(range(n))}).map(lambda r: {"v": times(r["v"])}).sink_to_parquet(out)
    env.execute("uploaded")
""")
MODULE = "def times(v):\n    return v * 3\n"


def _upload(web: str, name: str, data: bytes) -> requests.Response:
    return requests.post(f"{web}/jars/upload", files={"jarfile": (name, data, "application/octet-stream")}, timeout=30)


def _zip(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return buf.getvalue()


def _values(out: Path) -> list[int]:
    return sorted(pads.dataset(str(out), format="parquet").to_table()["v"].to_pylist())


def test_a_zipped_job_is_uploaded_listed_planned_run_and_deleted(cluster: Any, tmp_path: Path) -> None:  # noqa: F811
    web = cluster.web
    up = _upload(web, "wordy job.zip", _zip({"job.py": JOB, "scale.py": MODULE}))
    assert up.status_code == 200 and up.json()["status"] == "success"
    jarid = os.path.basename(up.json()["filename"])
    [listed] = [f for f in get(f"{web}/jars")["files"] if f["id"] == jarid]
    assert listed["name"] == "wordy_job.zip" and listed["entry"] == [{"name": "job.py", "description": None}]

    plan = requests.post(f"{web}/jars/{jarid}/plan", json={"programArgsList": [str(tmp_path / "x"), "10"],
                                                           "parallelism": 3}, timeout=120)
    assert plan.status_code == 200, plan.text
    [node] = plan.json()["plan"]["nodes"]
    assert node["parallelism"] == 3 and "map" in node["description"]
    assert not (tmp_path / "x").exists()  # a plan runs nothing

    out = tmp_path / "out"
    run = requests.post(f"{web}/jars/{jarid}/run", json={
        "programArgsList": [str(out), "1000"], "parallelism": 2,
        "flinkConfiguration": {"execution.runtime-mode": "BATCH"}}, timeout=120)
    assert run.status_code == 200, run.text
    job_id = run.json()["jobid"]
    wait_until(lambda: get(f"{web}/jobs/{job_id}/status")["status"] == "FINISHED", 60, "the uploaded job did not finish")
    assert _values(out) == [3 * v for v in range(1000)]
    details = get(f"{web}/jobs/{job_id}")
    assert details["name"] == "uploaded" and details["job-type"] == "BATCH"
    assert {v["parallelism"] for v in details["vertices"]} == {2}

    assert requests.delete(f"{web}/jars/{jarid}", timeout=10).status_code == 200
    assert jarid not in [f["id"] for f in get(f"{web}/jars")["files"]]
    assert requests.post(f"{web}/jars/{jarid}/run", json={}, timeout=10).status_code == 404


def test_a_job_file_is_run_with_query_arguments(cluster: Any, tmp_path: Path) -> None:  # noqa: F811
    (tmp_path / "scale.py").write_text(MODULE)  # (a lone job file imports only what the cluster has)
    job = JOB.replace("from scale import times\n", "times = lambda v: v * 3\n")
    up = _upload(cluster.web, "job.py", job.encode())
    jarid = os.path.basename(up.json()["filename"])
    out = tmp_path / "out"
    run = requests.post(f"{cluster.web}/jars/{jarid}/run", params={"programArg": f"{out},50", "parallelism": "1"},
                        timeout=120)
    assert run.status_code == 200, run.text
    job_id = run.json()["jobid"]
    wait_until(lambda: get(f"{cluster.web}/jobs/{job_id}/status")["status"] == "FINISHED", 60, "not finished")
    assert _values(out) == [3 * v for v in range(50)]


@pytest.mark.parametrize("name, data, status, message", [
    ("job.txt", b"print(1)", 400, "upload a Python job file"),
    ("evil.zip", None, 400, "a path outside its folder"),
    ("empty.zip", b"PK\x05\x06" + b"\0" * 18, 400, "no Python job file"),
    ("broken.zip", b"not a zip", 400, "not a zip file"),
])
def test_bad_uploads_are_refused_and_leave_nothing(cluster: Any, name: str, data: bytes | None, status: int,  # noqa: F811
                                                   message: str) -> None:
    if data is None:
        data = _zip({"../../escape.py": "x = 1\n", "job.py": JOB})
    response = _upload(cluster.web, name, data)
    assert response.status_code == status and message in response.json()["errors"][0], response.text
    assert get(f"{cluster.web}/jars")["files"] == []
    assert not list(Path(cluster.work_dir).rglob("escape.py"))


def test_a_failing_job_file_is_a_clear_error_with_its_traceback(cluster: Any) -> None:  # noqa: F811
    up = _upload(cluster.web, "bad.py", b"import yarnflow\nraise ValueError('no such input: /nowhere')\n")
    jarid = os.path.basename(up.json()["filename"])
    run = requests.post(f"{cluster.web}/jars/{jarid}/run", json={}, timeout=120)
    assert run.status_code == 400
    error = run.json()["errors"][0]
    assert "the job file failed" in error and "ValueError: no such input: /nowhere" in error and "bad.py" in error
    quiet = _upload(cluster.web, "quiet.py", b"print('no job here')\n")
    run = requests.post(f"{cluster.web}/jars/{os.path.basename(quiet.json()['filename'])}/run", timeout=120)
    assert run.status_code == 400 and "defined no job" in run.json()["errors"][0]
    assert requests.post(f"{cluster.web}/jars/nope/run", timeout=10).status_code == 400
    assert requests.post(f"{cluster.web}/jars/{jarid}/run", json={"parallelism": 0}, timeout=10).status_code == 400


def test_with_web_submit_off_nothing_can_be_uploaded(local_cluster: Any) -> None:
    c = local_cluster(taskexecutors=1, slots=1, rest__port="0", web__submit__enable="false")
    web = c.web_url()
    assert _upload(web, "job.py", JOB.encode()).status_code == 404
    assert requests.get(f"{web}/jars", timeout=10).status_code == 404
    assert get(f"{web}/config")["features"]["web-submit"] is False
