"""TaskExecutor processes started before their cluster (an embedded local cluster's fixed cost,
issue 54).

A TaskExecutor process spends ~0.4 s loading Python, pyarrow, Arrow Flight and the operators
before it can register. ``yarnflow run`` on an embedded local cluster starts the processes it
expects to need as its very first step (``LocalCluster.prestart_taskexecutors``), while the job
file still has to run and be compiled. Each is ``python -m yarnflow.worker --warm`` with its
final resource id, work dir, log and parent already: it applies the process memory settings,
loads what a TaskExecutor loads and waits on its stdin. When the cluster's ResourceManager
asks the ``LocalProcessDriver`` for a TaskExecutor, the driver ``take``s a waiting process and
writes the rest of its command line to its stdin (the ResourceManager's address and the
configuration: one JSON line), instead of starting a new process. The TaskExecutor then runs
as a freshly started one would, with the same arguments, parent, environment and log. A
process not taken exits when its stdin closes (``close``, or this process ending).

Only processes started with the cluster's memory settings are taken (the settings a process
applies before it loads Arrow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Mapping

from yarnflow.common.config import Configuration, Options
from yarnflow.common.ids import ResourceID

WARM_FLAG = "--warm"
MEMORY_OPTIONS = (Options.ARROW_ALLOCATOR, Options.MALLOC_ARENA_MAX, Options.DEFER_PANDAS)


def worker_layout(work_dir: str, resource_id: ResourceID) -> tuple[str, str]:
    """A TaskExecutor's work dir and log file in the cluster's ``work_dir`` (created)."""
    own, log_dir = os.path.join(work_dir, "taskexecutors", resource_id), os.path.join(work_dir, "log")
    os.makedirs(own, exist_ok=True)
    os.makedirs(log_dir, exist_ok=True)
    return own, os.path.join(log_dir, f"{resource_id}.log")


def _memory(config: Configuration) -> dict[str, str]:
    strings = config.to_strings()
    return {o.key: strings[o.key] for o in MEMORY_OPTIONS}


class WarmWorkers:
    """Processes waiting to become TaskExecutors of the cluster in ``work_dir`` (see the module
    docstring); ``env`` is added to their environment, as the driver adds it to its workers'."""

    def __init__(self, config: Configuration, count: int, work_dir: str, env: Mapping[str, str]) -> None:
        self._memory = _memory(config)
        self._lock = threading.Lock()
        self._waiting: list[tuple[ResourceID, subprocess.Popen[bytes]]] = []
        for i in range(count):
            resource_id = ResourceID(f"te-w{i + 1}-{ResourceID.generate()[3:9]}")
            own_dir, log_path = worker_layout(work_dir, resource_id)
            cmd = [sys.executable, "-m", "yarnflow.worker", WARM_FLAG, "--resource-id", resource_id,
                   "--work-dir", own_dir, "--parent-pid", str(os.getpid())]
            for key, value in self._memory.items():
                cmd += ["-D", f"{key}={value}"]
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                        env={**os.environ, **env})
            self._waiting.append((resource_id, proc))

    def pids(self) -> list[int]:
        with self._lock:
            return [p.pid for _, p in self._waiting]

    def take(self, config: Configuration, rm_address: str, parent_pid: int | None
             ) -> tuple[ResourceID, subprocess.Popen[bytes]] | None:
        """A waiting process made a TaskExecutor of ``config`` registering at ``rm_address``
        (``parent_pid``: it dies with that process), with its resource id; None when none is
        left alive and started with ``config``'s memory settings."""
        if _memory(config) != self._memory:
            return None
        while True:
            with self._lock:
                if not self._waiting:
                    return None
                resource_id, proc = self._waiting.pop(0)
            if proc.poll() is not None or proc.stdin is None:  # (died while waiting: passed over)
                _close_stdin(proc)
                continue
            argv = ["--rm-address", rm_address]
            if parent_pid:
                argv += ["--parent-pid", str(parent_pid)]
            for key, value in config.to_strings().items():
                argv += ["-D", f"{key}={value}"]
            try:
                proc.stdin.write(json.dumps({"argv": argv}).encode() + b"\n")
                proc.stdin.close()
            except OSError:  # it died meanwhile: the next one
                _close_stdin(proc)
                proc.wait(5)
                continue
            return resource_id, proc

    def close(self) -> None:
        """The processes not taken exit (their stdin closes); waits for them."""
        with self._lock:
            left, self._waiting = self._waiting, []
        for _, proc in left:
            _close_stdin(proc)
        for _, proc in left:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _close_stdin(proc: subprocess.Popen[bytes]) -> None:
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:  # (a broken pipe: the process is gone)
        pass
