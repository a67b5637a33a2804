"""A source of your own with operator state: numbered partitions read in parallel, each
subtask reading the partitions whose number modulo the parallelism is its index, every
partition's offset kept in union-list state (the pattern of Flink's Kafka consumer): after a
failure, or restored from a savepoint at another parallelism, every subtask gets every offset and
resumes the partitions it now owns where they were.

    yarnflow run -D execution.checkpointing.interval=1s examples/partitions_source.py --output out/rows

A savepoint of it, and the job started again from it at another parallelism, on a session:

    yarnflow session start &                                # prints its address, HOST:PORT
    yarnflow run --address HOST:PORT --detached -D execution.checkpointing.interval=1s \
        examples/partitions_source.py --rows 10000 --output out/resumed       # prints its id, JOB_ID
    yarnflow savepoint --address HOST:PORT JOB_ID savepoints/    # prints the savepoint's path, SAVEPOINT
    yarnflow cancel --address HOST:PORT JOB_ID
    yarnflow run --address HOST:PORT -s SAVEPOINT -p 3 -D execution.checkpointing.interval=1s \
        examples/partitions_source.py --rows 10000 --output out/resumed

The rows in out/resumed hold every (partition, offset) once.

--partitions, --rows  how many partitions and rows per partition (default 8 x 2000)
--output              a folder of Parquet files (partition, offset, value); default: stdout
"""

import argparse

import yarnflow
from yarnflow import CheckpointedFunction, ListStateDescriptor, SourceFunction

OFFSETS = ListStateDescriptor("offsets")


class Partitions(SourceFunction, CheckpointedFunction):
    def __init__(self, partitions, rows):
        self.partitions, self.rows = partitions, rows

    def initialize_state(self, ctx):
        self.state = ctx.get_operator_state_store().get_union_list_state(OFFSETS)
        self.restored = dict(self.state.get())  # every subtask's (partition, offset) pairs

    def open(self, ctx):
        mine = [p for p in range(self.partitions) if p % ctx.parallelism == ctx.subtask_index]
        self.offsets = {p: self.restored.get(p, 0) for p in mine}

    def snapshot_state(self, ctx):
        self.state.update(sorted(self.offsets.items()))

    def run(self, ctx):
        while not ctx.is_cancelled():
            live = [p for p, offset in self.offsets.items() if offset < self.rows]
            if not live:
                return
            for p in live:
                offset = self.offsets[p]
                ctx.collect({"partition": p, "offset": offset, "value": (p * 7919 + offset) % 1000})
                self.offsets[p] = offset + 1  # right after collect: a checkpoint sees both or neither
            ctx.sleep(0.001)


def main():
    parser = argparse.ArgumentParser(prog="partitions_source", description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--output", help="folder for the rows (Parquet); default: print a count per partition")
    args = parser.parse_args()

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_runtime_mode("STREAMING")
    rows = env.add_source(Partitions(args.partitions, args.rows), name="partitions").uid("partitions")
    if args.output:
        rows.sink_to_parquet(args.output).uid("sink")
    else:
        rows.key_by("partition").count().uid("count").print()
    env.execute("partitions source")


if __name__ == "__main__":
    main()
