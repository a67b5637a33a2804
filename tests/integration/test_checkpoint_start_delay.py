"""A checkpoint's start delay (Flink's checkpointStartDelay): from the trigger to the first
barrier at each task. Behind a slow per-row map with aligned checkpoints, the barrier waits in
the map's input queue behind the rows ahead of it: the map's start delay is that wait, and it
shows in REST per subtask, per vertex summary and per checkpoint (issue 55)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.harness import wait_until
from tests.rest import submit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PER_ROW_S = 0.004
BATCH = 25  # rows: 100 ms of the slow map's time a batch


def _build(out: Path) -> Any:
    def build(env: Any) -> None:
        def rows(start: int, n: int) -> dict[str, list[int]]:
            return {"v": list(range(start, start + n))}

        def slow(row: dict[str, Any]) -> dict[str, Any]:
            time.sleep(PER_ROW_S)
            return row

        (env.from_generator(rows, count=None).uid("source").rebalance()
            .map(slow, name="slow").uid("slow").sink_to_parquet(str(out)).uid("sink"))
    return build


def test_the_start_delay_of_a_task_is_its_barriers_wait_behind_the_rows_queued_ahead(
        local_cluster: Any, tmp_path: Path) -> None:
    cluster = local_cluster(taskexecutors=1, slots=2, rest__port="0", rest__authentication="none")
    web = cluster.web_url()
    job_id = submit(cluster, _build(tmp_path / "out"), "start-delay",
                    {"execution.checkpointing.interval": "500 ms", "execution.batch-size": str(BATCH)}, parallelism=1)
    try:
        def completed() -> Any:
            stats = requests.get(f"{web}/jobs/{job_id}/checkpoints", timeout=10).json()
            return stats["latest"]["completed"]

        checkpoint = wait_until(completed, 60, "no checkpoint completed")
        vertices = requests.get(f"{web}/jobs/{job_id}", timeout=10).json()["vertices"]
        [slow] = [v["id"] for v in vertices if "slow" in v["name"]]
        [source] = [v["id"] for v in vertices if v["id"] != slow]
        details = requests.get(f"{web}/jobs/{job_id}/checkpoints/details/{checkpoint['id']}/subtasks/{slow}",
                               timeout=10).json()
        [row] = details["subtasks"]
        # at least the batch being processed and one queued ahead of the barrier (100 ms each)
        assert 100 <= row["start_delay"] <= row["end_to_end_duration"], row
        assert details["summary"]["start_delay"]["max"] == row["start_delay"]
        assert checkpoint["start_delay"] >= row["start_delay"]
        # the source, triggered directly, starts it sooner than the map its barrier queues for
        [first] = requests.get(f"{web}/jobs/{job_id}/checkpoints/details/{checkpoint['id']}/subtasks/{source}",
                               timeout=10).json()["subtasks"]
        assert first["start_delay"] < row["start_delay"], (first, row)
    finally:
        requests.patch(f"{web}/jobs/{job_id}?mode=cancel", timeout=10)
