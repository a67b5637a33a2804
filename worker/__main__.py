"""``python -m yarnflow.worker``: run one TaskExecutor process."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import threading
import time

from yarnflow.common.ids import ResourceID
from yarnflow.common.config import Configuration, parse_dynamic_properties
from yarnflow.common.errors import ConfigurationError
from yarnflow.common.process import (add_common_arguments, apply_memory_settings, die_with_parent,
                                     shutdown_on_signals, start_process)


def appmaster_from_yarn(timeout_s: float = 60.0) -> str:
    """In a YARN container of a yarnflow application that its ResourceManager did not request (a
    ``skein container scale --service taskexecutor``, so no ``--rm-address``): the AppMaster's
    address, from the application's key-value store, where the AppMaster publishes it once it
    leads. Empty outside YARN, or when none appears within ``timeout_s``."""
    if not os.environ.get("SKEIN_APPLICATION_ID"):
        return ""
    import skein

    from yarnflow.common.yarn import ADDRESS_KEY

    deadline = time.monotonic() + timeout_s
    try:
        kv = skein.ApplicationClient.from_current().kv
        while True:
            value = kv.get(ADDRESS_KEY)
            if value or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    except Exception as exc:  # noqa: BLE001 - skein's errors: no address, said why below
        logging.getLogger(__name__).warning("cannot read the AppMaster's address from YARN: %s", exc)
        return ""
    if value:
        logging.getLogger(__name__).info("started outside the ResourceManager's requests: its AppMaster is at %s",
                                         value.decode())
    return value.decode() if value else ""


def warm_then_main(argv: list[str]) -> int:
    """``python -m yarnflow.worker --warm --resource-id ID --work-dir DIR [--parent-pid P] [-D
    memory settings]``: a TaskExecutor process started ahead of its cluster
    (``am/resourcemanager/drivers/warm_workers.py``). It loads what a TaskExecutor loads, then
    reads the rest of its command line from stdin (one JSON line: ``{"argv": [...]}``) and runs
    as ``main`` with both. Exits (0) when stdin closes first."""
    import json

    parser = argparse.ArgumentParser(prog="python -m yarnflow.worker --warm")
    parser.add_argument("--warm", action="store_true")
    parser.add_argument("--resource-id", required=True)
    parser.add_argument("--work-dir", required=True)
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.parent_pid:
        die_with_parent(args.parent_pid)
    try:
        config = Configuration.load(parse_dynamic_properties(args.dynamic))
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    apply_memory_settings(config)
    _load_taskexecutor(config)
    line = sys.stdin.readline()
    if not line.strip():
        return 0  # (not needed after all)
    rest = [str(a) for a in json.loads(line)["argv"]]
    return main([a for a in argv if a != "--warm"] + rest, warm=True)


def _load_taskexecutor(config: Configuration) -> None:
    """Load the TaskExecutor's modules; pandas and the operators on threads of their own."""
    from yarnflow.common.config import Options
    from yarnflow.common.memory import warm_pandas_support
    from yarnflow.worker.taskexecutor.task_executor import TaskExecutor  # noqa: F401 - loaded for later

    if not config[Options.DEFER_PANDAS]:
        warm_pandas_support()  # (alongside the start below: ~0.3 s of CPU out of the first job's way)
    if config[Options.METRICS_REPORTERS] == "prom":  # (its endpoint starts before registering: ~12-30 ms)
        import prometheus_client  # noqa: F401 - loaded for later
    warm_operator_modules()


def main(argv: list[str] | None = None, warm: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="python -m yarnflow.worker", description="Run a yarnflow TaskExecutor.")
    parser.add_argument("--resource-id", required=True, help="this TaskExecutor's id")
    parser.add_argument("--rm-address", default="",
                        help="HOST:PORT of the ResourceManager (with ZooKeeper high availability: where to "
                             "start; the leader is then followed in ZooKeeper)")
    parser.add_argument("--work-dir", required=True, help="local directory for artifacts and spill files")
    parser.add_argument("--container-id", default="",
                        help="the worker this TaskExecutor is one slot process of (set by that worker's launcher; "
                             "taskmanager.slot-processes)")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    config = start_process(args, configure_memory=False)
    if config is None:
        return 2
    from yarnflow.common.config import Options
    from yarnflow.common.ha import ha_enabled

    from yarnflow.worker.slot_processes import wanted

    launcher = wanted(config)
    if not launcher and not warm:  # (a worker of slot processes loads no Arrow: it only starts
        apply_memory_settings(config)        # and watches them)

    if not args.rm_address and not ha_enabled(config):
        args.rm_address = appmaster_from_yarn()
    if not args.rm_address and not ha_enabled(config):
        print("error: --rm-address is needed without ZooKeeper high availability (or in a YARN container "
              "of a yarnflow application, whose AppMaster it finds)", file=sys.stderr)
        return 2
    if launcher:
        return run_slot_processes(config, args)  # (before the imports below: it needs none of them)
    from yarnflow.common.addresses import check_bind_address, check_reachable_from
    from yarnflow.common.errors import ConfigurationError, CoordinationUnavailableError
    from yarnflow.common.ha import create_ha_services
    from yarnflow.common.kerberos import TicketRenewal
    from yarnflow.worker.taskexecutor.task_executor import TaskExecutor

    TicketRenewal.in_container(config)  # a YARN container with the application's keytab renews its tickets
    if not warm:  # (a warm process loaded it all before it was taken)
        _load_taskexecutor(config)
    try:
        check_bind_address(config[Options.TM_HOST], Options.TM_HOST.key)
        check_reachable_from(config[Options.TM_HOST], Options.TM_HOST.key, args.rm_address.rpartition(":")[0])
        ha = create_ha_services(config, leader_address=args.rm_address)
    except (ConfigurationError, CoordinationUnavailableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    te = TaskExecutor(config, ResourceID(args.resource_id), args.rm_address, args.work_dir, ha,
                      container_id=args.container_id)
    shutdown_on_signals(te.shutdown)
    te.start()
    while not te.wait(1.0):
        pass
    logging.getLogger(__name__).info("TaskExecutor exits: %s", te.exit_reason)
    return 1 if te.fatal else 0


#: what nearly every task loads at its first deployment (~60 ms of CPU, measured with
#: ``PYTHONPROFILEIMPORTTIME``): loaded as the TaskExecutor starts, alongside its registration,
#: rather than on the first task's thread while the job waits for it
OPERATOR_MODULES = ("pyarrow.parquet", "pyarrow.dataset", "pyarrow.acero", "yarnflow.worker.operators.sources",
                    "yarnflow.worker.operators.transforms", "yarnflow.worker.operators.keyed",
                    "yarnflow.worker.operators.sinks", "yarnflow.worker.operators.batch.aggregate")


def warm_operator_modules() -> threading.Thread:
    def load() -> None:
        for name in OPERATOR_MODULES:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the task that needs it will say why it cannot load
                logging.getLogger(__name__).debug("preloading %s failed", name, exc_info=True)

    thread = threading.Thread(target=load, name="warm-operators", daemon=True)
    thread.start()
    return thread


def run_slot_processes(config: Configuration, args: argparse.Namespace) -> int:
    """This worker as one TaskExecutor process per slot (``yarnflow.worker.slot_processes``)."""
    from yarnflow.worker.slot_processes import SlotProcesses, slot_commands

    commands = slot_commands(config, args.resource_id, args.rm_address, args.work_dir, args.dynamic)
    logging.getLogger(__name__).info("worker %s: %d slot processes", args.resource_id, len(commands))
    processes = SlotProcesses(commands)
    shutdown_on_signals(processes.stop)
    return processes.run()


if __name__ == "__main__":
    code = warm_then_main(sys.argv[1:]) if sys.argv[1:2] == ["--warm"] else main()
    # the TaskExecutor has stopped everything it started: the interpreter's own teardown of
    # pyarrow, gRPC and their threads (~0.1 s) is not waited for
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
