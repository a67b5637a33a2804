"""The main-thread model of Flink's RpcEndpoint: a component owns its state on one thread.

Thrift handler threads hand their calls to that thread with ``call`` (and wait for the result)
or ``execute`` (fire and forget); timers fire there too, so the component never needs a lock.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any, Callable, TypeVar

from yarnflow.common.clock import TimerHandle
from yarnflow.common.errors import RpcTimeoutError, UnavailableError

log = logging.getLogger(__name__)
T = TypeVar("T")
_STOP = object()


class MainThreadExecutor:
    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.Queue[Any] = queue.Queue()
        self._timers: list[tuple[float, int, TimerHandle, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopped = False
        self._lock = threading.Lock()  # orders submissions against stop(): nothing lands after _STOP

    def start(self) -> MainThreadExecutor:
        self._thread.start()
        return self

    def in_main_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def execute(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            if not self._stopped:
                self._queue.put((fn, args, None))
                return
        log.debug("%s stopped: dropping %s", self.name, getattr(fn, "__name__", fn))

    def call(self, fn: Callable[..., T], *args: Any, timeout: float | None = 30.0) -> T:
        """Run ``fn(*args)`` on the main thread and return its result (or raise its error)."""
        if self.in_main_thread():
            return fn(*args)
        future: Future[T] = Future()
        with self._lock:
            if self._stopped:
                raise UnavailableError(f"{self.name} is shutting down")
            self._queue.put((fn, args, future))
        try:
            return future.result(timeout)
        except FutureTimeoutError:
            if future.done():  # fn itself raised a TimeoutError: that is its result
                raise
            what = getattr(fn, "__name__", fn)
            raise RpcTimeoutError(f"{self.name} did not handle {what} within {timeout}s") from None

    def schedule(self, delay_ms: int, fn: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle()
        with self._lock:
            if not self._stopped:
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
        while True:
            wait = None
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                _, _, handle, fn = heapq.heappop(self._timers)
                if not handle.cancelled:
                    self._safely(fn, (), None)
            if self._timers:
                wait = max(0.0, self._timers[0][0] - time.monotonic())
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                continue
            if item is _STOP:
                self._drain()
                return
            self._safely(*item)

    def _drain(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP and item[2] is not None:
                item[2].set_exception(UnavailableError(f"{self.name} is shutting down"))

    def _safely(self, fn: Callable[..., Any], args: tuple[Any, ...], future: Future[Any] | None) -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - the main thread must survive anything
            if future is not None:
                future.set_exception(exc)
            else:
                log.exception("%s: unhandled error in %s", self.name, getattr(fn, "__name__", fn))
            return
        if future is not None:
            future.set_result(result)
