"""PyFlink programs run unchanged by ``yarnflow run`` (issue 56, first steps): written for this
repository in PyFlink's style, each imports ``pyflink.*`` (apache-flink is not installed: the
names are yarnflow's PyFlink layer), and their outputs are checked exactly: a word count from
files to a FileSink, functions with open() and the RuntimeContext, typed tuples and Rows,
pickled objects, execute_and_collect, partitioners, job-code configuration, and a checkpointed
STREAMING job whose TaskExecutor is SIGKILLed. What yarnflow cannot do yet fails naming it."""

from __future__ import annotations

import ast
import collections
import signal
import textwrap
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.harness import wait_until
from tests.integration.test_cluster_failures import _te_processes
from yarnflow.common.states import JobStatus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

WORDCOUNT = textwrap.dedent("""\
    import sys

    from pyflink.common import Encoder, Types, WatermarkStrategy
    from pyflink.datastream import RuntimeExecutionMode, StreamExecutionEnvironment
    from pyflink.datastream.connectors.file_system import FileSink, FileSource, OutputFileConfig, StreamFormat


    def words(line):
        for w in line.lower().split():
            yield w.strip(".,")


    def main(src, out):
        env = StreamExecutionEnvironment.get_execution_environment()
        env.set_runtime_mode(RuntimeExecutionMode.BATCH)
        env.set_parallelism(2)
        env.add_jars("file:///opt/flink/lib/flink-connector-files.jar")  # (ignored, with a warning)
        lines = env.from_source(FileSource.for_record_stream_format(StreamFormat.text_line_format(), src).build(),
                                WatermarkStrategy.no_watermarks(), "lines")
        counts = lines.flat_map(words) \\
            .map(lambda w: (w, 1), output_type=Types.TUPLE([Types.STRING(), Types.INT()])) \\
            .key_by(lambda t: t[0]) \\
            .reduce(lambda a, b: (a[0], a[1] + b[1]))
        counts.sink_to(FileSink.for_row_format(out, Encoder.simple_string_encoder())
                       .with_output_file_config(OutputFileConfig.builder().with_part_suffix(".txt").build())
                       .build())
        counts.filter(lambda t: t[1] >= 3).print("frequent")
        env.execute("pyflink wordcount")


    if __name__ == "__main__":
        main(sys.argv[1], sys.argv[2])
    """)


def _lines(folder: Path) -> list[str]:
    return [line for f in sorted(folder.iterdir()) if not f.name.startswith(".")
            for line in f.read_text().splitlines()]


def test_a_pyflink_word_count_runs_unchanged_and_counts_exactly(cli: Any, tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    texts = ["The cat sat. The dog sat,", "the end", "Dog days"]
    for i, t in enumerate(texts):
        (src / f"{i}.txt").write_text(t + "\n")
    (tmp_path / "wc.py").write_text(WORDCOUNT)
    ran = cli.run("run", "wc.py", str(src), str(tmp_path / "out"))
    assert ran.returncode == 0, ran.stderr
    expected = collections.Counter(w.strip(".,") for t in texts for w in t.lower().split())
    written = [ast.literal_eval(line) for line in _lines(tmp_path / "out")]
    assert dict(written) == expected and len(written) == len(expected)
    assert all(f.suffix == ".txt" for f in (tmp_path / "out").iterdir() if not f.name.startswith("."))
    printed = sorted(line for line in ran.stdout.splitlines() if line.startswith("frequent:"))
    assert printed == ["frequent:('the', 3)"], ran.stdout
    assert "add_jars(...) is ignored on yarnflow: yarnflow runs no JVM" in ran.stderr


FUNCTIONS = textwrap.dedent("""\
    from pyflink.common import Row, Types
    from pyflink.common.restart_strategy import RestartStrategies
    from pyflink.datastream import (FilterFunction, FlatMapFunction, KeySelector, MapFunction, ReduceFunction,
                                    RuntimeContext, StreamExecutionEnvironment)
    from pyflink.datastream.state_backend import EmbeddedRocksDBStateBackend


    class Scale(MapFunction):
        def open(self, runtime_context: RuntimeContext):
            self.factor = 10
            self.where = runtime_context.get_task_name_with_subtasks()

        def map(self, value):
            return Row(name=value[0], amount=value[1] * self.factor, where=self.where)


    class Large(FilterFunction):
        def filter(self, value):
            return value.amount >= 20


    class Explode(FlatMapFunction):
        def flat_map(self, value):
            for i in range(value["n"]):
                yield {"id": value["id"], "i": i}


    class ById(KeySelector):
        def get_key(self, value):
            return value["id"]


    class Most(ReduceFunction):
        def reduce(self, a, b):
            return a if a["i"] >= b["i"] else b


    env = StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(2)
    env.set_restart_strategy(RestartStrategies.no_restart())
    env.set_state_backend(EmbeddedRocksDBStateBackend())
    rows = env.from_collection([("a", 1), ("b", 2), ("c", 3)], type_info=Types.TUPLE([Types.STRING(), Types.INT()])) \\
        .map(Scale(), output_type=Types.ROW_NAMED(["name", "amount", "where"],
                                                  [Types.STRING(), Types.INT(), Types.STRING()])) \\
        .filter(Large())
    import re
    print("rows", sorted((r.name, r.amount, bool(re.search(r"Map: Scale.* \\([12]/2\\)$", r["where"])))
                         for r in rows.execute_and_collect()))
    most = env.from_collection([{"id": "x", "n": 3}, {"id": "y", "n": 2}]).flat_map(Explode()) \\
        .key_by(ById()).reduce(Most())
    print("most", sorted((d["id"], d["i"]) for d in most.execute_and_collect()))
    spread = env.from_collection(list(range(20)), type_info=Types.INT()) \\
        .partition_custom(lambda key, n: key % n, lambda v: v).map(lambda v: v * 2, output_type=Types.LONG())
    print("spread", sorted(spread.execute_and_collect()))
    """)


def test_pyflink_functions_types_and_configuration_run_unchanged(cli: Any, tmp_path: Path) -> None:
    (tmp_path / "functions.py").write_text(FUNCTIONS)
    ran = cli.run("run", "functions.py")
    assert ran.returncode == 0, ran.stderr
    out = {line.split(" ", 1)[0]: ast.literal_eval(line.split(" ", 1)[1]) for line in ran.stdout.splitlines()
           if line.split(" ", 1)[0] in ("rows", "most", "spread")}
    assert out["rows"] == [("b", 20, True), ("c", 30, True)]
    # a keyed reduce emits each key's latest value per batch it touched: the last is the most
    assert max(i for k, i in out["most"] if k == "x") == 2 and max(i for k, i in out["most"] if k == "y") == 1
    assert out["spread"] == [2 * v for v in range(20)]


CHECKPOINTED = textwrap.dedent("""\
    import sys
    import time

    from pyflink.common import Encoder, Types, WatermarkStrategy
    from pyflink.common.restart_strategy import RestartStrategies
    from pyflink.datastream import CheckpointingMode, StreamExecutionEnvironment
    from pyflink.datastream.connectors.file_system import FileSink, FileSource, StreamFormat


    def parse(line):
        time.sleep(0.001)  # (long enough for checkpoints, and a kill between them)
        f, i = line.split()
        return int(f), int(i)


    env = StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(2)
    env.enable_checkpointing(200, CheckpointingMode.EXACTLY_ONCE)
    env.get_checkpoint_config().enable_unaligned_checkpoints()  # (barriers need not wait for a file's lines)
    env.set_restart_strategy(RestartStrategies.fixed_delay_restart(5, 200))
    lines = env.from_source(FileSource.for_record_stream_format(StreamFormat.text_line_format(), sys.argv[1]).build(),
                            WatermarkStrategy.no_watermarks(), "lines")
    # (rebalance: a slow map chained to the file source would hold each checkpoint for a whole file)
    lines.rebalance().map(parse, output_type=Types.TUPLE([Types.INT(), Types.INT()])) \\
        .sink_to(FileSink.for_row_format(sys.argv[2], Encoder.simple_string_encoder()).build())
    env.execute("pyflink checkpointed")
    """)


def test_a_checkpointed_pyflink_job_survives_a_taskexecutor_kill_exactly(cli: Any, local_cluster: Any,
                                                                         tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    files, lines = 4, 2500  # (1 ms a line on 2 subtasks: about 5 s, for checkpoints and a kill between them)
    for f in range(files):
        (src / f"{f}.txt").write_text("".join(f"{f} {i}\n" for i in range(lines)))
    (tmp_path / "job.py").write_text(CHECKPOINTED)
    cluster = local_cluster(taskexecutors=2, slots=1)  # (parallelism 2: a task on each, so a kill hits the job)
    ran = cli.run("run", "--address", cluster.address, "--detached", "job.py", str(src), str(tmp_path / "out"))
    assert ran.returncode == 0, ran.stderr
    with closing(cluster.gateway()) as gw:
        job = wait_until(lambda: (gw.list_jobs() or [None])[0], 30, "no job").job_id
        wait_until(lambda: gw.get_job(job).latest_completed_checkpoint_id >= 2, 60,
                   "no checkpoints: the job's enable_checkpointing did not take effect")
        assert gw.get_job(job).status == JobStatus.RUNNING
        _te_processes(cluster)[0].send_signal(signal.SIGKILL)
        wait_until(lambda: gw.get_job(job).status == JobStatus.FINISHED, 120,
                   lambda: f"the job did not finish: {gw.get_job(job).status}")
        assert gw.get_job(job).failure_history, "the kill did not hit the job"
    written = collections.Counter(ast.literal_eval(line) for line in _lines(tmp_path / "out"))
    assert len(written) == files * lines and set(written.values()) == {1}


WINDOWS = '''\
from pyflink.common import Duration, Time, Types, WatermarkStrategy
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import AggregateFunction, StreamExecutionEnvironment
from pyflink.datastream.window import EventTimeSessionWindows, SlidingEventTimeWindows, TumblingEventTimeWindows


class ByField(TimestampAssigner):
    def extract_timestamp(self, value, record_timestamp):
        return value[2]


class Avg(AggregateFunction):
    def create_accumulator(self):
        return (0, 0)

    def add(self, value, acc):
        return acc[0] + value[1], acc[1] + 1

    def get_result(self, acc):
        return acc[0] / acc[1]

    def merge(self, a, b):
        return a[0] + b[0], a[1] + b[1]


env = StreamExecutionEnvironment.get_execution_environment()
env.set_parallelism(2)
events = [("a", 1, 1000), ("a", 2, 2000), ("b", 5, 3000), ("a", 3, 6500), ("b", 1, 9000), ("a", 4, 20000)]
t = Types.TUPLE([Types.STRING(), Types.INT(), Types.LONG()])
ds = env.from_collection(events, type_info=t).assign_timestamps_and_watermarks(
    WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_seconds(1)).with_timestamp_assigner(ByField()))
tumbling = ds.key_by(lambda e: e[0]).window(TumblingEventTimeWindows.of(Time.seconds(5))) \\
    .reduce(lambda a, b: (a[0], a[1] + b[1], max(a[2], b[2])))
print("tumbling", sorted(tumbling.execute_and_collect()))
sliding = ds.map(lambda e: (e[0], e[1], e[2]), output_type=t).key_by(lambda e: e[0]) \\
    .window(SlidingEventTimeWindows.of(Time.seconds(10), Time.seconds(5))).aggregate(Avg(), output_type=Types.DOUBLE())
print("sliding", sorted(sliding.execute_and_collect()))
sessions = ds.key_by(lambda e: e[0]).window(EventTimeSessionWindows.with_gap(Time.seconds(3))) \\
    .reduce(lambda a, b: (a[0], a[1] + b[1], max(a[2], b[2])))
print("sessions", sorted(sessions.execute_and_collect()))
'''


def test_pyflink_event_time_windows_run_unchanged(cli: Any, tmp_path: Path) -> None:
    """Event time from a TimestampAssigner, bounded out-of-orderness; tumbling and session
    windows with reduce, sliding windows with an AggregateFunction: every window's result."""
    (tmp_path / "windows.py").write_text(WINDOWS)
    ran = cli.run("run", "windows.py")
    assert ran.returncode == 0, ran.stderr
    out = {line.split(" ", 1)[0]: ast.literal_eval(line.split(" ", 1)[1]) for line in ran.stdout.splitlines()
           if line.split(" ", 1)[0] in ("tumbling", "sliding", "sessions")}
    # a: 1@1s 2@2s 3@6.5s 4@20s; b: 5@3s 1@9s
    assert out["tumbling"] == [("a", 3, 2000), ("a", 3, 6500), ("a", 4, 20000), ("b", 1, 9000), ("b", 5, 3000)]
    assert out["sessions"] == out["tumbling"]  # (3 s gaps split them the same way here)
    # 10 s windows every 5 s, the mean of field 1: a [-5,5) 1.5, [0,10) 2, [5,15) 3, [15,25) 4, [20,30) 4;
    # b [-5,5) 5, [0,10) 3, [5,15) 1
    assert out["sliding"] == [1.0, 1.5, 2.0, 3.0, 3.0, 4.0, 4.0, 5.0]


PROCESS = '''\
from pyflink.common import Duration, Types, WatermarkStrategy
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import KeyedProcessFunction, OutputTag, RuntimeContext, StreamExecutionEnvironment
from pyflink.datastream.functions import AggregateFunction
from pyflink.datastream.state import (AggregatingStateDescriptor, ListStateDescriptor, MapStateDescriptor,
                                      ReducingStateDescriptor, ValueStateDescriptor)

BIG = OutputTag("big", Types.TUPLE([Types.STRING(), Types.INT()]))


class At(TimestampAssigner):
    def extract_timestamp(self, value, record_timestamp):
        return value[2]


class Mean(AggregateFunction):
    def create_accumulator(self):
        return [0, 0]

    def add(self, value, acc):
        return [acc[0] + value, acc[1] + 1]

    def get_result(self, acc):
        return acc[0] / acc[1]

    def merge(self, a, b):
        return [a[0] + b[0], a[1] + b[1]]


class Sessionize(KeyedProcessFunction):
    """Per key: totals and the amounts seen, reported 5 s (event time) after the key's first event."""

    def open(self, runtime_context: RuntimeContext):
        self.total = runtime_context.get_state(ValueStateDescriptor("total", Types.INT()))
        self.seen = runtime_context.get_list_state(ListStateDescriptor("seen", Types.INT()))
        self.firsts = runtime_context.get_map_state(MapStateDescriptor("firsts", Types.STRING(), Types.LONG()))
        self.mean = runtime_context.get_aggregating_state(AggregatingStateDescriptor("mean", Mean(), Types.PICKLED_BYTE_ARRAY()))
        self.biggest = runtime_context.get_reducing_state(ReducingStateDescriptor("biggest", max, Types.INT()))

    def process_element(self, value, ctx: KeyedProcessFunction.Context):
        if self.total.value() is None:
            ctx.timer_service().register_event_time_timer(ctx.timestamp() + 5000)
            self.firsts.put("first", ctx.timestamp())
        self.total.update((self.total.value() or 0) + value[1])
        self.seen.add(value[1])
        self.mean.add(value[1])
        self.biggest.add(value[1])
        if value[1] >= 10:
            yield BIG, (ctx.get_current_key(), value[1])

    def on_timer(self, timestamp, ctx: KeyedProcessFunction.OnTimerContext):
        yield (ctx.get_current_key(), self.total.value(), sorted(self.seen.get()), self.firsts.get("first"),
               self.mean.get(), self.biggest.get(), timestamp)
        self.total.clear()
        self.seen.clear()


env = StreamExecutionEnvironment.get_execution_environment()
env.set_parallelism(2)
events = [("a", 1, 1000), ("a", 12, 2000), ("b", 3, 1500), ("a", 4, 3000), ("b", 20, 4000), ("c", 2, 30000)]
ds = env.from_collection(events, type_info=Types.TUPLE([Types.STRING(), Types.INT(), Types.LONG()])) \
    .assign_timestamps_and_watermarks(WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(At()))
reports = ds.key_by(lambda e: e[0]).process(Sessionize())
big = reports.get_side_output(BIG)
reports.print("report")
big.print("big")
env.execute("process")
'''


def test_a_pyflink_keyed_process_function_with_state_timers_and_side_outputs(cli: Any, tmp_path: Path) -> None:
    """Value, list, map, reducing and aggregating state from open's runtime context; an event-time timer
    per key; ctx.timestamp() and get_current_key(); a side output by OutputTag."""
    (tmp_path / "process.py").write_text(PROCESS)
    ran = cli.run("run", "process.py")
    assert ran.returncode == 0, ran.stderr
    reports = sorted(ast.literal_eval(line[len("report:"):]) for line in ran.stdout.splitlines()
                     if line.startswith("report:"))
    assert reports == [("a", 17, [1, 4, 12], 1000, 17 / 3, 12, 6000), ("b", 23, [3, 20], 1500, 11.5, 20, 6500),
                       ("c", 2, [2], 30000, 2.0, 2, 35000)]
    big = sorted(ast.literal_eval(line[len("big:"):]) for line in ran.stdout.splitlines() if line.startswith("big:"))
    assert big == [("a", 12), ("b", 20)]


CONNECTED = '''\
from pyflink.common import Types
from pyflink.datastream import (BroadcastProcessFunction, CoMapFunction, KeyedBroadcastProcessFunction,
                                KeyedCoProcessFunction, RuntimeContext, StreamExecutionEnvironment)
from pyflink.datastream.state import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor


class Label(CoMapFunction):
    def map1(self, value):
        return ("num", value)

    def map2(self, value):
        return ("word", len(value))


class Match(KeyedCoProcessFunction):
    """Orders (id, amount) and payments (id, paid): emits (id, amount, paid) once both came."""

    def open(self, runtime_context: RuntimeContext):
        self.order = runtime_context.get_state(ValueStateDescriptor("order", Types.INT()))
        self.paid = runtime_context.get_state(ValueStateDescriptor("paid", Types.INT()))

    def process_element1(self, value, ctx):
        self.order.update(value[1])
        if self.paid.value() is not None:
            yield ctx.get_current_key(), value[1], self.paid.value()

    def process_element2(self, value, ctx):
        self.paid.update(value[1])
        if self.order.value() is not None:
            yield ctx.get_current_key(), self.order.value(), value[1]


RULES = MapStateDescriptor("rules", Types.STRING(), Types.INT())


PENDING = ListStateDescriptor("pending", Types.TUPLE([Types.STRING(), Types.INT()]))


class Threshold(KeyedBroadcastProcessFunction):
    """Readings above the broadcast limit; those that came before the limit wait in keyed state."""

    def open(self, runtime_context: RuntimeContext):
        self.pending = runtime_context.get_list_state(PENDING)

    def process_element(self, value, ctx):
        limit = ctx.get_broadcast_state(RULES).get("limit")
        if limit is None:
            self.pending.add(value)
        elif value[1] > limit:
            yield value

    def process_broadcast_element(self, value, ctx):
        ctx.get_broadcast_state(RULES).put(value[0], value[1])
        found = []

        def over(key, state):
            found.extend(v for v in state.get() if v[1] > value[1])
            state.clear()
        ctx.apply_to_keyed_state(PENDING, over)
        yield from found


env = StreamExecutionEnvironment.get_execution_environment()
env.set_parallelism(2)
nums = env.from_collection([1, 2], type_info=Types.INT())
words = env.from_collection(["abc", "de"], type_info=Types.STRING())
print("labels", sorted(nums.connect(words).map(Label()).execute_and_collect()))
tt = Types.TUPLE([Types.STRING(), Types.INT()])
orders = env.from_collection([("o1", 10), ("o2", 20), ("o3", 30)], type_info=tt)
payments = env.from_collection([("o2", 20), ("o1", 9)], type_info=tt)
print("matched", sorted(orders.connect(payments).key_by(lambda o: o[0], lambda p: p[0]).process(Match())
                        .execute_and_collect()))
readings = env.from_collection([("s1", 5), ("s2", 50), ("s1", 70), ("s3", 8)], type_info=tt)
rules = env.from_collection([("limit", 10)], type_info=tt)
print("alerts", sorted(readings.key_by(lambda r: r[0]).connect(rules.broadcast(RULES)).process(Threshold(), output_type=tt)
                       .execute_and_collect()))
'''


def test_pyflink_connected_and_broadcast_streams_run_unchanged(cli: Any, tmp_path: Path) -> None:
    """A CoMapFunction on two streams of different types; a KeyedCoProcessFunction matching
    orders with payments through keyed state; a KeyedBroadcastProcessFunction with broadcast
    state (readings that came before the rule wait in keyed state, apply_to_keyed_state)."""
    (tmp_path / "connected.py").write_text(CONNECTED)
    ran = cli.run("run", "connected.py")
    assert ran.returncode == 0, ran.stderr
    out = {line.split(" ", 1)[0]: ast.literal_eval(line.split(" ", 1)[1]) for line in ran.stdout.splitlines()
           if line.split(" ", 1)[0] in ("labels", "matched", "alerts")}
    assert out == {"labels": [("num", 1), ("num", 2), ("word", 2), ("word", 3)],
                   "matched": [("o1", 10, 9), ("o2", 20, 20)], "alerts": [("s1", 70), ("s2", 50)]}


WINDOW_FUNCTIONS = '''\
from pyflink.common import Time, Types, WatermarkStrategy
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import StreamExecutionEnvironment
from pyflink.datastream.functions import AggregateFunction, ProcessWindowFunction, WindowFunction
from pyflink.datastream.window import TumblingEventTimeWindows


class At(TimestampAssigner):
    def extract_timestamp(self, value, record_timestamp):
        return value[2]


class Describe(ProcessWindowFunction):
    def process(self, key, context, elements):
        w = context.window()
        values = sorted(e[1] for e in elements)
        yield key, w.start, w.end, values
        if len(values) > 1:
            yield key, w.start, w.end, [-len(values)]


class Count(AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, value, acc):
        return acc + 1

    def get_result(self, acc):
        return acc

    def merge(self, a, b):
        return a + b


class Stamp(WindowFunction):
    def apply(self, key, window, inputs):
        for n in inputs:
            yield key, window.end, n


class AllTotal(ProcessWindowFunction):
    def process(self, context, elements):
        yield context.window().start, sum(e[1] for e in elements)


env = StreamExecutionEnvironment.get_execution_environment()
env.set_parallelism(2)
events = [("a", 1, 1000), ("a", 2, 2000), ("b", 5, 3000), ("a", 3, 6500), ("b", 1, 9000)]
ds = env.from_collection(events, type_info=Types.TUPLE([Types.STRING(), Types.INT(), Types.LONG()])) \
    .assign_timestamps_and_watermarks(WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(At()))
windows = ds.key_by(lambda e: e[0]).window(TumblingEventTimeWindows.of(Time.seconds(5)))
print("described", sorted(windows.process(Describe()).execute_and_collect()))
print("counted", sorted(ds.key_by(lambda e: e[0]).window(TumblingEventTimeWindows.of(Time.seconds(5)))
                        .aggregate(Count(), Stamp()).execute_and_collect()))
print("all", sorted(ds.window_all(TumblingEventTimeWindows.of(Time.seconds(5))).process(AllTotal())
                    .execute_and_collect()))
'''


def test_pyflink_window_functions_and_window_all_run_unchanged(cli: Any, tmp_path: Path) -> None:
    """A ProcessWindowFunction (every element of the window, its bounds, several outputs), an
    AggregateFunction with a WindowFunction, and window_all with a process function."""
    (tmp_path / "window_functions.py").write_text(WINDOW_FUNCTIONS)
    ran = cli.run("run", "window_functions.py")
    assert ran.returncode == 0, ran.stderr
    out = {line.split(" ", 1)[0]: ast.literal_eval(line.split(" ", 1)[1]) for line in ran.stdout.splitlines()
           if line.split(" ", 1)[0] in ("described", "counted", "all")}
    assert out == {
        "described": [("a", 0, 5000, [-2]), ("a", 0, 5000, [1, 2]), ("a", 5000, 10000, [3]), ("b", 0, 5000, [5]),
                      ("b", 5000, 10000, [1])],
        "counted": [("a", 5000, 2), ("a", 10000, 1), ("b", 5000, 1), ("b", 10000, 1)],
        "all": [(0, 8), (5000, 4)]}


LATE = '''\
from pyflink.common import Time, Types, WatermarkStrategy
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import OutputTag, StreamExecutionEnvironment
from pyflink.datastream.window import TumblingEventTimeWindows

TT = Types.TUPLE([Types.STRING(), Types.INT(), Types.LONG()])
LATE = OutputTag("late", TT)


class At(TimestampAssigner):
    def extract_timestamp(self, value, record_timestamp):
        return value[2]


env = StreamExecutionEnvironment.get_execution_environment()
env.set_parallelism(1)
events = [("a", 1, 1000), ("a", 2, 12000), ("a", 3, 2000), ("a", 4, 13000)]
ds = env.from_collection(events, type_info=TT).assign_timestamps_and_watermarks(
    WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(At()))
sums = ds.key_by(lambda e: e[0]).window(TumblingEventTimeWindows.of(Time.seconds(5))) \
    .side_output_late_data(LATE).reduce(lambda a, b: (a[0], a[1] + b[1], max(a[2], b[2])))
sums.get_side_output(LATE).print("late")
sums.print("sum")
env.execute()
'''


def test_pyflink_late_data_goes_to_its_side_output(cli: Any, tmp_path: Path) -> None:
    """side_output_late_data(OutputTag): an element behind the watermark (a batch a row, so the
    watermark moves between elements) is in the side output, not in its window's sum."""
    (tmp_path / "late.py").write_text(LATE)
    ran = cli.run("run", "-D", "execution.batch-size=1", "late.py")
    assert ran.returncode == 0, ran.stderr
    assert sorted(line for line in ran.stdout.splitlines() if line.startswith(("late:", "sum:"))) == [
        "late:('a', 3, 2000)", "sum:('a', 1, 1000)", "sum:('a', 6, 13000)"]


UNKEYED = '''\
from pyflink.common import Types, WatermarkStrategy
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import OutputTag, ProcessFunction, StreamExecutionEnvironment

ODD = OutputTag("odd", Types.INT())


class At(TimestampAssigner):
    def extract_timestamp(self, value, record_timestamp):
        return value * 1000


class Split(ProcessFunction):
    def process_element(self, value, ctx):
        if value % 2:
            yield ODD, value
        else:
            yield value, ctx.timestamp()


env = StreamExecutionEnvironment.get_execution_environment()
env.set_parallelism(2)
ds = env.from_collection(list(range(6)), type_info=Types.INT()).assign_timestamps_and_watermarks(
    WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(At()))
evens = ds.process(Split(), output_type=Types.TUPLE([Types.INT(), Types.LONG()]))
evens.get_side_output(ODD).print("odd")
evens.print("even")
env.execute()
'''


def test_a_pyflink_process_function_on_an_unkeyed_stream(cli: Any, tmp_path: Path) -> None:
    """ProcessFunction: ctx.timestamp() of each element, a side output by OutputTag."""
    (tmp_path / "unkeyed.py").write_text(UNKEYED)
    ran = cli.run("run", "unkeyed.py")
    assert ran.returncode == 0, ran.stderr
    assert sorted(line for line in ran.stdout.splitlines() if line.startswith(("odd:", "even:"))) == [
        "even:(0, 0)", "even:(2, 2000)", "even:(4, 4000)", "odd:1", "odd:3", "odd:5"]


TTL = '''\
import time

from pyflink.common import Time, Types
from pyflink.datastream import KeyedProcessFunction, RuntimeContext, StreamExecutionEnvironment
from pyflink.datastream.state import StateTtlConfig, ValueStateDescriptor


def pause(value):
    time.sleep(value[1] / 1000)  # (the element's delay: processing time passes between elements)
    return value


class Remember(KeyedProcessFunction):
    """Each element says what its key's previous element was, if that is under 1.5 s old."""

    def open(self, runtime_context: RuntimeContext):
        ttl = StateTtlConfig.new_builder(Time.milliseconds(1500)) \
            .set_update_type(StateTtlConfig.UpdateType.OnCreateAndWrite) \
            .set_state_visibility(StateTtlConfig.StateVisibility.NeverReturnExpired).build()
        descriptor = ValueStateDescriptor("previous", Types.STRING())
        descriptor.enable_time_to_live(ttl)
        self.previous = runtime_context.get_state(descriptor)

    def process_element(self, value, ctx):
        yield value[2], self.previous.value()
        self.previous.update(value[2])


env = StreamExecutionEnvironment.get_execution_environment()
env.set_parallelism(1)
tt = Types.TUPLE([Types.STRING(), Types.INT(), Types.STRING()])
events = [("a", 0, "a1"), ("a", 0, "a2"), ("a", 3000, "a3"), ("a", 0, "a4")]
out = env.from_collection(events, type_info=tt).map(pause, output_type=tt).key_by(lambda e: e[0]) \
    .process(Remember(), output_type=Types.TUPLE([Types.STRING(), Types.STRING()]))
print("seen", list(out.execute_and_collect()))
'''


def test_pyflink_state_time_to_live(cli: Any, tmp_path: Path) -> None:
    """A value state with a 1.5 s time-to-live (never returning expired values): read right after
    it was written it is there; 3 s later it is gone."""
    (tmp_path / "ttl.py").write_text(TTL)
    ran = cli.run("run", "-D", "execution.batch-size=1", "-D", "execution.buffer-timeout=0ms", "ttl.py")
    assert ran.returncode == 0, ran.stderr
    [seen] = [ast.literal_eval(line.split(" ", 1)[1]) for line in ran.stdout.splitlines() if line.startswith("seen ")]
    assert seen == [("a1", None), ("a2", "a1"), ("a3", None), ("a4", "a3")]


COUNT_WINDOWS = '''\
from pyflink.common import Types
from pyflink.datastream import ProcessWindowFunction, StreamExecutionEnvironment
from pyflink.datastream.window import CountTumblingWindowAssigner


class Span(ProcessWindowFunction):
    def process(self, key, context, elements):
        yield key, context.window().id, [e[1] for e in elements]


env = StreamExecutionEnvironment.get_execution_environment()
env.set_parallelism(1)  # (one source subtask: each key's elements in order)
tt = Types.TUPLE([Types.STRING(), Types.INT()])
data = [("a", i) for i in range(1, 8)] + [("b", i) for i in range(10, 13)]
ds = env.from_collection(data, type_info=tt)
print("tumbling", sorted(ds.key_by(lambda e: e[0]).count_window(3)
                         .reduce(lambda x, y: (x[0], x[1] + y[1])).execute_and_collect()))
print("sliding", sorted(ds.key_by(lambda e: e[0]).count_window(3, 2).process(Span()).execute_and_collect()))
print("assigner", sorted(ds.key_by(lambda e: e[0]).window(CountTumblingWindowAssigner.of(2))
                         .reduce(lambda x, y: (x[0], max(x[1], y[1]))).execute_and_collect()))
'''


def test_pyflink_count_windows_run_unchanged(cli: Any, tmp_path: Path) -> None:
    """count_window(3) with reduce; count_window(3, 2) with a ProcessWindowFunction (every 2
    elements, the last 3; context.window().id); window(CountTumblingWindowAssigner.of(2))."""
    (tmp_path / "count.py").write_text(COUNT_WINDOWS)
    ran = cli.run("run", "count.py")
    assert ran.returncode == 0, ran.stderr
    out = {line.split(" ", 1)[0]: ast.literal_eval(line.split(" ", 1)[1]) for line in ran.stdout.splitlines()
           if line.split(" ", 1)[0] in ("tumbling", "sliding", "assigner")}
    assert out == {"tumbling": [("a", 6), ("a", 15), ("b", 33)],  # (a's 7th is in no full window)
                   "sliding": [("a", 0, [1, 2]), ("a", 1, [2, 3, 4]), ("a", 2, [4, 5, 6]), ("b", 0, [10, 11])],
                   "assigner": [("a", 2), ("a", 4), ("a", 6), ("b", 11)]}


JSON_PARTITIONERS = '''\
import json
import sys

from pyflink.common import Types, WatermarkStrategy
from pyflink.datastream import MapFunction, RuntimeContext, StreamExecutionEnvironment
from pyflink.datastream.connectors.file_system import FileSource, StreamFormat


class Where(MapFunction):
    """The element with the index of the subtask that saw it."""

    def open(self, runtime_context: RuntimeContext):
        self.index = runtime_context.get_index_of_this_subtask()

    def map(self, value):
        return value[0], value[1], self.index


def parse(line):
    record = json.loads(line)
    return record["user"], record["amount"]


env = StreamExecutionEnvironment.get_execution_environment()
env.set_parallelism(2)
pair = Types.TUPLE([Types.STRING(), Types.INT()])
seen = Types.TUPLE([Types.STRING(), Types.INT(), Types.INT()])
records = env.from_source(FileSource.for_record_stream_format(StreamFormat.text_line_format(), sys.argv[1]).build(),
                          WatermarkStrategy.no_watermarks(), "json lines") \
    .filter(lambda line: line.strip() and not line.startswith("#")) \
    .map(parse, output_type=pair)
outs = {
    "shuffle": records.shuffle().map(Where(), output_type=seen).set_parallelism(3),
    "rebalance": records.rebalance().map(Where(), output_type=seen).set_parallelism(3),
    "rescale": records.rescale().map(Where(), output_type=seen).set_parallelism(4),
    "global": records.global_().map(Where(), output_type=seen).set_parallelism(3),
    "forward": records.forward().map(Where(), output_type=seen),
    "broadcast": records.broadcast().map(Where(), output_type=seen).set_parallelism(3),
}
for name, ds in outs.items():
    ds.print(name)
env.execute("json and partitioners")
'''


def test_a_pyflink_json_job_through_each_partitioner(cli: Any, tmp_path: Path) -> None:
    """JSON lines from files (a comment and a blank line filtered out), parsed to typed tuples,
    then through each of PyFlink's partitioners to a map that records its subtask: every record
    once (three times broadcast, once per subtask), where each partitioner sends it."""
    import json

    src = tmp_path / "in"
    src.mkdir()
    records = [{"user": f"u{i % 7}", "amount": i} for i in range(300)]
    (src / "a.json").write_text("# users and amounts\n\n" + "".join(json.dumps(r) + "\n" for r in records[:150]))
    (src / "b.json").write_text("".join(json.dumps(r) + "\n" for r in records[150:]))
    (tmp_path / "job.py").write_text(JSON_PARTITIONERS)
    ran = cli.run("run", "job.py", str(src))
    assert ran.returncode == 0, ran.stderr
    got: dict[str, list[tuple[str, int, int]]] = collections.defaultdict(list)
    for line in ran.stdout.splitlines():
        name, sep, value = line.partition(":")
        if sep and name in ("shuffle", "rebalance", "rescale", "global", "forward", "broadcast"):
            got[name].append(ast.literal_eval(value))
    expected = sorted((r["user"], r["amount"]) for r in records)
    for name, rows in got.items():
        copies = 3 if name == "broadcast" else 1
        assert sorted((u, a) for u, a, _ in rows) == sorted(expected * copies), name
    assert {i for _, _, i in got["global"]} == {0}
    assert len({i for _, _, i in got["shuffle"]}) == 3  # (per record; rebalance deals whole batches)
    assert {i for _, _, i in got["rescale"]} <= {0, 1, 2, 3}
    for user, amount in expected:
        assert sorted(i for u, a, i in got["broadcast"] if (u, a) == (user, amount)) == [0, 1, 2]


FUSED = '''\
from pyflink.common import Types
from pyflink.datastream import StreamExecutionEnvironment

env = StreamExecutionEnvironment.get_execution_environment()
env.set_parallelism(2)
words = env.from_collection(["a b", "c d e", "f"], type_info=Types.STRING()).flat_map(lambda line: line.split())
upper = words.map(lambda w: w.upper())            # fused with the flat_map ...
both = words.map(lambda w: w + w).filter(lambda w: w != "cc")  # ... and the flat_map read again here
named = upper.map(lambda w: "<" + w + ">").name("angles")
upper.print("upper")
both.print("both")
named.print("named")
print("operators", sorted(t.operator.name for t in env._env.transformations if t.operator is not None))
env.execute()
print("after", sorted(t.operator.name for t in env._env.transformations if t.operator is not None))
'''


def test_consecutive_pyflink_functions_run_fused_and_a_stream_read_twice_stays_right(cli: Any, tmp_path: Path) -> None:
    """A flat_map then a map run as one operator (the elements go from one function to the next
    without Arrow between them), also when the flat_map's stream is read by another branch
    (which gets its own fused operator), and a fused operator can still be named."""
    (tmp_path / "fuse.py").write_text(FUSED)
    ran = cli.run("run", "fuse.py")
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    got = collections.defaultdict(list)
    for line in lines:
        name, sep, value = line.partition(":")
        if sep and name in ("upper", "both", "named"):
            got[name].append(value)
    assert {k: sorted(v) for k, v in got.items()} == {
        "upper": list("ABCDEF"), "both": ["aa", "bb", "dd", "ee", "ff"], "named": [f"<{c}>" for c in "ABCDEF"]}
    [after] = [ast.literal_eval(line.split(" ", 1)[1]) for line in lines if line.startswith("after ")]
    assert "FlatMap" not in after  # (the flat_map alone ran nowhere: every reader of it has it fused)
    assert after.count("FlatMap -> Map") == 1 and "FlatMap -> Map -> Filter" in after and "angles" in after


PROCESSING_TIME = '''\
import time

from pyflink.common import Time, Types
from pyflink.datastream import ProcessWindowFunction, StreamExecutionEnvironment
from pyflink.datastream.window import TumblingProcessingTimeWindows


def slowly(value):
    time.sleep(0.05)  # (20 elements a second: the elements span several 1 s windows)
    return value


class Count(ProcessWindowFunction):
    def process(self, key, context, elements):
        yield key, context.window().start, len(list(elements))


env = StreamExecutionEnvironment.get_execution_environment()
env.set_parallelism(1)
tt = Types.TUPLE([Types.STRING(), Types.INT()])
ds = env.from_collection([("k" + str(i % 3), i) for i in range(60)], type_info=tt).map(slowly, output_type=tt)
counts = ds.key_by(lambda e: e[0]).window(TumblingProcessingTimeWindows.of(Time.seconds(1))).process(Count())
print("windows", sorted(counts.execute_and_collect()))
'''


def test_pyflink_processing_time_windows_count_every_element_once(cli: Any, tmp_path: Path) -> None:
    """1 s processing-time windows over elements arriving 20 a second for 3 s: windows are whole
    seconds, each element is in exactly one of its key's windows, and they span several."""
    (tmp_path / "ptime.py").write_text(PROCESSING_TIME)
    ran = cli.run("run", "-D", "execution.batch-size=1", "-D", "execution.buffer-timeout=0ms", "ptime.py")
    assert ran.returncode == 0, ran.stderr
    [windows] = [ast.literal_eval(line.split(" ", 1)[1]) for line in ran.stdout.splitlines()
                 if line.startswith("windows ")]
    assert all(start % 1000 == 0 for _, start, _ in windows)
    per_key = collections.Counter()
    for key, _, n in windows:
        per_key[key] += n
    assert per_key == {"k0": 20, "k1": 20, "k2": 20}
    assert len({start for _, start, _ in windows}) >= 2


DYNAMIC_GAP = '''\
from pyflink.common import Types, WatermarkStrategy
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import StreamExecutionEnvironment
from pyflink.datastream.window import EventTimeSessionWindows, SessionWindowTimeGapExtractor


class At(TimestampAssigner):
    def extract_timestamp(self, value, record_timestamp):
        return value[2]


class GapOf(SessionWindowTimeGapExtractor):
    """A "slow" user waits up to 10 s between clicks in a session, others 2 s."""

    def extract(self, element):
        return 10_000 if element[0] == "slow" else 2_000


env = StreamExecutionEnvironment.get_execution_environment()
env.set_parallelism(2)
tt = Types.TUPLE([Types.STRING(), Types.INT(), Types.LONG()])
clicks = [("slow", 1, 0), ("slow", 1, 6000), ("slow", 1, 30000), ("fast", 1, 0), ("fast", 1, 1500),
          ("fast", 1, 6000)]
sessions = env.from_collection(clicks, type_info=tt) \
    .assign_timestamps_and_watermarks(WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(At())) \
    .key_by(lambda c: c[0]).window(EventTimeSessionWindows.with_dynamic_gap(GapOf())) \
    .reduce(lambda a, b: (a[0], a[1] + b[1], max(a[2], b[2])))
print("sessions", sorted(sessions.execute_and_collect()))
'''


def test_pyflink_session_windows_with_a_dynamic_gap(cli: Any, tmp_path: Path) -> None:
    """EventTimeSessionWindows.with_dynamic_gap: each element's own gap (10 s for one key, 2 s for
    the other) decides which elements share a session."""
    (tmp_path / "dyn.py").write_text(DYNAMIC_GAP)
    ran = cli.run("run", "dyn.py")
    assert ran.returncode == 0, ran.stderr
    [sessions] = [ast.literal_eval(line.split(" ", 1)[1]) for line in ran.stdout.splitlines()
                  if line.startswith("sessions ")]
    assert sessions == [("fast", 1, 6000), ("fast", 2, 1500), ("slow", 1, 30000), ("slow", 2, 6000)]


def test_what_yarnflow_cannot_run_yet_is_named(cli: Any, tmp_path: Path) -> None:
    (tmp_path / "table.py").write_text("from pyflink.table import TableEnvironment\n")
    ran = cli.run("run", "table.py")
    assert ran.returncode == 1
    assert "PyFlink's Table API and SQL (pyflink.table) are not supported by yarnflow" in ran.stderr
    (tmp_path / "windows.py").write_text(textwrap.dedent("""\
        from pyflink.common import Time
        from pyflink.datastream import StreamExecutionEnvironment
        from pyflink.datastream.window import TumblingProcessingTimeWindows
        env = StreamExecutionEnvironment.get_execution_environment()
        from pyflink.datastream.window import CountTrigger, ProcessingTimeTrigger
        windowed = env.from_collection([1, 2]).key_by(lambda v: v) \\
            .window(TumblingProcessingTimeWindows.of(Time.seconds(1)))
        windowed.trigger(ProcessingTimeTrigger.create())  # (its own default: accepted)
        windowed.trigger(CountTrigger.of(5))
        """))
    ran = cli.run("run", "windows.py")
    assert ran.returncode == 1
    assert "window trigger CountTrigger is not supported yet by yarnflow's PyFlink layer" in ran.stderr
