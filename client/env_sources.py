"""The sources of a StreamExecutionEnvironment (``datastream.py``): collections, files of every
format (with per-split watermarks when given a strategy) and generators."""

from __future__ import annotations

import os
import sys

from typing import TYPE_CHECKING, Any, Callable, Sequence

import pyarrow as pa

from yarnflow.common.api import WatermarkStrategy
from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.operators.base import Operator
from yarnflow.worker.operators.sources import CollectionSource, FileSource, GeneratorSource

if TYPE_CHECKING:
    from yarnflow.datastream import DataStream

__all__ = ["SourceMethods"]


def _to_table(data: Any, schema: pa.Schema | None) -> pa.Table:
    if isinstance(data, pa.Table):
        return data if schema is None else data.cast(schema)
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, dict):
        return pa.table(data, schema=schema)
    pd = sys.modules.get("pandas")  # (not imported: ~0.15 s, and data cannot be a DataFrame)
    if pd is not None and isinstance(data, pd.DataFrame):
        return pa.Table.from_pandas(data, schema=schema, preserve_index=False)
    rows = list(data)
    if rows and not isinstance(rows[0], dict):
        rows = [{"value": r} for r in rows]
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise JobDefinitionError(f"from_collection: cannot make a table of the given rows: {exc}") from None



def qualified(path: Any) -> Any:
    """A path as the job's tasks must read it wherever they run: a relative local path (no
    ``scheme://``) made absolute against the working directory of the process that defines the
    job, as Flink's client qualifies a ``Path``; URLs and absolute paths as they are. A list
    is qualified element by element."""
    if isinstance(path, (list, tuple)):
        return [qualified(p) for p in path]
    if not isinstance(path, str) or "://" in path or os.path.isabs(path) or not path:
        return path
    absolute = os.path.abspath(path)
    return absolute + "/" if path.endswith("/") else absolute

class SourceMethods:
    """What an environment reads from; ``_source`` (the environment's) makes the stream."""

    def _source(self, op: Operator, event_time_column: str | None = None) -> DataStream:
        raise NotImplementedError

    # -- sources ----------------------------------------------------------------------------
    def from_collection(self, data: Any, schema: pa.Schema | None = None, name: str = "collection") -> DataStream:
        """Rows (dicts, or scalars in column 'value'), a dict of columns, a pyarrow Table or a
        pandas DataFrame."""
        return self._source(CollectionSource(_to_table(data, schema), name))

    def _files(self, path: str | list[str], fmt: str, name: str, watermarks: WatermarkStrategy | None,
               **options: Any) -> DataStream:
        """A file source; with ``watermark_strategy``, event time and per-split watermarks."""
        try:
            op = FileSource(qualified(path), fmt, name, options=options, watermarks=watermarks)
        except ValueError as exc:
            raise JobDefinitionError(str(exc)) from None
        return self._source(op, watermarks.timestamp_column if watermarks else None)

    def read_text(self, path: str | list[str], name: str = "read_text",
                  watermark_strategy: WatermarkStrategy | None = None) -> DataStream:
        """Text files (a file, a folder or a glob on any fsspec filesystem): one row per line,
        column 'line'. Any ``read_*`` takes a ``watermark_strategy`` whose column the files have:
        watermarks per split (file), the source's the minimum of those of the splits it holds."""
        return self._files(path, "text", name, watermark_strategy)

    def read_parquet(self, path: str | list[str], columns: Sequence[str] | None = None, name: str = "read_parquet",
                     watermark_strategy: WatermarkStrategy | None = None) -> DataStream:
        return self._files(path, "parquet", name, watermark_strategy, **({"columns": list(columns)} if columns else {}))

    def read_csv(self, path: str | list[str], name: str = "read_csv",
                 watermark_strategy: WatermarkStrategy | None = None) -> DataStream:
        return self._files(path, "csv", name, watermark_strategy)

    def read_json(self, path: str | list[str], name: str = "read_json",
                  watermark_strategy: WatermarkStrategy | None = None) -> DataStream:
        """JSON lines files."""
        return self._files(path, "json", name, watermark_strategy)

    def from_generator(self, fn: Callable[[int, int], Any], count: int | None = None,
                       rate_per_s: float | None = None, name: str = "generator") -> DataStream:
        """Rows made by ``fn(start, n)`` for sequence numbers ``[start, start + n)`` (a
        RecordBatch, Table or dict of columns); unbounded when ``count`` is None;
        ``rate_per_s`` limits the rows per second over all subtasks."""
        return self._source(GeneratorSource(fn, count, rate_per_s, name))

    def from_source(self, source: Any, watermark_strategy: WatermarkStrategy | None = None,
                    source_name: str = "source") -> DataStream:
        """A connector's source (``yarnflow.kafka.KafkaSource``), as Flink's
        ``env.from_source(source, watermark_strategy, name)``. With a strategy that names a
        timestamp column: event time, with per-partition watermarks."""
        create = getattr(source, "create_operator", None)
        if create is None:
            raise JobDefinitionError(f"from_source: {type(source).__name__} is not a connector source (such as "
                                     "yarnflow.kafka.KafkaSource)")
        strategy = watermark_strategy if watermark_strategy is not None and watermark_strategy.timestamp_column \
            else None
        if watermark_strategy is not None and not watermark_strategy.timestamp_column and \
                watermark_strategy.generator is not None:
            raise JobDefinitionError("from_source: the watermark strategy needs a timestamp column "
                                     "(.with_timestamp_column('timestamp'), e.g. the Kafka record timestamps)")
        return self._source(create(source_name, strategy), strategy.timestamp_column if strategy else None)

    def add_source(self, fn: Any, name: str | None = None) -> DataStream:
        """A source of your own: a ``SourceFunction`` (one instance per subtask)."""
        from yarnflow.worker.operators.user_source import UserSource

        return self._source(UserSource(fn, name))
