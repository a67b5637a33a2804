"""Kafka in, Kafka out, exactly once: JSON events {"key", "ts", "value"} from a topic, summed
per key in 1 s tumbling event-time windows, the results written to another topic in Kafka
transactions (visible to read_committed consumers when the checkpoint that covers them
completes).

    yarnflow run -D execution.checkpointing.interval=1s examples/kafka_windows.py \\
        --bootstrap 127.0.0.1:9092 --input events --output sums --bounded

--bounded stops at the ends the input topic has when the job starts; without it the job runs
until cancelled. A local broker for trying it (noida-db speaks Kafka's protocol, transactions
included; `pip install noida-db==0.2.3`):

    noida-db start --data-dir /tmp/kafka --host 127.0.0.1 --only kafka --kafka-port 9092
"""

import argparse

import yarnflow
from yarnflow.kafka import DeliveryGuarantee, KafkaOffsetsInitializer, KafkaSink, KafkaSource
from yarnflow.windows import TumblingEventTimeWindows, WatermarkStrategy


def main():
    parser = argparse.ArgumentParser(prog="kafka_windows", description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="the brokers (host:port,...)")
    parser.add_argument("--input", default="events", help="the topic of JSON events")
    parser.add_argument("--output", default="sums", help="the topic of the window sums")
    parser.add_argument("--group", default="kafka-windows", help="the consumer group (offsets for lag tools)")
    parser.add_argument("--window", type=int, default=1000, help="window size, ms")
    parser.add_argument("--bounded", action="store_true", help="stop at the input's ends at the start")
    args = parser.parse_args()

    env = yarnflow.StreamExecutionEnvironment()
    env.set_runtime_mode("STREAMING")
    builder = (KafkaSource.builder().set_bootstrap_servers(args.bootstrap).set_topics(args.input)
               .set_group_id(args.group).set_starting_offsets(KafkaOffsetsInitializer.committed_offsets("earliest"))
               .set_value_format("json"))
    if args.bounded:
        builder = builder.set_bounded(KafkaOffsetsInitializer.latest())
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(200).with_timestamp_column("ts").with_idleness(5000)
    sums = (env.from_source(builder.build(), strategy, "events").uid("events")
            .key_by("key").window(TumblingEventTimeWindows.of(args.window)).sum("value").uid("sums"))
    sums.sink_to(KafkaSink.builder().set_bootstrap_servers(args.bootstrap).set_topic(args.output)
                 .set_key_columns("key").set_value_format("json")
                 .set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE)
                 .set_transactional_id_prefix(f"kafka-windows-{args.output}").build()).uid("sink")
    env.execute("kafka-windows")


if __name__ == "__main__":
    main()
