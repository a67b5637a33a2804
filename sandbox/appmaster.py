"""One application attempt's master: what skein's Java ApplicationMaster does inside YARN, done
in the sandbox process. It owns the attempt's key-value store, its services (each a
``ServiceTracker``, services.py: instances, restarts, dependencies) and their containers, the AppMaster
container (``..._000001``) whose directory holds the master script, and decides how the attempt
ends (an ``Outcome``). The gRPC AppMaster service (server.py) calls into it; the application
(applications.py) starts it, waits for its outcome and tears it down.

Container states, as skein's (terminal: SUCCEEDED, FAILED, KILLED)::

    WAITING --(dependencies running)--> REQUESTED --(launched)--> RUNNING --> SUCCEEDED / FAILED
       \\____________________\\___________________________________\\______--> KILLED (kill, scale down, end)

How an attempt ends (the first decision wins): the master script exits (0: SUCCEEDED,
otherwise FAILED naming its exit status and the end of its stderr); ``shutdown`` (the given
status); a service fails beyond its ``max_restarts`` (FAILED); with no master script, every
service finished (SUCCEEDED); the application is killed or the sandbox stops (KILLED).

Threads: none of its own beyond a small pool (``launch-<app id>``) that localizes and starts
service containers off the gRPC threads; container exits arrive on each container's thread
(processes.py). Everything is guarded by ``lock`` (shared with the KV store).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from skein.proto import skein_pb2 as proto

from yarnflow.sandbox.kv import KeyValueStore, RequestRejected
from yarnflow.sandbox.services import Container, Node, ServiceTracker, local_files, now_ms
from yarnflow.sandbox.processes import (ContainerProcess, LaunchRequest, ProcessLauncher, describe_exit,
                                        localize, yarn_exit_status)

logger = logging.getLogger(__name__)

ACTIVE = ("WAITING", "REQUESTED", "RUNNING")
#: variables of the sandbox's own environment that a container must not inherit
CONTAINER_VARS = frozenset({
    "SKEIN_APPLICATION_ID", "SKEIN_APPMASTER_ADDRESS", "SKEIN_CONTAINER_ID", "SKEIN_RESOURCE_MEMORY",
    "SKEIN_RESOURCE_VCORES", "CONTAINER_ID", "LOCAL_DIRS", "LOG_DIRS", "NM_HOST", "NM_PORT", "NM_HTTP_PORT",
    "APP_SUBMIT_TIME_ENV", "MAX_APP_ATTEMPTS", "PWD", "OLDPWD", "CLASSPATH",
})
MIB = 1024 * 1024
STDERR_TAIL_LINES = 20
RESTART_DELAY_S = 0.2


@dataclass(frozen=True)
class AttemptContext:
    """What an attempt needs from its application and the sandbox."""

    app_id: str
    container_prefix: str  # container_<cluster ts>_<app seq>
    attempt_id: str  # appattempt_<cluster ts>_<app seq>_<attempt, 6 digits>
    attempt: int
    max_attempts: int
    spec: proto.ApplicationSpec
    cert: bytes
    key: bytes
    user: str
    submit_ms: int
    local_dir: str  # LOCAL_DIRS: container directories are <local_dir>/<yarn container id>
    log_root: str  # a container's log directory is <log_root>/<yarn container id>
    launcher: ProcessLauncher
    place: Callable[..., Node]  # place(avoid=None): a node for a new container
    previous_am_node: Node | None = None  # where the previous attempt's AppMaster ran
    ui_address: str = ""  # the application's web UI through the ResourceManager's proxy (web_proxy.py)


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended. ``registered`` False: the AppMaster container itself failed (YARN
    then fails the application rather than finishing it); ``killed``: no retry, state KILLED."""

    final_status: str
    diagnostics: str
    registered: bool = True
    killed: bool = False


class AppMaster:
    def __init__(self, ctx: AttemptContext) -> None:
        self.ctx = ctx
        self.spec = ctx.spec
        self.lock = threading.RLock()
        self.kv = KeyValueStore(self.lock, self)
        self.services = {name: ServiceTracker(name, s, self) for name, s in sorted(ctx.spec.services.items())}
        for tracker in self.services.values():
            for dep in tracker.service.depends:
                self.services[dep].dependents.append(tracker)
        self.am_container = Container("", 0, "RUNNING", {}, ctx.spec.master.resources.memory,
                                      ctx.spec.master.resources.vcores)
        self.address = ""
        self.progress = -1.0
        self.proxies: dict[str, proto.Proxy] = {}
        self.outcome: Outcome | None = None
        self._ended = threading.Event()
        self._numbers = iter(range(1, 1 << 31))
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"launch-{ctx.app_id}")
        self._am_log = ""

    # ------------------------------------------------------------------ lifecycle (applications.py)

    def run(self, address: str) -> None:
        """Set up the AppMaster container, start the services and the master script. Raises
        OSError/ValueError/RuntimeError when the AppMaster container cannot be set up."""
        self.address = address
        c = self.am_container
        c.yarn_id, c.start_ms = self._next_yarn_id(), now_ms()
        c.node = self.ctx.place(self.ctx.previous_am_node)
        directory, c.log_dir = self._prepare(c, self.spec.master.files, self.spec.master.script)
        self._am_log = os.path.join(c.log_dir, "application.master.log")
        self.log(f"AppMaster at {address} (attempt {self.ctx.attempt} of {self.ctx.max_attempts}), its container "
                 f"{c.yarn_id} in {directory}")
        with self.lock:
            for tracker in self.services.values():
                self.log(f"Initializing service '{tracker.name}'.")
                for _ in range(tracker.service.instances):
                    tracker.add_container()
        if self.spec.master.script:
            env = self._environment(c, directory, dict(self.spec.master.env), None)
            proc = self.ctx.launcher.launch(self._launch_request(c, directory, env), self._master_exited)
            self.log(f"Started the master script in {c.yarn_id}, pid {proc.pid}")
            with self.lock:
                c.process = proc
                if self.outcome is not None:
                    proc.terminate()

    def end(self, outcome: Outcome) -> None:
        """Decide how the attempt ends (only the first decision counts)."""
        with self.lock:
            if self.outcome is not None:
                return
            self.outcome = outcome
            self.log(f"Shutting down: {outcome.final_status}: {outcome.diagnostics}")
        self._ended.set()

    def wait(self, timeout: float | None = None) -> Outcome | None:
        self._ended.wait(timeout)
        return self.outcome

    def teardown(self, timeout: float) -> None:
        """Stop every container of the attempt (SIGTERM, SIGKILL after the grace period) and
        end the watch streams; returns once all have exited (or ``timeout`` passed)."""
        with self.lock:
            for tracker in self.services.values():
                for c in tracker.containers:
                    if c.state in ACTIVE:
                        if c.state == "RUNNING":
                            c.finish_ms = now_ms()
                        c.state, c.exit_message = "KILLED", "Killed: the application attempt ended."
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self.lock:
            procs = [c.process for c in self._all_containers() if c.process is not None]
        for proc in procs:
            proc.terminate()
        deadline = time.monotonic() + timeout
        for proc in procs:
            if not proc.wait(max(0.0, deadline - time.monotonic())):
                logger.warning("%s: container %s (pid %d) did not exit", self.ctx.app_id, proc.name, proc.pid)
        with self.lock:
            self.am_container.finish_ms = self.am_container.finish_ms or now_ms()
        self.kv.close()

    def log(self, message: str, level: int = logging.INFO) -> None:
        """A line in the sandbox's log and in the AppMaster container's application.master.log."""
        logger.log(level, "%s attempt %d: %s", self.ctx.app_id, self.ctx.attempt, message)
        if self._am_log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            try:
                with open(self._am_log, "a", encoding="utf-8") as fh:
                    fh.write(f"{stamp} {logging.getLevelName(level)} {message}\n")
            except OSError:
                pass

    # ------------------------------------------------------------------ what the RPCs call

    def tracker(self, name: str) -> ServiceTracker:
        tracker = self.services.get(name)
        if tracker is None:
            raise RequestRejected("INVALID_ARGUMENT", f"Unknown service '{name}'")
        return tracker

    def container(self, service: str, instance: int, not_completed: bool = False) -> Container:
        c = self.tracker(service).get(instance)
        if c is None:
            raise RequestRejected("INVALID_ARGUMENT", f"Service '{service}' has no container instance {instance}")
        if not_completed and c.state not in ACTIVE:
            raise RequestRejected("INVALID_ARGUMENT", f"Container '{service}_{instance}' has already completed")
        return c

    def get_containers(self, services: Sequence[str], states: Sequence[str]) -> list[proto.Container]:
        with self.lock:
            names = [self.tracker(s).name for s in services] if services else list(self.services)
            wanted = set(states) if states else set(ACTIVE)
            return [c.to_proto() for n in sorted(set(names)) for c in self.services[n].containers if c.state in wanted]

    def kill_container(self, service: str, instance: int) -> None:
        with self.lock:
            self.container(service, instance)
            self.services[service].finish(instance, "KILLED", "Killed by user request.")

    def scale(self, service: str, count: int, delta: int) -> list[proto.Container]:
        with self.lock:
            tracker = self.tracker(service)
            if delta != 0 and count != 0:
                raise RequestRejected("INVALID_ARGUMENT", "Can't specify both count and delta")
            if delta == 0 and count < 0:
                raise RequestRejected("INVALID_ARGUMENT", "count must be >= 0")
            return [c.to_proto() for c in tracker.scale(count, delta)]

    def add_container(self, service: str, env: Mapping[str, str]) -> proto.Container:
        with self.lock:
            return self.tracker(service).add_container(env).to_proto()

    def shutdown(self, final_status: str, diagnostics: str) -> None:
        self.end(Outcome(final_status, diagnostics or "Shutdown requested by user."))

    def set_progress(self, progress: float) -> None:
        if not 0.0 <= progress <= 1.0:
            raise RequestRejected("INVALID_ARGUMENT", f"progress must be between 0 and 1, got {progress}")
        self.progress = progress

    def add_proxy(self, req: proto.Proxy) -> None:
        if "/" in req.route:
            raise RequestRejected("INVALID_ARGUMENT", "Page page routes must not contain '/'")
        with self.lock:
            if req.route in self.proxies:
                raise RequestRejected("ALREADY_EXISTS", f"A proxied page with route '{req.route}' already exists")
            if req.link_name and any(p.link_name == req.link_name for p in self.proxies.values()):
                raise RequestRejected("ALREADY_EXISTS", f"A proxied page with name '{req.link_name}' already exists")
            self.proxies[req.route] = req

    def pages(self) -> dict[str, tuple[str, str]]:
        """The proxied pages: route -> (target, link name)."""
        with self.lock:
            return {route: (p.target, p.link_name) for route, p in self.proxies.items()}

    def remove_proxy(self, route: str) -> None:
        with self.lock:
            if self.proxies.pop(route, None) is None:
                raise RequestRejected("FAILED_PRECONDITION", f"A proxied page with route '{route}' doesn't exist")

    def memory_exceeded(self, c: Container, rss: int) -> None:
        """``c`` uses more physical memory than it asked for: YARN's NodeManager kills it."""
        if c.state != "RUNNING" or (c is self.am_container and self.outcome is not None):
            return
        pid = c.process.pid if c.process is not None else 0
        used = f"{rss / MIB:.1f} MB of {c.memory:.1f} MB physical memory used"
        message = (f"Container [pid={pid},containerID={c.yarn_id}] is running {rss - c.memory * MIB}B beyond the "
                   f"'PHYSICAL' memory limit. Current usage: {used}. Killing container.")
        self.log(message, logging.WARNING)
        if c is self.am_container:
            self.end(Outcome("FAILED", f"AM Container for {self.ctx.attempt_id} exited with exitCode: -104\n"
                                       f"Diagnostics: {message}\nThe application master memory limit was exceeded.",
                             registered=False))
            return
        with self.lock:
            if c.state == "RUNNING":
                self.services[c.service].finish(c.instance, "FAILED", used)

    # the Owners protocol of the KV store (called under the lock)

    def check_owner(self, owner: proto.ContainerInstance) -> None:
        self.container(owner.service_name, owner.instance, not_completed=True)

    def add_owned_key(self, owner: proto.ContainerInstance, key: str) -> None:
        self.container(owner.service_name, owner.instance).owned_keys.add(key)

    def remove_owned_key(self, owner: proto.ContainerInstance, key: str) -> None:
        self.container(owner.service_name, owner.instance).owned_keys.discard(key)

    # ------------------------------------------------------------------ reports (applications.py)

    def all_containers(self) -> list[Container]:
        with self.lock:
            return self._all_containers()

    def _all_containers(self) -> list[Container]:
        return [self.am_container, *(c for t in self.services.values() for c in t.containers)]

    # ------------------------------------------------------------------ containers

    def maybe_shutdown(self) -> None:
        finished = not self.spec.master.script
        for tracker in self.services.values():
            finished = finished and tracker.is_finished()
            if tracker.is_failed():
                self.end(Outcome("FAILED", f"Failure in service {tracker.name}, see logs for more information."))
                return
        if finished:
            self.end(Outcome("SUCCEEDED", "Application completed successfully."))

    def request_launch(self, c: Container) -> None:
        if self.outcome is None:
            try:
                self._pool.submit(self._launch, c)
            except RuntimeError:  # the pool is shut down: the attempt is over
                pass

    def _launch(self, c: Container) -> None:
        tracker = self.services[c.service]
        if c.replaces:  # as YARN's allocation heartbeat would, keep a crash loop from spinning
            self._ended.wait(RESTART_DELAY_S)
        with self.lock:
            if c.state != "REQUESTED" or self.outcome is not None:
                return
            c.state, c.start_ms, c.yarn_id = "RUNNING", now_ms(), self._next_yarn_id()
            c.node = self.ctx.place()
            tracker.allocated(c)
            self.log(f"RUNNING: {c.id} on {c.yarn_id}")
        try:
            directory, c.log_dir = self._prepare(c, tracker.service.files, tracker.service.script)
            env = self._environment(c, directory, {**tracker.service.env, **c.env}, c.id)
            proc = self.ctx.launcher.launch(self._launch_request(c, directory, env),
                                            lambda p: self._container_exited(c, p))
        except Exception as exc:
            logger.warning("%s: cannot start %s", self.ctx.app_id, c.id, exc_info=True)
            with self.lock:
                tracker.finish(c.instance, "FAILED", f"Failed to start, exception raised: {exc}")
            return
        with self.lock:
            c.process = proc
            if c.state != "RUNNING":  # killed while it started
                proc.terminate()
        logger.info("%s: container %s (%s) started, pid %d", self.ctx.app_id, c.yarn_id, c.id, proc.pid)

    def _container_exited(self, c: Container, proc: ContainerProcess) -> None:
        code = proc.returncode if proc.returncode is not None else -1
        logger.info("%s: container %s (%s) exited: %s", self.ctx.app_id, c.yarn_id, c.id, describe_exit(code))
        with self.lock:
            if c.state != "RUNNING":
                return
            if code == 0:
                self.services[c.service].finish(c.instance, "SUCCEEDED", "Completed successfully.")
            else:
                self.services[c.service].finish(
                    c.instance, "FAILED", f"Container failed with {_status(code)}, see logs for more information "
                                          f"({c.log_dir}).")

    def _master_exited(self, proc: ContainerProcess) -> None:
        code = proc.returncode if proc.returncode is not None else -1
        self.log(f"The master script exited: {describe_exit(code)}")
        c = self.am_container
        with self.lock:
            c.finish_ms = now_ms()
            c.state = "SUCCEEDED" if code == 0 else "FAILED"
        if code == 0:
            self.end(Outcome("SUCCEEDED", "Application driver completed successfully."))
        else:
            tail = _tail(os.path.join(c.log_dir, "stderr"), STDERR_TAIL_LINES)
            self.end(Outcome("FAILED", f"Application driver failed with {_status(code)} (attempt {self.ctx.attempt} "
                                       f"of {self.ctx.max_attempts}), see logs for more information. Last lines of "
                                       f"its stderr ({c.log_dir}/stderr):\n{tail}"))

    def _next_yarn_id(self) -> str:
        return f"{self.ctx.container_prefix}_{self.ctx.attempt:02d}_{next(self._numbers):06d}"

    def _local_dir(self, node: Node) -> str:
        """LOCAL_DIRS of the application's containers on ``node`` (a host of its own has its own)."""
        return os.path.join(node.root, "local", self.ctx.app_id) if node.root else self.ctx.local_dir

    def _prepare(self, c: Container, files: Mapping[str, proto.File], script: str) -> tuple[str, str]:
        """The container's directory (credentials, script, localized files) and log directory."""
        assert c.node is not None
        directory = os.path.join(self._local_dir(c.node), c.yarn_id)
        log_root = os.path.join(c.node.root, "logs", self.ctx.app_id) if c.node.root else self.ctx.log_root
        log_dir = os.path.join(log_root, c.yarn_id)
        os.makedirs(directory)
        os.makedirs(log_dir)
        for name, data in ((".skein.crt", self.ctx.cert), (".skein.pem", self.ctx.key)):
            with os.fdopen(os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600),
                           "wb") as fh:
                fh.write(data)
        with open(os.path.join(directory, ".skein.sh"), "w", encoding="utf-8") as fh:
            fh.write(script)
        localize(local_files(files), directory)
        return directory, log_dir

    def _environment(self, c: Container, directory: str, spec_env: Mapping[str, str],
                     skein_container_id: str | None) -> dict[str, str]:
        assert c.node is not None
        env = {k: v for k, v in os.environ.items() if k not in CONTAINER_VARS}
        env.update(spec_env)
        env.update(SKEIN_APPLICATION_ID=self.ctx.app_id, SKEIN_APPMASTER_ADDRESS=self.address,
                   SKEIN_RESOURCE_MEMORY=str(c.memory), SKEIN_RESOURCE_VCORES=str(c.vcores))
        if skein_container_id is not None:
            env["SKEIN_CONTAINER_ID"] = skein_container_id
        env.update(CONTAINER_ID=c.yarn_id, LOCAL_DIRS=self._local_dir(c.node), LOG_DIRS=c.log_dir, PWD=directory,
                   NM_HOST=c.node.host, NM_PORT=str(c.node.port), NM_HTTP_PORT=str(c.node.http_port), USER=self.ctx.user,
                   LOGNAME=self.ctx.user, HADOOP_USER_NAME=self.ctx.user)
        if c is self.am_container:
            env.update(APP_SUBMIT_TIME_ENV=str(self.ctx.submit_ms), MAX_APP_ATTEMPTS=str(self.ctx.max_attempts))
        return env

    def _launch_request(self, c: Container, directory: str, env: Mapping[str, str]) -> LaunchRequest:
        assert c.node is not None
        return LaunchRequest(name=c.yarn_id, command=("bash", ".skein.sh"), cwd=directory, env=env,
                             stdout_path=os.path.join(c.log_dir, "stdout"),
                             stderr_path=os.path.join(c.log_dir, "stderr"), netns=c.node.netns, hidden=c.node.hidden)


def _status(returncode: int) -> str:
    status = yarn_exit_status(returncode)
    return f"exit code {status}" + (f" (killed by {describe_exit(returncode)})" if returncode < 0 else "")


def _tail(path: str, lines: int) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return "".join(collections.deque(fh, maxlen=lines)).rstrip("\n") or "(empty)"
    except OSError:
        return "(no stderr)"
