"""Kafka's sink operator (Flink's KafkaSink); how it commits: ``worker/operators/kafka.py``'s
module docstring."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pyarrow as pa

from yarnflow.common.errors import YarnflowError
from yarnflow.worker.operators.base import Operator
from yarnflow.worker.operators.kafka_formats import encode_keys, encode_values

log = logging.getLogger(__name__)

PENDING_TABLE = "kafka-pending"
COMMIT_ATTEMPTS = 3  # transactions tried (each by a new producer after the first) before the task fails
COMMIT_ATTEMPT_S = 90.0  # how long one may take: librdkafka's own timeouts (30 s + 60 s) and then some


class KafkaSinkError(YarnflowError, RuntimeError):
    """The Kafka sink lost a delivery or a transaction failed."""


class KafkaSinkOperator(Operator):
    """See the module docstring. ``spec``: ``yarnflow.kafka.KafkaSink``'s settings."""

    kind = "kafka_sink"
    connector_sink = True  # (a pipeline may end with it)

    def __init__(self, spec: dict[str, Any], name: str | None = None, uid: str | None = None) -> None:
        super().__init__(name or "kafka_sink", uid)
        self.spec = spec
        self.guarantee = spec.get("delivery_guarantee", "AT_LEAST_ONCE")
        self._producer: Any = None
        self._marker_consumer: Any = None
        self._buffer: list[tuple[str, int | None, bytes | None, bytes]] = []  # rows since the last barrier
        self._pending: dict[int, list[tuple[str, int | None, bytes | None, bytes]]] = {}
        self._restored: list[tuple[str, int, list[tuple[str, int | None, bytes | None, bytes]]]] = []
        self._errors: list[str] = []
        self._lost: dict[int, list[str]] = {}  # id(transactional producer) -> broker connection errors
        self._abandoned: list[Any] = []  # producers replaced after a lost broker or a failed commit
        self.rows = 0

    @property
    def exactly_once(self) -> bool:
        return self.guarantee == "EXACTLY_ONCE"

    @property
    def needs_final_checkpoint(self) -> bool:
        return self.exactly_once and self.ctx.checkpointing

    def transactional_id(self, subtask: int | None = None) -> str:
        prefix = self.spec.get("transactional_id_prefix") or f"yarnflow-{self.name}"
        return f"{prefix}-{self.ctx.subtask_index if subtask is None else subtask}"

    def _base(self) -> dict[str, Any]:
        conf = {"bootstrap.servers": self.spec["bootstrap_servers"]}
        conf.update(self.spec.get("properties") or {})
        return conf

    def open(self) -> None:
        from confluent_kafka import Producer

        if not self.exactly_once:
            conf = {**self._base(), "enable.idempotence": self.guarantee == "AT_LEAST_ONCE"}
            self._producer = Producer(conf)
            return
        if not self.ctx.checkpointing:  # one transaction for the whole (bounded) input
            self._producer = self._transactional(self.transactional_id())
            self._producer.begin_transaction()
            return
        by_owner: dict[str, list[tuple[int, list[Any]]]] = {}
        for owner_id, cid, rows in self._restored:
            by_owner.setdefault(owner_id, []).append((cid, rows))
        for owner_id, entries in sorted(by_owner.items()):  # restored: commit what the checkpoint covers
            if owner_id != self.transactional_id():
                producer = self._commit_pending(self._transactional(owner_id), owner_id, dict(entries))
                producer.flush(0)
                self._lost.pop(id(producer), None)
        self._producer = self._transactional(self.transactional_id())
        own = dict(by_owner.get(self.transactional_id(), []))
        if own:
            self._producer = self._commit_pending(self._producer, self.transactional_id(), own)
        self._restored = []

    def _transactional(self, transactional_id: str) -> Any:
        """A producer of ``transactional_id``; its ``init_transactions`` aborts (fences) what an
        earlier producer of that id left open. Its ``lost`` list collects the broker connection
        errors it reports (served by ``poll``)."""
        from confluent_kafka import KafkaError, Producer

        lost: list[str] = []

        def on_error(err: Any) -> None:
            if err.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
                lost.append(str(err))

        producer = Producer({**self._base(), "transactional.id": transactional_id, "error_cb": on_error})
        producer.init_transactions(30)
        self._lost[id(producer)] = lost
        return producer

    def _marker(self, transactional_id: str, topic: str) -> int:
        """The last checkpoint committed under ``transactional_id`` (0: none)."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({**self._base(), "group.id": transactional_id, "enable.auto.commit": False})
        try:
            [tp] = consumer.committed([TopicPartition(topic, 0)], timeout=30)
            return max(0, tp.offset)
        finally:
            consumer.close()

    def _commit_pending(self, producer: Any, transactional_id: str,
                        pending: dict[int, list[tuple[str, int | None, bytes | None, bytes]]]) -> Any:
        """Produce the rows of the checkpoints in ``pending`` not committed yet, with the marker
        of the last one, in one transaction; return the producer to use from now on.

        A producer that lost its broker connection since its last transaction is replaced
        before it starts one (librdkafka's transactional producer can hang past its own
        timeouts on a broker that went away and came back), and a transaction that fails or
        does not end within ``COMMIT_ATTEMPT_S`` is redone from the start by a new producer:
        its ``init_transactions`` aborts what the old one left open, and the rows are all in
        ``pending`` (write-ahead), so nothing is lost or written twice. KafkaSinkError after
        ``COMMIT_ATTEMPTS`` tries: the task fails and the job restarts from its checkpoint,
        whose state still holds these rows."""
        if not pending:
            return producer
        topic = self.spec["topic"]
        done = self._marker(transactional_id, topic)
        todo = {cid: rows for cid, rows in pending.items() if cid > done}
        if not todo:
            log.info("%s: checkpoints %s of %s were committed already", self.name, sorted(pending), transactional_id)
            return producer
        last, errors = max(todo), list[str]()
        for _ in range(COMMIT_ATTEMPTS):
            producer.poll(0)  # (serves the error callback)
            if self._lost.get(id(producer)) or errors:
                log.warning("%s (%d/%d): %s; a new producer of %s redoes the transaction of checkpoints %s",
                            self.name, self.ctx.subtask_index + 1, self.ctx.parallelism,
                            errors[-1] if errors else f"the producer lost its broker ({self._lost[id(producer)][-1]})",
                            transactional_id, sorted(todo))
                self._abandon(producer)
                producer = self._transactional(transactional_id)
            outcome: dict[str, Any] = {}
            worker = threading.Thread(target=self._transaction, args=(producer, todo, last, transactional_id, outcome),
                                      name=f"kafka-commit {transactional_id}", daemon=True)
            worker.start()
            worker.join(COMMIT_ATTEMPT_S)
            if "count" in outcome:
                log.info("%s (%d/%d): committed checkpoints %s (%d records) as %s", self.name,
                         self.ctx.subtask_index + 1, self.ctx.parallelism, sorted(todo), outcome["count"],
                         transactional_id)
                return producer
            errors.append(outcome.get("error") or f"the transaction did not end within {COMMIT_ATTEMPT_S:.0f} s")
        raise KafkaSinkError(f"{self.name}: committing checkpoint {last} as {transactional_id} failed "
                             f"{COMMIT_ATTEMPTS} times: {'; '.join(errors)}")

    def _transaction(self, producer: Any, todo: dict[int, list[tuple[str, int | None, bytes | None, bytes]]],
                     last: int, transactional_id: str, outcome: dict[str, Any]) -> None:
        from confluent_kafka import Consumer, TopicPartition

        topic = self.spec["topic"]
        marker_group = Consumer({**self._base(), "group.id": transactional_id, "enable.auto.commit": False})
        try:
            producer.begin_transaction()
            count = 0
            for cid in sorted(todo):
                for t, partition, key, value in todo[cid]:
                    self._produce(producer, t, partition, key, value)
                    count += 1
            producer.send_offsets_to_transaction([TopicPartition(topic, 0, last)],
                                                 marker_group.consumer_group_metadata(), 30)
            producer.commit_transaction(60)
            outcome["count"] = count
        except Exception as exc:  # noqa: BLE001 - confluent_kafka.KafkaException; reported by the caller
            outcome["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            marker_group.close()

    def _abandon(self, producer: Any) -> None:
        """Drop a producer that is replaced; one stuck in a call stays referenced (destroying it
        would wait for that call) until the operator closes."""
        self._lost.pop(id(producer), None)
        if producer is self._producer:
            self._producer = None
        self._abandoned.append(producer)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}[{msg.partition()}]: {err}")

    def _produce(self, producer: Any, topic: str, partition: int | None, key: bytes | None, value: bytes) -> None:
        kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": self._on_delivery}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                producer.produce(topic, **kwargs)
                return
            except BufferError:  # the local queue is full: deliver some first
                producer.poll(0.05)

    def _rows(self, batch: pa.RecordBatch) -> list[tuple[str, int | None, bytes | None, bytes]]:
        table = pa.Table.from_batches([batch])
        topic_column = self.spec.get("topic_column")
        topics = table.column(topic_column).to_pylist() if topic_column else [self.spec["topic"]] * table.num_rows
        value_columns = [c for c in table.column_names if c not in (self.spec.get("exclude_columns") or ())]
        values = encode_values(self.spec.get("format", "json"), table.select(value_columns),
                               self.spec.get("value_column"), self.spec.get("avro_schema"))
        keys = encode_keys(table, list(self.spec.get("key_columns") or ()))
        return [(str(t), None, k, v) for t, k, v in zip(topics, keys, values)]

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if not batch.num_rows:
            return
        rows = self._rows(batch)
        self.rows += len(rows)
        if self.exactly_once and self.ctx.checkpointing:
            self._buffer.extend(rows)
            return
        for t, partition, key, value in rows:
            self._produce(self._producer, t, partition, key, value)
        self._producer.poll(0)
        self._raise_errors()

    def _raise_errors(self) -> None:
        if self._errors:
            raise KafkaSinkError(f"{self.name}: {len(self._errors)} records were not delivered, e.g. {self._errors[0]}")

    def _flush(self) -> None:
        left = self._producer.flush(60)
        if left:
            raise KafkaSinkError(f"{self.name}: {left} records not delivered within 60 s")
        self._raise_errors()

    def snapshot_state(self, checkpoint_id: int) -> dict[str, pa.Table]:
        if not self.exactly_once:
            if self.guarantee == "AT_LEAST_ONCE" and self._producer is not None:
                self._flush()  # every record before the barrier is in Kafka
            return {}
        if self._buffer:
            self._pending[checkpoint_id] = self._buffer
            self._buffer = []
        entries = [(cid, row) for cid in sorted(self._pending) for row in self._pending[cid]]
        table = pa.table({
            "owner": pa.array([self.transactional_id()] * len(entries), pa.string()),
            "checkpoint_id": pa.array([cid for cid, _ in entries], pa.int64()),
            "topic": pa.array([r[0] for _, r in entries], pa.string()),
            "key": pa.array([r[2] for _, r in entries], pa.binary()),
            "value": pa.array([r[3] for _, r in entries], pa.binary()),
        })
        if not entries:  # (an owner row without records: the subtask's id, so a rescale keeps it)
            table = pa.table({"owner": [self.transactional_id()], "checkpoint_id": pa.array([0], pa.int64()),
                              "topic": pa.array([None], pa.string()), "key": pa.array([None], pa.binary()),
                              "value": pa.array([None], pa.binary())})
        return {PENDING_TABLE: table}

    def initialize_state(self, state: dict[str, pa.Table]) -> None:
        table = state.get(PENDING_TABLE)
        if table is None:
            return
        grouped: dict[tuple[str, int], list[tuple[str, int | None, bytes | None, bytes]]] = {}
        for row in table.to_pylist():
            if row["value"] is None:
                continue
            grouped.setdefault((row["owner"], int(row["checkpoint_id"])), []).append(
                (row["topic"], None, row["key"], row["value"]))
        self._restored = [(o, cid, rows) for (o, cid), rows in sorted(grouped.items())]

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if not (self.exactly_once and self.ctx.checkpointing):
            return
        done = {cid: rows for cid, rows in self._pending.items() if cid <= checkpoint_id}
        if not done:
            return
        self._producer = self._commit_pending(self._producer, self.transactional_id(), done)
        for cid in done:
            del self._pending[cid]

    def finish(self) -> None:
        if self._producer is None:
            return
        if self.exactly_once and not self.ctx.checkpointing:
            try:
                self._producer.commit_transaction(60)
            except Exception as exc:  # noqa: BLE001 - confluent_kafka.KafkaException
                raise KafkaSinkError(f"{self.name}: committing the transaction failed: {exc}") from exc
        elif not self.exactly_once:
            self._flush()

    def close(self) -> None:
        abandoned, self._abandoned = self._abandoned, []
        if abandoned:  # (dropped off the task's thread: one stuck in a call cannot be destroyed yet)
            threading.Thread(target=abandoned.clear, name="kafka-abandoned-producers", daemon=True).start()
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.flush(0 if self.exactly_once else 5)
            except Exception:  # noqa: BLE001
                log.debug("closing the Kafka producer", exc_info=True)
