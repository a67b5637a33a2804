"""The sandbox's ResourceManager: it accepts skein ApplicationSpecs, runs each application's
attempts one after another, and answers reports, queues, nodes and logs as YARN would (through
skein's Driver, in server.py).

Application states (YARN's YarnApplicationState; terminal: FINISHED, FAILED, KILLED)::

    ACCEPTED --(AppMaster up)--> RUNNING --(the attempt ends)--+--> FINISHED   (final status as decided)
        ^                                                      +--> FAILED     (the AppMaster container
        +------(it failed and attempts remain: next attempt)---+                itself failed, last attempt)
    any non-terminal --(kill, sandbox stop)--> KILLED

As in skein, an attempt that ends SUCCEEDED always finishes the application; one that ends
FAILED or KILLED (a failed master script, a failed service, ``shutdown('FAILED')``) is retried
while attempts remain (``min(spec.max_attempts, max_am_attempts)``, YARN's cap, default 2), and
on the last attempt the application FINISHES with that final status. Every container of an
attempt is stopped before the next attempt starts or the application ends.

Threads: each application has one, ``app-<id>``, that runs its attempts; ``kill`` waits for it.
``Cluster._lock`` guards only the table of applications and is never held while calling into an
application; an application's condition is taken before its attempt's lock, never after.
"""

from __future__ import annotations

import getpass
import itertools
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil
from skein.proto import skein_pb2 as proto

from yarnflow.sandbox.appmaster import AppMaster, AttemptContext, Outcome
from yarnflow.sandbox.services import Node, file_url, now_ms
from yarnflow.sandbox.web_proxy import WebProxy
from yarnflow.sandbox.kv import RequestRejected
from yarnflow.sandbox.processes import ProcessLauncher, local_path
from yarnflow.sandbox.submission import credentials, validate_spec

logger = logging.getLogger(__name__)

TERMINAL = ("FINISHED", "FAILED", "KILLED")
#: starts the gRPC AppMaster service of an attempt: returns its port and a function that stops it
Serve = Callable[[AppMaster], tuple[int, Callable[[], None]]]


@dataclass(frozen=True)
class Limits:
    """``max_memory_mb``/``max_vcores``: YARN's maximum allocation per container;
    ``max_am_attempts``: yarn.resourcemanager.am.max-attempts; ``kill_grace_s``: the wait
    between SIGTERM and SIGKILL (yarn.nodemanager.sleep-delay-before-sigkill.ms);
    ``check_memory``: kill a container whose processes use more physical memory (RSS) than
    it asked for (yarn.nodemanager.pmem-check-enabled), checked every ``memory_check_s``."""

    max_memory_mb: int = 8192
    max_vcores: int = 4
    max_am_attempts: int = 2
    kill_grace_s: float = 0.25
    check_memory: bool = True
    memory_check_s: float = 1.0


class Application:
    def __init__(self, cluster: Cluster, seq: int, spec: proto.ApplicationSpec, user: str, queue: str,
                 cert: bytes, key: bytes) -> None:
        self.cluster = cluster
        self.seq = seq
        self.id = f"application_{cluster.timestamp}_{seq:04d}"
        self.user = user
        self.queue = queue
        self.cert, self.key = cert, key
        self.max_attempts = min(spec.max_attempts, cluster.limits.max_am_attempts)
        self.local_dir = os.path.join(cluster.work_dir, "local", self.id)
        self.log_root = os.path.join(cluster.work_dir, "logs", self.id)
        self.staging_dir = os.path.join(cluster.work_dir, "staging", self.id)
        self.spec = self._staged(spec)
        self.state, self.final_status, self.diagnostics = "ACCEPTED", "UNDEFINED", ""
        self.start_ms, self.finish_ms = now_ms(), 0
        self.host, self.port = "N/A", -1
        self.attempts: list[AppMaster] = []
        self._progress = 0.0
        self._kill: Outcome | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"app-{self.id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    def wait_started(self, timeout: float) -> bool:
        """True once RUNNING or terminal (skein's waitForStart)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.state not in ("ACCEPTED",), timeout)

    def kill(self, diagnostics: str, timeout: float) -> None:
        """Kill the application and wait (up to ``timeout``) until its containers have exited."""
        with self._cond:
            if self.finished:
                return
            if self._kill is None:
                self._kill = Outcome("KILLED", diagnostics, killed=True)
                logger.info("%s: killing: %s", self.id, diagnostics)
            current = self.attempts[-1] if self.attempts else None
        if current is not None:
            current.end(self._kill)
        self._thread.join(timeout)

    def report(self) -> proto.ApplicationReport:
        with self._cond:
            current = self.attempts[-1] if self.attempts else None
            progress = self._progress
            if self.state == "RUNNING" and current is not None:
                progress = current.progress if current.progress >= 0 else 0.1
            usage = self._usage()
            # the ResourceManager's proxy of the attempt's web UI (skein's), which links its pages
            tracking = "" if current is None or self.state != "RUNNING" else current.ctx.ui_address
            return proto.ApplicationReport(
                id=self.id, name=self.spec.name, user=self.user, queue=self.queue, tags=sorted(self.spec.tags),
                host=self.host, port=self.port, tracking_url=tracking, state=self.state, final_status=self.final_status,
                progress=progress, usage=usage, diagnostics=self.diagnostics, start_time=self.start_ms,
                finish_time=self.finish_ms)

    def used(self, node: Node | None = None) -> tuple[int, int]:
        """Memory and vcores of this application's running containers (on ``node``)."""
        memory = vcores = 0
        for am in self._live_attempts():
            for c in am.all_containers():
                if c.start_ms and not c.finish_ms and (node is None or c.node == node):
                    memory, vcores = memory + c.memory, vcores + c.vcores
        return memory, vcores

    def logs(self) -> dict[str, str]:
        """yarn container id -> its log files, in YARN's aggregated-log layout."""
        out = {}
        for am in list(self.attempts):
            for c in am.all_containers():
                if not c.yarn_id or not os.path.isdir(c.log_dir):
                    continue
                parts = []
                for name in sorted(os.listdir(c.log_dir)):
                    with open(os.path.join(c.log_dir, name), encoding="utf-8", errors="replace") as fh:
                        text = fh.read()
                    parts.append(f"LogType:{name}\nLog Upload Time:{time.ctime()}\nLogLength:{len(text)}\n"
                                 f"Log Contents:\n{text}\nEnd of LogType:{name}\n")
                out[c.yarn_id] = "\n".join(parts)
        return out

    def _staged(self, spec: proto.ApplicationSpec) -> proto.ApplicationSpec:
        """``spec`` as skein's driver hands it to its AppMaster: the credentials written to the
        application's directory and referred to as files (never as bytes)."""
        staging = self.staging_dir
        os.makedirs(staging)
        staged = proto.ApplicationSpec()
        staged.CopyFrom(spec)
        security = proto.Security()
        for name, data, field in ((".skein.crt", self.cert, security.cert_file), (".skein.pem", self.key,
                                                                                 security.key_file)):
            path = os.path.join(staging, name)
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as fh:
                fh.write(data)
            field.source.scheme, field.source.file = "file", path
            field.type, field.visibility = proto.File.FILE, proto.File.APPLICATION
            field.size, field.timestamp = len(data), int(os.stat(path).st_mtime * 1000)
        staged.master.security.CopyFrom(security)
        copies: dict[str, str] = {}
        for files in [staged.master.files, *(svc.files for svc in staged.services.values())]:
            for target, f in files.items():
                self._upload(f, target, staging, copies)
        return staged

    @staticmethod
    def _upload(f: proto.File, target: str, staging: str, copies: dict[str, str]) -> None:
        """Copy a local file into the application's staging directory and point ``f`` at the
        copy, as skein's driver uploads local files at submit: the client may delete its own
        once ``submit`` returns. A path used twice is copied once."""
        path = local_path(file_url(f))
        if path is None:
            return
        if path not in copies:
            dest = os.path.join(staging, str(len(copies)), os.path.basename(path.rstrip("/")) or target)
            os.makedirs(os.path.dirname(dest))
            if os.path.isdir(path):
                shutil.copytree(path, dest, symlinks=True)
            else:
                shutil.copy2(path, dest)
            copies[path] = dest
        f.source.scheme, f.source.host, f.source.port, f.source.file = "file", "", 0, copies[path]
        f.size, f.timestamp = os.path.getsize(copies[path]), int(os.stat(copies[path]).st_mtime * 1000)

    def _live_attempts(self) -> list[AppMaster]:
        return self.attempts[-1:] if not self.finished else []

    def _usage(self) -> proto.ResourceUsageReport:
        now = now_ms()
        memory_ms = vcore_ms = 0
        for am in list(self.attempts):
            for c in am.all_containers():
                if c.start_ms:
                    ran = max(0, (c.finish_ms or now) - c.start_ms)  # (one started since ``now``: 0, not < 0)
                    memory_ms, vcore_ms = memory_ms + c.memory * ran, vcore_ms + c.vcores * ran
        memory, vcores = self.used()
        running = sum(1 for am in self._live_attempts() for c in am.all_containers()
                      if c.start_ms and not c.finish_ms)
        used = proto.Resources(memory=memory, vcores=vcores)
        return proto.ResourceUsageReport(memory_seconds=memory_ms // 1000, vcore_seconds=vcore_ms // 1000,
                                         num_used_containers=running, needed_resources=used,
                                         reserved_resources=proto.Resources(), used_resources=used)

    def _run(self) -> None:
        try:
            self._run_attempts()
        except Exception as exc:  # a bug of the sandbox: the application must still end
            logger.exception("%s: the YARN sandbox failed running it", self.id)
            for am in self.attempts[-1:]:
                am.teardown(self.cluster.limits.kill_grace_s + 5.0)
            self._finish("FAILED", "FAILED", f"The YARN sandbox failed: {type(exc).__name__}: {exc}")

    def _run_attempts(self) -> None:
        limits = self.cluster.limits
        for attempt in itertools.count(1):
            ctx = AttemptContext(
                app_id=self.id, container_prefix=f"container_{self.cluster.timestamp}_{self.seq:04d}",
                attempt_id=f"appattempt_{self.cluster.timestamp}_{self.seq:04d}_{attempt:06d}", attempt=attempt,
                max_attempts=self.max_attempts, spec=self.spec, cert=self.cert, key=self.key, user=self.user,
                submit_ms=self.start_ms, local_dir=self.local_dir, log_root=self.log_root,
                launcher=self.cluster.launcher, place=self.cluster.place,
                previous_am_node=self.attempts[-1].am_container.node if self.attempts else None,
                ui_address=self.cluster.ui_address(self.id))
            am = AppMaster(ctx)
            with self._cond:
                if self._kill is not None:
                    self._finish("KILLED", "KILLED", self._kill.diagnostics)
                    return
                self.attempts.append(am)
            stop_server: Callable[[], None] | None = None
            try:
                port, stop_server = self.cluster.serve(am)
                with self._cond:
                    self.host, self.port, self.state = self.cluster.host, port, "RUNNING"
                    self._cond.notify_all()
                am.run(f"{self.cluster.host}:{port}")
            except Exception as exc:
                logger.warning("%s attempt %d: the AppMaster container failed", self.id, attempt, exc_info=True)
                am.end(Outcome("FAILED", f"AM Container for {ctx.attempt_id} exited with exitCode: -1000\n"
                                         f"Diagnostics: {exc}", registered=False))
            outcome = am.wait()
            assert outcome is not None
            am.teardown(limits.kill_grace_s + 5.0)
            if stop_server is not None:
                stop_server()
            if outcome.killed:
                self._finish("KILLED", "KILLED", outcome.diagnostics)
                return
            if outcome.final_status == "SUCCEEDED" or attempt >= self.max_attempts:
                if outcome.registered:
                    self._finish("FINISHED", outcome.final_status, outcome.diagnostics)
                else:
                    self._finish("FAILED", "FAILED", f"Application {self.id} failed {attempt} times due to "
                                                     f"{outcome.diagnostics}")
                return
            am.log(f"Application attempt {attempt} out of {self.max_attempts} failed, will retry: "
                   f"{outcome.diagnostics}", logging.WARNING)
            with self._cond:
                self.state, self.host, self.port = "ACCEPTED", "N/A", -1
                self.diagnostics = f"Attempt {attempt} failed: {outcome.diagnostics}"
                self._cond.notify_all()

    def _finish(self, state: str, final_status: str, diagnostics: str) -> None:
        with self._cond:
            self.state, self.final_status, self.diagnostics = state, final_status, diagnostics
            self.finish_ms = now_ms()
            if state == "FINISHED":
                self._progress = 1.0
            self._cond.notify_all()
        shutil.rmtree(self.staging_dir, ignore_errors=True)  # as YARN's staging dir goes with the application
        logger.info("%s %s (final status %s): %s", self.id, state, final_status, diagnostics)


class Cluster:
    """The applications, nodes and queues of the sandbox. ``serve`` starts an attempt's gRPC
    AppMaster service; every container is started by ``launcher``."""

    def __init__(self, host: str, work_dir: str, limits: Limits, node_count: int, queues: Sequence[str],
                 cert: bytes, key: bytes, serve: Serve, nodes: Sequence[Node] | None = None,
                 reachable: Callable[[Node], bool] = lambda node: True) -> None:
        self.host = host
        self.work_dir = work_dir
        self.limits = limits
        self.timestamp = now_ms()
        self.nodes = list(nodes) if nodes else [Node(host, 45454 + i, 8042 + 2 * i) for i in range(max(1, node_count))]
        self._reachable = reachable  # (a NodeManager cut off from the ResourceManager gets no containers)
        self.queues = list(queues) or ["default"]
        self.cert, self.key = cert, key
        self.serve = serve
        self.launcher = ProcessLauncher(limits.kill_grace_s)
        self._apps: dict[str, Application] = {}
        self._seq = itertools.count(1)
        self._placements = itertools.count()
        self._lock = threading.Lock()
        self._stopped = False
        self._stopping = threading.Event()
        #: the ResourceManager's web proxy (set by the Sandbox once it listens)
        self.web_proxy: WebProxy | None = None
        if limits.check_memory:
            threading.Thread(target=self._check_memory, name="sandbox-memory", daemon=True).start()

    def place(self, avoid: Node | None = None) -> Node:
        """The node of a new container (round-robin): not ``avoid`` when there is another (as
        YARN places an application's next AppMaster attempt away from the node the last failed
        on), nor one cut off by the network (YARN hears nothing from its NodeManager)."""
        node = self.nodes[next(self._placements) % len(self.nodes)]
        for _ in range(2 * len(self.nodes)):  # (the next one that is reachable and not ``avoid``)
            if self._reachable(node) and (node != avoid or len(self.nodes) == 1):
                break
            node = self.nodes[next(self._placements) % len(self.nodes)]
        return node

    # ------------------------------------------------------------------ applications

    def submit(self, spec: proto.ApplicationSpec) -> Application:
        """Validate and start ``spec``; raises RequestRejected (INTERNAL, as skein's driver
        reports a failed submit) naming what is wrong."""
        for where, r in (("the application master", spec.master.resources),
                         *((f"service '{n}'", s.resources) for n, s in sorted(spec.services.items()))):
            for kind, amount in (("yarn.io/gpu", r.gpus), ("yarn.io/fpga", r.fpgas)):
                if amount:
                    raise RequestRejected("INVALID_ARGUMENT", f"Resource '{kind}' is not defined in your cluster's "
                                                              f"configuration (asked for {where}; the YARN sandbox "
                                                              f"has no GPUs or FPGAs)")
        try:
            validate_spec(spec, self.queues, self.limits)
            cert, key = credentials(spec.master, self.cert, self.key)
        except (ValueError, OSError) as exc:
            logger.warning("refused a submit: %s", exc)
            raise RequestRejected("INTERNAL", f"Failed to submit application, exception:\n{exc}") from exc
        with self._lock:
            if self._stopped:
                raise RequestRejected("UNAVAILABLE", "the YARN sandbox is stopping")
            try:
                app = Application(self, next(self._seq), spec, spec.user or getpass.getuser(),
                                  spec.queue or "default", cert, key)
            except OSError as exc:
                logger.warning("refused a submit: cannot stage its files: %s", exc)
                raise RequestRejected("INTERNAL", f"Failed to submit application, exception:\n{exc}") from exc
            self._apps[app.id] = app
            logger.info("submitted %s %r (user %s, queue %s, %d service(s), max attempts %d)", app.id, spec.name,
                        app.user, app.queue, len(spec.services), app.max_attempts)
            app.start()  # under the lock: stop() never sees an application whose thread did not start
        return app

    def get(self, app_id: str) -> Application:
        if not app_id.startswith("application_") or len(app_id.split("_")) != 3:
            raise RequestRejected("INVALID_ARGUMENT", f"Invalid ApplicationId '{app_id}'")
        with self._lock:
            app = self._apps.get(app_id)
        if app is None:
            raise RequestRejected("INVALID_ARGUMENT", f"Unknown ApplicationId '{app_id}'")
        return app

    def ui_address(self, app_id: str) -> str:
        """Application ``app_id``'s web UI through the sandbox's proxy ("": no proxy)."""
        proxy = self.web_proxy
        return proxy.base(app_id) if proxy is not None else ""

    def pages(self, app_id: str) -> dict[str, tuple[str, str]] | None:
        """The proxied pages of application ``app_id``'s running attempt (None: not running)."""
        with self._lock:
            app = self._apps.get(app_id)
        if app is None or app.state != "RUNNING":
            return None
        current = app.attempts[-1] if app.attempts else None
        return current.pages() if current is not None else None

    def applications(self) -> list[Application]:
        with self._lock:
            return list(self._apps.values())

    def reports(self, req: proto.ApplicationsRequest) -> list[proto.ApplicationReport]:
        states = {proto.ApplicationState.Type.Name(s) for s in req.states} or {"SUBMITTED", "ACCEPTED", "RUNNING"}
        started_end = req.started_end or 2 ** 63 - 1
        finished_end = req.finished_end or 2 ** 63 - 1
        out = []
        for app in self.applications():
            r = app.report()
            if (proto.ApplicationState.Type.Name(r.state) in states and (not req.name or r.name == req.name)
                    and (not req.user or r.user == req.user) and (not req.queue or r.queue == req.queue)
                    and req.started_begin <= r.start_time <= started_end
                    and req.finished_begin <= r.finish_time <= finished_end):
                out.append(r)
        return out

    def move(self, app_id: str, queue: str) -> None:
        app = self.get(app_id)
        if queue not in self.queues:
            raise RequestRejected("INVALID_ARGUMENT", f"Failed to move {app_id}: queue '{queue}' doesn't exist")
        app.queue = queue

    def stop(self, timeout: float) -> None:
        """Kill every application that still runs, then every container left."""
        with self._lock:
            self._stopped = True
        self._stopping.set()
        apps = [app for app in self.applications() if not app.finished]
        killers = [threading.Thread(target=app.kill, args=("Killed: the YARN sandbox stopped.", timeout),
                                    name=f"kill-{app.id}", daemon=True) for app in apps]
        for t in killers:
            t.start()
        for t in killers:
            t.join(timeout)
        self.launcher.close(timeout)

    def _check_memory(self) -> None:
        """YARN's physical-memory check: a container whose processes (its runner aside) use more
        resident memory than it asked for is killed."""
        while not self._stopping.wait(self.limits.memory_check_s):
            for app in self.applications():
                current = app.attempts[-1] if app.attempts and not app.finished else None
                if current is None:
                    continue
                for c in current.all_containers():
                    proc = c.process
                    if proc is None or proc.returncode is not None or c.finish_ms:
                        continue
                    rss = _tree_rss(proc.pid)
                    if rss > c.memory * 1024 * 1024:
                        current.memory_exceeded(c, rss)

    # ------------------------------------------------------------------ nodes and queues

    def node_reports(self, states: Sequence[int]) -> list[proto.NodeReport]:
        if states and proto.NodeState.RUNNING not in states:
            return []
        out = []
        for node in self.nodes:
            memory = vcores = 0
            for app in self.applications():
                m, v = app.used(node)
                memory, vcores = memory + m, vcores + v
            out.append(proto.NodeReport(
                id=node.id, http_address=node.http_address, rack_name="/default-rack", state=proto.NodeState.RUNNING,
                health_report="", total_resources=proto.Resources(memory=self.limits.max_memory_mb,
                                                                  vcores=self.limits.max_vcores),
                used_resources=proto.Resources(memory=memory, vcores=vcores)))
        return out

    def queue(self, name: str) -> proto.Queue:
        if name == "root":
            return self._queue("root", sum(self._used_memory(q) for q in self.queues))
        if name not in self.queues:
            raise RequestRejected("INVALID_ARGUMENT", f"Queue '{name}' does not exist")
        return self._queue(name, self._used_memory(name))

    def child_queues(self, name: str) -> list[proto.Queue]:
        if name == "root":
            return [self.queue(q) for q in self.queues]
        self.queue(name)
        return []

    def all_queues(self) -> list[proto.Queue]:
        return self.child_queues("root")  # as YarnClient.getAllQueues: the queues under root

    def _used_memory(self, queue: str) -> int:
        return sum(app.used()[0] for app in self.applications() if app.queue == queue)

    def _queue(self, name: str, used_memory: int) -> proto.Queue:
        share = 100.0 if name == "root" else 100.0 / len(self.queues)
        total = self.limits.max_memory_mb * len(self.nodes)
        return proto.Queue(name=name, state=proto.Queue.RUNNING, capacity=share, max_capacity=100.0,
                           percent_used=100.0 * used_memory / total if total else 0.0)


def _tree_rss(runner: int) -> int:
    """Resident memory of the processes under a container's runner, in bytes."""
    try:
        children = psutil.Process(runner).children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for p in children:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total
