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
from tests.integration.test_ha_failover import ha_cluster  # noqa: F401 - the fixture
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
    _assert_windows_exact(kafka_broker, out, events)
    committed = kafka_broker.read_all(out)
    # keyed by the window's key: Kafka's partitioner put each key in one partition
    by_key = collections.defaultdict(set)
    for m in committed:
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


def test_malformed_records_can_go_to_a_side_output_naming_each(run, kafka_broker):
    topic = kafka_broker.create_topic(1)
    kafka_broker.produce(topic, [b'{"a": 1}', b'{"a": oops}', b'{"a": 3}', b'[1, 2]', b'{"a": 5}'], partition=0)

    def build(env):
        env.set_runtime_mode("BATCH")
        source = (KafkaSource.builder().set_bootstrap_servers(kafka_broker.bootstrap).set_topics(topic)
                  .set_bounded(KafkaOffsetsInitializer.latest()).set_value_format("json")
                  .set_malformed_records_side_output("bad").build())
        stream = env.from_source(source, None, "kafka")
        stream.collect(name="good")
        stream.get_side_output("bad").collect(name="bad")

    result = run(build, name="kafka-side-output", parallelism=1)
    assert sorted(r["a"] for r in result.collected("good").to_pylist()) == [1, 3, 5]
    bad = result.collected("bad").to_pylist()
    assert [(r["offset"], r["value"]) for r in sorted(bad, key=lambda r: r["offset"])] == \
        [(1, b'{"a": oops}'), (3, b"[1, 2]")]
    assert all(f"topic {topic} partition 0 offset {r['offset']}" in r["error"] for r in bad)


AVRO = {"type": "record", "name": "Event", "fields": [{"name": "k", "type": "string"}, {"name": "n", "type": "long"},
                                                      {"name": "tag", "type": ["null", "string"], "default": None}]}


def test_avro_records_in_and_out(run, kafka_broker):
    import io

    import fastavro

    src, out = kafka_broker.create_topic(2), kafka_broker.create_topic(1)
    parsed = fastavro.parse_schema(AVRO)
    for p in range(2):
        values = []
        for i in range(100):
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, parsed, {"k": f"k{i % 3}", "n": i, "tag": None if i % 2 else "even"})
            values.append(buf.getvalue())
        kafka_broker.produce(src, values, partition=p)

    def build(env):
        env.set_runtime_mode("STREAMING")
        source = (KafkaSource.builder().set_bootstrap_servers(kafka_broker.bootstrap).set_topics(src)
                  .set_bounded(KafkaOffsetsInitializer.latest()).set_value_format("avro").set_avro_schema(AVRO)
                  .build())
        (env.from_source(source, None, "avro-in").map(lambda r: {**r, "n": r["n"] * 2}, name="double")
            .sink_to(KafkaSink.builder().set_bootstrap_servers(kafka_broker.bootstrap).set_topic(out)
                     .set_value_format("avro").set_avro_schema(json.dumps(AVRO))
                     .set_delivery_guarantee("EXACTLY_ONCE").set_transactional_id_prefix(f"avro-{out}").build()))

    run(build, name="kafka-avro", conf={"execution.checkpointing.interval": "200 ms"})
    got = sorted((r["k"], r["n"], r["tag"]) for r in (fastavro.schemaless_reader(io.BytesIO(m.value()), parsed, None)
                                                      for m in kafka_broker.read_all(out)))
    assert got == sorted((f"k{i % 3}", 2 * i, None if i % 2 else "even") for _ in range(2) for i in range(100))


def test_builders_refuse_incomplete_settings() -> None:
    with pytest.raises(JobDefinitionError, match="set_bootstrap_servers"):
        KafkaSource.builder().set_topics("t").build()
    with pytest.raises(JobDefinitionError, match="set_topics"):
        KafkaSource.builder().set_bootstrap_servers("b:9092").build()
    with pytest.raises(JobDefinitionError, match="unknown Kafka value format"):
        KafkaSource.builder().set_value_format("xml")
    with pytest.raises(JobDefinitionError, match="set_avro_schema"):
        KafkaSource.builder().set_bootstrap_servers("b:9092").set_topics("t").set_value_format("avro").build()
    with pytest.raises(JobDefinitionError, match="bad Avro schema"):
        KafkaSource.builder().set_avro_schema({"type": "record", "name": "X", "fields": [{"name": "a"}]})
    with pytest.raises(JobDefinitionError, match="transactional_id_prefix"):
        (KafkaSink.builder().set_bootstrap_servers("b:9092").set_topic("t")
         .set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE).build())


def test_partition_owners_follow_flinks_rule() -> None:
    # Flink's KafkaSourceEnumerator.getSplitOwner: ((topic.hashCode() * 31) & 0x7FFFFFFF) % p, then + partition
    # ("orders".hashCode() == -1008770331 in Java)
    start = ((-1008770331 * 31) & 0x7FFFFFFF) % 3
    assert [owner("orders", p, 3) for p in range(4)] == [(start + p) % 3 for p in range(4)]


def _assert_windows_exact(broker: KafkaBroker, out: str, events: list[tuple[str, int]]) -> None:
    expected = collections.Counter((k, ts - ts % WINDOW_MS) for k, ts in events)
    committed = [json.loads(m.value()) for m in broker.read_all(out)]
    windows = collections.Counter((r["k"], r["window_start"]) for r in committed)
    twice = [w for w, c in windows.items() if c > 1]
    assert not twice, f"{len(twice)} window results committed more than once, e.g. {twice[:3]}"
    assert {(r["k"], r["window_start"]): r["n"] for r in committed} == dict(expected)


def test_a_broker_restarted_mid_job_is_survived_exactly(local_cluster, tmp_path):
    """The broker stopped (cleanly: this broker keeps its data only then) and started again on the
    same port and data while the job reads, windows and commits transactions: the job carries on
    (or restarts from its last checkpoint) and every window result is committed once."""
    broker = KafkaBroker(tmp_path / "kafka")  # (its own broker: the restart does not disturb other tests)
    broker.start()
    try:
        src, out = broker.create_topic(PARTITIONS), broker.create_topic(PARTITIONS)
        cluster = local_cluster(taskexecutors=2, slots=2)
        events, writer = _events(broker, src, rounds_per_s=4.0)
        thread, outcome = _run_in_thread(cluster, _window_job(broker, src, out, f"restart-{out}"), "kafka-restart",
                                         CHECKPOINTS, 2)
        with closing(cluster.gateway()) as gw:
            wait_until(lambda: any(j.name == "kafka-restart" and j.latest_completed_checkpoint_id >= 2
                                   for j in gw.list_jobs()), 60, "the job completed no checkpoint")
            assert writer.is_alive() and thread.is_alive()  # mid-input, mid-job (the writer retries meanwhile)
            broker.restart()
            writer.join(60)
            thread.join(200)
            [info] = [j for j in gw.list_jobs() if j.name == "kafka-restart"]
        assert not thread.is_alive(), "the job did not end after the broker's restart"
        assert "error" not in outcome, outcome.get("error")
        _assert_windows_exact(broker, out, events)
        assert info.latest_completed_checkpoint_id > 2
    finally:
        broker.stop()


def test_an_idle_partition_does_not_stall_windows(local_cluster, kafka_broker):
    """Two partitions, events in one only: with the strategy's idleness the empty one stops
    holding the watermark back, and windows fire (are committed) while the job runs."""
    src, out = kafka_broker.create_topic(2), kafka_broker.create_topic(1)
    kafka_broker.produce(src, [json.dumps({"k": "a", "ts": ts, "n": 1}).encode() for ts in range(0, 3000, 10)],
                         partition=0)

    def build(env):
        from yarnflow.windows import TumblingEventTimeWindows, WatermarkStrategy

        env.set_runtime_mode("STREAMING")
        source = (KafkaSource.builder().set_bootstrap_servers(kafka_broker.bootstrap).set_topics(src)
                  .set_value_format("json").build())
        strategy = WatermarkStrategy.for_bounded_out_of_orderness(0).with_timestamp_column("ts").with_idleness(500)
        (env.from_source(source, strategy, "events").key_by("k").window(TumblingEventTimeWindows.of(WINDOW_MS))
            .sum("n").sink_to(KafkaSink.builder().set_bootstrap_servers(kafka_broker.bootstrap).set_topic(out)
                              .set_value_format("json").set_delivery_guarantee("AT_LEAST_ONCE").build()))

    cluster = local_cluster(taskexecutors=1, slots=2)
    thread, outcome = _run_in_thread(cluster, build, "kafka-idle", {}, 1)
    with closing(cluster.gateway()) as gw:
        try:
            fired = wait_until(lambda: [json.loads(m.value()) for m in kafka_broker.read_all(out, idle_s=0.3)], 60,
                               lambda: f"no window fired while a partition was idle ({outcome})")
        finally:
            for job in gw.list_jobs():
                if job.name == "kafka-idle" and not job.status.is_globally_terminal:
                    gw.cancel_job(str(job.job_id))
            thread.join(60)
    assert {(r["window_start"], r["n"]) for r in fired} <= {(s, 50) for s in range(0, 3000, WINDOW_MS)}


@pytest.mark.parametrize("after", [1, 3])
def test_a_savepoint_restored_at_another_parallelism_reads_no_record_twice_or_never(local_cluster, kafka_broker,
                                                                                    tmp_path, after):
    src, out = kafka_broker.create_topic(PARTITIONS), kafka_broker.create_topic(PARTITIONS)
    values = [json.dumps({"k": f"k{i % KEYS}", "i": i, "p": p}).encode() for p in range(PARTITIONS) for i in range(2000)]
    for p in range(PARTITIONS):
        kafka_broker.produce(src, values[p * 2000:(p + 1) * 2000], partition=p)

    def build(env):
        env.set_runtime_mode("STREAMING")
        source = (KafkaSource.builder().set_bootstrap_servers(kafka_broker.bootstrap).set_topics(src)
                  .set_value_format("json").set_property("max.poll.records", 100).build())
        (env.from_source(source, None, "events").uid("events").map_batches(_slow, name="slow").uid("slow")
            .sink_to(KafkaSink.builder().set_bootstrap_servers(kafka_broker.bootstrap).set_topic(out)
                     .set_value_format("json").set_delivery_guarantee("EXACTLY_ONCE")
                     .set_transactional_id_prefix(f"sp-{out}").build()).uid("sink"))

    cluster = local_cluster(taskexecutors=2, slots=2)
    thread, _ = _run_in_thread(cluster, build, "kafka-sp", CHECKPOINTS, 2)
    with closing(cluster.gateway()) as gw:
        job = wait_until(lambda: next((j for j in gw.list_jobs() if j.name == "kafka-sp"
                                       and j.latest_completed_checkpoint_id >= 2), None), 60, "no checkpoint")
        path = gw.stop_with_savepoint(str(job.job_id), str(tmp_path / "savepoints"))
        thread.join(60)
        read_before = len(kafka_broker.read_all(out, idle_s=0.5))
        assert 0 < read_before < len(values), read_before  # (stopped mid-topic)
        thread, outcome = _run_in_thread(cluster, build, "kafka-sp-2", {**CHECKPOINTS,
                                                                          "execution.savepoint.path": path}, after)
        wait_until(lambda: len(kafka_broker.read_all(out, idle_s=0.5)) >= len(values), 90,
                   lambda: f"not every record came through ({outcome})")
        for j in gw.list_jobs():
            if j.name == "kafka-sp-2" and not j.status.is_globally_terminal:
                gw.cancel_job(str(j.job_id))
        thread.join(60)
    got = collections.Counter((r["p"], r["i"]) for r in (json.loads(m.value()) for m in kafka_broker.read_all(out)))
    assert got == collections.Counter((p, i) for p in range(PARTITIONS) for i in range(2000))


def test_a_killed_taskexecutor_then_a_killed_leader_with_a_standby_commit_each_window_once(
        ha_cluster, kafka_broker):  # noqa: F811 - the fixture
    """ZooKeeper HA, a standby AppMaster: a TaskExecutor SIGKILLed mid-job, then (once the job
    runs and checkpoints again) the leading AppMaster SIGKILLed; the new leader carries on (a
    checkpoint whose commit notification was lost is committed by the restored or adopted sink)."""
    import signal

    from tests.integration.test_cluster_failures import _all_te_processes, _resource_id
    from tests.integration.test_ha_failover import connection, job_info, leader, run_following_the_leader

    src, out = kafka_broker.create_topic(PARTITIONS), kafka_broker.create_topic(PARTITIONS)
    cluster = ha_cluster(standby=1)
    old, am = leader(cluster)
    events, writer = _events(kafka_broker, src, rounds_per_s=3.0)
    thread, outcome = run_following_the_leader(cluster, _window_job(kafka_broker, src, out, f"ha-{out}"), "kafka-ha",
                                               CHECKPOINTS)
    conn = connection(cluster)
    try:
        running = wait_until(lambda: (j := job_info(conn, "kafka-ha")) is not None and j.latest_completed_checkpoint_id
                             and j, 60, "the job never completed a checkpoint")
        victim = random.Random(3).choice(sorted({loc for v in running.vertices for loc in v.subtask_locations if loc}))
        [proc] = [p for p in _all_te_processes(cluster) if _resource_id(p) == victim]
        proc.send_signal(signal.SIGKILL)
        restarted = wait_until(lambda: (j := job_info(conn, "kafka-ha")) is not None and j.failure_history
                               and j.status.name == "RUNNING" and j, 60, "the job did not restart after the kill")
        wait_until(lambda: job_info(conn, "kafka-ha").latest_completed_checkpoint_id >
                   restarted.latest_completed_checkpoint_id, 60, "no checkpoint after the restart")
        assert writer.is_alive()  # (mid-input)
        am.send_signal(signal.SIGKILL)
        wait_until(lambda: (a := cluster.leader_address(20)) != old and a, 30, "no AppMaster took over")
        thread.join(200)
        writer.join(30)
    finally:
        conn.close()
    assert "error" not in outcome, outcome.get("error")
    _assert_windows_exact(kafka_broker, out, events)


def _slower(batch):
    time.sleep(0.25)
    return batch


def test_offsets_and_lag_are_metrics_in_rest_and_prometheus(local_cluster, kafka_broker):
    """Flink's KafkaSource metrics: per partition ``currentOffset`` and ``committedOffset`` (after a
    checkpoint completed), and ``KafkaConsumer.records-lag-max``, through REST and Prometheus."""
    from tests.rest import get, scrape
    from yarnflow.common.metrics import free_port_range

    topic = kafka_broker.create_topic(2)
    for p in range(2):
        kafka_broker.produce(topic, [json.dumps({"k": "a", "n": i}).encode() for i in range(50)], partition=p)

    def build(env):
        env.set_runtime_mode("STREAMING")
        source = (KafkaSource.builder().set_bootstrap_servers(kafka_broker.bootstrap).set_topics(topic)
                  .set_group_id(f"metrics-{topic}").set_value_format("json")
                  .set_property("max.poll.records", 10).build())
        env.from_source(source, None, "events").map_batches(_slower, name="slower").collect()

    low, high = free_port_range(4, random.randint(20000, 60000))
    cluster = local_cluster(taskexecutors=1, slots=1, rest__port="0", metrics__reporter__prom__port=f"{low}-{high}")
    web = cluster.web_url()
    thread, outcome = _run_in_thread(cluster, build, "kafka-metrics", {"execution.checkpointing.interval": "300 ms"}, 1)
    with closing(cluster.gateway()) as gw:
        try:
            job = wait_until(lambda: next((j for j in gw.list_jobs() if j.name == "kafka-metrics"
                                           and j.latest_completed_checkpoint_id >= 2), None), 60,
                             lambda: f"no checkpoint ({outcome})")
            vertex = get(f"{web}/jobs/{job.job_id}")["vertices"][0]["id"]
            url = f"{web}/jobs/{job.job_id}/vertices/{vertex}/subtasks/0/metrics"
            names = [f"events.KafkaSourceReader.topic.{topic}.partition.{p}.{m}" for p in range(2)
                     for m in ("currentOffset", "committedOffset")] + ["events.KafkaConsumer.records-lag-max"]

            lags = []

            def values():
                got = {m["id"]: float(m["value"]) for m in get(f"{url}?get={','.join(names)}")}
                lags.append(got.get(names[4], 0.0))
                return got if len(got) == len(names) and got[names[1]] == got[names[3]] == 50 and \
                    got[names[4]] == 0 else None  # (offsets committed, nothing left to read)

            got = wait_until(values, 30, lambda: f"not every metric came: {get(url)}", interval_s=0.2)
            assert got[names[0]] == got[names[2]] == 49.0  # the last record read of each partition
            assert max(lags) > 0, lags  # (behind while the slow map held the source back)
            [te] = get(f"{web}/taskmanagers")["taskmanagers"]
            prom = scrape(f"http://{te['metricsAddress']}/metrics")
            current = {s[0]["partition"]: s[1] for s in
                       prom["yarnflow_taskmanager_job_task_operator_KafkaSourceReader_topic_partition_currentOffset"]
                       if s[0]["topic"] == topic}
            assert current == {"0": 49.0, "1": 49.0}
            assert prom["yarnflow_taskmanager_job_task_operator_KafkaConsumer_records_lag_max"][0][1] == 0.0
        finally:
            for j in gw.list_jobs():
                if j.name == "kafka-metrics" and not j.status.is_globally_terminal:
                    gw.cancel_job(str(j.job_id))
            thread.join(60)


@pytest.mark.parametrize("start", ["latest", "committed", "timestamp"])
def test_starting_offsets_latest_committed_and_by_timestamp(run, kafka_broker, start):
    """(``latest``: the ends when the job starts, bounded at the ends a moment later; ``committed``:
    the group's offsets, ``earliest`` where it has none; ``timestamp``: the first record at or
    after it, by the records' Kafka timestamps, also a column here.)"""
    from confluent_kafka import Consumer, TopicPartition

    topic = kafka_broker.create_topic(2)
    base = (int(time.time()) - 60) * 1000  # (recent: older records go with the broker's retention)
    for p in range(2):
        kafka_broker.produce(topic, [f"{p}-{i}".encode() for i in range(10)], partition=p,
                             timestamps=[base + i * 1000 for i in range(10)])
    group = f"g-{topic}"
    if start == "committed":  # the group is at 4 in partition 0, nowhere in partition 1
        c = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": group})
        c.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
        c.close()
    initializer = {"latest": KafkaOffsetsInitializer.latest(),
                   "committed": KafkaOffsetsInitializer.committed_offsets("earliest"),
                   "timestamp": KafkaOffsetsInitializer.timestamp(base + 7000)}[start]
    stop = KafkaOffsetsInitializer.offsets({(topic, 0): 10, (topic, 1): 10}) if start != "latest" else \
        KafkaOffsetsInitializer.offsets({(topic, 0): 12, (topic, 1): 10})

    def build(env):
        env.set_runtime_mode("BATCH")
        source = (KafkaSource.builder().set_bootstrap_servers(kafka_broker.bootstrap).set_topics(topic)
                  .set_group_id(group).set_starting_offsets(initializer).set_bounded(stop)
                  .set_metadata_columns(["timestamp"]).build())
        env.from_source(source, None, "kafka").collect()

    if start == "latest":  # two more records after the job started: read; the ten before it: not
        threading.Timer(2.0, lambda: kafka_broker.produce(topic, [b"0-10", b"0-11"], partition=0)).start()
    rows = run(build, name=f"kafka-{start}").collected().to_pylist()
    got = sorted(r["value"] for r in rows)
    want = {"latest": ["0-10", "0-11"],
            "committed": sorted([f"0-{i}" for i in range(4, 10)] + [f"1-{i}" for i in range(10)]),
            "timestamp": sorted(f"{p}-{i}" for p in range(2) for i in range(7, 10))}[start]
    assert got == want
    if start == "timestamp":
        assert sorted({int(r["timestamp"].timestamp() * 1000) for r in rows}) == [base + i * 1000 for i in range(7, 10)]


def test_the_sink_routes_rows_by_a_topic_column_with_keys_and_csv_values(run, kafka_broker):
    a, b = kafka_broker.create_topic(1), kafka_broker.create_topic(1)

    def build(env):
        env.set_runtime_mode("BATCH")
        rows = [{"to": a if i % 2 else b, "id": i, "name": f"n{i}"} for i in range(20)]
        (env.from_collection(rows).sink_to(
            KafkaSink.builder().set_bootstrap_servers(kafka_broker.bootstrap).set_topic(a).set_topic_column("to")
            .set_key_columns("id").set_value_format("csv").set_delivery_guarantee("AT_LEAST_ONCE").build()))

    run(build, name="kafka-routes")
    for topic, parity in ((a, 1), (b, 0)):
        got = sorted((int(m.key()), m.value()) for m in kafka_broker.read_all(topic))
        assert got == [(i, f'{i},"n{i}"'.encode()) for i in range(20) if i % 2 == parity]


def test_a_topic_pattern_reads_every_matching_topic(run, kafka_broker):
    import uuid

    prefix = f"pat{uuid.uuid4().hex[:6]}"
    a, b = kafka_broker.create_topic(2, f"{prefix}-a"), kafka_broker.create_topic(1, f"{prefix}-b")
    other = kafka_broker.create_topic(1, f"x{prefix}-c")
    for topic in (a, b, other):
        kafka_broker.produce(topic, [f"{topic}:{i}".encode() for i in range(5)])

    def build(env):
        env.set_runtime_mode("BATCH")
        source = (KafkaSource.builder().set_bootstrap_servers(kafka_broker.bootstrap)
                  .set_topic_pattern(f"{prefix}-.*").set_bounded(KafkaOffsetsInitializer.latest())
                  .set_metadata_columns(["topic"]).build())
        env.from_source(source, None, "kafka").collect()

    rows = run(build, name="kafka-pattern").collected().to_pylist()
    assert sorted(r["value"] for r in rows) == sorted(f"{t}:{i}" for t in (a, b) for i in range(5))


def _sink_operator(broker: KafkaBroker, topic: str, prefix: str):
    from tests.harness import RecordingOutput, runtime_context

    sink = (KafkaSink.builder().set_bootstrap_servers(broker.bootstrap).set_topic(topic).set_value_format("json")
            .set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE).set_transactional_id_prefix(prefix).build())
    op = sink.create_operator("sink")
    op.setup(runtime_context(checkpointing=True), RecordingOutput())
    op.open()
    return op


def _hang_first(op, monkeypatch, hangs: int) -> list[int]:
    """The sink's first ``hangs`` transactions never return (as librdkafka's did on a broker that
    went away and came back); the calls made are counted."""
    import yarnflow.worker.operators.kafka_sink as kafka_sink

    monkeypatch.setattr(kafka_sink, "COMMIT_ATTEMPT_S", 1.0)
    real, calls = op._transaction, []

    def transaction(*args):
        calls.append(1)
        if len(calls) <= hangs:
            time.sleep(3)  # (past the attempt's deadline; it then reports nothing)
            return
        real(*args)

    monkeypatch.setattr(op, "_transaction", transaction)
    return calls


def test_a_commit_that_hangs_is_redone_by_a_new_producer_once(kafka_broker, monkeypatch):
    import pyarrow as pa

    topic = kafka_broker.create_topic(1)
    op = _sink_operator(kafka_broker, topic, f"hang-{topic}")
    try:
        first = op._producer
        op.process_batch(pa.record_batch({"i": list(range(50))}))
        op.snapshot_state(1)
        calls = _hang_first(op, monkeypatch, 1)
        op.notify_checkpoint_complete(1)
        assert len(calls) == 2 and op._producer is not first  # (the second try, by a new producer)
    finally:
        op.close()
    assert sorted(json.loads(m.value())["i"] for m in kafka_broker.read_all(topic)) == list(range(50))


def test_a_commit_that_keeps_failing_fails_the_task_and_keeps_its_rows(kafka_broker, monkeypatch):
    import pyarrow as pa

    from yarnflow.worker.operators.kafka_sink import COMMIT_ATTEMPTS, PENDING_TABLE, KafkaSinkError

    topic = kafka_broker.create_topic(1)
    op = _sink_operator(kafka_broker, topic, f"fail-{topic}")
    try:
        op.process_batch(pa.record_batch({"i": list(range(10))}))
        op.snapshot_state(1)
        calls = _hang_first(op, monkeypatch, COMMIT_ATTEMPTS)
        with pytest.raises(KafkaSinkError, match=f"checkpoint 1 .* failed {COMMIT_ATTEMPTS} times: .*did not end"):
            op.notify_checkpoint_complete(1)
        assert len(calls) == COMMIT_ATTEMPTS
        # the rows stay pending: the next checkpoint (or the restored state) still carries them
        assert op.snapshot_state(2)[PENDING_TABLE].num_rows == 10
    finally:
        op.close()
    assert kafka_broker.read_all(topic, idle_s=1.0) == []
