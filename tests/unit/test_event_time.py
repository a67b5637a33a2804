"""Event time in the runtime: the timestamp/watermark assigner (bounded out-of-orderness,
idleness, null and missing event times) and how a task combines its channels' watermarks
(minimum over active channels; idle and finished channels do not hold it back)."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.operators.base import Operator
from yarnflow.common.api import WatermarkStrategy
from yarnflow.worker.operators.timestamps import EventTimeError, TimestampsAndWatermarks
from yarnflow.worker.elements import END_OF_PARTITION, IDLE, MAX_WATERMARK, Watermark
from yarnflow.worker.network.gate import InputGate
from yarnflow.worker.runtime.outputs import WatermarkValve
from yarnflow.worker.runtime.stream_task import StreamTask

from tests.harness import OperatorHarness, runtime_context

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def assigner(ooo: int = 10, idleness: int | None = None) -> OperatorHarness:
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(ooo).with_timestamp_column("ts")
    if idleness:
        strategy = strategy.with_idleness(idleness)
    return OperatorHarness(TimestampsAndWatermarks(strategy))


def test_watermark_trails_the_largest_timestamp_and_never_goes_back():
    h = assigner(ooo=10)
    h.batch(pa.record_batch({"ts": [5, 50, 20]}))
    h.batch(pa.record_batch({"ts": [30, 40]}))  # out of order, behind the max: no new watermark
    h.batch(pa.record_batch({"ts": [61]}))
    assert [[r["ts"] for r in b.to_pylist()] for b in h.batches] == [[5, 50, 20], [30, 40], [61]]
    assert h.trace() == [{"ts": 5}, {"ts": 50}, {"ts": 20}, ("wm", 39), {"ts": 30}, {"ts": 40}, {"ts": 61},
                         ("wm", 50)]


def test_timestamp_types_and_errors():
    h = assigner(ooo=0)
    h.batch(pa.record_batch({"ts": pa.array([1500], pa.timestamp("us"))}))  # 1.5 ms -> 1 ms
    assert h.events[-1] == ("wm", 0)
    with pytest.raises(EventTimeError, match=r"null event time in column 'ts'"):
        h.batch(pa.record_batch({"ts": pa.array([1, None], pa.int64())}))
    with pytest.raises(JobDefinitionError, match="event-time column 'ts' does not exist"):
        h.batch(pa.record_batch({"x": [1]}))
    with pytest.raises(EventTimeError, match="expected integer milliseconds"):
        h.batch(pa.record_batch({"ts": ["soon"]}))
    with pytest.raises(JobDefinitionError, match="needs a timestamp column"):
        TimestampsAndWatermarks(WatermarkStrategy.for_bounded_out_of_orderness(5))


def test_source_goes_idle_after_the_idleness_timeout_and_active_with_new_data():
    h = assigner(ooo=0, idleness=1000)
    interval = h.op.processing_time_interval_ms
    assert interval and interval <= 500
    h.batch(pa.record_batch({"ts": [10]}))
    h.tick(999)
    assert ("idle", True) not in h.events
    h.tick(1000)
    assert h.events[-1] == ("idle", True)
    h.tick(2000)
    assert h.events.count(("idle", True)) == 1  # said once
    h.batch(pa.record_batch({"ts": [20]}))
    assert ("idle", False) in h.events


def test_valve_excludes_idle_and_finished_channels():
    v = WatermarkValve([0, 1, 2])
    assert v.on_watermark(0, 100) is None
    assert v.on_watermark(1, 50) is None
    assert v.on_watermark(2, 70) == 50
    assert v.on_status(1, idle=True) == 70  # the slow channel went idle: it no longer holds the others
    assert v.on_watermark(1, 10) is None  # an idle channel's old watermark cannot pull it back
    assert v.on_end(2) == 100
    assert not v.all_idle
    assert v.on_status(0, idle=True) is None and v.all_idle
    assert v.on_status(1, idle=False) is None  # active again at 10 < 100: the watermark stays at 100
    assert v.current == 100


class Capture(Operator):
    def __init__(self) -> None:
        super().__init__("capture")
        self.seen: list[object] = []

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        self.seen.append(("batch", input_index, batch.num_rows))

    def process_watermark(self, watermark: Watermark, input_index: int = 0) -> None:
        self.seen.append(("wm", input_index, watermark.timestamp))

    def end_input(self, input_index: int = 0) -> None:
        self.seen.append(("end", input_index))


def _run_task(channel_inputs: list[int], feeds: list[list[object]]) -> Capture:
    gate = InputGate(len(channel_inputs), 8)
    head = Capture()
    task = StreamTask([head], gate, channel_inputs, [], lambda: False, "t")
    task.wire(lambda op: runtime_context())
    for ch, elements in enumerate(feeds):
        for el in elements:
            gate.push(ch, el)
    t = threading.Thread(target=task.invoke)
    t.start()
    t.join(10)
    assert not t.is_alive()
    return head


def test_an_idle_input_partition_does_not_stall_event_time():
    batch = pa.record_batch({"x": [1]})
    head = _run_task([0, 0], [[batch, Watermark(500), Watermark(900), END_OF_PARTITION],
                              [IDLE, END_OF_PARTITION]])
    wms = [e[2] for e in head.seen if e[0] == "wm"]
    assert 900 in wms  # advanced although channel 1 never sent a watermark
    assert wms == sorted(wms) and wms[-1] == MAX_WATERMARK.timestamp  # inputs ended: event time complete
    assert ("end", 0) in head.seen


def test_two_inputs_keep_separate_watermarks():
    head = _run_task([0, 1], [[Watermark(100), Watermark(300), END_OF_PARTITION],
                              [Watermark(200), END_OF_PARTITION]])
    per_input = {i: [e[2] for e in head.seen if e[0] == "wm" and e[1] == i] for i in (0, 1)}
    assert per_input[0][:2] == [100, 300] and per_input[1][0] == 200
    assert per_input[0][-1] == per_input[1][-1] == MAX_WATERMARK.timestamp
    assert [e for e in head.seen if e[0] == "end"] == [("end", 0), ("end", 1)] or \
        sorted(e for e in head.seen if e[0] == "end") == [("end", 0), ("end", 1)]
