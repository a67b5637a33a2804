"""The pipeline API: an environment, streams and keyed streams, as in Flink's DataStream API,
vectorised over Arrow record batches.

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    lines = env.read_text("s3://bucket/logs/")
    words = lines.flat_map(lambda row: ({"word": w, "count": 1} for w in row["line"].split()))
    words.key_by("word").sum("count").sink_to_parquet("hdfs:///out/wordcount")
    env.execute("wordcount")
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import pyarrow as pa

from yarnflow.common.errors import JobDefinitionError
from yarnflow.common.states import Partitioner
from yarnflow.worker.operators.base import Operator, SourceOperator
from yarnflow.worker.operators.keyed import KeyedAggregate, KeyedReduce
from yarnflow.worker.operators.sinks import CollectSink, ParquetSink
from yarnflow.worker.operators.sources import CollectionSource, FileSource
from yarnflow.worker.operators.transforms import MapBatches, RowFilter, RowFlatMap, RowMap

if TYPE_CHECKING:
    from yarnflow.executors import JobExecutionResult

_ids = itertools.count(1)


@dataclass
class Transformation:
    """One node of the user's pipeline: an operator and where its input comes from."""

    operator: Operator
    inputs: list[tuple[Transformation, Partitioner, tuple[str, ...]]]
    parallelism: int | None = None
    max_parallelism: int | None = None
    slot_sharing_group: str = "default"
    chaining: bool = True
    id: int = field(default_factory=lambda: next(_ids))

    @property
    def is_source(self) -> bool:
        return isinstance(self.operator, SourceOperator)


def _to_table(data: Any, schema: pa.Schema | None) -> pa.Table:
    if isinstance(data, pa.Table):
        return data if schema is None else data.cast(schema)
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, dict):
        return pa.table(data, schema=schema)
    try:
        import pandas as pd

        if isinstance(data, pd.DataFrame):
            return pa.Table.from_pandas(data, schema=schema, preserve_index=False)
    except ImportError:  # pragma: no cover
        pass
    rows = list(data)
    if rows and not isinstance(rows[0], dict):
        rows = [{"value": r} for r in rows]
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise JobDefinitionError(f"from_collection: cannot make a table of the given rows: {exc}") from None


class StreamExecutionEnvironment:
    """Where a pipeline is built and from where it is executed."""

    def __init__(self, parallelism: int | None = None, max_parallelism: int | None = None,
                 runtime_mode: str | None = None) -> None:
        from yarnflow import executors

        ctx = executors.current_context()
        self.parallelism = parallelism or ctx.default_parallelism
        self.max_parallelism = max_parallelism or ctx.max_parallelism
        self.runtime_mode = (runtime_mode or ctx.runtime_mode).upper()
        self.transformations: list[Transformation] = []
        self.executed = False

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

    def _add(self, t: Transformation) -> Transformation:
        self.transformations.append(t)
        return t

    # -- sources ----------------------------------------------------------------------------
    def from_collection(self, data: Any, schema: pa.Schema | None = None, name: str = "collection") -> DataStream:
        """Rows (dicts, or scalars in column 'value'), a dict of columns, a pyarrow Table or a
        pandas DataFrame."""
        return DataStream(self, self._add(Transformation(CollectionSource(_to_table(data, schema), name), [])))

    def read_text(self, path: str | list[str], name: str = "read_text") -> DataStream:
        """Text files (a file, a folder or a glob on any fsspec filesystem): one row per line,
        column 'line'."""
        return DataStream(self, self._add(Transformation(FileSource(path, "text", name), [])))

    def read_parquet(self, path: str | list[str], columns: Sequence[str] | None = None,
                     name: str = "read_parquet") -> DataStream:
        opts = {"columns": list(columns)} if columns else {}
        return DataStream(self, self._add(Transformation(FileSource(path, "parquet", name, options=opts), [])))

    def read_csv(self, path: str | list[str], name: str = "read_csv") -> DataStream:
        return DataStream(self, self._add(Transformation(FileSource(path, "csv", name), [])))

    def read_json(self, path: str | list[str], name: str = "read_json") -> DataStream:
        """JSON lines files."""
        return DataStream(self, self._add(Transformation(FileSource(path, "json", name), [])))

    # -- execution --------------------------------------------------------------------------
    def execute(self, job_name: str = "yarnflow job") -> JobExecutionResult:
        """Compile the pipeline, run it on the cluster of the current context (the CLI's, or an
        embedded local cluster started for this call) and wait for it to end.

        Raises ``JobFailedError`` (with the root cause) when the job fails."""
        from yarnflow import executors

        self.executed = True
        return executors.current_context().execute(self, job_name)


class DataStream:
    def __init__(self, env: StreamExecutionEnvironment, transformation: Transformation) -> None:
        self.env = env
        self.transformation = transformation

    def _then(self, op: Operator, partitioner: Partitioner = Partitioner.FORWARD,
              keys: Sequence[str] = ()) -> DataStream:
        t = Transformation(op, [(self.transformation, partitioner, tuple(keys))],
                           slot_sharing_group=self.transformation.slot_sharing_group)
        return DataStream(self.env, self.env._add(t))

    # -- naming and parallelism -------------------------------------------------------------
    def name(self, name: str) -> DataStream:
        self.transformation.operator.name = name
        return self

    def uid(self, uid: str) -> DataStream:
        self.transformation.operator.uid = uid
        return self

    def set_parallelism(self, parallelism: int) -> DataStream:
        if parallelism < 1:
            raise JobDefinitionError("parallelism must be at least 1")
        self.transformation.parallelism = parallelism
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
        return _PartitionedStream(self, Partitioner.REBALANCE)  # type: ignore[return-value]

    # -- sinks ------------------------------------------------------------------------------
    def sink_to_parquet(self, path: str, name: str = "parquet_sink") -> DataStream:
        """Write Parquet files (one per subtask, committed when the subtask finishes) into the
        folder ``path`` on any fsspec filesystem."""
        return self._then(ParquetSink(path, name))

    def print(self, name: str = "print") -> DataStream:
        """Print the rows on the client's stdout once the job has finished."""
        return self._then(CollectSink(f"print-{next(_ids)}", print_rows=True, name=name))

    def collect(self, name: str = "collect") -> DataStream:
        """Hand the rows to the client: ``env.execute(...).collected()`` returns them."""
        return self._then(CollectSink(f"collect-{next(_ids)}", name=name))


class _PartitionedStream(DataStream):
    """A stream whose next operator reads it through a given partitioner."""

    def __init__(self, upstream: DataStream, partitioner: Partitioner, keys: tuple[str, ...] = ()) -> None:
        super().__init__(upstream.env, upstream.transformation)
        self._partitioner = partitioner
        self._keys = keys

    def _then(self, op: Operator, partitioner: Partitioner = Partitioner.FORWARD,
              keys: Sequence[str] = ()) -> DataStream:
        return DataStream(self.env, self.env._add(Transformation(
            op, [(self.transformation, self._partitioner, self._keys)],
            slot_sharing_group=self.transformation.slot_sharing_group)))


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
