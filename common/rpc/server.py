"""A Thrift server that starts and stops cleanly.

One listening socket serves several services multiplexed by name (``TMultiplexedProcessor``);
services come and go while it serves (``register`` / ``unregister``: the AppMaster serves each
JobMaster as a service of its own), and a call to a service that is not there is answered by the
``fallback`` of its name's prefix (``jobmaster/<job id>`` -> ``jobmaster``) when one is set.
Each connection gets its own thread (clients keep their connections open). ``stop()`` closes
the listening socket and every open connection, so no thread outlives the server.

Bad bytes on the wire end that one connection, never the server: calls are framed, and a
message's size, its strings, its containers and how deep they nest are limited (``limits``) so
garbage cannot make it allocate gigabytes or recurse without end.

With ``tls`` (the cluster's credentials) every connection must complete a mutual TLS handshake
with the cluster's certificate before a byte is read; the handshake runs on the connection's
own thread with a deadline, and a refused peer is logged once per host.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import TYPE_CHECKING, Any, Mapping

from thrift.protocol.TBinaryProtocol import TBinaryProtocolAcceleratedFactory
from thrift.protocol.TMultiplexedProtocol import SEPARATOR
from thrift.protocol.TProtocol import TProtocolException
from thrift.Thrift import TApplicationException, TMessageType, TType
from thrift.TMultiplexedProcessor import TMultiplexedProcessor
from thrift.transport import TSocket, TTransport

from yarnflow.common.rpc.limits import LimitedFramedTransportFactory, RpcLimits

if TYPE_CHECKING:
    from yarnflow.common.security import TlsCredentials

log = logging.getLogger(__name__)

MAX_STRING_BYTES = RpcLimits.max_string_bytes
MAX_CONTAINER_ITEMS = RpcLimits.max_container_items


def protocol_factory(max_string_bytes: int = MAX_STRING_BYTES,
                     max_container_items: int = MAX_CONTAINER_ITEMS) -> TBinaryProtocolAcceleratedFactory:
    return TBinaryProtocolAcceleratedFactory(
        string_length_limit=max_string_bytes, container_length_limit=max_container_items)


class _Multiplexer(TMultiplexedProcessor):  # type: ignore[misc]  # thrift is untyped
    """TMultiplexedProcessor with fallbacks for services that are not (or no longer) there, and
    without its per-call cost: Thrift's own wraps the input protocol in a ``TProtocolDecorator``
    for every call, which makes a new class each time (about a third of a heartbeat's time on
    the server); this hands the call straight to the generated processor's method table."""

    def __init__(self) -> None:
        super().__init__()
        self.fallbacks: dict[str, Any] = {}

    def process(self, iprot: Any, oprot: Any) -> Any:
        name, kind, seqid = iprot.readMessageBegin()
        service, sep, call = name.partition(SEPARATOR)
        processor = self.services.get(service) or self.fallbacks.get(service.split("/", 1)[0])
        if not sep or processor is None:
            raise TProtocolException(TProtocolException.NOT_IMPLEMENTED, f"no service {service!r} here")
        handle = processor._processMap.get(call)
        if handle is None:  # as the generated processor answers an unknown method
            iprot.skip(TType.STRUCT)
            iprot.readMessageEnd()
            error = TApplicationException(TApplicationException.UNKNOWN_METHOD, f"Unknown function {call}")
            oprot.writeMessageBegin(call, TMessageType.EXCEPTION, seqid)
            error.write(oprot)
            oprot.writeMessageEnd()
            oprot.trans.flush()
            return None
        return handle(processor, seqid, iprot, oprot)


class _PerHost:
    """Connections dropped for a protocol error, logged at WARNING for the first from a host
    and at DEBUG after it (a fuzzer or a stray client must not flood the log)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def note(self, client: Any, exc: BaseException) -> None:
        try:
            host = str(client.handle.getpeername()[0])
        except (OSError, AttributeError):
            host = "?"
        with self._lock:
            n = self._seen[host] = self._seen.get(host, 0) + 1
        if n == 1:
            log.warning("%s: dropping a connection from %s after a protocol error: %s (further ones from that "
                        "host are logged at DEBUG)", self._name, host, exc)
        else:
            log.debug("%s: dropping connection %d from %s after a protocol error: %s", self._name, n, host, exc)


class RpcServer:
    """Serves ``services`` (name -> Thrift processor) on ``host:port`` (port 0: a free one)."""

    def __init__(self, host: str, port: int, services: Mapping[str, Any], name: str = "rpc",
                 tls: TlsCredentials | None = None, limits: RpcLimits = RpcLimits()) -> None:
        self._tls = tls
        self._handshakes: Any = None
        if tls is not None:
            from yarnflow.common.security import HandshakeLog

            self._handshakes = HandshakeLog(name)
        self._protocol_errors = _PerHost(name)
        self._processor = _Multiplexer()
        for service_name, processor in services.items():
            self._processor.registerProcessor(service_name, processor)
        self._name = name
        self._listen = TSocket.TServerSocket(host=host, port=port)
        self._tfactory = LimitedFramedTransportFactory(limits)
        self._pfactory = protocol_factory(limits.max_string_bytes, limits.max_container_items)
        self._lock = threading.Lock()
        self._clients: set[TTransport.TTransportBase] = set()
        self._threads: set[threading.Thread] = set()
        self._stopped = threading.Event()
        self._accept_thread: threading.Thread | None = None
        self.host = host
        self.port = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def register(self, service: str, processor: Any) -> None:
        """Serve ``service`` from now on (replacing one of that name)."""
        self._processor.services[service] = processor

    def unregister(self, service: str, processor: Any) -> None:
        """Stop serving ``service``, if ``processor`` still serves it (not a newer one)."""
        if self._processor.services.get(service) is processor:
            del self._processor.services[service]

    def fallback(self, prefix: str, processor: Any) -> None:
        """Answer calls to an absent ``<prefix>/...`` service with ``processor``."""
        self._processor.fallbacks[prefix] = processor

    def start(self) -> RpcServer:
        try:
            self._listen.listen()
        except OSError as exc:
            self._listen.close()
            raise OSError(exc.errno, f"{self._name} cannot listen on {self.host}:{self._listen.port}: "
                                     f"{exc.strerror or exc}") from exc
        sock = self._listen.handle
        assert sock is not None
        self.port = sock.getsockname()[1]
        self._accept_thread = threading.Thread(target=self._accept_loop, name=f"{self._name}-accept",
                                               daemon=True)
        self._accept_thread.start()
        log.info("%s serving on %s", self._name, self.address)
        return self

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client = self._listen.accept()
            except Exception:  # the listening socket was closed by stop()
                if self._stopped.is_set():
                    return
                log.debug("%s: accept failed", self._name, exc_info=True)
                continue
            if client is None:
                continue
            if client.handle is not None:
                client.handle.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = threading.Thread(target=self._serve, args=(client,), name=f"{self._name}-conn", daemon=True)
            with self._lock:
                if self._stopped.is_set():
                    client.close()
                    return
                self._clients.add(client)
                self._threads.add(t)
            t.start()

    def _serve(self, client: TTransport.TTransportBase) -> None:
        if self._tls is not None and not self._handshake(client):
            return
        itrans = self._tfactory.getTransport(client)
        otrans = self._tfactory.getTransport(client)
        iprot = self._pfactory.getProtocol(itrans)
        oprot = self._pfactory.getProtocol(otrans)
        try:
            while not self._stopped.is_set():
                self._processor.process(iprot, oprot)
        except TTransport.TTransportException as exc:
            if exc.type in (TTransport.TTransportException.SIZE_LIMIT, TTransport.TTransportException.NEGATIVE_SIZE) \
                    and not self._stopped.is_set():
                self._protocol_errors.note(client, exc)  # else the client went away
        except Exception as exc:  # garbage on the wire, or a protocol error: drop this connection
            if not self._stopped.is_set():
                self._protocol_errors.note(client, exc)
        finally:
            itrans.close()
            otrans.close()
            with self._lock:
                self._clients.discard(client)
                self._threads.discard(threading.current_thread())

    def _handshake(self, client: Any) -> bool:
        from yarnflow.common.security import server_handshake

        assert self._tls is not None
        try:
            host, port = client.handle.getpeername()[:2]
            peer = f"{host}:{port}"
        except OSError:
            peer = "?"
        try:
            server_handshake(client, self._tls)
            return True
        except Exception as exc:  # noqa: BLE001 - not a peer of the cluster (or gone): refused
            if not self._stopped.is_set():
                self._handshakes.refused(peer, exc)
            client.close()
            with self._lock:
                self._clients.discard(client)
                self._threads.discard(threading.current_thread())
            return False

    def stop(self, timeout: float = 5.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        try:
            if self._listen.handle is not None:
                self._listen.handle.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listen.close()
        with self._lock:
            clients = list(self._clients)
            threads = list(self._threads)
        for client in clients:
            try:
                if client.handle is not None:
                    client.handle.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            client.close()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout)
        for t in threads:
            t.join(timeout)
        log.info("%s stopped", self._name)
