"""Memory on YARN (issue 28), against the YARN sandbox, which kills a container whose processes
use more physical memory than it asked for, as YARN's NodeManager does: a RocksDB job with
20,000,000 keys stays inside 1 GB containers (its RocksDB memory bounded by the slots' managed
memory) with every key committed exactly once; a job whose user function allocates without
bound is stopped by the TaskExecutors' memory watchdog and fails with a cause that names the
memory limit, instead of restarting forever."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from tests.conftest import Cli
from tests.integration.test_yarn_jobs import app_id_of, containers_started, dconf, wait_final
from yarnflow.sandbox import Sandbox

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420),
              pytest.mark.filterwarnings("ignore:distutils Version classes are deprecated:DeprecationWarning")]

KEYS, FILES = 20_000_000, 8
MEMORY_CONF = {
    "taskmanager.memory.process.size": "1 gb",
    "jobmanager.memory.process.size": "512 mb",
    "taskmanager.numberOfTaskSlots": "1",
    "heartbeat.interval": "500 ms",
    "heartbeat.timeout": "5 s",
    "state.backend.type": "rocksdb",
    "execution.checkpointing.interval": "5 s",
    "restart-strategy.exponential-delay.initial-backoff": "200 ms",
}

ROCKSDB_JOB = textwrap.dedent("""\
    import sys

    import yarnflow

    src, out = sys.argv[1:3]
    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(2)
    env.set_runtime_mode("STREAMING")
    env.read_parquet(src).key_by("k").sum("n").uid("sum").sink_to_parquet(out)
    env.execute("rocksdb-20m")
""")

# every batch it reads, hoard() keeps 8 MB more for good: no container size is enough
HOG_JOB = textwrap.dedent("""\
    import sys
    import time

    import yarnflow

    kept = []

    def hoard(batch):
        kept.append(b"x" * (8 << 20))
        time.sleep(0.1)
        return batch

    src, out = sys.argv[1:3]
    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(1)
    env.set_runtime_mode("STREAMING")
    rows = lambda start, n: {"k": [i % 10 for i in range(start, start + n)], "n": [1] * n}
    env.from_generator(rows, count=None).map_batches(hoard).key_by("k").sum("n").sink_to_parquet(out)
    env.execute("hog")
""")


def write_keys(folder: Path) -> None:
    """``KEYS`` distinct int64 keys in random order, each with n = 1, in ``FILES`` Parquet files."""
    folder.mkdir(parents=True)
    keys = np.random.default_rng(28).permutation(KEYS).astype(np.int64)
    for i, part in enumerate(np.array_split(keys, FILES)):
        pq.write_table(pa.table({"k": part, "n": np.ones(len(part), np.int64)}), folder / f"part-{i}.parquet",
                       row_group_size=1 << 20)


def test_a_rocksdb_job_with_twenty_million_keys_stays_inside_1_gb_containers_and_is_exact(
        cli: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    cli.env["SKEIN_CONFIG"] = sandbox.config_dir
    (tmp_path / "job.py").write_text(ROCKSDB_JOB)
    write_keys(tmp_path / "in")
    out = tmp_path / "out"
    proc = cli.run("run", "--target", "yarn-per-job", "--no-progress", *dconf(MEMORY_CONF), "job.py",
                   str(tmp_path / "in"), str(out), timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    app_id = app_id_of(proc.stderr)
    started = containers_started(sandbox, app_id)
    assert len(started) == 3, started  # the AppMaster and two TaskExecutors: none was killed and replaced
    table = pads.dataset(str(out), format="parquet").to_table(columns=["k", "n"])
    assert table.num_rows == KEYS  # each key's one update committed once
    assert pc.count_distinct(table["k"]).as_py() == KEYS
    assert (pc.min(table["k"]).as_py(), pc.max(table["k"]).as_py()) == (0, KEYS - 1)
    assert pc.all(pc.equal(table["n"], 1)).as_py()
    logs = "\n".join(p.read_text(errors="replace") for p in (Path(sandbox.work_dir) / "logs" / app_id).rglob("*")
                     if p.is_file())
    assert "physical memory" not in logs and "memory watchdog: failed" not in logs
    assert logs.count("fails its tasks at 973 MB") == 2  # each TaskExecutor's watchdog, enforcing in its container
    assert logs.count("the RocksDB state backends share RocksDBMemory(256 MB") == 2  # a slot's managed memory


def test_a_job_that_allocates_without_bound_fails_with_a_cause_naming_the_memory_limit(
        cli: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    cli.env["SKEIN_CONFIG"] = sandbox.config_dir
    (tmp_path / "job.py").write_text(HOG_JOB)
    # the hog takes ~5 s to reach the limit from a fresh attempt: with checkpoints every 1 s one
    # completed between its failures whenever the failed attempt's memory had been freed (that
    # restarts the count of memory failures in a row), and the job restarted for minutes (a suite
    # run timed out so); at 60 s none completes before the limit
    conf = {**MEMORY_CONF, "taskmanager.memory.process.size": "512 mb", "state.backend.type": "hashmap",
            "execution.checkpointing.interval": "60 s"}
    proc = cli.run("run", "--target", "yarn-per-job", "--no-progress", *dconf(conf), "job.py", str(tmp_path / "in"),
                   str(tmp_path / "out"), timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    final = wait_final(app_id_of(proc.stderr))
    assert (final.state, final.final_status) == ("FINISHED", "FAILED")
    cause = final.diagnostics
    assert "MemoryLimitError" in cause and "of its 512 MB (taskmanager.memory.process.size)" in cause, cause
    assert "memory failure 3 in a row" in cause and "restart-strategy.max-memory-failures" in cause, cause
    assert "Give the TaskExecutors more memory" in cause and "the rest (Python objects, libraries)" in cause, cause
