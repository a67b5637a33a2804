"""``python -m yarnflow.am``: run an AppMaster (local target: TaskExecutors as local processes)."""

from __future__ import annotations

import argparse
import os
import sys

from yarnflow.common.process import add_common_arguments, shutdown_on_signals, start_process


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m yarnflow.am", description="Run a yarnflow AppMaster.")
    parser.add_argument("--cluster-id", default="local", help="the cluster's id (names its work dir)")
    parser.add_argument("--target", default="local", choices=["local"], help="where TaskExecutors run")
    parser.add_argument("--work-dir", default=None, help="local working directory (default: under io.tmp.dirs)")
    parser.add_argument("--address-file", default=None, help="write HOST:PORT here once serving")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    config = start_process(args)
    if config is None:
        return 2
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
