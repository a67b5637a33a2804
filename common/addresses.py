"""Addresses a process binds to and advertises (Flink's ``rest.bind-address`` / ``rest.address``,
``taskmanager.host``, ``jobmanager.rpc.address``).

A process binds to an address of its own host (or to all of them: ``0.0.0.0``) and advertises
one its peers can reach: on a cluster of many hosts never a loopback address, which each host
has for itself. Both are checked when the process starts, so that a wrong address is a clear
error naming the configuration key, not a hang of peers that cannot connect."""

from __future__ import annotations

import ipaddress
import socket

from typing import TYPE_CHECKING

from yarnflow.common.errors import ConfigurationError

if TYPE_CHECKING:
    from yarnflow.common.config import Configuration

__all__ = ["WILDCARDS", "check_bind_address", "check_reachable_from", "is_loopback", "rest_advertised_address",
           "rest_bind_address"]

WILDCARDS = ("", "0.0.0.0", "::")


def _resolve(host: str, key: str) -> tuple[int, str]:
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise ConfigurationError(f"{key}: the host name {host!r} does not resolve ({exc})") from None
    return family, str(sockaddr[0])


def check_bind_address(host: str, key: str) -> None:
    """Raise ConfigurationError (naming ``key``) when this host cannot listen on ``host``: a name
    that does not resolve, or an address that is not one of this host's (set the key to one of
    them, or to 0.0.0.0 for all)."""
    if host in WILDCARDS:
        return
    family, address = _resolve(host, key)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((address, 0))
    except OSError as exc:
        raise ConfigurationError(f"{key}: cannot listen on {host} ({address}): {exc.strerror}; it is not an "
                                 f"address of this host ({socket.gethostname()}): set it to one of this host's "
                                 f"addresses, or to 0.0.0.0 for all of them") from None
    finally:
        sock.close()


def is_loopback(host: str) -> bool:
    """``host`` names this host's loopback interface (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_reachable_from(advertised: str, key: str, peer: str) -> None:
    """Raise ConfigurationError when this process would advertise a loopback address (``key``)
    to a peer on another host (``peer``: an address that is not loopback): the peer, and every
    other host, could not reach this process by it."""
    if is_loopback(advertised) and peer and not is_loopback(peer) and peer not in WILDCARDS:
        raise ConfigurationError(f"{key} is {advertised}, a loopback address, but its peers are at {peer}: processes "
                                 f"on other hosts could not reach this one by it; set {key} to an address of this "
                                 f"host they can reach")


def rest_bind_address(config: Configuration) -> str:
    """Where the REST API listens: ``rest.bind-address``, else ``rest.address``."""
    from yarnflow.common.config import Options

    return str(config[Options.REST_BIND_ADDRESS] or config[Options.REST_ADDRESS] or "127.0.0.1")


def rest_advertised_address(config: Configuration) -> str:
    """The REST API's address in the URLs the AppMaster hands out: ``rest.address``, or (a
    wildcard there) ``jobmanager.rpc.address``, else 127.0.0.1."""
    from yarnflow.common.config import Options

    for host in (str(config[Options.REST_ADDRESS]), str(config[Options.RPC_ADDRESS])):
        if host not in WILDCARDS:
            return host
    return "127.0.0.1"
