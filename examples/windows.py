"""Windowed aggregation in event time: sum of `value` per `key` and window.

    yarnflow run examples/windows.py --window tumbling --size 1000 --input events/ --output out/
    yarnflow run examples/windows.py --window sliding --size 1000 --slide 500
    yarnflow run examples/windows.py --window session --gap 300

--input   Parquet files with columns key, value, ts (event time, ms); default: generated events
--output  a folder of Parquet files (key, window_start, window_end, value); default: stdout
Records later than --lateness after their window closed go to a side output, written to
<output>_late (or printed after the results).
"""

import argparse

import yarnflow
from yarnflow.windows import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)


def generated(start, n):
    """Deterministic events: 20 keys, about 10 events per ms, up to 50 ms out of order."""
    ids = range(start, start + n)
    return {
        "key": [i % 20 for i in ids],
        "value": [float(i % 7) for i in ids],
        "ts": [i // 10 - (i * 7919) % 50 for i in ids],
    }


def main():
    parser = argparse.ArgumentParser(prog="windows", description=__doc__.split("\n")[0])
    parser.add_argument("--window", choices=["tumbling", "sliding", "session"], default="tumbling")
    parser.add_argument("--size", type=int, default=1000, help="window size, ms")
    parser.add_argument("--slide", type=int, default=500, help="slide of sliding windows, ms")
    parser.add_argument("--gap", type=int, default=300, help="gap of session windows, ms")
    parser.add_argument("--out-of-orderness", type=int, default=100, help="watermark bound, ms")
    parser.add_argument("--lateness", type=int, default=0, help="allowed lateness, ms")
    parser.add_argument("--input", help="Parquet files with key, value, ts")
    parser.add_argument("--output", help="folder for the results")
    parser.add_argument("--records", type=int, default=100_000, help="generated events when --input is omitted")
    parser.add_argument("--mode", choices=["STREAMING", "BATCH"], default="STREAMING",
                        help="STREAMING: watermarks as data flows, late records exist; BATCH: windows fire at the "
                             "end of the input, nothing is late")
    args = parser.parse_args()

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_runtime_mode(args.mode)
    events = env.read_parquet(args.input) if args.input else env.from_generator(generated, count=args.records)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(args.out_of_orderness).with_timestamp_column("ts")
    assigner = {
        "tumbling": lambda: TumblingEventTimeWindows.of(args.size),
        "sliding": lambda: SlidingEventTimeWindows.of(args.size, args.slide),
        "session": lambda: EventTimeSessionWindows.with_gap(args.gap),
    }[args.window]()
    sums = (events.assign_timestamps_and_watermarks(strategy)
            .key_by("key").window(assigner).allowed_lateness(args.lateness).side_output_late_data("late")
            .sum("value", name=f"{args.window} sum"))
    late = sums.get_side_output("late")
    if args.output:
        sums.sink_to_parquet(args.output)
        late.sink_to_parquet(args.output.rstrip("/") + "_late")
    else:
        sums.print()
        late.print(name="late records")
    env.execute(f"{args.window} windows")


if __name__ == "__main__":
    main()
