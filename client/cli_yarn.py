"""``yarnflow session start --target yarn``: a session as a YARN application (see cli.py)."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from yarnflow.cli_common import CliError, SessionSignals, echo_security, echo_web_url
from yarnflow.common.config import Configuration, Options
from yarnflow.common.errors import ConfigurationError, YarnError, YarnflowError


def yarn_session_start(conf: dict[str, str], detached: bool, taskexecutors: int | None, slots: int | None,
                        port: int, standby: int) -> None:
    from yarnflow.yarn import ApplicationLocator, Submission, skein_client, submit_application

    if standby:
        raise CliError("--standby is for local sessions: on YARN a new application attempt takes over "
                       "(yarn.application-attempts, with the ZooKeeper high availability keys)")
    if taskexecutors:
        raise CliError("--taskexecutors is for local sessions: on YARN TaskExecutor containers start on demand "
                       "(-D slotmanager.number-of-slots.min=N keeps N slots up)")
    if slots:
        conf["taskmanager.numberOfTaskSlots"] = str(slots)
    if port:
        conf["jobmanager.rpc.port"] = str(port)
    if "yarn.application.id" in conf:
        raise CliError("yarn.application.id names a running session: leave it out to start one")
    config = Configuration.load(conf)
    try:
        client = skein_client(config)
        app_id = submit_application(config, Submission("session"), client)
    except (YarnError, ConfigurationError) as exc:
        raise CliError(str(exc)) from None
    click.echo(f"yarnflow session submitted as YARN application {app_id}")
    sys.stdout.flush()
    locator = ApplicationLocator(app_id, client)
    signals = SessionSignals(locator)
    try:
        address = locator.address(config[Options.CLIENT_TIMEOUT] / 1000.0)
    except YarnError as exc:
        if not detached:
            locator.kill()
        raise CliError(str(exc)) from None
    except KeyboardInterrupt:
        locator.kill()
        raise
    keys = f"-D yarn.application.id={app_id}"
    click.echo(f"yarnflow session running: YARN application {app_id}, AppMaster at {address}")
    tls = locator.credentials()
    echo_web_url(lambda: _cluster_info(address, tls).web_url)
    echo_security(tls, config, "")
    click.echo(f"  submit:  yarnflow run {keys} JOB.py")
    click.echo(f"  stop:    yarnflow session stop {keys}")
    sys.stdout.flush()
    if detached:
        return
    final = None
    while not signals.received():
        try:
            report = locator.report()
        except YarnError as exc:
            raise CliError(str(exc)) from None
        if str(report.state) in ("FINISHED", "FAILED", "KILLED"):
            final = report
            break
        time.sleep(0.5)
    if final is None:  # Ctrl-C / SIGTERM: stop the session as `session stop` does
        from yarnflow.connection import ClusterConnection

        try:
            conn = ClusterConnection(config.with_overrides({"yarn.application.id": app_id}), "")
            try:
                conn.call(lambda gw: gw.shutdown_cluster(), "shutdownCluster")
            finally:
                conn.close()
            final = locator.wait_final(30.0)
        except YarnflowError as exc:
            click.echo(f"stopping the session failed ({exc}): killing the application", err=True)
        if final is None:
            locator.kill()
            final = locator.wait_final(30.0)
    state = f"{final.state} (final status {final.final_status})" if final is not None else "killed"
    why = f" ({signals.names()})" if signals.received() else ""
    click.echo(f"session stopped{why}: YARN application {app_id} {state}")


def _cluster_info(address: str, tls: Any = None) -> Any:
    from yarnflow.common.rpc.gateways import RemoteDispatcherGateway

    gw = RemoteDispatcherGateway(address, 10_000, tls=tls)
    try:
        return gw.cluster_info()
    finally:
        gw.close()
