"""A PyFlink program reading and writing Kafka under PyFlink's names (issue 56), against the
real broker of tests/kafka.py: lines from a topic of 3 partitions, a bounded KafkaSource,
words counted per key, each count written to another topic with an EXACTLY_ONCE KafkaSink; a
read_committed consumer sees every word's final count."""

from __future__ import annotations

import collections
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

JOB = textwrap.dedent("""\
    import sys

    from pyflink.common import Types, WatermarkStrategy
    from pyflink.common.serialization import SimpleStringSchema
    from pyflink.datastream import StreamExecutionEnvironment
    from pyflink.datastream.connectors import DeliveryGuarantee
    from pyflink.datastream.connectors.kafka import (KafkaOffsetsInitializer, KafkaRecordSerializationSchema,
                                                     KafkaSink, KafkaSource)

    brokers, source_topic, sink_topic = sys.argv[1:4]
    env = StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(2)
    env.enable_checkpointing(300)
    source = KafkaSource.builder().set_bootstrap_servers(brokers).set_topics(source_topic) \\
        .set_group_id("pyflink-words").set_starting_offsets(KafkaOffsetsInitializer.earliest()) \\
        .set_bounded(KafkaOffsetsInitializer.latest()) \\
        .set_value_only_deserializer(SimpleStringSchema()).build()
    sink = KafkaSink.builder().set_bootstrap_servers(brokers) \\
        .set_record_serializer(KafkaRecordSerializationSchema.builder().set_topic(sink_topic)
                               .set_value_serialization_schema(SimpleStringSchema()).build()) \\
        .set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE).set_transactional_id_prefix("pyflink-words") \\
        .build()
    env.from_source(source, WatermarkStrategy.no_watermarks(), "Kafka Source") \\
        .flat_map(lambda line: line.split(), output_type=Types.STRING()) \\
        .map(lambda w: (w, 1), output_type=Types.TUPLE([Types.STRING(), Types.INT()])) \\
        .key_by(lambda t: t[0]).reduce(lambda a, b: (a[0], a[1] + b[1])) \\
        .map(lambda t: f"{t[0]}={t[1]}", output_type=Types.STRING()) \\
        .sink_to(sink)
    env.execute("pyflink kafka words")
    """)


def test_a_pyflink_kafka_program_counts_words_into_kafka_exactly_once(cli: Any, kafka_broker: Any,
                                                                       tmp_path: Path) -> None:
    source, sink = kafka_broker.create_topic(3), kafka_broker.create_topic(2)
    lines = [" ".join(f"w{(p * 7 + i) % 11}" for i in range(n)) for p in range(3) for n in range(1, 40)]
    for p in range(3):
        kafka_broker.produce(source, [line.encode() for line in lines[p::3]], partition=p)
    (tmp_path / "job.py").write_text(JOB)
    ran = cli.run("run", "job.py", kafka_broker.bootstrap, source, sink, timeout=150)
    assert ran.returncode == 0, ran.stderr
    latest: dict[str, int] = {}
    for message in kafka_broker.read_all(sink, "read_committed"):
        word, count = message.value().decode().split("=")
        latest[word] = max(latest.get(word, 0), int(count))
    assert latest == dict(collections.Counter(w for line in lines for w in line.split()))
