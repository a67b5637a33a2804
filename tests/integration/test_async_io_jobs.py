"""Async I/O on a real local cluster (issue 33): rows from files enriched by calls to a local HTTP
server that answers slowly and, for some rows, too late (the function's timeout handler gives
their result); a TaskExecutor is SIGKILLed mid-job. Every input row has exactly one result in the
committed output: calls in flight at a checkpoint are made again after the restore."""

from __future__ import annotations

import collections
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, urlparse

import pyarrow.dataset as pads
import pytest

from tests.integration.test_streaming_exactly_once import CHECKPOINTS, run_killing_one_taskexecutor
from yarnflow import AsyncDataStream, AsyncFunction

pytestmark = [pytest.mark.integration]

ROWS, FILES, TIMEOUT_MS = 3000, 6, 1000


def too_slow(i: int) -> bool:
    return i % 23 == 0


class Slow(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        i = int(parse_qs(urlparse(self.path).query)["id"][0])
        time.sleep(3.0 if too_slow(i) else (i * 7 % 10) / 100)
        body = json.dumps({"id": i, "score": i * 3 % 101}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the caller gave up on it (a timeout)

    def log_message(self, *args: Any) -> None:
        pass


class Server(ThreadingHTTPServer):
    request_queue_size = 256  # (the default 5 would make a burst of connections wait for SYN retries)
    daemon_threads = True


@pytest.fixture
def server() -> Iterator[int]:
    httpd = Server(("127.0.0.1", 0), Slow)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


class Lookup(AsyncFunction):
    def __init__(self, port: int) -> None:
        self.port = port

    async def async_invoke(self, row: dict[str, Any]) -> Any:
        import asyncio

        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(f"GET /lookup?id={row['id']} HTTP/1.0\r\n\r\n".encode())
            await writer.drain()
            answer = await reader.read()
        finally:
            writer.close()
        found = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        return {"id": row["id"], "status": "ok", "score": found["score"]}

    async def timeout(self, row: dict[str, Any]) -> Any:
        return {"id": row["id"], "status": "timeout", "score": -1}


def parse(batch: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    time.sleep(0.05)
    return pa.record_batch({"id": pc.cast(batch.column("line"), pa.int64())})


@pytest.mark.timeout(240)
def test_each_row_gets_one_result_from_a_slow_service_across_a_killed_taskexecutor(
        local_cluster: Any, server: int, tmp_path: Path) -> None:
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    per_file = ROWS // FILES
    for f in range(FILES):
        (src / f"ids-{f}.txt").write_text("".join(f"{i}\n" for i in range(f * per_file, (f + 1) * per_file)))

    def build(env: Any) -> None:
        env.set_runtime_mode("STREAMING")
        ids = env.read_text(str(src)).map_batches(parse, name="parse")
        (AsyncDataStream.unordered_wait(ids, Lookup(server), timeout_ms=TIMEOUT_MS, capacity=30, name="lookup")
            .uid("lookup").sink_to_parquet(str(out)))

    cluster = local_cluster(taskexecutors=2, slots=2)
    run_killing_one_taskexecutor(cluster, build, "async", {**CHECKPOINTS, "execution.batch-size": "50"},
                                 random.Random(9), (0.5, 1.5))
    table = pads.dataset(str(out), format="parquet").to_table()
    got = collections.Counter(zip(table["id"].to_pylist(), table["status"].to_pylist(), table["score"].to_pylist()))
    expected = collections.Counter((i, "timeout", -1) if too_slow(i) else (i, "ok", i * 3 % 101) for i in range(ROWS))
    assert got == expected


def test_ordered_results_keep_the_input_order(run: Any, server: int) -> None:
    def build(env: Any) -> None:
        ids = env.from_collection([{"id": i} for i in range(1, 200) if not too_slow(i)])
        AsyncDataStream.ordered_wait(ids, Lookup(server), timeout_ms=2000, capacity=50).set_parallelism(1).collect()

    rows = run(build, parallelism=1).collected().to_pylist()
    assert [r["id"] for r in rows] == [i for i in range(1, 200) if not too_slow(i)]
