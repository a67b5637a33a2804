"""The Kafka benchmark's pipeline as a Bytewax 0.21 dataflow, for ``kafka_pipeline.py``: JSON
events from a topic (Bytewax's KafkaSource, stopping at the partitions' ends) -> ``json.loads``
-> a count per key in 1 s tumbling event-time windows -> Bytewax's KafkaSink (not
transactional: Bytewax offers no exactly-once Kafka sink). Each result is
``{"k", "window_id", "n"}``.

Run by the benchmark in an environment of its own (Bytewax is not a yarnflow dependency), as
``python -m bytewax.run bytewax_kafka:flow -i <process> -a <addresses>`` once per process, with
``KB_BROKER``, ``KB_INPUT`` and ``KB_OUTPUT`` set. Not imported by yarnflow."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from typing import Any

import bytewax.operators as op  # type: ignore[import-not-found]
from bytewax.connectors.kafka import KafkaSink, KafkaSinkMessage, KafkaSource  # type: ignore[import-not-found]
from bytewax.dataflow import Dataflow  # type: ignore[import-not-found]
from bytewax.operators.windowing import EventClock, TumblingWindower, count_window  # type: ignore[import-not-found]

BROKER, INPUT, OUTPUT = os.environ.get("KB_BROKER", ""), os.environ.get("KB_INPUT", ""), os.environ.get("KB_OUTPUT", "")
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _event_time(event: dict[str, Any]) -> datetime:
    return EPOCH + timedelta(milliseconds=event["ts"])


def _message(item: Any) -> Any:
    key, (window_id, n) = item
    return KafkaSinkMessage(key=key.encode(), value=json.dumps({"k": key, "window_id": window_id, "n": n}).encode())


flow = Dataflow("kafka-windows")
events = op.map("parse", op.input("in", flow, KafkaSource([BROKER], [INPUT], tail=False, batch_size=10_000,
                                                    add_config={"receive.message.max.bytes": str(1 << 30)})),
                lambda m: json.loads(m.value))
# (a wait of an hour of event time: no record is late, as yarnflow's bounded source counts every one; the
# partitions of a worker are read unevenly, and with no wait Bytewax drops the records behind)
counts = count_window("count", events, EventClock(_event_time, wait_for_system_duration=timedelta(hours=1)),
                      TumblingWindower(length=timedelta(seconds=1), align_to=EPOCH), key=lambda e: e["k"])
op.output("out", op.map("serialise", counts.down, _message), KafkaSink([BROKER], OUTPUT))
