"""PyFlink's Kafka connector names (``pyflink.datastream.connectors.kafka``) over yarnflow's
(``yarnflow.kafka``: FLIP-27 source, two-phase-commit sink, tested against a real broker):
values as strings (``SimpleStringSchema``) or raw bytes; the sink writes ``str(element)``."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

from yarnflow.common.errors import JobDefinitionError
from yarnflow.kafka import DeliveryGuarantee, KafkaOffsetsInitializer, OffsetResetStrategy
from yarnflow.pyflink.common.typeinfo import Types
from yarnflow.pyflink.datastream.records import decode

__all__ = ["KafkaSource", "KafkaSourceBuilder", "KafkaSink", "KafkaSinkBuilder", "KafkaOffsetsInitializer",
           "KafkaOffsetResetStrategy", "KafkaRecordSerializationSchema", "KafkaTopicPartition", "DeliveryGuarantee"]

KafkaOffsetResetStrategy = OffsetResetStrategy
#: a topic's partition (a key of ``KafkaOffsetsInitializer.offsets({...})``)
KafkaTopicPartition = namedtuple("KafkaTopicPartition", ["topic", "partition"])


def _value_format(schema: Any) -> str:
    kind = type(schema).__name__
    if kind == "SimpleStringSchema":
        return "string"
    raise JobDefinitionError(f"yarnflow's PyFlink layer reads and writes Kafka values with SimpleStringSchema, not "
                             f"{kind} (yarnflow.kafka reads JSON, CSV and Avro into columns)")


class _Value:
    """A Kafka record's value, as the element."""

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        return {"v": row["value"]}


class _Text:
    """An element, as the record's value."""

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        return {"value": str(decode(row))}


class KafkaSource:
    def __init__(self, ours: Any) -> None:
        self._ours = ours

    @staticmethod
    def builder() -> KafkaSourceBuilder:
        return KafkaSourceBuilder()

    def _attach(self, env: Any, name: str) -> tuple[Any, Any]:
        return env.from_source(self._ours, None, name).map(_Value(), name="value"), Types.STRING()


class KafkaSourceBuilder:
    def __init__(self) -> None:
        from yarnflow.kafka import KafkaSource as Ours

        self._b = Ours.builder().set_value_format("string")

    def __getattr__(self, name: str) -> Any:
        """set_bootstrap_servers, set_topics, set_topic_pattern, set_group_id, set_starting_offsets,
        set_bounded, set_property, set_properties: yarnflow's, which has Flink's names."""
        call = getattr(self._b, name)

        def chained(*args: Any, **kwargs: Any) -> KafkaSourceBuilder:
            call(*args, **kwargs)
            return self
        return chained

    def set_value_only_deserializer(self, deserialization_schema: Any) -> KafkaSourceBuilder:
        self._b.set_value_format(_value_format(deserialization_schema))
        return self

    def set_unbounded(self, stopping_offsets_initializer: Any) -> KafkaSourceBuilder:
        raise JobDefinitionError("KafkaSource.set_unbounded is not supported: a source without set_bounded is "
                                 "unbounded")

    def set_client_id_prefix(self, prefix: str) -> KafkaSourceBuilder:
        self._b.set_property("client.id", prefix)
        return self

    def build(self) -> KafkaSource:
        return KafkaSource(self._b.build())


class KafkaRecordSerializationSchema:
    def __init__(self, topic: str, value_format: str) -> None:
        self.topic, self.value_format = topic, value_format

    @staticmethod
    def builder() -> KafkaRecordSerializationSchemaBuilder:
        return KafkaRecordSerializationSchemaBuilder()


class KafkaRecordSerializationSchemaBuilder:
    def __init__(self) -> None:
        self._topic = ""
        self._format = "string"

    def set_topic(self, topic: str) -> KafkaRecordSerializationSchemaBuilder:
        self._topic = topic
        return self

    def set_value_serialization_schema(self, value_serialization_schema: Any) -> KafkaRecordSerializationSchemaBuilder:
        self._format = _value_format(value_serialization_schema)
        return self

    def set_key_serialization_schema(self, key_serialization_schema: Any) -> KafkaRecordSerializationSchemaBuilder:
        raise JobDefinitionError("record keys from a key serialization schema are not supported by yarnflow's PyFlink "
                                 "layer (yarnflow.kafka's KafkaSink.set_key_columns is)")

    def build(self) -> KafkaRecordSerializationSchema:
        if not self._topic:
            raise JobDefinitionError("KafkaRecordSerializationSchema needs set_topic(...)")
        return KafkaRecordSerializationSchema(self._topic, self._format)


class KafkaSink:
    def __init__(self, ours: Any) -> None:
        self._ours = ours

    @staticmethod
    def builder() -> KafkaSinkBuilder:
        return KafkaSinkBuilder()

    def _attach(self, ds: Any) -> Any:
        return ds.map(_Text(), name="to_string").sink_to(self._ours, name="Kafka Sink")


class KafkaSinkBuilder:
    def __init__(self) -> None:
        from yarnflow.kafka import KafkaSink as Ours

        self._b = Ours.builder()
        self._serializer: KafkaRecordSerializationSchema | None = None

    def __getattr__(self, name: str) -> Any:
        """set_bootstrap_servers, set_delivery_guarantee, set_transactional_id_prefix,
        set_property, set_properties: yarnflow's, which has Flink's names."""
        call = getattr(self._b, name)

        def chained(*args: Any, **kwargs: Any) -> KafkaSinkBuilder:
            call(*(getattr(a, "name", a) if name == "set_delivery_guarantee" else a for a in args), **kwargs)
            return self
        return chained

    def set_record_serializer(self, record_serializer: KafkaRecordSerializationSchema) -> KafkaSinkBuilder:
        self._serializer = record_serializer
        return self

    def build(self) -> KafkaSink:
        if self._serializer is None:
            raise JobDefinitionError("KafkaSink needs set_record_serializer(KafkaRecordSerializationSchema...)")
        self._b.set_topic(self._serializer.topic).set_value_format(self._serializer.value_format, "value")
        return KafkaSink(self._b.build())
