"""Hosts of their own for the YARN sandbox: each NodeManager (and the ResourceManager, the
client and any extra host a test asks for, such as ZooKeeper's) becomes a Linux network
namespace with one address on a bridge the sandbox creates, and a process started on a host
also gets a mount namespace of its own in which the other hosts' folders are empty. So
processes on different hosts reach each other only by the addresses they advertise (their
127.0.0.1 is their own), and see none of each other's local files, as on a real cluster.

Topology (made by ``HostNetwork.create``, removed by ``remove``; root is needed)::

    bridge yfs<tag>b  10.A.B.1/24        the machine itself (the operator's console: tests poll from here)
      +- veth yfs<tag>v0 <-> eth0 in netns yfs-<tag>-rm        10.A.B.2
      +- veth yfs<tag>v1 <-> eth0 in netns yfs-<tag>-client    10.A.B.3
      +- ...  one per host: node-1, node-2, ..., then the extra hosts

``10.A.B.0/24`` is picked among the 10.x.y.0/24 networks no route of the machine touches, so
no address the sandbox uses exists outside the namespaces and nothing is routed off the
machine (the namespaces have no default route). A sandbox that died without removing its
namespaces leaves a record under ``/run/yarnflow-sandbox``; the next ``create`` removes what a
dead sandbox left.

Links are cut and healed with ``cut(host)`` / ``heal(host)`` (the host's veth down / up): its
processes keep running, cut off from every other host; ``cut_between(a, b)`` cuts one link,
silently (a neighbour entry that sends the other's packets nowhere).

The process side (entering a host) lives in processes.py, which must import nothing but the
standard library: ``enter_host(netns, hidden)``."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import random
import secrets
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from yarnflow.sandbox.kv import SandboxError
from yarnflow.sandbox.processes import RUNNER

__all__ = ["Host", "HostNetwork"]

log = logging.getLogger(__name__)

RECORDS = "/run/yarnflow-sandbox"


@dataclass(frozen=True)
class Host:
    """One host: its network namespace, its address on the bridge, the folders it must not see."""

    name: str
    netns: str
    address: str
    veth: str
    hidden: tuple[str, ...] = ()

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run on this host (a process that enters the host, then execs ``argv``)."""
        return [sys.executable, RUNNER, "--enter", self.netns, *(a for d in self.hidden for a in ("--hide", d)),
                "--", *argv]


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SandboxError(f"`ip {' '.join(args)}` failed: {done.stderr.strip() or done.returncode} (hosts of their "
                           f"own need root and iproute2)")


def _used_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks of the machine's addresses and routes (a default route aside)."""
    out = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    nets = []
    for line in out.splitlines():
        tokens = line.split()
        if tokens and tokens[0] in ("local", "broadcast", "unreachable", "prohibit", "blackhole", "unicast"):
            tokens = tokens[1:]
        if not tokens or tokens[0] == "default":
            continue
        try:
            nets.append(ipaddress.IPv4Network(tokens[0], strict=False))
        except ValueError:
            continue
    return nets


def _free_network() -> ipaddress.IPv4Network:
    used = _used_networks()
    for _ in range(200):
        candidate = ipaddress.IPv4Network(f"10.{random.randint(100, 250)}.{random.randint(0, 255)}.0/24")
        if not any(candidate.overlaps(n) for n in used):
            return candidate
    raise SandboxError("no free 10.x.y.0/24 network for the sandbox's hosts")


class HostNetwork:
    """The bridge and the hosts of one sandbox. ``names``: the hosts, in order (the first is the
    ResourceManager's); ``hidden(name)``: the folders a host must not see."""

    def __init__(self, names: Sequence[str], hidden: dict[str, tuple[str, ...]]) -> None:
        self.tag = secrets.token_hex(2)
        self.bridge = f"yfs{self.tag}b"
        self._names = list(names)
        self._hidden = hidden
        self.network: ipaddress.IPv4Network | None = None
        self.hosts: dict[str, Host] = {}
        self._cut: set[str] = set()

    @property
    def console_address(self) -> str:
        """The machine's own address on the bridge."""
        assert self.network is not None
        return str(self.network.network_address + 1)

    def create(self) -> HostNetwork:
        remove_stale()
        self.network = _free_network()
        os.makedirs(RECORDS, exist_ok=True)
        with open(os.path.join(RECORDS, f"{self.tag}.json"), "w", encoding="utf-8") as fh:
            json.dump({"pid": os.getpid(), "bridge": self.bridge, "netns": [self._netns(n) for n in self._names]}, fh)
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.console_address}/{self.network.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, name in enumerate(self._names):
                host = Host(name, self._netns(name), str(self.network.network_address + 2 + i), f"yfs{self.tag}v{i}",
                            self._hidden.get(name, ()))
                _ip("netns", "add", host.netns)
                _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
                _ip("link", "set", host.veth, "master", self.bridge, "up")
                _ip("-n", host.netns, "addr", "add", f"{host.address}/{self.network.prefixlen}", "dev", "eth0")
                _ip("-n", host.netns, "link", "set", "eth0", "up")
                _ip("-n", host.netns, "link", "set", "lo", "up")
                self.hosts[name] = host
        except SandboxError:
            self.remove()
            raise
        log.info("sandbox hosts on %s (bridge %s): %s", self.network, self.bridge,
                 ", ".join(f"{h.name} {h.address}" for h in self.hosts.values()))
        return self

    def remove(self) -> None:
        """Remove the namespaces and the bridge (their processes must have ended: a namespace
        with processes left in it lives on until they exit, unreachable)."""
        _remove(self.bridge, [self._netns(n) for n in self._names])
        try:
            os.remove(os.path.join(RECORDS, f"{self.tag}.json"))
        except OSError:
            pass

    def cut(self, name: str) -> None:
        """Cut the host off from every other (its link down: what it sends fails, what is sent to
        it is lost); its processes keep running."""
        _ip("link", "set", self.hosts[name].veth, "down")
        self._cut.add(name)
        log.info("cut host %s (%s) off", name, self.hosts[name].address)

    def heal(self, name: str) -> None:
        _ip("link", "set", self.hosts[name].veth, "up")
        self._cut.discard(name)
        log.info("healed host %s (%s)", name, self.hosts[name].address)

    def cut_between(self, a: str, b: str) -> None:
        """Cut the link between two hosts only, silently both ways (each sends the other's
        packets to a hardware address no host has: the bridge drops them, no error comes back,
        as with a firewall's DROP); both keep reaching every other host."""
        for this, other in ((a, b), (b, a)):
            _ip("-n", self.hosts[this].netns, "neigh", "replace", self.hosts[other].address, "lladdr",
                "02:00:00:00:00:01", "dev", "eth0", "nud", "permanent")
        log.info("cut the link between %s and %s", a, b)

    def heal_between(self, a: str, b: str) -> None:
        for this, other in ((a, b), (b, a)):
            _ip("-n", self.hosts[this].netns, "neigh", "del", self.hosts[other].address, "dev", "eth0")
        log.info("healed the link between %s and %s", a, b)

    def is_cut(self, netns: str | None) -> bool:
        """Whether the host of network namespace ``netns`` is cut off (from everything)."""
        return any(self.hosts[name].netns == netns for name in self._cut)

    def _netns(self, name: str) -> str:
        return f"yfs-{self.tag}-{name}"


def _remove(bridge: str, namespaces: Sequence[str]) -> None:
    for netns in namespaces:
        subprocess.run(["ip", "netns", "delete", netns], capture_output=True)
    subprocess.run(["ip", "link", "delete", bridge], capture_output=True)


def remove_stale() -> None:
    """Remove the namespaces and bridges of sandboxes that died without removing them."""
    try:
        names = os.listdir(RECORDS)
    except OSError:
        return
    for name in names:
        path = os.path.join(RECORDS, name)
        try:
            with open(path, encoding="utf-8") as fh:
                record = json.load(fh)
            if psutil.pid_exists(int(record["pid"])):
                continue
            _remove(str(record["bridge"]), [str(n) for n in record["netns"]])
            os.remove(path)
            log.info("removed the hosts a dead sandbox (pid %s) left: %s", record["pid"], ", ".join(record["netns"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
