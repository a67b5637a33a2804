"""What the AppMaster and TaskExecutor entry points share: common flags, logging, dying with
the parent process (local mode), configuration from -D pairs, and shutdown on signals."""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import logging
import os
import signal
import sys
import threading
from typing import Callable

from yarnflow.common import logs
from yarnflow.common.config import Configuration, parse_dynamic_properties
from yarnflow.common.errors import ConfigurationError


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parent-pid", type=int, default=0, help="exit when this process dies (local mode)")
    parser.add_argument("-D", dest="dynamic", action="append", default=[], metavar="KEY=VALUE",
                        help="configuration override (repeatable)")


def die_with_parent(parent_pid: int) -> None:
    """Linux: get SIGTERM when the process that started us dies (local driver only)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def start_process(args: argparse.Namespace, configure_memory: bool = True) -> Configuration | None:
    """Logging, parent-death signal and configuration for an entry point; None (after an
    error line on stderr) when the configuration is bad. ``configure_memory=False``: the caller
    applies the process memory settings itself, later (``apply_memory_settings``), or never (a
    process that loads no Arrow)."""
    logging.basicConfig(level=os.environ.get("YARNFLOW_LOG_LEVEL", "INFO"), format=logs.FORMAT)
    logs.install()  # lines of a job's threads carry [job <id>] (yarnflow logs JOB_ID)
    if args.parent_pid:
        die_with_parent(args.parent_pid)
    # `kill -USR1 <pid>` writes every thread's stack to the log: for a task that seems stuck
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    try:
        config = Configuration.load(parse_dynamic_properties(args.dynamic))
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    if configure_memory:
        apply_memory_settings(config)
    return config


def apply_memory_settings(config: Configuration) -> None:
    """The process memory settings (allocators, pandas deferral): before the first use of Arrow."""
    from yarnflow.common.config import Options
    from yarnflow.common.memory import configure_process_memory

    configure_process_memory(config[Options.ARROW_ALLOCATOR], config[Options.MALLOC_ARENA_MAX],
                             config[Options.DEFER_PANDAS])


def shutdown_on_signals(shutdown: Callable[[str], None]) -> None:
    """SIGTERM / SIGINT call ``shutdown(reason)`` on a thread of its own (once, for the first
    signal). The handler only writes the signal's number to a pipe that this thread reads: a
    handler runs in whatever frame the main thread is in, so it must take no lock and start no
    thread (``Thread.start`` takes a lock the interrupted frame may hold)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def wait_for_signal() -> None:
        signum = os.read(read_fd, 1)[0]
        shutdown(f"signal {signal.Signals(signum).name}")

    threading.Thread(target=wait_for_signal, name="signal-shutdown", daemon=True).start()

    def on_signal(signum: int, _frame: object) -> None:
        try:
            os.write(write_fd, bytes([signum]))
        except OSError:  # the pipe is full: a shutdown is under way already
            pass

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
