"""Kafka connectors with Flink's names: ``KafkaSource`` and ``KafkaSink`` (how they read, write
and commit: ``yarnflow.worker.operators.kafka``)::

    from yarnflow.kafka import KafkaSource, KafkaSink, KafkaOffsetsInitializer, DeliveryGuarantee

    source = (KafkaSource.builder().set_bootstrap_servers("broker:9092").set_topics("orders")
              .set_group_id("orders-job").set_starting_offsets(KafkaOffsetsInitializer.earliest())
              .set_value_format("json").build())
    stream = env.from_source(source, WatermarkStrategy.no_watermarks(), "orders")
    stream.sink_to(KafkaSink.builder().set_bootstrap_servers("broker:9092").set_topic("counts")
                   .set_value_format("json").set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE)
                   .set_transactional_id_prefix("counts").build())

Value formats: ``raw`` (bytes, column ``value``), ``string`` (column ``value``), ``json`` (one
object per record: its fields are the columns, typed by pyarrow or by ``set_schema``), ``csv``
(one line per record; ``set_csv_columns`` or ``set_schema`` names them), ``avro`` (a record of
the schema given with ``set_avro_schema``, in Avro's binary encoding). A source can add the
records' ``key``, ``topic``, ``partition``, ``offset``, ``timestamp`` and ``headers`` as
columns (``set_metadata_columns``)."""

from __future__ import annotations

import enum
import re
from typing import Any, Iterable, Mapping

import pyarrow as pa

from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.operators.kafka import METADATA_COLUMNS, KafkaSinkOperator, KafkaSourceOperator

__all__ = ["DeliveryGuarantee", "KafkaOffsetsInitializer", "KafkaSink", "KafkaSinkBuilder", "KafkaSource",
           "KafkaSourceBuilder", "OffsetResetStrategy"]

FORMATS = ("raw", "string", "json", "csv", "avro")


class OffsetResetStrategy(str, enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"


class DeliveryGuarantee(str, enum.Enum):
    NONE = "NONE"
    AT_LEAST_ONCE = "AT_LEAST_ONCE"
    EXACTLY_ONCE = "EXACTLY_ONCE"


class KafkaOffsetsInitializer:
    """Where a partition starts (or, for ``set_bounded``, stops)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    @classmethod
    def earliest(cls) -> KafkaOffsetsInitializer:
        return cls({"kind": "earliest"})

    @classmethod
    def latest(cls) -> KafkaOffsetsInitializer:
        return cls({"kind": "latest"})

    @classmethod
    def committed_offsets(cls, reset: OffsetResetStrategy | str = OffsetResetStrategy.EARLIEST
                          ) -> KafkaOffsetsInitializer:
        """The group's committed offsets; ``reset`` where a partition has none."""
        return cls({"kind": "committed", "reset": OffsetResetStrategy(reset).value})

    @classmethod
    def timestamp(cls, timestamp_ms: int) -> KafkaOffsetsInitializer:
        """The first record at or after ``timestamp_ms`` (the end where none is)."""
        return cls({"kind": "timestamp", "timestamp": int(timestamp_ms)})

    @classmethod
    def offsets(cls, offsets: Mapping[tuple[str, int], int],
                reset: OffsetResetStrategy | str = OffsetResetStrategy.EARLIEST) -> KafkaOffsetsInitializer:
        """``{(topic, partition): offset}``; ``reset`` for partitions not named."""
        return cls({"kind": "specific", "offsets": {(str(t), int(p)): int(o) for (t, p), o in offsets.items()},
                    "reset": OffsetResetStrategy(reset).value})


def _avro_schema(schema: str | dict[str, Any]) -> Any:
    import json

    import fastavro

    try:
        parsed = json.loads(schema) if isinstance(schema, str) else schema
        fastavro.parse_schema(parsed)
    except (ValueError, TypeError, fastavro.schema.SchemaParseException) as exc:
        raise JobDefinitionError(f"bad Avro schema: {exc}") from None
    return parsed


def _format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise JobDefinitionError(f"unknown Kafka value format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return fmt


class KafkaSource:
    """Built by ``KafkaSource.builder()``; read with ``env.from_source(source, strategy, name)``."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    @staticmethod
    def builder() -> KafkaSourceBuilder:
        return KafkaSourceBuilder()

    @property
    def bounded(self) -> bool:
        return self.spec.get("stopping") is not None

    def create_operator(self, name: str, watermarks: Any) -> KafkaSourceOperator:
        return KafkaSourceOperator(dict(self.spec), name, watermarks=watermarks)


class KafkaSourceBuilder:
    def __init__(self) -> None:
        self._spec: dict[str, Any] = {"format": "string", "properties": {}, "discovery_interval_ms": 300_000}

    def set_bootstrap_servers(self, servers: str) -> KafkaSourceBuilder:
        self._spec["bootstrap_servers"] = servers
        return self

    def set_topics(self, *topics: str | Iterable[str]) -> KafkaSourceBuilder:
        names: list[str] = []
        for t in topics:
            names.extend([t] if isinstance(t, str) else list(t))
        self._spec["topics"], self._spec["topic_pattern"] = names, None
        return self

    def set_topic_pattern(self, pattern: str) -> KafkaSourceBuilder:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise JobDefinitionError(f"bad Kafka topic pattern {pattern!r}: {exc}") from None
        self._spec["topic_pattern"], self._spec["topics"] = pattern, []
        return self

    def set_group_id(self, group_id: str) -> KafkaSourceBuilder:
        self._spec["group_id"] = group_id
        return self

    def set_starting_offsets(self, initializer: KafkaOffsetsInitializer) -> KafkaSourceBuilder:
        self._spec["starting"] = initializer.spec
        return self

    def set_bounded(self, stopping: KafkaOffsetsInitializer) -> KafkaSourceBuilder:
        """Stop at these offsets (for BATCH jobs; ``latest``: the ends when the job starts)."""
        if stopping.spec["kind"] == "committed":
            raise JobDefinitionError("set_bounded takes latest(), timestamp(...) or offsets({...})")
        self._spec["stopping"] = stopping.spec
        return self

    def set_value_format(self, fmt: str) -> KafkaSourceBuilder:
        self._spec["format"] = _format(fmt)
        return self

    def set_value_only_deserializer(self, fmt: str) -> KafkaSourceBuilder:
        """Flink's name for ``set_value_format``."""
        return self.set_value_format(fmt)

    def set_avro_schema(self, schema: str | dict[str, Any]) -> KafkaSourceBuilder:
        """The records' Avro schema (a record schema, as JSON text or a dict): with
        ``set_value_format("avro")`` each value is that record in Avro's binary encoding, without
        a header (Flink's ``AvroDeserializationSchema.forGeneric``; not a schema registry's
        framing)."""
        self._spec["avro_schema"] = _avro_schema(schema)
        return self

    def set_schema(self, schema: pa.Schema) -> KafkaSourceBuilder:
        """The value columns' types (JSON, CSV)."""
        self._spec["schema"] = schema
        return self

    def set_csv_columns(self, columns: Iterable[str]) -> KafkaSourceBuilder:
        self._spec["csv_columns"] = list(columns)
        return self

    def set_metadata_columns(self, columns: Iterable[str]) -> KafkaSourceBuilder:
        cols = list(columns)
        bad = [c for c in cols if c not in METADATA_COLUMNS]
        if bad:
            raise JobDefinitionError(f"unknown Kafka metadata column(s) {bad}: choose from {', '.join(METADATA_COLUMNS)}")
        self._spec["metadata_columns"] = cols
        return self

    def set_malformed_records_side_output(self, tag: str = "malformed") -> KafkaSourceBuilder:
        """Records whose value does not decode go to side output ``tag`` (columns ``topic``,
        ``partition``, ``offset``, ``key``, ``value``, ``error``: read it with
        ``stream.get_side_output(tag)``) instead of failing the job (the default: its error
        names the record's topic, partition and offset). Never dropped silently."""
        if not tag:
            raise JobDefinitionError("set_malformed_records_side_output needs a tag")
        self._spec["malformed_tag"] = tag
        return self

    def set_property(self, key: str, value: Any) -> KafkaSourceBuilder:
        """A consumer property (librdkafka's names); ``partition.discovery.interval.ms`` and
        ``commit.offsets.on.checkpoint`` are the source's own, as in Flink."""
        if key == "partition.discovery.interval.ms":
            self._spec["discovery_interval_ms"] = int(value)
        elif key == "max.poll.records":  # (Kafka's Java consumer's name: rows per poll)
            self._spec["max_poll_records"] = int(value)
        elif key == "commit.offsets.on.checkpoint":
            self._spec["commit_offsets_on_checkpoint"] = str(value).lower() == "true"
        else:
            self._spec["properties"][key] = value
        return self

    def set_properties(self, properties: Mapping[str, Any]) -> KafkaSourceBuilder:
        for k, v in properties.items():
            self.set_property(k, v)
        return self

    def build(self) -> KafkaSource:
        if self._spec["format"] == "avro" and not self._spec.get("avro_schema"):
            raise JobDefinitionError("KafkaSource: the Avro format needs set_avro_schema(...)")
        if not self._spec.get("bootstrap_servers"):
            raise JobDefinitionError("KafkaSource: set_bootstrap_servers(...) is required")
        if not self._spec.get("topics") and not self._spec.get("topic_pattern"):
            raise JobDefinitionError("KafkaSource: set_topics(...) or set_topic_pattern(...) is required")
        return KafkaSource(dict(self._spec))


class KafkaSink:
    """Built by ``KafkaSink.builder()``; written with ``stream.sink_to(sink)``."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    @staticmethod
    def builder() -> KafkaSinkBuilder:
        return KafkaSinkBuilder()

    def create_operator(self, name: str) -> KafkaSinkOperator:
        return KafkaSinkOperator(dict(self.spec), name)


class KafkaSinkBuilder:
    def __init__(self) -> None:
        self._spec: dict[str, Any] = {"format": "json", "properties": {},
                                      "delivery_guarantee": DeliveryGuarantee.NONE.value}

    def set_bootstrap_servers(self, servers: str) -> KafkaSinkBuilder:
        self._spec["bootstrap_servers"] = servers
        return self

    def set_topic(self, topic: str) -> KafkaSinkBuilder:
        self._spec["topic"] = topic
        return self

    def set_topic_column(self, column: str) -> KafkaSinkBuilder:
        """Each row goes to the topic its column ``column`` names (not written as a value)."""
        self._spec["topic_column"] = column
        self._spec["exclude_columns"] = [*self._spec.get("exclude_columns", []), column]
        return self

    def set_key_columns(self, *columns: str) -> KafkaSinkBuilder:
        """The record key: one column's value as text, or several as a JSON array."""
        self._spec["key_columns"] = list(columns)
        return self

    def set_value_format(self, fmt: str, column: str | None = None) -> KafkaSinkBuilder:
        """``json`` / ``csv``: the row; ``string`` / ``raw``: one column (``column``, else
        ``value``, else the first)."""
        self._spec["format"], self._spec["value_column"] = _format(fmt), column
        return self

    def set_avro_schema(self, schema: str | dict[str, Any]) -> KafkaSinkBuilder:
        """With ``set_value_format("avro")``: each row written as this Avro record (binary, no header)."""
        self._spec["avro_schema"] = _avro_schema(schema)
        return self

    def set_delivery_guarantee(self, guarantee: DeliveryGuarantee | str) -> KafkaSinkBuilder:
        try:
            self._spec["delivery_guarantee"] = DeliveryGuarantee(guarantee).value
        except ValueError:
            raise JobDefinitionError(f"unknown delivery guarantee {guarantee!r}: NONE, AT_LEAST_ONCE or "
                                     "EXACTLY_ONCE") from None
        return self

    def set_transactional_id_prefix(self, prefix: str) -> KafkaSinkBuilder:
        self._spec["transactional_id_prefix"] = prefix
        return self

    def set_property(self, key: str, value: Any) -> KafkaSinkBuilder:
        self._spec["properties"][key] = value
        return self

    def set_properties(self, properties: Mapping[str, Any]) -> KafkaSinkBuilder:
        self._spec["properties"].update(properties)
        return self

    def build(self) -> KafkaSink:
        if self._spec["format"] == "avro" and not self._spec.get("avro_schema"):
            raise JobDefinitionError("KafkaSink: the Avro format needs set_avro_schema(...)")
        if not self._spec.get("bootstrap_servers"):
            raise JobDefinitionError("KafkaSink: set_bootstrap_servers(...) is required")
        if not self._spec.get("topic"):
            raise JobDefinitionError("KafkaSink: set_topic(...) is required (with set_topic_column: the topic "
                                     "of the transactions' markers)")
        if self._spec["delivery_guarantee"] == DeliveryGuarantee.EXACTLY_ONCE.value and \
                not self._spec.get("transactional_id_prefix"):
            raise JobDefinitionError("KafkaSink: EXACTLY_ONCE needs set_transactional_id_prefix(...), unique to "
                                     "this sink among every job writing to the cluster (as in Flink)")
        return KafkaSink(dict(self._spec))
