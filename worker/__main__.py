"""``python -m yarnflow.worker``: run one TaskExecutor process."""

from __future__ import annotations

import argparse
import logging
import sys
import threading

from yarnflow.common.ids import ResourceID
from yarnflow.common.process import add_common_arguments, shutdown_on_signals, start_process


def warm_up() -> None:
    """Import what running tasks needs once the TaskExecutor has started (registered, serving),
    on a thread of its own: its first task would otherwise spend ~0.2 s of the job importing
    the operators and pandas (which pyarrow loads at its first conversion of Python values,
    unless ``process.memory.defer-pandas-import``). An error here is left to the first task."""
    try:
        import pyarrow as pa

        import yarnflow.worker.operators.joins
        import yarnflow.worker.operators.process
        import yarnflow.worker.operators.sinks
        import yarnflow.worker.operators.sources
        import yarnflow.worker.operators.transforms
        import yarnflow.worker.operators.windows.aggregate
        import yarnflow.worker.operators.windows.row_windows  # noqa: F401

        from yarnflow.worker.runtime.keygroups import key_groups

        pa.array([0])  # pyarrow's first type inference of Python values
        key_groups(pa.record_batch({"k": ["a"] * 100}), ["k"], 128)  # loads the string hash
    except Exception:  # noqa: BLE001 - the first task that needs it raises it in its job
        logging.getLogger(__name__).debug("warm-up import failed", exc_info=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m yarnflow.worker", description="Run a yarnflow TaskExecutor.")
    parser.add_argument("--resource-id", required=True, help="this TaskExecutor's id")
    parser.add_argument("--rm-address", default="",
                        help="HOST:PORT of the ResourceManager (with ZooKeeper high availability: where to "
                             "start; the leader is then followed in ZooKeeper)")
    parser.add_argument("--work-dir", required=True, help="local directory for artifacts and spill files")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    config = start_process(args)
    if config is None:
        return 2
    from yarnflow.common.errors import CoordinationUnavailableError
    from yarnflow.common.ha import create_ha_services, ha_enabled
    from yarnflow.worker.taskexecutor.task_executor import TaskExecutor

    if not args.rm_address and not ha_enabled(config):
        print("error: --rm-address is needed without ZooKeeper high availability", file=sys.stderr)
        return 2
    try:
        ha = create_ha_services(config, leader_address=args.rm_address)
    except CoordinationUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    te = TaskExecutor(config, ResourceID(args.resource_id), args.rm_address, args.work_dir, ha)
    shutdown_on_signals(te.shutdown)
    te.start()
    threading.Thread(target=warm_up, name="te-warm-up", daemon=True).start()
    while not te.wait(1.0):
        pass
    logging.getLogger(__name__).info("TaskExecutor exits: %s", te.exit_reason)
    return 1 if te.fatal else 0


if __name__ == "__main__":
    sys.exit(main())
