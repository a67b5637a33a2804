"""An embedded local cluster: one AppMaster that starts its TaskExecutors as local processes.
No Hadoop. Used by ``yarnflow run`` without ``--address``, by
``yarnflow session start --target local``, by tests and by benchmarks.

The AppMaster runs in a process of its own, or with ``appmaster_in_process=True`` on threads of
the calling process (``yarnflow.local_appmaster``: one process and ~90 MB fewer; what
``yarnflow run`` and ``env.execute()`` use when high availability is off).

With ZooKeeper high availability in its configuration, ``standby`` more AppMasters run beside
the first (each with its own work dir under this cluster's); the one ZooKeeper elects leads, and
``address`` is the leader's, looked up in ZooKeeper. TaskExecutors then outlive a killed leader
(they follow the next one), so the cluster finds its processes by an environment variable they
all inherit (``YARNFLOW_LOCAL_CLUSTER``), not by parentage.

Every process it starts is stopped by ``stop()`` (and dies with this process otherwise).
``stop()`` waits on the AppMaster, so call it from ordinary code, never from a signal handler
(which may run inside that very wait): a handler may call ``kill()``, which waits for nothing."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Callable, Mapping, Sequence, Union

import psutil

from yarnflow.common.config import Configuration, Options
from yarnflow.common.errors import ConfigurationError, HighAvailabilityError, UnavailableError, YarnflowError
from yarnflow.common.ha import ha_enabled
from yarnflow.common.rpc.gateways import RemoteDispatcherGateway
from yarnflow.common.security import (
    TlsCredentials,
    internal_credentials,
    new_credentials,
    publish,
    publish_to_storage,
    storage_folder,
    unpublish,
    unpublish_from_storage,
)

if TYPE_CHECKING:
    from yarnflow.am.resourcemanager.drivers.warm_workers import WarmWorkers
    from yarnflow.local_appmaster import InProcessAppMaster

CLUSTER_VAR = "YARNFLOW_LOCAL_CLUSTER"
log = logging.getLogger(__name__)
AppMasterHandle = Union[subprocess.Popen[bytes], "InProcessAppMaster"]
#: AppMaster index -> (the command it runs under, its own configuration): see LocalCluster.placement
Placement = Callable[[int], tuple[Sequence[str], Mapping[str, str]]]


class ClusterStartError(YarnflowError, RuntimeError):
    """The local cluster did not come up; the message includes the end of its log."""


class LocalCluster:
    def __init__(self, taskexecutors: int = 2, slots: int | None = None, conf: Mapping[str, str] | None = None,
                 work_dir: str | None = None, keep_work_dir: bool = False, die_with_parent: bool = True,
                 standby: int = 0, appmaster_in_process: bool = False,
                 placement: Placement | None = None) -> None:
        self.taskexecutors = taskexecutors
        self.conf = dict(conf or {})
        self.config = Configuration.load(self.conf)
        # -D taskmanager.numberOfTaskSlots names the slots of each TaskExecutor as surely as
        # --slots: the slots kept (taskexecutors x slots) must count with it
        self.slots = self.config[Options.NUM_SLOTS] if Options.NUM_SLOTS.key in self.conf or slots is None else slots
        self.ha = ha_enabled(self.config)
        if standby and not self.ha:
            raise ClusterStartError("standby AppMasters need ZooKeeper high availability: set "
                                    "high-availability.type=zookeeper, high-availability.zookeeper.quorum and "
                                    "high-availability.storageDir")
        self.standby = standby
        if appmaster_in_process and self.ha:
            raise ClusterStartError("an AppMaster in the calling process is for clusters without high "
                                    "availability: failing over needs AppMasters that can die apart from it")
        self.appmaster_in_process = appmaster_in_process
        if placement is not None and appmaster_in_process:
            raise ClusterStartError("an AppMaster in the calling process runs where it is: it takes no placement")
        #: where AppMaster ``i`` (0: the first, then the standbys) runs: a command its own runs
        #: under, and configuration of its own (its addresses); its TaskExecutors run there too.
        #: Tests place AppMasters on hosts of their own (network namespaces: the sandbox's hosts)
        self.placement = placement
        self._own_dir = work_dir is None
        self.work_dir = work_dir or tempfile.mkdtemp(prefix="yarnflow-local-")
        self.keep_work_dir = keep_work_dir
        #: on stop, keep ``<work dir>/log`` (a session's logs, to investigate it after it ended)
        self.keep_logs = False
        self._die_with_parent = die_with_parent
        self._warm: WarmWorkers | None = None
        self.proc: AppMasterHandle | None = None
        self.procs: list[AppMasterHandle] = []  # every AppMaster, the first (proc) included
        self.address = ""
        self.log_path = os.path.join(self.work_dir, "log", "appmaster.log")
        #: the cluster's credentials with security.ssl.internal.enabled (made here unless given)
        self.tls: TlsCredentials | None = None
        if self.config[Options.SSL_INTERNAL]:
            if not self.config[Options.SSL_INTERNAL_CERT] and not self.config[Options.SSL_INTERNAL_KEY]:
                made = new_credentials(os.path.join(self.work_dir, "security"))
                self.conf[Options.SSL_INTERNAL_CERT.key] = made.cert_file
                self.conf[Options.SSL_INTERNAL_KEY.key] = made.key_file
                self.config = Configuration.load(self.conf)
            try:
                self.tls = internal_credentials(self.config)
            except ConfigurationError as exc:
                raise ClusterStartError(str(exc)) from None
        self._published = ""
        self._stored = False
        if self.tls is not None and self.ha and storage_folder(self.config):
            publish_to_storage(self.tls, self.config)  # its clients find the leader, then these, there
            self._stored = True

    def prestart_taskexecutors(self, count: int) -> None:
        """Start ``count`` TaskExecutor processes now, before the cluster: they load what a
        TaskExecutor loads meanwhile, and the cluster's first TaskExecutors are these
        (``am/resourcemanager/drivers/warm_workers.py``). For an AppMaster in this process only
        (the processes wait for it as their parent); those not taken stop with the cluster."""
        from yarnflow.am.resourcemanager.drivers.warm_workers import WarmWorkers

        if not self.appmaster_in_process:
            raise ClusterStartError("TaskExecutors started ahead wait for an AppMaster in this process")
        if self._warm is None and count > 0:
            self._warm = WarmWorkers(self.config, count, self.work_dir, {CLUSTER_VAR: self.work_dir})

    def start(self, timeout_s: float = 30.0, wait_for_taskexecutors: bool = True,
              interrupted: Callable[[], bool] | None = None) -> LocalCluster:
        """Start the AppMaster and wait for its address (and its TaskExecutors). Raises
        ClusterStartError when it exits, does not come up within ``timeout_s`` or
        ``interrupted()`` becomes true while waiting; the caller should then call ``stop()``."""
        interrupted = interrupted or (lambda: False)
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        if self.ha:
            self._start_anew()
        address_file = os.path.join(self.work_dir, "appmaster.address")
        _remove_stale(address_file)  # (left by an earlier cluster in this work dir: never read it as ours)
        self.proc = self._start_appmaster(self.work_dir, self.log_path, address_file, 0)
        for i in range(1, self.standby + 1):
            am_dir = os.path.join(self.work_dir, f"standby-{i}")
            os.makedirs(am_dir, exist_ok=True)
            _remove_stale(os.path.join(am_dir, "appmaster.address"))
            self._start_appmaster(am_dir, os.path.join(self.work_dir, "log", f"appmaster-standby-{i}.log"),
                                  os.path.join(am_dir, "appmaster.address"), i)
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
        if self.ha:
            self.address = self.leader_address(deadline - time.monotonic())
        elif self.tls is not None:  # clients on this machine find them by the session's address
            self._published = self.address
            serving = self.procs[0] if self.procs and isinstance(self.procs[0], subprocess.Popen) else None
            publish(self.tls, self.address, serving.pid if serving is not None else None)
        if wait_for_taskexecutors:
            self.wait_for_taskexecutors(self.taskexecutors, deadline - time.monotonic(), interrupted)
        return self

    def _start_appmaster(self, work_dir: str, log_path: str, address_file: str, index: int) -> AppMasterHandle:
        conf = {"taskmanager.numberOfTaskSlots": str(self.slots),
                "slotmanager.number-of-slots.min": str(self.taskexecutors * self.slots),
                **self.conf}
        if self.appmaster_in_process:
            return self._start_appmaster_in_process(conf, work_dir, log_path, address_file)
        prefix: Sequence[str] = ()
        if self.placement is not None:
            prefix, own = self.placement(index)
            conf.update(own)
        cmd = [*prefix, sys.executable, "-m", "yarnflow.am", "--cluster-id", os.path.basename(self.work_dir),
               "--work-dir", work_dir, "--address-file", address_file]
        if self._die_with_parent:
            cmd += ["--parent-pid", str(os.getpid())]
        for k, v in conf.items():
            cmd += ["-D", f"{k}={v}"]
        env = {**os.environ, CLUSTER_VAR: self.work_dir}
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        self.procs.append(proc)
        return proc

    def _start_appmaster_in_process(self, conf: Mapping[str, str], work_dir: str, log_path: str,
                                    address_file: str) -> InProcessAppMaster:
        from yarnflow.common.errors import ConfigurationError, CoordinationUnavailableError
        from yarnflow.local_appmaster import InProcessAppMaster

        try:
            am = InProcessAppMaster(Configuration.load(conf), os.path.basename(self.work_dir), work_dir, log_path,
                                    {CLUSTER_VAR: self.work_dir}, self._warm)
        except (ConfigurationError, CoordinationUnavailableError, OSError) as exc:
            raise ClusterStartError(f"the AppMaster did not start: {exc}") from exc
        self.procs.append(am)
        tmp = address_file + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(am.address)
        os.replace(tmp, address_file)
        return am

    def appmasters(self) -> dict[str, AppMasterHandle]:
        """address -> process of every AppMaster serving (for tests)."""
        found = {}
        for i, proc in enumerate(self.procs):
            folder = self.work_dir if i == 0 else os.path.join(self.work_dir, f"standby-{i}")
            try:
                with open(os.path.join(folder, "appmaster.address")) as fh:
                    found[fh.read().strip()] = proc
            except OSError:
                continue
        return found

    def _start_anew(self) -> None:
        """A new cluster under the id of one that was stopped: ZooKeeper's mark of that one's
        shutdown would have the new AppMasters exit at once."""
        from yarnflow.common.ha import create_ha_services

        ha = create_ha_services(self.config)
        try:
            ha.start_anew()
        except HighAvailabilityError as exc:
            raise ClusterStartError(f"{exc}: stop it first, or start this one under another "
                                    "high-availability.cluster-id") from None
        finally:
            ha.close()

    def leader_address(self, timeout_s: float) -> str:
        """The address of the AppMaster that leads now (ZooKeeper high availability), waiting
        up to ``timeout_s`` for one."""
        from yarnflow.common.ha import create_ha_services

        found: list[str] = []
        ha = create_ha_services(self.config)
        retrieval = ha.leader_retrieval()
        retrieval.start(lambda leader: found.append(leader.address) if leader is not None else None)
        try:
            deadline = time.monotonic() + max(timeout_s, 1.0)
            while not found:
                if not any(p.poll() is None for p in self.procs):
                    raise ClusterStartError(f"every AppMaster exited:\n{self.log_tail()}")
                if time.monotonic() > deadline:
                    raise ClusterStartError(f"no AppMaster became leader in time:\n{self.log_tail()}")
                time.sleep(0.05)
            return found[-1]
        finally:
            retrieval.stop()
            ha.close()

    def wait_for_taskexecutors(self, count: int, timeout_s: float,
                               interrupted: Callable[[], bool] | None = None) -> None:
        gw = self.gateway()
        deadline = time.monotonic() + max(timeout_s, 1.0)
        try:
            while gw.cluster_info().total_slots < count * self.slots:  # (with slot processes: one TaskExecutor a slot)
                if interrupted is not None and interrupted():
                    raise ClusterStartError("interrupted while the TaskExecutors were starting")
                if self.proc is not None and self.proc.poll() is not None:
                    raise ClusterStartError(f"the AppMaster exited:\n{self.log_tail()}")
                if time.monotonic() > deadline:
                    raise ClusterStartError(f"{count} TaskExecutors did not register in time:\n{self.log_tail()}")
                time.sleep(0.05)
        finally:
            gw.close()

    def web_url(self) -> str:
        """The leading AppMaster's REST API and web UI ("" when it serves none)."""
        gw = self.gateway()
        try:
            return gw.cluster_info().web_url
        finally:
            gw.close()

    def gateway(self, timeout_ms: int = 30_000) -> RemoteDispatcherGateway:
        return RemoteDispatcherGateway(self.address, timeout_ms, tls=self.tls)

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, errors="replace") as fh:
                return "".join(fh.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def pids(self) -> list[int]:
        """The pids of the cluster's live processes: AppMasters first (not this process, where
        one runs on its threads), then TaskExecutors."""
        return [p.pid for p in self.procs if isinstance(p, subprocess.Popen) and p.poll() is None] + \
            [p.pid for p in self._descendants()]

    def kill(self) -> None:
        """SIGKILL the AppMasters (without high availability their TaskExecutors die with
        them); safe in a signal handler. ``stop()`` still has to be called to reap them, stop
        what is left and remove the work dir."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()

    def stop(self, timeout_s: float = 20.0) -> None:
        """Shut the cluster down (through the leading AppMaster, or SIGTERM, then SIGKILL after
        ``timeout_s``), wait until its AppMasters and TaskExecutors are gone and remove the work
        dir if this cluster made it. Idempotent."""
        others = self._descendants()
        live = [p for p in self.procs if p.poll() is None]
        if live:
            asked = False
            if self.ha:  # the leader may have changed since the cluster started
                try:
                    self.address = self.leader_address(3.0)
                except (ClusterStartError, YarnflowError):
                    pass
            if self.address:
                gw = RemoteDispatcherGateway(self.address, 5000, tls=self.tls)
                try:
                    gw.shutdown_cluster()  # standbys see the cluster shut down and exit too
                    asked = True
                except (YarnflowError, UnavailableError):
                    pass
                finally:
                    gw.close()
            for proc in live:
                if not asked:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            for proc in live:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGTERM)
            for proc in live:
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    try:
                        proc.wait(5)
                    except subprocess.TimeoutExpired:  # an AppMaster on our threads, stuck: its TaskExecutors are gone
                        log.warning("the AppMaster's shutdown did not end; leaving its threads")
        if self._warm is not None:  # (started ahead and never taken)
            self._warm.close()
        _wait_gone(others + self._descendants(), 5.0)  # orphaned TaskExecutors must not write into a removed dir
        if self._published:
            unpublish(self._published)
            self._published = ""
        if self._stored:
            unpublish_from_storage(self.config)
            self._stored = False
        if self._own_dir and not self.keep_work_dir:
            if self.keep_logs:  # everything but the log folder goes (a session's logs outlive it)
                for entry in os.listdir(self.work_dir) if os.path.isdir(self.work_dir) else ():
                    if entry != "log":
                        path = os.path.join(self.work_dir, entry)
                        if os.path.isdir(path) and not os.path.islink(path):
                            shutil.rmtree(path, ignore_errors=True)
                        else:
                            with contextlib.suppress(OSError):
                                os.remove(path)
            else:
                shutil.rmtree(self.work_dir, ignore_errors=True)

    def _descendants(self) -> list[psutil.Process]:
        """Every live process of this cluster but the AppMasters it started: found by the
        environment variable they inherit (TaskExecutors may have outlived their AppMaster)."""
        mine = {p.pid for p in self.procs}
        found = []
        for proc in psutil.process_iter(["pid"]):
            if proc.pid in mine or proc.pid == os.getpid():
                continue
            try:
                if proc.environ().get(CLUSTER_VAR) == self.work_dir and _running(proc):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

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


def _remove_stale(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def prestarted(taskexecutors: int | None, slots: int | None, conf: Mapping[str, str]) -> LocalCluster | None:
    """``yarnflow run``'s embedded cluster, made before the job file runs, with its TaskExecutor
    processes already started (``LocalCluster.prestart_taskexecutors``): ``taskexecutors`` of
    them, or as many as the default parallelism's slots need. None with high availability (the
    AppMaster then runs as a process of its own, which starts its own)."""
    if ha_enabled(Configuration.load(conf)):
        return None  # (checked before a cluster, and its work dir, is made)
    cluster = LocalCluster(taskexecutors or 1, slots, conf, appmaster_in_process=True)
    if not taskexecutors:
        cluster.taskexecutors = max(1, -(-cluster.config[Options.PARALLELISM] // cluster.slots))
    try:
        cluster.prestart_taskexecutors(cluster.taskexecutors)
    except BaseException:
        cluster.stop()
        raise
    return cluster
