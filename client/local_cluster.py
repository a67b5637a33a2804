"""An embedded local cluster: one AppMaster process that starts its TaskExecutors as local
processes. No Hadoop, no ZooKeeper. Used by ``yarnflow run`` without ``--address``, by
``yarnflow session start --target local``, by tests and by benchmarks.

Every process it starts is stopped by ``stop()`` (and dies with this process otherwise).
``stop()`` waits on the AppMaster, so call it from ordinary code, never from a signal handler
(which may run inside that very wait): a handler may call ``kill()``, which waits for nothing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Mapping

import psutil

from yarnflow.common.errors import UnavailableError, YarnflowError
from yarnflow.common.rpc.gateways import RemoteDispatcherGateway


class ClusterStartError(YarnflowError, RuntimeError):
    """The local cluster did not come up; the message includes the end of its log."""


class LocalCluster:
    def __init__(self, taskexecutors: int = 2, slots: int = 2, conf: Mapping[str, str] | None = None,
                 work_dir: str | None = None, keep_work_dir: bool = False, die_with_parent: bool = True) -> None:
        self.taskexecutors = taskexecutors
        self.slots = slots
        self.conf = dict(conf or {})
        self._own_dir = work_dir is None
        self.work_dir = work_dir or tempfile.mkdtemp(prefix="yarnflow-local-")
        self.keep_work_dir = keep_work_dir
        self._die_with_parent = die_with_parent
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.log_path = os.path.join(self.work_dir, "log", "appmaster.log")

    def start(self, timeout_s: float = 30.0, wait_for_taskexecutors: bool = True,
              interrupted: Callable[[], bool] | None = None) -> LocalCluster:
        """Start the AppMaster and wait for its address (and its TaskExecutors). Raises
        ClusterStartError when it exits, does not come up within ``timeout_s`` or
        ``interrupted()`` becomes true while waiting; the caller should then call ``stop()``."""
        interrupted = interrupted or (lambda: False)
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        address_file = os.path.join(self.work_dir, "appmaster.address")
        conf = {"taskmanager.numberOfTaskSlots": str(self.slots),
                "slotmanager.number-of-slots.min": str(self.taskexecutors * self.slots),
                **self.conf}
        cmd = [sys.executable, "-m", "yarnflow.am", "--cluster-id", os.path.basename(self.work_dir),
               "--work-dir", self.work_dir, "--address-file", address_file]
        if self._die_with_parent:
            cmd += ["--parent-pid", str(os.getpid())]
        for k, v in conf.items():
            cmd += ["-D", f"{k}={v}"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(address_file):
            if interrupted():
                raise ClusterStartError("interrupted while the AppMaster was starting")
            if self.proc.poll() is not None:
                raise ClusterStartError(f"the AppMaster exited with code {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise ClusterStartError(f"the AppMaster did not start within {timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(0.02)
        with open(address_file) as fh:
            self.address = fh.read().strip()
        if wait_for_taskexecutors:
            self.wait_for_taskexecutors(self.taskexecutors, deadline - time.monotonic(), interrupted)
        return self

    def wait_for_taskexecutors(self, count: int, timeout_s: float,
                               interrupted: Callable[[], bool] | None = None) -> None:
        gw = self.gateway()
        deadline = time.monotonic() + max(timeout_s, 1.0)
        try:
            while gw.cluster_info().registered_taskexecutors < count:
                if interrupted is not None and interrupted():
                    raise ClusterStartError("interrupted while the TaskExecutors were starting")
                if self.proc is not None and self.proc.poll() is not None:
                    raise ClusterStartError(f"the AppMaster exited:\n{self.log_tail()}")
                if time.monotonic() > deadline:
                    raise ClusterStartError(f"{count} TaskExecutors did not register in time:\n{self.log_tail()}")
                time.sleep(0.05)
        finally:
            gw.close()

    def gateway(self, timeout_ms: int = 30_000) -> RemoteDispatcherGateway:
        return RemoteDispatcherGateway(self.address, timeout_ms)

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, errors="replace") as fh:
                return "".join(fh.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def pids(self) -> list[int]:
        """The AppMaster's pid and every TaskExecutor pid it reports (for tests)."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        return [self.proc.pid] + [c.pid for c in self._descendants()]

    def kill(self) -> None:
        """SIGKILL the AppMaster (its TaskExecutors die with it); safe in a signal handler.
        ``stop()`` still has to be called to reap it and remove the work dir."""
        if self.proc is not None:
            self.proc.kill()

    def stop(self, timeout_s: float = 20.0) -> None:
        """Shut the cluster down (through the AppMaster, or SIGTERM, then SIGKILL after
        ``timeout_s``), wait until the AppMaster and its TaskExecutors are gone and remove the
        work dir if this cluster made it. Idempotent."""
        proc = self.proc
        descendants = self._descendants()
        if proc is not None and proc.poll() is None:
            if self.address:
                gw = RemoteDispatcherGateway(self.address, 5000)
                try:
                    gw.shutdown_cluster()
                except (YarnflowError, UnavailableError):
                    proc.send_signal(signal.SIGTERM)
                finally:
                    gw.close()
            else:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        _wait_gone(descendants, 5.0)  # orphaned TaskExecutors must not write into a removed dir
        if self._own_dir and not self.keep_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def _descendants(self) -> list[psutil.Process]:
        if self.proc is None or self.proc.poll() is not None:
            return []
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> None:
    """Wait for ``procs`` (not our children: nothing to reap) to exit; SIGKILL what is left."""
    deadline = time.monotonic() + timeout_s
    while True:
        procs = [p for p in procs if _running(p)]
        if not procs:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
