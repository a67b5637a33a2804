"""Bad input through the CLI: clear one-line errors, non-zero exits, nothing left running
(the ``cli`` fixture fails the test if any process it started is still alive)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.e2e.jobs import REPO, WORDCOUNT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _job(tmp_path, body: str, name: str = "job.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_job_file_that_raises_shows_the_error_and_its_line(cli, tmp_path):
    job = _job(tmp_path, """\
        import yarnflow
        env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
        raise ValueError("no such table: sales")
    """)
    proc = cli.run("run", job)
    assert proc.returncode == 1
    assert "ValueError: no such table: sales" in proc.stderr
    assert f'File "{job}", line 3' in proc.stderr
    assert "Traceback" not in proc.stderr  # only the user's frames, not the CLI's


def test_job_file_with_syntax_error(cli, tmp_path):
    job = _job(tmp_path, "def broken(:\n")
    proc = cli.run("run", job)
    assert proc.returncode == 1
    assert "SyntaxError" in proc.stderr and "line 1" in proc.stderr


def test_job_file_that_defines_no_job(cli, tmp_path):
    proc = cli.run("run", _job(tmp_path, "x = 1\n"))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'job.py'} defined no job: build a pipeline and call env.execute(...)"]


def test_pipeline_without_sink_is_rejected_before_anything_starts(cli, tmp_path):
    job = _job(tmp_path, """\
        import yarnflow
        env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
        env.from_collection([1, 2, 3]).map(lambda r: r)
        env.execute("nosink")
    """)
    proc = cli.run("run", job)
    assert proc.returncode == 1
    assert "the pipeline has no sink" in proc.stderr
    assert "Submitted" not in proc.stderr


def test_missing_job_file(cli, tmp_path):
    proc = cli.run("run", str(tmp_path / "nope.py"))
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: job file {tmp_path / 'nope.py'} does not exist"


#: what a user's error output must never show: yarnflow's own frames and the interpreter's runner
INTERNALS = ("/worker/", "/client/", "/common/", "site-packages/yarnflow", "<frozen runpy>", "click/core.py",
             "UserFunctionError", "RpcError")


def _no_internals(err: str) -> None:
    leaked = [line for line in err.splitlines() if any(mark in line for mark in INTERNALS)]
    assert not leaked, err


def test_user_function_error_fails_the_job_with_the_users_frames_only(cli, tmp_path):
    job = _job(tmp_path, """\
        import yarnflow

        def parse(row):
            return {"n": int(row["s"])}

        env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
        env.from_collection({"s": ["1", "2", "x"]}).map(parse, name="parse").print()
        env.execute("bad-data")
    """)
    proc = cli.run("run", "--no-progress", job)
    assert proc.returncode == 1
    err = proc.stderr
    [headline] = [line for line in err.splitlines() if line.startswith("error:")]
    assert re.match(r"error: job bad-data \([0-9a-f]{32}\) failed: user function parse in operator 'parse' "
                    r"raised ValueError: invalid literal for int\(\) with base 10: 'x' \[", headline), headline
    # then the user function's own frame (from the TaskExecutor) and its error: nothing of yarnflow
    after = err[err.index(headline) + len(headline):].strip().splitlines()
    assert after[0] == "Traceback (most recent call last):"
    assert after[1].endswith('job.py", line 4, in parse') and after[2].strip() == 'return {"n": int(row["s"])}'
    assert after[-1] == "ValueError: invalid literal for int() with base 10: 'x'"
    assert len(after) <= 5, err
    _no_internals(err)
    # run as `python JOB.py`: Python's own report, with the TaskExecutor's user frames as the
    # cause and the job file's execute() line, nothing of the client's or the tasks' internals
    proc = subprocess.run([sys.executable, job], capture_output=True, text=True, timeout=120, env=cli.env,
                          cwd=cli.cwd, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1
    err = proc.stderr
    assert re.search(r'File ".*job\.py", line 4, in parse', err), err
    assert re.search(r'File ".*job\.py", line 8, in <module>', err), err
    assert err.index("line 4, in parse") < err.index("line 8, in <module>") < err.index("JobFailedError: job bad-data")
    _no_internals(err)


def test_a_missing_input_path_is_one_line(cli, tmp_path):
    job = _job(tmp_path, f"""\
        import yarnflow
        env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
        env.read_text({str(tmp_path / "no-such-folder")!r}).print()
        env.execute("missing")
    """)
    proc = cli.run("run", "--no-progress", job)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"failed: input path {tmp_path / 'no-such-folder'} does not exist" in errors[0]
    assert "Traceback" not in proc.stderr
    _no_internals(proc.stderr)


def test_a_syntax_error_shows_the_line_and_the_caret_in_run_and_plan(cli, tmp_path):
    job = _job(tmp_path, """\
        import yarnflow
        env = yarnflow.StreamExecutionEnvironment.get_execution_environment(
        env.execute("x")
    """)
    for command in ("run", "plan"):
        proc = cli.run(command, job)
        assert proc.returncode == 1
        lines = proc.stderr.rstrip().splitlines()
        assert lines[0] == f"error: the job file {job} is not valid Python:", proc.stderr
        assert lines[1] == f'  File "{job}", line 2'
        assert lines[2].strip() == "env = yarnflow.StreamExecutionEnvironment.get_execution_environment("
        assert lines[3].strip() == "^" and lines[-1] == "SyntaxError: '(' was never closed"
        _no_internals(proc.stderr)


def test_plan_of_a_job_file_that_raises_shows_its_frames_only(cli, tmp_path):
    job = _job(tmp_path, """\
        import yarnflow
        raise ValueError("no such table: sales")
    """)
    proc = cli.run("plan", job)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"error: the job file {job} raised ValueError: no such table: sales",
                                        f'  File "{job}", line 2, in <module>',
                                        '    raise ValueError("no such table: sales")']


@pytest.mark.parametrize("args, message", [
    (["-D", "no.such.key=1"], "error: unknown configuration key 'no.such.key' (from -D)"),
    (["-D", "heartbeat.intervall=1 s"], "did you mean 'heartbeat.interval'?"),
    (["-D", "heartbeat.interval=soon"], "error: bad value 'soon' for configuration key 'heartbeat.interval'"),
    (["-D", "taskmanager.numberOfTaskSlots=0"], "'taskmanager.numberOfTaskSlots'"),
    (["-D", "nonsense"], "error: bad -D argument 'nonsense': expected key=value"),
    (["-D", "high-availability.type=zookeeper"], "high-availability.zookeeper.quorum"),
])
def test_bad_configuration_is_one_clear_line(cli, args, message):
    proc = cli.run("run", *args, WORDCOUNT)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]


def test_a_bad_spark_memory_is_one_clear_line(cli):
    proc = cli.run("run", "-D", "spark.driver.memory=lots", os.path.join(REPO, "examples", "revenue_by_region.py"),
                   "--engine", "spark", timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: spark.driver.memory: 'lots' is not a memory size (e.g. 512m, 2g)"]


def test_standby_appmasters_without_zookeeper_is_one_clear_line(cli):
    proc = cli.run("session", "start", "--standby", "1", timeout=60)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: standby AppMasters need ZooKeeper high availability")
    assert "running at" not in proc.stdout


def test_unknown_cli_option_is_one_clear_line(cli):
    proc = cli.run("run", "--frobnicate", WORDCOUNT)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: No such option") and "--frobnicate" in lines[0]
    assert lines[0].endswith("(see `yarnflow run --help`)")


@pytest.mark.parametrize("command", [["list"], ["cancel", "abc"], ["info", "abc"], ["session", "stop"],
                                     ["run", WORDCOUNT]])
def test_unreachable_address_is_one_clear_line(cli, command):
    split = 2 if command[0] == "session" else 1
    argv = [*command[:split], "--address", "127.0.0.1:1", *command[split:]]
    proc = cli.run(*argv)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: cannot reach a yarnflow cluster at 127.0.0.1:1")


def test_bad_address_format(cli):
    proc = cli.run("list", "--address", "localhost")
    assert proc.returncode == 1
    assert "expected HOST:PORT" in proc.stderr


def test_every_command_has_help(cli):
    for command in (["--help"], ["run", "--help"], ["list", "--help"], ["cancel", "--help"], ["info", "--help"],
                    ["session", "--help"], ["session", "start", "--help"], ["session", "stop", "--help"]):
        proc = cli.run(*command)
        assert proc.returncode == 0, command
        assert "Usage: yarnflow" in proc.stdout
