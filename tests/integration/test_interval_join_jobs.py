"""The interval join on a real local cluster (issue 33): two file-source streams with
out-of-order rows, keyed and joined on event-time intervals, checked against a join computed in
Python: exact after a SIGKILLed TaskExecutor, and after a savepoint restored at another
parallelism (2 -> 3) through the CLI, into the same output folder."""

from __future__ import annotations

import collections
import random
import textwrap
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest

from tests.conftest import Cli
from tests.harness import savepoint_after_a_checkpoint, wait_until
from tests.integration.test_streaming_exactly_once import CHECKPOINTS, run_killing_one_taskexecutor

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FILES, PER_FILE, KEYS, LOWER, UPPER, JITTER = 8, 300, 7, -5, 8, 40

# argv: A B OUT PARALLELISM
JOB = textwrap.dedent(f"""\
    import sys, time
    import pyarrow as pa, pyarrow.compute as pc
    import yarnflow
    from yarnflow.windows import WatermarkStrategy

    def parse(batch):
        time.sleep(0.15)
        parts = pc.split_pattern(batch.column("line"), " ")
        return pa.record_batch({{"k": pc.list_element(parts, 0),
                                "ts": pc.cast(pc.list_element(parts, 1), pa.int64()),
                                "id": pc.list_element(parts, 2)}})

    def build(env, a, b, out):
        strategy = WatermarkStrategy.for_bounded_out_of_orderness({JITTER}).with_timestamp_column("ts")
        left = env.read_text(a).uid("a").map_batches(parse).uid("parse-a").assign_timestamps_and_watermarks(
            strategy).uid("wm-a")
        right = env.read_text(b).uid("b").map_batches(parse).uid("parse-b").assign_timestamps_and_watermarks(
            strategy).uid("wm-b")
        (left.key_by("k").interval_join(right.key_by("k")).between({LOWER}, {UPPER})
            .process(lambda l, r: {{"a": l["id"], "b": r["id"], "k": l["k"]}}).uid("join")
            .sink_to_parquet(out).uid("sink"))

    if __name__ == "__main__":
        env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
        env.set_parallelism(int(sys.argv[4]))
        env.set_runtime_mode("STREAMING")
        build(env, sys.argv[1], sys.argv[2], sys.argv[3])
        env.execute("interval join")
""")


def write_inputs(root: Path) -> list[tuple[str, str]]:
    """Files of both streams (file f: event times around [1000 f, 1000 f + 900), each row up to
    JITTER ms out of order); ``job.py``; the pairs the join must give."""
    rng = random.Random(11)
    sides: dict[str, list[tuple[str, int, str]]] = {}
    for side in ("a", "b"):
        (root / side).mkdir(parents=True)
        rows = []
        for f in range(FILES):
            lines = []
            for r in range(PER_FILE):
                key, ts, rid = f"k{rng.randrange(KEYS)}", f * 1000 + r * 3 + rng.randrange(JITTER), f"{side}{f}-{r}"
                rows.append((key, ts, rid))
                lines.append(f"{key} {ts} {rid}\n")
            (root / side / f"{side}-{f:02d}.txt").write_text("".join(lines))
        sides[side] = rows
    (root / "job.py").write_text(JOB)
    by_key: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    for key, ts, rid in sides["b"]:
        by_key[key].append((ts, rid))
    return sorted((aid, bid) for key, ts, aid in sides["a"] for tb, bid in by_key[key] if ts + LOWER <= tb <= ts + UPPER)


def joined(out: Path) -> list[tuple[str, str]]:
    table = pads.dataset(str(out), format="parquet").to_table()
    return sorted(zip(table["a"].to_pylist(), table["b"].to_pylist()))


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_an_interval_join_is_exact_across_a_killed_taskexecutor(local_cluster: Any, tmp_path: Path,
                                                                backend: str) -> None:
    import importlib.util
    import sys

    expected = write_inputs(tmp_path)
    spec = importlib.util.spec_from_file_location("interval_job", tmp_path / "job.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["interval_job"] = module
    spec.loader.exec_module(module)
    out = tmp_path / "out"
    cluster = local_cluster(taskexecutors=2, slots=2)

    def build(env: Any) -> None:
        env.set_runtime_mode("STREAMING")
        module.build(env, str(tmp_path / "a"), str(tmp_path / "b"), str(out))

    try:
        run_killing_one_taskexecutor(cluster, build, f"interval-{backend}",
                                     {**CHECKPOINTS, "execution.batch-size": "50", "state.backend.type": backend,
                                      "state.backend.rocksdb.localdir": str(tmp_path / "local")},
                                     random.Random(3), (0.3, 1.0))
    finally:
        sys.modules.pop("interval_job", None)
    assert len(expected) > 500
    assert joined(out) == expected


def test_an_interval_join_restored_at_another_parallelism_is_exact(cli: Cli, local_cluster: Any, tmp_path: Path) -> None:
    expected = write_inputs(tmp_path)
    address = local_cluster(taskexecutors=2, slots=6).address
    args = [str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "out")]
    checkpoints = ["-D", "execution.checkpointing.interval=300 ms", "-D", "execution.batch-size=50"]
    cli.run("run", "-a", address, "--detached", *checkpoints, "job.py", *args, "2", check=True)

    job, path = savepoint_after_a_checkpoint(cli, address, str(tmp_path / "savepoints"))
    held = [(Path(s).name, o) for side in ("a", "b")
            for f in Path(path.removeprefix("file://")).glob(f"{side}/*/splits.arrow")
            for t in [pads.dataset(str(f), format="arrow").to_table()]
            for s, o in zip(t["split_id"].to_pylist(), t["offset"].to_pylist())]
    assert held, "the savepoint holds no source position"
    wait_until(lambda: list((tmp_path / "out").glob("part-*")), 30, "nothing was committed")
    cli.run("cancel", "-a", address, job, check=True)  # later checkpoints committed more output meanwhile
    wait_until(lambda: cli.job_status("-a", address, job) == "CANCELED", 30, "not cancelled")
    restored = cli.run("run", "-a", address, "--no-progress", "-s", path, *checkpoints, "job.py", *args, "3",
                       timeout=150)
    assert restored.returncode == 0, restored.stderr
    assert joined(tmp_path / "out") == expected
