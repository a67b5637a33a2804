"""Operators (worker/operators/*), driven directly: a RuntimeContext, a list-collecting Output,
and a pyarrow / plain-Python reference for every result."""

from __future__ import annotations

import json
import os
import random
from collections import defaultdict
from typing import Any, Callable

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.operators import keyed
from yarnflow.worker.operators.base import Operator, RuntimeContext, UserFunctionError
from yarnflow.worker.operators.keyed import KeyedAggregate, KeyedReduce
from yarnflow.worker.operators.sinks import CollectSink, ParquetSink, read_collected
from yarnflow.worker.operators.sources import CollectionSource, FileSource, SourceReadError
from yarnflow.worker.operators.transforms import MapBatches, RowFilter, RowFlatMap, RowMap, SchemaMismatchError
from yarnflow.worker.runtime.elements import Watermark

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class ListOutput:
    """An Output that keeps what it is given."""

    def __init__(self) -> None:
        self.batches: list[pa.RecordBatch] = []
        self.side: dict[str, list[pa.RecordBatch]] = defaultdict(list)
        self.watermarks: list[Watermark] = []

    def collect(self, batch: pa.RecordBatch) -> None:
        assert isinstance(batch, pa.RecordBatch)
        self.batches.append(batch)

    def collect_side(self, tag: str, batch: pa.RecordBatch) -> None:
        self.side[tag].append(batch)

    def emit_watermark(self, watermark: Watermark) -> None:
        self.watermarks.append(watermark)

    def rows(self) -> list[dict[str, Any]]:
        return [r for b in self.batches for r in b.to_pylist()]

    def take(self) -> list[pa.RecordBatch]:
        out, self.batches = self.batches, []
        return out


def ctx(**overrides: Any) -> RuntimeContext:
    base: dict[str, Any] = dict(job_id="job-1", task_name="t", subtask_index=0, parallelism=1,
                                max_parallelism=128, attempt_number=0)
    base.update(overrides)
    return RuntimeContext(**base)


def started(op: Operator, **ctx_overrides: Any) -> tuple[Operator, ListOutput]:
    out = ListOutput()
    op.setup(ctx(**ctx_overrides), out)
    op.open()
    return op, out


def run_source(op: Any, cancelled: Callable[[], bool] = lambda: False, **ctx_overrides: Any) -> ListOutput:
    op, out = started(op, **ctx_overrides)
    try:
        op.run(cancelled)
    finally:
        op.close()
    return out


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
    op, out = started(MapBatches(lambda b: results.pop(0)(b), name="mb"))
    for _ in range(4):
        op.process_batch(WORDS)
    assert len(out.batches) == 3  # the empty result is not emitted
    assert out.batches[0].column("m").to_pylist() == [10, 20, 30, None, 50, 60, 70]
    assert out.batches[1].schema.names == ["n"] and out.batches[1].num_rows == 7
    assert out.batches[2].column("n2").to_pylist()[:3] == [1, 2, 3]


def test_map_batches_with_a_wrong_return_type_names_the_operator():
    op, _ = started(MapBatches(lambda b: b.to_pylist(), name="to-list"))
    with pytest.raises(SchemaMismatchError, match="'to-list'.*got list"):
        op.process_batch(WORDS)


def test_row_map_with_dict_and_scalar_results():
    op, out = started(RowMap(lambda r: {"word": r["word"], "twice": None if r["n"] is None else 2 * r["n"]}))
    op.process_batch(WORDS)
    assert out.rows() == [{"word": w, "twice": None if n is None else 2 * n}
                          for w, n in zip(WORDS["word"].to_pylist(), WORDS["n"].to_pylist(), strict=True)]
    op2, out2 = started(RowMap(lambda r: (r["word"] or "") * 2))
    op2.process_batch(WORDS)
    op2.process_batch(WORDS.slice(0, 2))
    assert all(b.schema.names == ["value"] for b in out2.batches)
    assert [r["value"] for r in out2.rows()] == ["aa", "bb", "aa", "cc", "", "bb", "aa", "aa", "bb"]


def test_row_filter_keeps_truthy_rows_and_emits_nothing_for_an_empty_result():
    op, out = started(RowFilter(lambda r: r["n"] and r["n"] % 2))
    op.process_batch(WORDS)
    assert out.rows() == [r for r in WORDS.to_pylist() if r["n"] and r["n"] % 2]
    op.process_batch(WORDS.filter(pa.array([False, True, False, False, False, True, False])))  # even n only
    assert len(out.batches) == 1


def test_row_flat_map_fans_out_and_skips_none():
    op, out = started(RowFlatMap(lambda r: None if r["word"] is None else ({"w": r["word"], "i": i}
                                                                           for i in range(r["n"] or 0))))
    op.process_batch(WORDS)
    expected = [{"w": w, "i": i} for w, n in zip(WORDS["word"].to_pylist(), WORDS["n"].to_pylist(), strict=True)
                if w is not None for i in range(n or 0)]
    assert out.rows() == expected


def test_row_flat_map_with_a_non_iterable_result_names_the_operator():
    op, _ = started(RowFlatMap(lambda r: 5, name="bad-fm"))
    with pytest.raises(SchemaMismatchError, match="'bad-fm'.*iterable.*int"):
        op.process_batch(WORDS)


@pytest.mark.parametrize("later", [
    [{"w": "x", "n": 1, "extra": True}],                      # a new column
    [{"w": "x", "n": "not a number"}],                         # another type
    [{"w": "x", "n": 1}, {"w": "y", "n": 2, "extra": True}],  # a new column, not in the first row
])
def test_row_flat_map_schema_is_fixed_by_the_first_batch(later: list[dict[str, Any]]):
    batches = iter([[{"w": "a", "n": 1}, {"w": "b", "n": 2}], later])
    op, out = started(RowFlatMap(lambda r: next(batches), name="splitter"))
    op.process_batch(WORDS.slice(0, 1))
    assert out.batches[0].schema == pa.schema([("w", pa.string()), ("n", pa.int64())])
    with pytest.raises(SchemaMismatchError, match="operator 'splitter'"):
        op.process_batch(WORDS.slice(0, 1))
    assert len(out.batches) == 1


@pytest.mark.parametrize("first", [1, None])
def test_rows_whose_keys_differ_within_one_batch_are_not_silently_dropped(first: Any):
    op, out = started(RowMap(lambda r: {"a": first} if r["n"] == 1 else {"a": 2, "b": 3}, name="uneven"))
    with pytest.raises(SchemaMismatchError, match="'uneven'.*'b'"):
        op.process_batch(WORDS)
    assert out.batches == []


def test_row_map_decides_column_types_on_the_first_batch_that_has_them():
    values = iter([None, None, 7, 8])
    op, out = started(RowMap(lambda r: {"a": next(values)}))
    op.process_batch(WORDS.slice(0, 2))
    op.process_batch(WORDS.slice(0, 2))
    assert [b.schema.field("a").type for b in out.batches] == [pa.null(), pa.int64()]
    assert out.rows() == [{"a": None}, {"a": None}, {"a": 7}, {"a": 8}]


def test_row_map_keeps_a_later_row_with_missing_columns_as_nulls():
    rows = iter([{"a": 1, "b": "x"}, {"a": 2}])
    op, out = started(RowMap(lambda r: next(rows)))
    op.process_batch(WORDS.slice(0, 1))
    op.process_batch(WORDS.slice(0, 1))
    assert out.rows() == [{"a": 1, "b": "x"}, {"a": 2, "b": None}]


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

    op, _ = started(make(user_fn))
    with pytest.raises(UserFunctionError, match="operator 'the-op' raised ZeroDivisionError: boom") as info:
        op.process_batch(WORDS)
    assert info.value.__cause__ is original


def test_stateless_operators_forward_watermarks():
    op, out = started(RowMap(lambda r: r))
    op.process_watermark(Watermark(42))
    assert out.watermarks == [Watermark(42)]


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
    op, out = started(KeyedAggregate(["k"], AGGS), runtime_mode="BATCH", batch_size=16)
    for b in batches:
        op.process_batch(b)
    op.end_input()
    assert out.batches == []
    op.finish()
    assert all(b.num_rows <= 16 for b in out.batches)
    rows = sorted_rows(out.rows(), ["k"])
    assert rows == reference(batches)
    assert len(rows) == len({r["k"] for r in rows}) == 51  # 50 keys and the null key


def test_keyed_count_counts_rows_of_the_null_key():
    op, out = started(KeyedAggregate(["k"], [("k", "count")]), runtime_mode="BATCH")
    op.process_batch(pa.record_batch({"k": pa.array([None, "a", None], pa.string())}))
    op.finish()
    assert sorted_rows(out.rows(), ["k"]) == [{"k": "a", "count": 1}, {"k": None, "count": 2}]


def test_keyed_aggregate_compacts_partials_in_batch_mode(monkeypatch):
    monkeypatch.setattr(keyed, "_COMPACT_ROWS", 100)
    compactions = []
    original = KeyedAggregate._compact

    def counting(self: KeyedAggregate) -> None:
        compactions.append(self._partial_rows)
        original(self)

    monkeypatch.setattr(KeyedAggregate, "_compact", counting)
    batches = random_batches(2, 40, 200, 80)
    op, out = started(KeyedAggregate(["k"], AGGS), runtime_mode="BATCH")
    for b in batches:
        op.process_batch(b)
        assert op._partial_rows <= 100 + 81  # never more than the threshold plus one batch's keys
    assert len(compactions) > 5
    op.finish()
    assert sorted_rows(out.rows(), ["k"]) == reference(batches)


def test_keyed_aggregate_in_streaming_mode_emits_upserts_per_batch():
    batches = random_batches(3, 15, 40, 12)
    op, out = started(KeyedAggregate(["k"], AGGS), runtime_mode="STREAMING")
    latest: dict[Any, dict[str, Any]] = {}
    for i, b in enumerate(batches):
        op.process_batch(b)
        emitted = out.take()
        assert len(emitted) == 1
        rows = emitted[0].to_pylist()
        assert {r["k"] for r in rows} == set(b["k"].to_pylist())  # exactly the keys this batch touched
        for r in rows:
            latest[r["k"]] = r
        # every upsert holds the aggregate over all input so far
        so_far = {r["k"]: r for r in reference(batches[:i + 1])}
        assert all(so_far[r["k"]] == r for r in rows)
    op.end_input()
    op.finish()
    assert out.batches == []  # nothing more at the end
    assert sorted_rows(list(latest.values()), ["k"]) == reference(batches)


@pytest.mark.parametrize("mode", ["BATCH", "STREAMING"])
def test_keyed_aggregate_on_a_missing_column_is_a_job_definition_error(mode: str):
    op, _ = started(KeyedAggregate(["key"], [("v", "sum")], name="agg"), runtime_mode=mode)
    with pytest.raises(JobDefinitionError, match=r"'agg'.*\['key'\]"):
        op.process_batch(pa.record_batch({"k": ["a"], "v": [1]}))
    op2, _ = started(KeyedAggregate(["k"], [("value", "max")], name="agg2"), runtime_mode=mode)
    with pytest.raises(JobDefinitionError, match=r"'agg2'.*\['value'\]"):
        op2.process_batch(pa.record_batch({"k": ["a"], "v": [1]}))
    with pytest.raises(JobDefinitionError, match="'avg'"):
        KeyedAggregate(["k"], [("v", "avg")])


def test_keyed_aggregate_over_multi_column_keys():
    b = pa.record_batch({"a": ["x", "x", "y", "x"], "b": [1, 2, 1, 1], "v": [1.5, 2.0, 3.0, 4.0]})
    op, out = started(KeyedAggregate(["a", "b"], [("v", "sum")]), runtime_mode="BATCH")
    op.process_batch(b)
    op.process_batch(b)
    op.finish()
    assert sorted_rows(out.rows(), ["a", "b"]) == [{"a": "x", "b": 1, "v": 11.0}, {"a": "x", "b": 2, "v": 4.0},
                                                   {"a": "y", "b": 1, "v": 6.0}]


def _concat(acc: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    return {"k": "ignored", "s": acc["s"] + row["s"], "n": acc["n"] + row["n"]}


def test_keyed_reduce_in_batch_mode_emits_one_row_per_key_at_finish():
    b = pa.record_batch({"k": ["a", "b", "a", "a", None], "s": ["1", "2", "3", "4", "5"], "n": [1, 2, 3, 4, 5]})
    op, out = started(KeyedReduce(["k"], _concat), runtime_mode="BATCH", batch_size=2)
    op.process_batch(b)
    op.process_batch(b.slice(0, 2))
    assert out.batches == []
    op.finish()
    assert all(x.num_rows <= 2 and x.schema == b.schema for x in out.batches)
    assert sorted_rows(out.rows(), ["k"]) == [{"k": "a", "s": "1341", "n": 9}, {"k": "b", "s": "22", "n": 4},
                                              {"k": None, "s": "5", "n": 5}]


def test_keyed_reduce_in_streaming_mode_emits_the_updated_rows_of_each_batch():
    op, out = started(KeyedReduce(["k"], _concat))
    op.process_batch(pa.record_batch({"k": ["a", "b", "a"], "s": ["1", "2", "3"], "n": [1, 2, 3]}))
    assert sorted_rows(out.rows(), ["k"]) == [{"k": "a", "s": "13", "n": 4}, {"k": "b", "s": "2", "n": 2}]
    out.take()
    op.process_batch(pa.record_batch({"k": ["b"], "s": ["9"], "n": [9]}))
    assert out.rows() == [{"k": "b", "s": "29", "n": 11}]
    op.finish()
    assert len(out.batches) == 1


def test_keyed_reduce_errors():
    op, _ = started(KeyedReduce(["key"], _concat, name="red"))
    with pytest.raises(JobDefinitionError, match=r"'red'.*\['key'\]"):
        op.process_batch(pa.record_batch({"k": ["a"]}))
    op, _ = started(KeyedReduce(["k"], lambda a, b: 5, name="red2"))
    with pytest.raises(JobDefinitionError, match="'red2' must return a dict"):
        op.process_batch(pa.record_batch({"k": ["a", "a"]}))


# -- sources -------------------------------------------------------------------------------------

def test_collection_source_splits_into_contiguous_slices():
    table = pa.table({"i": list(range(103))})
    for p in range(1, 6):
        parts = []
        for i in range(p):
            out = run_source(CollectionSource(table), subtask_index=i, parallelism=p, batch_size=10)
            assert all(0 < b.num_rows <= 10 for b in out.batches)
            part = [r["i"] for r in out.rows()]
            assert part and part == list(range(part[0], part[0] + len(part)))  # one contiguous slice
            assert abs(len(part) - 103 / p) < 1
            parts.append(part)
        assert [x for part in parts for x in part] == list(range(103))


def test_collection_source_stops_when_cancelled():
    calls = []

    def cancelled() -> bool:
        calls.append(1)
        return len(calls) > 2

    out = run_source(CollectionSource(pa.table({"i": list(range(100))})), cancelled, batch_size=10)
    assert len(out.batches) == 2


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


def rows_of(fmt: str, out: ListOutput) -> list[Any]:
    if fmt == "text":
        return [r["line"] for r in out.rows()]
    return out.rows()


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
    out = run_source(FileSource(str(folder), fmt), batch_size=4)
    assert sorted(map(repr, rows_of(fmt, out))) == sorted(map(repr, expected_rows(fmt, data)))
    # files are read in sorted order, each in order
    assert rows_of(fmt, out) == expected_rows(fmt, data)
    if fmt in ("parquet", "json", "text"):
        assert all(b.num_rows <= 4 for b in out.batches)


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json", "text"])
def test_file_source_splits_files_between_subtasks(fmt: str, data: pa.Table, tmp_path):
    for i in range(5):
        write(fmt, data.slice(6 * i, 6), tmp_path / f"part-{i}")
    seen = []
    for i in range(2):
        out = run_source(FileSource(str(tmp_path), fmt), subtask_index=i, parallelism=2)
        got = rows_of(fmt, out)
        files = [0, 2, 4] if i == 0 else [1, 3]  # every p-th file, in sorted order
        assert got == [r for f in files for r in expected_rows(fmt, data.slice(6 * f, 6))]
        seen += got
    assert sorted(map(repr, seen)) == sorted(map(repr, expected_rows(fmt, data)))


def test_parquet_row_groups_are_splits_and_a_split_provider_hands_them_out(data: pa.Table, tmp_path):
    pq.write_table(data, tmp_path / "one.parquet", row_group_size=7)  # 5 row groups
    source = FileSource(str(tmp_path / "one.parquet"), "parquet", options={"columns": ["id"]})
    splits = source.enumerate_splits()
    assert [sid.rsplit("#", 1)[1] for sid, _ in splits] == ["0", "1", "2", "3", "4"]
    by_subtask = [[r["id"] for r in run_source(FileSource(str(tmp_path), "parquet"), subtask_index=i,
                                               parallelism=3).rows()] for i in range(3)]
    assert by_subtask[0] == list(range(0, 7)) + list(range(21, 28))
    assert sorted(x for part in by_subtask for x in part) == list(range(30))
    payloads = iter([splits[3][1], splits[0][1], None])
    out = run_source(source, split_provider=lambda: next(payloads))
    assert out.rows() == [{"id": i} for i in list(range(21, 28)) + list(range(0, 7))]


def test_a_corrupt_parquet_file_is_a_source_read_error_naming_it(data: pa.Table, tmp_path):
    pq.write_table(data, tmp_path / "good.parquet")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(SourceReadError, match="bad.parquet") as info:
        run_source(FileSource(str(tmp_path), "parquet"))
    assert isinstance(info.value, OSError) and "good.parquet" not in str(info.value)


@pytest.mark.parametrize("fmt,content", [("json", b'{"a": 1}\n{not json\n'), ("csv", b"a,b\n1,2\n3\n"),
                                         ("text", b"ok\n\xff\xfe bad utf-8\n")])
def test_an_unreadable_file_is_a_source_read_error_naming_it(fmt: str, content: bytes, tmp_path):
    (tmp_path / "broken").write_bytes(content)
    with pytest.raises(SourceReadError, match=f"cannot read {fmt} file .*broken"):
        run_source(FileSource(str(tmp_path / "broken"), fmt))


def test_a_missing_input_path_is_a_source_read_error(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(SourceReadError, match="nope does not exist"):
        run_source(FileSource(missing, "csv"))
    with pytest.raises(SourceReadError, match="nope does not exist"):
        FileSource([str(tmp_path), missing], "parquet").enumerate_splits()
    with pytest.raises(ValueError, match="unknown file format 'xml'"):
        FileSource(missing, "xml")


# -- sinks ---------------------------------------------------------------------------------------

def visible(folder: Any) -> list[str]:
    return sorted(f for f in os.listdir(folder) if not f.startswith("."))


def test_parquet_sink_commits_under_the_final_name_only_at_finish(data: pa.Table, tmp_path):
    out_dir = tmp_path / "out"
    sink, _ = started(ParquetSink(str(out_dir)), subtask_index=3, parallelism=4)
    for b in data.to_batches(max_chunksize=8):
        sink.process_batch(b)
    assert visible(out_dir) == []
    assert len(os.listdir(out_dir)) == 1  # the staged file
    sink.finish()
    sink.close()
    assert os.listdir(out_dir) == ["part-00003.parquet"]
    assert pq.read_table(out_dir / "part-00003.parquet") == data


def test_parquet_sink_closed_without_finish_leaves_nothing(data: pa.Table, tmp_path):
    sink, _ = started(ParquetSink(str(tmp_path)))
    sink.process_batch(data.to_batches()[0])
    assert len(os.listdir(tmp_path)) == 1
    sink.close()  # failed or cancelled
    assert os.listdir(tmp_path) == []


def test_parquet_sink_rolls_files_and_refuses_another_schema(data: pa.Table, tmp_path):
    sink, _ = started(ParquetSink(str(tmp_path), roll_size_bytes=1, name="pq"))
    batches = data.to_batches(max_chunksize=10)
    for b in batches:
        sink.process_batch(b)
    assert visible(tmp_path) == ["part-00000-0.parquet", "part-00000-1.parquet", "part-00000-2.parquet"]
    with pytest.raises(SchemaMismatchError, match="sink 'pq'"):
        sink.process_batch(pa.record_batch({"other": [1]}))
    sink.finish()
    sink.close()
    assert pq.read_table(tmp_path / "part-00000-1.parquet") == pa.Table.from_batches([batches[1]])


def test_collect_sink_rows_are_read_back_after_finish(data: pa.Table, tmp_path):
    store = str(tmp_path / "job")
    sinks = []
    for i in range(2):
        sink, _ = started(CollectSink("collect-1"), subtask_index=i, parallelism=2, job_storage_dir=store)
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
    sink, _ = started(CollectSink("c"), job_storage_dir=store)
    sink.process_batch(data.to_batches()[0])
    sink.close()
    assert read_collected(store, "c") is None


def test_sink_waits_for_the_type_of_a_column_that_started_all_null(tmp_path):
    """A row function's first rows may have only None in a column (type null); the sink holds
    them until the column's real type shows up, instead of failing on the schema change."""
    import pyarrow.parquet as pq

    from yarnflow.worker.operators.sinks import ParquetSink

    sink = ParquetSink(str(tmp_path / "out"))
    sink.setup(ctx(), ListOutput())
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
        other.setup(ctx(), ListOutput())
        other.open()
        other.process_batch(pa.record_batch({"i": [1]}))
        other.process_batch(pa.record_batch({"i": ["not an int"]}))
