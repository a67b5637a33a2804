"""Translation between the project's exceptions and what crosses the wire, in one place."""

from __future__ import annotations

import socket
import traceback

from thrift.Thrift import TApplicationException
from thrift.transport.TTransport import TTransportException

from yarnflow.common import errors
from yarnflow.common.rpc.gen.yarnflow_rpc import ttypes

_KIND_TO_ERROR: dict[int, type[errors.RpcError]] = {
    ttypes.ErrorKind.INTERNAL: errors.RpcError,
    ttypes.ErrorKind.FENCING: errors.FencingTokenError,
    ttypes.ErrorKind.NOT_FOUND: errors.NotFoundError,
    ttypes.ErrorKind.INVALID: errors.InvalidRequestError,
    ttypes.ErrorKind.UNAVAILABLE: errors.UnavailableError,
    ttypes.ErrorKind.REFUSED: errors.RefusedError,
    ttypes.ErrorKind.NOT_LEADER: errors.NotLeaderRpcError,
}
_ERROR_TO_KIND = {v: k for k, v in _KIND_TO_ERROR.items()}


def to_wire_error(exc: BaseException) -> ttypes.RpcError:
    """The ``RpcError`` a handler raises to its caller for ``exc``."""
    kind = ttypes.ErrorKind.INTERNAL
    for cls in type(exc).__mro__:
        if cls in _ERROR_TO_KIND:
            kind = _ERROR_TO_KIND[cls]
            break
    else:
        if isinstance(exc, (errors.ConfigurationError, errors.JobDefinitionError)):
            kind = ttypes.ErrorKind.INVALID
    if exc.__traceback__ is not None:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    else:  # made to be sent (``raise to_wire_error(NotFoundError(...))``): where it was made
        tb = ("Traceback (most recent call last):\n" + "".join(traceback.format_stack()[:-1])
              + "".join(traceback.format_exception_only(type(exc), exc)))
    return ttypes.RpcError(kind=kind, message=f"{type(exc).__name__}: {exc}" if kind == 0 else str(exc),
                           remote_traceback=tb)


#: errors a remote handler raised that reach the caller as themselves, not as an RpcError: they
#: say what is wrong with the user's job (an input path that does not exist), not with the call
_PASSED_THROUGH: dict[str, type[errors.YarnflowError]] = {"SourceReadError": errors.SourceReadError}


def from_wire_error(exc: BaseException, address: str) -> errors.YarnflowError:
    """The project's exception for anything a Thrift call raised."""
    if isinstance(exc, ttypes.RpcError):
        name, _, text = (exc.message or "").partition(": ")
        if exc.kind == ttypes.ErrorKind.INTERNAL and name in _PASSED_THROUGH and text:
            return _PASSED_THROUGH[name](text)
        cls = _KIND_TO_ERROR.get(exc.kind, errors.RpcError)
        return cls(exc.message or "remote error", exc.remote_traceback)
    if isinstance(exc, TTransportException):
        if isinstance(exc.inner, socket.timeout) or "timed out" in str(exc):
            return errors.RpcTimeoutError(f"{address} did not answer in time")
        return errors.RpcConnectionError(f"cannot reach {address}: {exc.message or exc}")
    if isinstance(exc, socket.timeout):
        return errors.RpcTimeoutError(f"{address} did not answer in time")
    if isinstance(exc, OSError):
        return errors.RpcConnectionError(f"cannot reach {address}: {exc}")
    if isinstance(exc, TApplicationException):
        return errors.RpcError(f"{address} failed to handle the call: {exc.message}")
    return errors.RpcError(f"call to {address} failed: {type(exc).__name__}: {exc}")
