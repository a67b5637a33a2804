"""Flink's partitioners on yarnflow's own API (issue 56: what PyFlink programs use): shuffle,
rescale, global_, forward and partition_custom, each checked by which subtask received which
row (every row once), in one job read from files on a cluster of 2 TaskExecutors x 2 slots."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest

from yarnflow.common.errors import JobDefinitionError, JobFailedError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FILES, LINES = 4, 500


class Tag:
    """A rich map function: each row gains the index of the subtask that mapped it."""

    def __init__(self, column: str) -> None:
        self.column = column
        self.index = -1

    def open(self, ctx: Any) -> None:
        self.index = ctx.subtask_index

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        return {**row, self.column: self.index}


def _rows(folder: Path) -> None:
    folder.mkdir()
    for f in range(FILES):
        (folder / f"part-{f}.txt").write_text("".join(f"{f * LINES + i}\n" for i in range(LINES)))


def _read(path: Path) -> list[dict[str, Any]]:
    return pads.dataset(str(path), format="parquet").to_table().to_pylist()


def _once(rows: list[dict[str, Any]]) -> None:
    assert sorted(r["i"] for r in rows) == list(range(FILES * LINES))


def test_each_partitioner_sends_each_row_where_flinks_would(run: Any, tmp_path: Path) -> None:
    _rows(tmp_path / "in")
    out = tmp_path / "out"

    def build(env: Any) -> None:
        env.set_runtime_mode("BATCH")
        rows = (env.read_text(str(tmp_path / "in")).set_parallelism(2)
                .map(lambda r: {"i": int(r["line"])}, name="parse").set_parallelism(2)
                .map(Tag("p"), name="producer").set_parallelism(2))
        rows.shuffle().map(Tag("c"), name="shuffled").set_parallelism(3).sink_to_parquet(str(out / "shuffle"))
        rows.rescale().map(Tag("c"), name="rescaled").set_parallelism(4).sink_to_parquet(str(out / "rescale"))
        rows.global_().map(Tag("c"), name="global").set_parallelism(3).sink_to_parquet(str(out / "global"))
        rows.forward().map(Tag("c"), name="forwarded").set_parallelism(2).sink_to_parquet(str(out / "forward"))
        rows.partition_custom(lambda key, n: key % n, lambda row: row["i"]).map(
            Tag("c"), name="custom").set_parallelism(3).sink_to_parquet(str(out / "custom"))

    run(build, "partitioners", conf={"execution.batch-size": "50"})
    shuffled = _read(out / "shuffle")
    _once(shuffled)
    per_subtask = collections.Counter(r["c"] for r in shuffled)
    assert set(per_subtask) == {0, 1, 2} and min(per_subtask.values()) > 300, per_subtask  # (random, per row)
    rescaled = _read(out / "rescale")
    _once(rescaled)
    share = {0: {0, 1}, 1: {2, 3}}  # each producer deals only to its half of the consumers
    assert all(r["c"] in share[r["p"]] for r in rescaled)
    sent = collections.Counter(r["p"] for r in rescaled)
    for producer, n in sent.items():  # (batches of 50 rows: one that sent several reached both of its half)
        if n >= 150:
            assert {r["c"] for r in rescaled if r["p"] == producer} == share[producer], producer
    globalled = _read(out / "global")
    _once(globalled)
    assert {r["c"] for r in globalled} == {0}
    forwarded = _read(out / "forward")
    _once(forwarded)
    assert all(r["c"] == r["p"] for r in forwarded)
    custom = _read(out / "custom")
    _once(custom)
    assert all(r["c"] == r["i"] % 3 for r in custom)


def test_forward_between_different_parallelisms_is_refused(run: Any, tmp_path: Path) -> None:
    def build(env: Any) -> None:
        env.from_collection([{"i": 1}]).set_parallelism(1).forward().map(lambda r: r, name="wide") \
            .set_parallelism(2).collect()

    with pytest.raises(JobDefinitionError, match="forward\\(\\) from 'collection' \\(parallelism 1\\) to 'wide' "
                                                 "\\(parallelism 2\\)"):
        run(build, "bad-forward")


def test_a_custom_partitioner_answering_outside_the_range_fails_the_job_naming_it(run: Any) -> None:
    def build(env: Any) -> None:
        env.set_runtime_mode("BATCH")
        env.from_collection([{"i": i} for i in range(10)]).partition_custom(lambda key, n: n, lambda row: row["i"]) \
            .map(lambda r: r, name="after").collect()

    with pytest.raises(JobFailedError, match="partitioner answered 2 for 2 partitions: it must be an int in 0..1"):
        run(build, "bad-partitioner", conf={"restart-strategy.type": "none"})
