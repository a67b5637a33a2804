"""What `yarnflow run` says as a job starts and ends, as a newcomer reads it (issue 50): Ctrl-C
cancels the job and says so (not an error about a running job), a detached job's hint names
the cluster to ask, a warning is said once, and where collected rows went is said without
naming a folder that is gone when the command ends."""

from __future__ import annotations

import re
import signal
import textwrap
import time
from pathlib import Path

import pytest

from tests.e2e.jobs import slow_job
from tests.harness import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def test_ctrl_c_cancels_the_job_and_says_so(cli, tmp_path):
    job = slow_job(str(tmp_path / "slow.py"), str(tmp_path / "out"), rows=4000, sleep_s=0.05)
    proc = cli.start("run", "--no-progress", job)
    submitted = proc.stderr.readline()  # type: ignore[union-attr]
    job_id = re.search(r"Submitted job slow \(([0-9a-f]{32})\)", submitted).group(1)  # type: ignore[union-attr]
    # let its tasks run (a map sleeping per row: the job takes minutes), then one Ctrl-C
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert f"cancelling job {job_id}" in err
    assert err.rstrip().splitlines()[-1] == f"interrupted: job {job_id} CANCELED", err
    assert "error:" not in err


def test_a_session_job_submitted_detached_names_its_cluster_in_the_hint(cli, tmp_path):
    session = cli.start("session", "start", "--target", "local", "--taskexecutors", "1")
    address = re.search(r"running at (\S+:\d+)", session.stdout.readline()).group(1)  # type: ignore[union-attr]
    job = slow_job(str(tmp_path / "slow.py"), str(tmp_path / "out"), rows=40, sleep_s=0.01)
    proc = cli.run("run", "--detached", "--address", address, job, check=True)
    job_id = re.search(r"\(([0-9a-f]{32})\) submitted detached", proc.stderr).group(1)  # type: ignore[union-attr]
    hint = re.search(r"follow it with `([^`]+)`", proc.stderr).group(1)  # type: ignore[union-attr]
    assert hint == f"yarnflow info --address {address} {job_id}"
    info = cli.run(*hint.split()[1:], check=True)  # the hint works as printed
    assert info.stdout.startswith(f"job slow ({job_id})"), info.stdout
    cli.run("session", "stop", "--address", address, check=True)


def test_warnings_are_said_once_and_collected_rows_are_named(cli, tmp_path):
    job = Path(tmp_path / "job.py")
    job.write_text(textwrap.dedent("""\
        import yarnflow
        env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
        env.set_runtime_mode("STREAMING")
        env.from_collection({"k": [1, 2, 1], "v": [1, 2, 3]}).key_by("k").sum("v").collect(name="sums")
        result = env.execute("sums")
        print(sorted(r["v"] for r in result.collected("sums").to_pylist()))
    """))
    proc = cli.run("run", "--no-progress", "-D", "execution.checkpointing.interval=1s", str(job), check=True)
    assert proc.stderr.count("stateful operators without a uid") == 1, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[2, 4]"  # (one batch: each key's sum once)
    [last] = [line for line in proc.stderr.splitlines() if " FINISHED in " in line]
    assert last.endswith("; results collected ('sums': env.execute(...).collected(name) returns them)"), last
    assert "file://" not in proc.stderr


@pytest.mark.parametrize("owner", ["none", "dead"])
def test_credentials_left_by_a_dead_session_are_not_used_for_a_new_cluster_on_its_port(cli, tmp_path, owner):
    """A session killed with SIGKILL leaves its credentials under its address; a later cluster
    on the same port (here `yarnflow run`'s embedded one, TLS off) must not be spoken to with
    them: credentials belong to the process that published them, not to an address."""
    import subprocess

    from yarnflow.common.security import CERT_FILE, KEY_FILE, OWNER_FILE, new_credentials

    port = free_port()
    stale = Path(cli.env["YARNFLOW_HOME"]) / "clusters" / f"127.0.0.1_{port}"
    made = new_credentials(str(tmp_path / "old-session"))
    stale.mkdir(parents=True)
    (stale / CERT_FILE).write_bytes(made.cert_pem)
    (stale / KEY_FILE).write_bytes(made.key_pem)
    if owner == "dead":
        gone = subprocess.Popen(["true"])
        gone.wait()
        (stale / OWNER_FILE).write_text(f"{gone.pid} 1.0")
    job = Path(tmp_path / "job.py")
    job.write_text("import yarnflow\nenv = yarnflow.StreamExecutionEnvironment.get_execution_environment()\n"
                   "env.from_collection({'x': [1, 2]}).print()\nenv.execute('after')\n")
    proc = cli.run("run", "--no-progress", "-D", f"jobmanager.rpc.port={port}", str(job))
    assert proc.returncode == 0, proc.stderr
    assert f"to 127.0.0.1:{port}" in proc.stderr and proc.stdout.split() == ["x", "1", "2"]
