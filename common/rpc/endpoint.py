"""Flink's RpcEndpoint and FencedRpcEndpoint: the one way a component is called over RPC.

A component owns its state on one thread, its ``MainThreadExecutor``: other threads hand it
work with ``call`` (and wait for the result) or ``execute`` (fire and forget); timers fire there
too, so the component never needs a lock. A ``call`` made while the main thread has nothing to
do (nothing queued, nothing running) runs on the caller's thread in the main thread's stead:
exactly as if the main thread had run it (one at a time with everything else it runs, after
everything queued before it), without the two thread switches of a hand-over, which cost more
than a whole Thrift call on loopback.

``RpcEndpoint`` is the base of every component served over Thrift. Its methods that a service
of thrift/yarnflow.thrift calls are declared with ``@rpc`` (not fenced) or ``@fenced`` (the call
carries a fencing token, checked here, once, before the method runs); the generated handlers
(common/rpc/services/) call ``rpc_invoke``, which checks the token, runs the method on the
main thread and, when the method answers with a Future (a result that comes later: a job's end,
a savepoint), waits for it on the RPC thread. A refused call raises ``FencingTokenError``; the
handler turns every error into the one typed ``RpcError`` the caller sees (``translated``).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import queue
import threading
import time
from _thread import allocate_lock as _allocate_lock
from collections.abc import Collection
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, TypeVar, overload

from yarnflow.common import logs
from yarnflow.common.clock import TimerHandle
from yarnflow.common.errors import (
    FencingTokenError,
    InvalidRequestError,
    RpcTimeoutError,
    UnavailableError,
    YarnflowError,
)
from yarnflow.common.rpc.errors import to_wire_error

log = logging.getLogger(__name__)
T = TypeVar("T")
_STOP = object()


class _Waiter:
    """A caller waiting for its call's result: a lock it blocks on (cheaper than a Future, which
    is a Condition: the hand-off is the cost of every RPC)."""

    __slots__ = ("done", "result", "error")

    def __init__(self) -> None:
        self.done = _allocate_lock()
        self.done.acquire()
        self.result: Any = None
        self.error: BaseException | None = None


class MainThreadExecutor:
    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._timers: list[tuple[float, int, TimerHandle, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopped = False
        self._lock = threading.Lock()  # orders submissions against stop(): nothing lands after _STOP
        #: held by whoever runs the component now: the main thread, or a caller in its stead
        self._turn = threading.Lock()
        self._owner = 0  # the thread ident holding the turn
        self._queued = 0  # items put (under _lock) ...
        self._ran = 0  # ... and taken off the queue and run (under _turn): equal when nothing waits
        #: the job whose log lines this executor's work writes (``logs.bind_job``), if one
        self.job: str | None = None

    def start(self) -> MainThreadExecutor:
        self._thread.start()
        return self

    @property
    def stopped(self) -> bool:
        return self._stopped

    def in_main_thread(self) -> bool:
        """Whether the calling thread runs as the main thread now (it is, or stands in for it)."""
        return threading.get_ident() == self._owner

    def execute(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            if not self._stopped:
                self._queued += 1
                self._queue.put((fn, args, None))
                return
        log.debug("%s stopped: dropping %s", self.name, getattr(fn, "__name__", fn))

    def call(self, fn: Callable[..., T], *args: Any, timeout: float | None = 30.0) -> T:
        """Run ``fn(*args)`` as the main thread and return its result (or raise its error)."""
        if self.in_main_thread():
            return fn(*args)
        if self._turn.acquire(False):  # idle (or between two items): stand in; busy: queue behind
            try:
                if self._stopped:
                    raise UnavailableError(f"{self.name} is shutting down")
                if self._queued == self._ran:  # nothing queued before this call: run it here
                    return self._stand_in(fn, args)
            finally:
                self._turn.release()
        waiter = _Waiter()
        with self._lock:
            if self._stopped:
                raise UnavailableError(f"{self.name} is shutting down")
            self._queued += 1
            self._queue.put((fn, args, waiter))
        if not waiter.done.acquire(True, -1 if timeout is None else timeout):
            what = getattr(fn, "__name__", fn)
            raise RpcTimeoutError(f"{self.name} did not handle {what} within {timeout}s")
        if waiter.error is not None:
            raise waiter.error
        return waiter.result  # type: ignore[no-any-return]

    def _stand_in(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        """Run ``fn`` on this thread as the main thread (holding the turn)."""
        previous = getattr(logs.bound, "job", None)
        self._owner = threading.get_ident()
        if self.job is not None:
            logs.bind_job(self.job)
        try:
            return fn(*args)
        finally:
            self._owner = 0
            logs.bound.job = previous

    def schedule(self, delay_ms: int, fn: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle()
        with self._lock:
            if not self._stopped:
                self._queued += 1
                self._queue.put((self._add_timer, (time.monotonic() + delay_ms / 1000.0, handle, fn), None))
        return handle

    def _add_timer(self, due: float, handle: TimerHandle, fn: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (due, next(self._seq), handle, fn))

    def stop(self, timeout: float = 5.0) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._queue.put(_STOP)
        if not self.in_main_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        timers, get, turn, me = self._timers, self._queue.get, self._turn, threading.get_ident()
        item: Any = None
        while True:
            with turn:
                self._owner = me
                if item is not None:
                    self._ran += 1
                    self._safely(*item)
                    item = None
                now = time.monotonic()
                while timers and timers[0][0] <= now:
                    _, _, handle, fn = heapq.heappop(timers)
                    if not handle.cancelled:
                        self._safely(fn, (), None)
                wait = max(0.0, timers[0][0] - time.monotonic()) if timers else None
                self._owner = 0
            try:
                item = get(timeout=wait)
            except queue.Empty:
                continue
            if item is _STOP:
                with turn:
                    self._drain()
                return

    def _drain(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP and item[2] is not None:
                item[2].error = UnavailableError(f"{self.name} is shutting down")
                item[2].done.release()

    def _safely(self, fn: Callable[..., Any], args: tuple[Any, ...], waiter: _Waiter | None) -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - the main thread must survive anything
            if waiter is not None:
                waiter.error = exc
                waiter.done.release()
            else:
                log.exception("%s: unhandled error in %s", self.name, getattr(fn, "__name__", fn))
            return
        if waiter is not None:
            waiter.result = result
            waiter.done.release()


def settle(future: Future[Any], outcome: Any) -> None:
    """Complete ``future`` with ``outcome``: an error, another (done) Future's outcome, or a
    value; a future already settled stays as it is (whoever settled it first wins)."""
    if future.done():
        return
    try:
        if isinstance(outcome, Future):
            error = outcome.exception()
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(outcome.result())
        elif isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except InvalidStateError:
        pass  # settled meanwhile on another thread


# ---- the endpoint -----------------------------------------------------------------------------

class _Unfenced:
    def __repr__(self) -> str:
        return "UNFENCED"


#: what a ``token_of`` answers for a call that needs no token (e.g. it names a job unknown here)
UNFENCED: Any = _Unfenced()
#: what ``token_of`` may answer: the one token the call must carry, any of several, None (no token
#: is valid now: the call is refused), or UNFENCED
Expected = str | Collection[str] | None


@dataclass(frozen=True)
class RpcSpec:
    fenced: bool
    token_of: Callable[..., Expected] | None = None  # (endpoint, *args) -> the token expected


F = TypeVar("F", bound=Callable[..., Any])


def rpc(fn: F) -> F:
    """Declares an RPC method that is not fenced."""
    fn.__rpc__ = RpcSpec(fenced=False)  # type: ignore[attr-defined]
    return fn


def fenced(token_of: Callable[..., Expected] | None = None) -> Callable[[F], F]:
    """Declares a fenced RPC method: its caller's token must be ``endpoint.fencing_token``, or
    what ``token_of(endpoint, *args)`` answers (run on the main thread, before the method)."""

    def mark(fn: F) -> F:
        fn.__rpc__ = RpcSpec(fenced=True, token_of=token_of)  # type: ignore[attr-defined]
        return fn

    return mark


class RpcTarget(Protocol):
    def rpc_invoke(self, method: str, token: str | None, args: tuple[Any, ...]) -> Any: ...


#: what converting a call's wire values raises when the frame left one out or gave it another shape
MALFORMED = (TypeError, ValueError, AttributeError, KeyError, IndexError)


def malformed(method: str, exc: BaseException) -> YarnflowError:
    """The error a call with arguments that cannot be read gets (not a server failure); one of
    ours (a JobGraph's own validation) as it is."""
    if isinstance(exc, YarnflowError):
        return exc
    return InvalidRequestError(f"malformed arguments of {method}: {exc}")


def read_args(method: str, convert: Callable[[], tuple[Any, ...]]) -> tuple[Any, ...]:
    """A handler's arguments, converted from the wire by ``convert``: a frame without an
    argument, or with one of another shape, is the caller's error (``malformed``), not ours."""
    try:
        return convert()
    except MALFORMED as exc:
        raise malformed(method, exc) from None


def translated(fn: F) -> F:
    """A handler method: any error becomes the typed ``RpcError`` its caller sees."""

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        try:
            return fn(*args)
        except YarnflowError as exc:
            log.debug("%s refused: %s", fn.__name__, exc)
            raise to_wire_error(exc) from None
        except Exception as exc:  # an unexpected error: still answer, with its traceback
            log.exception("handler %s failed", fn.__name__)
            raise to_wire_error(exc) from None

    return wrapper  # type: ignore[return-value]


class RpcEndpoint:
    """A component called over RPC. ``main_thread`` runs every call (None: the caller's
    thread, for a component that guards its own state); ``fencing_token`` is what fenced
    calls carry unless a method's ``token_of`` says otherwise (Flink's FencedRpcEndpoint)."""

    fencing_token: str = ""
    #: how long an RPC waits for a result the method answered as a Future (None: as long as it takes)
    rpc_result_timeout_s: float | None = None

    def __init__(self, name: str, main_thread: MainThreadExecutor | None) -> None:
        self.endpoint_name = name
        self.main_thread = main_thread

    def rpc_invoke(self, method: str, token: str | None, args: tuple[Any, ...]) -> Any:
        fn = getattr(self, method, None)
        spec: RpcSpec | None = getattr(fn, "__rpc__", None)
        if fn is None or spec is None:
            raise UnavailableError(f"{self.endpoint_name} does not serve {method}")
        if spec.fenced != (token is not None):
            raise UnavailableError(f"{self.endpoint_name}.{method} is {'' if spec.fenced else 'not '}fenced, "
                                   "the service says otherwise")

        def run() -> Any:
            if spec.fenced:
                self._fence(method, spec, token, args)
            return fn(*args)

        result = run() if self.main_thread is None else self.main_thread.call(run)
        if isinstance(result, Future):
            try:
                return result.result(self.rpc_result_timeout_s)
            except FutureTimeoutError:
                if result.done():
                    raise
                raise RpcTimeoutError(f"{self.endpoint_name}.{method} had no result within "
                                      f"{self.rpc_result_timeout_s}s") from None
        return result

    @overload
    def ask(self, fn: Callable[..., Future[T]], *args: Any,
            timeout: float | None = 60.0) -> T: ...

    @overload
    def ask(self, fn: Callable[..., T], *args: Any, timeout: float | None = 60.0) -> T: ...

    def ask(self, fn: Callable[..., Any], *args: Any, timeout: float | None = 60.0) -> Any:
        """Call one of this endpoint's methods from another thread of this process as an RPC
        would, without the wire and unfenced: on the main thread, a Future answer waited for
        (up to ``timeout`` seconds, also the longest wait for the main thread). How the
        AppMaster's own parts (REST, the per-job runner, the metrics) call its components."""
        main = self.main_thread
        if main is None:
            result = fn(*args)
        elif main.in_main_thread():
            result = fn(*args)
            if isinstance(result, Future) and not result.done():
                raise RuntimeError(f"{self.endpoint_name}: ask() on the main thread would wait for itself")
        else:
            result = main.call(fn, *args, timeout=timeout)
        if isinstance(result, Future):
            try:
                return result.result(timeout)
            except FutureTimeoutError:
                if result.done():
                    raise
                raise RpcTimeoutError(f"{self.endpoint_name}: no answer from {getattr(fn, '__name__', fn)} "
                                      f"within {timeout}s") from None
        return result

    def _fence(self, method: str, spec: RpcSpec, token: str | None, args: tuple[Any, ...]) -> None:
        expected: Any = self.fencing_token if spec.token_of is None else spec.token_of(self, *args)
        if expected is UNFENCED:
            return
        if expected is None:
            raise FencingTokenError(f"{self.endpoint_name}: {method} refused: no fencing token (here {token!r}) "
                                    "is valid for it")
        if token == expected if isinstance(expected, str) else token in expected:
            return
        raise FencingTokenError(f"{self.endpoint_name}: {method} with a stale fencing token {token!r}")

    @classmethod
    def undeclared(cls, methods: Mapping[str, bool]) -> list[str]:
        """The methods of a service (name -> fenced, as in common/rpc/services/) that this class does not
        declare as the IDL does: missing, not marked, or fenced where the IDL is not (or the
        reverse)."""
        wrong = []
        for name, is_fenced in methods.items():
            spec = getattr(getattr(cls, name, None), "__rpc__", None)
            if spec is None or spec.fenced != is_fenced:
                wrong.append(name)
        return wrong
