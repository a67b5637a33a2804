"""Kafka in, Kafka out (issue 53), against a real Kafka-protocol broker (tests/kafka.py:
noida-db, which enforces transactions) on a real local cluster.

The main test: a topic of 4 partitions of JSON events -> keyed 500 ms tumbling windows in event
time (per-partition watermarks from the source) -> Kafka EXACTLY_ONCE, STREAMING with
checkpoints; a TaskExecutor SIGKILLed mid-job. A ``read_committed`` consumer of the output sees
every window result exactly once, with every input record counted in it; a
``read_uncommitted`` one is shown too (it may see records of aborted transactions: what the
test would catch if the sink did not use transactions right)."""

from __future__ import annotations

import collections
import json
import random
import threading
import time
from contextlib import closing
from typing import Any

import pytest

from tests.harness import wait_until
from tests.integration.test_streaming_exactly_once import CHECKPOINTS, _run_in_thread, run_killing_one_taskexecutor
from tests.kafka import KafkaBroker
from yarnflow.common.errors import JobDefinitionError
from yarnflow.kafka import DeliveryGuarantee, KafkaOffsetsInitializer, KafkaSink, KafkaSource
from yarnflow.worker.operators.kafka import owner

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PARTITIONS, PER_PARTITION, KEYS, WINDOW_MS = 4, 3000, 13, 500


def _events(broker: KafkaBroker, topic: str, rounds_per_s: float = 8.0) -> tuple[list[tuple[str, int]], Any]:
    """JSON events ``{"k", "ts", "n"}``, written while the job runs, in rounds of 100 records a
    partition (partition p carries event times ``4 r + p``: in order within a partition,
    interleaved across them), so windows fire all along. Returns (the events, the writer's
    thread)."""
    events, rounds = [], []
    for start in range(0, PER_PARTITION, 100):
        batch = []
        for p in range(PARTITIONS):
            values = []
            for r in range(start, start + 100):
                key, ts = f"k{(p * 5 + r) % KEYS}", r * 4 + p
                events.append((key, ts))
                values.append(json.dumps({"k": key, "ts": ts, "n": 1}).encode())
            batch.append((p, values))
        rounds.append(batch)

    def write() -> None:
        for batch in rounds:
            for p, values in batch:
                broker.produce(topic, values, partition=p)
            time.sleep(1.0 / rounds_per_s)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return events, thread


def _slow(batch):
    time.sleep(0.02)
    return batch


def _window_job(broker: KafkaBroker, src: str, out: str, prefix: str):
    def build(env):
        from yarnflow.windows import TumblingEventTimeWindows, WatermarkStrategy

        env.set_runtime_mode("STREAMING")
        source = (KafkaSource.builder().set_bootstrap_servers(broker.bootstrap).set_topics(src)
                  .set_group_id(f"g-{prefix}").set_starting_offsets(KafkaOffsetsInitializer.earliest())
                  .set_bounded(KafkaOffsetsInitializer.offsets({(src, p): PER_PARTITION for p in range(PARTITIONS)}))
                  .set_value_format("json").set_property("max.poll.records", 100).build())
        strategy = WatermarkStrategy.for_bounded_out_of_orderness(200).with_timestamp_column("ts")
        (env.from_source(source, strategy, "events").map_batches(_slow, name="slow")
            .key_by("k").window(TumblingEventTimeWindows.of(WINDOW_MS)).sum("n")
            .sink_to(KafkaSink.builder().set_bootstrap_servers(broker.bootstrap).set_topic(out)
                     .set_key_columns("k").set_value_format("json")
                     .set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE)
                     .set_transactional_id_prefix(prefix).build()))
    return build


@pytest.mark.parametrize("seed", [1, 2])
def test_kafka_windows_to_kafka_exactly_once_through_a_killed_taskexecutor(local_cluster, kafka_broker, seed):
    rng = random.Random(seed)
    src, out = kafka_broker.create_topic(PARTITIONS), kafka_broker.create_topic(PARTITIONS)
    cluster = local_cluster(taskexecutors=2, slots=2)
    events, writer = _events(kafka_broker, src)
    run_killing_one_taskexecutor(cluster, _window_job(kafka_broker, src, out, f"win-{seed}-{out}"),
                                 f"kafka-{seed}", CHECKPOINTS, rng, (1.0, 2.5))
    writer.join(30)
    expected = collections.Counter((k, ts - ts % WINDOW_MS) for k, ts in events)
    committed = [json.loads(m.value()) for m in kafka_broker.read_all(out)]
    windows = collections.Counter((r["k"], r["window_start"]) for r in committed)
    twice = [w for w, c in windows.items() if c > 1]
    assert not twice, f"{len(twice)} window results committed more than once, e.g. {twice[:3]}"
    assert {(r["k"], r["window_start"]): r["n"] for r in committed} == dict(expected)
    # keyed by the window's key: Kafka's partitioner put each key in one partition
    by_key = collections.defaultdict(set)
    for m in kafka_broker.read_all(out):
        by_key[m.key()].add(m.partition())
    assert all(len(ps) == 1 for ps in by_key.values())
    uncommitted = kafka_broker.read_all(out, "read_uncommitted")
    assert len(uncommitted) >= len(committed)  # (aborted transactions' records show only here)


def test_a_bounded_source_ends_a_batch_job_with_offsets_and_metadata(run, kafka_broker):
    topic = kafka_broker.create_topic(3)
    for p in range(3):
        kafka_broker.produce(topic, [f"{p}-{i}".encode() for i in range(200)], partition=p,
                             keys=[f"key{i}".encode() for i in range(200)])

    def build(env):
        env.set_runtime_mode("BATCH")
        source = (KafkaSource.builder().set_bootstrap_servers(kafka_broker.bootstrap).set_topics(topic)
                  .set_starting_offsets(KafkaOffsetsInitializer.offsets({(topic, 1): 150}))
                  .set_bounded(KafkaOffsetsInitializer.latest()).set_value_format("string")
                  .set_metadata_columns(["key", "partition", "offset"]).build())
        env.from_source(source, None, "kafka").collect()

    rows = run(build, name="kafka-batch").collected().to_pylist()
    got = sorted((r["partition"], r["offset"], r["value"], r["key"]) for r in rows)
    want = sorted((p, i, f"{p}-{i}", f"key{i}".encode()) for p in range(3) for i in range(150 if p == 1 else 0, 200))
    assert got == want


def test_a_partition_added_mid_job_is_read(local_cluster, kafka_broker):
    topic, out = kafka_broker.create_topic(1), kafka_broker.create_topic(1)
    kafka_broker.produce(topic, [b"first"], partition=0)

    def build(env):
        env.set_runtime_mode("STREAMING")
        source = (KafkaSource.builder().set_bootstrap_servers(kafka_broker.bootstrap).set_topics(topic)
                  .set_property("partition.discovery.interval.ms", 300).set_value_format("string").build())
        (env.from_source(source, None, "kafka")
            .sink_to(KafkaSink.builder().set_bootstrap_servers(kafka_broker.bootstrap).set_topic(out)
                     .set_value_format("string").set_delivery_guarantee(DeliveryGuarantee.AT_LEAST_ONCE).build()))

    cluster = local_cluster(taskexecutors=1, slots=2)
    thread, outcome = _run_in_thread(cluster, build, "kafka-discovery", {}, 2)
    with closing(cluster.gateway()) as gw:
        try:
            wait_until(lambda: [m.value() for m in kafka_broker.read_all(out, idle_s=0.3)] == [b"first"], 60,
                       lambda: f"the first record was not read ({outcome})")
            kafka_broker.add_partitions(topic, 2)
            kafka_broker.produce(topic, [b"second"], partition=1)
            wait_until(lambda: sorted(m.value() for m in kafka_broker.read_all(out, idle_s=0.3)) ==
                       [b"first", b"second"], 60, "the record of the new partition was not read")
        finally:
            for job in gw.list_jobs():
                if job.name == "kafka-discovery" and not job.status.is_globally_terminal:
                    gw.cancel_job(str(job.job_id))
            thread.join(60)


def test_a_malformed_json_record_fails_the_job_naming_its_offset(run, kafka_broker):
    topic = kafka_broker.create_topic(1)
    kafka_broker.produce(topic, [b'{"a": 1}', b'{"a": 2}', b'{"a": oops}', b'{"a": 4}'], partition=0)

    def build(env):
        env.set_runtime_mode("BATCH")
        source = (KafkaSource.builder().set_bootstrap_servers(kafka_broker.bootstrap).set_topics(topic)
                  .set_bounded(KafkaOffsetsInitializer.latest()).set_value_format("json").build())
        env.from_source(source, None, "kafka").collect()

    from yarnflow import JobFailedError

    with pytest.raises(JobFailedError, match=f"topic {topic} partition 0 offset 2"):
        run(build, name="kafka-bad-json", conf={"restart-strategy.type": "none"})


def test_builders_refuse_incomplete_settings() -> None:
    with pytest.raises(JobDefinitionError, match="set_bootstrap_servers"):
        KafkaSource.builder().set_topics("t").build()
    with pytest.raises(JobDefinitionError, match="set_topics"):
        KafkaSource.builder().set_bootstrap_servers("b:9092").build()
    with pytest.raises(JobDefinitionError, match="unknown Kafka value format"):
        KafkaSource.builder().set_value_format("xml")
    with pytest.raises(JobDefinitionError, match="transactional_id_prefix"):
        (KafkaSink.builder().set_bootstrap_servers("b:9092").set_topic("t")
         .set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE).build())


def test_partition_owners_follow_flinks_rule() -> None:
    # Flink's KafkaSourceEnumerator.getSplitOwner: ((topic.hashCode() * 31) & 0x7FFFFFFF) % p, then + partition
    # ("orders".hashCode() == -1008770331 in Java)
    start = ((-1008770331 * 31) & 0x7FFFFFFF) % 3
    assert [owner("orders", p, 3) for p in range(4)] == [(start + p) % 3 for p in range(4)]
