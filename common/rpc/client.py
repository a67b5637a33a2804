"""A Thrift client for one service at one address, safe to share between threads.

Calls are serialised over one connection, opened lazily and re-opened after a transport
error. Every error is translated into the project's own exceptions (``rpc.errors``). With
``tls`` (the cluster's credentials) the connection is mutual TLS."""

from __future__ import annotations

import atexit
import logging
import select
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from thrift.protocol.TMultiplexedProtocol import TMultiplexedProtocol
from thrift.transport import TSocket, TTransport

from yarnflow.common.errors import RpcConnectionError
from yarnflow.common.rpc.errors import from_wire_error
from yarnflow.common.rpc.limits import LimitedFramedTransport
from yarnflow.common.rpc.server import protocol_factory

if TYPE_CHECKING:
    from yarnflow.common.security import TlsCredentials

# TSocket logs every failed connect at ERROR; callers get a RpcConnectionError instead.
logging.getLogger("thrift.transport.TSocket").setLevel(logging.CRITICAL)


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise RpcConnectionError(f"bad address {address!r}: expected HOST:PORT")
    return host, int(port)


class RpcClient:
    def __init__(self, address: str, service: str, client_cls: type, timeout_ms: int = 10_000,
                 connect_timeout_ms: int | None = None, tls: TlsCredentials | None = None) -> None:
        self.address = address
        self._tls = tls
        self._host, self._port = split_address(address)
        self._service = service
        self._client_cls = client_cls
        self._timeout_ms = timeout_ms
        self._connect_timeout_ms = connect_timeout_ms or min(timeout_ms, 5000)
        self._lock = threading.Lock()
        self._transport: TTransport.TTransportBase | None = None
        self._socket: TSocket.TSocket | None = None
        self._client: Any = None
        self._closed = False
        self._answered = False  # the connection's last call got its answer (it may be reused)

    def _connect(self) -> Any:
        if self._closed:
            raise RpcConnectionError(f"client for {self.address} is closed")
        idle = _IDLE.take(self._pool_key)
        if idle is not None:  # (an earlier client's connection: no connect, no handshake)
            sock, transport = idle
            sock.setTimeout(self._timeout_ms)
            protocol = TMultiplexedProtocol(protocol_factory().getProtocol(transport), self._service)
            self._socket, self._transport = sock, transport
            self._client = self._client_cls(protocol)
            return self._client
        sock = TSocket.TSocket(self._host, self._port)
        sock.setTimeout(self._connect_timeout_ms)
        transport = LimitedFramedTransport(sock)
        try:
            transport.open()
        except Exception as exc:
            # Nothing was sent: even a connect that timed out means the peer cannot be reached.
            reason = getattr(exc, "message", None) or exc
            raise RpcConnectionError(f"cannot reach {self.address}: {reason}") from None
        if self._tls is not None:
            try:
                # (resuming an earlier connection's session to this address: ~1 ms instead of ~3)
                sock.handle = self._tls.client_context().wrap_socket(sock.handle,
                                                                     session=self._tls.session(self.address))
            except (OSError, ssl.SSLError) as exc:
                transport.close()
                reason = getattr(exc, "reason", None) or exc
                raise RpcConnectionError(f"cannot reach {self.address}: the TLS handshake failed ({reason}): is it "
                                         "a cluster with other credentials, or without TLS?") from None
        if sock.handle is not None:
            sock.handle.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setTimeout(self._timeout_ms)
        protocol = TMultiplexedProtocol(protocol_factory().getProtocol(transport), self._service)
        self._socket, self._transport = sock, transport
        self._client = self._client_cls(protocol)
        return self._client

    def _drop(self) -> None:
        if self._transport is not None:
            try:
                self._transport.close()
            except Exception:
                pass
        self._transport = self._client = self._socket = None

    def call(self, method: str, *args: Any, timeout_ms: int | None = None) -> Any:
        with self._lock:
            client = self._client or self._connect()
            if timeout_ms is not None and self._socket is not None:
                self._socket.setTimeout(timeout_ms)
            try:
                self._answered = False
                result = getattr(client, method)(*args)
                self._answered = True
                if self._tls is not None and self._socket is not None and self._socket.handle is not None:
                    # (a TLS 1.3 session is known once the server's first answer was read)
                    self._tls.remember_session(self.address, self._socket.handle)
                return result
            except Exception as exc:
                self._answered = _is_declared(exc)  # (a declared error's answer was read whole)
                translated = from_wire_error(exc, self.address)
                if not _is_declared(exc):
                    self._drop()  # the connection's state is unknown: start afresh next time
                if self._tls is None and isinstance(translated, RpcConnectionError) and \
                        "unexpected exception" in str(translated):
                    translated = RpcConnectionError(
                        f"{translated}: it closed the connection at once, as a cluster with mutual TLS does to a "
                        "client without its credentials (security.ssl.internal.cert-file and .key-file, or those "
                        "a session on this machine published; docs/security.md)")
                raise translated from None
            finally:
                if timeout_ms is not None and self._socket is not None:
                    self._socket.setTimeout(self._timeout_ms)

    def method(self, name: str) -> Callable[..., Any]:
        return lambda *args: self.call(name, *args)

    def close(self) -> None:
        """Close the client; its connection, when it is sound, is kept for the next client of
        the same service at the same address (``_IdleConnections``)."""
        with self._lock:
            self._closed = True
            # (only a connection whose last call was answered: one interrupted mid-call, by a
            # Ctrl-C say, may still get that answer, which the next client would read as its own)
            if self._answered and self._socket is not None and self._transport is not None and _IDLE.give(
                    self._pool_key, self._socket, self._transport):
                self._transport = self._client = self._socket = None
                return
            self._drop()

    @property
    def _pool_key(self) -> tuple[str, str, str]:
        # (by the credentials' files, not the object: a connection is only handed to a client
        # holding the credentials it was authenticated with)
        tls = f"{self._tls.cert_file}\0{self._tls.key_file}" if self._tls is not None else ""
        return self.address, self._service, tls


class _IdleConnections:
    """Connections of closed clients, kept (``PER_KEY`` at most, ``MAX_IDLE_S`` at most) for the
    next client of the same service, address and credentials. Each job opens its own clients
    between its JobMaster and its TaskExecutors; without this, each job paid a TCP connect and,
    with TLS, a handshake both ways (issue 54). A connection is never shared: one client uses it
    at a time. One the server closed meanwhile (readable while idle: its end, or stray bytes) is
    dropped, not reused."""

    PER_KEY = 2
    TOTAL = 32
    MAX_IDLE_S = 30.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, str, str], list[tuple[float, Any, Any]]] = {}

    def give(self, key: tuple[str, str, str], sock: Any, transport: Any) -> bool:
        if sock.handle is None:
            return False
        now, expired = time.monotonic(), []
        with self._lock:
            for k in list(self._idle):  # (kept ones of servers long gone are closed here)
                fresh = [e for e in self._idle[k] if now - e[0] <= self.MAX_IDLE_S]
                expired += [e for e in self._idle[k] if now - e[0] > self.MAX_IDLE_S]
                if fresh:
                    self._idle[k] = fresh
                else:
                    del self._idle[k]
            kept = self._idle.setdefault(key, [])
            total = sum(len(v) for v in self._idle.values())
            accepted = len(kept) < self.PER_KEY and total < self.TOTAL
            if accepted:
                kept.append((now, sock, transport))
        for _, _, old in expired:
            _close_quietly(old)
        return accepted

    def take(self, key: tuple[str, str, str]) -> tuple[Any, Any] | None:
        now = time.monotonic()
        while True:
            with self._lock:
                kept = self._idle.get(key)
                if not kept:
                    return None
                since, sock, transport = kept.pop()
            if now - since <= self.MAX_IDLE_S and not _dropped(sock.handle):
                return sock, transport
            _close_quietly(transport)

    def close_all(self) -> None:
        with self._lock:
            kept, self._idle = self._idle, {}
        for entries in kept.values():
            for _, _, transport in entries:
                _close_quietly(transport)


def _close_quietly(transport: Any) -> None:
    try:
        transport.close()
    except Exception:  # noqa: BLE001 - already gone
        pass


def _dropped(handle: Any) -> bool:
    """Whether an idle connection can no longer be used: closed, or readable (an idle
    connection has nothing to read unless the peer closed it)."""
    if handle is None or handle.fileno() < 0:
        return True
    try:
        readable, _, _ = select.select([handle], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


_IDLE = _IdleConnections()
atexit.register(_IDLE.close_all)


def _is_declared(exc: BaseException) -> bool:
    from yarnflow.common.rpc.gen.yarnflow_rpc.ttypes import RpcError

    return isinstance(exc, RpcError)
