"""kafka: Kafka in, keyed event-time windows, Kafka out, exactly once, against a real broker
(noida-db's Kafka service, started here on 127.0.0.1).

The input: ``--records`` JSON events ``{"k", "ts", "n"}`` in a topic of 4 partitions (100 keys,
event time advancing 1 ms every 5 records: 1,000 windows of 1 s at 5M records). Figures:

- ``records_per_s``: yarnflow (an embedded LocalCluster of 2 TaskExecutors of 1 slot,
  parallelism 2): ``KafkaSource`` (JSON, bounded at the topic's ends) -> key_by -> 1 s tumbling
  windows (sum) -> ``KafkaSink`` EXACTLY_ONCE, checkpoints every 1 s; records over the time
  from submit to the job's end (every result committed);
- ``rows_lost`` / ``rows_duplicated``: input records missing from / counted twice in the
  committed window results (a ``read_committed`` reader), against the counts computed here;
- ``bytewax_records_per_s`` / ``ratio_to_bytewax`` (with ``--bytewax-python``, a Python with
  Bytewax 0.21 and confluent-kafka): the same dataflow in Bytewax, 2 processes
  (``bytewax_kafka.py``; its Kafka sink is not transactional), process start to end;
- ``consume_records_per_s`` / ``consume_ratio_to_bare_consumer``: a yarnflow job that only
  reads the topic (JSON decoded into Arrow, then dropped; BATCH, so no checkpoints), submit to
  end, against one process's bare confluent-kafka consume loop over the same topic (values
  not decoded); ``consume_ratio_while_reading``: the same against the time the job's source
  subtasks ran (first start to last end: the read, without the job's deployment and end);
  ``raw_consume_*``: both again with the values kept as bytes (``raw``), decoding nothing like
  the bare loop; ``bare_consumer_and_broker_cores``: the cores the bare loop and the broker
  used together while it ran (CPU seconds over its wall time), and
  ``consume_ratio_ceiling_on_this_machine``: the machine's cores over that, the most any
  consumers could read here against the bare loop if they spent no more per record than it
  did (the broker shares the cores).

``verified``: nothing lost or duplicated, and Bytewax's results (if run) counted every record.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from typing import Any

KEYS, PARTITIONS, WINDOW_MS = 100, 4, 1000
#: noida-db answers a fetch with all it has, whatever fetch.max.bytes says (184 MB at 5M records),
#: more than librdkafka takes by default (100 MB): every consumer here takes up to 1 GB
FETCH = {"receive.message.max.bytes": 1 << 30}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Broker:
    def __init__(self, work_dir: str) -> None:
        import noida_db

        # the binary itself: the console script runs it as a child a kill of the script leaves behind
        binary = os.path.join(os.path.dirname(noida_db.__file__), "noida-db")
        os.chmod(binary, 0o755)
        self.port = _free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log = open(os.path.join(work_dir, "broker.log"), "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([binary, "start", "--data-dir", os.path.join(work_dir, "broker"), "--host",
                                      "127.0.0.1", "--only", "kafka", "--kafka-port", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + 30
        while True:
            try:
                AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=1)
                return
            except Exception:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("the broker did not start") from None
                time.sleep(0.1)

    def topic(self, partitions: int) -> str:
        from confluent_kafka.admin import AdminClient, NewTopic

        name = f"t-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for f in admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)]).values():
            f.result(30)
        return name

    def cpu_s(self) -> float:
        """CPU seconds the broker has used so far (user + system)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.log.close()


def _fill(broker: _Broker, topic: str, records: int) -> collections.Counter[tuple[str, int]]:
    """Write the events (round-robin over the partitions); returns the expected window counts."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                         "queue.buffering.max.messages": 1_000_000})
    expected: collections.Counter[tuple[str, int]] = collections.Counter()
    for i in range(records):
        key, ts = f"k{i % KEYS}", i // 5
        expected[(key, ts - ts % WINDOW_MS)] += 1
        value = b'{"k":"%s","ts":%d,"n":1}' % (key.encode(), ts)
        while True:
            try:
                producer.produce(topic, value, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0, "the benchmark's input was not all written"
    return expected


def _read_committed(broker: _Broker, topic: str) -> list[dict[str, Any]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"check-{uuid.uuid4().hex[:6]}",
                         "isolation.level": "read_committed", "enable.auto.commit": False, **FETCH})
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    out: list[dict[str, Any]] = []
    quiet = time.monotonic()
    while time.monotonic() - quiet < 3:
        messages = [m for m in consumer.consume(10_000, 0.2) if m.error() is None]
        if messages:
            out.extend(json.loads(m.value()) for m in messages)
            quiet = time.monotonic()
    consumer.close()
    return out


def _yarnflow(broker: _Broker, src: str, out: str | None, work_dir: str, fmt: str = "json"
              ) -> tuple[float, float]:
    """Seconds from submit to the end of the job (``out`` None: read only, values decoded as
    ``fmt``), and seconds the source's subtasks ran (the first one's start to the last one's end:
    the read itself, without the job's deployment before it and its end after)."""
    import yarnflow
    from yarnflow import executors
    from yarnflow.common.states import ExecutionState
    from yarnflow.kafka import DeliveryGuarantee, KafkaOffsetsInitializer, KafkaSink, KafkaSource
    from yarnflow.local_cluster import LocalCluster
    from yarnflow.windows import TumblingEventTimeWindows, WatermarkStrategy

    # read only: a BATCH job (no checkpoints, so no wait for a final one at the end)
    conf = {"execution.checkpointing.interval": "1 s"} if out is not None else {}
    with LocalCluster(2, 1, conf, work_dir=tempfile.mkdtemp(dir=work_dir)) as cluster:
        executors.set_context(executors.ClusterContext(cluster.address, conf, progress=False))
        try:
            env = yarnflow.StreamExecutionEnvironment(parallelism=2,
                                                      runtime_mode="STREAMING" if out is not None else "BATCH")
            source = (KafkaSource.builder().set_bootstrap_servers(broker.bootstrap).set_topics(src)
                      .set_starting_offsets(KafkaOffsetsInitializer.earliest())
                      .set_bounded(KafkaOffsetsInitializer.latest()).set_value_format(fmt)
                      .set_properties(FETCH).build())
            if out is None:
                env.from_source(source, None, "events").map_batches(lambda b: b.slice(0, 0), name="drop").collect()
            else:
                strategy = WatermarkStrategy.for_bounded_out_of_orderness(0).with_timestamp_column("ts")
                (env.from_source(source, strategy, "events").key_by("k").window(TumblingEventTimeWindows.of(WINDOW_MS))
                    .sum("n").sink_to(KafkaSink.builder().set_bootstrap_servers(broker.bootstrap).set_topic(out)
                                      .set_value_format("json").set_key_columns("k")
                                      .set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE)
                                      .set_transactional_id_prefix(f"bench-{out}").build()))
            started = time.perf_counter()
            env.execute("kafka-bench")
            took = time.perf_counter() - started
            gw = cluster.gateway()
            try:
                [job] = [j for j in gw.list_jobs() if j.name == "kafka-bench"]
            finally:
                gw.close()
            times = job.vertices[0].subtask_timestamps  # (the source's chain)
            read_s = (max(t[ExecutionState.FINISHED] for t in times) - min(t[ExecutionState.RUNNING] for t in times)) / 1e3
            return took, read_s
        finally:
            executors.set_context(None)


def _bare_consumer(broker: _Broker, topic: str, records: int) -> tuple[float, float]:
    """Seconds for one process's plain consume loop to read every record of ``topic``, and the
    CPU seconds it and the broker used meanwhile."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"bare-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, **FETCH})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    started, seen = time.perf_counter(), 0
    cpu_before = time.process_time() + broker.cpu_s()
    while seen < records:
        for m in consumer.consume(10_000, 1.0):
            if m.error() is None:
                seen += 1
                m.value()
    took = time.perf_counter() - started
    cpu = time.process_time() + broker.cpu_s() - cpu_before
    consumer.close()
    return took, cpu


def _bytewax(python: str, broker: _Broker, src: str, out: str) -> float:
    here = os.path.dirname(os.path.abspath(__file__))
    addresses = ";".join(f"127.0.0.1:{_free_port()}" for _ in range(2))
    env = {**os.environ, "KB_BROKER": broker.bootstrap, "KB_INPUT": src, "KB_OUTPUT": out,
           "PYTHONPATH": here}
    started = time.perf_counter()
    procs = [subprocess.Popen([python, "-m", "bytewax.run", "bytewax_kafka:flow", "-i", str(i), "-a", addresses],
                              env=env, cwd=here) for i in range(2)]
    codes = [p.wait(3600) for p in procs]
    took = time.perf_counter() - started
    if any(codes):
        raise RuntimeError(f"the Bytewax dataflow failed: exit codes {codes}")
    return took


def run_kafka(records: int = 5_000_000, bytewax_python: str | None = None, work_dir: str | None = None
              ) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="yarnflow-kafka-bench-", dir=work_dir)
    broker = _Broker(root)
    try:
        src, out = broker.topic(PARTITIONS), broker.topic(PARTITIONS)
        t0 = time.perf_counter()
        expected = _fill(broker, src, records)
        fill_s = time.perf_counter() - t0
        seconds, _ = _yarnflow(broker, src, out, root)
        seen: dict[tuple[str, int], int] = {}
        repeated = 0
        for r in _read_committed(broker, out):
            key = (r["k"], r["window_start"])
            if key in seen:  # a window committed twice: its records counted twice
                repeated += r["n"]
            else:
                seen[key] = r["n"]
        lost = sum(max(0, n - seen.get(key, 0)) for key, n in expected.items())
        extra = sum(max(0, n - expected.get(key, 0)) for key, n in seen.items())
        result: dict[str, Any] = {"name": "kafka", "records": records, "fill_s": round(fill_s, 1),
                                  "seconds": round(seconds, 2), "records_per_s": round(records / seconds),
                                  "rows_lost": lost, "rows_duplicated": repeated + extra}
        consume_s, read_s = _yarnflow(broker, src, None, root)
        raw_s, raw_read_s = _yarnflow(broker, src, None, root, "raw")
        bare_s, bare_cpu_s = _bare_consumer(broker, src, records)
        result.update(consume_records_per_s=round(records / consume_s), bare_consumer_records_per_s=round(
            records / bare_s), consume_ratio_to_bare_consumer=round(bare_s / consume_s, 2),
            consume_ratio_while_reading=round(bare_s / read_s, 2),
            raw_consume_ratio_to_bare_consumer=round(bare_s / raw_s, 2),
            raw_consume_ratio_while_reading=round(bare_s / raw_read_s, 2),
            bare_consumer_and_broker_cores=round(bare_cpu_s / bare_s, 2),
            consume_ratio_ceiling_on_this_machine=round(bare_s * (os.cpu_count() or 1) / bare_cpu_s, 2))
        ok = lost == 0 and result["rows_duplicated"] == 0
        python = bytewax_python or os.environ.get("BYTEWAX_PYTHON")
        if python:
            bw_out = broker.topic(PARTITIONS)
            bw_s = _bytewax(python, broker, src, bw_out)
            counted = sum(r["n"] for r in _read_committed(broker, bw_out))
            result.update(bytewax_records_per_s=round(records / bw_s), ratio_to_bytewax=round(bw_s / seconds, 2),
                          bytewax_records_counted=counted)
            ok = ok and counted == records
        else:
            result["bytewax"] = "skipped: give a Python with bytewax 0.21 (--bytewax-python or $BYTEWAX_PYTHON)"
        result["verified"] = ok
        return result
    finally:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)
