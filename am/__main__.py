"""``python -m yarnflow.am``: run an AppMaster (local target: TaskExecutors as local processes)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from yarnflow.common.config import Configuration, parse_dynamic_properties
from yarnflow.common.errors import ConfigurationError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m yarnflow.am", description="Run a yarnflow AppMaster.")
    parser.add_argument("--cluster-id", default="local", help="the cluster's id (names its work dir)")
    parser.add_argument("--target", default="local", choices=["local"], help="where TaskExecutors run")
    parser.add_argument("--work-dir", default=None, help="local working directory (default: under io.tmp.dirs)")
    parser.add_argument("--address-file", default=None, help="write HOST:PORT here once serving")
    parser.add_argument("--parent-pid", type=int, default=0, help="exit when this process dies")
    parser.add_argument("-D", dest="dynamic", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("YARNFLOW_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s")
    if args.parent_pid:
        from yarnflow.worker.__main__ import _die_with_parent

        _die_with_parent(args.parent_pid)
    try:
        config = Configuration.load(parse_dynamic_properties(args.dynamic))
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from yarnflow.am.appmaster import AppMaster

    am = AppMaster(config, args.cluster_id, args.target, work_dir=args.work_dir)

    def on_signal(signum: int, _frame: object) -> None:
        threading.Thread(target=am.shutdown, name="signal-shutdown", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
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
