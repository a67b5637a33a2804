"""``yarnflow plan JOB.py [args]``: the dataflow plan of the job a job file defines, as JSON
(Flink's ``flink info``), without running it; the REST API's ``/jars/:jarid/plan`` runs it."""

from __future__ import annotations

import json
import os
import runpy
import sys
from typing import Any

import click

from yarnflow.cli_options import dynamic_option


class _Planned(Exception):
    """Stops the job file at its first ``execute()``, its plan taken."""


def _planning_context(conf: dict[str, str]) -> Any:
    from yarnflow import executors
    from yarnflow.compiler import compile_job
    from yarnflow.common.plan import job_plan

    class PlanContext(executors.ClusterContext):
        def execute(self, env: Any, job_name: str, job: Any = None) -> Any:
            job = job or compile_job(env, job_name)
            job.job_graph.config.update({**self.conf, **job.job_graph.config})
            self.plan = job_plan(job.job_graph, job_name)
            raise _Planned()

    return PlanContext("", conf)


@click.command(context_settings={"allow_interspersed_args": False})
@click.option("--parallelism", "-p", type=click.IntRange(min=1), default=None,
              help="Default parallelism of the job's operators.")
@dynamic_option
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.argument("job_args", nargs=-1, type=click.UNPROCESSED)
def plan(parallelism: int | None, dynamic: tuple[str, ...], job_file: str, job_args: tuple[str, ...]) -> None:
    """Print the dataflow plan of the job JOB_FILE defines (its first execute()) as JSON:
    vertices, parallelism, operators and inputs, as the REST API's /jobs/:jobid/plan shows a
    running job's. Nothing runs: the job file stops at execute()."""
    from yarnflow import executors
    from yarnflow.cli_common import CliError, conf_from, job_file_error
    from yarnflow.common.errors import YarnflowError

    if not os.path.isfile(job_file):
        raise CliError(f"job file {job_file} does not exist")
    conf = conf_from(dynamic)
    if parallelism is not None:
        conf["parallelism.default"] = str(parallelism)
    ctx = _planning_context(conf)
    executors.set_context(ctx)
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [job_file, *job_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(job_file)))
    try:
        runpy.run_path(job_file, run_name="__main__")
    except _Planned:
        click.echo(json.dumps(ctx.plan, indent=2))
        return
    except (SystemExit, KeyboardInterrupt):
        raise
    except YarnflowError as exc:
        raise CliError(str(exc)) from None
    except BaseException as exc:  # noqa: BLE001 - the user's code raised: show where, as `run` does
        click.echo(job_file_error(exc, job_file), err=True, nl=False)
        sys.exit(1)
    finally:
        sys.argv, sys.path[:] = old_argv, old_path
        executors.set_context(None)
    raise CliError(f"{job_file} defined no job: it never called execute()")
