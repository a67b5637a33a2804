"""`yarnflow logs JOB_ID [--taskexecutor ID]` and the web UI's URL, through the CLI as a user
runs them: against a local session (the AppMaster serves the log lines of its own log and its
TaskExecutors' log files) and against a YARN application on the sandbox (the containers' logs
through YARN's log aggregation, read with skein)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import requests

from tests.conftest import Cli
from tests.e2e.jobs import WORDCOUNT, write_text_corpus
from tests.e2e.test_session import _address

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def _job_id(text: str) -> str:
    found = re.search(r"\(([0-9a-f]{32})\)", text)
    assert found, text
    return found.group(1)


def sections(out: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        m = re.fullmatch(r"==> (.+) <==", line)
        if m:
            current = found.setdefault(m.group(1), [])
        elif current is not None:
            current.append(line)
    return found


def test_a_sessions_job_logs_and_web_ui(cli: Cli, tmp_path: Path) -> None:
    session = cli.start("session", "start", "--target", "local", "--taskexecutors", "2", "--slots", "1",
                        "-D", "rest.port=0")
    address = _address(session)
    web_line = session.stdout.readline()
    web = re.search(r"web UI:\s+(http://\S+)", web_line)
    assert web, web_line
    # a session's REST API wants its token, which `session start` prints (issue 31)
    assert requests.get(f"{web.group(1)}/overview", timeout=10).status_code == 401
    token = next(m.group(1) for line in iter(session.stdout.readline, "")
                 if (m := re.search(r"REST:\s+token (\S+)", line)))
    signed = {"Authorization": f"Bearer {token}"}
    assert requests.get(f"{web.group(1)}/overview", headers=signed, timeout=10).json()["taskmanagers"] == 2

    write_text_corpus(str(tmp_path / "books"), files=2, lines_per_file=500)
    ran = cli.run("run", "--address", address, "-p", "2", WORDCOUNT, "--input", str(tmp_path / "books"),
                  "--output", str(tmp_path / "counts"), check=True)
    job_id = _job_id(ran.stdout + ran.stderr)

    shown = cli.run("logs", "--address", address, job_id, check=True).stdout
    found = sections(shown)
    assert "appmaster" in found and any(f"job wordcount ({job_id}) submitted" in line for line in found["appmaster"])
    tes = [s for s in found if s.startswith("te-")]
    assert len(tes) == 2, found.keys()  # both TaskExecutors ran subtasks of the job
    for te in tes:
        assert all(job_id in line for line in found[te] if line[:4].isdigit())
        assert any(f"[job {job_id}]" in line and "finished" in line for line in found[te])

    one = cli.run("logs", "--address", address, "--taskexecutor", tes[0], job_id, check=True).stdout
    assert list(sections(one)) == [tes[0]]

    unknown_te = cli.run("logs", "--address", address, "--taskexecutor", "te-nope", job_id)
    assert unknown_te.returncode == 1 and "no log of TaskExecutor te-nope" in unknown_te.stderr
    unknown_job = cli.run("logs", "--address", address, "0" * 32)
    assert unknown_job.returncode == 1 and "no job 00000000000000000000000000000000" in unknown_job.stderr
    bad = cli.run("logs", "--address", address, "nope")
    assert bad.returncode == 1 and "is not a job id" in bad.stderr
    cli.run("session", "stop", "--address", address, check=True)
    session.wait(30)


def test_a_yarn_applications_job_logs_come_through_log_aggregation(cli: Cli, sandbox: object,
                                                                   tmp_path: Path) -> None:
    from tests.integration.test_yarn_jobs import JOB, YARN_CONF, app_id_of, dconf, write_input

    cli.env["SKEIN_CONFIG"] = sandbox.config_dir  # type: ignore[attr-defined]
    (tmp_path / "job.py").write_text(JOB)
    write_input(tmp_path / "in", files=2, rows=200)
    proc = cli.run("run", "--target", "yarn-per-job", *dconf(YARN_CONF), "job.py", str(tmp_path / "in"),
                   str(tmp_path / "out"), "BATCH", "0", "counted", timeout=120)
    assert proc.returncode == 0, proc.stderr
    app_id, job_id = app_id_of(proc.stderr), _job_id(proc.stderr)
    keys = ["-D", f"yarn.application.id={app_id}"]
    found = sections(cli.run("logs", *keys, job_id, check=True).stdout)
    masters = [s for s in found if s.startswith("appmaster (container_")]
    assert len(masters) == 1 and masters[0].endswith("_01_000001)")
    assert any(f"job counted ({job_id}) submitted" in line for line in found[masters[0]])
    containers = [s for s in found if s.startswith("container_")]
    # the TaskExecutor containers that ran its subtasks (BATCH: maybe one after the other): their
    # task lines are tagged; a container that only had a slot offered to the job (its subtask went
    # to another one first, as happens under load) names the job in untagged lines only
    ran = [c for c in containers if any(f"[job {job_id}]" in line for line in found[c])]
    assert ran, {c: found[c][-8:] for c in containers}
    one = sections(cli.run("logs", *keys, "--taskexecutor", ran[0], job_id, check=True).stdout)
    assert list(one) == [ran[0]]
    missing = cli.run("logs", *keys, "--taskexecutor", "container_nope", job_id)
    assert missing.returncode == 1 and "has no container container_nope" in missing.stderr
