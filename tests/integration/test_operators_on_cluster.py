"""Keyed process functions, keyed AggregateFunctions, window joins and processing-time windows
as whole jobs on one real local cluster (2 TaskExecutors x 2 slots, parallelism 2), each
checked against a plain-Python reference.

Job functions and classes are defined at module level: they travel to the TaskExecutors
pickled by value."""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict

import pytest

from yarnflow.windows import (
    AggregateFunction,
    SlidingProcessingTimeWindows,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from yarnflow import ListStateDescriptor, ValueStateDescriptor
from yarnflow.windows import EVENT_TIME, KeyedProcessFunction

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]




def _uid(stream) -> str:
    """The uid of the collect sink ``stream`` ends in (for ``collected(uid)``)."""
    return stream.transformation.operator.uid


def _rows(table):
    return [] if table is None else table.to_pylist()


# --------------------------------------------------------------------------- keyed process function

THRESHOLD = 5
GAP = 1000  # a key's events at most GAP ms apart share a session


class SessionTracker(KeyedProcessFunction):
    """Per key: counts the (non-negative) events in ValueState and emits a "threshold" row when
    the count reaches THRESHOLD; keeps the pending event times in ListState and, with an
    event-time timer at ``ts + GAP``, emits a "closed" row for a session once no event of the
    key follows its last one within GAP. Events with a negative value go to the side output
    "negative". The result does not depend on the order in which the two source subtasks'
    rows interleave: when the timer at T fires, the watermark says every event up to T is in."""

    def open(self, ctx):
        self.count = self.get_state(ValueStateDescriptor("count", default=0))
        self.pending = self.get_state(ListStateDescriptor("pending"))

    def process_element(self, row, ctx, out):
        if row["value"] < 0:
            ctx.output("negative", {"key": ctx.current_key, "value": row["value"], "ts": ctx.timestamp})
            return
        n = self.count.value() + 1
        self.count.update(n)
        if n == THRESHOLD:
            out.collect({"key": ctx.current_key, "kind": "threshold", "count": n, "start": 0, "end": 0})
        self.pending.add(ctx.timestamp)
        ctx.timer_service().register_event_time_timer(ctx.timestamp + GAP)

    def on_timer(self, timestamp, ctx, out):
        assert ctx.time_domain == EVENT_TIME
        assert ctx.timer_service().current_watermark() >= timestamp
        pending = sorted(self.pending.get())
        last = timestamp - GAP
        if last not in pending or any(last < t <= timestamp for t in pending):
            return  # not the end of a session
        end = max(i for i, t in enumerate(pending) if t == last)
        begin = end
        while begin > 0 and pending[begin] - pending[begin - 1] <= GAP:
            begin -= 1
        session = pending[begin:end + 1]
        out.collect({"key": ctx.current_key, "kind": "closed", "count": len(session),
                     "start": session[0], "end": session[-1]})
        self.pending.update(pending[:begin] + pending[end + 1:])


def session_events(seed: int = 3):
    """Events of 7 keys: sessions of 1-8 events (gaps < GAP) separated by more than GAP, a few
    negative values, sorted by time (each source subtask's slice is then in order)."""
    rng = random.Random(seed)
    rows = []
    for k in range(7):
        key = f"k{k}"
        t = rng.randint(0, 500)
        sessions = 1 if k == 6 else rng.randint(2, 5)
        for _ in range(sessions):
            for _ in range(2 if k == 6 else rng.randint(1, 8)):
                value = -rng.randint(1, 9) if rng.random() < 0.1 else rng.randint(0, 100)
                rows.append({"key": key, "value": value, "ts": t})
                t += rng.randint(1, GAP // 2)
            t += GAP + rng.randint(1, 3 * GAP)
    rows.sort(key=lambda r: r["ts"])
    return rows


def reference_sessions(rows):
    main, negative = [], []
    times = defaultdict(list)
    for r in rows:
        if r["value"] < 0:
            negative.append((r["key"], r["value"], r["ts"]))
        else:
            times[r["key"]].append(r["ts"])
    for key, ts in times.items():
        ts.sort()
        if len(ts) >= THRESHOLD:
            main.append((key, "threshold", THRESHOLD, 0, 0))
        begin = 0
        for i in range(1, len(ts) + 1):
            if i == len(ts) or ts[i] - ts[i - 1] > GAP:
                main.append((key, "closed", i - begin, ts[begin], ts[i - 1]))
                begin = i
    return sorted(main), sorted(negative)


def test_keyed_process_function_with_value_state_event_time_timers_and_side_output(run):
    events = session_events()
    expected_main, expected_negative = reference_sessions(events)
    assert any(k == "threshold" for _, k, *_ in expected_main) and expected_negative  # the data covers it all
    assert any(key == "k6" for key, *_ in expected_main) and not any(
        key == "k6" and kind == "threshold" for key, kind, *_ in expected_main)
    uids = {}

    def build(env):
        env.set_runtime_mode("STREAMING")
        strategy = WatermarkStrategy.for_bounded_out_of_orderness(50).with_timestamp_column("ts")
        processed = (env.from_collection(events)
                     .assign_timestamps_and_watermarks(strategy)
                     .key_by("key").process(SessionTracker(), name="sessions"))
        uids["main"] = _uid(processed.collect())
        uids["negative"] = _uid(processed.get_side_output("negative").collect(name="negative"))

    result = run(build, "sessions", conf={"execution.batch-size": "16"})
    got_main = sorted((r["key"], r["kind"], r["count"], r["start"], r["end"])
                      for r in _rows(result.collected(uids["main"])))
    got_negative = sorted((r["key"], r["value"], r["ts"]) for r in _rows(result.collected(uids["negative"])))
    assert got_main == expected_main
    assert got_negative == expected_negative


# --------------------------------------------------------------------------- keyed AggregateFunction


class MeanAndCount(AggregateFunction):
    def create_accumulator(self):
        return (0.0, 0)

    def add(self, row, accumulator):
        total, n = accumulator
        return (total + row["v"], n + 1)

    def get_result(self, accumulator):
        total, n = accumulator
        return {"mean": total / n, "count": n}

    def merge(self, a, b):
        return (a[0] + b[0], a[1] + b[1])


def aggregate_data(n: int = 3000):
    rng = random.Random(11)
    return {"k": [f"g{rng.randint(0, 16)}" for _ in range(n)], "v": [rng.randint(-50, 500) / 4 for _ in range(n)]}


def reference_mean_count(data):
    acc: dict[str, list[float]] = defaultdict(list)
    for k, v in zip(data["k"], data["v"]):
        acc[k].append(v)
    return {k: (sum(vs) / len(vs), len(vs)) for k, vs in acc.items()}


def _check_mean_count(got: dict[str, tuple[float, int]], expected: dict[str, tuple[float, int]]) -> None:
    assert set(got) == set(expected)
    for k, (mean, count) in expected.items():
        assert got[k][1] == count, k
        assert got[k][0] == pytest.approx(mean, rel=1e-9, abs=1e-9), k


@pytest.mark.parametrize("mode", ["BATCH", "STREAMING"])
def test_keyed_aggregate_function_mean_and_count(run, mode):
    data = aggregate_data()
    expected = reference_mean_count(data)

    def build(env):
        env.set_runtime_mode(mode)
        env.from_collection(data).key_by("k").aggregate(MeanAndCount(), name="mean_count").collect()

    result = run(build, f"mean-count-{mode.lower()}", conf={"execution.batch-size": "100"})
    rows = _rows(result.collected())
    assert rows and all(set(r) == {"k", "mean", "count"} for r in rows)
    if mode == "BATCH":
        assert len(rows) == len(expected)  # one final row per key
        _check_mean_count({r["k"]: (r["mean"], r["count"]) for r in rows}, expected)
    else:
        # an upsert stream: each key's rows in emission order (one subtask, one file, in order);
        # the counts grow and the last row of each key is the final result
        per_key: dict[str, list[tuple[float, int]]] = defaultdict(list)
        for r in rows:
            per_key[r["k"]].append((r["mean"], r["count"]))
        assert len(rows) > len(expected)  # updates, not only final rows
        for k, updates in per_key.items():
            counts = [c for _, c in updates]
            assert counts == sorted(set(counts)), k
        _check_mean_count({k: updates[-1] for k, updates in per_key.items()}, expected)


# --------------------------------------------------------------------------- window join

JOIN_WINDOW = 100


def join_inputs():
    rng = random.Random(5)
    left, right = [], []
    for i in range(400):
        left.append({"k": rng.choice("abcd"), "ts": i * 3 + rng.randint(0, 2), "lv": i})
    for i in range(300):
        right.append({"k": rng.choice("bcde"), "ts": i * 4 + rng.randint(0, 3), "rv": 1000 + i})
    left.sort(key=lambda r: r["ts"])
    right.sort(key=lambda r: r["ts"])
    return left, right


def reference_join(left, right, size=JOIN_WINDOW):
    out = []
    for lrow in left:
        for rrow in right:
            start = lrow["ts"] - lrow["ts"] % size
            if lrow["k"] == rrow["k"] and rrow["ts"] - rrow["ts"] % size == start:
                out.append((lrow["k"], lrow["ts"], lrow["lv"], rrow["ts"], rrow["rv"], start, start + size))
    return sorted(out)


def pair(lrow, rrow):
    if (lrow["lv"] + rrow["rv"]) % 7 == 0:
        return None  # join_fn may drop a pair
    return {"key": lrow["k"], "lv": lrow["lv"], "rv": rrow["rv"], "dt": rrow["ts"] - lrow["ts"]}


def _join_job(left, right, join_fn):
    def build(env):
        env.set_runtime_mode("STREAMING")
        strategy = WatermarkStrategy.for_bounded_out_of_orderness(20).with_timestamp_column("ts")
        a = env.from_collection(left).assign_timestamps_and_watermarks(strategy)
        b = env.from_collection(right).assign_timestamps_and_watermarks(strategy)
        a.join(b).where("k").equal_to("k").window(TumblingEventTimeWindows.of(JOIN_WINDOW)).apply(join_fn).collect()

    return build


def test_window_join_tumbling_event_time_with_and_without_join_fn(run):
    left, right = join_inputs()
    expected = reference_join(left, right)
    assert len(expected) > 100

    result = run(_join_job(left, right, None), "join", conf={"execution.batch-size": "32"})
    rows = _rows(result.collected())
    assert rows and set(rows[0]) == {"k", "ts", "lv", "ts_right", "rv", "window_start", "window_end"}
    got = sorted((r["k"], r["ts"], r["lv"], r["ts_right"], r["rv"], r["window_start"], r["window_end"])
                 for r in rows)
    assert got == expected

    result = run(_join_job(left, right, pair), "join-fn", conf={"execution.batch-size": "32"})
    rows = _rows(result.collected())
    got = sorted((r["key"], r["lv"], r["rv"], r["dt"], r["window_start"], r["window_end"]) for r in rows)
    want = sorted((k, lv, rv, rts - lts, ws, we) for k, lts, lv, rts, rv, ws, we in expected
                  if (lv + rv) % 7 != 0)
    assert len(want) < len(expected)
    assert got == want


# --------------------------------------------------------------------------- processing-time windows

SLIDE = 100
SIZE = 300


def slow_batches(batch):
    time.sleep(0.02)
    return batch


def test_sliding_processing_time_windows_lose_no_rows_at_end_of_input(run):
    n = 3000
    data = {"key": [f"p{i % 5}" for i in range(n)], "x": list(range(n))}
    windows_per_row = SIZE // SLIDE

    def build(env):
        env.set_runtime_mode("STREAMING")
        (env.from_collection(data).map_batches(slow_batches, name="slow")
            .key_by("key").window(SlidingProcessingTimeWindows.of(SIZE, SLIDE)).count().collect())

    t0 = time.monotonic()
    result = run(build, "sliding-processing-time", conf={"execution.batch-size": "25"})
    took = time.monotonic() - t0
    rows = _rows(result.collected())
    assert rows and all(r["window_end"] - r["window_start"] == SIZE and r["window_start"] % SLIDE == 0
                        for r in rows)
    assert len({(r["key"], r["window_start"]) for r in rows}) == len(rows)  # each window fires once
    per_key = Counter()
    for r in rows:
        per_key[r["key"]] += r["count"]
    assert sum(per_key.values()) == n * windows_per_row
    assert per_key == {f"p{i}": (n // 5) * windows_per_row for i in range(5)}
    # the input took several slides to go through: windows fired while rows came and at the end
    assert len({r["window_start"] for r in rows}) > windows_per_row
    assert took > 1.0


# --------------------------------------------------------------------------- collected sinks by name

def test_collected_rows_are_found_by_the_name_given_to_the_sink(run):
    def build(env):
        numbers = env.from_collection({"v": list(range(10))})
        numbers.filter(lambda r: r["v"] % 2 == 0).collect(name="evens")
        numbers.filter(lambda r: r["v"] % 2 == 1).collect(name="odds")

    result = run(build)
    assert sorted(r["v"] for r in _rows(result.collected("evens"))) == [0, 2, 4, 6, 8]
    assert sorted(r["v"] for r in _rows(result.collected("odds"))) == [1, 3, 5, 7, 9]
    uid = next(u for u in result.collect_uids if result.collect_names[u] == "odds")
    assert sorted(r["v"] for r in _rows(result.collected(uid))) == [1, 3, 5, 7, 9]  # the uid still works
    with pytest.raises(KeyError, match="no collect sink named 'nope': 'evens' .*'odds'"):
        result.collected("nope")
    with pytest.raises(ValueError, match="2 collect sinks"):
        result.collected()
