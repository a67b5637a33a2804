"""Rescaling through a savepoint, on a real local cluster through the CLI (issue 12): a job with
a keyed aggregation, event-time windows and a keyed process function with event-time timers,
reading text files, is savepointed while its sources are in the middle of their files, cancelled
after more output was committed, and run again from the savepoint at another parallelism
(2 -> 3 and 3 -> 1; and 2 -> 3 with keyed state in RocksDB on both sides) into the same output
folders. The committed output must be what an
unchanged run commits: each key's running totals once each ending at its count, and each
(key, window) and (key, bucket) result once with its exact count."""

from __future__ import annotations

import collections
import json
import textwrap
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest

from tests.conftest import Cli
from tests.harness import assert_upsert_counts, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FILES, PER_FILE, KEYS, WINDOW_MS = 8, 600, 11, 500
CHECKPOINTS = ["-D", "execution.checkpointing.interval=300 ms", "-D", "execution.batch-size=40"]

# argv: SRC OUT PARALLELISM; ~0.1 s per 40-row batch: about 6 s at parallelism 2
JOB = textwrap.dedent("""\
    import sys, time
    import pyarrow as pa, pyarrow.compute as pc
    import yarnflow
    from yarnflow import MapStateDescriptor
    from yarnflow.windows import KeyedProcessFunction, TumblingEventTimeWindows, WatermarkStrategy

    def parse(batch):
        time.sleep(0.1)
        parts = pc.split_pattern(batch.column("line"), " ")
        return pa.record_batch({"k": pc.list_element(parts, 0),
                                "ts": pc.cast(pc.list_element(parts, 1), pa.int64()),
                                "n": pa.array([1] * batch.num_rows, pa.int64())})

    class Buckets(KeyedProcessFunction):
        # per key and 500 ms bucket: a count in MapState, emitted by an event-time timer
        def open(self, ctx):
            self.buckets = self.get_state(MapStateDescriptor("buckets"))

        def process_element(self, row, ctx, out):
            b = row["ts"] - row["ts"] % 500
            self.buckets.put(b, self.buckets.get(b, 0) + 1)
            ctx.timer_service().register_event_time_timer(b + 499)

        def on_timer(self, ts, ctx, out):
            b = ts - 499
            out.collect({"k": ctx.current_key, "bucket": b, "n": self.buckets.get(b)})
            self.buckets.remove(b)

    src, out = sys.argv[1], sys.argv[2]
    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(int(sys.argv[3]))
    env.set_runtime_mode("STREAMING")
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(2000).with_timestamp_column("ts")
    events = (env.read_text(src).uid("source").map_batches(parse, name="parse").uid("parse")
              .assign_timestamps_and_watermarks(strategy).uid("watermarks"))
    (events.map_batches(lambda b: b.select(["k", "n"]), name="kn").uid("kn")
        .key_by("k").sum("n").uid("sum").sink_to_parquet(out + "/sum").uid("sum-sink"))
    (events.key_by("k").window(TumblingEventTimeWindows.of(500)).sum("n").uid("windows")
        .sink_to_parquet(out + "/windows").uid("window-sink"))
    events.key_by("k").process(Buckets()).uid("buckets").sink_to_parquet(out + "/buckets").uid("bucket-sink")
    env.execute("rescaled")
""")


@pytest.fixture
def setup(cli: Cli, local_cluster: Any, tmp_path: Path) -> tuple[Cli, str, Path, list[tuple[str, int]]]:
    cluster = local_cluster(taskexecutors=2, slots=6)
    return cli, cluster.address, tmp_path, write_input(tmp_path, FILES, PER_FILE)


def write_input(tmp_path: Path, files: int, per_file: int) -> list[tuple[str, int]]:
    """``job.py`` and its input folder ``in``: file f holds event times [1000 f, 1000 f + n_f),
    names in event-time order (a source takes its splits by name); the events. The files differ
    in length (n_f = per_file + 7 (f % 8)), so that sources reading them side by side do not
    switch files at the same moment (a stop or savepoint then always finds one mid-file)."""
    src = tmp_path / "in"
    src.mkdir()
    events = []
    for f in range(files):
        lines = []
        for r in range(per_file + 7 * (f % 8)):
            key, ts = f"k{(f * 5 + r) % KEYS}", f * 1000 + r
            events.append((key, ts))
            lines.append(f"{key} {ts}\n")
        (src / f"in-{f:03d}.txt").write_text("".join(lines))
    (tmp_path / "job.py").write_text(JOB)
    return events


def _start(cli: Cli, address: str, tmp_path: Path, parallelism: int, *flags: str) -> str:
    """Run the job detached; its id once it runs with a completed checkpoint."""
    cli.run("run", "-a", address, "--detached", *CHECKPOINTS, *flags, "job.py", str(tmp_path / "in"),
            str(tmp_path / "out"), str(parallelism), check=True)

    def running_with_checkpoint() -> str | None:
        listed = cli.run("list", "-a", address, "--json", check=True).stdout.splitlines()
        job = json.loads(listed[-1])["id"] if listed else None
        info = cli.run("info", "-a", address, job, check=True).stdout if job else ""
        return job if "RUNNING" in info and "COMPLETED" in info else None
    return str(wait_until(running_with_checkpoint, 60, "the job never ran with a completed checkpoint",
                          interval_s=0.2))


def _savepoint_mid_file(cli: Cli, address: str, tmp_path: Path, parallelism: int, *flags: str) -> tuple[str, str]:
    job = _start(cli, address, tmp_path, parallelism, *flags)
    [path] = cli.run("savepoint", "-a", address, job, str(tmp_path / "savepoints"), check=True).stdout.split()
    return job, path


def _held_splits(path: str) -> list[tuple[str, int]]:
    """(file, offset) of the splits the savepoint's source subtasks were reading."""
    tables = [pads.dataset(str(f), format="arrow").to_table()
              for f in Path(path.removeprefix("file://")).glob("source/*/splits.arrow")]
    return [(Path(s).name, o) for t in tables for s, o in zip(t["split_id"].to_pylist(), t["offset"].to_pylist())]


def _check(out: Path, events: list[tuple[str, int]]) -> None:
    assert_upsert_counts(out / "sum", collections.Counter(k for k, _ in events))
    for folder, column in (("windows", "window_start"), ("buckets", "bucket")):
        table = pads.dataset(str(out / folder), format="parquet").to_table()
        results = list(zip(table["k"].to_pylist(), table[column].to_pylist(), table["n"].to_pylist()))
        seen = collections.Counter((k, start) for k, start, _ in results)
        twice = [w for w, c in seen.items() if c > 1]
        assert not twice, f"{folder}: {len(twice)} results committed more than once, e.g. {twice[:3]}"
        expected = collections.Counter((k, ts - ts % WINDOW_MS) for k, ts in events)
        assert {(k, start): n for k, start, n in results} == dict(expected), folder


ROCKSDB = ["-D", "state.backend.type=rocksdb", "-D", "execution.checkpointing.incremental=true"]


@pytest.mark.parametrize(("before", "after", "flags"), [(2, 3, []), (3, 1, []), (2, 3, ROCKSDB)],
                         ids=["2to3", "3to1", "2to3-rocksdb"])
def test_a_job_restored_at_another_parallelism_commits_what_an_unchanged_run_does(setup: Any, before: int,
                                                                                   after: int, flags: list[str]) -> None:
    cli, address, tmp_path, events = setup
    job, path = _savepoint_mid_file(cli, address, tmp_path, before, *flags)
    held = _held_splits(path)
    assert any(offset > 0 for _, offset in held), f"no source was mid-file: {held}"  # (a read split is not held)
    wait_until(lambda: list((tmp_path / "out" / "sum").glob("part-*")), 30, "nothing was committed")
    cli.run("cancel", "-a", address, job, check=True)  # later checkpoints committed more output meanwhile
    wait_until(lambda: cli.job_status("-a", address, job) == "CANCELED", 30, "not cancelled")
    restored = cli.run("run", "-a", address, "--no-progress", "-s", path, *CHECKPOINTS, *flags, "job.py",
                       str(tmp_path / "in"), str(tmp_path / "out"), str(after), timeout=150)
    assert restored.returncode == 0, restored.stderr
    assert "FINISHED" in restored.stderr
    _check(tmp_path / "out", events)


def test_a_collection_source_cannot_be_rescaled_and_says_why(cli: Cli, local_cluster: Any, tmp_path: Path) -> None:
    cluster = local_cluster(taskexecutors=1, slots=4)
    (tmp_path / "gen.py").write_text(textwrap.dedent("""\
        import sys, time
        import yarnflow
        env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
        env.set_parallelism(int(sys.argv[2]))
        env.set_runtime_mode("STREAMING")
        slow = lambda b: (time.sleep(0.1), b)[1]
        (env.from_collection([{"k": i % 5, "n": 1} for i in range(4000)]).uid("numbers")
            .map_batches(slow).uid("slow").key_by("k").sum("n").uid("sum").sink_to_parquet(sys.argv[1]).uid("out"))
        env.execute("collection")
    """))
    cli.run("run", "-a", cluster.address, "--detached", *CHECKPOINTS, "gen.py", str(tmp_path / "o"), "2", check=True)
    job = wait_until(lambda: "COMPLETED" in cli.run("info", "-a", cluster.address, _last(cli, cluster.address)).stdout
                     and _last(cli, cluster.address), 60, "no checkpoint", interval_s=0.2)
    [path] = cli.run("savepoint", "-a", cluster.address, job, str(tmp_path / "sp"), check=True).stdout.split()
    cli.run("cancel", "-a", cluster.address, job, check=True)
    refused = cli.run("run", "-a", cluster.address, "-s", path, *CHECKPOINTS, "gen.py", str(tmp_path / "o"), "3")
    assert refused.returncode == 1
    [line] = refused.stderr.strip().splitlines()[-1:]
    assert "operator 'numbers'" in line and "ran with parallelism 2 in the savepoint and has 3 now" in line
    assert "keep the parallelism at 2" in line


def _last(cli: Cli, address: str) -> str:
    listed = cli.run("list", "-a", address, "--json", check=True).stdout.splitlines()
    return str(json.loads(listed[-1])["id"]) if listed else ""


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 1)], ids=["2to3", "3to1"])
def test_a_running_job_rescaled_by_hand_commits_what_an_unchanged_run_does(setup: Any, before: int,
                                                                           after: int) -> None:
    """``yarnflow rescale JOB -p N`` (issue 30): the job, mid-way through its files with output
    committed, goes through a checkpoint taken then and runs on under the same id at the new parallelism
    (every vertex was at the job's), ending FINISHED with exactly what an unchanged run commits."""
    cli, address, tmp_path, events = setup
    job = _start(cli, address, tmp_path, before)
    wait_until(lambda: list((tmp_path / "out" / "sum").glob("part-*")), 30, "nothing was committed")
    rescaled = cli.run("rescale", "-a", address, job, "-p", str(after), timeout=120)
    assert rescaled.returncode == 0, rescaled.stderr
    assert rescaled.stdout.strip() == f"job {job} runs at parallelism {after}"
    info = cli.run("info", "-a", address, job, check=True).stdout
    assert f"(parallelism {after})" in info and f"(parallelism {before})" not in info, info
    wait_until(lambda: cli.job_status("-a", address, job) == "FINISHED", 120, "the rescaled job did not finish")
    assert len(cli.run("list", "-a", address, "--json", check=True).stdout.splitlines()) == 1  # one job, same id
    _check(tmp_path / "out", events)


def test_a_job_whose_state_cannot_be_rescaled_runs_on_at_its_parallelism(cli: Cli, local_cluster: Any,
                                                                         tmp_path: Path) -> None:
    """A parallelism above the keyed operators' max parallelism is refused before anything
    stops; a collection source's per-subtask position cannot be dealt to another parallelism:
    the rescale is refused saying why, and the job runs on from where it stopped, exactly."""
    cluster = local_cluster(taskexecutors=1, slots=4)
    (tmp_path / "gen.py").write_text(textwrap.dedent("""\
        import sys, time
        import yarnflow
        env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
        env.set_parallelism(2)
        env.set_runtime_mode("STREAMING")
        slow = lambda b: (time.sleep(0.1), b)[1]
        (env.from_collection([{"k": i % 5, "n": 1} for i in range(4000)]).uid("numbers")
            .map_batches(slow).uid("slow").key_by("k").sum("n").uid("sum").sink_to_parquet(sys.argv[1]).uid("out"))
        env.execute("collection")
    """))
    cli.run("run", "-a", cluster.address, "--detached", *CHECKPOINTS, "gen.py", str(tmp_path / "o"), check=True)
    job = wait_until(lambda: "COMPLETED" in cli.run("info", "-a", cluster.address, _last(cli, cluster.address)).stdout
                     and _last(cli, cluster.address), 60, "no checkpoint", interval_s=0.2)
    too_many = cli.run("rescale", "-a", cluster.address, job, "-p", "200")
    assert too_many.returncode == 1 and "max parallelism 128" in too_many.stderr
    refused = cli.run("rescale", "-a", cluster.address, job, "-p", "3", timeout=120)
    assert refused.returncode == 1
    assert "operator 'numbers'" in refused.stderr and "the job runs on at its parallelism" in refused.stderr
    wait_until(lambda: cli.job_status("-a", cluster.address, job) == "FINISHED", 120, "the job did not finish")
    counts = {k: 800 for k in range(5)}
    table = pads.dataset(str(tmp_path / "o"), format="parquet").to_table()
    per_key: dict[int, list[int]] = {}
    for k, n in zip(table["k"].to_pylist(), table["n"].to_pylist()):
        per_key.setdefault(k, []).append(n)
    assert {k: max(v) for k, v in per_key.items()} == counts
    assert all(len(v) == len(set(v)) for v in per_key.values())  # each running total committed once
