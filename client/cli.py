"""The ``yarnflow`` command line: run jobs, manage sessions, list and cancel jobs."""

from __future__ import annotations

import atexit
import gc
import logging
import os
import runpy
import sys
import time
from typing import Any

import click

from yarnflow.cli_common import (CliError, job_file_error, SessionSignals, check_address, conf_from, connect, echo_web_url,
                                 echo_security, rpc_error)
from yarnflow.cli_views import operator_paths, size
from yarnflow.cli_history import history_server
from yarnflow.cli_logs import logs
from yarnflow.cli_options import ADDRESS_HELP, dynamic_option
from yarnflow.cli_plan import plan
from yarnflow.cli_savepoints import rescale, savepoint, session_scale, stop
from yarnflow.common.tracebacks import user_traceback
from yarnflow.common.version import __version__
from yarnflow.common.config import Configuration, Options
from yarnflow.common.security import published_folder, storage_folder
from yarnflow.common.spark_reports import read_spark_reports
from yarnflow.common.errors import (JobDefinitionError, JobFailedError, NotFoundError, RefusedError, RpcError,
                                    YarnflowError)

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="yarnflow")
@click.option("--log-level", default="WARNING", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Log level of the client.")
def cli(log_level: str) -> None:
    """yarnflow: Flink-style dataflow jobs in Python, on YARN or on a local cluster."""
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if logging.getLogger().level >= logging.WARNING:
        # kazoo warns on every dropped ZooKeeper connection; the CLI says what matters in one line
        logging.getLogger("kazoo").setLevel(logging.ERROR)


# ---- run -------------------------------------------------------------------------------------

RUN_TARGETS = ["local", "remote", "yarn-per-job", "yarn-session", "yarn-application"]


@cli.command(context_settings={"allow_interspersed_args": False})
@click.option("--target", "-t", type=click.Choice(RUN_TARGETS), default=None,
              help="Where the job runs: local (an embedded local cluster started for it), remote (the cluster "
                   "at --address, or the leader found in ZooKeeper), yarn-per-job (a YARN application of its "
                   "own), yarn-session (the YARN session -D yarn.application.id=ID), yarn-application (the job "
                   "file and the modules beside it shipped to a YARN application whose AppMaster runs its main()). "
                   "Default: remote with "
                   "--address or the high availability keys, yarn-session with yarn.application.id, else local.")
@click.option("--detached", "-d", is_flag=True,
              help="Return once the job was submitted instead of following it to its end (not with an "
                   "embedded local cluster): yarn-per-job returns once YARN accepted the application; follow "
                   "jobs with `yarnflow list` / `yarnflow info`.")
@click.option("--address", "-a", default=None, help=ADDRESS_HELP + "; without either: an embedded local cluster.")
@click.option("--parallelism", "-p", type=click.IntRange(min=1), default=None,
              help="Default parallelism of the job's operators.")
@click.option("--taskexecutors", type=click.IntRange(min=1), default=None,
              help="TaskExecutors of the embedded local cluster [default: as many as the job's slots need].")
@click.option("--slots", type=click.IntRange(min=1), default=None,
              help="Slots per TaskExecutor of the embedded local cluster [default: taskmanager.numberOfTaskSlots, 1].")
@click.option("--no-progress", is_flag=True, help="Do not show the job's progress.")
@click.option("--from-savepoint", "-s", "savepoint", default=None, metavar="PATH",
              help="Start the job from this savepoint (printed by `yarnflow savepoint`): each operator gets the "
                   "state of the operator with its uid.")
@click.option("--allow-non-restored-state", is_flag=True,
              help="With -s: start even when the savepoint has state for operators this job does not have "
                   "(that state is dropped).")
@dynamic_option
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.argument("job_args", nargs=-1, type=click.UNPROCESSED)
def run(target: str | None, detached: bool, address: str | None, parallelism: int | None,
        taskexecutors: int | None, slots: int | None, no_progress: bool, savepoint: str | None, allow_non_restored_state: bool,
        dynamic: tuple[str, ...], job_file: str, job_args: tuple[str, ...]) -> None:
    """Run the pipeline defined in JOB_FILE; JOB_ARGS go to the job (as `flink run` does).

    Without --address (or a YARN application id, or high availability keys), an embedded local
    cluster (one AppMaster and --taskexecutors TaskExecutor processes) is started for the job
    and stopped when it ends. --target yarn-per-job submits a YARN application that runs the job
    and ends with it, through the skein driver of this machine (`skein driver start` on a Hadoop
    edge node, or `yarnflow yarn-sandbox`)."""
    from yarnflow.common.ha import ha_enabled

    if not os.path.isfile(job_file):
        raise CliError(f"job file {job_file} does not exist")
    conf = conf_from(dynamic)
    if parallelism is not None:
        conf["parallelism.default"] = str(parallelism)
    if savepoint:
        conf["execution.savepoint.path"] = savepoint
    if allow_non_restored_state:
        if not savepoint:
            raise CliError("--allow-non-restored-state goes with -s/--from-savepoint PATH")
        conf["execution.savepoint.ignore-unclaimed-state"] = "true"
    progress = None if not no_progress else False
    config = Configuration.load(conf)
    app_id = config[Options.YARN_APPLICATION_ID]
    if target is None:
        target = ("remote" if address or ha_enabled(config) else "yarn-session" if app_id else "local")
    if detached and target == "local":
        raise CliError("--detached needs a cluster that outlives the command (--target remote, yarn-session or "
                       "yarn-per-job): an embedded local cluster stops when `yarnflow run` ends")
    if address and target != "remote":
        raise CliError(f"--address names a running cluster: it does not go with --target {target}")
    prestarted = None
    if target == "local" and not ha_enabled(config):  # its TaskExecutor processes load while the job file runs
        from yarnflow.local_cluster import prestarted as prestart

        prestarted = prestart(taskexecutors, slots, conf)
    from yarnflow import executors

    ctx: executors.ClusterContext
    if target == "remote":
        if address:
            check_address(address)
        else:
            connect(None, dynamic).close()  # fail now, in one line, when there is no cluster
        ctx = executors.ClusterContext(address or "", conf, job_file, progress, detached)
    elif target == "yarn-session":
        if not app_id:
            raise CliError("--target yarn-session needs the session's application id: -D yarn.application.id=ID "
                           "(printed by `yarnflow session start --target yarn`)")
        connect(None, dynamic).close()
        ctx = executors.ClusterContext("", conf, job_file, progress, detached)
    elif target in ("yarn-per-job", "yarn-application"):
        if app_id:
            raise CliError(f"--target {target} starts an application of its own: leave out yarn.application.id")
        if target == "yarn-application":
            from yarnflow.application_mode import run_application

            sys.exit(run_application(config, job_file, job_args, detached))
        ctx = executors.YarnPerJobContext(conf, job_file, progress, detached)
    else:
        ctx = executors.LocalContext(taskexecutors, slots, conf, job_file, progress, prestarted)
    executors.set_context(ctx)
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [job_file, *job_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(job_file)))
    exited = False
    try:
        from yarnflow.pyflink import install

        install()  # a PyFlink program runs unchanged: `import pyflink...` is yarnflow's PyFlink layer
        runpy.run_path(job_file, run_name="__main__")
    except JobFailedError as exc:
        cause = exc.cause
        tb = user_traceback(getattr(cause, "traceback", "") or "").splitlines()  # (`yarnflow info`: whole)
        if len(tb) > 30:
            tb = ["Traceback (its last 30 lines; `yarnflow info` shows it whole):", *tb[-30:]]
        detail = ("\n" + "\n".join(tb)) if tb else ""
        click.echo(f"error: {exc}{detail}", err=True)
        sys.exit(1)
    except YarnflowError as exc:
        if isinstance(exc, RpcError):
            raise rpc_error(ctx.address, exc) from None
        raise CliError(str(exc)) from None
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
        exited = True  # the job chose to stop (e.g. its --help): not an error
    except KeyboardInterrupt:
        if ctx.interrupted is not None:
            job_id, status = ctx.interrupted
            click.echo(f"interrupted: job {job_id} {status.name if status else 'left cancelling'}", err=True)
        else:
            click.echo("interrupted", err=True)
        sys.exit(130)
    except BaseException as exc:  # noqa: BLE001 - the user's code raised: show where
        click.echo(job_file_error(exc, job_file), err=True, nl=False)
        sys.exit(1)
    finally:
        sys.argv = old_argv
        sys.path[:] = old_path
        executors.set_context(None)
        if isinstance(ctx, executors.LocalContext):
            ctx.close()
    if not ctx.results and not ctx.submitted and not exited:
        raise CliError(f"{job_file} defined no job: build a pipeline and call env.execute(...)")
    for result in ctx.results:
        if isinstance(ctx, executors.YarnPerJobContext) and ctx.detached:
            app = ctx.applications[-1] if ctx.applications else "?"
            click.echo(f"Job {result.job_name} ({result.job_id}) submitted detached as YARN application {app}; "
                       f"follow it with `yarnflow list -D yarn.application.id={app}`", err=True)
            continue
        if ctx.detached:
            click.echo(f"Job {result.job_name} ({result.job_id}) submitted detached; follow it with "
                       f"`yarnflow info {_where_args(ctx, app_id)}{result.job_id}`", err=True)
            continue
        where = _result_locations(result)
        click.echo(f"Job {result.job_name} ({result.job_id}) {result.status.name} in "
                   f"{result.duration_ms / 1000:.2f} s{where}", err=True)


def _where_args(ctx: Any, app_id: str) -> str:
    """The options that find the cluster a job went to, for a command to type next."""
    if app_id:
        return f"-D yarn.application.id={app_id} "
    if ctx.address:
        return f"--address {ctx.address} "
    keys = [f"-D {k}={v}" for k, v in ctx.conf.items() if k.startswith("high-availability")]
    return "".join(f"{k} " for k in keys)  # (none given: they come from $YARNFLOW_CONF_DIR)


def _result_locations(result: Any) -> str:
    """Where the job's results went, for the closing line."""
    places = [f"written to {p}" for p in result.outputs]
    pyflink = {u for u in result.collect_uids if result.collect_names.get(u, u).startswith("pyflink-")}
    if result.printed or any(result.collect_names.get(u, u).startswith("pyflink-print-") for u in pyflink):
        places.append("printed above")
    others = [u for u in result.collect_uids if not u.startswith("print-") and u not in pyflink]
    if others:  # (where they were stored is the cluster's business: an embedded one's folder is gone now)
        names = ", ".join(repr(result.collect_names.get(u, u)) for u in others)
        places.append(f"collected ({names}: env.execute(...).collected(name) returns them)")
    return f"; results {', '.join(places)}" if places else ""


# ---- jobs ------------------------------------------------------------------------------------

@cli.command("list")
@click.option("--address", "-a", default=None, help=ADDRESS_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
@dynamic_option
def list_jobs(address: str | None, as_json: bool, dynamic: tuple[str, ...]) -> None:
    """List the cluster's jobs: id, name, state, start time and duration."""
    import datetime
    import json
    import time

    conn = connect(address, dynamic)
    try:
        jobs = conn.call(lambda gw: gw.list_jobs(), "listJobs")
    except YarnflowError as exc:
        raise rpc_error(conn.address, exc) from None
    finally:
        conn.close()
    now = int(time.time() * 1000)
    rows = []
    for j in jobs:
        start = datetime.datetime.fromtimestamp(j.start_time_ms / 1000).strftime("%Y-%m-%d %H:%M:%S")
        duration = ((j.end_time_ms or now) - j.start_time_ms) / 1000
        rows.append({"id": str(j.job_id), "name": j.name, "state": j.status.name, "start": start,
                     "duration_s": round(duration, 2)})
    if as_json:
        for r in rows:
            click.echo(json.dumps(r))
        return
    if not rows:
        click.echo("no jobs")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("JOB ID", "NAME", "STATE", "START", "DURATION")
    for r in rows:
        table.add_row(r["id"], r["name"], r["state"], r["start"], f"{r['duration_s']:.1f} s")
    Console(width=160).print(table)


@cli.command()
@click.option("--address", "-a", default=None, help=ADDRESS_HELP)
@dynamic_option
@click.argument("job_id")
def cancel(address: str | None, dynamic: tuple[str, ...], job_id: str) -> None:
    """Cancel the running job JOB_ID."""
    conn = connect(address, dynamic)
    try:
        conn.call(lambda gw: gw.cancel_job(job_id), "cancelJob")
        click.echo(f"cancelling job {job_id}")
    except (NotFoundError, RefusedError) as exc:
        raise CliError(str(exc)) from None
    except YarnflowError as exc:
        raise rpc_error(conn.address, exc) from None
    finally:
        conn.close()


@cli.command()
@click.option("--address", "-a", default=None, help=ADDRESS_HELP)
@dynamic_option
@click.argument("job_id")
def info(address: str | None, dynamic: tuple[str, ...], job_id: str) -> None:
    """Show the state of job JOB_ID, its vertices and its failure cause."""
    conn = connect(address, dynamic)
    try:
        j = conn.call(lambda gw: gw.get_job(job_id), "getJob")
        storage_dir = conn.call(lambda gw: gw.cluster_info(), "clusterInfo").storage_dir
    except NotFoundError as exc:
        raise CliError(str(exc)) from None
    except YarnflowError as exc:
        raise rpc_error(conn.address, exc) from None
    finally:
        conn.close()
    import datetime

    click.echo(f"job {j.name} ({j.job_id}): {j.status.name}")
    if j.restart_strategy:
        click.echo(f"restart strategy: {j.restart_strategy}")
    if j.scaling:
        click.echo(f"scheduler: {j.scaling}")
    for v in j.vertices:
        states = ", ".join(f"{n} {s.name}" for s, n in sorted(v.state_counts.items()) if n)
        click.echo(f"  {v.name} (parallelism {v.parallelism}): {states}")
        metrics = list(v.subtask_metrics) or [None] * v.parallelism
        for i, (attempt, where) in enumerate(zip(v.subtask_attempts, v.subtask_locations or [""] * v.parallelism)):
            m = metrics[i] if i < len(metrics) else None
            memory = ""
            if m is not None and m.managed_memory_bytes:
                memory = (f", managed memory {size(m.managed_memory_bytes)} (peak {size(m.managed_memory_peak)})"
                          + (f", spilled {size(m.spilled_bytes)}" if m.spilled_bytes else ""))
            click.echo(f"    subtask {i}: attempt {attempt}{' on ' + where if where else ''}{memory}")
        for line in operator_paths(v.name, [m for m in metrics if m is not None]):
            click.echo(f"    {line}")
    if j.failure_history:
        click.echo(f"failure history ({len(j.failure_history)}):")
        for f in j.failure_history:
            when = datetime.datetime.fromtimestamp(f.timestamp_ms / 1000).strftime("%H:%M:%S")
            action = (f"restarted {f.restarted_subtasks} subtask{'s' if f.restarted_subtasks != 1 else ''}"
                      if f.restarted_subtasks else "no restart")
            if f.restored_checkpoint_id:
                action += f" from checkpoint {f.restored_checkpoint_id}"
            click.echo(f"  {when} {f.task or '(job)'}: {f.error.describe()} -> {action}")
    if j.checkpoints:
        click.echo(f"checkpoints (latest completed: {j.latest_completed_checkpoint_id or 'none'}):")
        click.echo("  id  status      type       triggered  duration    size       alignment  in-flight data")
        for c in j.checkpoints:
            when = datetime.datetime.fromtimestamp(c.trigger_time_ms / 1000).strftime("%H:%M:%S")
            line = (f"  {c.checkpoint_id:<3} {c.status:<11} {'unaligned' if c.unaligned else 'aligned':<10} "
                    f"{when:<10} {c.duration_ms:>6} ms {size(c.size_bytes):>10} {c.alignment_ms:>6} ms "
                    f"{size(c.inflight_bytes) if c.unaligned else '-':>10}")
            click.echo(line + (f"  {c.failure}" if c.failure else ""))
    spark = read_spark_reports(storage_dir, str(j.job_id))
    if spark:
        click.echo("spark stages:")
        for r in spark:
            executors = r.get("executors", -1)
            click.echo(f"  {r.get('stage')}: application {r.get('application_id')} ({r.get('master')}"
                       f"{f', {executors} executors' if executors and executors > 0 else ''}), "
                       f"{r.get('jobs')} jobs, {r.get('stages')} stages, {r.get('seconds')} s, "
                       f"{r.get('output_files')} output files (attempt {r.get('attempt')})"
                       + (f", {r['micro_batches']} micro-batches (last: checkpoint {r.get('epoch')})"
                          if r.get("micro_batches") else ""))
    if j.failure_cause:
        click.echo(f"failure cause: {j.failure_cause.describe()}")
        if j.failure_cause.traceback:
            click.echo(j.failure_cause.traceback)


# ---- session ---------------------------------------------------------------------------------

@cli.group()
def session() -> None:
    """Start and stop long-running session clusters (many jobs, one AppMaster)."""


@session.command("start")
@click.option("--target", type=click.Choice(["local", "yarn"]), default="local", show_default=True,
              help="Where the session runs: local (processes on this machine) or yarn (a YARN application, "
                   "through this machine's skein driver: `skein driver start`, or `yarnflow yarn-sandbox`).")
@click.option("--detached", "-d", is_flag=True,
              help="yarn: print the application id and return, leaving the session running.")
@click.option("--taskexecutors", type=click.IntRange(min=1), default=None,
              help="local: TaskExecutor processes to start with [default: 2]; more start when a job needs their "
                   "slots. On YARN TaskExecutor containers start on demand.")
@click.option("--slots", type=click.IntRange(min=1), default=None,
              help="Slots per TaskExecutor [default: taskmanager.numberOfTaskSlots, 1].")
@click.option("--port", type=click.IntRange(min=0, max=65535), default=0, show_default=True,
              help="RPC port of the AppMaster (0: any free port).")
@click.option("--standby", type=click.IntRange(min=0), default=0, show_default=True,
              help="Standby AppMasters beside the active one (needs the ZooKeeper high availability keys); "
                   "one takes over every job when the active one dies.")
@click.option("--remove-logs", is_flag=True,
              help="local: remove the session's log folder when it stops (by default it is kept, to look into).")
@dynamic_option
def session_start(target: str, detached: bool, taskexecutors: int | None, slots: int | None, port: int,
                  standby: int, remove_logs: bool, dynamic: tuple[str, ...]) -> None:
    """Start a session cluster, print its address (on YARN: its application id) and keep
    running until stopped (`yarnflow session stop ...` or Ctrl-C)."""
    from yarnflow.local_cluster import ClusterStartError, LocalCluster

    conf = conf_from(dynamic)
    if target == "yarn":
        from yarnflow.cli_yarn import yarn_session_start

        yarn_session_start(conf, detached, taskexecutors, slots, port, standby)
        return
    if detached:
        raise CliError("--detached is for --target yarn (a local session runs in this terminal)")
    taskexecutors = taskexecutors or 2
    if not Configuration.load(conf).is_set(Options.SSL_INTERNAL):  # closed to anyone without its credentials
        conf[Options.SSL_INTERNAL.key] = "true"
    if port:
        if standby:
            raise CliError("--port names one AppMaster's port: leave it out with --standby")
        conf["jobmanager.rpc.port"] = str(port)
    try:
        cluster = LocalCluster(taskexecutors, slots, conf, standby=standby)
    except ClusterStartError as exc:
        raise CliError(str(exc)) from None
    cluster.keep_logs = not remove_logs
    signals = SessionSignals(cluster)
    try:
        cluster.start(interrupted=signals.received)
    except ClusterStartError as exc:
        cluster.stop()
        if signals.received():
            click.echo(f"session stopped ({signals.names()}) before it was running", err=True)
            return
        raise CliError(str(exc)) from None
    click.echo(f"yarnflow session running at {cluster.address}")
    echo_web_url(cluster.web_url)
    echo_security(cluster.tls, cluster.config, storage_folder(cluster.config) if cluster.ha else
                  published_folder(cluster.address))
    if cluster.ha:
        ha_keys = " ".join(f"-D {k}={v}" for k, v in conf.items() if k.startswith("high-availability."))
        click.echo(f"  {standby} standby AppMaster{'s' if standby != 1 else ''}; the leader is found in ZooKeeper:")
        click.echo(f"  submit:  yarnflow run {ha_keys} JOB.py")
        click.echo(f"  stop:    yarnflow session stop {ha_keys}")
    else:
        click.echo(f"  submit:  yarnflow run --address {cluster.address} JOB.py")
        click.echo(f"  stop:    yarnflow session stop --address {cluster.address}")
    click.echo(f"  logs:    {os.path.dirname(cluster.log_path)}", err=True)
    sys.stdout.flush()
    # The main thread polls; the signal handler only records the signal. (Stopping the cluster
    # inside the handler would wait on the AppMaster from the frame that is already waiting
    # on it, which hangs and leaves the AppMaster a zombie.)
    while any(p.poll() is None for p in cluster.procs) and not signals.received():
        time.sleep(0.1)
    cluster.stop()
    why = f" ({signals.names()})" if signals.received() else ""
    click.echo(f"session stopped{why}")
    if not remove_logs:
        click.echo(f"  logs kept in {os.path.dirname(cluster.log_path)} (--remove-logs: removed at stop)", err=True)


@session.command("token")
@click.option("--address", "-a", default=None, help=ADDRESS_HELP)
@dynamic_option
def session_token(address: str | None, dynamic: tuple[str, ...]) -> None:
    """Print the session's REST token, for scripts on this machine that call its REST API
    (curl -u yarnflow:TOKEN, or the header Authorization: Bearer TOKEN). It is derived from the
    session's credentials, which only their owner can read: the cluster is found as `list`
    finds it, and asked whether its REST API is open."""
    conn = connect(address, dynamic)
    try:
        info = conn.call(lambda gw: gw.cluster_info(), "clusterInfo")
        access = conn.rest_access()
    except YarnflowError as exc:
        raise rpc_error(conn.address, exc) from None
    finally:
        conn.close()
    if not info.web_url:
        raise CliError(f"the cluster at {conn.address} serves no REST API (rest.enabled: false)")
    if _rest_is_open(info.web_url, access.context):
        raise CliError(f"the REST API at {info.web_url} is open (rest.authentication: none): it takes no token")
    header = access.headers.get("Authorization", "")
    if not header:
        raise CliError(f"the credentials of the cluster at {conn.address} are not here (they are its owner's): "
                       "its REST token cannot be derived")
    click.echo(header.removeprefix("Bearer "))


def _rest_is_open(web_url: str, context: Any) -> bool:
    """Whether the REST API answers without a token (a cheap path: ``/config``)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{web_url}/v1/config", timeout=10, context=context):  # noqa: S310 - its own URL
            return True
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            return False
        raise CliError(f"the REST API at {web_url} answered {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise CliError(f"cannot reach the REST API at {web_url}: {exc}") from None


@session.command("stop")
@click.option("--address", "-a", default=None, help=ADDRESS_HELP)
@dynamic_option
def session_stop(address: str | None, dynamic: tuple[str, ...]) -> None:
    """Stop the session cluster (its running jobs are cancelled; with high availability its
    standby AppMasters exit too)."""
    conn = connect(address, dynamic)
    try:
        conn.call(lambda gw: gw.shutdown_cluster(), "shutdownCluster")
        where = conn.address
    except YarnflowError as exc:
        raise rpc_error(conn.address, exc) from None
    finally:
        conn.close()
    click.echo(f"stopping the session at {where}")


@cli.command("yarn-sandbox")
@click.option("--port", type=click.IntRange(min=0, max=65535), default=0, show_default=True,
              help="Port of skein's Driver service (0: any free port).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--web-port", type=click.IntRange(min=0, max=65535), default=0, show_default=True,
              help="Port of the ResourceManager's web proxy, where running applications' tracking URLs "
              "(http://HOST:PORT/proxy/APP_ID/) are served, as YARN's 8088 (0: any free port).")
@click.option("--config-dir", default=None,
              help="skein's configuration directory (credentials, driver file); default $SKEIN_CONFIG or ~/.skein.")
@click.option("--work-dir", default=None, help="Where containers and their logs live (default: a temporary "
              "directory removed on exit).")
@click.option("--max-memory", type=click.IntRange(min=64), default=8192, show_default=True,
              help="The largest container in MiB (YARN's maximum allocation); bigger ones are refused.")
@click.option("--max-vcores", type=click.IntRange(min=1), default=4, show_default=True,
              help="The largest container in virtual cores.")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="NodeManagers.")
@click.option("--separate-hosts", is_flag=True, help="Make every NodeManager a host of its own (root only): a "
              "network namespace with its own address on a bridge the sandbox creates, its own folders, none of "
              "the others'; the ResourceManager listens on a host of its own. Run a client on the client's host "
              "with `ip netns exec <the printed client namespace> ...`.")
@click.option("--hide", multiple=True, help="With --separate-hosts: a folder no NodeManager may see (the client's); "
              "repeatable.")
def yarn_sandbox(port: int, host: str, web_port: int, config_dir: str | None, work_dir: str | None, max_memory: int,
                 max_vcores: int, nodes: int, separate_hosts: bool, hide: tuple[str, ...]) -> None:
    """Run a local skein-compatible stand-in for YARN until Ctrl-C or SIGTERM: the skein client
    (and `--target yarn-per-job` / `yarn-session`) submits to it as to a Hadoop cluster, and
    containers run as local processes. It registers as skein's global driver, so commands in
    other shells with the same SKEIN_CONFIG find it."""
    from yarnflow.sandbox import run_sandbox

    if hide and not separate_hosts:
        raise click.UsageError("--hide needs --separate-hosts")
    code = run_sandbox(config_dir=config_dir, port=port, host=host, work_dir=work_dir, max_memory_mb=max_memory,
                       max_vcores=max_vcores, node_count=nodes, separate_hosts=separate_hosts, hide=hide,
                       web_port=web_port)
    if code:
        raise click.exceptions.Exit(code)


cli.add_command(logs)
cli.add_command(savepoint)
cli.add_command(stop)
cli.add_command(rescale)
cli.add_command(plan)
cli.add_command(history_server)
session.add_command(session_scale)


def main(argv: list[str] | None = None) -> int:
    # the last thing before the interpreter's own teardown (atexit runs the handlers registered
    # first last): its final garbage collections walk every object left (~0.1 s once pandas and
    # pyarrow are loaded). Frozen, they are skipped; objects are still released by their counts.
    atexit.register(gc.freeze)
    try:
        cli.main(args=argv, prog_name="yarnflow", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.UsageError as exc:
        hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
        click.echo(f"error: {exc.format_message()}{hint}", err=True)
        return 2
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except JobDefinitionError as exc:
        click.echo(f"error: {exc}", err=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
