"""The Python worker process's side (forked by the fork server, ``handle.py``): load the
task's operators from the job artifact, then run each batch the task sends through the named
operator and send back what it emitted, or the error it raised."""

from __future__ import annotations

import ctypes
import logging
import os
import pickle
import queue
import signal
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import pyarrow as pa

from yarnflow.common.config import Options
from yarnflow.common.thread_info import sample
from yarnflow.worker.elements import Watermark
from yarnflow.worker.operators.base import RuntimeContext
from yarnflow.worker.pyworker import wire

__all__ = ["serve", "serve_forked"]

log = logging.getLogger("yarnflow.worker.pyworker")

_PR_SET_PDEATHSIG = 1


class _Collected:
    """The worker's operators' output: the batches of the current request."""

    def __init__(self) -> None:
        self.batches: list[pa.RecordBatch] = []

    def collect(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self.batches.append(batch)

    def collect_side(self, tag: str, batch: pa.RecordBatch) -> None:
        raise RuntimeError("a per-row operator in a Python worker emitted a side output")

    def emit_watermark(self, watermark: Watermark) -> None:
        pass  # watermarks stay with the task


def _die_with_parent() -> None:
    """SIGKILL when the TaskExecutor that started the worker dies (Linux); elsewhere the worker
    still exits when its socket closes."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _load(init: dict[str, Any], out: _Collected) -> dict[int, Any]:
    for entry in [init["src_dir"], *init["sys_path"]]:
        if entry and entry not in sys.path:
            sys.path.append(entry)
    with open(init["chain_file"], "rb") as fh:
        chain = cloudpickle.load(fh)
    context = dict(init["context"])
    # the task tried Arrow compute already: what comes here runs per row
    context["config"] = {**context.get("config", {}), Options.PYTHON_VECTORIZE.key: "false"}
    ops = {}
    for index in init["indices"]:
        op = chain[index]
        op.setup(RuntimeContext(**context), out)
        op.open()
        ops[index] = op
    return ops


def _error_reply(exc: BaseException) -> tuple[Any, ...]:
    blob: bytes | None
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)
    except Exception:  # noqa: BLE001 - not picklable (or not unpicklable): the text goes instead
        blob = None
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    tb = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
    return ("error", blob, type(exc).__name__, str(exc), tb)


def serve(conn: Connection) -> int:
    init = wire.recv(conn)
    logging.basicConfig(level=init.get("log_level", logging.INFO), stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s [python worker {os.getpid()} of {init['name']}] %(message)s")
    out = _Collected()
    try:
        ops = _load(init, out)
    except Exception as exc:  # noqa: BLE001 - the task goes on without a worker, and says why
        wire.send(conn, ("failed", f"{type(exc).__name__}: {exc}"))
        return 1
    wire.send(conn, ("ready", os.getpid()))
    requests: queue.SimpleQueue[tuple[int, bytes | None, bytes] | None] = queue.SimpleQueue()
    # a thread of its own reads the requests: the task sends its next batch while this one's
    # answer is still being sent, and neither may wait for the other
    threading.Thread(target=_read_requests, args=(conn, requests), name="requests", daemon=True).start()
    while True:
        request = requests.get()
        if request is None:
            return 0  # the task ended (or its TaskExecutor died)
        index, schema, payload = request
        op = ops[index]
        if schema is not None:
            op.row_schema = wire.schema_of(schema)
        out.batches = []
        try:
            for batch in wire.read_batches(payload):
                op.process_batch(batch)
        except Exception as exc:  # noqa: BLE001 - raised again by the task, as the operator raised it
            reply: tuple[Any, ...] = _error_reply(exc)
        else:
            reply = ("ok", wire.schema_bytes(op.row_schema), len(out.batches))
        try:
            wire.send(conn, reply)
            for batch in out.batches if reply[0] == "ok" else ():
                conn.send_bytes(memoryview(wire.write_batches([batch])))
        except OSError:
            return 0  # the task ended while this batch ran (it was cancelled or failed)


def _read_requests(conn: Connection, requests: queue.SimpleQueue[tuple[int, bytes | None, bytes] | None]) -> None:
    try:
        while True:
            index, schema = wire.recv(conn)
            requests.put((index, schema, conn.recv_bytes()))
    except (EOFError, OSError):
        requests.put(None)


def _serve_control(control: Connection, main: threading.Thread) -> None:
    """Answer the task's requests for samples of this worker's main thread, where its per-row
    functions run (the task's flame graph): ``(request id, samples, delay ms, depth)`` ->
    ``(request id, [(on CPU, frames, count)])``."""
    try:
        while True:
            ident, num, delay_ms, depth = wire.recv(control)
            found = sample({0: main}, num, delay_ms, depth)
            wire.send(control, (ident, [(s.on_cpu, s.frames, s.count) for s in found]))
    except (EOFError, OSError):
        return


def serve_forked(conn: Connection, control: Connection | None = None) -> None:
    """The worker's body in the process the fork server made for it."""
    _die_with_parent()
    if control is not None:
        threading.Thread(target=_serve_control, args=(control, threading.current_thread()), name="control",
                         daemon=True).start()
    try:
        code = serve(conn)
    finally:
        conn.close()
    sys.exit(code)
