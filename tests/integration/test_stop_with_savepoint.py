"""Stop-with-savepoint through the CLI on a real local cluster (issue 12): `yarnflow stop
--savepoint-path DIR` stops a job whose sources are in the middle of their files, with windows
and event-time timers open: the job ends FINISHED, and `yarnflow run -s` of the savepoint (at
the same parallelism, or another) commits exactly what an unchanged run commits. With --drain
every window and timer fires before the savepoint: the output is complete for the rows read."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest

from tests.harness import wait_until
from tests.integration import test_rescaling
from tests.integration.test_rescaling import CHECKPOINTS, WINDOW_MS, _check, _held_splits, _start

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

setup = test_rescaling.setup  # the same job (windows, timers, a keyed sum) on the same files


def _rows(folder: Path) -> list[dict[str, Any]]:
    return pads.dataset(str(folder), format="parquet").to_table().to_pylist() if folder.exists() else []


@pytest.mark.parametrize("after", [2, 3])
def test_a_stopped_job_resumes_from_its_savepoint_as_if_never_stopped(setup: Any, after: int) -> None:
    cli, address, tmp_path, events = setup
    job = _start(cli, address, tmp_path, 2)
    stopped = cli.run("stop", "-a", address, "--savepoint-path", str(tmp_path / "savepoints"), job, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    [path] = stopped.stdout.split()
    assert path.startswith(f"file://{tmp_path}/savepoints/savepoint-{job[:6]}-")
    assert cli.job_status("-a", address, job) == "FINISHED"
    held = _held_splits(path)
    assert any(offset > 0 for _, offset in held), f"no source was mid-file: {held}"  # (a read split is not held)
    # not drained: the windows still open at the stop were not emitted (they are in the savepoint)
    windows = {(r["k"], r["window_start"]) for r in _rows(tmp_path / "out" / "windows")}
    expected = {(k, ts - ts % WINDOW_MS) for k, ts in events}
    assert windows < expected
    restored = cli.run("run", "-a", address, "--no-progress", "-s", path, *CHECKPOINTS, "job.py",
                       str(tmp_path / "in"), str(tmp_path / "out"), str(after), timeout=150)
    assert restored.returncode == 0, restored.stderr
    _check(tmp_path / "out", events)


def test_drain_fires_every_window_and_timer_before_the_savepoint(setup: Any) -> None:
    cli, address, tmp_path, events = setup
    job = _start(cli, address, tmp_path, 2)
    stopped = cli.run("stop", "-a", address, "-p", str(tmp_path / "savepoints"), "--drain", job, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert cli.job_status("-a", address, job) == "FINISHED"
    sums = collections.defaultdict(list)
    for r in _rows(tmp_path / "out" / "sum"):
        sums[r["k"]].append(r["n"])
    read = {k: max(v) for k, v in sums.items()}  # rows read per key before the stop
    assert 0 < sum(read.values()) < len(events)  # stopped mid-input
    for folder, column in (("windows", "window_start"), ("buckets", "bucket")):
        rows = _rows(tmp_path / "out" / folder)
        seen = collections.Counter((r["k"], r[column]) for r in rows)
        assert all(c == 1 for c in seen.values()), f"{folder}: a result committed twice"
        per_key: collections.Counter = collections.Counter()
        for r in rows:
            per_key[r["k"]] += r["n"]
        assert dict(per_key) == read, f"{folder}: every row read was in a fired window / timer"


def test_stop_errors_are_one_line(setup: Any) -> None:
    cli, address, tmp_path, _ = setup
    unknown = cli.run("stop", "-a", address, "-p", str(tmp_path / "sp"), "0" * 32)
    assert unknown.returncode == 1 and unknown.stderr.strip() == f"error: no job {'0' * 32} on this cluster"
    cli.run("run", "-a", address, "--detached", "-D", "execution.batch-size=40", "job.py", str(tmp_path / "in"),
            str(tmp_path / "o"), "2", check=True)  # no checkpoints
    listed = cli.run("list", "-a", address, "--json", check=True).stdout.splitlines()
    job = json.loads(listed[-1])["id"]
    refused = cli.run("stop", "-a", address, "-p", str(tmp_path / "sp"), job)
    assert refused.returncode == 1
    assert "takes no checkpoints" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    cli.run("cancel", "-a", address, job, check=True)


def test_a_stop_whose_savepoint_fails_leaves_the_job_running_and_exact(setup: Any) -> None:
    cli, address, tmp_path, events = setup
    job = _start(cli, address, tmp_path, 2)
    (tmp_path / "not-a-folder").write_text("x")  # the savepoint cannot be written under a file
    failed = cli.run("stop", "-a", address, "-p", str(tmp_path / "not-a-folder"), job, timeout=120)
    assert failed.returncode == 1
    [line] = failed.stderr.strip().splitlines()
    assert "writing the savepoint to" in line
    # the savepoint was aborted: the stopped tasks went on (this job has no restarts) and it
    # runs to its end, every row once
    wait_until(lambda: cli.job_status("-a", address, job) == "FINISHED", 120, "the job did not finish")
    _check(tmp_path / "out", events)
