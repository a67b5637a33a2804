"""The checks a sandbox application's spec passes before it is accepted, as YARN and skein
make them (skein's ApplicationSpec.validate, the queue, the scheduler's maximum allocation,
local files that exist), and the TLS credentials the application runs with."""

from __future__ import annotations

import getpass
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from skein.proto import skein_pb2 as proto

from yarnflow.sandbox.processes import local_path
from yarnflow.sandbox.services import local_files

if TYPE_CHECKING:
    from yarnflow.sandbox.applications import Limits

__all__ = ["credentials", "validate_spec"]


def validate_spec(spec: proto.ApplicationSpec, queues: Sequence[str], limits: Limits) -> None:
    """skein's ApplicationSpec.validate, YARN's queue and maximum-allocation checks, and that
    every local file exists. Raises ValueError (or FileNotFoundError) naming the problem."""
    if spec.max_attempts < 1:
        raise ValueError(f"maxAttempts must be >= 1, got {spec.max_attempts}")
    if (spec.queue or "default") not in queues:
        raise ValueError(f"Application submitted by user {spec.user or getpass.getuser()} to unknown queue: "
                         f"{spec.queue} (the sandbox's queues: {', '.join(queues)})")
    if not spec.services and not spec.master.script:
        raise ValueError("There must be either at least one service or a script to run on the application master")
    _check_resources("the application master", spec.master.resources, limits)
    _check_files(spec.master.files)
    for name, service in sorted(spec.services.items()):
        where = f"service '{name}'"
        if service.instances < 0:
            raise ValueError(f"{where}: instances must be >= 0, got {service.instances}")
        if service.max_restarts < -1:
            raise ValueError(f"{where}: maxRestarts must be >= -1, got {service.max_restarts}")
        if not service.script:
            raise ValueError(f"{where}: Script must be provided.")
        unknown = sorted(set(service.depends) - set(spec.services))
        if unknown:
            raise ValueError(f"{where} depends on unknown service(s) {unknown}")
        _check_resources(where, service.resources, limits)
        _check_files(service.files)


def _check_resources(where: str, r: proto.Resources, limits: Limits) -> None:
    if r.memory < 1 or r.vcores < 1:
        raise ValueError(f"{where}: resources.memory and resources.vcores must be >= 1, got "
                         f"<memory:{r.memory}, vCores:{r.vcores}>")
    if r.memory > limits.max_memory_mb or r.vcores > limits.max_vcores:
        kind = "memory-mb" if r.memory > limits.max_memory_mb else "vcores"
        raise ValueError(
            f"Invalid resource request for {where}, requested resource type=[{kind}] < 0 or greater than "
            f"maximum allowed allocation. Requested resource=<memory:{r.memory}, vCores:{r.vcores}>, maximum "
            f"allowed allocation=<memory:{limits.max_memory_mb}, vCores:{limits.max_vcores}> (the sandbox's "
            f"max_memory_mb / max_vcores)")


def _check_files(files: Mapping[str, proto.File]) -> None:
    for f in local_files(files):
        path = local_path(f.url)
        if path is not None and not os.path.exists(path):
            raise FileNotFoundError(f"File {f.url} does not exist (for '{f.target}')")


def credentials(master: proto.Master, cert: bytes, key: bytes) -> tuple[bytes, bytes]:
    """The TLS certificate and key of an application: the spec's, else ``cert`` and ``key``
    (the sandbox's)."""
    if not master.HasField("security"):
        return cert, key
    sec = master.security
    return _secret(sec, "cert"), _secret(sec, "key")


def _secret(sec: proto.Security, kind: str) -> bytes:
    which = sec.WhichOneof(kind)
    if which == f"{kind}_bytes":
        return bytes(getattr(sec, which))
    if which == f"{kind}_file":
        path = local_path(local_files({"x": getattr(sec, which)})[0].url)
        if path is None:
            raise ValueError(f"Cannot read security {kind} file from a remote file system")
        with open(path, "rb") as fh:
            return fh.read()
    raise ValueError(f"Must specify either {kind}File or {kind}Bytes")
