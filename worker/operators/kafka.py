"""Kafka: the source operator (Flink's KafkaSource) here, the sink (Flink's KafkaSink) in
``kafka_sink.py``, the value formats in ``kafka_formats.py``; on confluent-kafka (librdkafka).
The user's side, the builders, is ``yarnflow.kafka``.

Source. The partitions of the topics (or of the topics matching a pattern) are the splits.
Each is owned by one subtask, by Flink's rule (``owner``: a start index from the topic's name,
then round-robin by partition), so no coordination is needed and a partition keeps its owner
while the parallelism stays. Each subtask discovers its partitions at start and every
``partition.discovery.interval.ms`` (a partition added mid-job is read from its earliest
offset), and reads them with one consumer (``assign``: no consumer-group rebalancing, as in
Flink). A batch is built straight from a poll: the values are decoded per batch (JSON and CSV
by pyarrow's readers), plus the metadata columns asked for.

Offsets are the state: union-list state (table ``operator.union.kafka-offsets``: ``topic``,
``partition``, ``offset``: the next offset to read), so on any restore, at any parallelism,
every subtask sees every partition's offset and takes those of the partitions it owns now. A
restore resumes at exactly the checkpointed offsets; the offsets committed back to Kafka when a
checkpoint completes are for lag tools only, never read back.

Sink. NONE and AT_LEAST_ONCE produce as rows come (AT_LEAST_ONCE flushes at every barrier
and fails on a lost delivery). EXACTLY_ONCE is a write-ahead two-phase commit: the rows
between two barriers are kept, serialised, in the checkpoint's state; when the checkpoint
completes they are produced in one Kafka transaction, which also commits a marker (the
checkpoint id, as the committed "offset" of the consumer group named by the transactional id
on partition 0 of the topic). So a commit happens at most once per checkpoint, even when the
notification is lost and the restored attempt commits the restored checkpoint again, or when
two attempts race: the transactional id ``<prefix>-<subtask>`` fences a zombie's producer.
Unlike Flink's sink, no transaction stays open across a checkpoint (librdkafka cannot resume
another process's transaction), so the transaction timeout does not bound the checkpoint
interval; the price is the rows of one checkpoint interval in the state.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from yarnflow.common.api.watermarks import MIN_WATERMARK
from yarnflow.common.keygroups import REDISTRIBUTE_KEY, UNION, operator_table
from yarnflow.worker.elements import Watermark
from yarnflow.worker.operators.base import SourceOperator
from yarnflow.worker.operators.kafka_formats import KafkaSourceError, decode_values
from yarnflow.worker.operators.kafka_sink import KafkaSinkError, KafkaSinkOperator
from yarnflow.worker.operators.timestamps import event_times_ms

__all__ = ["KafkaSinkError", "KafkaSinkOperator", "KafkaSourceError", "KafkaSourceOperator", "METADATA_COLUMNS",
           "owner"]

log = logging.getLogger(__name__)

OFFSETS_TABLE = operator_table(UNION, "kafka-offsets")
METADATA_COLUMNS = ("key", "topic", "partition", "offset", "timestamp", "headers")


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode`` (Flink's split owner rule starts from it)."""
    h = 0
    for ch in s.encode("utf-16-be").decode("utf-16-be"):
        code = ord(ch)
        units = [code] if code < 0x10000 else [0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)]
        for u in units:
            h = (31 * h + u) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def owner(topic: str, partition: int, parallelism: int) -> int:
    """The subtask that reads ``partition`` of ``topic`` (Flink's KafkaSourceEnumerator.getSplitOwner)."""
    start = ((java_string_hash(topic) * 31) & 0x7FFFFFFF) % parallelism
    return (start + partition) % parallelism


# -- the source ----------------------------------------------------------------------------------

class KafkaSourceOperator(SourceOperator):
    """See the module docstring. ``spec`` is ``yarnflow.kafka.KafkaSource``'s settings (a
    plain dict: it travels in the job artifact)."""

    kind = "kafka_source"

    def __init__(self, spec: dict[str, Any], name: str | None = None, uid: str | None = None,
                 watermarks: Any = None) -> None:
        super().__init__(name or "kafka_source", uid)
        self.spec = spec
        self.bounded = spec.get("stopping") is not None
        self.watermarks = watermarks
        self._offsets: dict[tuple[str, int], int] = {}  # next offset of each partition read here
        self._restored: dict[tuple[str, int], int] | None = None
        self._wm: dict[tuple[str, int], list[Any]] = {}  # partition -> [watermark, generator, last active]
        self._emitted = MIN_WATERMARK
        self._consumer: Any = None
        self.records = 0
        self.malformed = 0  # records sent to the side output for those that do not decode
        self._committed: dict[tuple[str, int], int] = {}  # offsets Kafka confirmed committed (for lag tools)
        self._lag: dict[tuple[str, int], int] = {}  # records behind the partition's end, at the last look
        self._lag_at = 0.0

    # state
    def snapshot_state(self, checkpoint_id: int) -> dict[str, pa.Table]:
        items = sorted(self._offsets.items())
        table = pa.table({"topic": pa.array([t for (t, _), _ in items], pa.string()),
                          "partition": pa.array([p for (_, p), _ in items], pa.int32()),
                          "offset": pa.array([o for _, o in items], pa.int64())})
        return {OFFSETS_TABLE: table.replace_schema_metadata({REDISTRIBUTE_KEY: UNION.encode()})}

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        table = state.get(OFFSETS_TABLE)
        self._restored = {}
        if table is not None:
            for row in table.to_pylist():
                key = (str(row["topic"]), int(row["partition"]))
                self._restored[key] = max(self._restored.get(key, -1), int(row["offset"]))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Offsets back to Kafka, for lag tools (never read back: the state is the truth)."""
        if self._consumer is None or not self._offsets or not self.spec.get("commit_offsets_on_checkpoint", True):
            return
        from confluent_kafka import KafkaException, TopicPartition

        try:
            self._consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in self._offsets.items()],
                                  asynchronous=True)
        except KafkaException as exc:
            log.warning("%s: committing offsets to Kafka failed (only lag tools see them): %s", self.name, exc)

    # reading
    def _config(self) -> dict[str, Any]:
        conf = {"bootstrap.servers": self.spec["bootstrap_servers"], "group.id": self.spec.get("group_id") or
                f"yarnflow-{self.name}", "enable.auto.commit": False, "enable.partition.eof": False,
                "isolation.level": "read_committed", "auto.offset.reset": "earliest", "on_commit": self._on_commit}
        conf.update(self.spec.get("properties") or {})
        return conf

    def _on_commit(self, err: Any, partitions: list[Any]) -> None:
        """(librdkafka's callback, on the task thread's poll) Kafka confirmed these offsets."""
        if err is not None:  # (never raise here: librdkafka's callback cannot carry an exception)
            log.info("%s: Kafka did not take the offsets committed for lag tools: %s", self.name, err)
            return
        for tp in partitions:
            if tp.error is None and tp.offset >= 0:
                self._committed[(str(tp.topic), int(tp.partition))] = int(tp.offset)

    def _measure_lag(self, consumer: Any) -> None:
        """Each partition's lag (its end, as last fetched, minus the next offset to read), about
        once a second: Flink's ``records-lag-max`` is their maximum."""
        from confluent_kafka import TopicPartition

        now = time.monotonic()
        if now - self._lag_at < 1.0:
            return
        self._lag_at = now
        for (t, p), offset in list(self._offsets.items()):
            try:
                _, high = consumer.get_watermark_offsets(TopicPartition(t, p), cached=True)
            except Exception:  # noqa: BLE001 - not fetched yet
                continue
            if high >= 0:
                self._lag[(t, p)] = max(0, int(high) - offset)

    def gauges(self) -> list[Any]:
        """Flink's KafkaSource metrics: per partition ``currentOffset`` (the last record read)
        and ``committedOffset`` (the last offset Kafka confirmed committed at a checkpoint's
        completion); ``KafkaConsumer.records-lag-max``."""
        out: list[Any] = []
        for (t, p), offset in sorted(self._offsets.items()):
            labels = (("topic", t), ("partition", str(p)))
            out.append(("KafkaSourceReader", labels, "currentOffset", float(offset - 1)))
            if (t, p) in self._committed:
                out.append(("KafkaSourceReader", labels, "committedOffset", float(self._committed[(t, p)])))
        if self._lag:
            out.append(("KafkaConsumer", (), "records-lag-max", float(max(self._lag.values()))))
        return out

    def _partitions(self, consumer: Any) -> list[tuple[str, int]]:
        """Every partition of the source's topics (or of those matching its pattern) now."""
        metadata = consumer.list_topics(timeout=10)
        pattern = self.spec.get("topic_pattern")
        if pattern:
            rx = re.compile(pattern)
            topics = [t for t in metadata.topics if rx.fullmatch(t) and not t.startswith("__")]
        else:
            topics = list(self.spec["topics"])
            missing = [t for t in topics if t not in metadata.topics or metadata.topics[t].error is not None]
            if missing:
                raise KafkaSourceError(f"{self.name}: topic(s) {missing} do not exist at "
                                       f"{self.spec['bootstrap_servers']}")
        return sorted((t, p) for t in topics for p in metadata.topics[t].partitions)

    def _mine(self, partitions: list[tuple[str, int]]) -> list[tuple[str, int]]:
        p, i = self.ctx.parallelism, self.ctx.subtask_index
        return [tp for tp in partitions if owner(tp[0], tp[1], p) == i]

    def _starting(self, consumer: Any, tps: list[tuple[str, int]], initializer: dict[str, Any],
                  first: bool) -> dict[tuple[str, int], int]:
        """Start offsets: the restored ones; else the initializer's (a partition discovered
        after the start: its earliest offset, as Flink does)."""
        from confluent_kafka import TopicPartition

        out: dict[tuple[str, int], int] = {}
        todo = []
        for tp in tps:
            if self._restored is not None and tp in self._restored:
                out[tp] = self._restored[tp]
            else:
                todo.append(tp)
        if not todo:
            return out
        kind = initializer.get("kind", "earliest") if first else "earliest"
        if kind == "specific":
            given = {(t, int(p)): int(o) for (t, p), o in initializer["offsets"].items()}
            rest = [tp for tp in todo if tp not in given]
            out.update({tp: given[tp] for tp in todo if tp in given})
            todo, kind = rest, initializer.get("reset", "earliest")
        if kind == "committed":
            committed = consumer.committed([TopicPartition(t, p) for t, p in todo], timeout=10)
            rest = []
            for tp in committed:
                if tp.offset >= 0:
                    out[(tp.topic, tp.partition)] = tp.offset
                else:
                    rest.append((tp.topic, tp.partition))
            todo, kind = rest, initializer.get("reset", "earliest")
        if kind == "timestamp":
            found = consumer.offsets_for_times([TopicPartition(t, p, int(initializer["timestamp"])) for t, p in todo],
                                               timeout=10)
            for tp in found:
                out[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else self._end(consumer, tp.topic,
                                                                                              tp.partition)
            return out
        for t, p in todo:
            low, high = consumer.get_watermark_offsets(TopicPartition(t, p), timeout=10)
            out[(t, p)] = low if kind == "earliest" else high
        return out

    @staticmethod
    def _end(consumer: Any, topic: str, partition: int) -> int:
        from confluent_kafka import TopicPartition

        return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1])

    def _stops(self, consumer: Any, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        stopping = self.spec["stopping"]
        if stopping.get("kind") == "specific":
            given = {(t, int(p)): int(o) for (t, p), o in stopping["offsets"].items()}
            return {tp: given.get(tp, self._end(consumer, *tp)) for tp in tps}
        if stopping.get("kind") == "timestamp":
            from confluent_kafka import TopicPartition

            found = consumer.offsets_for_times([TopicPartition(t, p, int(stopping["timestamp"])) for t, p in tps],
                                               timeout=10)
            return {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else self._end(consumer, tp.topic,
                                                                                            tp.partition)
                    for tp in found}
        return {tp: self._end(consumer, *tp) for tp in tps}  # latest: the end when the job starts

    def run(self, cancelled: Callable[[], bool]) -> None:
        from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

        consumer = self._consumer = Consumer(self._config())
        try:
            mine = self._mine(self._partitions(consumer))
            self._offsets = self._starting(consumer, mine, self.spec.get("starting") or {}, True)
            stops = self._stops(consumer, mine) if self.bounded else {}
            consumer.assign([TopicPartition(t, p, o) for (t, p), o in self._offsets.items()])
            log.info("%s (%d/%d) reads %s", self.name, self.ctx.subtask_index + 1, self.ctx.parallelism,
                     ", ".join(f"{t}[{p}] from {o}" + (f" to {stops[(t, p)]}" if stops else "")
                               for (t, p), o in sorted(self._offsets.items())) or "no partition yet")
            interval_s = float(self.spec.get("discovery_interval_ms", 300_000)) / 1000.0
            next_discovery = time.monotonic() + interval_s if interval_s > 0 and not self.bounded else float("inf")
            size = max(1, min(self.ctx.batch_size, int(self.spec.get("max_poll_records", 10_000))))
            topics = {t for t, _ in mine}
            single_topic = len(topics) == 1 and not self.spec.get("topic_pattern")
            topic = next(iter(topics)) if single_topic else ""
            while not cancelled():
                if self.bounded and all(self._offsets.get(tp, 0) >= end for tp, end in stops.items()):
                    return
                if time.monotonic() >= next_discovery:
                    next_discovery = time.monotonic() + interval_s
                    new = [tp for tp in self._mine(self._partitions(consumer)) if tp not in self._offsets]
                    if new:
                        start = self._starting(consumer, new, {}, False)
                        self._offsets.update(start)
                        consumer.incremental_assign([TopicPartition(t, p, o) for (t, p), o in start.items()])
                        log.info("%s (%d/%d) discovered %s", self.name, self.ctx.subtask_index + 1,
                                 self.ctx.parallelism, ", ".join(f"{t}[{p}]" for t, p in new))
                self._measure_lag(consumer)
                started = time.perf_counter_ns()
                messages = consumer.consume(num_messages=size, timeout=0.1)
                if not messages:
                    self.idle_ns += time.perf_counter_ns() - started
                    self._idle_watermark()
                    if self.bounded:  # read_committed: control records move the position past the last record
                        self._advance_idle(consumer, stops)
                    continue
                good = messages  # (the hot path: about one call into the client per record and column)
                if any([m.error() is not None for m in messages]):
                    for m in messages:
                        err = m.error()
                        if err is not None and err.code() != KafkaError._PARTITION_EOF:
                            raise KafkaSourceError(f"{self.name}: reading {m.topic()}[{m.partition()}] failed: "
                                                   f"{err}")
                    good = [m for m in messages if m.error() is None]
                if not good:
                    continue
                ends = self._last_offsets(good, topic if single_topic else None)
                if self.bounded and any(o >= stops.get(tp, 0) for tp, o in ends.items()):
                    for tp, o in ends.items():  # past its stop: that partition is done
                        if o >= stops.get(tp, 0):
                            self._offsets[tp] = max(self._offsets.get(tp, 0), stops.get(tp, 0))
                    good = [m for m in good if _offset(m) < stops.get(_tp(m), 0)]
                    if not good:
                        continue
                    ends = self._last_offsets(good, None)
                self._emit(good)
                for tp, o in ends.items():
                    self._offsets[tp] = max(self._offsets.get(tp, 0), o + 1)
        except KafkaException as exc:
            raise KafkaSourceError(f"{self.name}: {exc}") from exc
        finally:
            self._close_consumer()

    def _decode(self, messages: list[Any]) -> pa.Table:
        def where(i: int) -> str:
            m = messages[i]
            return f"topic {m.topic()} partition {m.partition()} offset {m.offset()}"

        return decode_values(self.spec.get("format", "string"), [m.value() for m in messages],
                             self.spec.get("schema"), where, self.spec.get("csv_columns"), self.spec.get("avro_schema"))

    @staticmethod
    def _last_offsets(messages: list[Any], topic: str | None) -> dict[tuple[str, int], int]:
        """The offset of each partition's last record in ``messages`` (``topic``: the only one)."""
        n = range(len(messages))
        if topic is not None:
            return {(topic, p): _offset(messages[i]) for p, i in dict(zip([m.partition() for m in messages], n)).items()}
        return {tp: _offset(messages[i]) for tp, i in dict(zip([_tp(m) for m in messages], n)).items()}

    def _advance_idle(self, consumer: Any, stops: dict[tuple[str, int], int]) -> None:
        """Nothing came: each unfinished partition's offset moves to the consumer's position
        (past control records), or to the log's start when the records before it are gone
        (deleted by retention before they were read: said in the log, as Kafka's reset does)."""
        from confluent_kafka import TopicPartition

        for tp, stop in stops.items():
            at = self._offsets.get(tp, 0)
            if at >= stop:
                continue
            pos = consumer.position([TopicPartition(*tp)])[0].offset
            if pos >= 0:
                self._offsets[tp] = max(at, pos)
                continue
            low = int(consumer.get_watermark_offsets(TopicPartition(*tp), timeout=10)[0])
            if low > at:
                log.warning("%s: %s[%d] starts at offset %d now: records %d to %d were deleted before they were "
                            "read", self.name, tp[0], tp[1], low, at, low - 1)
                self._offsets[tp] = low

    def _emit(self, messages: list[Any]) -> None:
        try:
            table = self._decode(messages)
        except KafkaSourceError:
            tag = self.spec.get("malformed_tag")
            if not tag:
                raise
            bad = []
            for i, m in enumerate(messages):  # (the slow path: which ones do not decode)
                try:
                    self._decode([m])
                except KafkaSourceError as exc:
                    bad.append((i, str(exc)))
            self._malformed(tag, [messages[i] for i, _ in bad], [e for _, e in bad])
            skip = {i for i, _ in bad}
            messages = [m for i, m in enumerate(messages) if i not in skip]
            if not messages:
                return
            table = self._decode(messages)
        for column in self.spec.get("metadata_columns") or ():
            if column in table.column_names:
                raise KafkaSourceError(f"{self.name}: the metadata column {column!r} clashes with a column of the "
                                       "records' values")
            if column == "key":
                arr = pa.array([m.key() for m in messages], pa.binary())
            elif column == "topic":
                arr = pa.array([m.topic() for m in messages], pa.string())
            elif column == "partition":
                arr = pa.array([m.partition() for m in messages], pa.int32())
            elif column == "offset":
                arr = pa.array([m.offset() for m in messages], pa.int64())
            elif column == "timestamp":
                arr = pa.array([m.timestamp()[1] for m in messages], pa.timestamp("ms"))
            else:
                arr = pa.array([[(k, v) for k, v in (m.headers() or [])] for m in messages],
                               pa.map_(pa.string(), pa.binary()))
            table = table.append_column(column, arr)
        for batch in table.to_batches():
            self.output.collect(batch)
        self.records += len(messages)
        if self.watermarks is not None:
            self._watermark(table, messages)

    def _malformed(self, tag: str, messages: list[Any], errors: list[str]) -> None:
        """Records that do not decode, to side output ``tag``: where each is, its bytes, why."""
        self.malformed += len(messages)
        log.warning("%s (%d/%d): %d records do not decode (side output %r), e.g. %s", self.name,
                    self.ctx.subtask_index + 1, self.ctx.parallelism, len(messages), tag, errors[0])
        self.output.collect_side(tag, pa.record_batch({
            "topic": pa.array([m.topic() for m in messages], pa.string()),
            "partition": pa.array([m.partition() for m in messages], pa.int32()),
            "offset": pa.array([m.offset() for m in messages], pa.int64()),
            "key": pa.array([m.key() for m in messages], pa.binary()),
            "value": pa.array([m.value() for m in messages], pa.binary()),
            "error": pa.array(errors, pa.string())}))

    # per-partition watermarks (FLIP-27): the source emits the minimum over partitions not idle
    def _watermark(self, table: pa.Table, messages: list[Any]) -> None:
        assert self.watermarks is not None
        ts = event_times_ms(table.combine_chunks().to_batches()[0] if table.num_rows else table,
                            self.watermarks.timestamp_column, self.name).tolist()
        now = self.ctx.clock()
        by_tp: dict[tuple[str, int], list[int]] = {}
        for m, t in zip(messages, ts):
            by_tp.setdefault(_tp(m), []).append(t)
        for tp, times in by_tp.items():
            held = self._wm.get(tp)
            if held is None:
                held = self._wm[tp] = [MIN_WATERMARK, self.watermarks.create_generator(), now]
            out = _PartitionOutput(held)
            for t in times:
                self.call_user(held[1].on_event, None, t, out)
            self.call_user(held[1].on_periodic_emit, out)
            held[2] = now
        self._emit_min()

    def _idle_watermark(self) -> None:
        if self.watermarks is not None and self._wm:
            self._emit_min()

    def _emit_min(self) -> None:
        assert self.watermarks is not None
        idleness, now = self.watermarks.idleness_ms, self.ctx.clock()
        live = [h[0] for h in self._wm.values() if not idleness or now - h[2] < idleness]
        for tp in self._offsets:  # a partition of ours that gave nothing yet holds the watermark back
            if tp not in self._wm and not idleness:
                return
        if live:
            low = min(live)
            if low > self._emitted:
                self._emitted = low
                self.output.emit_watermark(Watermark(low))

    def _close_consumer(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close()
            except Exception:  # noqa: BLE001 - closing a consumer whose broker is gone
                log.debug("closing the Kafka consumer", exc_info=True)

    def close(self) -> None:
        self._close_consumer()


def _tp(message: Any) -> tuple[str, int]:
    return str(message.topic()), int(message.partition())


def _offset(message: Any) -> int:
    return int(message.offset())


class _PartitionOutput:
    def __init__(self, held: list[Any]) -> None:
        self.held = held

    def emit_watermark(self, timestamp: int) -> None:
        self.held[0] = max(self.held[0], int(timestamp))

    def mark_idle(self) -> None:
        pass
