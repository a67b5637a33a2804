"""Fuzzing a real local cluster (issue 31, hardened inputs): a call nesting containers 100,000
deep and one declaring 1 GB, then 10,000 malformed Thrift frames at each of the Dispatcher and the ResourceManager (the
AppMaster's port) and at a TaskExecutor, made by mutating real calls (bytes flipped, cut, inserted, lengths made huge or negative,
frames glued together) and by random bytes; then 1,000 malformed REST requests. No process
dies, no thread is left behind, the log holds no traceback, and the next job counts every row
exactly once. Seeded: a failure names the seed and frame that caused it."""

from __future__ import annotations

import glob
import os
import random
import re
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from thrift.protocol.TMultiplexedProtocol import TMultiplexedProtocol
from thrift.transport import TTransport

from tests.integration.test_batch_exactly_once import _committed_counts, _pipeline, _to_row, _write_files
from tests.integration.test_failover_jobs import _run
from yarnflow.common.errors import InvalidRequestError
from yarnflow.common.rpc.gateways import RemoteTaskExecutorGateway
from yarnflow.common.messages import JobEdge, JobGraph, JobVertex, ResourceProfile, SlotReport, SlotStatus
from yarnflow.common.rpc.gen.yarnflow_rpc import DispatcherService, ResourceManagerService, TaskExecutorService
from yarnflow.common.rpc.limits import LimitedFramedTransport
from yarnflow.common.rpc.server import protocol_factory
from yarnflow.common.states import JobStatus, Partitioner

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FRAMES = 10_000
REST_REQUESTS = 1_000
SEED = 31


def _calls(service: str, client_cls: type, calls: list[tuple[str, tuple[Any, ...]]]) -> list[bytes]:
    """The bytes a real client sends for each call."""
    out = []
    for method, args in calls:
        buf = TTransport.TMemoryBuffer()
        client = client_cls(TMultiplexedProtocol(protocol_factory().getProtocol(LimitedFramedTransport(buf)), service))
        getattr(client, f"send_{method}")(*args)  # framed, as the client sends it: the mutations reach the length
        out.append(buf.getvalue())
    return out


def _graph() -> Any:
    src = JobVertex("v-src", "src", 2, 128, ["src"], is_source=True)
    sink = JobVertex("v-sink", "sink", 2, 128, ["sink"], is_sink=True)
    return JobGraph("0" * 32, "fuzz", [src, sink], [JobEdge("v-src", "v-sink", Partitioner.HASH, key_columns=["k"])],
                    artifact_uri="file:///nowhere.zip").to_thrift()


def _base_frames() -> dict[str, list[bytes]]:
    token = "f" * 32
    report = SlotReport([SlotStatus(0, ResourceProfile(1.0, 1024))]).to_thrift()
    return {
        "dispatcher": _calls("dispatcher", DispatcherService.Client, [
            ("listJobs", (token,)), ("getJob", (token, "0" * 32)), ("clusterInfo", ()),
            ("submitJob", (token, _graph())), ("cancelJob", (token, "0" * 32))]),
        "resourcemanager": _calls("resourcemanager", ResourceManagerService.Client, [
            ("heartbeatFromTaskExecutor", (token, "reg-1", report)),
            ("disconnectTaskExecutor", (token, "te-x", "fuzz"))]),
        "taskexecutor": _calls("taskexecutor", TaskExecutorService.Client, [
            ("freeSlot", (token, "alloc-1", "fuzz")), ("cancelTask", (token, "a" * 32)),
            ("requestSlot", (token, 0, "0" * 32, "alloc-1", ResourceProfile(1.0, 1024).to_thrift(), "127.0.0.1:1",
                             token))]),
    }


def _mutate(rng: random.Random, frames: list[bytes]) -> bytes:
    frame = bytearray(rng.choice(frames))
    kind = rng.randrange(7)
    if kind == 0:  # bytes flipped
        for _ in range(rng.randint(1, 8)):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
    elif kind == 1:  # cut short
        del frame[rng.randrange(1, len(frame)):]
    elif kind == 2:  # bytes inserted
        at = rng.randrange(len(frame))
        frame[at:at] = rng.randbytes(rng.randint(1, 32))
    elif kind == 3:  # a length (any 4 bytes) made huge or negative
        at = rng.randrange(max(1, len(frame) - 4))
        frame[at:at + 4] = struct.pack("!i", rng.choice([0x7FFFFFFF, 0x7FFFFFF0, -1, -2147483648, 1 << 24]))
    elif kind == 4:  # random bytes
        return rng.randbytes(rng.randint(1, 2048))
    elif kind == 5:  # two frames glued, the second mutated
        return bytes(frame) + _mutate(rng, frames)
    else:  # a type byte changed
        at = rng.randrange(len(frame))
        frame[at] = rng.choice([0, 1, 2, 3, 4, 6, 8, 10, 11, 12, 13, 14, 15, 255])
    return bytes(frame)


def _send(address: str, payload: bytes) -> None:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # no TIME_WAIT pile-up
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)  # the server sees the end: it answers or drops the connection
            s.settimeout(2)
            while s.recv(65536):
                pass
        except OSError:
            pass  # reset by the server: that is one of its answers


def _fuzz(address: str, frames: list[bytes], seed: int) -> None:
    rng = random.Random(seed)
    payloads = [_mutate(rng, frames) for _ in range(FRAMES)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: _send(address, p), payloads))


def _logs(cluster: Any) -> str:
    return "\n".join(Path(p).read_text(errors="replace")
                     for p in glob.glob(os.path.join(cluster.work_dir, "**", "*.log"), recursive=True))


def _threads(pid: int) -> int:
    return psutil.Process(pid).num_threads()


def _settled_threads(pid: int, before: int) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        n = _threads(pid)
        if n <= before + 2:
            return n
        time.sleep(0.2)
    return _threads(pid)


def test_malformed_frames_and_requests_leave_every_process_serving_and_the_next_job_exact(
        local_cluster: Any, tmp_path: Any) -> None:
    cluster = local_cluster(taskexecutors=2, slots=1, rest__port="0")
    am_pid = cluster.proc.pid
    logs = _logs(cluster)
    te_rpc = re.findall(r"started: rpc (\S+), data", logs)[0]
    tes = [p for p in psutil.Process(am_pid).children(recursive=True) if "yarnflow.worker" in " ".join(p.cmdline())]
    assert len(tes) == 2
    before = {p: _threads(p) for p in [am_pid] + [te.pid for te in tes]}
    # a call short of an argument is the caller's error, answered as such (it was an internal
    # error with a traceback in the log)
    te_gateway = RemoteTaskExecutorGateway(te_rpc, 3000)
    with pytest.raises(InvalidRequestError, match="malformed arguments of cancelTask"):
        te_gateway._c.call("cancelTask", "token", None)
    te_gateway.close()
    # containers nested 100,000 deep in a field the server does not know (it skips it): Thrift's
    # own recursion limit ends the connection, not the process; and a message declaring 1 GB
    deep = (struct.pack("!i", -2147418112 | 1) + struct.pack("!i", 17) + b"taskexecutor:ping" + struct.pack("!i", 1)
            + b"\x0f" + struct.pack("!h", 99) + (b"\x0f" + struct.pack("!i", 1)) * 100_000 + b"\x08" + b"\x00" * 4)
    for address in (te_rpc, cluster.address):
        _send(address, struct.pack("!i", len(deep)) + deep)
        _send(address, struct.pack("!i", 1 << 30) + deep)
    base = _base_frames()
    _fuzz(cluster.address, base["dispatcher"], SEED)
    _fuzz(cluster.address, base["resourcemanager"], SEED + 1)
    _fuzz(te_rpc, base["taskexecutor"], SEED + 2)

    web = cluster.web_url()
    rng = random.Random(SEED + 3)
    paths = ["/jobs", "/jobs/" + "0" * 32, "/jobs/%zz", "/jobs/" + "a" * 5000, "/taskmanagers", "/overview",
             "/jobs/" + "0" * 32 + "/savepoints", "/jobs/" + "0" * 32 + "/rescaling", "/artifacts", "/../../etc",
             "/jobs/" + "0" * 32 + "/vertices/x/backpressure", "/taskmanagers?count=-5", "/taskmanagers?count=x"]
    bodies = [b"", b"{", b"[]", b"{\"target-directory\": 5}", b"\xff\xfe", b"[" * 20000, b"{\"a\":" * 500,
              rng.randbytes(4096), b"null", b"{\"cancel-job\": \"maybe\"}"]
    statuses = set()
    for i in range(REST_REQUESTS):
        method = rng.choice(["GET", "POST", "PATCH", "DELETE", "PUT", "HEAD", "OPTIONS"])
        body = rng.choice(bodies)
        headers = rng.choice([{}, {"Content-Type": "application/json"}, {"Content-Type": "text/plain"},
                              {"Content-Length": "999999999999"}, {"Authorization": "Bearer nope"}])
        try:
            r = requests.request(method, web + rng.choice(paths), data=body, headers=headers, timeout=3)
            statuses.add(r.status_code)
            assert r.status_code < 500 or r.status_code == 503, (i, method, r.status_code, r.text[:200])
        except (requests.exceptions.ConnectionError, requests.exceptions.Timeout):
            # a declared length the body does not have: the server waits for the rest of it, or
            # refuses it and closes the connection
            assert "Content-Length" in headers, (i, method, headers)
    assert statuses and max(statuses) < 500

    for proc in [psutil.Process(am_pid)] + tes:
        assert proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE, proc
    for pid, n in before.items():
        assert _settled_threads(pid, n) <= n + 2, f"threads of {pid}: {n} before, {_threads(pid)} after"
    src, out = tmp_path / "in", tmp_path / "out"
    expected = _write_files(src, files=4, rows=4000)
    result = _run(cluster, _pipeline(src, out, _to_row), "after-fuzz", {}, parallelism=2)
    assert result.status == JobStatus.FINISHED and _committed_counts(out) == expected
    assert "Traceback" not in _logs(cluster)
