"""The REST server's access log: one plain line per request on the ``yarnflow.am.rest.access``
logger. werkzeug's own handler styles its lines with ANSI colour codes for a terminal, whatever
they are written to (they ended up in the AppMaster's log file), and dates them itself. Here:
no colour, control characters of a request line escaped, answered GETs and HEADs at DEBUG (the
web UI polls every few seconds), everything else (changes, errors) at INFO."""

from __future__ import annotations

import logging
from typing import Any

from werkzeug.serving import WSGIRequestHandler

access = logging.getLogger("yarnflow.am.rest.access")


def printable(text: str) -> str:
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


class AccessLogHandler(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        code = str(code)
        quiet = self.command in ("GET", "HEAD") and code[:1] in ("2", "3")
        access.log(logging.DEBUG if quiet else logging.INFO, "%s \"%s\" %s %s", self.address_string(),
                   printable(getattr(self, "requestline", "")), code, size)

    def log(self, type: str, message: str, *args: Any) -> None:  # noqa: A002 - werkzeug's name
        access.log(logging.WARNING if type == "error" else logging.INFO, "%s %s", self.address_string(),
                   printable(message % args if args else message))
