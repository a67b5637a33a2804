"""The task's side of its Python worker (``PythonWorker``): starts the process when the task's
per-row functions have shown they are worth it, sends it batches, and turns its answers back
into batches or into the error the operator would have raised on the task thread."""

from __future__ import annotations

import collections
import logging
import multiprocessing
import multiprocessing.forkserver
import pickle
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Callable, Sequence

import pyarrow as pa

from yarnflow.common.errors import YarnflowError
from yarnflow.common.messages import ThreadInfoSample
from yarnflow.worker.operators.base import TaskCancelledError, UserFunctionError
from yarnflow.worker.pyworker import wire
from yarnflow.worker.pyworker.process import serve_forked

__all__ = ["PythonWorker", "PythonWorkerError", "RemoteTraceback", "offloadable"]

log = logging.getLogger(__name__)

#: how often a task waiting for its worker checks whether it was cancelled
_POLL_S = 0.05

#: when each task of this process last ran per-row functions on its own thread (a task's
#: worker starts only while another one does too)
_PER_ROW_AT: dict[int, float] = {}
_CONTENDED_S = 1.0

#: Workers are forked by multiprocessing's fork server, a process of the TaskExecutor's that has
#: imported pyarrow and the operators once (started with the first worker): a worker starts in
#: milliseconds instead of the ~0.3 s of a new interpreter, and shares those pages with the server.
#: (Forking the TaskExecutor itself is not safe: it has threads.)
_FORKS = multiprocessing.get_context("forkserver")
#: (pandas: pyarrow imports it on its first ``pa.array`` of a Python list, ~0.2 s, when installed)
_FORKS.set_forkserver_preload(["yarnflow.worker.pyworker.process", "yarnflow.worker.operators.transforms", "pandas"])


_FORK_SERVER_STARTING = threading.Event()


def _start_fork_server() -> None:
    """Start the fork server (its imports take ~0.3 s) before the first worker is asked for."""
    try:
        multiprocessing.forkserver.ensure_running()
    except (OSError, RuntimeError) as exc:
        log.warning("the Python worker fork server did not start: %s", exc)


class PythonWorkerError(YarnflowError, RuntimeError):
    """A task's Python worker process died (killed, out of memory, a crash in native code)
    while it ran an operator's function. The task fails; the job restarts under its restart
    strategy."""


class RemoteTraceback(Exception):
    """The traceback of an error raised in the Python worker process (set as the error's
    cause, so the job's exception history shows where in the user's code it happened)."""

    def __str__(self) -> str:
        return f"raised in the task's Python worker process:\n{self.args[0] if self.args else ''}"


def offloadable(op: Any) -> bool:
    """``op`` is a stateless per-row operator whose batches its task may send to its worker."""
    return bool(getattr(op, "runs_in_python_worker", False))


def _exit_status(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class PythonWorker:
    """One task's Python worker process. ``chain_file`` is the task's operator chain as the job
    artifact holds it (the worker loads the same operators from it), ``src_dir`` the artifact's
    source folder; ``context`` the RuntimeContext fields the worker's operators get."""

    def __init__(self, chain_file: str, src_dir: str, chain: Sequence[Any], context: dict[str, Any], name: str,
                 cancelled: Callable[[], bool], start_after_s: float) -> None:
        self._index = {id(op): i for i, op in enumerate(chain) if offloadable(op)}
        self._chain_file = chain_file
        self._src_dir = src_dir
        self._context = context
        self._name = name
        self._cancelled = cancelled
        self._start_after_s = start_after_s
        self._spent_s = 0.0
        self._state = "idle"  # -> starting -> ready | failed; any -> closed
        self._proc: Any = None  # a multiprocessing Process
        self._conn: Connection | None = None
        #: the worker's second socket: samples of its thread for flame graphs (any thread asks)
        self._control: Connection | None = None
        self._control_lock = threading.Lock()
        self._control_requests = 0
        self._spawning: threading.Thread | None = None
        #: the operators whose batches were sent and not answered yet, oldest first
        self._pending: collections.deque[Any] = collections.deque()
        self._draining = False
        self._started_at = 0.0
        #: batches the worker ran, in all and per operator (index in the chain)
        self.batches = 0
        self.batches_of: collections.Counter[int] = collections.Counter()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def spent(self, seconds: float) -> None:
        """The task spent ``seconds`` in per-row functions on its own thread: start the worker
        once that adds up to ``python.worker.start-after`` while another task of this process
        runs per-row functions too (they would share its GIL; a task alone in its process
        loses nothing on its own thread and would pay for the copies)."""
        now = time.monotonic()
        self._spent_s += seconds
        _PER_ROW_AT[id(self)] = now
        if self._state != "idle" or self._spent_s < self._start_after_s / 4 or not self._contended(now):
            return
        if self._spent_s >= self._start_after_s:
            self._start()
        elif not _FORK_SERVER_STARTING.is_set():  # a quarter of the way: the fork server starts meanwhile
            _FORK_SERVER_STARTING.set()
            threading.Thread(target=_start_fork_server, name="python worker fork server", daemon=True).start()

    def _contended(self, now: float) -> bool:
        me = id(self)
        return any(at >= now - _CONTENDED_S for key, at in list(_PER_ROW_AT.items()) if key != me)

    def ready(self) -> bool:
        """The worker runs batches now (it has loaded the chain); never blocks."""
        if self._state == "starting":
            self._check_started()
        return self._state == "ready"

    def submit(self, op: Any, batch: pa.RecordBatch) -> None:
        """Send ``batch`` to ``op``'s copy in the worker; what it emits comes out of ``op``'s
        output later, in order: while the worker runs it, the task reads its next input. At most
        one batch waits here once this returns (its answer is taken when the next comes, or at
        ``flush``). Raises what an earlier batch's operator raised (a UserFunctionError, a
        SchemaMismatchError), TaskCancelledError when the task was cancelled meanwhile (the
        worker is killed), or PythonWorkerError when the worker died."""
        conn = self._conn
        assert conn is not None and self._state == "ready"
        try:
            wire.send(conn, (self._index[id(op)], wire.schema_bytes(op.row_schema)), wire.write_batches([batch]))
        except OSError as exc:
            raise self._died(op, exc) from None
        self._pending.append(op)
        self._drain(1)

    def flush(self) -> None:
        """Take every answer still due (before a watermark, a checkpoint barrier or the end of
        input goes on, so that it follows what was sent before it)."""
        if self._pending:
            self._drain(0)

    def emit_ready(self) -> None:
        """Take the answers that have arrived, without waiting (on the task's timer, so a slow
        stream's last batch does not wait for the next one)."""
        try:
            while self._pending and not self._draining and self._conn is not None and self._conn.poll(0):
                self._drain(len(self._pending) - 1)
        except OSError as exc:
            raise self._died(self._pending[0], exc) from None

    def _drain(self, limit: int) -> None:
        """Take answers, oldest first, until at most ``limit`` are due. Emitting one may send a
        later operator's batch (it queues behind: taken by this same loop, so no operator's
        ``process_batch`` is re-entered)."""
        if self._draining:
            return
        self._draining = True
        try:
            while len(self._pending) > limit:
                op = self._pending[0]
                outputs, schema = self._answer(op)
                self._pending.popleft()
                if op.row_schema is None:
                    op.row_schema = schema
                for out in outputs:
                    op.output.collect(out)
        finally:
            self._draining = False

    def _answer(self, op: Any) -> tuple[list[pa.RecordBatch], pa.Schema | None]:
        conn = self._conn
        assert conn is not None
        try:
            while not conn.poll(_POLL_S):
                if self._cancelled():
                    self.kill()
                    raise TaskCancelledError(f"{op.name} was cancelled")
            reply = wire.recv(conn)
            if reply[0] != "ok":
                raise self._remote_error(reply)
            outputs = [b for _ in range(reply[2]) for b in wire.read_batches(conn.recv_bytes())]
        except (EOFError, OSError) as exc:
            raise self._died(op, exc) from None
        self.batches += 1
        self.batches_of[self._index[id(op)]] += 1
        return outputs, wire.schema_of(reply[1])

    def describe(self, op: Any) -> str:
        """What ``op``'s execution path adds: how many of its batches ran in this worker."""
        n = self.batches_of.get(self._index.get(id(op), -1), 0)
        return f"; {n} batches in its task's Python worker" if n else ""

    def kill(self) -> None:
        """Stop the worker now (SIGKILL): a cancelled task, or one whose function never returns."""
        _PER_ROW_AT.pop(id(self), None)
        self._await_spawn()
        if self._proc is not None and self._proc.exitcode is None:
            self._proc.kill()
            self._proc.join()
        self._close_conn()
        self._state = "closed"

    def close(self) -> None:
        """The task ended: the worker exits when its socket closes (killed if it does not
        within a second)."""
        _PER_ROW_AT.pop(id(self), None)
        if self._state == "closed":
            return
        self._await_spawn()
        self._close_conn()
        self._state = "closed"
        if self._proc is not None:
            self._proc.join(timeout=1.0)
            if self._proc.exitcode is None:
                self._proc.kill()
                self._proc.join()
            log.info("%s: its Python worker (pid %d) ran %d batches", self._name, self._proc.pid, self.batches)

    # -- internals ---------------------------------------------------------------------------
    def _start(self) -> None:
        """Fork the worker on a thread of its own (the fork server's first start takes a
        moment): the task goes on meanwhile, on its own thread."""
        self._state = "starting"
        self._started_at = time.monotonic()
        log.info("%s: its per-row functions took %.0f ms on the task thread: starting a Python worker",
                 self._name, self._spent_s * 1000)
        self._spawning = threading.Thread(target=self._spawn, name=f"python worker of {self._name}", daemon=True)
        self._spawning.start()

    def _spawn(self) -> None:
        try:
            ours, theirs = _FORKS.Pipe(duplex=True)
            control, their_control = _FORKS.Pipe(duplex=True)
            proc = _FORKS.Process(target=serve_forked, args=(theirs, their_control),
                                  name=f"python worker of {self._name}", daemon=True)
            proc.start()
            theirs.close()
            their_control.close()
            self._control = control
            wire.send(ours, dict(chain_file=self._chain_file, src_dir=self._src_dir, sys_path=list(sys.path),
                                 indices=sorted(self._index.values()), context=self._context, name=self._name,
                                 log_level=logging.getLogger().getEffectiveLevel()))
        except (OSError, RuntimeError, ValueError) as exc:
            log.warning("%s: cannot start a Python worker (%s): its per-row functions go on on the task thread",
                        self._name, exc)
            self._state = "failed"
            return
        self._proc, self._conn = proc, ours

    def _await_spawn(self) -> None:
        if self._spawning is not None:
            self._spawning.join()
            self._spawning = None

    def _check_started(self) -> None:
        if self._spawning is not None and self._spawning.is_alive():
            return
        self._await_spawn()
        conn = self._conn
        if conn is None:  # it could not be forked (said)
            self._state = "failed"
            return
        try:
            if not conn.poll(0):
                return
            reply = wire.recv(conn)
        except (EOFError, OSError):
            self._proc.join(timeout=1.0)
            reply = ("failed", f"it exited ({_exit_status(self._proc.exitcode)})")
        if reply[0] == "ready":
            self._state = "ready"
            log.info("%s: its Python worker (pid %s) runs its per-row functions (ready %.0f ms after it was asked "
                     "for)", self._name, self.pid, (time.monotonic() - self._started_at) * 1000)
            return
        log.warning("%s: its Python worker could not start: %s; its per-row functions go on on the task thread",
                    self._name, reply[1])
        self.kill()
        self._state = "failed"

    def _died(self, op: Any, exc: BaseException) -> PythonWorkerError:
        code = None
        if self._proc is not None:
            self._proc.join(timeout=1.0)
            if self._proc.exitcode is None:
                self._proc.kill()
            code = self._proc.exitcode
        self._close_conn()
        self._state = "closed"
        return PythonWorkerError(f"the Python worker process (pid {self.pid}) of {self._name} died while operator "
                                 f"'{op.name}' ran its function ({_exit_status(code)}; {type(exc).__name__})")

    @staticmethod
    def _remote_error(reply: tuple[Any, ...]) -> Exception:
        _, blob, type_name, message, tb = reply
        try:
            error = pickle.loads(blob) if blob is not None else None
        except Exception:  # noqa: BLE001 - an exception class the task cannot load: its text will do
            error = None
        if not isinstance(error, Exception):
            error = UserFunctionError(f"{type_name}: {message}")
        error.__cause__ = RemoteTraceback(tb)
        return error

    def _close_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        control, self._control = self._control, None
        if control is not None:
            with self._control_lock:
                control.close()

    def sample(self, num_samples: int, delay_ms: int, max_depth: int) -> list[ThreadInfoSample]:
        """Samples of the worker's thread, where the task's per-row functions run (for the
        task's flame graph; any thread may ask): their stacks under a "python worker (pid N)"
        frame. [] when no worker runs (or it ended meanwhile)."""
        control, pid = self._control, self.pid
        if control is None or self._state != "ready":
            return []
        with self._control_lock:
            self._control_requests += 1
            ident = self._control_requests
            deadline = time.monotonic() + num_samples * max(delay_ms, 1) / 1000 + 10
            try:
                wire.send(control, (ident, num_samples, delay_ms, max_depth))
                while control.poll(max(0.0, deadline - time.monotonic())):
                    answer, found = wire.recv(control)
                    if answer == ident:  # (an answer that came too late for an earlier request is dropped)
                        return [ThreadInfoSample(-1, on_cpu, [f"python worker (pid {pid})", *frames], count)
                                for on_cpu, frames, count in found]
            except (EOFError, OSError, ValueError):
                pass
        return []
