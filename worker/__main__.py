"""``python -m yarnflow.worker``: run one TaskExecutor process."""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys
import threading

from yarnflow.common.config import Configuration, parse_dynamic_properties
from yarnflow.common.errors import ConfigurationError
from yarnflow.common.ids import ResourceID


def _die_with_parent(parent_pid: int) -> None:
    """Linux: get SIGTERM when the process that started us dies (local driver only)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m yarnflow.worker", description="Run a yarnflow TaskExecutor.")
    parser.add_argument("--resource-id", required=True, help="this TaskExecutor's id")
    parser.add_argument("--rm-address", required=True, help="HOST:PORT of the ResourceManager")
    parser.add_argument("--work-dir", required=True, help="local directory for artifacts and spill files")
    parser.add_argument("--parent-pid", type=int, default=0, help="exit when this process dies (local mode)")
    parser.add_argument("-D", dest="dynamic", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("YARNFLOW_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s")
    if args.parent_pid:
        _die_with_parent(args.parent_pid)
    try:
        config = Configuration.load(parse_dynamic_properties(args.dynamic))
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from yarnflow.worker.taskexecutor.task_executor import TaskExecutor

    te = TaskExecutor(config, ResourceID(args.resource_id), args.rm_address, args.work_dir)

    def on_signal(signum: int, _frame: object) -> None:
        threading.Thread(target=te.shutdown, args=(f"signal {signal.Signals(signum).name}",), daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    te.start()
    while not te.wait(1.0):
        pass
    logging.getLogger(__name__).info("TaskExecutor exits: %s", te.exit_reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
