"""The pipeline API: an environment, streams and keyed streams, as in Flink's DataStream API,
vectorised over Arrow record batches.

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    lines = env.read_text("s3://bucket/logs/")
    words = lines.flat_map(lambda row: ({"word": w, "count": 1} for w in row["line"].split()))
    words.key_by("word").sum("count").sink_to_parquet("hdfs:///out/wordcount")
    env.execute("wordcount")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import pyarrow as pa

from yarnflow.common.errors import JobDefinitionError, JobFailedError
from yarnflow.common.states import Partitioner
from yarnflow.worker.operators.base import Operator
from yarnflow.worker.operators.keyed import KeyedAggregate, KeyedReduce
from yarnflow.common.api import AggregateFunction, KeyedProcessFunction, WatermarkStrategy
from yarnflow.worker.operators.sinks import CollectSink, CsvSink, ParquetSink, TextSink
from yarnflow.worker.operators.timestamps import TimestampsAndWatermarks
from yarnflow.worker.operators.transforms import MapBatches, RowFilter, RowFlatMap, RowMap

from yarnflow.env_sources import SourceMethods, qualified
from yarnflow.joins import JoinedStreams
from yarnflow.pipeline import Input, Transformation, next_id

if TYPE_CHECKING:
    from yarnflow.executors import JobExecutionResult

__all__ = ["StreamExecutionEnvironment", "DataStream", "KeyedStream", "WindowedStream", "JoinedStreams", "Input",
           "Transformation"]

class StreamExecutionEnvironment(SourceMethods):
    """Where a pipeline is built and from where it is executed."""

    def __init__(self, parallelism: int | None = None, max_parallelism: int | None = None,
                 runtime_mode: str | None = None) -> None:
        from yarnflow import executors

        ctx = executors.current_context()
        for label, value in (("parallelism", parallelism), ("max_parallelism", max_parallelism)):
            if value is not None and value < 1:
                raise JobDefinitionError(f"{label} must be at least 1, not {value}")
        self.parallelism = parallelism or ctx.default_parallelism
        self.max_parallelism = max_parallelism or ctx.max_parallelism
        self.runtime_mode = "AUTOMATIC"
        self.set_runtime_mode(runtime_mode or ctx.runtime_mode)
        self.transformations: list[Transformation] = []
        self.executed = False
        #: the configuration the job is submitted with (``yarnflow run -D``, the execution
        #: context's), which the compiler reads
        self.conf: dict[str, str] = dict(getattr(ctx, "conf", {}) or {})

    @staticmethod
    def get_execution_environment() -> StreamExecutionEnvironment:
        return StreamExecutionEnvironment()

    def set_parallelism(self, parallelism: int) -> StreamExecutionEnvironment:
        if parallelism < 1:
            raise JobDefinitionError("parallelism must be at least 1")
        self.parallelism = parallelism
        return self

    def set_max_parallelism(self, max_parallelism: int) -> StreamExecutionEnvironment:
        self.max_parallelism = max_parallelism
        return self

    def set_runtime_mode(self, mode: str) -> StreamExecutionEnvironment:
        if mode.upper() not in ("STREAMING", "BATCH", "AUTOMATIC"):
            raise JobDefinitionError(f"runtime mode must be STREAMING, BATCH or AUTOMATIC, not {mode!r}")
        self.runtime_mode = mode.upper()
        return self

    # -- the job's configuration from its code (job_config.py): it wins over -D and the file
    def enable_checkpointing(self, interval_ms: Any, mode: Any = None) -> StreamExecutionEnvironment:
        """Checkpoint every ``interval_ms`` ms (``mode``: EXACTLY_ONCE, the default, or AT_LEAST_ONCE)."""
        config = self.get_checkpoint_config().set_checkpoint_interval(interval_ms)
        if mode is not None:
            config.set_checkpointing_mode(mode)
        return self

    def get_checkpoint_config(self) -> Any:
        """The job's checkpointing (``CheckpointConfig``: Flink's setters and getters)."""
        from yarnflow.job_config import CheckpointConfig

        return CheckpointConfig(self.conf)

    def get_checkpoint_interval(self) -> int:
        return int(self.get_checkpoint_config().get_checkpoint_interval())

    def set_state_backend(self, backend: Any) -> StreamExecutionEnvironment:
        """``HashMapStateBackend()`` or ``EmbeddedRocksDBStateBackend(enable_incremental_checkpointing)``."""
        if not callable(getattr(backend, "configure", None)):
            raise JobDefinitionError(f"set_state_backend takes HashMapStateBackend() or EmbeddedRocksDBStateBackend(), "
                                     f"not {backend!r}")
        backend.configure(self.conf)
        return self

    def set_restart_strategy(self, strategy: Any) -> StreamExecutionEnvironment:
        """A strategy from ``RestartStrategies`` (no_restart, fixed_delay_restart, ...)."""
        from yarnflow.job_config import RestartStrategyConfiguration

        if not isinstance(strategy, RestartStrategyConfiguration):
            raise JobDefinitionError(f"set_restart_strategy takes one of RestartStrategies' strategies, not {strategy!r}")
        strategy.configure(self.conf)
        return self

    def _add(self, t: Transformation) -> Transformation:
        self.transformations.append(t)
        return t

    def _source(self, op: Operator, event_time_column: str | None = None) -> DataStream:
        return DataStream(self, self._add(Transformation(op, [], event_time_column=event_time_column)))

    # -- Spark stages -----------------------------------------------------------------------
    def spark_sql(self, query: str, name: str = "spark_sql", **inputs: DataStream) -> DataStream:
        """Run ``query`` on Spark with each named input as a temporary view:
        ``env.spark_sql("SELECT ... FROM orders JOIN customers USING (customer_id)",
        orders=orders, customers=customers)``. The result is a stream the pipeline continues
        from. In a STREAMING job (checkpoints on) the stage runs once per completed checkpoint
        over the rows that checkpoint covers (a micro-batch), exactly once."""
        if not inputs:
            raise JobDefinitionError(f"spark_sql '{name}' needs its inputs as keyword arguments, e.g. "
                                     "orders=stream")
        return _spark_stage(self, inputs, None, query, name)

    # -- execution --------------------------------------------------------------------------
    def execute(self, job_name: str = "yarnflow job") -> JobExecutionResult:
        """Compile the pipeline, run it on the cluster of the current context (the CLI's, or an
        embedded local cluster started for this call) and wait for it to end.

        Raises ``JobFailedError`` (with the root cause) when the job fails."""
        from yarnflow import executors

        self.executed = True
        try:
            return executors.current_context().execute(self, job_name)
        except JobFailedError:
            executors.show_job_failures_briefly()  # (if nobody catches it: the user's frames, not ours)
            raise


class DataStream:
    def __init__(self, env: StreamExecutionEnvironment, transformation: Transformation) -> None:
        self.env = env
        self.transformation = transformation

    _partitioner = Partitioner.FORWARD
    _keys: tuple[str, ...] = ()
    _tag = ""
    _forward_only = False

    def _then(self, op: Operator, event_time_column: str | None = "") -> DataStream:
        up = self.transformation
        ordered = up.ordered and self._partitioner == Partitioner.FORWARD and not self._tag
        t = Transformation(op, [Input(up, self._partitioner, self._keys, self._tag,
                                      forward_only=self._forward_only)],
                           slot_sharing_group=up.slot_sharing_group, parallelism=1 if ordered else None,
                           ordered=ordered,
                           event_time_column=up.event_time_column if event_time_column == "" else event_time_column)
        return DataStream(self.env, self.env._add(t))

    def _stream(self, t: Transformation) -> DataStream:
        """A new stream of this environment, from ``t`` (added to the job)."""
        return DataStream(self.env, self.env._add(t))

    def _operator(self) -> Operator:
        op = self.transformation.operator
        if op is None:
            raise JobDefinitionError("a union has no operator of its own to name or configure")
        return op

    # -- naming and parallelism -------------------------------------------------------------
    def name(self, name: str) -> DataStream:
        self._operator().name = name
        return self

    def uid(self, uid: str) -> DataStream:
        """The operator's id in checkpoints and savepoints: state is restored to the operator
        with the same uid. Without one, the compiler derives a uid from the operator and its
        inputs, which changes when the pipeline before it changes."""
        if not uid or not isinstance(uid, str):
            raise JobDefinitionError("uid must be a non-empty string")
        op = self._operator()
        op.uid = uid
        op.user_uid = True  # type: ignore[attr-defined]
        return self

    def set_parallelism(self, parallelism: int) -> DataStream:
        if parallelism < 1:
            raise JobDefinitionError("parallelism must be at least 1")
        self.transformation.parallelism = parallelism
        return self

    def set_resources(self, cpu_cores: float = 0.0, memory_mb: int = 0) -> DataStream:
        """What one subtask of this operator needs; a slot must offer at least the sum of what
        the subtasks sharing it need (0: unspecified). A request no slot can meet waits until
        slot.request.timeout."""
        if cpu_cores < 0 or memory_mb < 0:
            raise JobDefinitionError("resources cannot be negative")
        self.transformation.cpu_cores, self.transformation.memory_mb = cpu_cores, memory_mb
        return self

    def slot_sharing_group(self, name: str) -> DataStream:
        self.transformation.slot_sharing_group = name
        return self

    def disable_chaining(self) -> DataStream:
        self.transformation.chaining = False
        return self

    # -- transformations --------------------------------------------------------------------
    def map_batches(self, fn: Callable[[pa.RecordBatch], Any], name: str | None = None) -> DataStream:
        """The fast path: ``fn`` takes a RecordBatch and returns a RecordBatch or Table."""
        return self._then(MapBatches(fn, name))

    def map(self, fn: Callable[[dict[str, Any]], Any], name: str | None = None) -> DataStream:
        """Per row: ``fn(row_dict)`` returns a dict (or a scalar, kept in column 'value')."""
        return self._then(RowMap(fn, name))

    def filter(self, fn: Callable[[dict[str, Any]], Any], name: str | None = None) -> DataStream:
        return self._then(RowFilter(fn, name))

    def flat_map(self, fn: Callable[[dict[str, Any]], Iterable[Any]], name: str | None = None) -> DataStream:
        return self._then(RowFlatMap(fn, name))

    def key_by(self, *columns: str) -> KeyedStream:
        if not columns or not all(isinstance(c, str) and c for c in columns):
            raise JobDefinitionError("key_by needs one or more column names")
        return KeyedStream(self, tuple(columns))

    def rebalance(self) -> DataStream:
        """Deal batches round-robin to the next operator's subtasks."""
        return _PartitionedStream(self, Partitioner.REBALANCE)

    def shuffle(self) -> DataStream:
        """Send each row to a subtask of the next operator picked at random."""
        return _PartitionedStream(self, Partitioner.SHUFFLE)

    def rescale(self) -> DataStream:
        """Deal batches round-robin to a subset of the next operator's subtasks (each subtask
        here feeds its share of them: 2 -> 4, subtask 0 feeds 0 and 1), as Flink's rescale."""
        return _PartitionedStream(self, Partitioner.RESCALE)

    def global_(self) -> DataStream:
        """Send every row to subtask 0 of the next operator (``global`` is a Python keyword)."""
        return _PartitionedStream(self, Partitioner.GLOBAL)

    def forward(self) -> DataStream:
        """Each subtask feeds the next operator's subtask of its own index (chained when it can
        be); both operators must have the same parallelism (a JobDefinitionError otherwise)."""
        stream = _PartitionedStream(self, Partitioner.FORWARD)
        stream._forward_only = True
        return stream

    def partition_custom(self, partitioner: Any, key_selector: Callable[[dict[str, Any]], Any]) -> DataStream:
        """Send each row to the subtask ``partitioner.partition(key_selector(row), n)`` of the
        next operator (``n`` its parallelism; ``partitioner`` may be a function of (key, n))."""
        from yarnflow.worker.operators.transforms import CustomPartition

        if not callable(getattr(partitioner, "partition", partitioner)) or not callable(key_selector):
            raise JobDefinitionError("partition_custom needs a partitioner (partition(key, n), or a function of "
                                     "(key, n)) and a key selector (a function of the row)")
        return _PartitionedStream(self._then(CustomPartition(partitioner, key_selector)), Partitioner.CUSTOM)

    def broadcast(self, *descriptors: Any) -> Any:
        """Send every batch to every subtask of the next operator. With broadcast state
        descriptors (``MapStateDescriptor``), a BroadcastStream to ``connect`` a stream to (the
        broadcast state pattern)."""
        if descriptors:
            from yarnflow.connected import BroadcastStream

            return BroadcastStream(self, descriptors)
        return _PartitionedStream(self, Partitioner.BROADCAST)

    def connect(self, other: Any) -> Any:
        """Connect ``other`` (a stream, or a BroadcastStream) to this one: ConnectedStreams
        (``map``, ``flat_map``, ``process``, ``key_by``) or a BroadcastConnectedStream."""
        from yarnflow.connected import BroadcastConnectedStream, BroadcastStream, ConnectedStreams

        if isinstance(other, BroadcastStream):
            return BroadcastConnectedStream(self, other)
        if not isinstance(other, DataStream):
            raise JobDefinitionError(f"connect needs a stream or a broadcast stream, got {other!r}")
        return ConnectedStreams(self, other)

    def union(self, *others: DataStream) -> DataStream:
        """One stream of this stream's rows and the others' (they must share a schema)."""
        if not others:
            raise JobDefinitionError("union needs at least one other stream")
        streams = [self, *others]
        for s in streams:
            if s.env is not self.env:
                raise JobDefinitionError("union of streams from different environments")
        t = Transformation(None, [Input(s.transformation, s._partitioner, s._keys, s._tag) for s in streams],
                           event_time_column=self.transformation.event_time_column)
        return DataStream(self.env, self.env._add(t))

    def process(self, fn: Any, name: str | None = None) -> DataStream:
        """Run a ``ProcessFunction`` per row of a stream that is not keyed (event time, side
        outputs, the clocks; no keyed state or timers: key_by(...).process for those)."""
        from yarnflow.worker.operators.process import ProcessOperator

        return self._then(ProcessOperator(fn, self.transformation.event_time_column, name=name or type(fn).__name__))

    def assign_timestamps_and_watermarks(self, strategy: WatermarkStrategy) -> DataStream:
        """Event time from ``strategy``'s column; watermarks as the strategy says."""
        return self._then(TimestampsAndWatermarks(strategy), event_time_column=strategy.timestamp_column)

    def get_side_output(self, tag: str) -> DataStream:
        """The rows this operator sent to side output ``tag`` (e.g. late window data)."""
        side = DataStream(self.env, self.transformation)
        side._tag = tag
        return side

    def sort_by(self, *columns: str, ascending: bool | Sequence[bool] = True, limit: int | None = None,
                name: str = "sort") -> DataStream:
        """The rows sorted by ``columns`` (BATCH jobs), nulls last; with ``limit``, the first
        ``limit`` rows only (top-N: each upstream subtask keeps its own best ``limit`` rows, so
        little crosses the exchange). The sort runs at parallelism 1 in managed memory, spilling
        sorted runs to disk when its input does not fit; what follows it by a forward edge keeps
        the order and runs at parallelism 1 too, unless given another parallelism."""
        from yarnflow.worker.operators.batch.sort import SortOperator, sort_keys

        op = SortOperator(sort_keys(columns, ascending), limit=limit, name=name)
        up = self.transformation
        t = Transformation(op, [Input(up, Partitioner.REBALANCE, (), self._tag)], parallelism=1, max_parallelism=1,
                           slot_sharing_group=up.slot_sharing_group, ordered=True,
                           event_time_column=up.event_time_column)
        return DataStream(self.env, self.env._add(t))

    order_by = sort_by

    def join(self, other: DataStream, how: str = "inner") -> JoinedStreams:
        """``a.join(b).where("k").equal_to("k").apply()``: without a window, a join of two bounded
        streams (BATCH jobs; ``how``: ``inner``, ``left_outer``, ``right_outer``, ``full_outer``,
        ``left_semi`` / ``semi`` or ``left_anti`` / ``anti``) in managed memory, spilling to disk
        when its build side does not fit; ``.with_hint("broadcast" | "shuffle_hash" |
        "sort_merge")`` picks the strategy. With ``.window(assigner)`` before ``apply``, a window
        join (inner) in event time."""
        return JoinedStreams(self, other, how)

    def spark(self, fn: Callable[[Any], Any], name: str = "spark") -> DataStream:
        """Run ``fn`` (a Spark DataFrame -> a Spark DataFrame) on Spark over this stream's rows;
        the result is a stream the pipeline continues from. The stage is driven from a
        TaskExecutor slot; in a STREAMING job (checkpoints on) it runs once per completed
        checkpoint over the rows that checkpoint covers."""
        if not callable(fn):
            raise JobDefinitionError(f"spark '{name}': fn must be a function from a Spark DataFrame to one")
        return _spark_stage(self.env, {"input": self}, fn, None, name)

    # -- sinks ------------------------------------------------------------------------------
    def sink_to_parquet(self, path: str, name: str = "parquet_sink", roll_size_bytes: int | None = None
                        ) -> DataStream:
        """Write Parquet files into the folder ``path`` on any fsspec filesystem: one file set
        per subtask, a new file after ``roll_size_bytes``; each file appears under its final
        name only once complete."""
        return self._then(ParquetSink(qualified(path), name, roll_size_bytes=roll_size_bytes))

    def sink_to_csv(self, path: str, name: str = "csv_sink", roll_size_bytes: int | None = None) -> DataStream:
        """Like ``sink_to_parquet``, as CSV files with a header."""
        return self._then(CsvSink(qualified(path), name, roll_size_bytes=roll_size_bytes))

    def sink_to_text(self, path: str, name: str = "text_sink", roll_size_bytes: int | None = None,
                     suffix: str = "") -> DataStream:
        """Like ``sink_to_parquet``, as text files: one line per row of the stream's one column."""
        return self._then(TextSink(qualified(path), name, roll_size_bytes=roll_size_bytes, suffix=suffix))

    def sink_to(self, sink: Any, name: str | None = None) -> DataStream:
        """Write to a connector's sink (``yarnflow.kafka.KafkaSink``), as Flink's ``sink_to``."""
        create = getattr(sink, "create_operator", None)
        if create is None:
            raise JobDefinitionError(f"sink_to: {type(sink).__name__} is not a connector sink (such as "
                                     "yarnflow.kafka.KafkaSink)")
        return self._then(create(name or "kafka_sink"))

    def print(self, name: str = "print") -> DataStream:
        """Print the rows on the client's stdout once the job has finished."""
        return self._then(CollectSink(f"print-{next_id()}", print_rows=True, name=name))

    def collect(self, name: str = "collect") -> DataStream:
        """Hand the rows to the client: ``env.execute(...).collected()`` returns them."""
        return self._then(CollectSink(f"collect-{next_id()}", name=name))


class _PartitionedStream(DataStream):
    """A stream whose next operator reads it through a given partitioner."""

    def __init__(self, upstream: DataStream, partitioner: Partitioner, keys: tuple[str, ...] = ()) -> None:
        super().__init__(upstream.env, upstream.transformation)
        self._partitioner = partitioner
        self._keys = keys
        self._tag = upstream._tag


class KeyedStream(_PartitionedStream):
    """A stream hash-partitioned by key columns: every row of one key goes to one subtask."""

    def __init__(self, upstream: DataStream, keys: tuple[str, ...]) -> None:
        super().__init__(upstream, Partitioner.HASH, keys)
        self.keys = keys

    def _agg(self, fn: str, column: str, name: str | None) -> DataStream:
        return self._then(KeyedAggregate(self.keys, [(column, fn)], name or f"{fn}({column})"))

    def sum(self, column: str, name: str | None = None) -> DataStream:
        return self._agg("sum", column, name)

    def min(self, column: str, name: str | None = None) -> DataStream:
        return self._agg("min", column, name)

    def max(self, column: str, name: str | None = None) -> DataStream:
        return self._agg("max", column, name)

    def count(self, name: str | None = None) -> DataStream:
        return self._agg("count", self.keys[0], name or "count")

    def reduce(self, fn: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]],
               name: str | None = None) -> DataStream:
        """``fn(accumulated_row, new_row) -> row`` per key."""
        return self._then(KeyedReduce(self.keys, fn, name or "reduce"))

    def aggregate(self, fn: AggregateFunction[Any], name: str | None = None) -> DataStream:
        """Aggregate each key's rows with a user ``AggregateFunction``."""
        from yarnflow.worker.operators.process import KeyedAggregateFunctionOperator

        return self._then(KeyedAggregateFunctionOperator(list(self.keys), fn, name=name or type(fn).__name__))

    def process(self, fn: KeyedProcessFunction, name: str | None = None) -> DataStream:
        """Run a ``KeyedProcessFunction`` (keyed state, timers, side outputs) per row."""
        from yarnflow.worker.operators.process import KeyedProcessOperator

        return self._then(KeyedProcessOperator(list(self.keys), fn, self.transformation.event_time_column,
                                               name=name or type(fn).__name__))

    def window(self, assigner: Any) -> WindowedStream:
        """Group each key's rows into windows (tumbling, sliding, session; event or processing time)."""
        return WindowedStream(self, assigner)

    def interval_join(self, other: KeyedStream) -> Any:
        """Join with another keyed stream on event-time intervals: ``.between(lo, hi).process()``."""
        from yarnflow.connected import IntervalJoin

        return IntervalJoin(self, other)


class WindowedStream:
    """``key_by(...).window(assigner)``, then an aggregation."""

    def __init__(self, keyed: KeyedStream, assigner: Any) -> None:
        self._keyed = keyed
        self._assigner = assigner
        self._lateness = 0
        self._late_tag: str | None = None
        self._time_column: str | None = keyed.transformation.event_time_column
        if getattr(assigner, "is_event_time", False) and not self._time_column:
            raise JobDefinitionError(
                "event-time windows need event time: call assign_timestamps_and_watermarks(...) upstream "
                "(or .time_column(name) on the windowed stream)")

    def time_column(self, column: str) -> WindowedStream:
        self._time_column = column
        return self

    def allowed_lateness(self, ms: int) -> WindowedStream:
        if ms < 0:
            raise JobDefinitionError("allowed lateness cannot be negative")
        self._lateness = ms
        return self

    def side_output_late_data(self, tag: str) -> WindowedStream:
        """Send records too late for their window to the side output ``tag``."""
        self._late_tag = tag
        return self

    def _op(self, name: str, **kw: Any) -> DataStream:
        from yarnflow.worker.operators.windows import WindowAggregateOperator

        op = WindowAggregateOperator(list(self._keyed.keys), self._assigner, self._time_column,
                                     allowed_lateness_ms=self._lateness, late_tag=self._late_tag, name=name, **kw)
        return self._keyed._then(op)

    def sum(self, column: str, name: str | None = None) -> DataStream:
        return self._op(name or f"window sum({column})", aggs=[(column, "sum")])

    def min(self, column: str, name: str | None = None) -> DataStream:
        return self._op(name or f"window min({column})", aggs=[(column, "min")])

    def max(self, column: str, name: str | None = None) -> DataStream:
        return self._op(name or f"window max({column})", aggs=[(column, "max")])

    def mean(self, column: str, name: str | None = None) -> DataStream:
        return self._op(name or f"window mean({column})", aggs=[(column, "mean")])

    def count(self, name: str | None = None) -> DataStream:
        return self._op(name or "window count", aggs=[(self._keyed.keys[0], "count")])

    def aggregate(self, fn: AggregateFunction[Any], name: str | None = None) -> DataStream:
        return self._op(name or f"window {type(fn).__name__}", aggregate_function=fn)

    def reduce(self, fn: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]],
               name: str | None = None) -> DataStream:
        return self._op(name or "window reduce", reduce_fn=fn)


def _spark_stage(env: StreamExecutionEnvironment, inputs: dict[str, DataStream], fn: Callable[[Any], Any] | None,
                 query: str | None, name: str) -> DataStream:
    """A Spark stage (parallelism 1, declaring the Spark driver's memory) fed by a writer of
    Parquet files chained onto each input, and, after it, the reader of its output files: the
    stream the pipeline continues from."""
    from yarnflow.worker.operators.spark import ParquetFilesReader, SparkStage, SparkStageInput
    from yarnflow.worker.spark import DEFAULTS, memory_mb

    for view, stream in inputs.items():
        if stream.env is not env:
            raise JobDefinitionError(f"Spark stage '{name}': input {view!r} comes from another environment")
        if not view.isidentifier():
            raise JobDefinitionError(f"Spark stage '{name}': input name {view!r} cannot name a table")
    conf = env.conf
    try:
        memory = memory_mb(conf.get("spark.driver.memory") or DEFAULTS["spark.driver.memory"])
    except ValueError:
        raise JobDefinitionError(f"spark.driver.memory: {conf.get('spark.driver.memory')!r} is not a memory size "
                                 "(e.g. 512m, 2g)") from None
    stage = SparkStage(list(inputs), fn=fn, query=query, name=name)
    writers = []
    for view, stream in inputs.items():  # each upstream subtask writes its own share of the input
        up = stream.transformation
        writers.append(env._add(Transformation(
            SparkStageInput(stage.uid, view, name=f"{view} -> {name}"),
            [Input(up, stream._partitioner, stream._keys, stream._tag)], slot_sharing_group=up.slot_sharing_group)))
    t = Transformation(stage, [Input(w, Partitioner.REBALANCE, (), "", i) for i, w in enumerate(writers)],
                       parallelism=1, max_parallelism=1, chaining=False, memory_mb=memory)
    env._add(t)
    reader = Transformation(ParquetFilesReader(name=f"{name} output"), [Input(t, Partitioner.REBALANCE)])
    return DataStream(env, env._add(reader))
