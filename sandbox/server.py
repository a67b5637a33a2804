"""The YARN sandbox's servers and its public face: ``Sandbox`` serves skein's Driver service
(applications, queues, nodes, logs) and, per application attempt, skein's AppMaster service
(key-value store, containers, shutdown), both over TLS with skein's credentials, so that the
unmodified skein client (``skein.Client``, ``ApplicationClient``, ``from_current()`` inside
containers) works against it. ``run_sandbox`` is the blocking entry point of a CLI command.

Credentials are the ones ``skein.Security.from_default()`` uses: ``skein.crt`` and
``skein.pem`` in the config directory (``$SKEIN_CONFIG``, default ``~/.skein``), created when
missing. The sandbox registers itself as skein's global driver (``<config_dir>/driver``, which
``skein.Client.from_global_driver()`` and the ``skein`` CLI read) and removes that file on stop
if it is still its own. ``skein.Client()`` without an address always starts a Java driver:
with ``client_env()`` in the environment (JAVA_HOME and PATH point at two small stand-ins for
``java`` and ``yarn``) that "driver" just reports the sandbox's port, so it works too.

Wire errors are translated in one place (``_rpc``): RequestRejected becomes the gRPC status it
names, anything else INTERNAL. skein's client turns INVALID_ARGUMENT / FAILED_PRECONDITION /
ALREADY_EXISTS into ValueError, NOT_FOUND into KeyError, INTERNAL into DriverError (or
ApplicationError from an AppMaster).

Threads: gRPC's thread pools (``sandbox-driver``, and ``am-<app>`` per attempt; a Watch call
holds one thread for its duration plus a ``kv-watch-<app>`` thread that reads its requests),
plus those of applications.py (``app-<id>`` per application, ``sandbox-memory``), appmaster.py
(``launch-<app>``) and processes.py (``sandbox-launcher``, ``container-<id>``). ``stop()`` may
be called from any thread but a signal handler (it waits for the containers to exit).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
import skein
from skein.proto import skein_pb2 as proto
from skein.proto import skein_pb2_grpc

from yarnflow.common.process import shutdown_on_signals
from yarnflow.sandbox.applications import Cluster, Limits
from yarnflow.sandbox.appmaster import AppMaster
from yarnflow.sandbox.hosts import Host, HostNetwork
from yarnflow.sandbox.kv import RequestRejected, SandboxError
from yarnflow.sandbox.processes import enter_network
from yarnflow.sandbox.services import Node
from yarnflow.sandbox.web_proxy import WebProxy

__all__ = ["Sandbox", "run_sandbox"]

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
#: how long a kill (of an application, or of everything at stop) waits for the containers
KILL_TIMEOUT_S = 30.0


def _rpc(method: F) -> F:
    """Answer a RequestRejected with the status it names and any other error with INTERNAL."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except RequestRejected as exc:
            logger.debug("%s rejected: %s", method.__name__, exc)
            context.abort(grpc.StatusCode[exc.code], str(exc))
        except Exception as exc:
            logger.exception("%s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")

    return wrapper  # type: ignore[return-value]


def _server_credentials(cert: bytes, key: bytes) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=cert, require_client_auth=True)


def _listen(server: grpc.Server, address: str, creds: grpc.ServerCredentials) -> int:
    try:
        port = server.add_secure_port(address, creds)
    except RuntimeError as exc:
        raise SandboxError(f"cannot listen on {address}: {exc}") from exc
    if not port:
        raise SandboxError(f"cannot listen on {address}")
    return int(port)


class DriverService(skein_pb2_grpc.DriverServicer):
    """skein's Driver service over the sandbox's Cluster."""

    def __init__(self, cluster: Cluster, stopping: threading.Event) -> None:
        self.cluster = cluster
        self.stopping = stopping

    @_rpc
    def ping(self, request: proto.Empty, context: grpc.ServicerContext) -> proto.Empty:
        return proto.Empty()

    @_rpc
    def getStatus(self, request: proto.Application, context: grpc.ServicerContext) -> proto.ApplicationReport:
        return self.cluster.get(request.id).report()

    @_rpc
    def getApplications(self, request: proto.ApplicationsRequest,
                        context: grpc.ServicerContext) -> proto.ApplicationsResponse:
        return proto.ApplicationsResponse(reports=self.cluster.reports(request))

    @_rpc
    def getNodes(self, request: proto.NodesRequest, context: grpc.ServicerContext) -> proto.NodesResponse:
        return proto.NodesResponse(reports=self.cluster.node_reports(list(request.states)))

    @_rpc
    def getQueue(self, request: proto.QueueRequest, context: grpc.ServicerContext) -> proto.Queue:
        return self.cluster.queue(request.name)

    @_rpc
    def getChildQueues(self, request: proto.QueueRequest, context: grpc.ServicerContext) -> proto.QueuesResponse:
        return proto.QueuesResponse(queues=self.cluster.child_queues(request.name))

    @_rpc
    def getAllQueues(self, request: proto.Empty, context: grpc.ServicerContext) -> proto.QueuesResponse:
        return proto.QueuesResponse(queues=self.cluster.all_queues())

    @_rpc
    def moveApplication(self, request: proto.MoveRequest, context: grpc.ServicerContext) -> proto.Empty:
        self.cluster.move(request.id, request.queue)
        return proto.Empty()

    @_rpc
    def submit(self, request: proto.ApplicationSpec, context: grpc.ServicerContext) -> proto.Application:
        return proto.Application(id=self.cluster.submit(request).id)

    @_rpc
    def waitForStart(self, request: proto.Application, context: grpc.ServicerContext) -> proto.ApplicationReport:
        app = self.cluster.get(request.id)
        while not app.wait_started(0.5):
            if self.stopping.is_set():
                raise RequestRejected("UNAVAILABLE", "the YARN sandbox is stopping")
            if not context.is_active():
                raise RequestRejected("CANCELLED", "the caller went away")
        return app.report()

    @_rpc
    def kill(self, request: proto.KillRequest, context: grpc.ServicerContext) -> proto.Empty:
        app = self.cluster.get(request.id)
        user = request.user or app.user
        app.kill(f"Application {app.id} was killed by user {user} at {self.cluster.host}", KILL_TIMEOUT_S)
        return proto.Empty()

    @_rpc
    def getLogs(self, request: proto.LogsRequest, context: grpc.ServicerContext) -> proto.LogsResponse:
        app = self.cluster.get(request.id)
        if not app.finished:
            raise RequestRejected("INVALID_ARGUMENT",
                                  f"Application {request.id} has not completed, logs are not available")
        return proto.LogsResponse(logs=app.logs())


class AppMasterService(skein_pb2_grpc.AppMasterServicer):
    """skein's AppMaster service over one application attempt."""

    def __init__(self, am: AppMaster) -> None:
        self.am = am

    @_rpc
    def shutdown(self, request: proto.ShutdownRequest, context: grpc.ServicerContext) -> proto.Empty:
        self.am.shutdown(proto.FinalStatus.Type.Name(request.final_status), request.diagnostics)
        return proto.Empty()

    @_rpc
    def GetRange(self, request: proto.GetRangeRequest, context: grpc.ServicerContext) -> proto.GetRangeResponse:
        return self.am.kv.get_range(request)

    @_rpc
    def PutKey(self, request: proto.PutKeyRequest, context: grpc.ServicerContext) -> proto.PutKeyResponse:
        return self.am.kv.put_key(request)

    @_rpc
    def DeleteRange(self, request: proto.DeleteRangeRequest,
                    context: grpc.ServicerContext) -> proto.DeleteRangeResponse:
        return self.am.kv.delete_range(request)

    @_rpc
    def Transaction(self, request: proto.TransactionRequest,
                    context: grpc.ServicerContext) -> proto.TransactionResponse:
        return self.am.kv.transaction(request)

    def Watch(self, request_iterator: Iterator[proto.WatchRequest],
              context: grpc.ServicerContext) -> Iterator[proto.WatchResponse]:
        """Create/cancel requests are read on a thread of their own; events come as they happen;
        the call ends when the client closes or cancels it, or with UNAVAILABLE when the attempt
        ends (skein's client then raises ConnectionError from its event queues)."""
        stream = self.am.kv.open_stream()
        context.add_callback(stream.close)

        def read_requests() -> None:
            try:
                for req in request_iterator:
                    stream.request(req)
            except Exception:  # the call was cancelled or the server stops
                logger.debug("watch stream of %s ended", self.am.ctx.app_id, exc_info=True)
            finally:
                stream.close()

        threading.Thread(target=read_requests, name=f"kv-watch-{self.am.ctx.app_id}", daemon=True).start()
        yield from stream
        if stream.lost:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the application master has shut down")

    @_rpc
    def getApplicationSpec(self, request: proto.Empty, context: grpc.ServicerContext) -> proto.ApplicationSpec:
        return self.am.spec

    @_rpc
    def getContainers(self, request: proto.ContainersRequest,
                      context: grpc.ServicerContext) -> proto.ContainersResponse:
        states = [proto.Container.State.Name(s) for s in request.states]
        return proto.ContainersResponse(containers=self.am.get_containers(list(request.services), states))

    @_rpc
    def killContainer(self, request: proto.ContainerInstance, context: grpc.ServicerContext) -> proto.Empty:
        self.am.kill_container(request.service_name, request.instance)
        return proto.Empty()

    @_rpc
    def scale(self, request: proto.ScaleRequest, context: grpc.ServicerContext) -> proto.ContainersResponse:
        return proto.ContainersResponse(containers=self.am.scale(request.service_name, request.count, request.delta))

    @_rpc
    def addContainer(self, request: proto.AddContainerRequest, context: grpc.ServicerContext) -> proto.Container:
        return self.am.add_container(request.service_name, dict(request.env))

    @_rpc
    def SetProgress(self, request: proto.SetProgressRequest, context: grpc.ServicerContext) -> proto.Empty:
        self.am.set_progress(request.progress)
        return proto.Empty()

    @_rpc
    def AddProxy(self, request: proto.Proxy, context: grpc.ServicerContext) -> proto.Empty:
        self.am.add_proxy(request)
        return proto.Empty()

    @_rpc
    def RemoveProxy(self, request: proto.RemoveProxyRequest, context: grpc.ServicerContext) -> proto.Empty:
        self.am.remove_proxy(request.route)
        return proto.Empty()

    @_rpc
    def UiInfo(self, request: proto.UIInfoRequest, context: grpc.ServicerContext) -> proto.UIInfoResponse:
        return proto.UIInfoResponse(ui_address=[self.am.ctx.ui_address], proxy_prefix="/pages")

    @_rpc
    def GetProxies(self, request: proto.GetProxiesRequest, context: grpc.ServicerContext) -> proto.GetProxiesResponse:
        with self.am.lock:
            return proto.GetProxiesResponse(proxy=list(self.am.proxies.values()))


def load_credentials(config_dir: str) -> tuple[bytes, bytes]:
    """The certificate and key in ``config_dir`` (skein.crt, skein.pem), created as skein does
    when neither exists. Raises SandboxError when only one does."""
    cert_path, key_path = os.path.join(config_dir, "skein.crt"), os.path.join(config_dir, "skein.pem")
    if not os.path.exists(cert_path) and not os.path.exists(key_path):
        try:
            skein.Security.new_credentials().to_directory(config_dir)
            logger.info("wrote new skein credentials to %s", config_dir)
        except FileExistsError:  # another process wrote them meanwhile
            pass
    try:
        with open(cert_path, "rb") as cert, open(key_path, "rb") as key:
            return cert.read(), key.read()
    except OSError as exc:
        raise SandboxError(f"cannot read skein's credentials in {config_dir} ({exc}); remove what is left of "
                           f"skein.crt / skein.pem there to have new ones made") from exc


JAVA_SHIM = """#!{python}
# Written by yarnflow's YARN sandbox: stands in for `java com.anaconda.skein.Driver`, which
# skein.Client() starts, and reports the sandbox's port instead of starting a driver.
import os, signal, socket, struct, sys
with socket.create_connection(("127.0.0.1", int(os.environ["SKEIN_CALLBACK_PORT"]))) as s:
    s.sendall(struct.pack("!i", {port}))
if "--daemon" in sys.argv:
    while True:
        signal.pause()
while sys.stdin.buffer.read(65536):  # the client closes stdin to stop its driver
    pass
"""
YARN_SHIM = """#!/bin/sh
# Written by yarnflow's YARN sandbox: skein.Client() runs `yarn classpath --glob`.
if [ "$1" = classpath ]; then echo; exit 0; fi
echo "yarn-sandbox: only 'yarn classpath' is available here" >&2
exit 1
"""


class Sandbox:
    """A skein-compatible stand-in for YARN (see the module docstring). ``start()`` returns
    self; ``stop()`` kills every application and container, stops the servers and removes the
    driver file (idempotent). ``work_dir`` holds containers (``local/<app>/<container>``) and
    their logs (``logs/<app>/<container>``); a temporary one, removed on stop, by default.

    ``max_memory_mb``/``max_vcores``: the largest container (a bigger one is refused at
    submit); ``node_count``: pretend NodeManagers (all containers run on this machine);
    ``max_am_attempts``: YARN's cap on ``spec.max_attempts`` (its default, 2); ``kill_grace_s``:
    SIGTERM to SIGKILL; ``check_memory``: kill containers over their memory, as YARN's pmem
    check; ``queues``: the leaf queues under root; ``web_port``: the ResourceManager's web proxy,
    where the tracking URL of a running application (``http://host:port/proxy/<id>/``) and its
    skein pages are served (web_proxy.py; 0: any free port).

    ``separate_hosts`` (root only): every NodeManager is a host of its own (hosts.py): its
    containers run in its network namespace, with their folders under ``nodes/<node>/`` of the
    work dir and the other nodes' folders (and every folder of ``hide``: the client's) hidden.
    The ResourceManager's services listen on a host of their own (``rm``), the client's host is
    ``client`` (``host_command("client", argv)`` runs a command there), and each name of
    ``extra_hosts`` (``zookeeper``, say) is one more host. ``node_count`` NodeManagers.

    Raises SandboxError from ``start()`` when it cannot listen (the port is taken: pick another)
    or read the credentials."""

    def __init__(self, config_dir: str, port: int = 0, host: str = "127.0.0.1", work_dir: str | None = None,
                 max_memory_mb: int = 8192, max_vcores: int = 4, node_count: int = 1, max_am_attempts: int = 2,
                 kill_grace_s: float = 0.25, check_memory: bool = True,
                 queues: Sequence[str] = ("default",), separate_hosts: bool = False,
                 extra_hosts: Sequence[str] = (), hide: Sequence[str] = (), web_port: int = 0) -> None:
        self.config_dir = os.path.abspath(os.path.expanduser(config_dir))
        self.host = host
        self.port = port
        #: the ResourceManager's web proxy (web_proxy.py: tracking URLs): 0, any free port
        self.web_port = web_port
        self._own_work_dir = work_dir is None
        self.work_dir = os.path.abspath(work_dir) if work_dir else ""
        self.limits = Limits(max_memory_mb, max_vcores, max_am_attempts, kill_grace_s, check_memory)
        self.node_count = node_count
        self.queues = tuple(queues)
        self.separate_hosts = separate_hosts
        self.extra_hosts = tuple(extra_hosts)
        self.hide = tuple(os.path.abspath(h) for h in hide)
        self.network: HostNetwork | None = None
        self.cluster: Cluster | None = None
        self._server: grpc.Server | None = None
        self._web_proxy: WebProxy | None = None
        self._executors: list[ThreadPoolExecutor] = []
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        """host:port of the Driver service (valid after ``start()``)."""
        return f"{self.host}:{self.port}"

    @property
    def java_home(self) -> str:
        return os.path.join(self.work_dir, "skein-shims")

    def client_env(self) -> dict[str, str]:
        """Variables under which ``skein.Client()`` (no address) reaches this sandbox."""
        return {"SKEIN_CONFIG": self.config_dir, "JAVA_HOME": self.java_home,
                "PATH": os.path.join(self.java_home, "bin") + os.pathsep + os.environ.get("PATH", "")}

    def start(self) -> Sandbox:
        os.makedirs(self.config_dir, exist_ok=True)
        cert, key = load_credentials(self.config_dir)
        if self._own_work_dir:
            self.work_dir = tempfile.mkdtemp(prefix="yarn-sandbox-")
        os.makedirs(self.work_dir, exist_ok=True)
        nodes = self._make_hosts() if self.separate_hosts else None
        network = self.network
        self.cluster = Cluster(self.host, self.work_dir, self.limits, self.node_count, self.queues, cert, key,
                               self._serve_appmaster, nodes,
                               (lambda node: not network.is_cut(node.netns)) if network is not None else lambda node: True)
        executor = ThreadPoolExecutor(max_workers=32, thread_name_prefix="sandbox-driver")
        self._executors.append(executor)
        server = grpc.server(executor, options=[("grpc.so_reuseport", 0)])
        skein_pb2_grpc.add_DriverServicer_to_server(DriverService(self.cluster, self._stopping), server)
        try:
            self.port = self._on_rm_host(lambda: _listen(server, f"{self.host}:{self.port}",
                                                         _server_credentials(cert, key)))
        except SandboxError:
            self.cluster.stop(1.0)
            executor.shutdown(wait=False)
            if self.network is not None:
                self.network.remove()
            if self._own_work_dir:
                shutil.rmtree(self.work_dir, ignore_errors=True)
            raise
        server.start()
        self._server = server
        proxy = WebProxy(self.cluster.pages, self.host, self.web_port)
        try:
            self.web_port = self._on_rm_host(proxy.bind)
        except OSError as exc:
            self.stop()
            raise SandboxError(f"the web proxy cannot listen on {self.host}:{self.web_port}: {exc}") from None
        proxy.start()
        self.cluster.web_proxy = self._web_proxy = proxy
        self._write_shims()
        self._write_driver_file()
        logger.info("YARN sandbox serving skein's Driver at %s and applications' web UIs at http://%s:%d/proxy/ "
                    "(config %s, work dir %s, max container <memory:%d, vCores:%d>)", self.address, self.host,
                    self.web_port, self.config_dir, self.work_dir, self.limits.max_memory_mb, self.limits.max_vcores)
        return self

    def stop(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            self._stopping.set()
        logger.info("YARN sandbox at %s stopping", self.address)
        try:
            if self.cluster is not None:
                self.cluster.stop(KILL_TIMEOUT_S)
            if self._server is not None:
                self._server.stop(grace=1.0).wait(5.0)
            if self._web_proxy is not None:
                self._web_proxy.stop()
            for executor in self._executors:
                executor.shutdown(wait=False)
            self._remove_driver_file()
            if self.network is not None:
                self.network.remove()
            if self._own_work_dir and self.work_dir:
                shutil.rmtree(self.work_dir, ignore_errors=True)
        finally:
            self._stopped.set()
            logger.info("YARN sandbox at %s stopped", self.address)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until ``stop()`` has finished (True) or ``timeout`` passed (False)."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- hosts of their own ------------------------------------------------------------------------
    def _make_hosts(self) -> list[Node]:
        """The hosts (hosts.py) and the NodeManagers on them; the services listen on ``rm``."""
        names = [f"node-{i + 1}" for i in range(max(1, self.node_count))]
        roots = {name: os.path.join(self.work_dir, "nodes", name) for name in names}
        for root in roots.values():  # (all made now: a host hides the others' from its start)
            os.makedirs(root, exist_ok=True)
        shared = [os.path.join(self.work_dir, d) for d in ("local", "logs", "staging")]
        hidden = {name: tuple(sorted({*(r for n, r in roots.items() if n != name), *shared, *self.hide}))
                  for name in names}
        for name in ("client", *self.extra_hosts):
            hidden[name] = (os.path.join(self.work_dir, "nodes"),)
        self.network = HostNetwork(["rm", "client", *names, *self.extra_hosts], hidden).create()
        self.host = self.network.hosts["rm"].address
        return [Node(self.network.hosts[n].address, 45454, 8042, roots[n], self.network.hosts[n].netns, hidden[n])
                for n in names]

    def _on_rm_host(self, listen: Callable[[], int]) -> int:
        """``listen()`` run in the ResourceManager's network namespace (by a thread of its own:
        a socket stays in the namespace it was made in), or here without hosts of their own."""
        if self.network is None:
            return listen()
        result: list[int] = []
        errors: list[BaseException] = []

        def run() -> None:
            try:
                assert self.network is not None
                enter_network(self.network.hosts["rm"].netns)
                result.append(listen())
            except BaseException as exc:  # noqa: B036 - handed to the caller
                errors.append(exc)

        thread = threading.Thread(target=run, name="sandbox-listen")
        thread.start()
        thread.join()
        if errors:
            raise errors[0] if isinstance(errors[0], SandboxError) else SandboxError(str(errors[0]))
        return result[0]

    def hosts(self) -> dict[str, Host]:
        """The hosts by name (empty without hosts of their own)."""
        return dict(self.network.hosts) if self.network is not None else {}

    def host_command(self, name: str, argv: Sequence[str]) -> list[str]:
        """``argv`` to run on host ``name`` (``client``, ``node-1``, an extra host)."""
        if self.network is None:
            raise SandboxError("this sandbox's hosts are not apart (separate_hosts=False)")
        return self.network.hosts[name].command(argv)

    def _serve_appmaster(self, am: AppMaster) -> tuple[int, Callable[[], None]]:
        app_id = am.ctx.app_id
        executor = ThreadPoolExecutor(max_workers=64, thread_name_prefix=f"am-{app_id}")
        server = grpc.server(executor, options=[("grpc.so_reuseport", 0)])
        skein_pb2_grpc.add_AppMasterServicer_to_server(AppMasterService(am), server)
        try:
            port = self._on_rm_host(lambda: _listen(server, f"{self.host}:0",
                                                    _server_credentials(am.ctx.cert, am.ctx.key)))
        except SandboxError:
            executor.shutdown(wait=False)
            raise
        server.start()

        def stop() -> None:
            am.kv.close()
            server.stop(grace=0.5).wait(5.0)
            executor.shutdown(wait=False)

        return port, stop

    def _driver_file(self) -> str:
        return os.path.join(self.config_dir, "driver")

    def _write_driver_file(self) -> None:
        path = self._driver_file()
        if os.path.exists(path):
            logger.warning("replacing skein's global driver file %s (it named another driver)", path)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"address": self.address, "pid": os.getpid()}, fh)
        os.replace(tmp, path)

    def _remove_driver_file(self) -> None:
        path = self._driver_file()
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            if data.get("address") == self.address and data.get("pid") == os.getpid():
                os.remove(path)
        except (OSError, ValueError):
            pass

    def _write_shims(self) -> None:
        bin_dir = os.path.join(self.java_home, "bin")
        os.makedirs(bin_dir, exist_ok=True)
        for name, text in (("java", JAVA_SHIM.format(python=sys.executable, port=self.port)), ("yarn", YARN_SHIM)):
            path = os.path.join(bin_dir, name)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def run_sandbox(config_dir: str | None = None, port: int = 0, host: str = "127.0.0.1", work_dir: str | None = None,
                **options: Any) -> int:
    """Run a Sandbox until SIGTERM or SIGINT (call from the main thread), then stop it; prints
    one line with its address. ``config_dir`` defaults to ``$SKEIN_CONFIG`` or ``~/.skein``;
    ``options`` are Sandbox's other keyword arguments. Returns the exit code (1: it could not
    start, with the reason on stderr)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=os.environ.get("YARNFLOW_LOG_LEVEL", "INFO"),
                            format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s")
    config_dir = config_dir or os.environ.get("SKEIN_CONFIG") or os.path.join(os.path.expanduser("~"), ".skein")
    stop_requested = threading.Event()
    shutdown_on_signals(lambda reason: stop_requested.set())
    try:
        sandbox = Sandbox(config_dir, port=port, host=host, work_dir=work_dir, **options).start()
    except SandboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"yarn-sandbox running at {sandbox.address} (SKEIN_CONFIG={sandbox.config_dir}, work dir "
              f"{sandbox.work_dir}); applications' web UIs at http://{sandbox.host}:{sandbox.web_port}/proxy/APP_ID/",
              flush=True)
        for h in sandbox.hosts().values():
            print(f"  host {h.name}: {h.address} (network namespace {h.netns})", flush=True)
        stop_requested.wait()
    finally:
        sandbox.stop()
    return 0
