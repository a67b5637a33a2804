"""Mutual TLS on the RPC layer over real loopback Thrift (issue 31): an RpcServer with the
cluster's credentials serves clients holding them; a client without TLS, with another
cluster's certificate, or one that connects and says nothing is refused at the handshake
without holding up anyone else, and each refusing host is logged once. Also how a process
finds its credentials (configuration, a local session's published folder)."""

from __future__ import annotations

import logging
import os
import socket
import stat
import struct
import threading
import time
from typing import Any

import pytest

from tests.integration.test_rpc import TaskExecutorHandler
from yarnflow.common import errors
from yarnflow.common.config import Configuration
from yarnflow.common.rpc.client import RpcClient
from yarnflow.common.rpc.gen.yarnflow_rpc import TaskExecutorService
from yarnflow.common.rpc.limits import RpcLimits
from yarnflow.common.rpc.server import RpcServer
from yarnflow.common.security import (
    client_credentials,
    internal_credentials,
    new_credentials,
    publish,
    published_folder,
    unpublish,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def served(tmp_path: Any) -> Any:
    creds = new_credentials(str(tmp_path / "cluster"))
    handler = TaskExecutorHandler()
    server = RpcServer("127.0.0.1", 0, {"taskexecutor": TaskExecutorService.Processor(handler)}, name="te-test",
                       tls=creds).start()
    yield server, creds, handler
    server.stop()


def _client(server: RpcServer, tls: Any) -> RpcClient:
    return RpcClient(server.address, "taskexecutor", TaskExecutorService.Client, 3000, tls=tls)


def test_the_credentials_are_readable_by_their_owner_only(tmp_path: Any) -> None:
    creds = new_credentials(str(tmp_path / "c"))
    assert stat.S_IMODE(os.stat(creds.key_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "c").st_mode) == 0o700
    assert b"BEGIN CERTIFICATE" in creds.cert_pem and b"PRIVATE KEY" in creds.key_pem


def test_a_client_with_the_clusters_credentials_is_served(served: Any) -> None:
    server, creds, handler = served
    client = _client(server, creds)
    for _ in range(3):  # one connection, kept
        client.call("ping")
    assert [c[0] for c in handler.calls] == ["ping"] * 3
    client.close()


def test_a_new_connection_resumes_the_last_tls_session_and_a_process_loads_its_credentials_once(
        served: Any, tmp_path: Any) -> None:
    """Issue 54: every job opens new connections between its JobMaster and TaskExecutors; with
    TLS on each one's full handshake (certificates, key exchange) took ~3 ms. A process now loads
    its credentials once (files unchanged), and a client resumes the session of the last
    connection to the same address (~1 ms): still only with the cluster's credentials."""
    server, creds, handler = served
    first = _client(server, creds)
    first.call("ping")
    assert not first._socket.handle.session_reused
    first._drop()  # (a connection of its own closed: not kept for the next client, see test_rpc.py)
    first.close()
    second = _client(server, creds)
    second.call("ping")
    assert second._socket.handle.session_reused
    second.close()
    assert [c[0] for c in handler.calls] == ["ping", "ping"]

    conf = Configuration.load({"security.ssl.internal.enabled": "true", "security.ssl.internal.cert-file":
                               creds.cert_file, "security.ssl.internal.key-file": creds.key_file})
    assert internal_credentials(conf) is internal_credentials(conf)
    other = new_credentials(str(tmp_path / "other"))  # another cluster's: no session of this one's to resume
    stranger = _client(server, other)
    with pytest.raises(errors.RpcConnectionError, match="handshake"):
        stranger.call("ping")
    stranger.close()


def test_clients_without_them_are_refused_and_logged_once_per_host(served: Any, tmp_path: Any,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    server, creds, handler = served
    other = new_credentials(str(tmp_path / "other"))
    caplog.set_level(logging.DEBUG, logger="yarnflow.common.security")
    for tls in (None, other, None, other):
        client = _client(server, tls)
        with pytest.raises(errors.RpcConnectionError):
            client.call("ping")
        client.close()
    assert handler.calls == []
    time.sleep(0.2)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "refused a connection" in r.message]
    assert len(warnings) == 1 and "te-test" in warnings[0].message
    assert sum("refused connection" in r.message for r in caplog.records if r.levelno == logging.DEBUG) >= 2
    assert not any(r.exc_info for r in caplog.records)  # no traceback


def test_a_silent_connection_does_not_hold_up_others(served: Any) -> None:
    server, creds, handler = served
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=5)  # never starts a handshake
    try:
        client = _client(server, creds)
        started = time.monotonic()
        client.call("ping")
        assert time.monotonic() - started < 2.0
        client.close()
    finally:
        silent.close()


def test_a_server_stops_with_connections_in_their_handshake(tmp_path: Any) -> None:
    creds = new_credentials(str(tmp_path / "cluster"))
    server = RpcServer("127.0.0.1", 0, {"taskexecutor": TaskExecutorService.Processor(TaskExecutorHandler())},
                       name="te-stop", tls=creds).start()
    sockets = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(3)]
    time.sleep(0.1)
    before = threading.active_count()
    server.stop(timeout=15)
    assert threading.active_count() <= before
    for s in sockets:
        s.close()


def test_how_a_process_finds_its_credentials(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YARNFLOW_HOME", str(tmp_path / "home"))
    assert internal_credentials(Configuration.load({})) is None
    with pytest.raises(errors.ConfigurationError, match="give both"):
        internal_credentials(Configuration.load({"security.ssl.internal.enabled": "true"}))
    creds = new_credentials(str(tmp_path / "cluster"))
    given = Configuration.load({"security.ssl.internal.enabled": "true",
                                "security.ssl.internal.cert-file": creds.cert_file,
                                "security.ssl.internal.key-file": creds.key_file})
    assert internal_credentials(given) == creds
    # a client of a local session: none configured, the session's published ones by its address
    assert client_credentials(Configuration.load({}), "127.0.0.1:5000") is None
    folder = publish(creds, "127.0.0.1:5000")
    assert folder == published_folder("127.0.0.1:5000") and stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    found = client_credentials(Configuration.load({}), "127.0.0.1:5000")
    assert found is not None and found.cert_pem == creds.cert_pem
    with pytest.raises(errors.ConfigurationError, match="no credentials for the cluster at 127.0.0.1:6000"):
        client_credentials(Configuration.load({"security.ssl.internal.enabled": "true"}), "127.0.0.1:6000")
    unpublish("127.0.0.1:5000")
    assert client_credentials(Configuration.load({}), "127.0.0.1:5000") is None


def _deep_call(depth: int) -> bytes:
    """A framed cancelTask call carrying, in a field the server does not know, lists nested ``depth`` deep."""
    name = b"taskexecutor:cancelTask"
    body = (struct.pack("!i", -2147418112 | 1) + struct.pack("!i", len(name)) + name + struct.pack("!i", 1)
            + b"\x0f" + struct.pack("!h", 99) + (b"\x0f" + struct.pack("!i", 1)) * (depth - 1) + b"\x08"
            + struct.pack("!i", 0) + b"\x00")
    return struct.pack("!i", len(body)) + body


def _answered(server: RpcServer, payload: bytes) -> bool:
    """Whether the server answers ``payload`` (a handler's answer) or drops the connection."""
    with socket.create_connection((server.host, server.port), timeout=5) as s:
        s.sendall(payload)
        try:
            return bool(s.recv(4))
        except ConnectionResetError:
            return False


@pytest.mark.parametrize("depth_limit", [64, 8])
def test_a_call_beyond_the_servers_limits_ends_its_connection_and_the_server_serves_on(
        depth_limit: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="yarnflow.common.rpc.server")
    handler = TaskExecutorHandler()
    limits = RpcLimits(max_message_bytes=20_000, max_string_bytes=1000, max_container_items=10,
                       max_nesting_depth=depth_limit)
    server = RpcServer("127.0.0.1", 0, {"taskexecutor": TaskExecutorService.Processor(handler)}, name="te-limits",
                       limits=limits).start()
    try:
        client = _client(server, None)
        for too_big in ("x" * 5000, "x" * 50_000):  # rpc.max-string-size, then rpc.max-message-size
            with pytest.raises(errors.YarnflowError) as refused:
                client.call("cancelTask", "tok", too_big)
            assert not isinstance(refused.value, errors.NotFoundError)  # never reached the handler
        assert handler.calls == []
        with pytest.raises(errors.NotFoundError):  # a call within the limits is answered
            client.call("cancelTask", "tok", "a1")
        # nesting: exactly at the limit is decoded (the unknown field skipped) and answered,
        # one level deeper ends the connection: Thrift's decoder at 64, the scan below it
        assert _answered(server, _deep_call(depth_limit - 1))  # the arguments struct is one level
        assert not _answered(server, _deep_call(depth_limit))
        assert not _answered(server, struct.pack("!i", 1 << 29) + b"\x80")  # a frame declared huge: not awaited
        with pytest.raises(errors.NotFoundError):
            client.call("cancelTask", "tok", "a1")
        client.close()
    finally:
        server.stop()
    dropped = [r for r in caplog.records if "dropping" in r.getMessage()]
    assert [r.levelno for r in dropped] == [logging.WARNING] + [logging.DEBUG] * 3  # once per host, then DEBUG
    said = " ".join(r.getMessage() for r in dropped)
    assert "above rpc.max-message-size (20000)" in said
    assert ("rpc.max-nesting-depth (8)" if depth_limit == 8 else "Maximum recursion depth exceeded") in said
