"""Credit-based flow control in a running job: a fast source and a slow consumer on two
TaskExecutor processes (one slot each, so half of every keyed exchange crosses between them).
The consumer's remote channels never hold more than their credit (exclusive plus floating
buffers, times the segment size, shown as ``inflight-bytes-peak``), and the source shows the
back-pressure it feels from waiting for room (``backpressure-level`` high)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.harness import wait_until
from tests.rest import get, submit, wait_flowing

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SEGMENT = 64 * 1024
EXCLUSIVE, FLOATING = 2, 2
NETWORK = {"taskmanager.memory.segment-size": "64 kb",
           "taskmanager.network.memory.buffers-per-channel": str(EXCLUSIVE),
           "taskmanager.network.memory.floating-buffers-per-gate": str(FLOATING)}


def slow_consumer_job(out: str) -> Any:
    def build(env: Any) -> None:
        def rows(start: int, n: int) -> dict[str, list[int]]:
            return {"k": [i % 101 for i in range(start, start + n)], "v": list(range(start, start + n))}

        def slow(batch: Any) -> Any:
            time.sleep(0.05)  # far slower than the unlimited source
            return batch

        (env.from_generator(rows, count=None).map_batches(lambda b: b, name="identity")
            .key_by("k").map_batches(slow, name="slow").sink_to_parquet(out))
    return build


def test_a_slow_consumers_remote_channels_hold_no_more_than_their_credit(local_cluster: Any, tmp_path: Path):
    cluster = local_cluster(taskexecutors=2, slots=1, rest__port="0", **NETWORK)
    web = cluster.web_url()
    job_id = submit(cluster, slow_consumer_job(str(tmp_path / "out")), "slow consumer",
                    {"execution.batch-size": "16384", **NETWORK})
    try:
        wait_flowing(web, job_id)
        subtasks = get(f"{web}/jobs/{job_id}")["vertices"]
        source, consumer = subtasks[0], subtasks[1]
        # the two consumer subtasks run on different TaskExecutors: each reads one channel remotely
        places = {s["taskmanager-id"] for s in get(f"{web}/jobs/{job_id}/vertices/{consumer['id']}")["subtasks"]}
        assert len(places) == 2
        wait_until(lambda: get(f"{web}/jobs/{job_id}/vertices/{source['id']}/backpressure")["backpressure-level"]
                   == "high", 40, "the source never showed as back-pressured by the slow consumer")
        peak = wait_until(lambda: get(f"{web}/jobs/{job_id}")["vertices"][1]["metrics"]["inflight-bytes-peak"],
                          30, "no remote channel of the consumer ever held a batch")
        # batches of 16384 rows (256 KiB) are sent as slices of the channel's exclusive credit
        assert 0 < peak <= (EXCLUSIVE + FLOATING) * SEGMENT
        time.sleep(2.0)  # and it stays bounded while the source keeps producing
        later = get(f"{web}/jobs/{job_id}")["vertices"][1]["metrics"]["inflight-bytes-peak"]
        assert later <= (EXCLUSIVE + FLOATING) * SEGMENT
    finally:
        requests.patch(f"{web}/jobs/{job_id}?mode=cancel", timeout=10)
        wait_until(lambda: get(f"{web}/jobs/{job_id}")["state"] in ("CANCELED", "FAILED"), 60,
                   "the job did not end after its cancel")
