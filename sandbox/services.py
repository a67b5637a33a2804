"""A sandbox application's services and their containers, as skein's Java ApplicationMaster
keeps them: ``ServiceTracker`` (one service: its instances, restarts and dependencies) and
``Container`` (one container's state, its node, its process), and the (pretend) ``Node`` it
runs on. Used under the attempt master's lock (appmaster.py), which they call back."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from skein.proto import skein_pb2 as proto

from yarnflow.sandbox.processes import ContainerProcess, LocalFile

if TYPE_CHECKING:
    from yarnflow.sandbox.appmaster import AppMaster

__all__ = ["Container", "Node", "ServiceTracker", "file_url", "local_files", "now_ms"]


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Node:
    """A NodeManager. Without hosts of their own (``netns`` None) a pretend one: its containers
    run on this machine and share its folders. On a host of its own, its containers run in
    network namespace ``netns`` with their folders under ``root`` and ``hidden`` hidden."""

    host: str
    port: int
    http_port: int
    root: str = ""
    netns: str | None = None
    hidden: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def http_address(self) -> str:
        return f"{self.host}:{self.http_port}"


@dataclass(eq=False)
class Container:
    service: str
    instance: int
    state: str
    env: dict[str, str]
    memory: int = 0
    vcores: int = 0
    yarn_id: str = ""
    node: Node | None = None
    start_ms: int = 0
    finish_ms: int = 0
    exit_message: str = ""
    log_dir: str = ""
    owned_keys: set[str] = field(default_factory=set)
    process: ContainerProcess | None = None
    replaces: str = ""  # the id of the failed container this one restarts

    @property
    def id(self) -> str:
        return f"{self.service}_{self.instance}"

    @property
    def node_http(self) -> str:
        return self.node.http_address if self.node is not None else ""

    def to_proto(self) -> proto.Container:
        return proto.Container(service_name=self.service, instance=self.instance, state=self.state,
                               yarn_container_id=self.yarn_id, yarn_node_http_address=self.node_http,
                               start_time=self.start_ms, finish_time=self.finish_ms, exit_message=self.exit_message)


def local_files(files: Mapping[str, proto.File]) -> list[LocalFile]:
    return [LocalFile(target, file_url(f), f.type == proto.File.ARCHIVE) for target, f in sorted(files.items())]


def file_url(f: proto.File) -> str:
    u = f.source
    if u.scheme in ("", "file"):
        return "file://" + u.file
    return f"{u.scheme}://{u.host}{f':{u.port}' if u.port > 0 else ''}{u.file}"


class ServiceTracker:
    """One service's containers, as skein's ServiceTracker: instance numbers only grow; failed
    containers are replaced while restarts remain (``max_restarts`` -1: always)."""

    def __init__(self, name: str, service: proto.Service, am: AppMaster) -> None:
        self.name = name
        self.service = service
        self.am = am
        self.depends = set(service.depends)
        self.dependents: list[ServiceTracker] = []
        self.containers: list[Container] = []
        self.waiting: dict[int, None] = {}  # ordered sets of instances
        self.requested: dict[int, None] = {}
        self.running: dict[int, None] = {}
        self.initial_running = False
        self.num_failed = self.num_restarted = 0

    def num_active(self) -> int:
        return len(self.waiting) + len(self.requested) + len(self.running)

    def is_finished(self) -> bool:
        return self.num_active() == 0

    def is_failed(self) -> bool:
        return self.num_failed > self.num_restarted and not self.service.allow_failures

    def get(self, instance: int) -> Container | None:
        return self.containers[instance] if 0 <= instance < len(self.containers) else None

    def add_container(self, env: Mapping[str, str] | None = None, replaces: str = "") -> Container:
        c = Container(self.name, len(self.containers), "REQUESTED" if not self.depends else "WAITING", dict(env or {}),
                      self.service.resources.memory, self.service.resources.vcores, replaces=replaces)
        self.containers.append(c)
        if self.depends:
            self.waiting[c.instance] = None
            self.am.log(f"WAITING: {c.id}")
        else:
            self._request(c)
        return c

    def _request(self, c: Container) -> None:
        c.state = "REQUESTED"
        self.requested[c.instance] = None
        self.am.log(f"REQUESTED: {c.id}")
        self.am.request_launch(c)

    def notify_running(self, dependency: str) -> None:
        self.depends.discard(dependency)
        if not self.depends:
            for instance in list(self.waiting):
                self._request(self.containers[instance])
            self.waiting.clear()

    def allocated(self, c: Container) -> None:
        self.requested.pop(c.instance, None)
        self.running[c.instance] = None
        if not self.initial_running and not self.requested:
            self.initial_running = True
            for dependent in self.dependents:
                dependent.notify_running(self.name)

    def scale(self, count: int, delta: int) -> list[Container]:
        active = self.num_active()
        if delta == 0:
            delta = count - active
        else:
            delta = max(delta, -active)
            count = delta + active
        self.am.log(f"Scaling service '{self.name}' to {count} instances, a delta of {delta}.")
        if delta > 0:
            return [self.add_container() for _ in range(delta)]
        out = []
        for _ in range(-delta):  # WAITING first, then REQUESTED, then RUNNING; oldest (lowest instance) first
            pool = self.waiting or self.requested or self.running
            instance = min(pool)
            self.finish(instance, "KILLED", "Killed by user request.")
            out.append(self.containers[instance])
        return out

    def finish(self, instance: int, state: str, message: str) -> None:
        c = self.containers[instance]
        if c.state == "WAITING":
            self.waiting.pop(instance, None)
        elif c.state == "REQUESTED":
            self.requested.pop(instance, None)
        elif c.state == "RUNNING":
            self.running.pop(instance, None)
            c.finish_ms = now_ms()
            if c.process is not None:
                c.process.terminate()
        else:
            return
        c.state, c.exit_message = state, message
        self.am.log(f"{state}: {c.id} - {message}", logging.WARNING if state == "FAILED" else logging.INFO)
        self.am.kv.remove_owned(sorted(c.owned_keys))
        c.owned_keys.clear()
        if state == "FAILED":
            self.num_failed += 1
            if self.service.max_restarts == -1 or self.num_restarted < self.service.max_restarts:
                self.num_restarted += 1
                self.am.log(f"RESTARTING: adding new container to replace {c.id}.")
                self.add_container(c.env, replaces=c.id)
        if self.is_finished() or self.is_failed():
            self.am.maybe_shutdown()
