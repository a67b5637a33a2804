"""A real Kafka-protocol broker for tests: noida-db's Kafka service (PyPI ``noida-db``, one
binary; it gets transactions right: read_committed, transactional offsets, fencing), on
127.0.0.1 and a free port, its data in a folder of the test session. Started by the
``kafka_broker`` fixture, killed by pid at the end (and when the test process dies).

librdkafka's mock cluster is no stand-in: it does not enforce transaction semantics."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TAG_VAR
from tests.harness import ServerProcess, free_port
from tests.zookeeper import _die_with_parent


def _binary() -> str | None:
    """The broker binary itself, not the ``noida-db`` console script: that one runs the binary
    as its child, which a SIGKILL of the script (by pid, as fixtures stop what they start)
    would leave running."""
    try:
        import noida_db
    except ImportError:
        return None
    candidate = os.path.join(os.path.dirname(noida_db.__file__), "noida-db")
    if not os.path.isfile(candidate):
        return None
    if not os.access(candidate, os.X_OK):
        os.chmod(candidate, 0o755)  # (as the console script does before it runs it)
    return candidate


class KafkaBroker(ServerProcess):
    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        work_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.tag = f"kafka-{uuid.uuid4().hex}"
        self._process: subprocess.Popen[bytes] | None = None
        binary = _binary()
        if binary is None:
            pytest.fail("the Kafka tests need noida-db (pip install 'noida-db==0.2.3', a test extra)")
        self._command = [binary, "start", "--data-dir", str(work_dir / "data"), "--host", "127.0.0.1", "--only",
                         "kafka", "--kafka-port", str(self.port)]

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        from confluent_kafka.admin import AdminClient

        env = {**os.environ, TAG_VAR: self.tag}  # (its own tag: a restart inside a test is not that test's leak)
        self._launch(_die_with_parent(self._command), self.work_dir / "broker.log",
                     lambda: AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0}).list_topics(timeout=1),
                     "the Kafka broker", timeout, env=env)

    def restart(self) -> None:
        """Stop the broker cleanly (SIGTERM) and start it again on the same port and data: noida-db
        saves its data when it stops, and a SIGKILL loses what it had not saved (Kafka's log on
        disk would survive one; this broker's would not, so the tests do not claim it)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join((self.work_dir / "broker.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- helpers for tests ------------------------------------------------------------------------
    def create_topic(self, partitions: int = 1, name: str | None = None) -> str:
        from confluent_kafka.admin import AdminClient, NewTopic

        topic = name or f"t-{uuid.uuid4().hex[:10]}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap})  # (kept: its futures die with it)
        for f in admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)]).values():
            f.result(30)
        return topic

    def add_partitions(self, topic: str, total: int) -> None:
        from confluent_kafka.admin import AdminClient, NewPartitions

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for f in admin.create_partitions([NewPartitions(topic, total)]).values():
            f.result(30)

    def produce(self, topic: str, values: list[bytes], partition: int | None = None,
                keys: list[bytes] | None = None, timestamps: list[int] | None = None) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        for i, value in enumerate(values):
            kwargs: dict[str, Any] = {"value": value}
            if partition is not None:
                kwargs["partition"] = partition
            if keys is not None:
                kwargs["key"] = keys[i]
            if timestamps is not None:
                kwargs["timestamp"] = timestamps[i]
            while True:
                try:
                    producer.produce(topic, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.05)
        assert producer.flush(60) == 0, "the test's records were not all delivered"

    def read_all(self, topic: str, isolation: str = "read_committed", idle_s: float = 2.0) -> list[Any]:
        """Every record of ``topic`` (all partitions) a consumer of ``isolation`` sees, read until
        nothing came for ``idle_s``."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                             "isolation.level": isolation, "enable.auto.commit": False,
                             "auto.offset.reset": "earliest"})
        try:
            partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
            out: list[Any] = []
            quiet_since = time.monotonic()
            while time.monotonic() - quiet_since < idle_s:
                messages = consumer.consume(1000, 0.2)
                good = [m for m in messages if m.error() is None]
                if good:
                    out.extend(good)
                    quiet_since = time.monotonic()
            return out
        finally:
            consumer.close()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
