"""A checkpoint taken unaligned restores at another parallelism (issue 51; Flink redistributes
the in-flight data on rescale): a keyed STREAMING job over text files, its keyed map slow
enough that every exchange is back-pressured, takes unaligned checkpoints at parallelism 2 that
hold in-flight data; cancelled with them retained, it is started again from one of them at
parallelism 3 and at 1 (``yarnflow run -s <checkpoint> -p N``). The in-flight input of its keyed
inputs goes to the subtasks of its key groups, its in-flight output out again through the
partitioner, and every key's running totals are committed once each, ending at its count."""

from __future__ import annotations

import collections
import json
import re
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli
from tests.harness import write_keyed_lines, assert_upsert_counts, wait_until
from yarnflow.common.states import JobStatus
from tests.integration.test_adaptive_scheduler import extra_taskexecutors  # noqa: F401 - the fixture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FILES, ROWS, KEYS = 6, 3000, 23
UNALIGNED = ["-D", "execution.checkpointing.interval=200 ms", "-D", "execution.checkpointing.unaligned.enabled=true",
             "-D", "execution.batch-size=50"]

# argv: SRC OUT [SECONDS PER ROW]; the keyed map takes ~2 ms a row by default: ~3 s of the job at
# parallelism 2, the source far faster
JOB = textwrap.dedent("""\
    import sys, time
    import pyarrow as pa, pyarrow.compute as pc
    import yarnflow

    def parse(batch):
        parts = pc.split_pattern(batch.column("line"), " ")
        return pa.record_batch({"k": pc.list_element(parts, 0), "n": pa.array([1] * batch.num_rows, pa.int64())})

    per_row = float(sys.argv[3]) if len(sys.argv) > 3 else 0.002

    def slow(batch):
        time.sleep(per_row * batch.num_rows)
        return batch

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_runtime_mode("STREAMING")
    (env.read_text(sys.argv[1]).uid("source").map_batches(parse, name="parse").uid("parse")
        .key_by("k").map_batches(slow, name="slow").uid("slow")
        .key_by("k").sum("n").uid("sum").sink_to_parquet(sys.argv[2]).uid("sink"))
    env.execute("unaligned-rescaled")
""")


def _write(tmp_path: Path) -> collections.Counter:
    """The input files in ``tmp_path/in`` and ``job.py``; returns each key's count."""
    expected = write_keyed_lines(tmp_path / "in", FILES, ROWS, KEYS)
    (tmp_path / "job.py").write_text(JOB)
    return expected


def _inflight(metadata: Path) -> list[str]:
    """The in-flight data files a checkpoint holds."""
    try:
        doc = json.loads(metadata.read_text())
    except FileNotFoundError:  # (subsumed and discarded meanwhile)
        return []
    return [f["name"] for s in doc["subtasks"].values() for f in s["files"] if f["name"].startswith(("@in-", "@out-"))]


@pytest.mark.parametrize("parallelism", [3, 1])
def test_an_unaligned_checkpoint_restores_at_another_parallelism(cli: Cli, local_cluster: Any, tmp_path: Path,
                                                                 parallelism: int) -> None:
    cluster = local_cluster(taskexecutors=2, slots=2)
    address = cluster.address
    expected = _write(tmp_path)
    chk = tmp_path / "chk"
    cli.run("run", "-a", address, "--detached", "-p", "2", *UNALIGNED, "-D", f"execution.checkpointing.dir={chk}",
            "-D", "execution.checkpointing.externalized-checkpoint-retention=RETAIN_ON_CANCELLATION",
            "-D", "execution.checkpointing.num-retained=100", "job.py",
            str(tmp_path / "in"), str(tmp_path / "out"), check=True)
    listed = cli.run("list", "-a", address, "--json", check=True).stdout.splitlines()
    job = json.loads(listed[-1])["id"]

    def with_inflight() -> Path | None:
        done = sorted((chk / job).glob("chk-*/_metadata"), key=lambda p: int(p.parent.name[4:]))
        return next((m for m in reversed(done) if _inflight(m)), None)
    taken = wait_until(with_inflight, 60, "no checkpoint held in-flight data", interval_s=0.1)
    cli.run("cancel", "-a", address, job, check=True)
    wait_until(lambda: cli.job_status("-a", address, job) == "CANCELED", 30, "not cancelled")
    assert any(n.startswith("@in-") for n in _inflight(taken)), _inflight(taken)

    restored = cli.run("run", "-a", address, "--no-progress", "-s", str(taken.parent), "-p", str(parallelism),
                       *UNALIGNED, "job.py", str(tmp_path / "in"), str(tmp_path / "out"), timeout=150)
    assert restored.returncode == 0, restored.stderr
    assert "FINISHED" in restored.stderr
    assert_upsert_counts(tmp_path / "out", expected)
    # the restored tasks replayed the in-flight data the old subtasks held (dealt to them)
    logs = "".join(p.read_text(errors="replace") for p in Path(cluster.work_dir).rglob("te-*.log"))
    replayed = [int(n) for n in re.findall(r"rescaled: (\d+) inputs", logs)]
    assert replayed and sum(replayed) > 0, "no restored task replayed rescaled in-flight input"


def test_an_adaptive_job_whose_latest_checkpoint_is_unaligned_shrinks_when_it_loses_slots(
        cli: Cli, local_cluster: Any, extra_taskexecutors: Any, tmp_path: Path) -> None:  # noqa: F811
    """The adaptive scheduler (the reactive mode's) goes on at fewer slots from the latest
    checkpoint: an unaligned one with in-flight data, once refused at another parallelism, now
    too (before, the job restarted at its old parallelism and waited for slots)."""
    from contextlib import closing

    cluster = local_cluster(taskexecutors=1, slots=2, **{"slotmanager.number-of-slots.max": "2"})
    expected = _write(tmp_path)
    with closing(cluster.gateway()) as gw:
        extra = extra_taskexecutors(cluster.address, "te-extra-1")
        wait_until(lambda: gw.cluster_info().total_slots == 4, 60, "the extra TaskExecutor did not register")
        cli.run("run", "-a", cluster.address, "--detached", "-p", "4", *UNALIGNED, "-D", "jobmanager.scheduler=adaptive",
                "-D", "jobmanager.adaptive-scheduler.resource-stabilization-timeout=1 s", "job.py",
                str(tmp_path / "in"), str(tmp_path / "out"), "0.01", check=True)  # ~8 s at parallelism 4
        job = wait_until(lambda: (gw.list_jobs() or [None])[0], 30, "no job").job_id

        def unaligned_with_inflight() -> bool:
            info = gw.get_job(job)
            latest = next((c for c in reversed(info.checkpoints) if c.status == "COMPLETED"), None)
            return (info.status == JobStatus.RUNNING and {v.parallelism for v in info.vertices} == {4}
                    and latest is not None and latest.unaligned and latest.inflight_bytes > 0)
        wait_until(unaligned_with_inflight, 60, "no unaligned checkpoint with in-flight data at parallelism 4",
                   interval_s=0.05)
        extra.send_signal(signal.SIGKILL)
        extra.wait(10)
        wait_until(lambda: {v.parallelism for v in gw.get_job(job).vertices} == {2}
                   and gw.get_job(job).status == JobStatus.RUNNING, 60, "the job did not go on at parallelism 2",
                   interval_s=0.2)
        wait_until(lambda: cli.job_status("-a", cluster.address, job) == "FINISHED", 180, "the job did not finish")
    assert_upsert_counts(tmp_path / "out", expected)
