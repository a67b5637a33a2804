"""Render the package common/rpc/services/: per Thrift service of thrift/yarnflow.thrift, a
module (``services/<service>.py``) with a typed client gateway, a handler for the server side and
the service's method table; ``services/__init__.py`` re-exports them all. One module per service
keeps each under the repository's module size as the interface grows.

Called by ``codegen`` on what the Thrift compiler generated; it reads the compiler's
``<method>_args`` / ``<method>_result`` specs, so adding an RPC is an IDL change plus the
component's method (``@rpc`` / ``@fenced`` on an ``RpcEndpoint``):

- the gateway's method is the Thrift method in snake case with the IDL's parameters, typed:
  structs are the ``common.messages`` class of the same name, ``*_id`` strings the typed ids
  of ``common.ids``; it converts them to and from the wire;
- the handler converts the wire values back and calls ``endpoint.rpc_invoke(method, token,
  args)``: the endpoint base checks the fencing token (a first parameter named
  ``*fencing_token`` carries it) and runs the method on the component's main thread;
- ``<SERVICE>_METHODS`` names each method and whether the IDL fences it, so a test can check a
  component declares the same;
- ``<Service>Calls`` is the service's calls as a Protocol, what a caller depends on (the
  gateway implements it, and so can a test's double).
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

from thrift.Thrift import TType

#: string parameters (and results) that carry one of these ids
ID_TYPES = {
    "job_id": "JobID",
    "resource_id": "ResourceID",
    "allocation_id": "AllocationID",
    "execution_attempt_id": "ExecutionAttemptID",
    "vertex_id": "JobVertexID",
}
TOKEN_SUFFIX = "fencing_token"
_SCALARS = {TType.STRING: "str", TType.BOOL: "bool", TType.I32: "int", TType.I64: "int", TType.DOUBLE: "float"}


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def service_key(service: str) -> str:
    """The name a service is multiplexed under: ResourceManagerService -> resourcemanager."""
    return service.removesuffix("Service").lower()


def constant(service: str) -> str:
    """The name of its constant: ResourceManagerService -> RESOURCE_MANAGER."""
    return snake(service.removesuffix("Service")).upper()


class _Value:
    """How one value crosses the wire: its Python type and the two conversions."""

    def __init__(self, name: str, ttype: int, targs: Any, default: Any = None) -> None:
        self.name, self.ttype, self.targs, self.default = name, ttype, targs, default

    def py_type(self, typed_ids: bool) -> str:
        if self.ttype == TType.STRUCT:
            return str(self.targs[0].__name__)
        if self.ttype == TType.LIST:
            return f"list[{_Value('', self.targs[0], self.targs[1]).py_type(typed_ids)}]"
        if self.ttype == TType.MAP:
            k = _Value("", self.targs[0], self.targs[1]).py_type(typed_ids)
            v = _Value("", self.targs[2], self.targs[3]).py_type(typed_ids)
            return f"dict[{k}, {v}]"
        if typed_ids and self.ttype == TType.STRING and self.name in ID_TYPES:
            return ID_TYPES[self.name]
        if self.binary:
            return "bytes"
        return _SCALARS[self.ttype]

    @property
    def binary(self) -> bool:
        """A Thrift ``binary`` (bytes; a ``string`` is text)."""
        return bool(self.ttype == TType.STRING and self.targs == "BINARY")

    def to_wire(self, expr: str) -> str:
        if self.ttype == TType.STRUCT:
            return f"{expr}.to_thrift()"
        if self.ttype == TType.LIST:
            inner = _Value("", self.targs[0], self.targs[1])
            return f"[{inner.to_wire('v')} for v in {expr}]"
        if self.ttype == TType.MAP:
            return f"dict({expr})"
        if self.binary:
            return f"bytes({expr})"
        if self.ttype == TType.STRING:
            return f"str({expr})"
        return expr

    def from_wire(self, expr: str) -> str:
        if self.ttype == TType.STRUCT:
            return f"{self.targs[0].__name__}.from_thrift({expr})"
        if self.ttype == TType.LIST:
            inner = _Value("", self.targs[0], self.targs[1])
            return f"[{inner.from_wire('v')} for v in {expr} or ()]"
        if self.ttype == TType.MAP:
            return f"dict({expr} or {{}})"
        if self.ttype == TType.STRING and self.name in ID_TYPES:
            return f"{ID_TYPES[self.name]}({expr})"
        if self.binary:
            return f"bytes({expr} or b'')"
        if self.ttype in (TType.STRING, TType.BOOL, TType.I32, TType.I64, TType.DOUBLE):
            return f"{_SCALARS[self.ttype]}({expr})"
        return expr


class _Method:
    def __init__(self, module: ModuleType, name: str) -> None:
        self.name = name
        self.py_name = snake(name)
        spec = getattr(module, f"{name}_args").thrift_spec
        self.params = [_Value(f[2], f[1], f[3], f[4]) for f in spec if f is not None]
        # the caller's token is the first parameter (a later one is data: requestSlot hands the
        # TaskExecutor the token its JobMaster will use)
        first = self.params[0] if self.params else None
        self.token = first.name if first is not None and first.name.endswith(TOKEN_SUFFIX) else None
        success = [f for f in getattr(module, f"{name}_result").thrift_spec if f is not None and f[0] == 0]
        self.result = _Value("", success[0][1], success[0][3]) if success else None

    @property
    def args(self) -> list[_Value]:
        return self.params[1:] if self.token else self.params


def _structs(methods: list[_Method]) -> set[str]:
    found: set[str] = set()

    def walk(v: _Value) -> None:
        if v.ttype == TType.STRUCT:
            found.add(v.targs[0].__name__)
        elif v.ttype == TType.LIST:
            walk(_Value("", v.targs[0], v.targs[1]))
        elif v.ttype == TType.MAP:
            walk(_Value("", v.targs[0], v.targs[1]))
            walk(_Value("", v.targs[2], v.targs[3]))

    for m in methods:
        for p in m.params:
            walk(p)
        if m.result is not None:
            walk(m.result)
    return found


def _gateway(service: str, methods: list[_Method]) -> list[str]:
    key = service_key(service)
    out = [
        f"class {service}Gateway:",
        f'    """Calls on a {service} (``{key}`` on its server, or ``service`` when given)."""',
        "",
        f"    SERVICE = {constant(service)}",
        "",
        "    def __init__(self, address: str, timeout_ms: int = 10_000, service: str | None = None,",
        "                 tls: TlsCredentials | None = None) -> None:",
        "        self.address = address",
        f"        self._c = RpcClient(address, service or self.SERVICE, {service}.Client, timeout_ms, tls=tls)",
        "",
    ]
    for m in methods:
        params = ", ".join(_param(p, all(q.default is not None for q in m.params[i:]))
                           for i, p in enumerate(m.params))
        ret = m.result.py_type(False) if m.result is not None else "None"
        wire = ", ".join([f'"{m.name}"'] + [p.to_wire(p.name) for p in m.params] + ["timeout_ms=rpc_timeout_ms"])
        sig = f"    def {m.py_name}(self{', ' if params else ''}{params}, *, rpc_timeout_ms: int | None = None) -> {ret}:"
        out.append(sig)
        if m.result is None:
            out.append(f"        self._c.call({wire})")
        else:
            out.append(f"        return {m.result.from_wire(f'self._c.call({wire})')}")
        out.append("")
    out += ["    def close(self) -> None:", "        self._c.close()", "", ""]
    return out


def _param(p: _Value, with_default: bool) -> str:
    text = f"{p.name}: {'str' if p.ttype == TType.STRING else p.py_type(False)}"
    return f"{text} = {p.default!r}" if with_default else text


def _calls(service: str, methods: list[_Method]) -> list[str]:
    """The service's calls as a Protocol: what a component that calls it depends on (its
    gateway, or a test's double, which need not take ``rpc_timeout_ms``)."""
    out = [f"class {service}Calls(Protocol):", f'    """The calls of a {service}, as its gateway makes them."""', ""]
    for m in methods:
        params = ", ".join(_param(p, all(q.default is not None for q in m.params[i:]))
                           for i, p in enumerate(m.params))
        ret = m.result.py_type(False) if m.result is not None else "None"
        out += [f"    def {m.py_name}(self{', ' if params else ''}{params}) -> {ret}: ...", ""]
    out += ["    def close(self) -> None: ...", "", ""]
    return out


def _handler(service: str, methods: list[_Method]) -> list[str]:
    out = [
        f"class {service}Handler:",
        f'    """The Thrift side of a {service}: wire values in, ``endpoint.rpc_invoke`` on them."""',
        "",
        "    def __init__(self, endpoint: RpcTarget) -> None:",
        "        self._e = endpoint",
        "",
    ]
    for m in methods:
        params = ", ".join(f"{p.name}: Any" for p in m.params)
        args = "".join(f"{a.from_wire(a.name)}, " for a in m.args)
        call = (f'self._e.rpc_invoke("{m.py_name}", {m.token or "None"}, '
                f'read_args("{m.name}", lambda: ({args})))')
        out.append("    @translated")
        out.append(f"    def {m.name}(self{', ' if params else ''}{params}) -> Any:  # noqa: N802 - Thrift's names")
        if m.result is None:
            out.append(f"        {call}")
        else:
            out.append(f"        result = {call}")
            out.append(f"        return {m.result.to_wire('result')}")
        out.append("")
    out += ["    def processor(self) -> Any:", f"        return {service}.Processor(self)", "", ""]
    return out


def _header(doc: str) -> list[str]:
    return [f'"""{doc}"""', "", "from __future__ import annotations", ""]


def render(package: str, modules: dict[str, ModuleType]) -> dict[str, str]:
    """The sources of the services package for the generated service ``modules`` (name ->
    module): {file name under common/rpc/services/: text}."""
    services = {name: [_Method(mod, n) for n in mod.Iface.__dict__ if not n.startswith("_")]
                for name, mod in sorted(modules.items())}
    files: dict[str, str] = {}
    exported: dict[str, list[str]] = {}
    for name, methods in services.items():
        structs = sorted(_structs(methods))
        ids = sorted({ID_TYPES[p.name] for m in methods for p in m.args
                      if p.ttype == TType.STRING and p.name in ID_TYPES})
        lines = _header(f"Gateway (client side), handler (server side) and method table of {name}.")
        lines += ["from typing import TYPE_CHECKING, Any, Protocol", ""]
        if ids:
            lines.append(f"from yarnflow.common.ids import {', '.join(ids)}")
        if structs:
            lines += ["from yarnflow.common.messages import (", *[f"    {s}," for s in structs], ")"]
        lines += [
            "from yarnflow.common.rpc.client import RpcClient",
            "from yarnflow.common.rpc.endpoint import RpcTarget, read_args, translated",
            f"from {package} import {name}",
            "",
            "if TYPE_CHECKING:",
            "    from yarnflow.common.security import TlsCredentials",
            "",
            f'{constant(name)} = "{service_key(name)}"',
            "",
            f"#: {name}'s methods: Python name -> whether the IDL fences it",
            f"{constant(name)}_METHODS = {{",
            *[f'    "{m.py_name}": {m.token is not None},' for m in methods],
            "}",
            "",
            "",
        ]
        lines += _calls(name, methods)
        lines += _gateway(name, methods)
        lines += _handler(name, methods)
        while lines and lines[-1] == "":
            lines.pop()
        module = module_name(name)
        files[f"{module}.py"] = "\n".join(lines) + "\n"
        exported[module] = [constant(name), f"{constant(name)}_METHODS", f"{name}Calls", f"{name}Gateway",
                            f"{name}Handler"]
    init = _header("Gateways (client side) and handlers (server side) of every service in the IDL, one "
                   "module per service.")
    for module, names in exported.items():
        init += [f"from yarnflow.common.rpc.services.{module} import (",
                 *[f"    {n} as {n}," for n in names], ")"]
    files["__init__.py"] = "\n".join(init) + "\n"
    return files


def module_name(service: str) -> str:
    """The module a service's code is rendered into: ResourceManagerService -> resource_manager."""
    return snake(service.removesuffix("Service"))
