"""What the tasks' threads are doing, over REST (issue 32): a TaskExecutor's thread dump
(``/taskmanagers/:id/thread-dump``) and a vertex's flame graph
(``/jobs/:jid/vertices/:vid/flamegraph``), as Flink serves them.

A flame graph is built from samples of the stacks of the vertex's running subtasks' threads,
taken by the TaskExecutors that run them (``requestThreadInfoSamples``: ``rest.flamegraph.
num-samples`` samples, ``delay-between-samples`` apart, each cut to ``stack-depth`` frames).
As Flink's JobVertexThreadInfoTracker: the first request starts the sampling and answers
"waiting" (``endTimestamp`` -3); later ones answer the latest samples, and start fresh ones
once those are older than ``rest.flamegraph.refresh-interval``; samples nobody asked for within
``rest.flamegraph.cleanup-interval`` are dropped. ``endTimestamp`` -1: the vertex has no running
subtask; -2: flame graphs are off (``rest.flamegraph.enabled``). ``type`` FULL / ON_CPU /
OFF_CPU keeps every sample / those of a thread on the CPU / the others (how a Python thread is
judged on the CPU: ``common/thread_info.py``)."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

from flask import Response, jsonify, request

from yarnflow.am.rest.api_error import ApiError
from yarnflow.common.config import Options
from yarnflow.common.errors import RpcError
from yarnflow.common.ids import JobID, JobVertexID
from yarnflow.common.messages import ThreadInfoSample
from yarnflow.common.rpc.gateways import RemoteTaskExecutorGateway
from yarnflow.common.states import ExecutionState
from yarnflow.common.thread_info import stringified

if TYPE_CHECKING:
    from yarnflow.am.rest.server import RestServer

log = logging.getLogger(__name__)

TERMINATED, DISABLED, WAITING = -1, -2, -3
TYPES = ("FULL", "ON_CPU", "OFF_CPU")


def flame_graph(samples: list[ThreadInfoSample], kind: str = "FULL") -> dict[str, Any]:
    """Flink's VertexFlameGraph node tree (``name``, ``value``, ``children``) of ``samples``:
    ``root`` counts every sample kept, each child the samples whose stacks pass through it."""
    root: dict[str, Any] = {"name": "root", "value": 0, "children": {}}
    for s in samples:
        if kind == "ON_CPU" and not s.on_cpu or kind == "OFF_CPU" and s.on_cpu:
            continue
        root["value"] += s.count
        node = root
        for name in s.frames:
            node = node["children"].setdefault(name, {"name": name, "value": 0, "children": {}})
            node["value"] += s.count

    def listed(node: dict[str, Any]) -> dict[str, Any]:
        children = sorted(node["children"].values(), key=lambda c: (-c["value"], c["name"]))
        return {"name": node["name"], "value": node["value"], "children": [listed(c) for c in children]}

    return listed(root)


class _Entry:
    """The latest samples of one (job, vertex, subtask or all) and whether fresh ones are coming."""

    def __init__(self) -> None:
        self.samples: list[ThreadInfoSample] | None = None
        self.end_ms = 0
        self.sampled_at = 0.0  # monotonic; when the latest sampling ended
        self.asked_at = time.monotonic()
        self.running = False


class ThreadInfoApi:
    """The handlers; ``routes()`` lists them for the REST server."""

    def __init__(self, rest: RestServer) -> None:
        self._r = rest
        self._config = rest.configuration
        self._entries: dict[tuple[str, str, int], _Entry] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="rest-thread-samples")

    def routes(self) -> list[tuple[str, Callable[..., Any], tuple[str, ...]]]:
        return [("/taskmanagers/<tmid>/thread-dump", self.task_manager_thread_dump, ("GET",)),
                ("/jobs/<jobid>/vertices/<vertexid>/flamegraph", self.flame_graph, ("GET",))]

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _gateway(self, address: str, timeout_ms: int) -> RemoteTaskExecutorGateway:
        return RemoteTaskExecutorGateway(address, timeout_ms, tls=self._r.appmaster.tls)

    # -- a TaskExecutor's thread dump ----------------------------------------------------------------
    def task_manager_thread_dump(self, tmid: str) -> Response:
        """Flink's ThreadDumpInfo of a TaskExecutor, asked of it over RPC."""
        found = [tm for tm in self._r.task_executors() if tm["id"] == tmid]
        if not found:
            raise ApiError(404, f"no TaskExecutor {tmid[:100]} is registered")
        gateway = self._gateway(found[0]["path"], self._config[Options.RPC_TIMEOUT])
        try:
            infos = gateway.request_thread_dump()
        except RpcError as exc:
            raise ApiError(503, f"TaskExecutor {tmid} did not answer: {exc}") from None
        finally:
            gateway.close()
        return jsonify(threadInfos=[{"threadName": i.name, "stringifiedThreadInfo": stringified(i)} for i in infos])

    # -- a vertex's flame graph ------------------------------------------------------------------------
    def flame_graph(self, jobid: str, vertexid: str) -> Response:
        kind = request.args.get("type", "FULL")
        if kind not in TYPES:
            raise ApiError(400, f"type must be one of {', '.join(TYPES)}, not {kind[:40]!r}")
        raw = request.args.get("subtaskindex")
        info, v = self._r.vertex_status(jobid, vertexid)
        subtask = -1
        if raw is not None:
            if not raw.isascii() or not raw.isdigit() or len(raw) > 9:
                raise ApiError(400, f"subtaskindex {raw[:40]!r} is not a subtask index (a non-negative integer)")
            subtask = int(raw)
            if subtask >= v.parallelism:
                raise ApiError(404, f"vertex {vertexid} has {v.parallelism} subtasks: no subtask {subtask}")
        if not self._config[Options.FLAMEGRAPH_ENABLED]:
            return jsonify(endTimestamp=DISABLED)
        running = {i: where for i, (state, where) in enumerate(zip(v.subtask_states, v.subtask_locations))
                   if state == ExecutionState.RUNNING and where and subtask in (-1, i)}
        key = (jobid.lower(), vertexid.lower(), subtask)
        now = time.monotonic()
        with self._lock:
            self._forget(now)
            if not running:  # (Flink: a vertex whose tasks ended has no flame graph)
                self._entries.pop(key, None)
                return jsonify(endTimestamp=TERMINATED)
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry()
            entry.asked_at = now
            stale = now - entry.sampled_at > self._config[Options.FLAMEGRAPH_REFRESH] / 1000
            if not entry.running and (entry.samples is None or stale):
                entry.running = True
                self._pool.submit(self._sample, entry, info.job_id, v.vertex_id, running)
            if entry.samples is None:
                return jsonify(endTimestamp=WAITING)
            samples, end_ms = entry.samples, entry.end_ms
        return jsonify(endTimestamp=end_ms, data=flame_graph(samples, kind))

    def _forget(self, now: float) -> None:
        """Drop samples nobody asked for within the cleanup interval (under the lock)."""
        horizon = self._config[Options.FLAMEGRAPH_CLEANUP] / 1000
        for key in [k for k, e in self._entries.items() if not e.running and now - e.asked_at > horizon]:
            del self._entries[key]

    def _sample(self, entry: _Entry, job_id: JobID, vertex_id: JobVertexID, running: dict[int, str]) -> None:
        """(a pool thread) Ask each TaskExecutor running some of the subtasks for their samples."""
        samples: list[ThreadInfoSample] = []
        try:
            addresses = {tm["id"]: tm["path"] for tm in self._r.task_executors()}
            by_place: dict[str, list[int]] = {}
            for index, where in running.items():
                by_place.setdefault(where, []).append(index)
            num, delay = self._config[Options.FLAMEGRAPH_NUM_SAMPLES], self._config[Options.FLAMEGRAPH_DELAY]
            depth = self._config[Options.FLAMEGRAPH_STACK_DEPTH]
            timeout_ms = num * delay + self._config[Options.RPC_TIMEOUT]

            def ask(place: str, indexes: list[int]) -> list[ThreadInfoSample]:
                if place not in addresses:
                    return []
                gateway = self._gateway(addresses[place], timeout_ms)
                try:
                    return gateway.request_thread_info_samples(str(job_id), str(vertex_id), sorted(indexes), num,
                                                               delay, depth)
                except RpcError as exc:
                    log.warning("flame graph: TaskExecutor %s gave no thread samples: %s", place, exc)
                    return []
                finally:
                    gateway.close()

            with ThreadPoolExecutor(max(1, len(by_place)), thread_name_prefix="rest-thread-samples-te") as asking:
                for found in asking.map(lambda item: ask(*item), by_place.items()):
                    samples.extend(found)
        except Exception:  # noqa: BLE001 - the next request tries again
            log.exception("flame graph sampling of vertex %s failed", vertex_id)
        finally:
            with self._lock:
                entry.samples, entry.end_ms = samples, int(time.time() * 1000)
                entry.sampled_at, entry.running = time.monotonic(), False
