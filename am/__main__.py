"""``python -m yarnflow.am``: run an AppMaster. ``--target local``: TaskExecutors as local
processes; ``--target yarn``: in a YARN container, TaskExecutors as YARN containers (skein),
as the master script of an application the client submitted (``yarnflow.yarn``)."""

from __future__ import annotations

import argparse
import os
import sys

from yarnflow.common.process import add_common_arguments, shutdown_on_signals, start_process


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m yarnflow.am", description="Run a yarnflow AppMaster.")
    parser.add_argument("--cluster-id", default="local", help="the cluster's id (names its work dir)")
    parser.add_argument("--target", default="local", choices=["local", "yarn"], help="where TaskExecutors run")
    parser.add_argument("--work-dir", default=None, help="local working directory (default: under io.tmp.dirs)")
    parser.add_argument("--address-file", default=None, help="write HOST:PORT here once serving")
    parser.add_argument("--job-graph", default=None, help="yarn: the per-job application's JobGraph file")
    parser.add_argument("--artifact", default=None, help="yarn: the per-job application's job artifact")
    parser.add_argument("--detached", action="store_true",
                        help="yarn per-job: end as soon as the job ends (no client waits for its result)")
    parser.add_argument("--application", default=None,
                        help="yarn application mode: the job file whose main() this AppMaster runs, then ends")
    parser.add_argument("--application-args", default="[]", help="yarn application mode: main()'s arguments (JSON)")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    config = start_process(args)
    if config is None:
        return 2
    if args.target == "yarn":
        if bool(args.job_graph) != bool(args.artifact):
            parser.error("--job-graph and --artifact go together")
        if args.application and args.job_graph:
            parser.error("--application (application mode) and --job-graph (per-job mode) exclude each other")
        from yarnflow.am import yarn

        return yarn.run(args, config)
    if args.job_graph or args.artifact or args.application:
        parser.error("--job-graph, --artifact and --application are for --target yarn")
    from yarnflow.am.appmaster import AppMaster
    from yarnflow.common.errors import ConfigurationError, CoordinationUnavailableError

    try:
        am = AppMaster(config, args.cluster_id, args.target, work_dir=args.work_dir)
    except (ConfigurationError, CoordinationUnavailableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    shutdown_on_signals(lambda _reason: am.shutdown())
    am.start()
    if args.address_file:
        tmp = args.address_file + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(am.address)
        os.replace(tmp, args.address_file)
    print(f"yarnflow AppMaster listening on {am.address}", flush=True)
    while not am.wait(1.0):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
