"""What the CLI's savepoint commands do (``yarnflow savepoint``, ``yarnflow stop``; their
options and help are in ``yarnflow.cli``)."""

from __future__ import annotations

import time
from typing import Any, Callable

import click

from yarnflow.cli import CliError, _connection, _rpc_error
from yarnflow.common.errors import NotFoundError, RefusedError, YarnflowError


def _call(address: str | None, dynamic: tuple[str, ...], fn: Callable[[Any], Any], what: str) -> tuple[Any, Any]:
    """``fn(gateway)`` on the cluster's Dispatcher; (result, open connection): the caller closes it."""
    conn = _connection(address, dynamic)
    try:
        return conn.call(fn, what), conn
    except (NotFoundError, RefusedError) as exc:
        conn.close()
        raise CliError(str(exc)) from None
    except YarnflowError as exc:
        conn.close()
        raise _rpc_error(conn.address, exc) from None


def take_savepoint(address: str | None, dynamic: tuple[str, ...], job_id: str, target_dir: str) -> None:
    path, conn = _call(address, dynamic, lambda gw: gw.trigger_savepoint(job_id, target_dir), "triggerSavepoint")
    conn.close()
    click.echo(path)


def stop_with_savepoint(address: str | None, dynamic: tuple[str, ...], job_id: str, target_dir: str, drain: bool,
                        timeout_s: float) -> None:
    """Stop the job with a savepoint, wait until it ended, print the savepoint's path."""
    path, conn = _call(address, dynamic, lambda gw: gw.stop_with_savepoint(job_id, target_dir, drain),
                       "stopWithSavepoint")
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            state = conn.call(lambda gw: gw.get_job(job_id), "getJob").status.name
            if state in ("FINISHED", "FAILED", "CANCELED"):
                break
            if time.monotonic() > deadline:
                raise CliError(f"the savepoint {path} was taken, but job {job_id} is still {state} after "
                               f"{timeout_s:.0f} s")
            time.sleep(0.1)
    except YarnflowError as exc:
        raise _rpc_error(conn.address, exc) from None
    finally:
        conn.close()
    if state != "FINISHED":
        raise CliError(f"the savepoint {path} was taken, but job {job_id} ended {state}")
    click.echo(path)
