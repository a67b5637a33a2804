"""RPC over real loopback Thrift: RpcServer, RpcClient and the error translation between them.

The server hosts two multiplexed services (a TaskExecutorService and a DispatcherService) with
small handlers; clients call them through the project's RpcClient; raw sockets throw garbage
at the server to prove one bad connection never takes it down."""

from __future__ import annotations

import os
import socket
import struct
import sys
import threading
import time
import traceback
import uuid
from typing import Any, Iterator

import psutil
import pytest
from thrift.protocol.TMultiplexedProtocol import TMultiplexedProtocol
from thrift.transport import TTransport

from tests.harness import wait_until
from yarnflow.common import errors, ids
from yarnflow.common.messages import (
    InputChannelDescriptor,
    InputGateDescriptor,
    JobStatusInfo,
    ResourceProfile,
    ResultPartitionDescriptor,
    TaskDeploymentDescriptor,
)
from yarnflow.common.rpc.client import RpcClient
from yarnflow.common.rpc.errors import to_wire_error
from yarnflow.common.rpc.gen.yarnflow_rpc import DispatcherService, TaskExecutorService
from yarnflow.common.rpc.limits import LimitedFramedTransport
from yarnflow.common.rpc.server import MAX_STRING_BYTES, RpcServer, protocol_factory
from yarnflow.common.states import JobStatus, Partitioner

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

DECLARED = {
    "fencing": errors.FencingTokenError,
    "not-found": errors.NotFoundError,
    "invalid": errors.InvalidRequestError,
    "unavailable": errors.UnavailableError,
    "refused": errors.RefusedError,
    "internal": errors.RpcError,
}


class TaskExecutorHandler:
    """A TaskExecutorService that records what it was sent and fails on request."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, str]] = []  # (method, args, serving thread)
        self.lock = threading.Lock()

    def _record(self, method: str, *args: Any) -> None:
        with self.lock:
            self.calls.append((method, args, threading.current_thread().name))

    def ping(self) -> str:
        self._record("ping")
        return "pong"

    def cancelTask(self, jobmaster_fencing_token: str, execution_attempt_id: str) -> None:
        self._record("cancelTask", jobmaster_fencing_token, execution_attempt_id)
        raise to_wire_error(errors.NotFoundError(f"unknown attempt {execution_attempt_id}"))

    def freeSlot(self, jobmaster_fencing_token: str, allocation_id: str, reason: str) -> None:
        """Raises the declared error named by ``reason``."""
        self._record("freeSlot", jobmaster_fencing_token, allocation_id, reason)
        raise_declared_error(reason, allocation_id)

    def disconnectResourceManager(self, rm_fencing_token: str, reason: str) -> None:
        """``boom``: an undeclared error; ``sleep:<ms>``: answer late."""
        self._record("disconnectResourceManager", rm_fencing_token, reason)
        if reason == "boom":
            raise ValueError("a bug in the handler")
        if reason.startswith("sleep:"):
            time.sleep(int(reason.split(":")[1]) / 1000)

    def submitTask(self, jobmaster_fencing_token: str, tdd: Any) -> None:
        self._record("submitTask", jobmaster_fencing_token, TaskDeploymentDescriptor.from_thrift(tdd))

    def requestSlot(self, rm_fencing_token: str, slot_index: int, job_id: str, allocation_id: str,
                    profile: Any, jobmaster_address: str, jobmaster_fencing_token: str) -> None:
        self._record("requestSlot", rm_fencing_token, slot_index, job_id, allocation_id,
                     ResourceProfile.from_thrift(profile), jobmaster_address, jobmaster_fencing_token)


def raise_declared_error(kind: str, what: str) -> None:
    raise to_wire_error(DECLARED[kind](f"{kind} error for {what}"))


class DispatcherHandler:
    """Answers getJob with the job id it was asked for: replies can be matched to requests."""

    def getJob(self, fencing_token: str, job_id: str) -> Any:
        assert fencing_token == "dispatcher-token"
        return JobStatusInfo(ids.JobID(job_id), f"job {job_id}", JobStatus.RUNNING, len(job_id)).to_thrift()


class Cluster:
    """One server plus the clients opened against it; everything is closed at the end."""

    def __init__(self) -> None:
        self.handler = TaskExecutorHandler()
        self.name = f"rpctest-{uuid.uuid4().hex[:8]}"
        self.server = self.start_server(0)
        self.clients: list[RpcClient] = []

    def start_server(self, port: int) -> RpcServer:
        services = {"taskexecutor": TaskExecutorService.Processor(self.handler),
                    "dispatcher": DispatcherService.Processor(DispatcherHandler())}
        self.server = RpcServer(host="127.0.0.1", port=port, services=services, name=self.name).start()
        return self.server

    def client(self, timeout_ms: int = 10_000, service: str = "taskexecutor", client_cls: type | None = None,
               address: str | None = None) -> RpcClient:
        cls = client_cls or (TaskExecutorService.Client if service == "taskexecutor" else DispatcherService.Client)
        client = RpcClient(address or self.server.address, service, cls, timeout_ms=timeout_ms)
        self.clients.append(client)
        return client

    def server_threads(self) -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith(self.name)]

    def connections(self) -> int:
        """Connections the server is serving (one thread each)."""
        return sum(1 for t in self.server_threads() if t.name.endswith("-conn"))

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.server.stop()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    yield c
    c.close()
    assert c.server_threads() == []


def _tdd() -> TaskDeploymentDescriptor:
    channel = InputChannelDescriptor(ids.ResultPartitionID("rp-1"), ids.ResourceID("te-2"), "127.0.0.1:7001")
    return TaskDeploymentDescriptor(
        job_id=ids.JobID("job-1"), vertex_id=ids.JobVertexID("v-2"), task_name="map -> filter",
        execution_attempt_id=ids.ExecutionAttemptID("att-1"), subtask_index=1, attempt_number=2,
        parallelism=4, max_parallelism=128, allocation_id=ids.AllocationID("alloc-1"),
        artifact_uri="file:///tmp/storage/job-1/artifact.zip", artifact_sha256="ab" * 32,
        input_gates=[InputGateDescriptor(0, [channel, channel], 1)],
        result_partitions=[ResultPartitionDescriptor(ids.ResultPartitionID("rp-2"), 3, Partitioner.HASH,
                                                     ["word"], consumer_max_parallelism=64)],
        jobmaster_fencing_token="jm-token", config={"parallelism.default": "4"}, runtime_mode="BATCH",
        job_storage_dir="file:///tmp/storage/job-1")


# ---- calls and errors ---------------------------------------------------------------------

def test_ping(cluster: Cluster) -> None:
    client = cluster.client()
    assert client.call("ping") == "pong"
    assert client.method("ping")() == "pong"


def test_structs_cross_the_wire(cluster: Cluster) -> None:
    client = cluster.client()
    tdd = _tdd()
    client.call("submitTask", "jm-token", tdd.to_thrift())
    client.call("requestSlot", "rm-token", 3, "job-1", "alloc-9", ResourceProfile(1.5, 2048).to_thrift(),
                "127.0.0.1:6123", "jm-token")
    (submit, request) = [c for c in cluster.handler.calls if c[0] in ("submitTask", "requestSlot")]
    assert submit[1] == ("jm-token", tdd)
    assert request[1] == ("rm-token", 3, "job-1", "alloc-9", ResourceProfile(1.5, 2048), "127.0.0.1:6123",
                          "jm-token")


def test_two_services_share_one_port(cluster: Cluster) -> None:
    dispatcher = cluster.client(service="dispatcher")
    info = JobStatusInfo.from_thrift(dispatcher.call("getJob", "dispatcher-token", "job-42"))
    assert info.job_id == "job-42" and info.status is JobStatus.RUNNING
    assert cluster.client().call("ping") == "pong"


def test_not_found_maps_to_the_projects_error(cluster: Cluster) -> None:
    client = cluster.client()
    with pytest.raises(errors.NotFoundError) as info:
        client.call("cancelTask", "jm-token", "att-7")
    assert str(info.value) == "unknown attempt att-7"
    assert isinstance(info.value, LookupError)
    assert "NotFoundError" in (info.value.remote_traceback or "")
    assert "cancelTask" in (info.value.remote_traceback or "")


@pytest.mark.parametrize("kind", DECLARED)
def test_declared_errors_map_to_the_projects_errors(cluster: Cluster, kind: str) -> None:
    client = cluster.client()
    with pytest.raises(errors.RpcError) as info:
        client.call("freeSlot", "jm-token", "alloc-3", kind)
    assert type(info.value) is DECLARED[kind]
    assert f"{kind} error for alloc-3" in str(info.value)
    remote = info.value.remote_traceback or ""
    assert "raise_declared_error" in remote and "Traceback" in remote  # the peer's stack, not ours


def test_a_declared_error_keeps_the_connection(cluster: Cluster) -> None:
    client = cluster.client()
    client.call("ping")
    for _ in range(3):
        with pytest.raises(errors.FencingTokenError):
            client.call("freeSlot", "stale", "alloc-1", "fencing")
    client.call("ping")
    serving = {thread for _, _, thread in cluster.handler.calls}
    assert len(serving) == 1  # all five calls over one connection


def test_an_unexpected_handler_error_becomes_rpc_error(cluster: Cluster) -> None:
    client = cluster.client()
    with pytest.raises(errors.RpcError) as info:
        client.call("disconnectResourceManager", "rm-token", "boom")
    assert type(info.value) is errors.RpcError
    assert cluster.server.address in str(info.value)
    # The client keeps working, and so does the server for others.
    assert client.call("ping") == "pong"
    assert cluster.client().call("ping") == "pong"
    for _ in range(3):
        with pytest.raises(errors.RpcError):
            client.call("disconnectResourceManager", "rm-token", "boom")
        assert client.call("ping") == "pong"


def test_a_call_on_an_unregistered_service_fails_without_hurting_the_server(cluster: Cluster) -> None:
    wrong = cluster.client(service="no-such-service", client_cls=TaskExecutorService.Client)
    with pytest.raises(errors.RpcError):
        wrong.call("ping")
    assert cluster.client().call("ping") == "pong"


# ---- connection failures and timeouts -----------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_address_raises_connection_error(cluster: Cluster) -> None:
    client = cluster.client(address=f"127.0.0.1:{_free_port()}")
    started = time.monotonic()
    with pytest.raises(errors.RpcConnectionError) as info:
        client.call("ping")
    assert isinstance(info.value, ConnectionError)
    assert time.monotonic() - started < 5
    assert client.address in str(info.value)
    with pytest.raises(ConnectionError):  # and again: no state left behind
        client.call("ping")


@pytest.mark.parametrize("address", ["localhost", "127.0.0.1:", ":80", "127.0.0.1:http"])
def test_a_malformed_address_is_a_connection_error(address: str) -> None:
    with pytest.raises(errors.RpcConnectionError, match="HOST:PORT"):
        RpcClient(address, "taskexecutor", TaskExecutorService.Client)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="relies on Linux dropping SYNs on a full backlog")
def test_a_connect_that_times_out_is_a_connection_error(cluster: Cluster) -> None:
    """Nothing was sent, so the caller may safely retry: a connection error, not a timeout."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        fillers = []
        try:
            for _ in range(3):  # fill the accept queue: later SYNs are dropped
                s = socket.socket()
                fillers.append(s)
                s.settimeout(0.2)
                try:
                    s.connect(listener.getsockname())
                except OSError:
                    pass
            client = cluster.client(address=f"127.0.0.1:{listener.getsockname()[1]}", timeout_ms=300)
            started = time.monotonic()
            with pytest.raises(errors.RpcConnectionError):
                client.call("ping")
            assert time.monotonic() - started < 5
        finally:
            for s in fillers:
                s.close()


def test_a_slow_answer_raises_timeout_and_the_client_recovers(cluster: Cluster) -> None:
    client = cluster.client(timeout_ms=200)
    started = time.monotonic()
    with pytest.raises(errors.RpcTimeoutError) as info:
        client.call("disconnectResourceManager", "rm-token", "sleep:1000")
    assert isinstance(info.value, TimeoutError)
    assert time.monotonic() - started < 0.9
    # The late reply must not be read as the answer to the next call.
    assert client.call("ping") == "pong"
    time.sleep(1.0)
    assert client.call("ping") == "pong"


def test_a_per_call_timeout(cluster: Cluster) -> None:
    client = cluster.client(timeout_ms=5_000)
    with pytest.raises(errors.RpcTimeoutError):
        client.call("disconnectResourceManager", "rm-token", "sleep:800", timeout_ms=100)
    # the client's own timeout is back in force
    client.call("disconnectResourceManager", "rm-token", "sleep:300")
    assert client.call("ping") == "pong"


def test_the_client_reconnects_after_a_server_restart_on_the_same_port(cluster: Cluster) -> None:
    client = cluster.client()
    assert client.call("ping") == "pong"
    port = cluster.server.port
    cluster.server.stop()
    with pytest.raises(errors.RpcConnectionError):
        client.call("ping")
    with pytest.raises(errors.RpcConnectionError):
        client.call("ping")
    cluster.start_server(port)
    assert cluster.server.port == port
    assert client.call("ping") == "pong"


def test_a_closed_clients_connection_serves_the_next_client_and_a_dropped_one_does_not(cluster: Cluster) -> None:
    """Issue 54: a job's clients (JobMaster <-> TaskExecutor) are closed with the job; their
    connections are kept for the next job's clients of the same service and address (no new
    connect, no TLS handshake), one client at a time. One whose server went away meanwhile is
    not handed out: the next client connects afresh and says it cannot reach the server."""
    first = cluster.client()
    assert first.call("ping") == "pong"
    kept = first._socket
    first.close()
    assert cluster.connections() == 1  # (kept open)
    second = cluster.client()
    assert second.call("ping") == "pong"
    assert second._socket is kept and cluster.connections() == 1
    third = cluster.client()  # while the second holds it: a connection of its own
    assert third.call("ping") == "pong"
    assert third._socket is not kept and cluster.connections() == 2
    second.close()
    third.close()
    port = cluster.server.port
    cluster.server.stop()  # (the kept connections are closed by the server now)
    fourth = cluster.client()
    with pytest.raises(errors.RpcConnectionError, match="cannot reach"):
        fourth.call("ping")
    cluster.start_server(port)
    assert fourth.call("ping") == "pong"


def test_a_connection_left_mid_call_is_not_reused(cluster: Cluster) -> None:
    """A call interrupted by Ctrl-C (the CLI then cancels its job on a new client) leaves its
    answer on the way: that connection is not kept, or the next client would read the late
    answer as its own."""
    import signal

    first = cluster.client(timeout_ms=5_000)
    first.call("ping")

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            first.call("disconnectResourceManager", "rm-token", "sleep:600")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    left = first._socket
    first.close()
    second = cluster.client(timeout_ms=5_000)  # (at once: the late answer is still on its way)
    assert second.call("ping") == "pong"
    assert second._socket is not left


def test_a_closed_client_refuses_calls(cluster: Cluster) -> None:
    client = cluster.client()
    client.call("ping")
    client.close()
    with pytest.raises(errors.RpcConnectionError, match="closed"):
        client.call("ping")


# ---- garbage on the wire ------------------------------------------------------------------

def _call_bytes(method: str, *args: Any) -> bytes:
    """The bytes a real client sends for ``method(*args)`` on the taskexecutor service (framed)."""
    buf = TTransport.TMemoryBuffer()
    protocol = TMultiplexedProtocol(protocol_factory().getProtocol(LimitedFramedTransport(buf)), "taskexecutor")
    getattr(TaskExecutorService.Client(protocol), f"send_{method}")(*args)
    return buf.getvalue()


def _message_begin(name: str) -> bytes:
    version_call = struct.pack("!i", -2147418112 | 1)  # VERSION_1 | CALL
    encoded = name.encode()
    return version_call + struct.pack("!i", len(encoded)) + encoded + struct.pack("!i", 1)


def _framed(message: bytes) -> bytes:
    """``message`` as one frame: the lengths inside it lie, its frame's does not."""
    return struct.pack("!i", len(message)) + message


def _send_raw(address: str, payload: bytes, *, wait_for_close: bool = True) -> bytes:
    """Send ``payload`` on a fresh connection; return what came back before the server closed it
    (or until a short timeout when the server waits for more bytes)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(payload)
        if not wait_for_close:
            return b""
        s.settimeout(2)
        received = b""
        try:
            while chunk := s.recv(65536):
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return received


GARBAGE = {
    "random-bytes": os.urandom(4096),
    "zeros": b"\x00" * 4096,
    "all-ones": b"\xff" * 4096,
    "http-request": b"GET / HTTP/1.1\r\nHost: localhost\r\nUser-Agent: curl/8\r\n\r\n",
    "http-post": b"POST /jobs HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
    "tls-client-hello": bytes.fromhex("16030100a5010000a10303") + os.urandom(64),
    "huge-name-length": _framed(struct.pack("!i", -2147418112 | 1) + struct.pack("!i", 0x7FFFFFF0) + b"x" * 64),
    "huge-old-style-name": _framed(struct.pack("!i", 0x7FFFFFFF) + b"x" * 64),
    "negative-name-length": _framed(struct.pack("!i", -2147418112 | 1) + struct.pack("!i", -5)),
    "bad-version": _framed(struct.pack("!i", -2147418112 + (7 << 8)) + b"\x00" * 16),
    "huge-string-argument": _framed(_message_begin("taskexecutor:freeSlot") + b"\x0b\x00\x01"
    + struct.pack("!i", 0x7FFFFFF0) + b"abc"),
    "huge-list-argument": _framed(_message_begin("taskexecutor:submitTask") + b"\x0c\x00\x02"  # tdd struct
                                  + b"\x0f\x00\x0c\x0c" + struct.pack("!i", 0x7FFFFFF0)),  # list<struct>, 2**31 items
    "negative-list-length": _framed(_message_begin("taskexecutor:submitTask") + b"\x0c\x00\x02"
                                    + b"\x0f\x00\x0c\x0c" + struct.pack("!i", -1)),
    "unknown-service": _framed(_message_begin("nope:ping") + b"\x00"),
    "no-service-name": _framed(_message_begin("ping") + b"\x00"),
    "unknown-method": _framed(_message_begin("taskexecutor:launchMissiles") + b"\x00"),
    "bad-utf8-name": _framed(struct.pack("!i", -2147418112 | 1) + struct.pack("!i", 4) + b"\xff\xfe\xfd\xfc"
    + struct.pack("!i", 1) + b"\x00"),
    "reply-instead-of-call": _framed(struct.pack("!i", -2147418112 | 2) + struct.pack("!i", 4) + b"ping"
    + struct.pack("!i", 1) + b"\x00"),
    "huge-frame": struct.pack("!i", 0x7FFFFFFF) + b"x" * 64,  # above rpc.max-message-size: not read
    "negative-frame": struct.pack("!i", -5) + b"x" * 64,
}


def test_the_raw_call_helper_speaks_thrift(cluster: Cluster) -> None:
    """Sanity check of the helpers the garbage tests rely on: a well-formed call is answered."""
    host, port = cluster.server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(_call_bytes("ping"))
        wait_until(lambda: any(c[0] == "ping" for c in cluster.handler.calls), 5, "the ping never reached the handler")
        reply = s.recv(65536)
    assert b"ping" in reply and b"pong" in reply


@pytest.mark.parametrize("name", GARBAGE)
def test_garbage_does_not_hurt_the_server(cluster: Cluster, name: str) -> None:
    client = cluster.client()
    assert client.call("ping") == "pong"  # connected before the garbage arrives
    rss_before = psutil.Process().memory_info().rss
    _send_raw(cluster.server.address, GARBAGE[name])
    assert client.call("ping") == "pong"  # the existing connection is unaffected
    assert cluster.client().call("ping") == "pong"  # and new ones are accepted
    assert psutil.Process().memory_info().rss - rss_before < 64 << 20
    assert any(t.name.endswith("-accept") for t in cluster.server_threads())
    # the bad connection was dropped (the two good ones remain)
    wait_until(lambda: cluster.connections() == 2, 5, lambda: f"{cluster.connections()} connections, not 2")


@pytest.mark.parametrize("name", ["huge-name-length", "huge-string-argument", "huge-list-argument",
                                  "http-request", "bad-version", "huge-frame"])
def test_a_declared_length_beyond_the_limit_closes_the_connection_at_once(cluster: Cluster, name: str) -> None:
    started = time.monotonic()
    reply = _send_raw(cluster.server.address, GARBAGE[name])
    assert time.monotonic() - started < 1.5  # closed by the server, not by our read timeout
    assert b"pong" not in reply


def test_a_large_declared_length_under_the_limit_does_not_allocate_it(cluster: Cluster) -> None:
    """The server reads what actually arrives; a peer that promises 200 MB and hangs up costs little."""
    declared = 200 << 20
    assert declared < MAX_STRING_BYTES
    rss_before = psutil.Process().memory_info().rss
    message = _message_begin("taskexecutor:freeSlot") + b"\x0b\x00\x01" + struct.pack("!i", declared)
    payload = struct.pack("!i", len(message) + declared) + message + b"a" * 1000  # a frame of 200 MB, too
    for _ in range(5):
        _send_raw(cluster.server.address, payload, wait_for_close=False)
    wait_until(lambda: cluster.connections() == 0, 5, lambda: f"{cluster.connections()} connections left open")
    assert psutil.Process().memory_info().rss - rss_before < 64 << 20
    assert cluster.client().call("ping") == "pong"


@pytest.mark.parametrize("cut", [1, 3, 4, 10, 20, -1])
def test_a_truncated_message_does_not_hurt_the_server(cluster: Cluster, cut: int) -> None:
    whole = _call_bytes("freeSlot", "token", "alloc-1", "fencing")
    _send_raw(cluster.server.address, whole[:cut], wait_for_close=False)  # then hang up mid-message
    wait_until(lambda: cluster.connections() == 0, 5, lambda: f"{cluster.connections()} connections left open")
    assert cluster.client().call("ping") == "pong"
    assert not any(c[0] == "freeSlot" for c in cluster.handler.calls)


def test_a_connection_that_sends_nothing_does_not_block_others(cluster: Cluster) -> None:
    host, port = cluster.server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5), \
            socket.create_connection((host, int(port)), timeout=5) as half:
        half.sendall(_call_bytes("ping")[:7])
        assert cluster.client().call("ping") == "pong"


# ---- stopping -----------------------------------------------------------------------------

def test_stop_is_prompt_with_connected_clients(cluster: Cluster) -> None:
    clients = [cluster.client() for _ in range(8)]
    for client in clients:
        assert client.call("ping") == "pong"
    host, port = cluster.server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as idle:
        idle.sendall(b"\x80\x01")  # a half-sent message: its thread is blocked reading
        wait_until(lambda: cluster.connections() == 9, 5, lambda: f"{cluster.connections()} connections, not 9")
        assert len(cluster.server_threads()) == 10  # accept + 9 connections
        started = time.monotonic()
        cluster.server.stop()
        assert time.monotonic() - started < 1.0
    assert cluster.server_threads() == []
    for client in clients:
        with pytest.raises(errors.RpcConnectionError):
            client.call("ping")
    cluster.server.stop()  # idempotent


def test_stop_of_an_idle_server_frees_the_port(cluster: Cluster) -> None:
    port = cluster.server.port
    cluster.server.stop()
    assert cluster.server_threads() == []
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_the_server_reports_its_address(cluster: Cluster) -> None:
    assert cluster.server.port > 0
    assert cluster.server.address == f"127.0.0.1:{cluster.server.port}"


# ---- concurrency --------------------------------------------------------------------------

def test_many_clients_from_many_threads(cluster: Cluster) -> None:
    failures: list[str] = []
    barrier = threading.Barrier(16)

    def run(n: int) -> None:
        try:
            client = cluster.client()
            dispatcher = cluster.client(service="dispatcher")
            barrier.wait()
            for i in range(50):
                assert client.call("ping") == "pong"
                job = f"job-{n}-{i}"
                assert JobStatusInfo.from_thrift(dispatcher.call("getJob", "dispatcher-token", job)).job_id == job
                if i % 10 == 0:
                    with pytest.raises(errors.NotFoundError):
                        client.call("cancelTask", "t", f"att-{n}-{i}")
        except BaseException:  # noqa: BLE001 - reported below
            failures.append(traceback.format_exc())

    threads = [threading.Thread(target=run, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert failures == []
    assert sum(1 for c in cluster.handler.calls if c[0] == "ping") == 16 * 50


def test_one_client_shared_by_many_threads(cluster: Cluster) -> None:
    """Calls on a shared client are serialised: every thread gets its own reply."""
    dispatcher = cluster.client(service="dispatcher")
    failures: list[str] = []

    def run(n: int) -> None:
        try:
            for i in range(100):
                job = f"job-{n}-{i}"
                assert JobStatusInfo.from_thrift(dispatcher.call("getJob", "dispatcher-token", job)).job_id == job
        except BaseException:  # noqa: BLE001 - reported below
            failures.append(traceback.format_exc())

    threads = [threading.Thread(target=run, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert failures == []
