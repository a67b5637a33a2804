"""A source of the user's own (``SourceFunction`` + ``CheckpointedFunction``) on a real local
cluster through the CLI (issue 33): it reads numbered "partitions", each subtask those whose
number modulo the parallelism is its index, and keeps every partition's next offset in
union-list state. Savepointed mid-way at parallelism 2 and restored at 3, every subtask gets
every partition's offset and resumes its own partitions there: every (partition, offset) is
committed exactly once."""

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

PARTITIONS, PER_PARTITION = 6, 400

# argv: OUT PARALLELISM
JOB = textwrap.dedent(f"""\
    import sys
    import yarnflow
    from yarnflow import CheckpointedFunction, ListStateDescriptor, SourceFunction

    OFFSETS = ListStateDescriptor("offsets")

    class Partitions(SourceFunction, CheckpointedFunction):
        def initialize_state(self, ctx):
            self.state = ctx.get_operator_state_store().get_union_list_state(OFFSETS)
            # every subtask's (partition, offset) pairs: keep those of the partitions now mine
            self.restored = dict(self.state.get())

        def open(self, ctx):
            mine = [p for p in range({PARTITIONS}) if p % ctx.parallelism == ctx.subtask_index]
            self.offsets = {{p: self.restored.get(p, 0) for p in mine}}

        def snapshot_state(self, ctx):
            self.state.update(sorted(self.offsets.items()))

        def run(self, ctx):
            while not ctx.is_cancelled():
                live = [p for p, o in self.offsets.items() if o < {PER_PARTITION}]
                if not live:
                    return
                for p in live:
                    ctx.collect({{"partition": p, "offset": self.offsets[p]}})
                    self.offsets[p] += 1
                ctx.sleep(0.015)

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(int(sys.argv[2]))
    env.set_runtime_mode("STREAMING")
    env.add_source(Partitions(), name="partitions").uid("partitions").sink_to_parquet(sys.argv[1]).uid("sink")
    env.execute("user source")
""")


def test_a_user_source_with_union_list_state_resumes_every_partition_after_a_rescale(
        cli: Cli, local_cluster: Any, tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    address = local_cluster(taskexecutors=2, slots=3).address
    out = tmp_path / "out"
    conf = ["-D", "execution.checkpointing.interval=200 ms"]
    cli.run("run", "-a", address, "--detached", *conf, "job.py", str(out), "2", check=True)

    job, path = savepoint_after_a_checkpoint(cli, address, str(tmp_path / "savepoints"))
    offsets = [tuple(v) for f in Path(path.removeprefix("file://")).glob("partitions/*/operator.union.offsets.arrow")
               for v in _pairs(f)]
    assert len(offsets) == PARTITIONS and all(0 < o < PER_PARTITION for _, o in offsets), offsets  # mid-way
    cli.run("cancel", "-a", address, job, check=True)
    wait_until(lambda: cli.job_status("-a", address, job) == "CANCELED", 30, "not cancelled")

    restored = cli.run("run", "-a", address, "--no-progress", "-s", path, *conf, "job.py", str(out), "3", timeout=150)
    assert restored.returncode == 0, restored.stderr
    table = pads.dataset(str(out), format="parquet").to_table()
    got = collections.Counter(zip(table["partition"].to_pylist(), table["offset"].to_pylist()))
    assert got == collections.Counter((p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION))


def _pairs(path: Path) -> list[Any]:
    from yarnflow.common.state_format import loads

    return [loads(v) for v in pads.dataset(str(path), format="arrow").to_table()["value"].to_pylist()]
