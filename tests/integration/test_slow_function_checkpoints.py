"""Checkpoints complete under slow per-row functions (issue 51): the job a new user wrote,
``read_text(8 files x 3,000 lines) -> map(parse) -> rebalance() -> map(slow) ->
sink_to_parquet`` plus a keyed count, on a session of 2 TaskExecutors x 2 slots, unaligned
checkpoints every 300 ms, where ``slow`` takes most of a millisecond a row: waiting on a
"service" (a sleep), burning the CPU, or a flat_map that multiplies every row 50x. The file
source hands its 65,536-row batches (here: every row at once) to the slow map, which once held
its first checkpoint for the whole job. Now the task takes a batch a slice at a time, and a
checkpoint completes between two slices: many complete while the job runs (counted over REST),
also after a TaskExecutor running it was SIGKILLed, and the committed output holds every row
once."""

from __future__ import annotations

import collections
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest
import requests

from tests.harness import wait_until
from tests.integration.test_cluster_failures import _resource_id, _te_processes
from tests.rest import submit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FILES, LINES, KEYS = 8, 3000, 37
CONF = {"execution.checkpointing.interval": "300 ms", "execution.checkpointing.unaligned.enabled": "true",
        "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": "3",
        "restart-strategy.fixed-delay.delay": "200 ms", "heartbeat.timeout": "4 s"}


def _write(folder: Path) -> None:
    folder.mkdir()
    for f in range(FILES):
        (folder / f"part-{f}.txt").write_text("".join(f"k{(f * LINES + i) % KEYS} {f} {i}\n" for i in range(LINES)))


def parse(row: dict[str, Any]) -> dict[str, Any]:
    k, f, i = row["line"].split()
    return {"k": k, "f": int(f), "i": int(i)}


def sleeping(row: dict[str, Any]) -> dict[str, Any]:
    """A call to a service per row: 0.8 ms of waiting."""
    time.sleep(0.0008)
    return row


def busy(row: dict[str, Any]) -> dict[str, Any]:
    """Most of a millisecond of Python per row, the GIL held."""
    x = 0
    for j in range(12000 + row["i"] % 7):  # (a job long enough for checkpoints after the kill)
        x += j
    return {**row, "x": x}


def fifty(row: dict[str, Any]) -> Any:
    """Every row 50 times (j = 0..49), a little work for each."""
    time.sleep(0.0002)
    return ({"k": row["k"], "f": row["f"], "i": row["i"], "j": j} for j in range(50))


FUNCTIONS = {"sleep": (sleeping, "map", 1), "cpu": (busy, "map", 1), "flat_map-50x": (fifty, "flat_map", 50)}


def _build(src: Path, out: Path, function: str) -> Any:
    fn, kind, _ = FUNCTIONS[function]

    def build(env: Any) -> None:
        env.set_runtime_mode("STREAMING")
        rows = env.read_text(str(src)).uid("src").map(parse, name="parse").uid("parse").rebalance()
        slow = (rows.map(fn, name="slow") if kind == "map" else rows.flat_map(fn, name="slow")).uid("slow")
        slow.sink_to_parquet(str(out)).uid("sink")
        slow.map(lambda r: {"k": r["k"], "n": 1}, name="one").uid("one").key_by("k").sum("n").uid("sum") \
            .sink_to_parquet(str(out) + "-sums").uid("sums")
    return build


class CheckpointWatch:
    """Polls the job's checkpoints over REST every 200 ms; keeps the most completed while the
    job was RUNNING."""

    def __init__(self, web: str, job_id: str) -> None:
        self.web, self.job_id = web, job_id
        self.completed_while_running = 0
        self.state = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                state = requests.get(f"{self.web}/jobs/{self.job_id}", timeout=5).json()["state"]
                counts = requests.get(f"{self.web}/jobs/{self.job_id}/checkpoints", timeout=5).json()["counts"]
            except (requests.RequestException, KeyError, ValueError):
                continue
            self.state = state
            if state == "RUNNING":
                self.completed_while_running = max(self.completed_while_running, int(counts["completed"]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _state(web: str, job_id: str) -> str:
    """What the job and its checkpoints looked like, for a failure's message."""
    try:
        job = requests.get(f"{web}/jobs/{job_id}", timeout=5).json()
        checkpoints = requests.get(f"{web}/jobs/{job_id}/checkpoints", timeout=5).json()
        failures = requests.get(f"{web}/jobs/{job_id}/exceptions", timeout=5).json()
    except (requests.RequestException, ValueError) as e:
        return f"(REST: {e!r})"
    vertices = [(v["name"], v["status"], v["metrics"].get("read-records"), v["metrics"].get("write-records"))
                for v in job.get("vertices", [])]
    entries = [e.get("exceptionName") for e in failures.get("exceptionHistory", {}).get("entries", [])]
    return (f"state {job.get('state')}, vertices {vertices}, counts {checkpoints.get('counts')}, "
            f"history {checkpoints.get('history', [])[:4]}, exceptions {entries}")


@pytest.mark.parametrize("function", list(FUNCTIONS))
def test_checkpoints_complete_behind_a_slow_per_row_function_through_a_taskexecutor_kill(
        local_cluster: Any, tmp_path: Path, function: str) -> None:
    src, out = tmp_path / "in", tmp_path / "out"
    _write(src)
    cluster = local_cluster(taskexecutors=2, slots=2, rest__port="0", rest__authentication="none")
    web = cluster.web_url()
    job_id = submit(cluster, _build(src, out, function), f"slow-{function}", CONF)
    watch = CheckpointWatch(web, job_id)
    try:
        # a few checkpoints, then a TaskExecutor that runs a task of the job goes
        wait_until(lambda: watch.completed_while_running >= 3, 60,
                   lambda: f"no checkpoint completed behind the slow map: {_state(web, job_id)}")
        details = requests.get(f"{web}/jobs/{job_id}", timeout=5).json()
        places = {tm["taskmanager-id"] for v in details["vertices"] for tm in requests.get(
            f"{web}/jobs/{job_id}/vertices/{v['id']}/taskmanagers", timeout=5).json()["taskmanagers"]}
        victim = sorted(p for p in places if p != "(unassigned)")[0]
        [proc] = [p for p in _te_processes(cluster) if _resource_id(p) == victim]
        # (read now, not the watch's last poll: one that completed since then is not "after the kill")
        killed_at = int(requests.get(f"{web}/jobs/{job_id}/checkpoints", timeout=5).json()["counts"]["completed"])
        proc.send_signal(signal.SIGKILL)
        wait_until(lambda: watch.state == "FINISHED", 180, "the job did not finish")
    finally:
        watch.stop()
    assert watch.completed_while_running >= max(5, killed_at + 2), (watch.completed_while_running, killed_at)
    exceptions = requests.get(f"{web}/jobs/{job_id}/exceptions", timeout=5).json()["exceptionHistory"]["entries"]
    assert exceptions, "the kill did not hit the job"

    # every row once, with its copies
    copies = FUNCTIONS[function][2]
    table = pads.dataset(str(out), format="parquet").to_table()
    seen = collections.Counter(zip(table["f"].to_pylist(), table["i"].to_pylist(),
                                   table["j"].to_pylist() if "j" in table.column_names else [0] * table.num_rows))
    assert len(seen) == FILES * LINES * copies and set(seen.values()) == {1}
    sums = pads.dataset(str(out) + "-sums", format="parquet").to_table()
    totals: dict[str, list[int]] = collections.defaultdict(list)
    for k, n in zip(sums["k"].to_pylist(), sums["n"].to_pylist()):
        totals[k].append(n)
    expected = collections.Counter(f"k{r % KEYS}" for r in range(FILES * LINES))
    assert {k: max(v) for k, v in totals.items()} == {k: n * copies for k, n in expected.items()}
    assert all(len(v) == len(set(v)) for v in totals.values()), "a running total was committed twice"
