"""A TaskExecutor's task metrics (Flink's TaskIOMetricGroup and its meters).

The counters live where the records cross a task's boundaries, so the per-row code never sees
them: the ``StreamTask`` counts records (and bytes) taken from its input gate and the records
each operator of the chain hands on (``ChainOutput``), each ``RecordWriter`` counts the bytes it
sends and the time it waited for room in a full subpartition (back-pressure), and the
``InputGate`` the time its task waited for input (idle). A ``TaskMetricGroup`` reads them
when asked (a JobMaster heartbeat, a Prometheus scrape) and derives the rates from the samples
it took over the last ``RATE_WINDOW_S`` seconds (Flink's MeterView), so no thread of its own is
needed: busy time is what is left of each second after idle and back-pressured time.
"""

from __future__ import annotations

import collections
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from yarnflow.common.messages import NO_WATERMARK, TaskMetrics
from yarnflow.worker.operators.base import Gauge

if TYPE_CHECKING:
    from yarnflow.worker.runtime.stream_task import StreamTask

#: rates are averaged over about this many seconds
RATE_WINDOW_S = 5.0


@dataclass(frozen=True)
class _Sample:
    at: float
    records_in: int
    records_out: int
    bytes_in: int
    bytes_out: int
    idle_ns: int
    backpressured_ns: int
    operators_in: tuple[int, ...] = ()
    operators_out: tuple[int, ...] = ()
    input_watermark: int = NO_WATERMARK
    output_watermark: int = NO_WATERMARK
    late_records_dropped: int = 0


class TaskMetricGroup:
    """One subtask attempt's figures, read from its StreamTask."""

    def __init__(self, task_name: str, subtask_index: int, job_id: str, operator_names: Iterable[str],
                 clock: Any = time.monotonic, job_name: str = "", attempt: int = 0) -> None:
        self.task_name = task_name
        self.subtask_index = subtask_index
        self.job_id = job_id
        self.job_name = job_name
        self.attempt = attempt
        self.operator_names = list(operator_names)
        self._clock = clock
        self._task: StreamTask | None = None
        self._attached_at = 0.0
        self._samples: collections.deque[_Sample] = collections.deque()
        self._lock = threading.Lock()
        #: per operator of the chain, as of the last ``snapshot``
        self.operator_rates_in: list[float] = []
        self.operator_rates_out: list[float] = []
        #: ``(budget, used, peak)`` bytes of the task's managed memory, and the bytes it spilled
        self.managed_memory: Callable[[], tuple[int, int, int]] = lambda: (0, 0, 0)
        self.spilled_bytes: Callable[[], int] = lambda: 0

    def attach(self, task: StreamTask) -> None:
        """The task's StreamTask was built: its counters are read from now on."""
        self._task = task
        self._attached_at = self._clock()

    def _sample(self) -> _Sample:
        st = self._task
        now = self._clock()
        if st is None:
            return _Sample(now, 0, 0, 0, 0, 0, 0)
        gate = st.gate
        operators_in, operators_out = st.operator_records()
        idle_ns = gate.idle_ns if gate is not None else getattr(st.chain[0], "idle_ns", 0) if st.chain else 0  # a source: its pauses
        return _Sample(now, st.records_in, st.tail.records_out, st.bytes_in,
                       sum(w.bytes_out for w in st.writers), idle_ns,
                       sum(w.backpressured_ns for w in st.writers), tuple(operators_in), tuple(operators_out),
                       getattr(st, "input_watermark", NO_WATERMARK), getattr(st.tail, "watermark", NO_WATERMARK),
                       sum(getattr(op, "late_records_dropped", 0) for op in getattr(st, "chain", ())))

    def snapshot(self) -> TaskMetrics:
        """The totals so far and the rates over the last ``RATE_WINDOW_S`` seconds (since the
        first sample when younger). Safe from any thread."""
        with self._lock:
            now = self._sample()
            samples = self._samples
            while len(samples) > 1 and now.at - samples[1].at >= RATE_WINDOW_S:
                samples.popleft()
            first = samples[0] if samples else now
            samples.append(now)
        span = now.at - first.at

        def rate(a: int, b: int) -> float:
            return (b - a) / span if span > 0 else 0.0

        def rates(a: tuple[int, ...], b: tuple[int, ...]) -> list[float]:
            if not a:  # sampled before the task's operators existed: they had counted nothing
                a = (0,) * len(b)
            return [rate(x, y) for x, y in zip(a, b)] if len(a) == len(b) else [0.0] * len(b)

        self.operator_rates_in = rates(first.operators_in, now.operators_in)
        self.operator_rates_out = rates(first.operators_out, now.operators_out)

        idle = min(1000.0, rate(first.idle_ns, now.idle_ns) / 1e6)
        backpressured = min(1000.0 - idle, rate(first.backpressured_ns, now.backpressured_ns) / 1e6)
        busy = max(0.0, 1000.0 - idle - backpressured) if span > 0 else 0.0
        managed, used, peak = self.managed_memory()
        idle_total, bp_total = now.idle_ns // 1_000_000, now.backpressured_ns // 1_000_000
        alive_ms = int((now.at - self._attached_at) * 1000) if self._task is not None else 0
        return TaskMetrics(now.records_in, now.records_out, now.bytes_in, now.bytes_out,
                           rate(first.records_in, now.records_in), rate(first.records_out, now.records_out),
                           rate(first.bytes_in, now.bytes_in), rate(first.bytes_out, now.bytes_out),
                           round(busy, 1), round(backpressured, 1), round(idle, 1),
                           list(now.operators_in), list(now.operators_out),
                           managed, used, peak, self.spilled_bytes(), self._inflight_peak(),
                           self._task.operator_paths() if self._task is not None else [],
                           [w.bytes_out for w in self._task.writers] if self._task is not None else [],
                           now.input_watermark, now.output_watermark, now.late_records_dropped,
                           max(0, alive_ms - idle_total - bp_total), bp_total, idle_total,
                           {f"{name}.{gauge_name(g)}": float(g[3]) for _, name, g in self.gauges()})

    def gauges(self) -> list[tuple[int, str, Gauge]]:
        """``(place in the chain, operator name, gauge)`` of the chain's operators' own gauges."""
        st = self._task
        return [(i, op.name, g) for i, op in enumerate(getattr(st, "chain", ()) if st is not None else ())
                for g in (op.gauges() if hasattr(op, "gauges") else ())]

    def _inflight_peak(self) -> int:
        st = self._task
        gate = st.gate if st is not None else None
        return gate.inflight_bytes_peak() if gate is not None else 0


#: Flink's counters among the task's figures: Prometheus counters (``<name>_total``)
COUNTERS = frozenset({"numRecordsIn", "numRecordsOut", "numBytesIn", "numBytesOut", "numLateRecordsDropped"})


def gauge_name(g: Gauge) -> str:
    """Flink's dotted name of an operator's gauge: ``KafkaSourceReader.topic.t.partition.0.currentOffset``."""
    group, labels, metric, _ = g
    return ".".join([group, *(part for kv in labels for part in kv), metric])


# ---- Prometheus ------------------------------------------------------------------------------

#: Flink's label names (its Prometheus reporter's)
_TASK = ("tm_id", "host", "job_id", "job_name", "task_name", "subtask_index", "task_attempt_num")
_OPERATOR = (*_TASK, "operator_name", "operator_id")


def task_executor_families(tm_id: str, tasks: Iterable[TaskMetricGroup],
                           managed_memory: tuple[int, int] | None = None, memory: Any = None) -> Iterator[Any]:
    """The metric families of a TaskExecutor's running tasks, under Flink's names, its
    managed memory (``(total, used)`` bytes: Flink's Status.Flink.Memory.Managed.*) and what its
    memory watchdog measured (``memory``, a ``MemoryStatus``: Status.Process.Memory.*)."""
    from yarnflow.common.metrics import counter, gauge

    host = socket.gethostname()
    if memory is not None:
        levels = {"ok": 0, "warning": 1, "critical": 2}
        for name, value, doc in (("Used", memory.used_bytes, "resident memory of the process and its children"),
                                 ("Peak", memory.peak_bytes, "the most resident memory measured"),
                                 ("Limit", memory.limit_bytes, "taskmanager.memory.process.size"),
                                 ("Arrow", memory.arrow_bytes, "bytes Arrow's memory pool holds"),
                                 ("RocksDB", memory.rocksdb_bytes, "bytes the shared RocksDB caches hold"),
                                 ("Level", levels.get(memory.level, 0), "0 ok, 1 near the limit (warning), "
                                                                         "2 at the limit (its tasks fail)")):
            family = gauge(f"taskmanager_Status_Process_Memory_{name}", doc, ("tm_id",))
            family.add_metric([tm_id], float(value))
            yield family
        family = gauge("taskmanager_Status_Process_CPU_Load", "cores the process used (1.0: one core)", ("tm_id",))
        family.add_metric([tm_id], float(memory.cpu_load))
        yield family

    if managed_memory is not None:
        for name, value, doc in (("Total", managed_memory[0], "managed memory of the TaskExecutor"),
                                 ("Used", managed_memory[1], "managed memory its tasks hold")):
            family = gauge(f"taskmanager_Status_Flink_Memory_Managed_{name}", doc, ("tm_id",))
            family.add_metric([tm_id], float(value))
            yield family

    task_gauges = {
        "numRecordsIn": ("records_in", "records the task read from its inputs"),
        "numRecordsOut": ("records_out", "records the task emitted to its outputs"),
        "numBytesIn": ("bytes_in", "bytes the task read from its inputs"),
        "numBytesOut": ("bytes_out", "bytes the task sent to its outputs"),
        "numRecordsInPerSecond": ("records_in_per_second", "records read per second"),
        "numRecordsOutPerSecond": ("records_out_per_second", "records emitted per second"),
        "numBytesInPerSecond": ("bytes_in_per_second", "bytes read per second"),
        "numBytesOutPerSecond": ("bytes_out_per_second", "bytes sent per second"),
        "busyTimeMsPerSecond": ("busy_ms_per_second", "ms per second the task was neither idle nor back-pressured"),
        "backPressuredTimeMsPerSecond": ("backpressured_ms_per_second",
                                         "ms per second the task waited for room in its outputs"),
        "idleTimeMsPerSecond": ("idle_ms_per_second", "ms per second the task waited for input"),
        "managedMemoryBytes": ("managed_memory_bytes", "the task's share of its slot's managed memory"),
        "managedMemoryUsed": ("managed_memory_used", "managed memory the task's operators hold"),
        "spilledBytes": ("spilled_bytes", "bytes the task's batch operators wrote to spill files"),
        "inflightBytesPeak": ("inflight_bytes_peak", "the most bytes one remote input channel of the task held "
                                                     "(bounded by its credit times the segment size)"),
        "currentInputWatermark": ("input_watermark", "the least watermark of the task's inputs (ms)"),
        "currentOutputWatermark": ("output_watermark", "the last watermark the task emitted (ms)"),
        "numLateRecordsDropped": ("late_records_dropped", "records its window operators dropped as late"),
        "accumulatedBusyTime": ("busy_ms_total", "ms the task was busy since it started"),
        "accumulatedBackPressuredTime": ("backpressured_ms_total", "ms the task was back-pressured"),
        "accumulatedIdleTime": ("idle_ms_total", "ms the task was idle"),
    }
    families = {name: (counter if name in COUNTERS else gauge)(f"taskmanager_job_task_{name}", doc, _TASK)
                for name, (_, doc) in task_gauges.items()}
    op_families = {name: (counter if name in COUNTERS else gauge)(f"taskmanager_job_task_operator_{name}",
                                                                   f"per operator: {doc}", _OPERATOR)
                   for name, doc in (("numRecordsIn", "records in"), ("numRecordsOut", "records out"),
                                     ("numRecordsInPerSecond", "records in per second"),
                                     ("numRecordsOutPerSecond", "records out per second"))}
    gauge_families: dict[tuple[str, tuple[str, ...]], Any] = {}
    for group in list(tasks):
        m = group.snapshot()
        labels = [tm_id, host, group.job_id, group.job_name, group.task_name, str(group.subtask_index),
                  str(group.attempt)]
        for name, (attr, _) in task_gauges.items():
            families[name].add_metric(labels, float(getattr(m, attr)))
        for i, op in enumerate(group.operator_names):
            op_labels = [*labels, op, f"{group.task_name}#{i}"]  # (its place in the chain: unique in the job)
            for name, values in (("numRecordsIn", m.operator_records_in), ("numRecordsOut", m.operator_records_out),
                                 ("numRecordsInPerSecond", group.operator_rates_in),
                                 ("numRecordsOutPerSecond", group.operator_rates_out)):
                if i < len(values):
                    op_families[name].add_metric(op_labels, float(values[i]))
        for i, op, g in group.gauges():  # a connector's: Flink's group and keys, the keys as labels
            keys = tuple(k for k, _ in g[1])
            name = "_".join(["taskmanager_job_task_operator", g[0], *keys, g[2]]).replace("-", "_").replace(".", "_")
            family = gauge_families.get((name, keys))
            if family is None:
                family = gauge_families[(name, keys)] = gauge(name, f"{g[0]} {g[2]}", (*_OPERATOR, *keys))
            family.add_metric([*labels, op, f"{group.task_name}#{i}", *(v for _, v in g[1])], float(g[3]))
    yield from families.values()
    yield from op_families.values()
    yield from gauge_families.values()


def start_task_executor_metrics(te: Any) -> Any:
    """The TaskExecutor's Prometheus endpoint over its running tasks (None: no reporter)."""
    from yarnflow.common.metrics import start_prometheus
    from yarnflow.common.security import rest_auth_token

    return start_prometheus(te.config, lambda: task_executor_families(
        str(te.resource_id), [t.metrics for t in list(te.tasks.values())],
        (te.memory.total_bytes, te.memory.used_bytes), te.watchdog.status()), f"TaskExecutor {te.resource_id}",
        rest_auth_token(te.config, te.credentials))  # (scrapes carry the cluster's token, as REST calls do)
