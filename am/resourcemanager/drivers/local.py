"""LocalProcessDriver: TaskExecutors as local processes (``python -m yarnflow.worker``).

Each process logs to ``<work dir>/log/<resource id>.log``; a watcher thread notices when one
exits and tells the ResourceManager why (exit code or signal). Without high availability workers
are started with ``--parent-pid`` so they die with the AppMaster even when it is killed with
SIGKILL. With ZooKeeper HA they outlive it: they find the leader in ZooKeeper and register with
whichever AppMaster leads next (a TaskExecutor that finds none exits after
``taskmanager.registration.timeout``).

Every process is started from one thread of the driver's (``_launch``) that lives as long as the
driver: Linux sends the parent-death signal when the *thread* that forked a child ends, not the
process. A TaskExecutor started from the RPC thread of a client's call (``yarnflow session
scale``) got SIGTERM as soon as that client hung up, and was replaced by another."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping

from yarnflow.am.resourcemanager.drivers.base import WorkerTerminated
from yarnflow.am.resourcemanager.drivers.warm_workers import WarmWorkers, worker_layout
from yarnflow.common.config import Configuration
from yarnflow.common.ha import ha_enabled
from yarnflow.common.ids import ResourceID

log = logging.getLogger(__name__)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"process killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"process killed by signal {-code}"
    return f"process exited with code {code}"


class LocalProcessDriver:
    #: Spark stages run Spark inside their TaskExecutor unless spark-stages.executors says cluster
    spark_in_containers = False

    def __init__(self, config: Configuration, work_dir: str, env: Mapping[str, str] | None = None,
                 warm: WarmWorkers | None = None) -> None:
        self._config = config
        #: TaskExecutor processes started ahead of the cluster, taken before starting new ones
        self._warm = warm
        self._work_dir = work_dir
        #: set in every TaskExecutor's environment (beside this process's own)
        self._env = dict(env or {})
        self._procs: dict[ResourceID, subprocess.Popen[bytes]] = {}
        self._stopping: set[ResourceID] = set()
        self._lock = threading.Lock()
        self._rm_address = ""
        self._on_terminated: WorkerTerminated | None = None
        self._closed = False
        self._counter = 0
        self._spark: dict[str, tuple[subprocess.Popen[bytes], str]] = {}  # handle -> (process, url file)
        #: the one thread that starts processes (see the module docstring)
        self._launcher = ThreadPoolExecutor(1, thread_name_prefix="process-launcher")

    def _launch(self, cmd: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """``subprocess.Popen(cmd, **kwargs)`` from the launcher thread, which outlives the child."""
        def popen() -> subprocess.Popen[bytes]:
            return subprocess.Popen(cmd, **kwargs)

        return self._launcher.submit(popen).result()

    def start(self, rm_address: str, on_terminated: WorkerTerminated) -> None:
        self._rm_address = rm_address
        self._on_terminated = on_terminated

    def start_worker(self) -> ResourceID:
        with self._lock:
            if self._closed:
                raise RuntimeError("driver stopped")
            self._counter += 1
            resource_id = ResourceID(f"te-{self._counter}-{ResourceID.generate()[3:9]}")
        parent = None if ha_enabled(self._config) else os.getpid()
        taken = self._warm.take(self._config, self._rm_address, parent) if self._warm is not None else None
        if taken is not None:  # (one started ahead of the cluster: see warm_workers.py)
            resource_id, proc = taken
            log_path = worker_layout(self._work_dir, resource_id)[1]
        else:
            work_dir, log_path = worker_layout(self._work_dir, resource_id)
            cmd = [sys.executable, "-m", "yarnflow.worker", "--resource-id", resource_id,
                   "--rm-address", self._rm_address, "--work-dir", work_dir]
            if parent is not None:
                cmd += ["--parent-pid", str(parent)]
            for key, value in self._config.to_strings().items():
                cmd += ["-D", f"{key}={value}"]
            with open(log_path, "ab") as log_file:
                proc = self._launch(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **self._env} if self._env else None)
        with self._lock:
            self._procs[resource_id] = proc
        threading.Thread(target=self._watch, args=(resource_id, proc), name=f"watch-{resource_id}",
                         daemon=True).start()
        log.info("%s TaskExecutor %s (pid %d), log %s", "took the waiting" if taken is not None else "started",
                 resource_id, proc.pid, log_path)
        return resource_id

    def _watch(self, resource_id: ResourceID, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        with self._lock:
            self._procs.pop(resource_id, None)
            expected = resource_id in self._stopping or self._closed
            self._stopping.discard(resource_id)
        reason = f"TaskExecutor {resource_id} (pid {proc.pid}): {describe_exit(code)}"
        if expected:
            log.info("%s", reason)
            return
        log.warning("%s", reason)
        if self._on_terminated is not None:
            self._on_terminated(resource_id, reason)

    def stop_worker(self, resource_id: ResourceID) -> None:
        with self._lock:
            proc = self._procs.get(resource_id)
            self._stopping.add(resource_id)
        if proc is not None:
            _terminate(proc)

    def stop(self) -> None:
        with self._lock:
            self._closed = True
            procs = list(self._procs.values()) + [p for p, _ in self._spark.values()]
            self._spark.clear()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            _terminate(proc)
        self._launcher.shutdown(wait=False)

    # -- Spark's standalone daemons (see am/resourcemanager/spark_cluster.py) -----------------
    def _spark_process(self, role: str, args: list[str]) -> tuple[str, str]:
        with self._lock:
            if self._closed:
                raise RuntimeError("driver stopped")
            self._counter += 1
            handle = f"spark-{role}-{self._counter}"
        folder = os.path.join(self._work_dir, "spark", handle)
        log_dir = os.path.join(self._work_dir, "log")
        os.makedirs(folder, exist_ok=True)
        os.makedirs(log_dir, exist_ok=True)
        url_file = os.path.join(folder, "master.url")
        cmd = [sys.executable, "-m", "yarnflow.worker.spark_daemon", role, "--parent-pid", str(os.getpid()), *args]
        if role == "master":
            cmd += ["--report-file", url_file]
        else:
            cmd += ["--work-dir", os.path.join(folder, "work")]
        log_file = open(os.path.join(log_dir, f"{handle}.log"), "ab")
        try:
            # a group of its own: the launcher and Spark's JVM (and a worker's executors) go together
            proc = self._launch(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **self._env} if self._env else None, start_new_session=True)
        finally:
            log_file.close()
        with self._lock:
            self._spark[handle] = (proc, url_file)
        log.info("started %s (pid %d), log %s", handle, proc.pid, os.path.join(log_dir, f"{handle}.log"))
        return handle, url_file

    def start_spark_master(self) -> str:
        return self._spark_process("master", ["--host", "127.0.0.1"])[0]

    def spark_master_url(self, handle: str) -> str | None:
        with self._lock:
            entry = self._spark.get(handle)
        if entry is None:
            return None
        try:
            with open(entry[1]) as fh:
                return fh.read().strip() or None
        except FileNotFoundError:
            return None

    def start_spark_worker(self, master_url: str, memory_mb: int, cores: int) -> str:
        return self._spark_process("worker", ["--host", "127.0.0.1", "--master", master_url, "--cores", str(cores),
                                              "--memory", f"{memory_mb}m"])[0]

    def spark_daemon_alive(self, handle: str) -> bool:
        with self._lock:
            entry = self._spark.get(handle)
        return entry is not None and entry[0].poll() is None

    def stop_spark_daemon(self, handle: str) -> None:
        with self._lock:
            entry = self._spark.pop(handle, None)
        if entry is not None:
            _terminate(entry[0])

    def spark_pids(self) -> dict[str, int]:
        with self._lock:
            return {h: p.pid for h, (p, _) in self._spark.items() if p.poll() is None}

    def kill_workers(self) -> None:
        """SIGKILL every worker now. Takes no lock: safe in a signal handler."""
        for proc in list(self._procs.values()):
            try:
                proc.kill()
            except OSError:  # gone already
                pass
        for proc, _ in list(self._spark.values()):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass

    def worker_pids(self) -> dict[ResourceID, int]:
        with self._lock:
            return {rid: p.pid for rid, p in self._procs.items()}


def _terminate(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        log.warning("pid %d ignored SIGTERM for %.0f s: killing it", proc.pid, grace_s)
        proc.kill()
        proc.wait(5)
