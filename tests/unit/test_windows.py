"""Window assigners, the keyed window aggregation and the window join, driven directly through
the shared OperatorHarness (a manual clock and a recording output), against a plain-Python
reference model of Flink's WindowOperator (row lists per key and window, brute-force window
assignment)."""

from __future__ import annotations

import datetime as dt
import pickle
import random
import zlib
from collections import defaultdict
from typing import Any, Callable

import cloudpickle
import numpy as np
import pyarrow as pa
import pytest

from yarnflow.common.errors import JobDefinitionError, YarnflowError
from yarnflow.worker.operators.base import UserFunctionError
from yarnflow.common.api import (
    AggregateFunction,
    EventTimeSessionWindows,
    ProcessingTimeSessionWindows,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    window_start_with_offset,
)
from yarnflow.worker.operators.windows import WindowAggregateOperator, WindowJoinOperator
from yarnflow.worker.elements import MAX_WATERMARK

from tests.harness import OperatorHarness

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

MIN_WM = -(2**63)
TS = pa.int64()


def _canon(value: Any) -> Any:
    return round(value, 9) if isinstance(value, float) else value


def canon(rows: list[dict[str, Any]]) -> list[tuple[tuple[str, Any], ...]]:
    return sorted((tuple(sorted((k, _canon(v)) for k, v in r.items())) for r in rows), key=repr)


def normalise(steps: list[list[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    """Per step: the data rows and the side rows (as multisets) and the watermarks; within a
    step, every result comes before the watermark."""
    out = []
    for events in steps:
        kinds = [e[0] for e in events]
        if "wm" in kinds:
            first_wm = kinds.index("wm")
            assert all(k == "wm" for k in kinds[first_wm:]), f"results after the watermark: {kinds}"
        data = [r for e in events if e[0] == "data" for r in e[1].to_pylist()]
        side = [(e[1], r) for e in events if e[0] == "side" for r in e[2].to_pylist()]
        out.append((canon(data), sorted((t, tuple(sorted(r.items()))) for t, r in side),
                    [e[1] for e in events if e[0] == "wm"]))
    return out


# --------------------------------------------------------------------------- reference model


def ref_windows(spec: dict[str, Any], t: int) -> list[tuple[int, int]]:
    """Brute force: every aligned start s with s <= t < s + size."""
    if spec["kind"] == "session":
        return [(t, t + spec["gap"])]
    size, slide, offset = spec["size"], spec.get("slide", spec["size"]), spec.get("offset", 0)
    return [(s, s + size) for s in range(t - size + 1, t + 1) if (s - offset) % slide == 0]


def ref_agg(aggs: list[tuple[str, str]], names: list[str]) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    def compute(rows: list[dict[str, Any]]) -> dict[str, Any]:
        out = {}
        for name, (col, fn) in zip(names, aggs, strict=True):
            vals = [r[col] for r in rows if r[col] is not None]
            if fn == "count":
                out[name] = len(vals)
            elif not vals:
                out[name] = None
            elif fn == "sum":
                out[name] = sum(vals)
            elif fn == "min":
                out[name] = min(vals)
            elif fn == "max":
                out[name] = max(vals)
            else:
                out[name] = sum(vals) / len(vals)
        return out
    return compute


class RefWindows:
    """Flink's WindowOperator, written plainly: rows kept per (key, window); a window fires when
    the watermark reaches end - 1 (processing time: when the clock reaches end); allowed
    lateness keeps it (and re-fires it per batch for the keys that got rows) until end - 1 + L."""

    def __init__(self, spec: dict[str, Any], keys: list[str], result: Callable[[list[dict[str, Any]]], dict[str, Any]],
                 event_time: bool = True, lateness: int = 0, late_tag: str | None = "late", time_column: str = "ts",
                 result_row: Callable[..., dict[str, Any]] | None = None) -> None:
        self.spec, self.keys, self.result = spec, keys, result
        self.event_time, self.lateness, self.late_tag, self.time_column = event_time, lateness, late_tag, time_column
        self.result_row = result_row
        self.wm = MIN_WM
        self.windows: dict[tuple[Any, ...], dict[tuple[int, int], list[Any]]] = defaultdict(dict)  # -> [rows, dirty]
        self.steps: list[list[tuple[Any, ...]]] = []
        self.dropped = 0

    def _row(self, key: tuple[Any, ...], win: tuple[int, int], rows: list[dict[str, Any]]) -> dict[str, Any]:
        if self.result_row is not None:
            return self.result_row(key, win, rows)
        return {**dict(zip(self.keys, key, strict=True)), "window_start": win[0], "window_end": win[1],
                **self.result(rows)}

    def _late(self, win: tuple[int, int]) -> bool:
        return self.event_time and win[1] - 1 + self.lateness <= self.wm

    def _emit(self, due: list[tuple[tuple[Any, ...], tuple[int, int]]], events: list[tuple[Any, ...]]) -> None:
        rows = []
        for key, win in sorted(set(due), key=lambda kw: (kw[1][1], kw[1][0], repr(kw[0]))):
            entry = self.windows.get(key, {}).get(win)
            if entry is not None and entry[1]:
                entry[1] = False
                rows.append(self._row(key, win, entry[0]))
        if rows:
            events.append(("rows", rows))

    def _fire(self, time: int, events: list[tuple[Any, ...]]) -> None:
        fire_at = (lambda w: w[1] - 1) if self.event_time else (lambda w: w[1])
        due = [(k, w) for k, wins in self.windows.items() for w in wins if fire_at(w) <= time]
        self._emit(due, events)
        for wins in self.windows.values():
            for w in [w for w in wins if fire_at(w) + self.lateness <= time]:
                del wins[w]

    def batch(self, rows: list[dict[str, Any]], now: int = 0) -> None:
        events: list[tuple[Any, ...]] = []
        if not self.event_time:
            self._fire(now, events)
        late, due = [], []
        for row in rows:
            key = tuple(row[k] for k in self.keys)
            t = row[self.time_column] if self.event_time else now
            wins = self.windows[key]
            if self.spec["kind"] == "session":
                new = ref_windows(self.spec, t)[0]
                touching = sorted(w for w in wins if w[0] <= new[1] and w[1] >= new[0])
                if not touching and self._late(new):
                    late.append(row)
                    continue
                merged = (min([new[0]] + [w[0] for w in touching]), max([new[1]] + [w[1] for w in touching]))
                kept = [r for w in touching for r in wins.pop(w)[0]]
                wins[merged] = [kept + [row], True]
                if self.event_time and merged[1] - 1 <= self.wm:
                    due.append((key, merged))
                continue
            all_wins = ref_windows(self.spec, t)
            live = [w for w in all_wins if not self._late(w)]
            if not live:
                if all_wins or (self.event_time and t + self.lateness <= self.wm):
                    late.append(row)
                continue
            for w in live:
                entry = wins.setdefault(w, [[], False])
                entry[0].append(row)
                entry[1] = True
                if self.event_time and w[1] - 1 <= self.wm:
                    due.append((key, w))
        if late:
            if self.late_tag:
                events.append(("side", self.late_tag, late))
            else:
                self.dropped += len(late)
        self._emit(due, events)
        self.steps.append(events)

    def watermark(self, ts: int) -> None:
        events: list[tuple[Any, ...]] = []
        if ts > self.wm:
            self.wm = ts
            if self.event_time:
                self._fire(ts, events)
        events.append(("wm", ts))
        self.steps.append(events)

    def tick(self, now: int) -> None:
        events: list[tuple[Any, ...]] = []
        if not self.event_time:
            self._fire(now, events)
        self.steps.append(events)

    def finish(self) -> None:
        events: list[tuple[Any, ...]] = []
        due = sorted(((k, w) for k, wins in self.windows.items() for w, e in wins.items() if e[1]),
                     key=lambda kw: kw[1])
        self._emit(due, events)
        self.windows.clear()
        self.steps.append(events)

    def normalised(self) -> list[tuple[Any, ...]]:
        out = []
        for events in self.steps:
            data = [r for e in events if e[0] == "rows" for r in e[1]]
            side = [(e[1], r) for e in events if e[0] == "side" for r in e[2]]
            out.append((canon(data), sorted((t, tuple(sorted(r.items()))) for t, r in side),
                        [e[1] for e in events if e[0] == "wm"]))
        return out


# --------------------------------------------------------------------------- streams

SCHEMA = pa.schema([("key", pa.int64()), ("value", pa.float64()), ("ts", TS), ("tag", pa.string())])
MULTI_SCHEMA = pa.schema([("k1", pa.string()), ("k2", pa.int64()), ("value", pa.float64()), ("ts", TS),
                          ("tag", pa.string())])


def event_stream(seed: int, n: int = 1500, bound: int = 0, late_every: int = 0, base: int = 0, multi: bool = False,
                 nulls: bool = False, n_keys: int = 5, rate: int = 4) -> list[tuple[list[dict[str, Any]], int]]:
    """Batches of rows with (wm after the batch): time advances about ``1/rate`` ms a row, rows are
    up to ``bound`` ms out of order (the watermark is max - bound - 1); every ``late_every``-th
    row is later than that. Values are multiples of 1/4, so sums are exact."""
    rnd = random.Random(seed)
    out, rows, max_ts, i = [], [], MIN_WM, 0
    while i < n:
        for _ in range(rnd.randint(1, 60)):
            t = base + i // rate - (rnd.randint(0, bound) if bound else 0)
            if late_every and i % late_every == late_every - 1 and max_ts > MIN_WM:
                t = max_ts - bound - 1 - rnd.randint(0, 120)
            key = rnd.randrange(n_keys)
            value = None if nulls and rnd.random() < 0.2 else rnd.randint(-20, 40) / 4
            row = {"value": value, "ts": t, "tag": f"r{i}"}
            row.update({"k1": "ab"[key % 2], "k2": key // 2} if multi else {"key": key})
            rows.append(row)
            max_ts = max(max_ts, t)
            i += 1
        out.append((rows, max_ts - bound - 1))
        rows = []
    return out


def run_event(op: WindowAggregateOperator, ref: RefWindows, stream: list[tuple[list[dict[str, Any]], int]],
              schema: pa.Schema) -> OperatorHarness:
    h = OperatorHarness(op, schema=schema)
    for rows, wm in stream:
        h.batch(rows)
        ref.batch(rows)
        h.watermark(wm)
        ref.watermark(wm)
    h.watermark(MAX_WATERMARK.timestamp)
    ref.watermark(MAX_WATERMARK.timestamp)
    h.finish()
    ref.finish()
    assert normalise(h.steps) == ref.normalised()
    return h


SPECS = {
    "tumbling": ({"kind": "tumbling", "size": 50}, lambda et: (TumblingEventTimeWindows if et else TumblingProcessingTimeWindows).of(50)),
    "tumbling_offset": ({"kind": "tumbling", "size": 50, "offset": 17},
                        lambda et: (TumblingEventTimeWindows if et else TumblingProcessingTimeWindows).of(50, 17)),
    "tumbling_neg_offset": ({"kind": "tumbling", "size": 50, "offset": -17},
                            lambda et: (TumblingEventTimeWindows if et else TumblingProcessingTimeWindows).of(50, -17)),
    "sliding": ({"kind": "sliding", "size": 50, "slide": 20},
                lambda et: (SlidingEventTimeWindows if et else SlidingProcessingTimeWindows).of(50, 20)),
    "sliding_offset": ({"kind": "sliding", "size": 60, "slide": 30, "offset": 7},
                       lambda et: (SlidingEventTimeWindows if et else SlidingProcessingTimeWindows).of(60, 30, 7)),
    "sliding_gaps": ({"kind": "sliding", "size": 20, "slide": 35},
                     lambda et: (SlidingEventTimeWindows if et else SlidingProcessingTimeWindows).of(20, 35)),
    "session": ({"kind": "session", "gap": 6},
                lambda et: (EventTimeSessionWindows if et else ProcessingTimeSessionWindows).with_gap(6)),
}
ALL_AGGS = [("value", "sum"), ("value", "min"), ("value", "max"), ("value", "mean"), ("key", "count")]
ALL_NAMES = ["value_sum", "value_min", "value_max", "value_mean", "count"]


class SumCount(AggregateFunction[list[float]]):
    """Sum and count of 'value'; counts its merges."""

    merges = 0

    def create_accumulator(self) -> list[float]:
        return [0.0, 0]

    def add(self, row: dict[str, Any], acc: list[float]) -> list[float]:
        if row["value"] is not None:
            acc[0] += row["value"]
        acc[1] += 1
        return acc

    def get_result(self, acc: list[float]) -> dict[str, Any]:
        return {"total": acc[0], "n": acc[1]}

    def merge(self, a: list[float], b: list[float]) -> list[float]:
        type(self).merges += 1
        return [a[0] + b[0], a[1] + b[1]]


def sum_count_ref(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"total": float(sum(r["value"] for r in rows if r["value"] is not None)), "n": len(rows)}


def reduce_max_value(acc: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """Keeps the row with the greatest value (ties: the later one), counting in 'tag'."""
    best = dict(row) if (row["value"] or 0) >= (acc["value"] or 0) else dict(acc)
    best["key"] = -1  # the operator puts the key back
    return best


def reduce_ref(key: tuple[Any, ...], win: tuple[int, int], rows: list[dict[str, Any]]) -> dict[str, Any]:
    acc = dict(rows[0])
    for r in rows[1:]:
        acc = reduce_max_value(acc, r)
        acc["key"] = key[0]
    return {**acc, "window_start": win[0], "window_end": win[1]}


# --------------------------------------------------------------------------- assigners


def test_window_start_with_offset_matches_flink_including_negative_timestamps() -> None:
    assert window_start_with_offset(0, 0, 100) == 0
    assert window_start_with_offset(99, 0, 100) == 0
    assert window_start_with_offset(100, 0, 100) == 100
    assert window_start_with_offset(-1, 0, 100) == -100
    assert window_start_with_offset(-100, 0, 100) == -100
    assert window_start_with_offset(-101, 0, 100) == -200
    assert window_start_with_offset(-1, 30, 100) == -70
    assert window_start_with_offset(29, 30, 100) == -70
    assert window_start_with_offset(30, 30, 100) == 30
    assert window_start_with_offset(5, -30, 100) == -30
    for t in range(-350, 350, 7):
        for size, offset in ((100, 0), (100, 30), (100, -30), (7, 3)):
            s = window_start_with_offset(t, offset, size)
            assert s <= t < s + size and (s - offset) % size == 0


def test_assigners_assign_like_flink() -> None:
    assert TumblingEventTimeWindows.of(100).assign_windows(-1) == [(-100, 0)]
    assert TumblingEventTimeWindows.of(100, 30).assign_windows(-1) == [(-70, 30)]
    assert SlidingEventTimeWindows.of(100, 50).assign_windows(120) == [(100, 200), (50, 150)]
    assert SlidingEventTimeWindows.of(100, 30).assign_windows(-5) == [(-30, 70), (-60, 40), (-90, 10)]
    assert SlidingEventTimeWindows.of(10, 30).assign_windows(15) == []  # between windows
    assert EventTimeSessionWindows.with_gap(10).assign_windows(-3) == [(-3, 7)]
    assert EventTimeSessionWindows.with_gap(10).session_window(-3, {}) == (-3, 7)
    for spec, make in SPECS.values():
        for t in range(-200, 200, 3):
            assert sorted(make(True).assign_windows(t)) == sorted(ref_windows(spec, t))
            assert sorted(make(False).assign_windows(t)) == sorted(ref_windows(spec, t))


def test_assigner_flags_pickling_and_equality() -> None:
    event = [TumblingEventTimeWindows.of(10), SlidingEventTimeWindows.of(10, 5), EventTimeSessionWindows.with_gap(3)]
    proc = [TumblingProcessingTimeWindows.of(10), SlidingProcessingTimeWindows.of(10, 5),
            ProcessingTimeSessionWindows.with_gap(3)]
    assert all(a.is_event_time for a in event) and not any(a.is_event_time for a in proc)
    assert [a.is_merging for a in event] == [False, False, True]
    for a in event + proc:
        assert pickle.loads(pickle.dumps(a)) == a
        assert cloudpickle.loads(cloudpickle.dumps(a)) == a
    assert TumblingEventTimeWindows.of(10) != TumblingProcessingTimeWindows.of(10)
    assert TumblingEventTimeWindows.of(10) != TumblingEventTimeWindows.of(10, 1)
    assert "size_ms=10" in repr(TumblingEventTimeWindows.of(10))


@pytest.mark.parametrize("make, message", [
    (lambda: TumblingEventTimeWindows.of(0), "size must be positive"),
    (lambda: TumblingProcessingTimeWindows.of(-5), "size must be positive"),
    (lambda: TumblingEventTimeWindows.of(10, 10), "abs(offset) < size"),
    (lambda: SlidingEventTimeWindows.of(0, 5), "size must be positive"),
    (lambda: SlidingEventTimeWindows.of(10, 0), "slide must be positive"),
    (lambda: SlidingProcessingTimeWindows.of(10, -1), "slide must be positive"),
    (lambda: SlidingEventTimeWindows.of(10, 5, -5), "abs(offset) < slide"),
    (lambda: EventTimeSessionWindows.with_gap(0), "gap must be positive"),
    (lambda: ProcessingTimeSessionWindows.with_gap(-1), "gap must be positive"),
    (lambda: TumblingEventTimeWindows.of(1.5), "integer number of milliseconds"),
])
def test_assigner_arguments_are_validated(make: Callable[[], Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


# --------------------------------------------------------------------------- event time vs the reference


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("scenario", ["in_order", "out_of_order", "late_dropped", "late_side", "lateness",
                                      "negative_multi"])
def test_event_time_builtin_aggs_match_reference(name: str, scenario: str) -> None:
    spec, make = SPECS[name]
    seed = zlib.crc32(f"{name}/{scenario}".encode())
    kw: dict[str, Any] = {}
    lateness, tag, schema, keys = 0, "late", SCHEMA, ["key"]
    aggs, names = ALL_AGGS, ALL_NAMES
    if scenario == "out_of_order":
        kw = {"bound": 40}
    elif scenario == "late_dropped":
        kw, tag = {"bound": 10, "late_every": 13}, None
    elif scenario == "late_side":
        kw = {"bound": 10, "late_every": 13, "nulls": True}
    elif scenario == "lateness":
        kw, lateness = {"bound": 10, "late_every": 7}, 45
    elif scenario == "negative_multi":
        kw, schema, keys = {"bound": 25, "late_every": 17, "base": -700, "multi": True, "n_keys": 6}, MULTI_SCHEMA, ["k1", "k2"]
        aggs, names = [("value", "sum"), ("value", "mean"), ("k2", "count")], ["value_sum", "value_mean", "count"]
    op = WindowAggregateOperator(keys, make(True), "ts", aggs=aggs, allowed_lateness_ms=lateness, late_tag=tag)
    ref = RefWindows(spec, keys, ref_agg(aggs, names), lateness=lateness, late_tag=tag)
    h = run_event(op, ref, event_stream(seed, **kw), schema)
    assert h.rows(), "the stream produced no windows"
    assert op.late_records_dropped == ref.dropped
    if scenario in ("late_dropped",):
        assert op.late_records_dropped > 0
    if scenario in ("late_side", "negative_multi"):
        assert h.side_rows("late")
    if scenario == "lateness":  # late-but-allowed rows fired their windows again, from the batch itself
        assert any(e[0] == "data" for step in h.steps[:-2] for e in step if not any(x[0] == "wm" for x in step))


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("lateness", [0, 45])
def test_event_time_aggregate_function_matches_reference(name: str, lateness: int) -> None:
    spec, make = SPECS[name]
    op = WindowAggregateOperator(["key"], make(True), "ts", aggregate_function=SumCount(),
                                 allowed_lateness_ms=lateness, late_tag="late")
    ref = RefWindows(spec, ["key"], sum_count_ref, lateness=lateness)
    h = run_event(op, ref, event_stream(len(name) + lateness, bound=15, late_every=11, nulls=True), SCHEMA)
    assert h.rows()


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("lateness", [0, 45])
def test_event_time_reduce_matches_reference(name: str, lateness: int) -> None:
    spec, make = SPECS[name]
    op = WindowAggregateOperator(["key"], make(True), "ts", reduce_fn=reduce_max_value,
                                 allowed_lateness_ms=lateness, late_tag="late")
    ref = RefWindows(spec, ["key"], lambda rows: {}, lateness=lateness, result_row=reduce_ref)
    h = run_event(op, ref, event_stream(3 * len(name) + lateness, bound=15, late_every=11), SCHEMA)
    rows = h.rows()
    assert rows and list(rows[0]) == ["key", "value", "ts", "tag", "window_start", "window_end"]


def test_final_results_match_an_offline_computation() -> None:
    """Independent of the reference model: with no late data, the results are the group-by of
    every row over its windows (sessions: split where the gap between sorted times exceeds gap)."""
    stream = event_stream(5, n=3000, bound=30)
    rows = [r for b, _ in stream for r in b]
    for name, (spec, make) in SPECS.items():
        op = WindowAggregateOperator(["key"], make(True), "ts", aggs=[("value", "sum"), ("key", "count")])
        h = OperatorHarness(op, schema=SCHEMA)
        for batch, wm in stream:
            h.batch(batch)
            h.watermark(wm)
        h.watermark(MAX_WATERMARK.timestamp)
        expected: dict[tuple[Any, ...], list[float]] = defaultdict(lambda: [0.0, 0])
        if spec["kind"] == "session":
            by_key: dict[int, list[dict[str, Any]]] = defaultdict(list)
            for r in rows:
                by_key[r["key"]].append(r)
            for key, krows in by_key.items():
                krows.sort(key=lambda r: r["ts"])
                start, end, group = krows[0]["ts"], krows[0]["ts"] + spec["gap"], [krows[0]]
                for r in krows[1:] + [None]:  # type: ignore[list-item]
                    if r is not None and r["ts"] <= end:
                        end = max(end, r["ts"] + spec["gap"])
                        group.append(r)
                        continue
                    expected[(key, start, end)] = [sum(g["value"] for g in group), len(group)]
                    if r is not None:
                        start, end, group = r["ts"], r["ts"] + spec["gap"], [r]
        else:
            for r in rows:
                for w in ref_windows(spec, r["ts"]):
                    acc = expected[(r["key"], *w)]
                    acc[0] += r["value"]
                    acc[1] += 1
        got = {(r["key"], r["window_start"], r["window_end"]): [r["value"], r["count"]] for r in h.rows()}
        assert len(got) == len(h.rows()), name
        assert got == dict(expected), name


# --------------------------------------------------------------------------- processing time vs the reference


def processing_run(op: WindowAggregateOperator, ref: RefWindows, seed: int, schema: pa.Schema = SCHEMA) -> OperatorHarness:
    rnd = random.Random(seed)
    h = OperatorHarness(op, now=-40, schema=schema)
    now = -40
    for i in range(150):
        now += rnd.choice([0, 1, 2, 3, 5, 8, 13])
        if rnd.random() < 0.3:
            h.tick(now)
            ref.tick(now)
            continue
        rows = [{"key": rnd.randrange(4), "value": rnd.randint(-8, 20) / 4, "ts": None, "tag": f"{i}.{j}"}
                for j in range(rnd.randint(1, 20))]
        h.batch(rows, now=now)
        ref.batch(rows, now=now)
        if rnd.random() < 0.2:
            h.watermark(now - 100)  # forwarded, never fires processing-time windows
            ref.watermark(now - 100)
    h.finish()
    ref.finish()
    assert normalise(h.steps) == ref.normalised()
    return h


@pytest.mark.parametrize("name", list(SPECS))
def test_processing_time_windows_match_reference(name: str) -> None:
    spec, make = SPECS[name]
    for seed, (kw, result, result_row) in enumerate([
        ({"aggs": ALL_AGGS}, ref_agg(ALL_AGGS, ALL_NAMES), None),
        ({"aggregate_function": SumCount()}, sum_count_ref, None),
        ({"reduce_fn": reduce_max_value}, lambda rows: {}, reduce_ref),
    ]):
        op = WindowAggregateOperator(["key"], make(False), None, **kw)
        assert op.processing_time_interval_ms is not None and 1 <= op.processing_time_interval_ms <= 100
        ref = RefWindows(spec, ["key"], result, event_time=False, result_row=result_row)
        h = processing_run(op, ref, seed + len(name))
        assert h.rows()


def test_processing_time_tumbling_fires_when_the_clock_reaches_the_end() -> None:
    op = WindowAggregateOperator(["key"], TumblingProcessingTimeWindows.of(1000), None, aggs=[("value", "sum")])
    h = OperatorHarness(op, now=1500, schema=SCHEMA)
    assert op.processing_time_interval_ms == 100
    h.batch([{"key": 1, "value": 1.0, "ts": None, "tag": "a"}, {"key": 2, "value": 2.0, "ts": None, "tag": "b"}])
    h.batch([{"key": 1, "value": 3.0, "ts": None, "tag": "c"}], now=1999)
    assert h.tick(1999) == []
    assert h.watermark(10**12) == [("wm", 10**12)]  # event time does not fire processing-time windows
    events = h.tick(2000)
    assert canon([r for e in events for r in e[1].to_pylist()]) == canon([
        {"key": 1, "window_start": 1000, "window_end": 2000, "value": 4.0},
        {"key": 2, "window_start": 1000, "window_end": 2000, "value": 2.0}])
    h.batch([{"key": 1, "value": 5.0, "ts": None, "tag": "d"}], now=2500)
    assert h.tick(2999) == []
    events = h.finish()
    assert [r for e in events for r in e[1].to_pylist()] == [
        {"key": 1, "window_start": 2000, "window_end": 3000, "value": 5.0}]


def test_processing_time_sessions_extend_and_fire_after_the_gap() -> None:
    """The clock only moves forward, so a processing-time session is extended, never bridged:
    by the time a record could bridge two sessions, the older one has fired."""
    SumCount.merges = 0
    op = WindowAggregateOperator(["key"], ProcessingTimeSessionWindows.with_gap(10), None,
                                 aggregate_function=SumCount())
    h = OperatorHarness(op, now=0, schema=SCHEMA)
    assert op.processing_time_interval_ms == 10
    row = {"key": 1, "value": 1.0, "ts": None, "tag": "x"}
    h.batch([row], now=0)  # [0, 10)
    h.batch([row], now=5)  # [5, 15) -> [0, 15)
    assert h.tick(14) == []
    h.batch([row], now=14)  # [14, 24) -> [0, 24)
    assert h.tick(23) == []
    assert rows_of(h.tick(24)) == [{"key": 1, "window_start": 0, "window_end": 24, "total": 3.0, "n": 3}]
    h.batch([row, row], now=30)
    assert rows_of(h.batch([row], now=40)) == [{"key": 1, "window_start": 30, "window_end": 40, "total": 2.0, "n": 2}]
    assert rows_of(h.finish()) == [{"key": 1, "window_start": 40, "window_end": 50, "total": 1.0, "n": 1}]
    assert SumCount.merges == 0


# --------------------------------------------------------------------------- hand-written event-time cases


def rows_of(events: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [r for e in events if e[0] == "data" for r in e[1].to_pylist()]


def test_tumbling_fires_at_end_minus_one_and_results_precede_the_watermark() -> None:
    op = WindowAggregateOperator(["key"], TumblingEventTimeWindows.of(1000), "ts", aggs=[("value", "sum")])
    h = OperatorHarness(op, schema=SCHEMA)
    h.batch([{"key": 1, "value": 1.5, "ts": 10, "tag": "a"}, {"key": 1, "value": 2.0, "ts": 999, "tag": "b"},
             {"key": 2, "value": 4.0, "ts": 500, "tag": "c"}, {"key": 1, "value": 8.0, "ts": 1000, "tag": "d"}])
    assert h.watermark(998) == [("wm", 998)]
    events = h.watermark(999)
    assert [e[0] for e in events] == ["data", "wm"]
    assert canon(rows_of(events)) == canon([{"key": 1, "window_start": 0, "window_end": 1000, "value": 3.5},
                                            {"key": 2, "window_start": 0, "window_end": 1000, "value": 4.0}])
    events = h.watermark(MAX_WATERMARK.timestamp)
    assert [e[0] for e in events] == ["data", "wm"]
    assert rows_of(events) == [{"key": 1, "window_start": 1000, "window_end": 2000, "value": 8.0}]
    assert h.finish() == []


def test_late_rows_go_to_the_side_output_with_the_input_columns() -> None:
    op = WindowAggregateOperator(["key"], TumblingEventTimeWindows.of(100), "ts", aggs=[("value", "sum")],
                                 late_tag="too-late")
    h = OperatorHarness(op, schema=SCHEMA)
    h.batch([{"key": 1, "value": 1.0, "ts": 50, "tag": "a"}])
    h.watermark(99)
    late = [{"key": 1, "value": 2.0, "ts": 99, "tag": "late1"}, {"key": 3, "value": 4.0, "ts": 0, "tag": "late2"}]
    events = h.batch([late[0], {"key": 1, "value": 3.0, "ts": 100, "tag": "ok"}, late[1]])
    assert [e[0] for e in events] == ["side"]
    assert events[0][1] == "too-late" and events[0][2].schema == SCHEMA
    assert events[0][2].to_pylist() == late
    assert op.late_records_dropped == 0 and op.late_records_side_output == 2
    h.watermark(MAX_WATERMARK.timestamp)
    assert canon(h.rows()) == canon([{"key": 1, "window_start": 0, "window_end": 100, "value": 1.0},
                                     {"key": 1, "window_start": 100, "window_end": 200, "value": 3.0}])


def test_late_rows_without_a_tag_are_dropped_and_counted() -> None:
    op = WindowAggregateOperator(["key"], EventTimeSessionWindows.with_gap(10), "ts", aggs=[("value", "sum")])
    h = OperatorHarness(op, schema=SCHEMA)
    h.batch([{"key": 1, "value": 1.0, "ts": 50, "tag": "a"}])
    h.watermark(59)
    assert len(h.rows()) == 1
    assert h.batch([{"key": 1, "value": 1.0, "ts": 49, "tag": "late"}]) == []  # [49, 59) is late
    assert op.late_records_dropped == 1


def test_allowed_lateness_refires_the_updated_result_of_that_key_then_purges() -> None:
    op = WindowAggregateOperator(["key"], TumblingEventTimeWindows.of(100), "ts", aggs=[("value", "sum")],
                                 allowed_lateness_ms=50, late_tag="late")
    h = OperatorHarness(op, schema=SCHEMA)
    h.batch([{"key": 1, "value": 1.0, "ts": 10, "tag": "a"}, {"key": 2, "value": 2.0, "ts": 20, "tag": "b"}])
    assert len(rows_of(h.watermark(120))) == 2
    events = h.batch([{"key": 1, "value": 10.0, "ts": 30, "tag": "c"}, {"key": 1, "value": 100.0, "ts": 40, "tag": "d"}])
    assert rows_of(events) == [{"key": 1, "window_start": 0, "window_end": 100, "value": 111.0}]
    assert rows_of(h.watermark(148)) == []
    events = h.batch([{"key": 2, "value": 0.5, "ts": 99, "tag": "e"}])  # 99 + 50 > 148: still allowed
    assert rows_of(events) == [{"key": 2, "window_start": 0, "window_end": 100, "value": 2.5}]
    h.watermark(149)  # end - 1 + lateness: purged
    events = h.batch([{"key": 2, "value": 7.0, "ts": 99, "tag": "f"}])
    assert rows_of(events) == [] and h.side_rows("late") == [{"key": 2, "value": 7.0, "ts": 99, "tag": "f"}]


def test_allowed_lateness_with_a_window_first_seen_after_its_end() -> None:
    op = WindowAggregateOperator(["key"], TumblingEventTimeWindows.of(100), "ts", aggs=[("value", "mean")],
                                 allowed_lateness_ms=1000)
    h = OperatorHarness(op, schema=SCHEMA)
    h.watermark(500)
    events = h.batch([{"key": 1, "value": 1.0, "ts": 5, "tag": "a"}, {"key": 1, "value": 2.0, "ts": 6, "tag": "b"}])
    assert rows_of(events) == [{"key": 1, "window_start": 0, "window_end": 100, "value": 1.5}]
    assert rows_of(h.watermark(MAX_WATERMARK.timestamp)) == []  # nothing new: no second firing


def test_session_bridging_record_merges_two_sessions_with_aggregate_merge() -> None:
    SumCount.merges = 0
    op = WindowAggregateOperator(["key"], EventTimeSessionWindows.with_gap(10), "ts", aggregate_function=SumCount())
    h = OperatorHarness(op, schema=SCHEMA)
    h.batch([{"key": 1, "value": 1.0, "ts": 0, "tag": "a"}, {"key": 1, "value": 2.0, "ts": 20, "tag": "b"},
             {"key": 2, "value": 5.0, "ts": 3, "tag": "c"}, {"key": 1, "value": 3.0, "ts": 5, "tag": "d"}])
    assert SumCount.merges == 0  # joining one session needs no merge
    h.batch([{"key": 1, "value": 4.0, "ts": 12, "tag": "bridge"}])  # [12, 22) overlaps [0, 15) and [20, 30)
    assert SumCount.merges == 1
    h.watermark(MAX_WATERMARK.timestamp)
    assert canon(h.rows()) == canon([{"key": 1, "window_start": 0, "window_end": 30, "total": 10.0, "n": 4},
                                     {"key": 2, "window_start": 3, "window_end": 13, "total": 5.0, "n": 1}])


def test_sessions_touching_at_the_gap_merge_and_builtin_aggs_merge() -> None:
    op = WindowAggregateOperator(["key"], EventTimeSessionWindows.with_gap(10), "ts",
                                 aggs=[("value", "max"), ("value", "mean"), ("key", "count")])
    h = OperatorHarness(op, schema=SCHEMA)
    h.batch([{"key": 1, "value": 1.0, "ts": 0, "tag": "a"}, {"key": 1, "value": 9.0, "ts": 20, "tag": "b"}])
    h.batch([{"key": 1, "value": 2.0, "ts": 10, "tag": "c"}])  # [10, 20) touches [0, 10) and [20, 30)
    h.batch([{"key": 1, "value": 3.0, "ts": 41, "tag": "d"}])  # [41, 51) does not reach [0, 30)
    h.watermark(MAX_WATERMARK.timestamp)
    assert canon(h.rows()) == canon([{"key": 1, "window_start": 0, "window_end": 30, "value_max": 9.0,
                                      "value_mean": 4.0, "count": 3},
                                     {"key": 1, "window_start": 41, "window_end": 51, "value_max": 3.0,
                                      "value_mean": 3.0, "count": 1}])


def test_late_record_bridging_into_a_live_session_is_not_late() -> None:
    op = WindowAggregateOperator(["key"], EventTimeSessionWindows.with_gap(100), "ts", aggs=[("value", "sum")],
                                 late_tag="late")
    h = OperatorHarness(op, schema=SCHEMA)
    h.batch([{"key": 1, "value": 1.0, "ts": 100, "tag": "a"}])  # [100, 200)
    h.watermark(150)
    h.batch([{"key": 1, "value": 2.0, "ts": 40, "tag": "b"}])  # [40, 140) alone would be late
    assert h.side_rows("late") == []
    assert rows_of(h.watermark(199)) == [{"key": 1, "window_start": 40, "window_end": 200, "value": 3.0}]


def test_negative_timestamps_and_offsets() -> None:
    op = WindowAggregateOperator(["key"], TumblingEventTimeWindows.of(100, 30), "ts", aggs=[("value", "sum")])
    h = OperatorHarness(op, schema=SCHEMA)
    h.batch([{"key": 1, "value": v, "ts": t, "tag": ""} for v, t in
             ((1.0, -1), (2.0, -70), (4.0, -71), (8.0, 29), (16.0, 30), (32.0, -1000))])
    assert rows_of(h.watermark(-72)) == [{"key": 1, "window_start": -1070, "window_end": -970, "value": 32.0}]
    assert rows_of(h.watermark(-71)) == [{"key": 1, "window_start": -170, "window_end": -70, "value": 4.0}]
    h.watermark(MAX_WATERMARK.timestamp)
    assert canon(h.rows()) == canon([
        {"key": 1, "window_start": -1070, "window_end": -970, "value": 32.0},
        {"key": 1, "window_start": -170, "window_end": -70, "value": 4.0},
        {"key": 1, "window_start": -70, "window_end": 30, "value": 11.0},
        {"key": 1, "window_start": 30, "window_end": 130, "value": 16.0}])


def test_sliding_record_lands_in_every_window_that_holds_it() -> None:
    op = WindowAggregateOperator(["key"], SlidingEventTimeWindows.of(30, 10), "ts", aggs=[("key", "count")])
    h = OperatorHarness(op, schema=SCHEMA)
    h.batch([{"key": 7, "value": 0.0, "ts": 25, "tag": ""}])
    h.watermark(MAX_WATERMARK.timestamp)
    assert sorted((r["window_start"], r["window_end"], r["count"]) for r in h.rows()) == [
        (0, 30, 1), (10, 40, 1), (20, 50, 1)]


def test_multi_column_keys_and_output_names() -> None:
    op = WindowAggregateOperator(["k1", "k2"], TumblingEventTimeWindows.of(10), "ts",
                                 aggs=[("value", "sum"), ("value", "min"), ("k2", "sum"), ("k1", "count")])
    h = OperatorHarness(op, schema=MULTI_SCHEMA)
    h.batch([{"k1": "a", "k2": 1, "value": 1.0, "ts": 1, "tag": ""}, {"k1": "a", "k2": 2, "value": 2.0, "ts": 2, "tag": ""},
             {"k1": "a", "k2": 1, "value": 3.0, "ts": 3, "tag": ""}, {"k1": None, "k2": 1, "value": 4.0, "ts": 4, "tag": ""}])
    h.watermark(MAX_WATERMARK.timestamp)
    batch = next(e[1] for e in h.out.events if e[0] == "data")
    assert batch.schema.names == ["k1", "k2", "window_start", "window_end", "value_sum", "value_min", "k2_sum", "count"]
    assert batch.schema.field("window_start").type == pa.int64()
    assert canon(h.rows()) == canon([
        {"k1": "a", "k2": 1, "window_start": 0, "window_end": 10, "value_sum": 4.0, "value_min": 1.0, "k2_sum": 2, "count": 2},
        {"k1": "a", "k2": 2, "window_start": 0, "window_end": 10, "value_sum": 2.0, "value_min": 2.0, "k2_sum": 2, "count": 1},
        {"k1": None, "k2": 1, "window_start": 0, "window_end": 10, "value_sum": 4.0, "value_min": 4.0, "k2_sum": 1,
         "count": 0}])


def test_plain_names_mean_and_count_with_nulls() -> None:
    op = WindowAggregateOperator(["key"], TumblingEventTimeWindows.of(10), "ts",
                                 aggs=[("value", "mean"), ("value", "count")])
    h = OperatorHarness(op, schema=SCHEMA)
    h.batch([{"key": 1, "value": 1.0, "ts": 1, "tag": ""}, {"key": 1, "value": None, "ts": 2, "tag": ""}])
    h.batch([{"key": 1, "value": 4.0, "ts": 3, "tag": ""}, {"key": 2, "value": None, "ts": 3, "tag": ""}])
    h.watermark(MAX_WATERMARK.timestamp)
    assert canon(h.rows()) == canon([{"key": 1, "window_start": 0, "window_end": 10, "value": 2.5, "count": 2},
                                     {"key": 2, "window_start": 0, "window_end": 10, "value": None, "count": 0}])
    batch = next(e[1] for e in h.out.events if e[0] == "data")
    assert batch.schema.field("value").type == pa.float64() and batch.schema.field("count").type == pa.int64()


def test_integer_sums_stay_integers_in_both_paths() -> None:
    schema = pa.schema([("key", pa.int32()), ("n", pa.int16()), ("ts", TS)])
    for assigner in (TumblingEventTimeWindows.of(10), EventTimeSessionWindows.with_gap(3)):
        op = WindowAggregateOperator(["key"], assigner, "ts", aggs=[("n", "sum"), ("n", "max")])
        h = OperatorHarness(op, schema=schema)
        h.batch([{"key": 1, "n": 3, "ts": 1}, {"key": 1, "n": 4, "ts": 2}])
        h.watermark(MAX_WATERMARK.timestamp)
        batch = next(e[1] for e in h.out.events if e[0] == "data")
        assert batch.schema.field("key").type == pa.int32()
        assert batch.schema.field("n_sum").type == pa.int64() and batch.schema.field("n_max").type == pa.int16()
        assert [(r["n_sum"], r["n_max"]) for r in h.rows()] == [(7, 4)]


def test_timestamp_typed_event_time_column() -> None:
    schema = pa.schema([("key", pa.int64()), ("value", pa.float64()), ("ts", pa.timestamp("us"))])
    op = WindowAggregateOperator(["key"], TumblingEventTimeWindows.of(1000), "ts", aggs=[("value", "sum")])
    h = OperatorHarness(op, schema=schema)
    epoch = dt.datetime(1970, 1, 1)
    h.batch([{"key": 1, "value": 1.0, "ts": epoch + dt.timedelta(microseconds=999_999)},
             {"key": 1, "value": 2.0, "ts": epoch + dt.timedelta(microseconds=1_000_500)},
             {"key": 1, "value": 4.0, "ts": epoch - dt.timedelta(microseconds=1)}])
    h.watermark(MAX_WATERMARK.timestamp)
    assert sorted((r["window_start"], r["value"]) for r in h.rows()) == [(-1000, 4.0), (0, 1.0), (1000, 2.0)]


def test_reduce_keeps_the_key_and_input_columns() -> None:
    op = WindowAggregateOperator(["key"], TumblingEventTimeWindows.of(10), "ts", reduce_fn=reduce_max_value)
    h = OperatorHarness(op, schema=SCHEMA)
    h.batch([{"key": 1, "value": 1.0, "ts": 1, "tag": "a"}, {"key": 1, "value": 5.0, "ts": 2, "tag": "b"},
             {"key": 1, "value": 2.0, "ts": 3, "tag": "c"}])
    h.watermark(MAX_WATERMARK.timestamp)
    assert h.rows() == [{"key": 1, "value": 5.0, "ts": 2, "tag": "b", "window_start": 0, "window_end": 10}]


def test_aggregate_function_scalar_result_goes_in_value() -> None:
    class Count(AggregateFunction[int]):
        def create_accumulator(self) -> int:
            return 0

        def add(self, row: dict[str, Any], acc: int) -> int:
            return acc + 1

        def get_result(self, acc: int) -> int:
            return acc

    op = WindowAggregateOperator(["key"], SlidingEventTimeWindows.of(10, 5), "ts", aggregate_function=Count())
    h = OperatorHarness(op, schema=SCHEMA)
    h.batch([{"key": 1, "value": 1.0, "ts": 7, "tag": ""}, {"key": 1, "value": 1.0, "ts": 8, "tag": ""}])
    h.watermark(MAX_WATERMARK.timestamp)
    assert canon(h.rows()) == canon([{"key": 1, "window_start": 0, "window_end": 10, "value": 2},
                                     {"key": 1, "window_start": 5, "window_end": 15, "value": 2}])


def test_user_function_errors_name_the_operator() -> None:
    def boom(acc: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("nope")

    op = WindowAggregateOperator(["key"], TumblingEventTimeWindows.of(10), "ts", reduce_fn=boom, name="my window")
    h = OperatorHarness(op, schema=SCHEMA)
    with pytest.raises(UserFunctionError, match="my window"):
        h.batch([{"key": 1, "value": 1.0, "ts": 1, "tag": ""}, {"key": 1, "value": 2.0, "ts": 2, "tag": ""}])


def test_null_event_time_raises_naming_operator_and_column() -> None:
    op = WindowAggregateOperator(["key"], TumblingEventTimeWindows.of(10), "ts", aggs=[("value", "sum")],
                                 name="win-sum")
    h = OperatorHarness(op, schema=SCHEMA)
    with pytest.raises(YarnflowError, match="win-sum") as info:
        h.batch([{"key": 1, "value": 1.0, "ts": 1, "tag": ""}, {"key": 1, "value": 1.0, "ts": None, "tag": ""}])
    assert "'ts'" in str(info.value)
    assert not isinstance(info.value, JobDefinitionError)


@pytest.mark.parametrize("kw, missing", [
    ({"keys": ["nokey"], "time_column": "ts", "aggs": [("value", "sum")]}, "nokey"),
    ({"keys": ["key"], "time_column": "when", "aggs": [("value", "sum")]}, "when"),
    ({"keys": ["key"], "time_column": "ts", "aggs": [("price", "sum")]}, "price"),
    ({"keys": ["key"], "time_column": "when", "reduce_fn": reduce_max_value}, "when"),
])
def test_missing_columns_raise_job_definition_error(kw: dict[str, Any], missing: str) -> None:
    op = WindowAggregateOperator(assigner=TumblingEventTimeWindows.of(10), name="win-op", **kw)
    h = OperatorHarness(op, schema=SCHEMA)
    with pytest.raises(JobDefinitionError, match="win-op") as info:
        h.batch([{"key": 1, "value": 1.0, "ts": 1, "tag": ""}])
    assert missing in str(info.value)


@pytest.mark.parametrize("kw, message", [
    ({}, "exactly one"),
    ({"aggs": [("value", "sum")], "reduce_fn": reduce_max_value}, "exactly one"),
    ({"aggs": [("value", "median")]}, "unknown aggregate"),
    ({"aggs": []}, "at least one aggregate"),
    ({"aggs": [("value", "sum")], "allowed_lateness_ms": -1}, "negative"),
    ({"aggregate_function": SumCount}, "AggregateFunction instance"),
    ({"aggs": [("value", "sum")], "time_column": None}, "event-time column"),
    ({"aggs": [("value", "sum")], "assigner": "tumbling"}, "window assigner"),
])
def test_constructor_validation(kw: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"keys": ["key"], "assigner": TumblingEventTimeWindows.of(10), "time_column": "ts", **kw}
    with pytest.raises(JobDefinitionError, match=message):
        WindowAggregateOperator(**args)


def test_operator_pickles_before_it_runs() -> None:
    op = WindowAggregateOperator(["key"], SlidingEventTimeWindows.of(10, 5), "ts", aggs=[("value", "mean")],
                                 allowed_lateness_ms=3, late_tag="late")
    copy = cloudpickle.loads(cloudpickle.dumps(op))
    assert copy.assigner == op.assigner and copy.aggs == op.aggs


def test_one_million_rows_through_a_tumbling_sum() -> None:
    n, bs = 1_000_000, 65536
    rng = np.random.default_rng(7)
    key = rng.integers(0, 1000, n)
    value = rng.integers(0, 100, n).astype(np.float64)
    ts = np.arange(n) // 100 - rng.integers(0, 151, n)
    op = WindowAggregateOperator(["key"], TumblingEventTimeWindows.of(1000), "ts", aggs=[("value", "sum")])
    h = OperatorHarness(op)
    max_ts = MIN_WM
    for a in range(0, n, bs):
        h.batch(pa.RecordBatch.from_arrays([pa.array(key[a:a + bs]), pa.array(value[a:a + bs]),
                                            pa.array(ts[a:a + bs])], names=["key", "value", "ts"]))
        max_ts = max(max_ts, int(ts[a:a + bs].max()))
        h.watermark(max_ts - 200 - 1)
    h.watermark(MAX_WATERMARK.timestamp)
    h.finish()
    assert op.late_records_dropped == 0
    out = pa.Table.from_batches([e[1] for e in h.out.events if e[0] == "data"])
    got = {(k, w): v for k, w, v in zip(out.column("key").to_pylist(), out.column("window_start").to_pylist(),
                                         out.column("value").to_pylist(), strict=True)}
    assert len(got) == out.num_rows
    starts = ts - np.mod(ts, 1000)
    expected: dict[tuple[int, int], float] = defaultdict(float)
    flat = (starts // 1000 - starts.min() // 1000) * 1000 + key
    sums = np.bincount(flat, weights=value)
    for idx in np.flatnonzero(np.bincount(flat)):
        expected[(int(idx % 1000), int(idx // 1000 * 1000 + starts.min()))] = float(sums[idx])
    assert got == expected


# --------------------------------------------------------------------------- window join

LEFT = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("ts", TS), ("side", pa.string())])
RIGHT = pa.schema([("id", pa.int64()), ("v", pa.float64()), ("ts", TS), ("w", pa.string())])


def join_stream(seed: int, n: int = 600, bound: int = 10) -> list[tuple[int, list[dict[str, Any]], int]]:
    rnd = random.Random(seed)
    out, max_ts = [], [MIN_WM, MIN_WM]
    t = [0, 0]
    while sum(len(b) for _, b, _ in out) < n:
        side = rnd.randrange(2)
        rows = []
        for _ in range(rnd.randint(1, 12)):
            t[side] += rnd.choice([0, 1, 2])
            ts = t[side] - rnd.randint(0, bound)
            if rnd.random() < 0.05:
                ts -= 60
            key = rnd.choice([0, 1, 2, 3, None]) if rnd.random() < 0.97 else None
            rows.append({"k": key, "v": float(rnd.randint(0, 9)), "ts": ts, "side": f"L{ts}"} if side == 0 else
                        {"id": key, "v": float(rnd.randint(0, 9)), "ts": ts, "w": f"R{ts}"})
            max_ts[side] = max(max_ts[side], ts)
        out.append((side, rows, max_ts[side] - bound - 1))
    return out


class RefJoin:
    def __init__(self, spec: dict[str, Any], join_fn: Callable[..., Any] | None) -> None:
        self.spec, self.join_fn = spec, join_fn
        self.wm_in = [MIN_WM, MIN_WM]
        self.wm = MIN_WM
        self.sides: dict[tuple[int, int], tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
        self.dropped = 0
        self.steps: list[list[tuple[Any, ...]]] = []

    def batch(self, side: int, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            wins = ref_windows(self.spec, row["ts"])
            live = [w for w in wins if w[1] - 1 > self.wm]
            if not live:
                if wins or row["ts"] <= self.wm:
                    self.dropped += 1
                continue
            for w in live:
                self.sides.setdefault(w, ([], []))[side].append(row)
        self.steps.append([])

    def watermark(self, side: int, ts: int) -> None:
        self.wm_in[side] = max(self.wm_in[side], ts)
        self._advance(min(self.wm_in))

    def end(self, side: int) -> None:
        self.wm_in[side] = 2**63 - 1
        self._advance(min(self.wm_in))

    def _advance(self, new: int) -> None:
        events: list[tuple[Any, ...]] = []
        if new > self.wm:
            self.wm = new
            rows = []
            for w in sorted(self.sides):
                if w[1] - 1 > new:
                    continue
                left, right = self.sides.pop(w)
                for lrow in left:
                    for rrow in right:
                        if lrow["k"] is None or lrow["k"] != rrow["id"]:
                            continue
                        if self.join_fn is not None:
                            row = dict(self.join_fn(lrow, rrow))
                        else:
                            row = dict(lrow)
                            for c, v in rrow.items():
                                if c != "id":
                                    row[c + "_right" if c in lrow else c] = v
                        row.update(window_start=w[0], window_end=w[1])
                        rows.append(row)
            if rows:
                events.append(("rows", rows))
            events.append(("wm", new))
        self.steps.append(events)

    def normalised(self) -> list[tuple[Any, ...]]:
        return [(canon([r for e in ev if e[0] == "rows" for r in e[1]]), [], [e[1] for e in ev if e[0] == "wm"])
                for ev in self.steps]


def pair_fn(left: dict[str, Any], right: dict[str, Any]) -> dict[str, Any]:
    return {"key": left["k"], "total": left["v"] + right["v"], "lts": left["ts"], "rts": right["ts"]}


@pytest.mark.parametrize("spec, assigner", [
    ({"kind": "tumbling", "size": 20}, TumblingEventTimeWindows.of(20)),
    ({"kind": "tumbling", "size": 20, "offset": -5}, TumblingEventTimeWindows.of(20, -5)),
    ({"kind": "sliding", "size": 30, "slide": 10}, SlidingEventTimeWindows.of(30, 10)),
    ({"kind": "sliding", "size": 10, "slide": 15}, SlidingEventTimeWindows.of(10, 15)),
])
@pytest.mark.parametrize("join_fn", [None, pair_fn])
def test_window_join_matches_reference(spec: dict[str, Any], assigner: Any, join_fn: Any) -> None:
    op = WindowJoinOperator(["k"], ["id"], assigner, "ts", "ts", join_fn=join_fn)
    ref = RefJoin(spec, join_fn)
    h = OperatorHarness(op)
    for side, rows, wm in join_stream(len(spec) + (join_fn is None)):
        h.batch(pa.RecordBatch.from_pylist(rows, schema=RIGHT if side else LEFT), input_index=side)
        ref.batch(side, rows)
        h.watermark(wm, input_index=side)
        ref.watermark(side, wm)
    h.end_input(0)
    ref.end(0)
    h.end_input(1)
    ref.end(1)
    h.finish()
    ref.steps.append([])
    assert normalise(h.steps) == ref.normalised()
    assert op.late_records_dropped == ref.dropped > 0
    rows = h.rows()
    assert rows
    if join_fn is None:
        assert list(rows[0]) == ["k", "v", "ts", "side", "v_right", "ts_right", "w", "window_start", "window_end"]
    else:
        assert list(rows[0]) == ["key", "total", "lts", "rts", "window_start", "window_end"]
    assert h.watermarks()[-1] == 2**63 - 1


def test_window_join_multi_keys_and_results_before_the_watermark() -> None:
    left = pa.schema([("a", pa.string()), ("b", pa.int64()), ("x", pa.int64()), ("t", TS)])
    right = pa.schema([("a", pa.string()), ("b", pa.int64()), ("y", pa.int64()), ("t", TS)])
    op = WindowJoinOperator(["a", "b"], ["a", "b"], TumblingEventTimeWindows.of(10), "t", "t")
    h = OperatorHarness(op)
    h.batch(pa.RecordBatch.from_pylist([{"a": "p", "b": 1, "x": 1, "t": 1}, {"a": "p", "b": 2, "x": 2, "t": 2},
                                        {"a": "q", "b": 1, "x": 3, "t": 11}], schema=left), input_index=0)
    h.batch(pa.RecordBatch.from_pylist([{"a": "p", "b": 1, "y": 10, "t": 9}, {"a": "p", "b": 1, "y": 20, "t": 5},
                                        {"a": "q", "b": 1, "y": 30, "t": 3}], schema=right), input_index=1)
    assert h.watermark(9, input_index=0) == []  # the right input holds the watermark back
    events = h.watermark(50, input_index=1)
    assert [e[0] for e in events] == ["data", "wm"] and events[-1] == ("wm", 9)
    assert canon(rows_of(events)) == canon([
        {"a": "p", "b": 1, "x": 1, "t": 1, "y": 10, "t_right": 9, "window_start": 0, "window_end": 10},
        {"a": "p", "b": 1, "x": 1, "t": 1, "y": 20, "t_right": 5, "window_start": 0, "window_end": 10}])
    h.batch(pa.RecordBatch.from_pylist([{"a": "p", "b": 1, "y": 1, "t": 0}], schema=right), input_index=1)
    assert op.late_records_dropped == 1
    h.end_input(0)
    assert h.watermarks()[-1] == 50  # the right input's watermark now leads; window [10, 20) fired: no match
    assert rows_of(h.steps[-1]) == []


def test_window_join_rejects_other_assigners_and_missing_columns() -> None:
    for assigner in (EventTimeSessionWindows.with_gap(5), TumblingProcessingTimeWindows.of(5),
                     SlidingProcessingTimeWindows.of(10, 5)):
        with pytest.raises(ValueError, match="tumbling or sliding event-time"):
            WindowJoinOperator(["k"], ["id"], assigner, "ts", "ts")
    with pytest.raises(ValueError, match="same"):
        WindowJoinOperator(["k", "j"], ["id"], TumblingEventTimeWindows.of(5), "ts", "ts")
    op = WindowJoinOperator(["k"], ["nope"], TumblingEventTimeWindows.of(5), "ts", "ts", name="jn")
    h = OperatorHarness(op)
    h.batch(pa.RecordBatch.from_pylist([{"k": 1, "v": 1.0, "ts": 1, "side": ""}], schema=LEFT), input_index=0)
    with pytest.raises(JobDefinitionError, match="jn.*nope"):
        h.batch(pa.RecordBatch.from_pylist([{"id": 1, "v": 1.0, "ts": 1, "w": ""}], schema=RIGHT), input_index=1)
    with pytest.raises(YarnflowError, match="jn.*'ts'"):
        h.batch(pa.RecordBatch.from_pylist([{"k": 1, "v": 1.0, "ts": None, "side": ""}], schema=LEFT), input_index=0)


def test_a_dynamic_session_gap_comes_from_each_row() -> None:
    """with_dynamic_gap(fn): a row opens a session of its own gap (Flink's gap extractor); a gap
    that is not a positive int of ms is refused naming it."""
    assigner = EventTimeSessionWindows.with_dynamic_gap(lambda row: row["gap"])
    assert assigner.session_window(100, {"gap": 7}) == (100, 107)
    assert assigner.session_window(100, {"gap": 30}) == (100, 130)
    for bad in (0, -5, 2.5, True):
        with pytest.raises(ValueError, match="dynamic session gap must be a positive int"):
            assigner.session_window(0, {"gap": bad})
    with pytest.raises(ValueError, match="needs a function of the row"):
        EventTimeSessionWindows.with_dynamic_gap("10 s")
