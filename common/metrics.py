"""What the AppMaster and the TaskExecutors share for metrics: binding a server to the first
free port of a configured range, and the Prometheus endpoint (prometheus-client) each process
serves when ``metrics.reporters`` is ``prom``.

Metric names follow Flink's Prometheus reporter: the scope joined by ``_`` and the metric's
Flink name (``yarnflow_taskmanager_job_task_operator_numRecordsIn``), with the scope's variables
as labels (``job_id``, ``task_name``, ``subtask_index``, ``operator_name``, ``tm_id``). Figures
that are counters in Flink (records and bytes in and out, late records dropped) are Prometheus
counters, so ``rate()`` and ``increase()`` are right across restarts: their samples carry the
``_total`` suffix (``..._numRecordsIn_total``; Flink's reporter exports them as gauges without
it). The rest are gauges, and checkpoint durations a histogram.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from typing import Any, Callable, Iterable, Iterator, TypeVar

from yarnflow.common.config import Configuration, Options

log = logging.getLogger(__name__)
S = TypeVar("S")

PREFIX = "yarnflow"


def bind_first_free(ports: tuple[int, int], bind: Callable[[int], S], what: str) -> tuple[S, int]:
    """``bind(port)`` for each port of the range until one is free; when none is, any free port
    (port 0), logged. Returns the server and the port asked for (0: an ephemeral one). Errors
    other than "address in use" are raised."""
    low, high = ports
    for port in range(low, high + 1) if low else ():
        try:
            return bind(port), port
        except OSError as exc:
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
    if low:
        log.warning("%s: every port of %d-%d is taken: using any free port", what, low, high)
    return bind(0), 0


def free_port_range(size: int, start: int = 20000) -> tuple[int, int]:
    """``size`` consecutive loopback ports that are free now, from ``start`` on (for a range
    setting that must not meet other processes: benchmarks and tests)."""
    import socket

    for low in range(start, 65535 - size, size):
        socks: list[socket.socket] = []
        try:
            for port in range(low, low + size):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return low, low + size - 1
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise OSError(errno.EADDRINUSE, f"no {size} consecutive free ports")


class _Collector:
    """Calls ``collect`` at each scrape: the figures are read live, never copied in advance."""

    def __init__(self, collect: Callable[[], Iterable[Any]]) -> None:
        self._collect = collect

    def collect(self) -> Iterator[Any]:
        try:
            yield from self._collect()
        except Exception:  # noqa: BLE001 - a failed read must not break the endpoint
            log.warning("reading metrics failed", exc_info=True)

    def describe(self) -> list[Any]:
        return []  # no eager collect at registration


class PrometheusEndpoint:
    """A prometheus-client HTTP server of this process, on the first free port of
    ``metrics.reporter.prom.port``."""

    def __init__(self, server: Any, thread: Any, host: str, port: int) -> None:
        self._server = server
        self._thread = thread
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def stop(self) -> None:
        stop_http_server(self._server, self._thread)


def stop_http_server(server: Any, thread: Any, timeout_s: float = 5.0) -> None:
    """Stop a plain-HTTP ``socketserver`` serving on ``thread`` at once: its ``shutdown()`` only
    takes effect at the serving loop's next poll (every 0.5 s in prometheus-client's server),
    so connections to the server's own port wake the loop until it has seen the request."""
    import socket

    stopper = threading.Thread(target=server.shutdown, name="http-server-stop", daemon=True)
    stopper.start()
    host, port = server.server_address[:2]
    deadline = time.monotonic() + timeout_s
    while stopper.is_alive() and time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=0.2).close()
        except OSError:
            pass
        stopper.join(0.01)
    server.server_close()
    thread.join(max(0.0, deadline - time.monotonic()))


def _authorized(header: str, token: str) -> bool:
    from yarnflow.common.security import token_in_header, token_matches

    return token_matches(token_in_header(header), token)


def _serve(port: int, host: str, registry: Any, token: str) -> tuple[Any, threading.Thread]:
    """prometheus-client's WSGI app on a threading server (as its ``start_http_server``), behind
    the token check when there is a token."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer

    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if token and not _authorized(environ.get("HTTP_AUTHORIZATION", ""), token):
            start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                                ("WWW-Authenticate", 'Basic realm="yarnflow"')])
            return [b"the cluster's REST token is needed: Authorization: Bearer <token> (or as the password "
                    b"of HTTP basic)\n"]
        return metrics(environ, start_response)

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

    server = make_server(host, port, app, ThreadingWSGIServer, handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, name="prometheus-server", daemon=True)
    thread.start()
    return server, thread


def metrics_address(endpoint: PrometheusEndpoint | None, rpc_address: str) -> str:
    """Where a Prometheus on another host scrapes ``endpoint`` (host:port; "" without one): its
    host, or the process's RPC host when it listens on every interface."""
    if endpoint is None:
        return ""
    host = endpoint.host if endpoint.host not in ("", "0.0.0.0", "::") else rpc_address.rsplit(":", 1)[0]
    return f"{host}:{endpoint.port}"


def start_prometheus(config: Configuration, collect: Callable[[], Iterable[Any]], what: str, token: str = ""
                     ) -> PrometheusEndpoint | None:
    """The Prometheus endpoint of this process (None when ``metrics.reporters`` has no
    ``prom``). ``collect()`` yields prometheus-client metric families at each scrape. With a
    ``token`` (the cluster's REST token, when its REST API asks for one) a scrape must carry it,
    as the REST API's requests do: ``Authorization: Bearer <token>`` (Prometheus's
    ``authorization`` scrape setting) or as the password of HTTP basic (``basic_auth``)."""
    if config[Options.METRICS_REPORTERS] != "prom":
        return None
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(collect))
    host = str(config[Options.PROM_HOST]) or "127.0.0.1"
    (server, thread), _ = bind_first_free(config[Options.PROM_PORT],
                                          lambda port: _serve(port, host, registry, token), what)
    endpoint = PrometheusEndpoint(server, thread, host, server.server_address[1])
    log.info("%s: Prometheus metrics at %s", what, endpoint.url)
    return endpoint


def counter(name: str, doc: str, labels: Iterable[str]) -> Any:
    """A counter family (its samples are named ``<name>_total``)."""
    from prometheus_client.core import CounterMetricFamily

    return CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))


def gauge(name: str, doc: str, labels: Iterable[str]) -> Any:
    """A gauge family named after Flink's scope and metric name."""
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))
