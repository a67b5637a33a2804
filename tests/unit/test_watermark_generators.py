"""Custom watermark generators (Flink's WatermarkGenerator: punctuated, periodic, and the
vectorised ``on_batch`` form) and the per-split watermarks of file sources: a source holding
several splits emits the minimum of their watermarks, restored from its state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.harness import OperatorHarness
from yarnflow.common.api import WatermarkStrategy
from yarnflow.common.api.watermarks import WatermarkGenerator
from yarnflow.worker.operators.base import UserFunctionError
from yarnflow.worker.operators.sources import FileSource
from yarnflow.worker.operators.timestamps import TimestampsAndWatermarks

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Punctuated(WatermarkGenerator):
    """A watermark at each row flagged as a marker."""

    def on_event(self, row: dict[str, Any], timestamp: int, output: Any) -> None:
        if row["marker"]:
            output.emit_watermark(timestamp)


class Periodic(WatermarkGenerator):
    """The lowest time seen in the last period, at each periodic emit; idle after an empty one."""

    def __init__(self) -> None:
        self.low: int | None = None

    def on_event(self, row: dict[str, Any], timestamp: int, output: Any) -> None:
        self.low = timestamp if self.low is None else min(self.low, timestamp)

    def on_periodic_emit(self, output: Any) -> None:
        if self.low is None:
            output.mark_idle()
        else:
            output.emit_watermark(self.low)
            self.low = None


def watermarks(h: OperatorHarness) -> list[Any]:
    return [e for e in h.out.events if e[0] in ("wm", "idle")]


def test_a_punctuated_generator_emits_at_its_markers_only_and_never_backwards() -> None:
    h = OperatorHarness(TimestampsAndWatermarks(WatermarkStrategy.for_generator(Punctuated).with_timestamp_column("ts")))
    h.batch([{"ts": 5, "marker": False}, {"ts": 9, "marker": True}, {"ts": 12, "marker": False}])
    h.batch([{"ts": 7, "marker": True}, {"ts": 20, "marker": True}])
    assert watermarks(h) == [("wm", 9), ("wm", 20)]


def test_a_periodic_generator_is_called_on_the_pipeline_interval_and_can_mark_idle() -> None:
    op = TimestampsAndWatermarks(WatermarkStrategy.for_generator(Periodic).with_timestamp_column("ts"))
    h = OperatorHarness(op, config={"pipeline.auto-watermark-interval": "50 ms"})
    assert op.processing_time_interval_ms == 50
    h.batch([{"ts": 30}, {"ts": 10}])
    assert watermarks(h) == []
    h.tick(50)
    h.tick(100)  # nothing came: idle
    h.batch([{"ts": 40}])  # a row makes it active again
    h.tick(150)
    assert watermarks(h) == [("wm", 10), ("idle", True), ("idle", False), ("wm", 40)]


def test_a_vectorised_generator_sees_a_batchs_times_at_once_and_errors_name_the_operator() -> None:
    class Batches(WatermarkGenerator):
        def on_batch(self, timestamps: Any, output: Any) -> None:
            output.emit_watermark(int(timestamps.min()))

    h = OperatorHarness(TimestampsAndWatermarks(WatermarkStrategy.for_generator(Batches).with_timestamp_column("ts")))
    h.batch([{"ts": 30}, {"ts": 10}])
    assert watermarks(h) == [("wm", 10)]

    class Broken(WatermarkGenerator):
        def on_event(self, row: dict[str, Any], timestamp: int, output: Any) -> None:
            raise KeyError("nope")

    h = OperatorHarness(TimestampsAndWatermarks(WatermarkStrategy.for_generator(Broken).with_timestamp_column("ts")))
    with pytest.raises(UserFunctionError, match="timestamps/watermarks.*KeyError"):
        h.batch([{"ts": 1}])
    with pytest.raises(ValueError, match="not a WatermarkGenerator"):
        WatermarkStrategy.for_generator(lambda: object()).create_generator()


def _files(tmp_path: Path) -> str:
    folder = tmp_path / "in"
    folder.mkdir()
    for name, start in (("a", 1000), ("b", 0)):  # b is earlier in time, later in split order
        pq.write_table(pa.table({"ts": list(range(start, start + 100))}), folder / f"{name}.parquet")
    return str(folder)


def test_a_source_holding_two_splits_emits_the_minimum_of_their_watermarks(tmp_path: Path) -> None:
    path = _files(tmp_path)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(5).with_timestamp_column("ts")
    first = FileSource(path, "parquet", watermarks=strategy)
    h = OperatorHarness(first, open=False, batch_size=10)
    # restored holding both splits part-read: a at row 50 (watermark 1044), b at row 20 (watermark 14)
    state = {"splits": pa.table({"split_id": [f"{path}/a.parquet#0", f"{path}/b.parquet#0"],
                                 "payload": [_payload(f"{path}/a.parquet"), _payload(f"{path}/b.parquet")],
                                 "offset": [50, 20], "watermark": [1044, 14]}),
             "static_splits": pa.table({"taken": [2]})}  # (no split provider here: both were taken)
    first.initialize_state(state)
    first.open()
    h.run()
    # while a is read, b (held, its reading not resumed yet) keeps the watermark at its own: no
    # row of b is behind it; then b's batches raise it (max - 5 - 1)
    assert [e[1] for e in h.out.events if e[0] == "wm"] == [14] + [t - 6 for t in range(29, 100, 10)]
    assert [r["ts"] for r in h.rows()] == list(range(1050, 1100)) + list(range(20, 100))

    # a snapshot holds each split's watermark; one from before the column existed loads too
    again = FileSource(path, "parquet", watermarks=strategy)
    OperatorHarness(again, open=False)
    again.initialize_state({"splits": state["splits"].drop_columns(["watermark"]), "static_splits": state["static_splits"]})
    assert [s.watermark for s in again._splits] == [-(2**63)] * 2


def _payload(file: str) -> bytes:
    from yarnflow.worker.state.tables import dumps

    return dumps((file, 0))


def test_with_idleness_a_held_split_without_rows_stops_holding_the_watermark(tmp_path: Path) -> None:
    """FLIP-27's per-split idleness: the split waiting its turn gave no rows for the idleness, so
    the watermark follows the split being read (progress over completeness: b's rows may now be
    late, as in Flink)."""
    import itertools

    path = _files(tmp_path)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(5).with_timestamp_column("ts").with_idleness(25)
    source = FileSource(path, "parquet", watermarks=strategy)
    clock = itertools.count(0, 10)  # 10 ms of processing time per reading of the clock
    h = OperatorHarness(source, open=False, batch_size=10)
    h.ctx.clock = lambda: next(clock)
    source.initialize_state({"splits": pa.table({
        "split_id": [f"{path}/a.parquet#0", f"{path}/b.parquet#0"],
        "payload": [_payload(f"{path}/a.parquet"), _payload(f"{path}/b.parquet")],
        "offset": [50, 20], "watermark": [1044, 14]}), "static_splits": pa.table({"taken": [2]})})
    source.open()
    h.run()
    marks = [e[1] for e in h.out.events if e[0] == "wm"]
    assert marks[0] == 14 and 1050 - 6 <= max(marks) <= 1099 - 6  # a's own, once b went idle
    assert marks == sorted(marks)
