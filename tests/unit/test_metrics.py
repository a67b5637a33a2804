"""The pure parts of the metrics: a task's meters (rates over a window, busy = what idle and
back-pressure leave), the REST API's aggregation into Flink's shapes, the port ranges, the
job's log lines, and the client's progress line."""

from __future__ import annotations

from types import SimpleNamespace
import pytest

from yarnflow.am.rest import views
from yarnflow.common.config import ConfigurationError, Configuration
from yarnflow.common.config_types import parse_port_range
from yarnflow.common.logs import job_lines
from yarnflow.common.messages import CheckpointCounts, CheckpointInfo, JobStatusInfo, TaskMetrics, VertexStatus
from yarnflow.common.states import ExecutionState, JobStatus
from yarnflow.executors import Progress
from yarnflow.worker.metrics import TaskMetricGroup


class FakeTask:
    """The counters a StreamTask, its gate and writers keep."""

    def __init__(self) -> None:
        self.records_in = self.bytes_in = 0
        self.tail = SimpleNamespace(records_out=0)
        self.writers = [SimpleNamespace(bytes_out=0, backpressured_ns=0)]
        self.gate = SimpleNamespace(idle_ns=0, inflight_bytes_peak=lambda: self.inflight_peak)
        self.inflight_peak = 0
        self.ops = ([0, 0], [0, 0])

    def operator_records(self) -> tuple[list[int], list[int]]:
        return self.ops

    def operator_paths(self) -> list[str]:
        return ["", "vectorised (Arrow compute)"]


def test_rates_over_the_window_and_busy_time() -> None:
    now = [100.0]
    group = TaskMetricGroup("map -> sink", 1, "j1", ["map", "sink"], clock=lambda: now[0])
    task = FakeTask()
    group.attach(task)  # type: ignore[arg-type]
    first = group.snapshot()
    assert (first.records_in_per_second, first.busy_ms_per_second) == (0.0, 0.0)  # one sample: no rate yet
    now[0] += 2.0
    task.records_in, task.tail.records_out, task.bytes_in = 4000, 1000, 64_000
    task.gate.idle_ns = int(0.5e9)  # 0.5 s of 2 s waiting for input: 250 ms/s
    task.writers[0].backpressured_ns = int(1.0e9)  # 1 s of 2 s waiting for room: 500 ms/s
    task.ops = ([4000, 1000], [1000, 0])
    task.inflight_peak = 3 << 20  # the most one remote channel held
    m = group.snapshot()
    assert (m.records_in, m.records_out, m.bytes_in) == (4000, 1000, 64_000)
    assert m.inflight_bytes_peak == 3 << 20
    assert (m.records_in_per_second, m.records_out_per_second, m.bytes_in_per_second) == (2000, 500, 32_000)
    assert (m.idle_ms_per_second, m.backpressured_ms_per_second, m.busy_ms_per_second) == (250, 500, 250)
    assert (m.operator_records_in, m.operator_records_out) == ([4000, 1000], [1000, 0])
    assert m.operator_paths == ["", "vectorised (Arrow compute)"]  # how each operator runs, for yarnflow info
    assert group.operator_rates_in == [2000, 500]
    # later samples push the first out of the window: the rate follows what happens now
    for _ in range(10):
        now[0] += 1.0
        task.records_in += 100
        last = group.snapshot()
    assert last.records_in_per_second == pytest.approx(100)
    assert last.idle_ms_per_second == 0 and last.busy_ms_per_second == 1000


def test_a_sources_pauses_are_its_idle_time_not_busy_time() -> None:
    """A rate-limited source sleeps between batches: that is waiting (idle), not work (it showed
    busy 1,000 ms/s on a process using 1.5% of a core)."""
    from yarnflow.worker.operators.base import SourceOperator

    now = [100.0]
    group = TaskMetricGroup("gen", 0, "j", ["gen"], clock=lambda: now[0])
    source = SourceOperator("gen")
    task = FakeTask()
    task.gate, task.chain = None, [source]  # type: ignore[assignment]
    group.attach(task)  # type: ignore[arg-type]
    group.snapshot()
    for _ in range(3):
        source.pause(0.02)
    assert 0.06e9 <= source.idle_ns < 0.5e9
    now[0] += 0.1  # 60+ ms of the 100 ms paused
    m = group.snapshot()
    assert m.idle_ms_per_second >= 600 and m.busy_ms_per_second <= 400


def test_operator_rates_count_from_a_sample_taken_before_the_task_was_built() -> None:
    now = [100.0]
    group = TaskMetricGroup("gen -> map", 0, "j", ["gen", "map"], clock=lambda: now[0])
    group.snapshot()  # a heartbeat before the StreamTask existed: no operator counts yet
    task = FakeTask()
    group.attach(task)  # type: ignore[arg-type]
    now[0] += 2.0
    task.ops = ([0, 3000], [3000, 3000])
    group.snapshot()
    assert group.operator_rates_out == [1500, 1500]  # not zeros until that sample leaves the window


def test_a_task_not_built_yet_reports_zeros() -> None:
    m = TaskMetricGroup("t", 0, "j", []).snapshot()
    assert m == TaskMetrics(operator_records_in=[], operator_records_out=[])


def metrics(records_in: int, rate_out: float, backpressured: float) -> TaskMetrics:
    return TaskMetrics(records_in=records_in, records_out=records_in, bytes_in=10 * records_in,
                       records_out_per_second=rate_out, backpressured_ms_per_second=backpressured,
                       idle_ms_per_second=100.0, busy_ms_per_second=900.0 - backpressured)


def vertex(states: list[ExecutionState], ms: list[TaskMetrics]) -> VertexStatus:
    counts: dict[ExecutionState, int] = {}
    for s in states:
        counts[s] = counts.get(s, 0) + 1
    return VertexStatus("v1", "map", len(states), counts, [0] * len(states), ["te-1"] * len(states), states, ms)


def test_vertex_metrics_sum_over_subtasks_and_average_the_times() -> None:
    v = vertex([ExecutionState.RUNNING] * 2, [metrics(100, 10.0, 0.0), metrics(300, 30.0, 600.0)])
    info = JobStatusInfo("a" * 32, "job", JobStatus.RUNNING, 1000, vertices=[v])
    [out] = views.job_details(info, None)["vertices"]
    m = out["metrics"]
    assert (m["read-records"], m["write-records"], m["read-bytes"]) == (400, 400, 4000)
    assert m["write-records-per-second"] == 40.0
    assert m["backpressured-time-ms-per-second"] == 300.0 and m["backpressure-level"] == "low"
    assert out["status"] == "RUNNING" and out["tasks"]["RUNNING"] == 2  # Flink's ExecutionState names
    assert views.backpressure(v)["backpressure-level"] == "high"  # the worst subtask
    assert [s["backpressure-level"] for s in views.backpressure(v)["subtasks"]] == ["ok", "high"]


@pytest.mark.parametrize("states, shown", [
    ([ExecutionState.RUNNING, ExecutionState.DEPLOYING], ExecutionState.DEPLOYING),
    ([ExecutionState.FINISHED, ExecutionState.RUNNING], ExecutionState.RUNNING),
    ([ExecutionState.FINISHED, ExecutionState.FINISHED], ExecutionState.FINISHED),
    ([ExecutionState.RUNNING, ExecutionState.FAILED], ExecutionState.FAILED),
    ([ExecutionState.CANCELED, ExecutionState.FINISHED], ExecutionState.CANCELED),
])
def test_a_vertex_shows_its_furthest_behind_subtask_or_a_failure(states: list[ExecutionState],
                                                                 shown: ExecutionState) -> None:
    assert views.vertex_status(vertex(states, [])) == shown


def test_checkpoint_statistics_in_flinks_shape() -> None:
    cps = [CheckpointInfo(1, "COMPLETED", 10, 5, 100), CheckpointInfo(2, "ABORTED", 20, failure="timeout"),
           CheckpointInfo(3, "COMPLETED", 30, 7, 300), CheckpointInfo(4, "PENDING", 40)]
    info = JobStatusInfo("a" * 32, "job", JobStatus.RUNNING, 1, checkpoints=cps, latest_completed_checkpoint_id=3,
                         checkpoint_counts=CheckpointCounts(2, 1, 1))
    out = views.checkpoints(info)
    assert out["counts"] == {"restored": 0, "total": 4, "in_progress": 1, "completed": 2, "failed": 1}
    assert [h["id"] for h in out["history"]] == [4, 3, 2, 1]  # newest first
    assert [h["status"] for h in out["history"]] == ["IN_PROGRESS", "COMPLETED", "FAILED", "COMPLETED"]
    assert out["latest"]["completed"]["id"] == 3 and out["latest"]["failed"]["failure_message"] == "timeout"
    assert out["summary"]["state_size"]["max"] == 300 and out["summary"]["end_to_end_duration"]["min"] == 5


def test_an_unaligned_checkpoint_shows_its_type_in_flight_data_and_alignment() -> None:
    cps = [CheckpointInfo(1, "COMPLETED", 10, 5, 100, alignment_ms=3000),
           CheckpointInfo(2, "COMPLETED", 20, 9, 100, alignment_ms=40, unaligned=True, inflight_bytes=5 << 20)]
    info = JobStatusInfo("a" * 32, "job", JobStatus.RUNNING, 1, checkpoints=cps, latest_completed_checkpoint_id=2,
                         checkpoint_counts=CheckpointCounts(2, 0, 0))
    out = views.checkpoints(info)
    unaligned, aligned = out["history"]
    assert (unaligned["checkpoint_type"], unaligned["unaligned"], unaligned["persisted_data"],
            unaligned["alignment_duration"]) == ("UNALIGNED_CHECKPOINT", True, 5 << 20, 40)
    assert (aligned["checkpoint_type"], aligned["unaligned"], aligned["persisted_data"]) == ("CHECKPOINT", False, 0)
    assert out["summary"]["persisted_data"]["max"] == 5 << 20 and out["summary"]["alignment_duration"]["max"] == 3000


def test_overview_counts_jobs_by_state() -> None:
    jobs = [JobStatusInfo(str(i) * 32, "j", s, 1) for i, s in enumerate(
        [JobStatus.RUNNING, JobStatus.RESTARTING, JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED])]
    assert views.overview_counts(jobs) == {"jobs-running": 2, "jobs-finished": 1, "jobs-cancelled": 1,
                                           "jobs-failed": 1}


def test_port_ranges() -> None:
    assert parse_port_range("9250-9260") == (9250, 9260)
    assert parse_port_range(8081) == (8081, 8081)
    assert parse_port_range("0") == (0, 0)
    for bad in ("9260-9250", "70000", "a-b", "0-10", True):
        with pytest.raises(ValueError):
            parse_port_range(bad)
    with pytest.raises(ConfigurationError, match="metrics.reporter.prom.port"):
        Configuration.load({"metrics.reporter.prom.port": "x"})


def test_a_jobs_log_lines_with_their_continuations() -> None:
    job = "ab" * 16
    log = "\n".join([
        "2026-01-01 10:00:00,000 INFO appmaster-conn yarnflow.dispatcher: job wc (" + job + ") submitted",
        "2026-01-01 10:00:01,000 INFO te-heartbeat yarnflow.te: registered",
        "2026-01-01 10:00:02,000 WARNING task map (1/2) [job " + job + "] yarnflow.task: map failed",
        "Traceback (most recent call last):",
        "  ValueError: bad row",
        "2026-01-01 10:00:03,000 INFO task other [job " + "cd" * 16 + "] yarnflow.task: other job",
        "  its traceback",
    ])
    assert job_lines(log, job) == [log.splitlines()[0], *log.splitlines()[2:5]]


def test_the_progress_line_shows_records_per_second() -> None:
    v = vertex([ExecutionState.RUNNING] * 2, [metrics(0, 1500.0, 0.0), metrics(0, 1000.0, 0.0)])
    info = JobStatusInfo("a" * 32, "wc", JobStatus.RUNNING, 1, vertices=[v])
    line = Progress(False).render(info)
    assert "map [2 RUNNING] out 2.5k/s" in line
    quiet = JobStatusInfo("a" * 32, "wc", JobStatus.RUNNING, 1, vertices=[vertex([ExecutionState.RUNNING], [])])
    assert Progress(False).render(quiet).endswith("map [1 RUNNING]")


def test_an_aggregated_container_log_splits_into_its_files() -> None:
    from yarnflow.cli_logs import split_container_log

    text = ("LogType:stderr.log\nLog Upload Time:now\nLogLength:12\nLog Contents:\nline 1\nline 2\n"
            "End of LogType:stderr.log\n\nLogType:empty.log\nLog Contents:\n\nEnd of LogType:empty.log\n")
    assert split_container_log(text) == {"stderr.log": "line 1\nline 2", "empty.log": ""}


def test_lines_of_a_thread_bound_to_a_job_carry_its_id() -> None:
    import io
    import logging

    from yarnflow.common import logs

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(threadName)s%(job)s: %(message)s"))
    handler.addFilter(logs.JobTagFilter())
    logger = logging.getLogger("test.job-tags")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logs.bind_job("ab" * 16)
        logger.warning("in the job")
        logs.unbind_job()
        logger.warning("outside")
    finally:
        logger.removeHandler(handler)
    assert out.getvalue().splitlines() == [f"MainThread [job {'ab' * 16}]: in the job", "MainThread: outside"]


def test_watermarks_late_records_and_accumulated_times() -> None:
    """currentInputWatermark (the least of its inputs'), currentOutputWatermark (the last it
    emitted), numLateRecordsDropped (its window operators'), and the busy / back-pressured / idle
    ms accumulated since the task started (Flink's accumulated-*-time)."""
    now = [100.0]
    group = TaskMetricGroup("window", 0, "j", ["window"], clock=lambda: now[0])
    task = FakeTask()
    task.valves = {0: SimpleNamespace(current=5_000), 1: SimpleNamespace(current=4_200)}  # type: ignore[attr-defined]
    task.input_watermark = min(v.current for v in task.valves.values())  # type: ignore[attr-defined]
    task.tail.watermark = 4_100
    task.chain = [SimpleNamespace(late_records_dropped=3), SimpleNamespace()]  # type: ignore[attr-defined]
    group.attach(task)  # type: ignore[arg-type]
    now[0] += 10.0
    task.gate.idle_ns, task.writers[0].backpressured_ns = int(4e9), int(1e9)
    m = group.snapshot()
    assert (m.input_watermark, m.output_watermark, m.late_records_dropped) == (4_200, 4_100, 3)
    assert (m.busy_ms_total, m.backpressured_ms_total, m.idle_ms_total) == (5_000, 1_000, 4_000)
    fresh = TaskMetricGroup("t", 0, "j", []).snapshot()
    assert fresh.input_watermark == fresh.output_watermark == -(2**63)  # none yet


def test_rest_metrics_leave_out_unknown_watermarks_and_give_the_lag() -> None:
    from yarnflow.am.rest.metrics_api import task_metrics

    known = task_metrics(TaskMetrics(input_watermark=9_000, output_watermark=8_000), now_ms=10_000)
    assert (known["currentInputWatermark"], known["currentOutputWatermark"], known["watermarkLag"]) == \
        (9_000, 8_000, 2_000)
    unknown = task_metrics(TaskMetrics())
    assert "currentInputWatermark" not in unknown and "watermarkLag" not in unknown
