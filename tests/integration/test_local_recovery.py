"""Task-local recovery (issue 51, Flink's ``state.backend.local-recovery``) on a real local
cluster: a keyed STREAMING job over text files with its state in RocksDB, checkpointed; a task
downstream of the keyed sum fails once (its function raises), the pipelined region restarts in
the slots it had, and every restored task (the sum's among them) reads its state from its
TaskExecutor's copies: nothing from the
checkpoint storage (each task logs where it read its state from). With the copies corrupted
first, the tasks read the storage's instead. The committed output is exact either way."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli
from tests.harness import assert_upsert_counts, wait_until, write_keyed_lines

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FILES, ROWS, KEYS = 8, 40_000, 5_000
# no second checkpoint for 10 s after the first (the min pause): the restore reads the first, whose
# copies a test corrupts (a later one would have copies of its own), however slow the machine
CONF = ["-D", "execution.checkpointing.interval=2 s", "-D", "execution.checkpointing.min-pause=10 s",
        "-D", "execution.batch-size=200",
        "-D", "state.backend.type=rocksdb", "-D", "state.backend.local-recovery=true",
        "-D", "restart-strategy.type=fixed-delay", "-D", "restart-strategy.fixed-delay.delay=100 ms"]

# argv: SRC OUT MARKER: ~60 ms per 200-row batch (~6 s at parallelism 2); the check after the sum
# (a task of its own) fails once when MARKER exists (and removes it)
JOB = textwrap.dedent("""\
    import os, sys, time
    import pyarrow as pa, pyarrow.compute as pc
    import yarnflow

    src, out, marker = sys.argv[1:4]

    def parse(batch):
        time.sleep(0.06)
        parts = pc.split_pattern(batch.column("line"), " ")
        return pa.record_batch({"k": pc.list_element(parts, 0), "n": pa.array([1] * batch.num_rows, pa.int64())})

    def check(batch):
        if os.path.exists(marker):
            os.remove(marker)
            raise RuntimeError("a failure on purpose")
        return batch

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(2)
    env.set_runtime_mode("STREAMING")
    (env.read_text(src).uid("source").map_batches(parse, name="parse").uid("parse")
        .key_by("k").sum("n").uid("sum").rebalance().map_batches(check, name="check").uid("check")
        .sink_to_parquet(out).uid("sink"))
    env.execute("local-recovery")
""")


def _restores(work_dir: str) -> list[tuple[str, int, int]]:
    """(task, files read locally, files read from the storage) of every restore the TaskExecutors logged."""
    text = "".join(p.read_text(errors="replace") for p in Path(work_dir).rglob("te-*.log"))
    return [(m.group(1), int(m.group(2)), int(m.group(3))) for m in re.finditer(
        r"INFO task (.+?) \[job \w+\] \S+: .+? restored checkpoint \d+: (\d+) files \(\d+ bytes\) read locally, "
        r"(\d+) files \(\d+ bytes\) from the checkpoint storage", text)]


def _corrupt_copies(work_dir: str) -> int:
    """Replace every local copy by its bytes flipped (sizes kept): each fails its checksum. A new
    file each (a copy of an SST file is a hard link of the live RocksDB file, which must stay)."""
    copies = [p for p in Path(work_dir).rglob("yarnflow-local-state/*/*/files/*") if p.is_file()]
    for p in copies:
        flipped = p.with_name(p.name + ".flipped")
        flipped.write_bytes(bytes(b ^ 0xFF for b in p.read_bytes()))
        flipped.replace(p)
    return len(copies)


@pytest.mark.parametrize("corrupt", [False, True], ids=["local", "corrupt-copies"])
def test_tasks_restarted_in_place_read_their_state_locally(cli: Cli, local_cluster: Any, tmp_path: Path,
                                                           corrupt: bool) -> None:
    cluster = local_cluster(taskexecutors=2, slots=2)
    expected = write_keyed_lines(tmp_path / "in", FILES, ROWS, KEYS)
    (tmp_path / "job.py").write_text(JOB)
    marker = tmp_path / "fail-now"
    cli.run("run", "-a", cluster.address, "--detached", *CONF, "job.py", str(tmp_path / "in"), str(tmp_path / "out"),
            str(marker), check=True)
    job = cli.run("list", "-a", cluster.address, "--json", check=True).stdout.split('"id": "')[1][:32]
    wait_until(lambda: "COMPLETED" in cli.run("info", "-a", cluster.address, job).stdout, 60, "no checkpoint completed")
    if corrupt:
        assert _corrupt_copies(cluster.work_dir) > 0
    marker.write_text("now")  # the check fails at its next batch, before the next checkpoint
    wait_until(lambda: not marker.exists(), 30, "the check did not fail")
    wait_until(lambda: cli.job_status("-a", cluster.address, job) == "FINISHED", 180, "the job did not finish")
    assert_upsert_counts(tmp_path / "out", expected)

    restores = _restores(cluster.work_dir)
    sums = [r for r in restores if r[0].startswith("sum(n)")]
    assert sums, restores  # the keyed sum's subtasks were restored
    if corrupt:
        assert all(remote > 0 and local == 0 for _, local, remote in sums), restores
    else:  # every restored task read its state from its TaskExecutor's copies, nothing remote
        assert all(remote == 0 for _, _, remote in restores), restores
        assert all(local > 0 for _, local, _ in sums), restores
