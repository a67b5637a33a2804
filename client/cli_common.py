"""What the ``yarnflow`` commands share (cli.py and the cli_*.py groups): the one-line error,
the -D configuration, the connection to a cluster, and the signals of a foreground session."""

from __future__ import annotations

import os
import signal
import traceback
from typing import Any

import click

from yarnflow.common.config import Configuration, Options, parse_dynamic_properties
from yarnflow.common.errors import ConfigurationError, RpcConnectionError, YarnError, YarnflowError
from yarnflow.common.tracebacks import user_frames


class CliError(click.ClickException):
    """An error the CLI reports in one line and exits 1 for."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def job_file_error(exc: BaseException, job_file: str) -> str:
    """What the job file's own error looks like: its frames (never yarnflow's or runpy's) and,
    for a syntax error, the line and the caret under the place."""
    if isinstance(exc, SyntaxError):
        where = "".join(traceback.format_exception_only(type(exc), exc))
        return f"error: the job file {job_file} is not valid Python:\n{where}"
    frames = "".join(traceback.format_list(user_frames(exc.__traceback__)))
    return f"error: the job file {job_file} raised {type(exc).__name__}: {exc}\n{frames}"


def conf_from(dynamic: tuple[str, ...]) -> dict[str, str]:
    try:
        conf = parse_dynamic_properties(dynamic)
        Configuration.load(conf)  # validate every key and value now, before anything starts
    except ConfigurationError as exc:
        raise CliError(str(exc)) from None
    return conf


def check_address(address: str) -> None:
    from yarnflow.common.rpc.client import split_address

    try:
        split_address(address)
    except RpcConnectionError as exc:
        raise CliError(str(exc)) from None


def connect(address: str | None, dynamic: tuple[str, ...] = ()) -> Any:
    """The cluster at ``address``, or its leader found in ZooKeeper (HA keys in -D or the
    configuration file)."""
    from yarnflow.common.errors import CoordinationUnavailableError
    from yarnflow.connection import ClusterConnection

    if address:
        check_address(address)
    conf = conf_from(dynamic)
    try:
        return ClusterConnection(Configuration.load(conf), address or "")
    except (ConfigurationError, CoordinationUnavailableError, YarnError) as exc:
        raise CliError(str(exc)) from None


def rpc_error(address: str, exc: YarnflowError) -> CliError:
    if isinstance(exc, RpcConnectionError):
        reason = str(exc).removeprefix(f"cannot reach {address}: ")
        return CliError(f"cannot reach a yarnflow cluster at {address}: {reason}")
    return CliError(str(exc))


def echo_web_url(web_url: Any) -> None:
    try:
        url = web_url()
    except YarnflowError:
        return
    if url:
        click.echo(f"  web UI:  {url}")


class SessionSignals:
    """SIGTERM and SIGINT ask ``session start`` to stop its cluster; a second signal kills the
    AppMaster at once (its TaskExecutors die with it). The handler takes no lock and waits for
    nothing: it may run in any frame of the main thread, even one inside ``Popen.wait``."""

    def __init__(self, cluster: Any) -> None:
        self._cluster = cluster
        self._received: list[int] = []
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._received.append(signum)
        if len(self._received) > 1:
            self._cluster.kill()

    def received(self) -> bool:
        return bool(self._received)

    def names(self) -> str:
        return ", ".join(dict.fromkeys(signal.Signals(s).name for s in self._received))


def echo_security(tls: Any, config: Any, published: str) -> None:
    """What a session's user needs to know of its security: where its credentials are (clients
    on this machine find ``published`` ones by the address) and its REST token."""
    from yarnflow.common.security import rest_auth_token

    token = rest_auth_token(config, tls) if tls is not None else ""
    if tls is not None:
        where = published or os.path.dirname(tls.cert_file)
        by_address = published and not published.startswith(("file:", "hdfs:", "s3:", "gs:", "abfs"))
        click.echo(f"  TLS:     mutual, with the session's credentials in {where}"
                   + (" (clients on this machine find them by its address)" if by_address else ""))
    if token:
        click.echo(f"  REST:    token {token} (Authorization: Bearer TOKEN; curl -u yarnflow:TOKEN; the web UI "
                   "asks for it; `yarnflow session token` prints it)")
    elif config[Options.REST_ENABLED]:
        click.echo("  REST:    open, no token (rest.authentication: none): anyone who can reach the web UI's port "
                   "can cancel jobs and run code as you; use it only where nobody else can reach it")
