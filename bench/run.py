"""One entry point for every benchmark: ``python bench/run.py NAME [options]`` prints one JSON
line with ``name``, the measured figures and ``verified`` (true when the result was checked).
``python bench/run.py --list`` names them. Benchmarks are run by hand, never by the tests;
record what you measure in bench/RESULTS.md with the command."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _rocksdb_keys(args: argparse.Namespace) -> dict[str, Any]:
    from rocksdb_keys import run_rocksdb_keys

    return run_rocksdb_keys(keys=args.keys, memory=args.memory, managed=not args.unmanaged)


def _rpc(args: argparse.Namespace) -> dict[str, Any]:
    from rpc_bench import run_rpc

    return run_rpc(calls=args.calls, warmup=args.warmup, rounds=args.rounds)


def _submit_latency(args: argparse.Namespace) -> dict[str, Any]:
    from submit_latency import run_submit_latency

    return run_submit_latency(submissions=args.submissions, warmup=args.warmup)


def _w(name: str) -> Callable[[argparse.Namespace], dict[str, Any]]:
    def run(args: argparse.Namespace) -> dict[str, Any]:
        import workloads

        fn = workloads.run_w1 if name == "w1" else workloads.run_w2
        mode = args.mode or ("BATCH" if name == "w1" else "STREAMING")
        return fn(records=args.records, parallelism=args.parallelism, input_dir=args.input, mode=mode,
                  conf=_conf(args))

    return run


def _conf(args: argparse.Namespace) -> dict[str, str] | None:
    return dict(kv.split("=", 1) for kv in args.conf) or None


def _rowpath(args: argparse.Namespace) -> dict[str, Any]:
    from rowpath import run_rowpath

    return run_rowpath(records=args.records, parallelism=args.parallelism, input_dir=args.input,
                       mode=args.mode or "BATCH", conf=_conf(args), function=args.function,
                       bytewax_python=args.bytewax_python, repeat=args.repeat)


def _rowpath_layout(args: argparse.Namespace) -> dict[str, Any]:
    from rowpath import run_layout

    taskexecutors, slots = (int(x) for x in args.layout.split("x"))
    return run_layout(args.records, args.parallelism, (taskexecutors, slots), args.mode or "BATCH", _conf(args),
                      args.input)


def _rowpath_args(p: argparse.ArgumentParser) -> None:
    _w_args(p)
    p.add_argument("--function", choices=["map", "realistic", "filter", "flat_map", "reduce", "process", "all"],
                   default="map",
                   help="the kind of per-row function timed (default: map, the README's first example)")
    p.add_argument("--bytewax-python", default=None,
                   help="realistic: a Python with bytewax 0.21 installed, to run the same word count as a Bytewax "
                        "dataflow in the same run (default: $BYTEWAX_PYTHON; without it, skipped)")
    p.add_argument("--repeat", type=int, default=3,
                   help="runs of each job (and of Bytewax's dataflow); every figure is their median (default: 3: "
                        "a job of 5,000,000 records takes well under a second, so one run is mostly noise)")


def _w_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--records", type=int, default=5_000_000)
    p.add_argument("--input", default=None, help="a folder of Parquet files with the workload's columns")
    p.add_argument("--mode", choices=["STREAMING", "BATCH"], default=None,
                   help="runtime mode (default: BATCH for w1, STREAMING for w2)")
    p.add_argument("-D", dest="conf", action="append", default=[], metavar="KEY=VALUE",
                   help="configuration of the job's cluster, e.g. -D state.backend.type=rocksdb")


def _scheduling(args: argparse.Namespace) -> dict[str, Any]:
    from scheduling import run_scheduling

    return run_scheduling(args.subtasks, args.mode)


def _recovery(args: argparse.Namespace) -> dict[str, Any]:
    from recovery import run_recovery

    return run_recovery(args.kills)


def _checkpoint_overhead(args: argparse.Namespace) -> dict[str, Any]:
    from checkpoint_overhead import run_checkpoint_overhead

    return run_checkpoint_overhead(args.records, args.parallelism, args.interval, args.rounds, args.unaligned)


def _backpressure(args: argparse.Namespace) -> dict[str, Any]:
    from backpressure import run_backpressure

    return run_backpressure(args.records, args.parallelism, args.interval, args.debloat, args.function)


def _metrics_overhead(args: argparse.Namespace) -> dict[str, Any]:
    from metrics_overhead import run_metrics_overhead

    return run_metrics_overhead(args.records, args.parallelism, args.rounds, args.mode, args.watch_interval)


def _am_failover(args: argparse.Namespace) -> dict[str, Any]:
    from am_failover import run_am_failover

    return run_am_failover(args.rows, args.interval, args.session_timeout, extra=_conf(args))


def _checkpoint_size(args: argparse.Namespace) -> dict[str, Any]:
    from checkpoint_size import run_checkpoint_size

    return run_checkpoint_size(args.keys, process_keys=args.process_keys)


def _w3(args: argparse.Namespace) -> dict[str, Any]:
    from w3 import run_w3

    return run_w3(args.input, args.engine, args.parallelism, args.orders, args.hint, _conf(args), args.prefilter,
                  args.target)


def _batch_agg(args: argparse.Namespace) -> dict[str, Any]:
    from batch_agg import run_batch_agg

    return run_batch_agg(args.rows, args.keys, args.input, args.parallelism, _conf(args))


def _yarn_submit(args: argparse.Namespace) -> dict[str, Any]:
    from yarn_submit import run_yarn_submit

    return run_yarn_submit(args.runs, args.words)


def _state(args: argparse.Namespace) -> dict[str, Any]:
    from state_bench import run_state

    return run_state(args.backend, args.keys, args.work_dir, args.vectorised, args.rocksdb_memory_mb)


def _local_recovery(args: argparse.Namespace) -> dict[str, Any]:
    from local_recovery import run_local_recovery

    if args.corrupt_copies:
        from local_recovery import run_corrupt

        return run_corrupt(args.state_mb, args.value_bytes, args.work_dir)
    return run_local_recovery(args.state_mb, args.value_bytes, args.work_dir)


def _kafka(args: argparse.Namespace) -> dict[str, Any]:
    from kafka_pipeline import run_kafka

    return run_kafka(args.records, args.bytewax_python, args.work_dir)


def _multi_host(args: argparse.Namespace) -> dict[str, Any]:
    from multi_host import run_multi_host

    return run_multi_host(args.records, args.work_dir)


def _rescale(args: argparse.Namespace) -> dict[str, Any]:
    from rescale import run_rescale

    return run_rescale(args.keys, args.rows)


def _fixed_costs(args: argparse.Namespace) -> dict[str, Any]:
    from fixed_costs import run_fixed_costs

    return run_fixed_costs(args.runs, args.submissions, args.work_dir)


def _cli_workloads(args: argparse.Namespace) -> dict[str, Any]:
    from cli_workloads import run_cli_workloads

    return run_cli_workloads(args.records, args.orders, args.bytewax_python, args.work_dir, args.only)


def _pyflink_wordcount(args: argparse.Namespace) -> dict[str, Any]:
    from pyflink_wordcount import run_pyflink_wordcount

    return run_pyflink_wordcount(args.words, args.pyflink_python, args.work_dir)


def _chaos(args: argparse.Namespace) -> dict[str, Any]:
    from chaos import run_chaos

    return run_chaos(args.kills, args.rows, args.interval, args.seed)


BENCHMARKS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[..., dict[str, Any]]]] = {
    "rpc": ("calls/s and latency of heartbeat-sized calls between two processes, yarnflow's RPC layer "
            "against bare Thrift in the same run",
            lambda p: (p.add_argument("--calls", type=int, default=20000),
                       p.add_argument("--warmup", type=int, default=1000),
                       p.add_argument("--rounds", type=int, default=2)), _rpc),
    "submit-latency": ("session mode: submit -> RUNNING and submit -> FINISHED of a two-vertex job",
                       lambda p: (p.add_argument("--submissions", type=int, default=50),
                                  p.add_argument("--warmup", type=int, default=3)), _submit_latency),
    "rowpath-layout": ("the realistic map called per row (vectorised with -D python.row-functions.vectorize=true) "
                       "on one cluster layout (TaskExecutors x slots), with the memory of the Python workers it "
                       "started",
                       lambda p: (_w_args(p), p.add_argument("--layout", default="1x2",
                                                             help="TaskExecutors x slots each (default 1x2)")),
                       _rowpath_layout),
    "recovery": ("SIGKILL of a TaskExecutor running a streaming job -> all its tasks RUNNING again",
                 lambda p: p.add_argument("--kills", type=int, default=5), _recovery),
    "scheduling": ("ExecutionGraph + deployment of a 2-vertex all-to-all job on simulated TaskExecutors",
                   lambda p: (p.add_argument("--subtasks", type=int, default=1000),
                              p.add_argument("--mode", choices=["streaming", "batch"], default="streaming")),
                   _scheduling),
    "checkpoint-overhead": ("W1 and W2 in STREAMING mode with checkpoints against none, same run",
                            lambda p: (p.add_argument("--records", type=int, default=5_000_000),
                                       p.add_argument("--parallelism", type=int, default=2),
                                       p.add_argument("--interval", default="1 s"),
                                       p.add_argument("--rounds", type=int, default=3),
                                       p.add_argument("--unaligned", action="store_true",
                                                      help="unaligned checkpoints")), _checkpoint_overhead),
    "backpressure": ("source -> keyed per-row map ~10x slower than the source -> sink, checkpoints every "
                     "interval, aligned against unaligned in the same run (targets: unaligned p99 <= 1 s while "
                     "aligned p99 > 5 s; in-flight bytes per channel <= credit x segment size)",
                     lambda p: (p.add_argument("--records", type=int, default=None,
                                               help="default: 2,000,000 for loop-15us, 100,000 for the 1 ms ones"),
                                p.add_argument("--parallelism", type=int, default=2),
                                p.add_argument("--interval", default="1 s"),
                                p.add_argument("--function", choices=["loop-15us", "sleep-1ms", "cpu-1ms"],
                                               default="loop-15us",
                                               help="the map's per-row cost: a 15 us loop, a 1 ms sleep (a remote "
                                                    "call), 1 ms of Python (target then: unaligned p99 <= 1.5 s)"),
                                p.add_argument("--debloat", action="store_true",
                                               help="also both with buffer debloating off")), _backpressure),
    "metrics-overhead": ("W1 with the REST API, Prometheus endpoints, task I/O meters and a watcher reading them "
                         "every second, against every metric off, same run (target: < 2%)",
                         lambda p: (p.add_argument("--records", type=int, default=20_000_000),
                                    p.add_argument("--parallelism", type=int, default=2),
                                    p.add_argument("--rounds", type=int, default=5),
                                    p.add_argument("--mode", choices=["STREAMING", "BATCH"], default="BATCH"),
                                    p.add_argument("--watch-interval", type=float, default=1.0,
                                                   help="seconds between the watcher's reads")),
                         _metrics_overhead),
    "checkpoint-size": ("keyed state of N keys: task pause to snapshot it, then background write speed",
                        lambda p: (p.add_argument("--keys", type=int, default=5_000_000),
                                   p.add_argument("--process-keys", type=int, default=1_000_000)), _checkpoint_size),
    "state": ("keyed state of N keys on the hashmap or rocksdb backend: update speed, full and incremental "
              "checkpoint (1% of the keys changed) size and time, restore time, peak memory",
              lambda p: (p.add_argument("--backend", choices=["hashmap", "rocksdb"], default="hashmap"),
                         p.add_argument("--keys", type=int, default=5_000_000),
                         p.add_argument("--work-dir", default=None, help="where checkpoints and RocksDB files go "
                                        "(default: the temp dir)"),
                         p.add_argument("--vectorised", action="store_true", help="the state of a STREAMING "
                                        "key_by().sum() (an aggregate table) instead of a ValueState per key"),
                         p.add_argument("--rocksdb-memory-mb", type=int, default=256, help="the shared RocksDB "
                                        "memory of the slot (as a 1 GB TaskExecutor with one slot has; 0: RocksDB's "
                                        "own caches, as before the memory model)")), _state),
    "local-recovery": ("a job with N MB of RocksDB keyed state: a task fails -> every task RUNNING again, with "
                       "task-local recovery off and on in the same run (restore time, state read locally / from "
                       "the checkpoint storage)",
                       lambda p: (p.add_argument("--state-mb", type=int, default=1024),
                                  p.add_argument("--value-bytes", type=int, default=1000,
                                                 help="bytes of each key's value (keys: state / value bytes)"),
                                  p.add_argument("--work-dir", default=None, help="where the cluster, checkpoints "
                                                 "and RocksDB files go (default: the temp dir)"),
                                  p.add_argument("--corrupt-copies", action="store_true", help="only with it on, "
                                                 "every local copy corrupted before the failure: all read from "
                                                 "the storage")), _local_recovery),
    "kafka": ("Kafka (4 partitions of JSON) -> keyed 1 s windows -> Kafka EXACTLY_ONCE, checkpoints every 1 s, "
              "parallelism 2, against a local noida-db broker: records/s, lost and duplicated rows, against "
              "Bytewax's Kafka connectors and a bare confluent-kafka consumer",
              lambda p: (p.add_argument("--records", type=int, default=5_000_000),
                         p.add_argument("--bytewax-python", default=None, help="a Python with bytewax 0.21 and "
                                        "confluent-kafka (default: $BYTEWAX_PYTHON; none: Bytewax is skipped)"),
                         p.add_argument("--work-dir", default=None, help="where the broker's data and the clusters "
                                        "go (default: the temp dir)")), _kafka),
    "multi-host": ("W1 and W2 through YARN (the sandbox) with the TaskExecutors on two hosts of their own (network "
                   "namespaces) against one host, and the time from a cut TaskExecutor host to the job RUNNING "
                   "again (root only)",
                   lambda p: (p.add_argument("--records", type=int, default=5_000_000),
                              p.add_argument("--work-dir", default=None, help="where the data, clusters and output "
                                             "go (default: the temp dir)")), _multi_host),
    "rocksdb-keys": ("a STREAMING keyed sum over N distinct keys on rocksdb through `yarnflow run` (2 TaskExecutors "
                     "of 1 slot): wall time, each TaskExecutor's peak RSS, every key once",
                     lambda p: (p.add_argument("--keys", type=int, default=20_000_000),
                                p.add_argument("--memory", default="1 gb", help="taskmanager.memory.process.size"),
                                p.add_argument("--unmanaged", action="store_true", help="RocksDB's own caches "
                                               "(state.backend.rocksdb.memory.managed: false)")), _rocksdb_keys),
    "am-failover": ("session with a standby AppMaster (ZooKeeper HA): SIGKILL of the leader under a checkpointed "
                    "job -> every task RUNNING again; rows lost / duplicated",
                    lambda p: (p.add_argument("--rows", type=int, default=200_000),
                               p.add_argument("--interval", default="500 ms"),
                               p.add_argument("--session-timeout", default="2 s"),
                               p.add_argument("-D", dest="conf", action="append", default=[], metavar="KEY=VALUE",
                                              help="configuration of the cluster, e.g. -D "
                                                   "high-availability.keep-running-tasks=false")), _am_failover),
    "rescale": ("a running STREAMING keyed sum with N keys of state rescaled by hand 2 -> 4 -> 2 on a local "
                "session: seconds per rescale, rows lost / duplicated",
                lambda p: (p.add_argument("--keys", type=int, default=1_000_000),
                           p.add_argument("--rows", type=int, default=8_000_000)), _rescale),
    "fixed-costs": ("a trivial job through `yarnflow run` (whole command, median of N runs, with its phases) and "
                    "its submit -> FINISHED; a running session's submit -> FINISHED with TLS on",
                    lambda p: (p.add_argument("--runs", type=int, default=5),
                               p.add_argument("--submissions", type=int, default=50),
                               p.add_argument("--work-dir", default=None)), _fixed_costs),
    "cli-workloads": ("W1, W2, W3 and a per-row helper map at N records through `yarnflow run` (embedded "
                      "cluster, parallelism 2): env.execute() to result, against a plain Python loop, DuckDB and "
                      "Bytewax (when installed) in the same run",
                      lambda p: (p.add_argument("--records", type=int, default=5_000_000),
                                 p.add_argument("--orders", type=int, default=5_000_000),
                                 p.add_argument("--bytewax-python", default=None,
                                                help="a Python with bytewax 0.21 (W1 against Bytewax)"),
                                 p.add_argument("--only", nargs="+", choices=["w1", "w2", "w3", "rowmap"], default=None),
                                 p.add_argument("--work-dir", default=None)), _cli_workloads),
    "pyflink-wordcount": ("a PyFlink-style word count of N words run unchanged by `yarnflow run`, against the same "
                          "count in yarnflow's own per-row API (and PyFlink itself with --pyflink-python)",
                          lambda p: (p.add_argument("--words", type=int, default=5_000_000),
                                     p.add_argument("--pyflink-python", default=None,
                                                    help="a Python with apache-flink installed"),
                                     p.add_argument("--work-dir", default=None)), _pyflink_wordcount),
    "chaos": ("STREAMING keyed job with checkpoints; N SIGKILLs of random TaskExecutors; rows lost / duplicated",
              lambda p: (p.add_argument("--kills", type=int, default=20),
                         p.add_argument("--rows", type=int, default=400_000),
                         p.add_argument("--interval", default="500 ms"),
                         p.add_argument("--seed", type=int, default=11)), _chaos),
    "w3": ("revenue per region: N orders (default 5M) joined with 100k customers, in a Spark SQL stage or "
           "yarnflow's own join and sum, against plain PySpark in the same run",
           lambda p: (p.add_argument("--input", default=None, help="folder with orders.parquet and customers.parquet"),
                      p.add_argument("--orders", type=int, default=5_000_000,
                                     help="orders to generate (without --input)"),
                      p.add_argument("--engine", choices=["spark", "native"], default="spark"),
                      p.add_argument("--hint", choices=["broadcast", "shuffle_hash", "sort_merge"], default=None,
                                     help="native engine: the join strategy (default: the compiler's choice)"),
                      p.add_argument("--parallelism", type=int, default=2),
                      p.add_argument("--target", choices=["local", "yarn-sandbox"], default="local",
                                     help="yarn-sandbox: a YARN per-job application on the sandbox (Spark stages "
                                          "on executors in containers of the application)"),
                      p.add_argument("--prefilter", action="store_true",
                                     help="a native filter on the orders first (spark: its subtasks write Spark's input)"),
                      p.add_argument("-D", dest="conf", action="append", default=[], metavar="KEY=VALUE",
                                     help="configuration of the job's cluster")), _w3),
    "batch-agg": ("BATCH keyed sum of R rows (default 100M) with N distinct keys, spilling past managed memory, "
                  "against PySpark's groupBy().sum() in the same run",
                  lambda p: (p.add_argument("--rows", type=int, default=100_000_000),
                             p.add_argument("--keys", type=int, default=50_000_000),
                             p.add_argument("--input", default=None, help="a folder of Parquet files (key, value)"),
                             p.add_argument("--parallelism", type=int, default=2),
                             p.add_argument("-D", dest="conf", action="append", default=[], metavar="KEY=VALUE",
                                            help="configuration of the job's cluster")), _batch_agg),
    "yarn-submit": ("yarnflow run --target yarn-per-job on the YARN sandbox: command start -> job FINISHED, and "
                    "the share spent starting containers",
                    lambda p: (p.add_argument("--runs", type=int, default=5),
                               p.add_argument("--words", type=int, default=20_000)), _yarn_submit),
    "w1": ("word count: 5M (word, ts) records, keyed count per word, vs a pyarrow reference", _w_args, _w("w1")),
    "rowpath": ("W1 with a per-row Python function (map, filter, flat_map, reduce or keyed process) before a "
                "keyed count, vs a plain-Python loop on one core in the same run", _rowpath_args, _rowpath),
    "w2": ("1 s tumbling event-time windows: 5M (key, value, ts) records, sum per key and window",
           _w_args, _w("w2")),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        print("usage: python bench/run.py --list | NAME [options]")
        return 0 if argv else 2
    if argv[0] == "--list":
        for name, (desc, _, _) in BENCHMARKS.items():
            print(f"{name:16s} {desc}")
        return 0
    name = argv[0]
    if name not in BENCHMARKS:
        print(f"error: unknown benchmark {name!r}; `python bench/run.py --list` names them", file=sys.stderr)
        return 2
    desc, add_args, fn = BENCHMARKS[name]
    parser = argparse.ArgumentParser(prog=f"bench/run.py {name}", description=desc)
    add_args(parser)
    result = fn(parser.parse_args(argv[1:]))
    print(json.dumps(result))
    return 0 if result.get("verified") else 1


if __name__ == "__main__":
    sys.exit(main())
