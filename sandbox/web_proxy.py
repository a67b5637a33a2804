"""The sandbox's web application proxy: what YARN's ResourceManager serves on its web port as
``/proxy/<application id>/``, the tracking URL of a running application, together with what
skein's AppMaster serves there, its web UI, whose pages (``ui.add_page(route, target)``) are
proxied under ``pages/<route>/``.

So a user follows the same address here as on a cluster: the application report's tracking URL
(``skein application status``, the ResourceManager's UI) is ``http://<rm>:<port>/proxy/<id>/``,
a page listing the application's linked pages; ``app.ui.get_pages()[route].address`` is
``.../proxy/<id>/pages/<route>/``, which forwards every method, header, query and body to the
page's target and answers what the target answered (its redirects and cookies as they are: a
relative redirect or a cookie without a path stays under the proxy's prefix, as it must on
YARN). An application that is not running, or a route it has no page for, answers 404 with a
line saying so, as YARN's proxy does.

Threads: ``web-proxy`` accepts, one thread per request (``ThreadingHTTPServer``)."""

from __future__ import annotations

import html
import http.client
import http.server
import logging
import threading
import urllib.parse
from typing import Any, Callable

logger = logging.getLogger(__name__)

#: headers that belong to one connection, never forwarded (RFC 9110, 7.6.1)
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "host", "content-length"})
#: how long the target may take to answer
TIMEOUT_S = 60.0
CHUNK = 64 * 1024

#: ``pages(app_id)``: the running application's proxied pages as ``{route: (target, link name)}``;
#: None when no such application runs
Pages = Callable[[str], "dict[str, tuple[str, str]] | None"]


class WebProxy:
    """Serves ``/proxy/<id>/...`` on ``host`` (port 0: any free one) for the applications
    ``pages`` knows. ``start()`` binds (in the caller's network namespace) and serves;
    ``stop()`` closes."""

    def __init__(self, pages: Pages, host: str = "127.0.0.1", port: int = 0) -> None:
        self._pages = pages
        self.host = host
        self.port = port
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def base(self, app_id: str) -> str:
        """The tracking URL of application ``app_id`` (valid after ``bind()``)."""
        return f"http://{self.host}:{self.port}/proxy/{app_id}/"

    def bind(self) -> int:
        """Listen; returns the port. OSError when the port is taken."""
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                proxy._serve(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                logger.debug("web proxy: " + format, *args)

        self._server = http.server.ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        return self.port

    def start(self) -> None:
        assert self._server is not None, "bind() first"
        self._thread = threading.Thread(target=self._server.serve_forever, name="web-proxy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    # -- requests ----------------------------------------------------------------------------
    def _serve(self, req: http.server.BaseHTTPRequestHandler) -> None:
        path, _, query = req.path.partition("?")
        parts = path.split("/", 4)  # "", "proxy", id, "pages"|"", route/rest
        if len(parts) < 3 or parts[1] != "proxy" or not parts[2]:
            return _answer(req, 404, "Not found: the web proxy serves /proxy/<application id>/")
        app_id = parts[2]
        pages = self._pages(app_id)
        if pages is None:
            return _answer(req, 404, f"Application {app_id} is not running (or is unknown): no tracking UI")
        if len(parts) == 3:  # /proxy/<id>: the page's links are relative to the folder
            return _redirect(req, f"/proxy/{app_id}/")
        if len(parts) == 4 and parts[3] == "":
            return self._index(req, app_id, pages)
        if parts[3] != "pages" or len(parts) < 5:
            return _answer(req, 404, f"Not found: {path} (application {app_id} serves pages/<route>/)")
        route, slash, rest = parts[4].partition("/")
        if route not in pages:
            return _answer(req, 404, f"Application {app_id} has no page {route!r} (its pages: {sorted(pages)})")
        if not slash:  # pages/<route>: relative links of the target's root need the slash
            return _redirect(req, f"/proxy/{app_id}/pages/{route}/" + (f"?{query}" if query else ""))
        self._forward(req, pages[route][0], "/" + rest + (f"?{query}" if query else ""))

    def _index(self, req: http.server.BaseHTTPRequestHandler, app_id: str, pages: dict[str, tuple[str, str]]) -> None:
        links = "".join(f'<li><a href="pages/{urllib.parse.quote(route)}/">{html.escape(name)}</a></li>'
                        for route, (_, name) in sorted(pages.items()) if name)
        head = f'<title>{html.escape(app_id)}</title><link rel="icon" href="data:,">'  # (no /favicon.ico 404)
        body = (f'<!doctype html><html lang="en"><head>{head}</head><body>'
                f'<h1>Application {html.escape(app_id)}</h1><ul id="pages">{links}</ul></body></html>').encode()
        req.send_response(200)
        req.send_header("Content-Type", "text/html; charset=utf-8")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        if req.command != "HEAD":
            req.wfile.write(body)

    def _forward(self, req: http.server.BaseHTTPRequestHandler, target: str, rest: str) -> None:
        url = urllib.parse.urlsplit(target)
        conn_type = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length > 0 else None
        headers = {k: v for k, v in req.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["X-Forwarded-Host"] = req.headers.get("Host", f"{self.host}:{self.port}")
        conn = conn_type(url.hostname or "127.0.0.1", url.port, timeout=TIMEOUT_S)
        started = False
        try:
            conn.request(req.command, url.path.rstrip("/") + rest, body=body, headers=headers)
            answer = conn.getresponse()
            bodyless = req.command == "HEAD" or answer.status in (204, 304) or answer.status < 200
            req.send_response(answer.status, answer.reason)
            started = True
            for k, v in answer.getheaders():
                if k.lower() not in HOP_BY_HOP:
                    req.send_header(k, v)
            if bodyless:
                req.send_header("Content-Length", "0")
                req.end_headers()
                return
            req.send_header("Transfer-Encoding", "chunked")  # (streamed: a log may be large)
            req.end_headers()
            while chunk := answer.read(CHUNK):
                req.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            req.wfile.write(b"0\r\n\r\n")
        except OSError as exc:
            logger.info("web proxy: %s %s%s failed: %s", req.command, target, rest, exc)
            if started:  # (half an answer cannot be taken back: the connection ends)
                req.close_connection = True
            else:
                _answer(req, 502, f"The application's page {target} did not answer: {exc}")
        finally:
            conn.close()


def _answer(req: http.server.BaseHTTPRequestHandler, status: int, text: str) -> None:
    body = (text + "\n").encode()
    try:
        req.send_response(status)
        req.send_header("Content-Type", "text/plain; charset=utf-8")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        if req.command != "HEAD":
            req.wfile.write(body)
    except OSError:
        pass  # (the client went)


def _redirect(req: http.server.BaseHTTPRequestHandler, location: str) -> None:
    req.send_response(302)
    req.send_header("Location", location)
    req.send_header("Content-Length", "0")
    req.end_headers()
