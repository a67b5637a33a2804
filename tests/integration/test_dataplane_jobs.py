"""Data plane features as whole jobs on a real local cluster (2 TaskExecutors x 2 slots,
parallelism 2): partitioners, union, side outputs, sources, sinks and bad input."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from yarnflow.common.errors import JobFailedError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]




def rows(table):
    return sorted(table.to_pylist(), key=lambda r: tuple(str(v) for v in r.values()))


def test_rebalance_broadcast_and_union(run):
    data = {"x": list(range(1000))}
    res = run(lambda env: env.from_collection(data).rebalance().map(lambda r: {"x": r["x"] * 2}).collect())
    assert sorted(res.collected()["x"].to_pylist()) == [2 * i for i in range(1000)]

    res = run(lambda env: env.from_collection({"x": [1, 2, 3]}).set_parallelism(1).broadcast()
              .map(lambda r: r).collect())
    assert sorted(res.collected()["x"].to_pylist()) == [1, 1, 2, 2, 3, 3]  # every subtask got every row

    def union(env):
        a = env.from_collection({"k": ["a", "b"], "v": [1, 2]})
        b = env.from_collection({"k": ["a", "c"], "v": [10, 20]})
        c = env.from_collection({"k": ["b"], "v": [100]})
        a.union(b, c).key_by("k").sum("v").collect()

    res = run(union)
    assert dict(zip(res.collected()["k"].to_pylist(), res.collected()["v"].to_pylist())) == \
        {"a": 11, "b": 102, "c": 20}


def test_multi_column_keys_and_min_max_reduce(run):
    data = {"a": ["x", "x", "y", "y", "x"], "b": [1, 1, 1, 2, 2], "v": [5, 3, 9, 1, 7]}

    def build(env):
        s = env.from_collection(data)
        s.key_by("a", "b").min("v").collect()

    res = run(build)
    got = {(r["a"], r["b"]): r["v"] for r in res.collected().to_pylist()}
    assert got == {("x", 1): 3, ("y", 1): 9, ("y", 2): 1, ("x", 2): 7}

    res = run(lambda env: env.from_collection(data).key_by("a").reduce(
        lambda acc, r: {**acc, "v": acc["v"] + r["v"], "b": max(acc["b"], r["b"])}).collect())
    got = {r["a"]: (r["v"], r["b"]) for r in res.collected().to_pylist()}
    assert got == {"x": (15, 2), "y": (10, 2)}


def test_generator_source_bounded_with_rate_limit(run):
    import time

    def gen(start, n):
        return {"i": list(range(start, start + n))}

    t0 = time.monotonic()
    res = run(lambda env: env.from_generator(gen, count=300, rate_per_s=200).collect())
    took = time.monotonic() - t0
    assert sorted(res.collected()["i"].to_pylist()) == list(range(300))
    assert took >= 1.2  # 300 rows at 200 rows/s take at least 1.5 s (less start-up slack)


def test_file_sources_split_dynamically_and_csv_sink_rolls(run, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    expected = 0
    for f in range(5):
        t = pa.table({"k": [f"k{i % 7}" for i in range(2000)], "v": list(range(2000))})
        pq.write_table(t, str(src / f"p{f}.parquet"), row_group_size=500)  # 4 splits each
        expected += sum(range(2000))
    out = tmp_path / "csv"
    run(lambda env: env.read_parquet(str(src)).map_batches(lambda b: b).sink_to_csv(str(out), roll_size_bytes=8_000))
    files = sorted(os.listdir(out))
    assert len(files) > 2 and all(f.endswith(".csv") and not f.startswith(".") for f in files)
    total = sum(sum(pacsv.read_csv(str(out / f))["v"].to_pylist()) for f in files)
    assert total == expected


def test_json_and_csv_sources(run, tmp_path):
    (tmp_path / "a.jsonl").write_text('{"k": "a", "v": 1}\n{"k": "b", "v": 2}\n{"k": "a", "v": 3}\n')
    (tmp_path / "b.csv").write_text("k,v\na,10\nc,5\n")
    res = run(lambda env: env.read_json(str(tmp_path / "a.jsonl")).union(env.read_csv(str(tmp_path / "b.csv")))
              .key_by("k").sum("v").collect())
    assert dict(zip(res.collected()["k"].to_pylist(), res.collected()["v"].to_pylist())) == {"a": 14, "b": 2, "c": 5}


def test_corrupt_parquet_file_is_named_in_the_failure(run, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(pa.table({"v": [1, 2]}), str(src / "good.parquet"))
    (src / "bad.parquet").write_bytes(b"PAR1 this is not parquet at all")
    with pytest.raises(JobFailedError) as err:
        run(lambda env: env.read_parquet(str(src)).collect())
    assert "bad.parquet" in str(err.value)


def test_corrupt_csv_file_is_named_in_the_failure(run, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "broken.csv").write_text('a,b\n1,2\n3,4,5\n')
    with pytest.raises(JobFailedError) as err:
        run(lambda env: env.read_csv(str(src)).collect())
    assert "broken.csv" in str(err.value)


def test_missing_key_column_names_operator_and_column(run):
    with pytest.raises(JobFailedError) as err:
        run(lambda env: env.from_collection({"a": [1, 2]}).key_by("nope").sum("a").collect())
    assert "'nope'" in str(err.value) and "does not exist" in str(err.value)


def test_schema_change_in_a_row_function_names_the_operator(run):
    def flip(row):
        return {"v": row["v"]} if row["v"] < 5 else {"v": str(row["v"])}

    with pytest.raises(JobFailedError) as err:
        run(lambda env: env.from_collection({"v": list(range(10))}).map(flip, name="flip").collect(),
            parallelism=1, conf={"execution.batch-size": "3"})
    assert "operator 'flip'" in str(err.value)


def test_null_event_time_names_operator_and_column(run):
    from yarnflow.windows import WatermarkStrategy

    strategy = WatermarkStrategy.for_bounded_out_of_orderness(10).with_timestamp_column("ts")
    with pytest.raises(JobFailedError) as err:
        run(lambda env: env.from_collection({"ts": [1, None, 3]}, schema=pa.schema([("ts", pa.int64())]))
            .assign_timestamps_and_watermarks(strategy).collect())
    assert "null event time in column 'ts'" in str(err.value)
    assert "timestamps/watermarks" in str(err.value)


def test_user_function_error_carries_its_traceback(run):
    def boom(row):
        raise KeyError("missing field")

    with pytest.raises(JobFailedError) as err:
        run(lambda env: env.from_collection({"v": [1]}).map(boom, name="enrich").collect())
    cause = err.value.cause
    assert "operator 'enrich'" in cause.message
    assert "in boom" in cause.traceback and "KeyError" in cause.traceback
