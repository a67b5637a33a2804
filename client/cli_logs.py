"""``yarnflow logs JOB_ID [--taskexecutor ID]``: the AppMaster's and TaskExecutors' log lines of
one job (lines of the job's threads carry ``[job <id>]``; lines that name the job count too).

- A local cluster (``--address``, or the leader found with the HA keys): the AppMaster reads its
  own log and its TaskExecutors' log files and answers ``GET /jobs/:jobid/logs`` on its REST API.
- A YARN application (``-D yarn.application.id=APP``): the containers' logs come through YARN's
  log aggregation, as ``yarn logs -applicationId`` shows them (skein's ``application_logs``); the
  AppMaster is the application attempt's first container, a TaskExecutor's id is its container
  id. On a Hadoop cluster YARN aggregates a container's logs once the application has ended.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

import click

from yarnflow.common.config import Configuration, Options
from yarnflow.common.errors import YarnError, YarnflowError
from yarnflow.common.logs import job_lines

@click.command()
@click.option("--address", "-a", default=None,
              help="HOST:PORT of a running local cluster; omitted with -D yarn.application.id or the HA keys.")
@click.option("--taskexecutor", "-t", default="", metavar="ID",
              help="Only this TaskExecutor's lines (its resource id; on YARN its container id).")
@click.option("-D", "dynamic", multiple=True, metavar="KEY=VALUE", help="Configuration override (repeatable).")
@click.argument("job_id")
def logs(address: str | None, taskexecutor: str, dynamic: tuple[str, ...], job_id: str) -> None:
    """Show the AppMaster's and the TaskExecutors' log lines of job JOB_ID."""
    from yarnflow.cli_common import CliError, conf_from

    config = Configuration.load(conf_from(dynamic))
    app_id = str(config[Options.YARN_APPLICATION_ID])
    if app_id and not address:
        found = yarn_job_logs(app_id, job_id, taskexecutor)
    else:
        found = _cluster_job_logs(address, dynamic, job_id, taskexecutor)
    if not found:
        raise CliError(f"no log lines of job {job_id}" + (f" on TaskExecutor {taskexecutor}" if taskexecutor else ""))
    for source, lines in found.items():
        click.echo(f"==> {source} <==")
        for line in lines:
            click.echo(line)


def _cluster_job_logs(address: str | None, dynamic: tuple[str, ...], job_id: str,
                      taskexecutor: str) -> dict[str, list[str]]:
    from yarnflow.cli_common import CliError, connect, rpc_error

    conn = connect(address, dynamic)
    try:
        web_url = conn.call(lambda gw: gw.cluster_info(), "clusterInfo").web_url
        rest = conn.rest_access()
    except YarnflowError as exc:
        raise rpc_error(conn.address, exc) from None
    finally:
        conn.close()
    if not web_url:
        raise CliError("the cluster serves no REST API (rest.enabled is false): its logs are in its log folder")
    query = f"?{urllib.parse.urlencode({'taskexecutor': taskexecutor})}" if taskexecutor else ""
    url = f"{web_url}/jobs/{urllib.parse.quote(job_id)}/logs{query}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=rest.headers), timeout=30,
                                    context=rest.context) as response:
            body = json.load(response)
    except urllib.error.HTTPError as exc:
        try:
            reason = "; ".join(json.load(exc).get("errors", [])) or exc.reason
        except ValueError:
            reason = exc.reason
        raise CliError(str(reason)) from None
    except (urllib.error.URLError, OSError) as exc:
        raise CliError(f"cannot reach the REST API at {web_url}: {exc}") from None
    return {entry["source"]: entry["lines"] for entry in body.get("logs", [])}


def split_container_log(text: str) -> dict[str, str]:
    """An aggregated container log (``LogType:NAME`` ... ``Log Contents:`` ... ``End of
    LogType:NAME`` per file, as YARN writes it) -> {file name: its text}."""
    files: dict[str, str] = {}
    name: str | None = None
    contents: list[str] | None = None
    for line in text.splitlines():
        if name is None:
            if line.startswith("LogType:"):
                name, contents = line[len("LogType:"):], None
        elif contents is None:
            if line == "Log Contents:":
                contents = []
        elif line == f"End of LogType:{name}":
            files[name] = "\n".join(contents)
            name, contents = None, None
        else:
            contents.append(line)
    return files


def yarn_job_logs(app_id: str, job_id: str, taskexecutor: str = "") -> dict[str, list[str]]:
    """The job's lines in the application's aggregated container logs: source -> lines."""
    from yarnflow.cli_common import CliError
    from yarnflow.yarn import skein_client

    try:
        client = skein_client()
        containers = dict(client.application_logs(app_id))
    except YarnError as exc:
        raise CliError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - skein's errors (unknown app, logs not aggregated yet)
        raise CliError(f"cannot read the logs of YARN application {app_id}: {exc}") from None
    if taskexecutor and taskexecutor not in containers:
        raise CliError(f"YARN application {app_id} has no container {taskexecutor}")
    out: dict[str, list[str]] = {}
    for container, text in sorted(containers.items()):
        if taskexecutor and container != taskexecutor:
            continue
        source = f"appmaster ({container})" if container.endswith("_000001") else container
        for contents in split_container_log(text).values():
            lines = job_lines(contents, job_id)
            if lines:
                out.setdefault(source, []).extend(lines)
    return out
