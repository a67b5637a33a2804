"""The CLI's savepoint commands: ``yarnflow savepoint`` and ``yarnflow stop`` (added to the
``yarnflow`` group by ``yarnflow.cli``)."""

from __future__ import annotations

import time
from typing import Any, Callable

import click

from yarnflow.cli_options import ADDRESS_HELP, dynamic_option
from yarnflow.common.errors import NotFoundError, RefusedError, YarnflowError


def _call(address: str | None, dynamic: tuple[str, ...], fn: Callable[[Any], Any], what: str) -> tuple[Any, Any]:
    """``fn(gateway)`` on the cluster's Dispatcher; (result, open connection): the caller closes it."""
    from yarnflow.cli_common import CliError, connect, rpc_error

    conn = connect(address, dynamic)
    try:
        return conn.call(fn, what), conn
    except (NotFoundError, RefusedError) as exc:
        conn.close()
        raise CliError(str(exc)) from None
    except YarnflowError as exc:
        conn.close()
        raise rpc_error(conn.address, exc) from None


@click.command()
@click.option("--address", "-a", default=None, help=ADDRESS_HELP)
@dynamic_option
@click.argument("job_id")
@click.argument("target_dir", required=False, default="")
def savepoint(address: str | None, dynamic: tuple[str, ...], job_id: str, target_dir: str) -> None:
    """Take a savepoint of the running job JOB_ID into a new folder under TARGET_DIR (default:
    state.savepoints.dir) and print its path; `yarnflow run -s PATH JOB.py` starts from it.
    The job must take checkpoints (execution.checkpointing.interval)."""
    path, conn = _call(address, dynamic, lambda gw: gw.trigger_savepoint(job_id, target_dir), "triggerSavepoint")
    conn.close()
    click.echo(path)


@click.command()
@click.option("--address", "-a", default=None, help=ADDRESS_HELP)
@dynamic_option
@click.option("--savepoint-path", "-p", "target_dir", default="", metavar="DIR",
              help="folder under which the savepoint is written (default: state.savepoints.dir)")
@click.option("--drain", is_flag=True,
              help="fire every timer and window first (end of input), for a job that will not be resumed")
@click.option("--timeout", "timeout_s", default=600.0, show_default=True, metavar="SECONDS",
              help="how long to wait for the job to end after its savepoint")
@click.argument("job_id")
def stop(address: str | None, dynamic: tuple[str, ...], target_dir: str, drain: bool, timeout_s: float,
         job_id: str) -> None:
    """Stop the running job JOB_ID with a savepoint: its sources stop, a savepoint is taken
    and the job ends FINISHED; prints the savepoint's path (`yarnflow run -s PATH JOB.py`
    resumes from it). Without --drain, windows and timers stay open in the savepoint; with
    --drain they fire first. If the savepoint fails the job keeps running (with --drain it
    restarts from its latest checkpoint)."""
    from yarnflow.cli_common import CliError, rpc_error

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
        raise rpc_error(conn.address, exc) from None
    finally:
        conn.close()
    if state != "FINISHED":
        raise CliError(f"the savepoint {path} was taken, but job {job_id} ended {state}")
    click.echo(path)


@click.command()
@click.option("--address", "-a", default=None, help=ADDRESS_HELP)
@dynamic_option
@click.option("--parallelism", "-p", type=click.IntRange(min=1), required=True,
              help="the job's new parallelism (operators at another parallelism than the job's keep theirs)")
@click.argument("job_id")
def rescale(address: str | None, dynamic: tuple[str, ...], parallelism: int, job_id: str) -> None:
    """Rescale the running job JOB_ID to --parallelism: it stops at a consistent point (sinks
    commit), its state is dealt to the new parallelism (keyed state by key group, a file
    source's splits and a sink's pending files round robin) and it runs on under the same id,
    from where it stopped. The job must take checkpoints (execution.checkpointing.interval);
    its keyed operators cannot go above their max parallelism (pipeline.max-parallelism).
    Needs a free slot for every new subtask: on YARN they are asked for."""
    now, conn = _call(address, dynamic, lambda gw: gw.rescale_job(job_id, parallelism), "rescaleJob")
    conn.close()
    click.echo(f"job {job_id} runs at parallelism {now}")


@click.command("scale")
@click.option("--address", "-a", default=None, help=ADDRESS_HELP)
@dynamic_option
@click.option("--taskexecutors", "-n", type=click.IntRange(min=0), required=True,
              help="how many TaskExecutors the session runs from now on")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="return once that many TaskExecutors are registered (--no-wait: once asked for)")
@click.option("--timeout", type=click.FloatRange(min=0), default=180.0, show_default=True,
              help="seconds to wait for them; past it the command fails, saying how many there are")
def session_scale(address: str | None, dynamic: tuple[str, ...], taskexecutors: int, wait: bool,
                  timeout: float) -> None:
    """Grow or shrink a running session to --taskexecutors TaskExecutors (YARN containers on
    YARN, processes locally), and keep it there: the idle ones go first, then those running
    the fewest tasks. Jobs with the adaptive scheduler or in reactive mode
    (-D jobmanager.scheduler=adaptive, -D scheduler-mode=reactive) follow the slots; other
    jobs that lose a TaskExecutor restart and wait for slots. By default the command returns
    once the session has registered that many (new ones start in parallel)."""
    from yarnflow.cli_common import CliError

    now, conn = _call(address, dynamic, lambda gw: gw.scale_session(taskexecutors), "scaleSession")
    try:
        if wait:
            deadline = time.monotonic() + timeout
            while (registered := conn.call(lambda gw: gw.cluster_info(), "clusterInfo").registered_taskexecutors) != now:
                if time.monotonic() > deadline:
                    raise CliError(f"asked for {now} TaskExecutors; {registered} registered after {timeout:g} s "
                                   "(the session goes on trying: see its AppMaster's log for why they do not start)")
                time.sleep(0.1)
    finally:
        conn.close()
    click.echo(f"the session runs {now} TaskExecutors" if wait else f"the session was asked to run {now} TaskExecutors")
