"""A worker of several slots as one TaskExecutor process per slot (``taskmanager.slot-processes``).

The slots of one TaskExecutor process are threads of one interpreter: per-row Python code in all
of them runs at one core's pace, whatever cores the worker was given. With slot processes, what
the ResourceManager's driver starts (a local process, a YARN container) is a launcher that runs
``taskmanager.numberOfTaskSlots`` one-slot TaskExecutors, each with an equal share of the
worker's memory and cores. Each registers with the ResourceManager by itself as
``<worker>-s<i>``, naming the worker it belongs to, so the ResourceManager counts the worker's
slots as they arrive and removes them all when the worker ends.

The worker is the unit of failure, as a TaskExecutor process is: a slot process that fails
(exits non-zero or by a signal) takes the others down, and the launcher exits with its code, so
the driver reports the worker and every job that had a slot in it restarts what ran there. A
slot process that ends on purpose (released when idle) just ends; the launcher ends with the
last of them. The slot processes die with the launcher (a parent-death signal)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Mapping

from yarnflow.common.config import Configuration, Options, taskexecutor_cores

log = logging.getLogger(__name__)

#: options given to each slot process: its share of the worker
SPLIT_SIZES = (Options.MANAGED_MEMORY_SIZE, Options.TASK_OFF_HEAP)
#: what the launcher itself keeps of the worker's memory (it loads no Arrow: ~35 MB measured)
LAUNCHER_RESERVE_BYTES = 48 << 20


def wanted(config: Configuration, env: Mapping[str, str] = os.environ) -> bool:
    """Whether this worker runs as slot processes: ``taskmanager.slot-processes``, where ``auto``
    means in a YARN container (``CONTAINER_ID``: YARN granted vcores for each slot) and not
    elsewhere (a local cluster's default layout already gives each slot a process)."""
    if config[Options.NUM_SLOTS] < 2:
        return False
    value = config[Options.SLOT_PROCESSES]
    return bool(env.get("CONTAINER_ID")) if value == "auto" else value == "true"


def slot_resource_id(worker_id: str, index: int) -> str:
    return f"{worker_id}-s{index}"


def slot_overrides(config: Configuration) -> dict[str, str]:
    """What a slot process's configuration says differently from its worker's: one slot, not
    split again, and its share of the worker's memory and cores."""
    slots = config[Options.NUM_SLOTS]
    out = {Options.NUM_SLOTS.key: "1", Options.SLOT_PROCESSES.key: "false",
           Options.TM_CPU.key: repr(taskexecutor_cores(config) / slots),
           Options.TM_MEMORY.key: str(slot_process_size(config))}
    for option in SPLIT_SIZES:
        value = config[option]
        if value:
            out[option.key] = str(int(value) // slots)
    return out


def slot_process_size(config: Configuration) -> int:
    """``taskmanager.memory.process.size`` of each slot process: an equal share of the worker's,
    less what the launcher keeps (the watchdog of each then holds the worker inside its limit)."""
    size = config[Options.TM_MEMORY]
    return (size - min(LAUNCHER_RESERVE_BYTES, size // 10)) // config[Options.NUM_SLOTS]


def slot_commands(config: Configuration, worker_id: str, rm_address: str, work_dir: str,
                  dynamic: list[str]) -> list[tuple[str, list[str]]]:
    """(resource id, command line) of each slot process of worker ``worker_id``."""
    overrides = [f"{k}={v}" for k, v in slot_overrides(config).items()]
    commands = []
    for i in range(config[Options.NUM_SLOTS]):
        rid = slot_resource_id(worker_id, i)
        cmd = [sys.executable, "-m", "yarnflow.worker", "--resource-id", rid, "--container-id", worker_id,
               "--work-dir", os.path.join(work_dir, f"s{i}"), "--parent-pid", str(os.getpid())]
        if rm_address:
            cmd += ["--rm-address", rm_address]
        for pair in [*dynamic, *overrides]:  # (the later of two pairs for one key wins)
            cmd += ["-D", pair]
        commands.append((rid, cmd))
    return commands


def own_log_dir() -> str:
    """The folder of this process's log when its stdout is a ``<id>.log`` file (the local driver's
    layout); "" otherwise."""
    try:
        path = os.readlink("/proc/self/fd/1")
    except OSError:
        return ""
    return os.path.dirname(path) if path.endswith(".log") and os.path.isfile(path) else ""


class SlotProcesses:
    """Runs and watches the slot processes of one worker (``run`` returns the worker's exit code)."""

    def __init__(self, commands: list[tuple[str, list[str]]], grace_s: float = 10.0) -> None:
        self._commands = commands
        self._grace_s = grace_s
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._stopping = threading.Event()

    def run(self) -> int:
        log_dir = own_log_dir()
        for rid, cmd in self._commands:
            if log_dir:  # each slot process logs where a TaskExecutor of its id would
                with open(os.path.join(log_dir, f"{rid}.log"), "ab") as out:
                    self._procs[rid] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                                        stderr=subprocess.STDOUT)
            else:  # (a YARN container's stdout and stderr: its lines go with the worker's)
                self._procs[rid] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
            log.info("slot process %s started (pid %d)", rid, self._procs[rid].pid)
        live = dict(self._procs)
        code = 0
        while live:
            time.sleep(0.05)
            for rid, proc in list(live.items()):
                rc = proc.poll()
                if rc is None:
                    continue
                del live[rid]
                if rc == 0 or self._stopping.is_set():
                    log.info("slot process %s (pid %d) ended (code %d)", rid, proc.pid, rc)
                    continue
                log.error("slot process %s (pid %d) failed (%s): stopping the worker's other slot processes",
                          rid, proc.pid, f"signal {-rc}" if rc < 0 else f"code {rc}")
                code = code or (128 - rc if rc < 0 else rc)
                self.stop(f"slot process {rid} failed")
        return code

    def stop(self, reason: str) -> None:
        """SIGTERM every slot process (each shuts down as a TaskExecutor does); SIGKILL those
        still there after the grace period."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        log.info("stopping %d slot processes: %s", len(self._procs), reason)
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        threading.Thread(target=self._kill_stragglers, name="slot-process-grace", daemon=True).start()

    def _kill_stragglers(self) -> None:
        deadline = time.monotonic() + self._grace_s
        for proc in self._procs.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("slot process pid %d ignored SIGTERM for %.0f s: killing it", proc.pid, self._grace_s)
                proc.kill()
