"""Per-split watermarks of file sources (issue 33, FLIP-27's behaviour), on a real local
cluster through the CLI: two files of the same event-time range are read by two subtasks; a
savepoint taken while both are mid-file is restored at parallelism 1, so one subtask holds both
splits and reads one after the other. Its watermark is the minimum of the two splits' (the
second's restored from the savepoint), so none of the second file's rows is late and every
event-time window counts exactly what a plain Python count says. (With a watermark strategy
applied after the source instead, the first file's rows would carry the watermark past the
second's, whose rows would then be dropped as late.)"""

from __future__ import annotations

import collections
import textwrap
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest

from tests.conftest import Cli
from tests.harness import savepoint_after_a_checkpoint, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ROWS, KEYS, WINDOW = 2400, 5, 500

# argv: SRC OUT PARALLELISM
JOB = textwrap.dedent(f"""\
    import sys, time
    import yarnflow
    from yarnflow.windows import TumblingEventTimeWindows, WatermarkStrategy

    def slow(batch):
        time.sleep(0.06)
        return batch

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(int(sys.argv[3]))
    env.set_runtime_mode("STREAMING")
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(20).with_timestamp_column("ts")
    (env.read_csv(sys.argv[1], watermark_strategy=strategy).uid("source").map_batches(slow).uid("slow")
        .key_by("k").window(TumblingEventTimeWindows.of({WINDOW})).count().uid("windows")
        .sink_to_parquet(sys.argv[2]).uid("sink"))
    env.execute("split watermarks")
""")


def test_a_subtask_holding_two_restored_splits_drops_none_of_their_rows(cli: Cli, local_cluster: Any,
                                                                        tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    events = []
    for sensor, extra in (("a", 0), ("b", 23)):  # about the same time range: ts = row (b a little longer,
        # so that the two sources never switch to the next batch in step: one is always mid-file)
        rows = [(f"k{(r * 3 + len(sensor)) % KEYS}", r) for r in range(ROWS + extra)]
        events += rows
        (src / f"{sensor}.csv").write_text("k,ts\n" + "".join(f"{k},{ts}\n" for k, ts in rows))
    (tmp_path / "job.py").write_text(JOB)
    address = local_cluster(taskexecutors=2, slots=2).address
    conf = ["-D", "execution.checkpointing.interval=300 ms", "-D", "execution.batch-size=40"]
    out = tmp_path / "out"
    cli.run("run", "-a", address, "--detached", *conf, "job.py", str(src), str(out), "2", check=True)

    job, path = savepoint_after_a_checkpoint(cli, address, str(tmp_path / "savepoints"))
    held = [(Path(s).name, o, w) for f in Path(path.removeprefix("file://")).glob("source/*/splits.arrow")
            for t in [pads.dataset(str(f), format="arrow").to_table()]
            for s, o, w in zip(t["split_id"].to_pylist(), t["offset"].to_pylist(), t["watermark"].to_pylist())]
    assert sorted(name for name, _, _ in held) == ["a.csv", "b.csv"], held  # both mid-file
    assert all(offset > 0 and watermark > 0 for _, offset, watermark in held), held
    cli.run("cancel", "-a", address, job, check=True)
    wait_until(lambda: cli.job_status("-a", address, job) == "CANCELED", 30, "not cancelled")

    restored = cli.run("run", "-a", address, "--no-progress", "-s", path, *conf, "job.py", str(src), str(out), "1",
                       timeout=150)
    assert restored.returncode == 0, restored.stderr
    table = pads.dataset(str(out), format="parquet").to_table()
    got = collections.Counter()
    for k, start, n in zip(table["k"].to_pylist(), table["window_start"].to_pylist(), table["count"].to_pylist()):
        assert (k, start) not in got, f"window {(k, start)} committed twice"
        got[(k, start)] = n
    assert got == collections.Counter((k, ts - ts % WINDOW) for k, ts in events)
