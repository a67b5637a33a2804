"""``stream.process(ProcessFunction)`` on a stream that is not keyed (yarnflow's own API; what
PyFlink's ProcessFunction runs on): each row with its event time, side outputs; timers are
refused naming the keyed stream they need."""

from __future__ import annotations

from typing import Any

import pytest

import yarnflow
from yarnflow.common.errors import JobFailedError
from yarnflow.windows import WatermarkStrategy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class Route(yarnflow.ProcessFunction):
    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        if row["v"] % 3 == 0:
            ctx.output("threes", {"v": row["v"]})
        else:
            out.collect({"v": row["v"], "at": ctx.timestamp, "watermark_known": ctx.timer_service().current_watermark()
                         is not None})


class Timers(yarnflow.ProcessFunction):
    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        ctx.timer_service().register_event_time_timer(5)


def test_a_process_function_on_an_unkeyed_stream_gets_event_time_and_side_outputs(run: Any) -> None:
    def build(env: Any) -> None:
        env.set_runtime_mode("STREAMING")
        strategy = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_column("ts")
        routed = env.from_collection([{"v": v, "ts": v * 10} for v in range(10)]) \
            .assign_timestamps_and_watermarks(strategy).process(Route())
        routed.collect(name="main")
        routed.get_side_output("threes").collect(name="threes")

    result = run(build, "unkeyed-process")
    main = sorted(result.collected("main").to_pylist(), key=lambda r: r["v"])
    assert main == [{"v": v, "at": v * 10, "watermark_known": True} for v in range(10) if v % 3]
    assert sorted(r["v"] for r in result.collected("threes").to_pylist()) == [0, 3, 6, 9]


def test_timers_on_an_unkeyed_stream_are_refused(run: Any) -> None:
    def build(env: Any) -> None:
        env.from_collection([{"v": 1}]).process(Timers()).collect()

    with pytest.raises(JobFailedError, match="timers need a keyed stream"):
        run(build, "unkeyed-timers", conf={"restart-strategy.type": "none"})
