"""Savepoints through the CLI on a real local cluster (issue 12, first part): `yarnflow
savepoint` mid-job, the job cancelled after more checkpoints committed more output, then
`yarnflow run -s` of the same job file (from the savepoint folder moved elsewhere) into the same
output folder: every key's running totals are committed once each and end at its count. A
pipeline whose operator uids changed is refused unless --allow-non-restored-state; a job without
checkpoints is refused in one line. (Rescaling: tests/integration/test_rescaling.py.)"""

from __future__ import annotations

import collections
import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest

from tests.conftest import Cli
from tests.harness import write_keyed_lines, assert_upsert_counts, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FILES, ROWS, KEYS = 6, 6000, 13
CHECKPOINTS = ["-D", "execution.checkpointing.interval=200 ms", "-D", "execution.batch-size=50"]

# argv: SRC OUT [SUM_UID] [PARALLELISM]; about 0.2 s per 50-row batch: ~12 s at parallelism 2
JOB = textwrap.dedent("""\
    import sys, time
    import pyarrow as pa, pyarrow.compute as pc
    import yarnflow

    def parse(batch):
        time.sleep(0.2)
        parts = pc.split_pattern(batch.column("line"), " ")
        return pa.record_batch({"k": pc.list_element(parts, 0), "n": pa.array([1] * batch.num_rows, pa.int64())})

    sum_uid = sys.argv[3] if len(sys.argv) > 3 else "sum"
    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(int(sys.argv[4]) if len(sys.argv) > 4 else 2)
    env.set_runtime_mode("STREAMING")
    (env.read_text(sys.argv[1]).uid("source").map_batches(parse, name="parse")
        .key_by("k").sum("n").uid(sum_uid).sink_to_parquet(sys.argv[2]).uid("sink"))
    env.execute("savepointed")
""")


@pytest.fixture
def setup(cli: Cli, local_cluster: Any, tmp_path: Path) -> tuple[Cli, str, Path, collections.Counter]:
    cluster = local_cluster(taskexecutors=2, slots=2)
    return cli, cluster.address, tmp_path, write_job(tmp_path)


def write_job(tmp_path: Path) -> collections.Counter:
    """The input files in ``tmp_path/in`` and ``job.py``; returns each key's count."""
    expected = write_keyed_lines(tmp_path / "in", FILES, ROWS, KEYS)
    (tmp_path / "job.py").write_text(JOB)
    return expected


def _job_id(cli: Cli, address: str) -> str:
    listed = cli.run("list", "-a", address, "--json", check=True).stdout.splitlines()
    return [json.loads(line)["id"] for line in listed][-1]


def _running_with_checkpoints(cli: Cli, address: str) -> str:
    def ready() -> str | None:
        job = _job_id(cli, address)
        info = cli.run("info", "-a", address, job, check=True).stdout
        return job if "RUNNING" in info and "COMPLETED" in info else None
    return wait_until(ready, 60, "the job never ran with a completed checkpoint", interval_s=0.2)


def _savepoint_midway(cli: Cli, address: str, tmp_path: Path, checkpoints: list[str] = CHECKPOINTS,
                      default_dir: bool = False) -> tuple[str, str]:
    """Start the job, take a savepoint once it checkpointed (into ``savepoints``: named on the
    command line, or the job's state.savepoints.dir with ``default_dir``)."""
    target = str(tmp_path / "savepoints")
    conf = ["-D", f"state.savepoints.dir={target}"] if default_dir else []
    started = cli.run("run", "-a", address, "--detached", *checkpoints, *conf, "job.py", str(tmp_path / "in"),
                      str(tmp_path / "out"), check=True)
    assert "submitted detached" in started.stderr
    job = _running_with_checkpoints(cli, address)
    taken = cli.run("savepoint", "-a", address, job, *([] if default_dir else [target]), check=True)
    [path] = taken.stdout.split()
    assert path.startswith(f"file://{tmp_path}/savepoints/savepoint-{job[:6]}-")
    return job, path


def test_a_job_restored_from_a_moved_savepoint_counts_every_row_once(setup: Any) -> None:
    cli, address, tmp_path, expected = setup
    job, path = _savepoint_midway(cli, address, tmp_path)
    wait_until(lambda: len(list((tmp_path / "out").glob("part-*"))) > 0, 30, "nothing was committed")
    cli.run("cancel", "-a", address, job, check=True)  # later checkpoints committed more output meanwhile
    wait_until(lambda: cli.job_status("-a", address, job) == "CANCELED", 30, "not cancelled")
    moved = tmp_path / "elsewhere" / "sp"
    shutil.move(path.removeprefix("file://"), moved)  # self-contained: relative paths only
    restored = cli.run("run", "-a", address, "--no-progress", "-s", str(moved), *CHECKPOINTS, "job.py",
                       str(tmp_path / "in"), str(tmp_path / "out"), timeout=120)
    assert restored.returncode == 0, restored.stderr
    assert "FINISHED" in restored.stderr
    assert_upsert_counts(tmp_path / "out", expected)


def test_a_sink_that_writes_elsewhere_now_commits_the_savepoints_rows_where_they_were(setup: Any) -> None:
    cli, address, tmp_path, expected = setup
    # 2 s between periodic checkpoints: the savepoint surely has rows pending in the sink
    slow = ["-D", "execution.checkpointing.interval=2 s", "-D", "execution.batch-size=50"]
    job, path = _savepoint_midway(cli, address, tmp_path, slow)
    cli.run("cancel", "-a", address, job, check=True)
    wait_until(lambda: cli.job_status("-a", address, job) == "CANCELED", 30, "not cancelled")
    restored = cli.run("run", "-a", address, "--no-progress", "-s", path, *CHECKPOINTS, "job.py",
                       str(tmp_path / "in"), str(tmp_path / "out2"), timeout=120)
    assert restored.returncode == 0, restored.stderr
    assert_upsert_counts(tmp_path / "out2", expected)  # the keyed totals went on from the savepoint
    pending = [pads.dataset(str(f), format="arrow").to_table()
               for f in Path(path.removeprefix("file://")).glob("sink/*/pending.arrow")]
    finals = [name for table in pending for name in table["final"].to_pylist()]
    assert finals and all((tmp_path / "out" / name).exists() for name in finals)  # committed where written


def test_state_nobody_claims_is_refused_unless_allowed(setup: Any) -> None:
    cli, address, tmp_path, _ = setup
    job, path = _savepoint_midway(cli, address, tmp_path, default_dir=True)
    cli.run("cancel", "-a", address, job, check=True)
    args = ["run", "-a", address, "--no-progress", "-s", path, *CHECKPOINTS, "job.py", str(tmp_path / "in"),
            str(tmp_path / "out")]
    refused = cli.run(*args, "totals")  # the keyed sum now has uid "totals": the state of "sum" has no home
    assert refused.returncode == 1
    [line] = refused.stderr.strip().splitlines()[-1:]
    assert "the savepoint has state for operators this job does not have (uids: sum)" in line
    assert "--allow-non-restored-state" in line
    allowed = cli.run(args[0], "--allow-non-restored-state", *args[1:], "totals", timeout=120)
    assert allowed.returncode == 0, allowed.stderr


def test_a_job_without_checkpoints_and_a_missing_savepoint_are_refused(setup: Any) -> None:
    cli, address, tmp_path, _ = setup
    job, path = _savepoint_midway(cli, address, tmp_path)
    cli.run("cancel", "-a", address, job, check=True)
    unchecked = cli.run("run", "-a", address, "-s", path, "job.py", str(tmp_path / "in"), str(tmp_path / "out4"))
    assert unchecked.returncode == 1
    assert "a job started from a savepoint must take checkpoints" in unchecked.stderr
    missing = cli.run("run", "-a", address, "-s", str(tmp_path / "nowhere"), *CHECKPOINTS, "job.py",
                      str(tmp_path / "in"), str(tmp_path / "out5"))
    assert missing.returncode == 1 and "no savepoint at" in missing.stderr


def test_savepoint_errors_are_one_line(setup: Any) -> None:
    cli, address, tmp_path, _ = setup
    unknown = cli.run("savepoint", "-a", address, "0" * 32, str(tmp_path / "sp"))
    assert unknown.returncode == 1 and unknown.stderr.strip() == f"error: no job {'0' * 32} on this cluster"
    cli.run("run", "-a", address, "--detached", "-D", "execution.batch-size=50", "job.py", str(tmp_path / "in"),
            str(tmp_path / "o"), check=True)  # STREAMING, no checkpoints, ~12 s
    job = wait_until(lambda: _job_id(cli, address), 30, "no job")
    no_checkpoints = cli.run("savepoint", "-a", address, job, str(tmp_path / "sp"))
    assert no_checkpoints.returncode == 1
    assert "takes no checkpoints: savepoints need a STREAMING job with execution.checkpointing.interval" \
        in no_checkpoints.stderr
    no_target = cli.run("savepoint", "-a", address, job)
    assert no_target.returncode == 1
    assert "no savepoint folder: give one (yarnflow savepoint JOB_ID DIR) or set state.savepoints.dir" \
        in no_target.stderr
    cli.run("cancel", "-a", address, job, check=True)
