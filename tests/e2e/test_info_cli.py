"""`yarnflow info` through the CLI on a session cluster with a fixed-delay restart strategy: a
job that fails once and recovers, and a job that fails for good once its restart attempts
are used up."""

from __future__ import annotations

import json
import re
import textwrap

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

FLAKY = """
    import os
    import sys

    import yarnflow

    MARKER = sys.argv[1]


    def fail_once(row):
        # the first attempt creates the marker and fails; every later attempt finds it
        if row["x"] == 7 and not os.path.exists(MARKER):
            open(MARKER, "w").close()
            raise RuntimeError("planned failure on row 7")
        return {"x": row["x"] * 10}


    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(2)
    env.from_collection({"x": list(range(100))}).map(fail_once, name="fail_once").collect()
    result = env.execute("flaky")
    print("total", sum(result.collected()["x"].to_pylist()))
"""

DOOMED = """
    import yarnflow


    def always(row):
        raise ValueError(f"doomed row {row['x']}")


    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(1)
    env.from_collection({"x": [1]}).map(always, name="always_fails").collect()
    env.execute("doomed")
"""

PATHS = """
    import yarnflow

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(1)
    words = env.from_collection({"s": [" Apple", "avocado ", "Berry", " ant"]})
    (words.map(lambda r: {"w": r["s"].strip().lower()}, name="clean")
          .filter(lambda r: r["w"].startswith("a"), name="keep_a")
          .map(lambda r: {"w": r["w"].title()}, name="titled").collect())
    print(sorted(env.execute("paths").collected()["w"].to_pylist()))
"""

SUBTASK = re.compile(r"^    subtask (\d+): attempt (\d+) on (\S.*)$")
HISTORY = re.compile(r"^  \d\d:\d\d:\d\d (.+?): (.+) -> (restarted (\d+) subtasks?|no restart)$")


def _address(session) -> str:
    line = session.stdout.readline()
    m = re.search(r"running at (\S+:\d+)", line)
    assert m, f"no address in {line!r}: {session.stderr.read() if session.poll() is not None else ''}"
    return m.group(1)


def _job_ids(cli, address) -> dict[str, dict]:
    proc = cli.run("list", "--address", address, "--json", check=True)
    jobs = [json.loads(line) for line in proc.stdout.splitlines()]
    return {j["name"]: j for j in jobs}


def _write(path, source: str) -> str:
    path.write_text(textwrap.dedent(source))
    return str(path)


def _info(cli, address, job_id) -> list[str]:
    proc = cli.run("info", "--address", address, job_id)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def _history(lines: list[str]) -> list[tuple[str, str, int | None]]:
    """(task, error, restarted subtasks or None for "no restart") per failure history line."""
    start = next(i for i, line in enumerate(lines) if line.startswith("failure history ("))
    entries = []
    for line in lines[start + 1:]:
        m = HISTORY.match(line)
        if not m:
            break
        entries.append((m.group(1), m.group(2), int(m.group(4)) if m.group(4) else None))
    return entries


def test_info_shows_attempts_locations_restart_strategy_and_failure_history(cli, tmp_path):
    session = cli.start("session", "start", "--taskexecutors", "2", "--slots", "2",
                        "-D", "restart-strategy.type=fixed-delay", "-D", "restart-strategy.fixed-delay.delay=100 ms")
    address = _address(session)

    # a job that fails once, is restarted and finishes
    marker = tmp_path / "failed-once"
    flaky = _write(tmp_path / "flaky.py", FLAKY)
    proc = cli.run("run", "--address", address, "--no-progress", flaky, str(marker))
    assert proc.returncode == 0, proc.stderr
    assert marker.exists()
    assert f"total {10 * sum(range(100))}" in proc.stdout
    job = _job_ids(cli, address)["flaky"]
    assert job["state"] == "FINISHED"

    lines = _info(cli, address, job["id"])
    text = "\n".join(lines)
    assert lines[0] == f"job flaky ({job['id']}): FINISHED", text
    assert "restart strategy: fixed-delay: 1 of 1 attempts used, delay 100 ms" in lines, text
    subtasks = [SUBTASK.match(line) for line in lines]
    subtasks = [(int(m.group(1)), int(m.group(2)), m.group(3)) for m in subtasks if m]
    assert [i for i, _, _ in subtasks] == [0, 1], text  # numbered from 0, as REST does; one vertex (source -> map -> collect chained), 2 subtasks
    locations = {where for _, _, where in subtasks}
    assert all(re.fullmatch(r"te-\d+-\w+", where) for where in locations), text  # a TaskExecutor's id
    assert len(locations) <= 2, text
    assert "failure history (1):" in lines, text
    [(task, error, restarted)] = _history(lines)
    assert "RuntimeError: planned failure on row 7" in error, text
    assert "fail_once" in task and task.endswith("(1/2)"), text  # row 7 is in subtask 1's half
    failed_on = re.search(r"\[TaskExecutor (\S+) ", error)
    assert failed_on and failed_on.group(1) in locations, text  # where the failure happened
    assert restarted is not None and restarted >= 1, text
    # every restarted subtask ran a second attempt; the others kept their first
    assert sum(attempt for _, attempt, _ in subtasks) == restarted, text
    assert {attempt for _, attempt, _ in subtasks} <= {0, 1}, text
    assert "failure cause" not in text, text
    # how its map ran: per row, and why (it calls os.path.exists, in a branch)
    assert re.search(r"^    fail_once: per row \(it .+\)$", text, re.MULTILINE), text

    # a job whose functions the vectoriser reads, and one it does not
    proc = cli.run("run", "--address", address, "--no-progress", _write(tmp_path / "paths.py", PATHS))
    assert proc.returncode == 0, proc.stderr
    assert "['Ant', 'Apple', 'Avocado']" in proc.stdout
    text = "\n".join(_info(cli, address, _job_ids(cli, address)["paths"]["id"]))
    assert "    clean: vectorised (Arrow compute)" in text, text
    assert "    keep_a: vectorised (Arrow compute)" in text, text
    assert "    titled: per row (it calls .title())" in text, text

    # a job that fails for good: its one restart attempt is used up
    doomed = _write(tmp_path / "doomed.py", DOOMED)
    proc = cli.run("run", "--address", address, "--no-progress", doomed)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "doomed row 1" in proc.stderr
    job = _job_ids(cli, address)["doomed"]
    assert job["state"] == "FAILED"

    lines = _info(cli, address, job["id"])
    text = "\n".join(lines)
    assert lines[0] == f"job doomed ({job['id']}): FAILED", text
    assert "restart strategy: fixed-delay: all 1 attempts used, 2 failures" in lines, text
    assert "failure history (2):" in lines, text
    history = _history(lines)
    assert len(history) == 2, text
    assert all("ValueError: doomed row 1" in error for _, error, _ in history), text
    assert [restarted for _, _, restarted in history] == [1, None], text  # the last one: "no restart"
    assert lines[lines.index("failure history (2):") + 2].endswith("-> no restart"), text
    cause = next(line for line in lines if line.startswith("failure cause: "))
    assert "ValueError: doomed row 1" in cause, text
    assert "Traceback" in text and "in always" in text, text  # the cause's traceback follows
    [(_, attempt, _)] = [(int(m.group(1)), int(m.group(2)), m.group(3))
                         for m in map(SUBTASK.match, lines) if m]
    assert attempt == 1, text

    # an unknown job: a one-line error
    unknown = cli.run("info", "--address", address, "0" * 32)
    assert unknown.returncode == 1 and unknown.stderr.startswith("error: "), unknown.stderr

    stop = cli.run("session", "stop", "--address", address)
    assert stop.returncode == 0, stop.stderr
    session.wait(30)
    assert session.returncode == 0
