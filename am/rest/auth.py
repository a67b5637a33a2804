"""Who may use the REST API and web UI (``rest.authentication``), and HTTPS for them
(``security.ssl.rest.*``); see docs/security.md.

The token is the cluster's (``security.rest_token``: derived from its private key), so every
AppMaster of a cluster checks the same one and a client holding the credentials knows it. A
request carries it as ``Authorization: Bearer <token>``, as the password of HTTP basic (any
user name: ``curl -u yarnflow:<token>``), or in the ``yarnflow-token`` cookie that the login
page sets for the web UI (HttpOnly, SameSite=Strict; Secure over HTTPS).
"""

from __future__ import annotations

import logging
import re
import ssl
from typing import Any

from flask import Flask, Response, jsonify, redirect, request

from yarnflow.common.config import Configuration, Options
from yarnflow.common.errors import ConfigurationError
from yarnflow.common.security import TlsCredentials, token_in_header, token_matches
from yarnflow.common.security import rest_auth_token as rest_auth_token

log = logging.getLogger(__name__)

COOKIE = "yarnflow-token"
#: what anyone may fetch: the login page and the UI's static files (code and style, no data)
_OPEN = ("/login", "/web/")

_LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>yarnflow: sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">
<style>body{font-family:system-ui,sans-serif;background:#f4f6f8;display:flex;justify-content:center;margin-top:12vh}
form{background:#fff;padding:2em;border-radius:6px;box-shadow:0 1px 4px #0002;min-width:22em}
h1{font-size:1.2em;margin:0 0 1em}input{width:100%;padding:.5em;margin:.5em 0 1em;box-sizing:border-box}
button{padding:.5em 1.5em}.error{color:#c23b3b}</style></head>
<body><form method="post" action="login" id="login"><h1>yarnflow</h1>{error}
<label for="token">The cluster's REST token (<code>yarnflow session start</code> printed it)</label>
<input id="token" name="token" type="password" autocomplete="current-password" autofocus>
<input type="hidden" name="next" id="next">
<button type="submit">Sign in</button></form>
<script>/* the page asked for (a deep link's #/jobs/...): signed in, the UI opens it */
document.getElementById("next").value = location.hash;
document.getElementById("login").action = "login" + location.hash;</script></body></html>"""

#: where the UI may be sent after signing in: one of its own views (``#/jobs/<id>/...``)
_NEXT = re.compile(r"#/[A-Za-z0-9_./-]{0,300}")


def https_context(config: Configuration, credentials: TlsCredentials | None) -> ssl.SSLContext | None:
    """The HTTPS server context with ``security.ssl.rest.enabled``, else None."""
    if not config[Options.SSL_REST]:
        return None
    cert, key = config[Options.SSL_REST_CERT], config[Options.SSL_REST_KEY]
    if not cert and not key and credentials is not None:
        cert, key = credentials.cert_file, credentials.key_file
    if not cert or not key:
        raise ConfigurationError(f"{Options.SSL_REST.key} is on: give {Options.SSL_REST_CERT.key} and "
                                 f"{Options.SSL_REST_KEY.key}, or turn on {Options.SSL_INTERNAL.key} to use the "
                                 "cluster's certificate")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"cannot use the HTTPS certificate {cert} / {key}: {exc}") from None
    return ctx


def presented_token() -> str:
    """The token the current request carries ("" for none)."""
    header = request.headers.get("Authorization", "")
    if header.partition(" ")[0].lower() in ("bearer", "basic"):
        return token_in_header(header)
    return request.cookies.get(COOKIE, "")


def install_token_check(app: Flask, token: str, secure: bool) -> None:
    """Every request but those of ``_OPEN`` must carry ``token``; adds the login page."""

    def valid(value: str) -> bool:
        return token_matches(value, token)

    @app.before_request
    def check() -> Any:
        if request.path.startswith(_OPEN) or valid(presented_token()):
            return None
        if request.method == "GET" and request.path == "/":  # a browser opening the UI
            return redirect("login")  # (relative: behind a proxy's prefix too)
        response = jsonify(errors=["authentication required: the cluster's REST token, as "
                                   "'Authorization: Bearer <token>', the password of HTTP basic, or the web UI's "
                                   "login (rest.authentication)"])
        response.headers["WWW-Authenticate"] = 'Bearer realm="yarnflow"'
        return response, 401

    def login() -> Any:
        if request.method == "GET":
            return Response(_LOGIN_PAGE.replace("{error}", ""), mimetype="text/html")
        if not valid(request.form.get("token", "")):
            log.info("REST: a sign-in from %s with a wrong token", request.remote_addr)
            page = _LOGIN_PAGE.replace("{error}", '<p class="error">That is not the cluster\'s token.</p>')
            return Response(page, status=401, mimetype="text/html")
        wanted = request.form.get("next", "")
        response = redirect("./" + wanted if _NEXT.fullmatch(wanted) else "./")  # (relative: behind a proxy too)
        response.set_cookie(COOKIE, token, httponly=True, samesite="Strict", secure=secure)
        return response

    app.add_url_rule("/login", "login", login, methods=["GET", "POST"])


def json_depth(data: bytes) -> int:
    """How deep arrays and objects nest in the JSON text ``data`` (brackets in strings do not
    count), read without parsing it."""
    if data.count(b"[") + data.count(b"{") <= 1:
        return data.count(b"[") + data.count(b"{")
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def bad_storage_path(path: str) -> str:
    """Why ``path`` (a folder a REST call names, e.g. a savepoint's target-directory) is refused,
    or "": it must be an absolute path or a URL (fsspec), at most 4,096 characters, without a
    NUL, a control character or a ``..`` component."""
    from urllib.parse import urlparse

    if len(path) > 4096:
        return "longer than 4,096 characters"
    if any(ord(c) < 32 for c in path):
        return "holds a control character"
    try:
        parsed = urlparse(path)
    except ValueError as exc:  # "Invalid IPv6 URL"
        return f"is not a valid URL ({exc})"
    if not parsed.scheme and not path.startswith("/"):
        return "must be an absolute path or a URL (file:///..., hdfs://..., s3://...)"
    if ".." in (parsed.path or path).split("/"):
        return "must not climb out of a folder with '..'"
    return ""
