"""Operators (worker/operators/*), driven directly through the shared OperatorHarness, with a
pyarrow / plain-Python reference for every result."""

from __future__ import annotations

import json
import os
import random
from typing import Any, Callable

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.operators.base import UserFunctionError
from yarnflow.worker.operators.keyed import KeyedAggregate, KeyedReduce
from yarnflow.worker.operators.sinks import CollectSink, ParquetSink, read_collected
from yarnflow.worker.operators.sources import CollectionSource, FileSource, SourceReadError
from yarnflow.worker.operators.transforms import MapBatches, RowFilter, RowFlatMap, RowMap, SchemaMismatchError

from tests.harness import OperatorHarness, RecordingOutput, runtime_context

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def sorted_rows(rows: list[dict[str, Any]], keys: list[str]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: tuple((r[k] is None, r[k] if r[k] is not None else 0) for k in keys))


WORDS = pa.record_batch({"word": ["a", "b", "a", "c", None, "b", "a"], "n": [1, 2, 3, None, 5, 6, 7]})


# -- stateless transformations -------------------------------------------------------------------

def test_map_batches_accepts_batches_tables_and_data_frames_and_drops_empty_results():
    results: list[Callable[[pa.RecordBatch], Any]] = [
        lambda b: b.append_column("m", pc.multiply(b["n"], 10)),
        lambda b: pa.Table.from_batches([b]).select(["n"]),
        lambda b: pd.DataFrame({"n2": b["n"].to_pylist()}),
        lambda b: b.slice(0, 0),
    ]
    h = OperatorHarness(MapBatches(lambda b: results.pop(0)(b), name="mb"))
    for _ in range(4):
        h.batch(WORDS)
    assert len(h.batches) == 3  # the empty result is not emitted
    assert h.batches[0].column("m").to_pylist() == [10, 20, 30, None, 50, 60, 70]
    assert h.batches[1].schema.names == ["n"] and h.batches[1].num_rows == 7
    assert h.batches[2].column("n2").to_pylist()[:3] == [1, 2, 3]


def test_map_batches_with_a_wrong_return_type_names_the_operator():
    h = OperatorHarness(MapBatches(lambda b: b.to_pylist(), name="to-list"))
    with pytest.raises(SchemaMismatchError, match="'to-list'.*got list"):
        h.batch(WORDS)


def test_row_map_with_dict_and_scalar_results():
    h = OperatorHarness(RowMap(lambda r: {"word": r["word"], "twice": None if r["n"] is None else 2 * r["n"]}))
    h.batch(WORDS)
    assert h.rows() == [{"word": w, "twice": None if n is None else 2 * n}
                        for w, n in zip(WORDS["word"].to_pylist(), WORDS["n"].to_pylist(), strict=True)]
    h2 = OperatorHarness(RowMap(lambda r: (r["word"] or "") * 2))
    h2.batch(WORDS)
    h2.batch(WORDS.slice(0, 2))
    assert all(b.schema.names == ["value"] for b in h2.batches)
    assert [r["value"] for r in h2.rows()] == ["aa", "bb", "aa", "cc", "", "bb", "aa", "aa", "bb"]


def test_row_filter_keeps_truthy_rows_and_emits_nothing_for_an_empty_result():
    h = OperatorHarness(RowFilter(lambda r: r["n"] and r["n"] % 2))
    h.batch(WORDS)
    assert h.rows() == [r for r in WORDS.to_pylist() if r["n"] and r["n"] % 2]
    h.batch(WORDS.filter(pa.array([False, True, False, False, False, True, False])))  # even n only
    assert len(h.batches) == 1


def test_row_flat_map_fans_out_and_skips_none():
    h = OperatorHarness(RowFlatMap(lambda r: None if r["word"] is None else ({"w": r["word"], "i": i}
                                                                             for i in range(r["n"] or 0))))
    h.batch(WORDS)
    expected = [{"w": w, "i": i} for w, n in zip(WORDS["word"].to_pylist(), WORDS["n"].to_pylist(), strict=True)
                if w is not None for i in range(n or 0)]
    assert h.rows() == expected


def test_row_flat_map_with_a_non_iterable_result_names_the_operator():
    h = OperatorHarness(RowFlatMap(lambda r: 5, name="bad-fm"))
    with pytest.raises(SchemaMismatchError, match="'bad-fm'.*iterable.*int"):
        h.batch(WORDS)


@pytest.mark.parametrize("later", [
    [{"w": "x", "n": 1, "extra": True}],                      # a new column
    [{"w": "x", "n": "not a number"}],                         # another type
    [{"w": "x", "n": 1}, {"w": "y", "n": 2, "extra": True}],  # a new column, not in the first row
])
def test_row_flat_map_schema_is_fixed_by_the_first_batch(later: list[dict[str, Any]]):
    batches = iter([[{"w": "a", "n": 1}, {"w": "b", "n": 2}], later])
    h = OperatorHarness(RowFlatMap(lambda r: next(batches), name="splitter"))
    h.batch(WORDS.slice(0, 1))
    assert h.batches[0].schema == pa.schema([("w", pa.string()), ("n", pa.int64())])
    with pytest.raises(SchemaMismatchError, match="operator 'splitter'"):
        h.batch(WORDS.slice(0, 1))
    assert len(h.batches) == 1


@pytest.mark.parametrize("first", [1, None])
def test_rows_whose_keys_differ_within_one_batch_are_not_silently_dropped(first: Any):
    h = OperatorHarness(RowMap(lambda r: {"a": first} if r["n"] == 1 else {"a": 2, "b": 3}, name="uneven"))
    with pytest.raises(SchemaMismatchError, match="'uneven'.*'b'"):
        h.batch(WORDS)
    assert h.batches == []


def test_row_map_decides_column_types_on_the_first_batch_that_has_them():
    values = iter([None, None, 7, 8])
    h = OperatorHarness(RowMap(lambda r: {"a": next(values)}))
    h.batch(WORDS.slice(0, 2))
    h.batch(WORDS.slice(0, 2))
    assert [b.schema.field("a").type for b in h.batches] == [pa.null(), pa.int64()]
    assert h.rows() == [{"a": None}, {"a": None}, {"a": 7}, {"a": 8}]


def test_row_map_keeps_a_later_row_with_missing_columns_as_nulls():
    rows = iter([{"a": 1, "b": "x"}, {"a": 2}])
    h = OperatorHarness(RowMap(lambda r: next(rows)))
    h.batch(WORDS.slice(0, 1))
    h.batch(WORDS.slice(0, 1))
    assert h.rows() == [{"a": 1, "b": "x"}, {"a": 2, "b": None}]


@pytest.mark.parametrize("make", [
    lambda fn: MapBatches(fn, name="the-op"),
    lambda fn: RowMap(fn, name="the-op"),
    lambda fn: RowFilter(fn, name="the-op"),
    lambda fn: RowFlatMap(fn, name="the-op"),
    lambda fn: KeyedReduce(["word"], lambda a, b: fn(b), name="the-op"),
])
def test_a_user_function_error_names_the_operator_and_chains_the_original(make):
    original = ZeroDivisionError("boom")

    def user_fn(_: Any) -> Any:
        raise original

    h = OperatorHarness(make(user_fn))
    with pytest.raises(UserFunctionError, match="operator 'the-op' raised ZeroDivisionError: boom") as info:
        h.batch(WORDS)
    assert info.value.__cause__ is original


def test_stateless_operators_forward_watermarks():
    h = OperatorHarness(RowMap(lambda r: r))
    h.watermark(42)
    assert h.watermarks() == [42]


# -- keyed aggregations --------------------------------------------------------------------------

AGGS = [("v", "sum"), ("v", "min"), ("v", "max"), ("k", "count")]


def random_batches(seed: int, n_batches: int, rows: int, keys: int, null_keys: bool = True) -> list[pa.RecordBatch]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n_batches):
        ks = [None if null_keys and rnd.random() < 0.05 else f"k{rnd.randrange(keys)}" for _ in range(rows)]
        vs = [None if rnd.random() < 0.1 else rnd.randint(-1000, 1000) for _ in range(rows)]
        out.append(pa.record_batch({"k": pa.array(ks, pa.string()), "v": pa.array(vs, pa.int64())}))
    return out


def reference(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    """Per key (nulls included): sum/min/max of the non-null values, count of the rows."""
    table = pa.Table.from_batches(batches)
    grouped = table.group_by("k").aggregate([("v", "sum"), ("v", "min"), ("v", "max"),
                                             ("k", "count", pc.CountOptions(mode="all"))])
    rows = grouped.rename_columns({"k_count": "count"}).select(["k", "v_sum", "v_min", "v_max", "count"]).to_pylist()
    return sorted_rows(rows, ["k"])


def test_keyed_aggregate_output_names():
    assert KeyedAggregate(["k"], AGGS)._names() == ["v_sum", "v_min", "v_max", "count"]
    assert KeyedAggregate(["word"], [("count", "sum")])._names() == ["count"]
    assert KeyedAggregate(["word"], [("word", "count")])._names() == ["count"]
    assert KeyedAggregate(["word"], [("word", "max")])._names() == ["word_max"]


def test_keyed_aggregate_in_batch_mode_emits_once_at_finish_and_matches_pyarrow():
    batches = random_batches(1, 20, 300, 50)
    h = OperatorHarness(KeyedAggregate(["k"], AGGS), runtime_mode="BATCH", batch_size=16)
    for b in batches:
        h.batch(b)
    h.end_input()
    assert h.batches == []
    h.finish()
    assert all(b.num_rows <= 16 for b in h.batches)
    rows = sorted_rows(h.rows(), ["k"])
    assert rows == reference(batches)
    assert len(rows) == len({r["k"] for r in rows}) == 51  # 50 keys and the null key


def test_keyed_count_counts_rows_of_the_null_key():
    h = OperatorHarness(KeyedAggregate(["k"], [("k", "count")]), runtime_mode="BATCH")
    h.batch(pa.record_batch({"k": pa.array([None, "a", None], pa.string())}))
    h.finish()
    assert sorted_rows(h.rows(), ["k"]) == [{"k": "a", "count": 1}, {"k": None, "count": 2}]


def test_keyed_aggregate_in_streaming_mode_emits_upserts_per_batch():
    batches = random_batches(3, 15, 40, 12)
    h = OperatorHarness(KeyedAggregate(["k"], AGGS), runtime_mode="STREAMING")
    latest: dict[Any, dict[str, Any]] = {}
    for i, b in enumerate(batches):
        h.batch(b)
        emitted = h.take()
        assert len(emitted) == 1
        rows = emitted[0].to_pylist()
        assert {r["k"] for r in rows} == set(b["k"].to_pylist())  # exactly the keys this batch touched
        for r in rows:
            latest[r["k"]] = r
        # every upsert holds the aggregate over all input so far
        so_far = {r["k"]: r for r in reference(batches[:i + 1])}
        assert all(so_far[r["k"]] == r for r in rows)
    h.end_input()
    h.finish()
    assert h.batches == []  # nothing more at the end
    assert sorted_rows(list(latest.values()), ["k"]) == reference(batches)


@pytest.mark.parametrize("mode", ["BATCH", "STREAMING"])
def test_keyed_aggregate_on_a_missing_column_is_a_job_definition_error(mode: str):
    h = OperatorHarness(KeyedAggregate(["key"], [("v", "sum")], name="agg"), runtime_mode=mode)
    with pytest.raises(JobDefinitionError, match=r"'agg'.*'key'.* not exist"):
        h.batch(pa.record_batch({"k": ["a"], "v": [1]}))
    h2 = OperatorHarness(KeyedAggregate(["k"], [("value", "max")], name="agg2"), runtime_mode=mode)
    with pytest.raises(JobDefinitionError, match=r"'agg2'.*'value'.* not exist"):
        h2.batch(pa.record_batch({"k": ["a"], "v": [1]}))
    with pytest.raises(JobDefinitionError, match="'avg'"):
        KeyedAggregate(["k"], [("v", "avg")])


def test_keyed_aggregate_over_multi_column_keys():
    b = pa.record_batch({"a": ["x", "x", "y", "x"], "b": [1, 2, 1, 1], "v": [1.5, 2.0, 3.0, 4.0]})
    h = OperatorHarness(KeyedAggregate(["a", "b"], [("v", "sum")]), runtime_mode="BATCH")
    h.batch(b)
    h.batch(b)
    h.finish()
    assert sorted_rows(h.rows(), ["a", "b"]) == [{"a": "x", "b": 1, "v": 11.0}, {"a": "x", "b": 2, "v": 4.0},
                                                 {"a": "y", "b": 1, "v": 6.0}]


def _concat(acc: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    return {"k": "ignored", "s": acc["s"] + row["s"], "n": acc["n"] + row["n"]}


def test_keyed_reduce_in_batch_mode_emits_one_row_per_key_at_finish():
    b = pa.record_batch({"k": ["a", "b", "a", "a", None], "s": ["1", "2", "3", "4", "5"], "n": [1, 2, 3, 4, 5]})
    h = OperatorHarness(KeyedReduce(["k"], _concat), runtime_mode="BATCH", batch_size=2)
    h.batch(b)
    h.batch(b.slice(0, 2))
    assert h.batches == []
    h.finish()
    assert all(x.num_rows <= 2 and x.schema == b.schema for x in h.batches)
    assert sorted_rows(h.rows(), ["k"]) == [{"k": "a", "s": "1341", "n": 9}, {"k": "b", "s": "22", "n": 4},
                                            {"k": None, "s": "5", "n": 5}]


def test_keyed_reduce_in_streaming_mode_emits_the_updated_rows_of_each_batch():
    h = OperatorHarness(KeyedReduce(["k"], _concat))
    h.batch(pa.record_batch({"k": ["a", "b", "a"], "s": ["1", "2", "3"], "n": [1, 2, 3]}))
    assert sorted_rows(h.rows(), ["k"]) == [{"k": "a", "s": "13", "n": 4}, {"k": "b", "s": "2", "n": 2}]
    h.take()
    h.batch(pa.record_batch({"k": ["b"], "s": ["9"], "n": [9]}))
    assert h.rows() == [{"k": "b", "s": "29", "n": 11}]
    h.finish()
    assert len(h.batches) == 1


def test_keyed_reduce_errors():
    h = OperatorHarness(KeyedReduce(["key"], _concat, name="red"))
    with pytest.raises(JobDefinitionError, match=r"'red'.*\['key'\]"):
        h.batch(pa.record_batch({"k": ["a"]}))
    h = OperatorHarness(KeyedReduce(["k"], lambda a, b: 5, name="red2"))
    with pytest.raises(JobDefinitionError, match="'red2' must return a dict"):
        h.batch(pa.record_batch({"k": ["a", "a"]}))


# -- sources -------------------------------------------------------------------------------------

def test_collection_source_splits_into_contiguous_slices():
    table = pa.table({"i": list(range(103))})
    for p in range(1, 6):
        parts = []
        for i in range(p):
            h = OperatorHarness(CollectionSource(table), subtask_index=i, parallelism=p, batch_size=10).run()
            assert all(0 < b.num_rows <= 10 for b in h.batches)
            part = [r["i"] for r in h.rows()]
            assert part and part == list(range(part[0], part[0] + len(part)))  # one contiguous slice
            assert abs(len(part) - 103 / p) < 1
            parts.append(part)
        assert [x for part in parts for x in part] == list(range(103))


def test_collection_source_stops_when_cancelled():
    calls = []

    def cancelled() -> bool:
        calls.append(1)
        return len(calls) > 2

    h = OperatorHarness(CollectionSource(pa.table({"i": list(range(100))})), batch_size=10).run(cancelled)
    assert len(h.batches) == 2


@pytest.fixture
def data() -> pa.Table:
    return pa.table({"id": list(range(30)), "name": [f"n{i}" for i in range(30)], "x": [i / 4 for i in range(30)]})


def write(fmt: str, table: pa.Table, path: Any) -> None:
    if fmt == "parquet":
        pq.write_table(table, path)
    elif fmt == "csv":
        pacsv.write_csv(table, path)
    elif fmt == "json":
        with open(path, "w") as fh:
            for row in table.to_pylist():
                fh.write(json.dumps(row) + "\n")
    else:
        with open(path, "w") as fh:
            fh.write("".join(f"{n}\n" for n in table["name"].to_pylist()))


def rows_of(fmt: str, h: OperatorHarness) -> list[Any]:
    if fmt == "text":
        return [r["line"] for r in h.rows()]
    return h.rows()


def expected_rows(fmt: str, table: pa.Table) -> list[Any]:
    return table["name"].to_pylist() if fmt == "text" else table.to_pylist()


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json", "text"])
def test_file_source_reads_a_folder_skipping_hidden_and_underscore_files(fmt: str, data: pa.Table, tmp_path):
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    (folder / "_temporary" / "0").mkdir(parents=True)
    (folder / ".hidden_dir").mkdir()
    write(fmt, data.slice(0, 10), folder / "a")
    write(fmt, data.slice(10, 10), folder / "b")
    write(fmt, data.slice(20, 10), folder / "sub" / "c")
    for junk in [folder / "_SUCCESS", folder / ".a.crc", folder / "_temporary" / "0" / "part-0",
                 folder / ".hidden_dir" / "d", folder / "sub" / ".e"]:
        junk.write_bytes(b"\x00garbage, not a data file\xff")
    h = OperatorHarness(FileSource(str(folder), fmt), batch_size=4).run()
    assert sorted(map(repr, rows_of(fmt, h))) == sorted(map(repr, expected_rows(fmt, data)))
    # files are read in sorted order, each in order
    assert rows_of(fmt, h) == expected_rows(fmt, data)
    if fmt in ("parquet", "json", "text"):
        assert all(b.num_rows <= 4 for b in h.batches)


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json", "text"])
def test_file_source_splits_files_between_subtasks(fmt: str, data: pa.Table, tmp_path):
    for i in range(5):
        write(fmt, data.slice(6 * i, 6), tmp_path / f"part-{i}")
    seen = []
    for i in range(2):
        h = OperatorHarness(FileSource(str(tmp_path), fmt), subtask_index=i, parallelism=2).run()
        got = rows_of(fmt, h)
        files = [0, 2, 4] if i == 0 else [1, 3]  # every p-th file, in sorted order
        assert got == [r for f in files for r in expected_rows(fmt, data.slice(6 * f, 6))]
        seen += got
    assert sorted(map(repr, seen)) == sorted(map(repr, expected_rows(fmt, data)))


def test_parquet_row_groups_are_splits_and_a_split_provider_hands_them_out(data: pa.Table, tmp_path):
    pq.write_table(data, tmp_path / "one.parquet", row_group_size=7)  # 5 row groups
    source = FileSource(str(tmp_path / "one.parquet"), "parquet", options={"columns": ["id"]})
    splits = source.enumerate_splits()
    assert [sid.rsplit("#", 1)[1] for sid, _ in splits] == ["0", "1", "2", "3", "4"]
    by_subtask = [[r["id"] for r in OperatorHarness(FileSource(str(tmp_path), "parquet"), subtask_index=i,
                                                    parallelism=3).run().rows()] for i in range(3)]
    assert by_subtask[0] == list(range(0, 7)) + list(range(21, 28))
    assert sorted(x for part in by_subtask for x in part) == list(range(30))
    payloads = iter([splits[3][1], splits[0][1], None])
    h = OperatorHarness(source, split_provider=lambda: next(payloads)).run()
    assert h.rows() == [{"id": i} for i in list(range(21, 28)) + list(range(0, 7))]


def test_a_corrupt_parquet_file_is_a_source_read_error_naming_it(data: pa.Table, tmp_path):
    pq.write_table(data, tmp_path / "good.parquet")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(SourceReadError, match="bad.parquet") as info:
        OperatorHarness(FileSource(str(tmp_path), "parquet")).run()
    assert isinstance(info.value, OSError) and "good.parquet" not in str(info.value)


@pytest.mark.parametrize("fmt,content", [("json", b'{"a": 1}\n{not json\n'), ("csv", b"a,b\n1,2\n3\n"),
                                         ("text", b"ok\n\xff\xfe bad utf-8\n")])
def test_an_unreadable_file_is_a_source_read_error_naming_it(fmt: str, content: bytes, tmp_path):
    (tmp_path / "broken").write_bytes(content)
    with pytest.raises(SourceReadError, match=f"cannot read {fmt} file .*broken"):
        OperatorHarness(FileSource(str(tmp_path / "broken"), fmt)).run()


def test_a_missing_input_path_is_a_source_read_error(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(SourceReadError, match="nope does not exist"):
        OperatorHarness(FileSource(missing, "csv")).run()
    with pytest.raises(SourceReadError, match="nope does not exist"):
        FileSource([str(tmp_path), missing], "parquet").enumerate_splits()
    with pytest.raises(ValueError, match="unknown file format 'xml'"):
        FileSource(missing, "xml")


# -- sinks ---------------------------------------------------------------------------------------

def visible(folder: Any) -> list[str]:
    return sorted(f for f in os.listdir(folder) if not f.startswith("."))


def test_parquet_sink_commits_under_the_final_name_only_at_finish(data: pa.Table, tmp_path):
    out_dir = tmp_path / "out"
    sink = OperatorHarness(ParquetSink(str(out_dir)), subtask_index=3, parallelism=4).op
    for b in data.to_batches(max_chunksize=8):
        sink.process_batch(b)
    assert visible(out_dir) == []
    assert len(os.listdir(out_dir)) == 1  # the staged file
    sink.finish()
    sink.close()
    assert os.listdir(out_dir) == ["part-00003.parquet"]
    assert pq.read_table(out_dir / "part-00003.parquet") == data


def test_parquet_sink_closed_without_finish_leaves_nothing(data: pa.Table, tmp_path):
    sink = OperatorHarness(ParquetSink(str(tmp_path))).op
    sink.process_batch(data.to_batches()[0])
    assert len(os.listdir(tmp_path)) == 1
    sink.close()  # failed or cancelled
    assert os.listdir(tmp_path) == []


def test_parquet_sink_rolls_files_and_refuses_another_schema(data: pa.Table, tmp_path):
    sink = OperatorHarness(ParquetSink(str(tmp_path), roll_size_bytes=1, name="pq")).op
    batches = data.to_batches(max_chunksize=10)
    for b in batches:
        sink.process_batch(b)
    assert visible(tmp_path) == []  # rolled parts stay hidden until the subtask finishes
    assert len(os.listdir(tmp_path)) == 3
    with pytest.raises(SchemaMismatchError, match="sink 'pq'"):
        sink.process_batch(pa.record_batch({"other": [1]}))
    sink.finish()
    sink.close()
    assert visible(tmp_path) == ["part-00000-0.parquet", "part-00000-1.parquet", "part-00000-2.parquet"]
    assert sorted(os.listdir(tmp_path)) == visible(tmp_path)  # no staged part left
    assert pq.read_table(tmp_path / "part-00000-1.parquet") == pa.Table.from_batches([batches[1]])


def test_collect_sink_rows_are_read_back_after_finish(data: pa.Table, tmp_path):
    store = str(tmp_path / "job")
    sinks = []
    for i in range(2):
        sink = OperatorHarness(CollectSink("collect-1"), subtask_index=i, parallelism=2, job_storage_dir=store).op
        sinks.append(sink)
    sinks[0].process_batch(data.slice(0, 12).to_batches()[0])
    sinks[1].process_batch(data.slice(12).to_batches()[0])
    assert read_collected(store, "collect-1") is None  # staged only
    assert read_collected(store, "other") is None
    for s in sinks:
        s.finish()
        s.close()
    assert read_collected(store, "collect-1") == data


def test_collect_sink_of_a_failed_attempt_leaves_nothing_to_read(data: pa.Table, tmp_path):
    store = str(tmp_path / "job")
    sink = OperatorHarness(CollectSink("c"), job_storage_dir=store).op
    sink.process_batch(data.to_batches()[0])
    sink.close()
    assert read_collected(store, "c") is None


def test_sink_waits_for_the_type_of_a_column_that_started_all_null(tmp_path):
    """A row function's first rows may have only None in a column (type null); the sink holds
    them until the column's real type shows up, instead of failing on the schema change."""
    import pyarrow.parquet as pq

    from yarnflow.worker.operators.sinks import ParquetSink

    sink = ParquetSink(str(tmp_path / "out"))
    sink.setup(runtime_context(), RecordingOutput())
    sink.open()
    sink.process_batch(pa.record_batch({"i": [0, 1], "note": pa.nulls(2)}))
    sink.process_batch(pa.record_batch({"i": [2], "note": ["x"]}))
    sink.process_batch(pa.record_batch({"i": [3], "note": pa.nulls(1)}))  # later nulls fit the known type
    sink.finish()
    t = pq.read_table(str(tmp_path / "out"))
    assert t.schema.field("note").type == pa.string()
    assert t.to_pydict() == {"i": [0, 1, 2, 3], "note": [None, None, "x", None]}
    with pytest.raises(Exception, match="does not match"):
        other = ParquetSink(str(tmp_path / "out2"))
        other.setup(runtime_context(), RecordingOutput())
        other.open()
        other.process_batch(pa.record_batch({"i": [1]}))
        other.process_batch(pa.record_batch({"i": ["not an int"]}))
