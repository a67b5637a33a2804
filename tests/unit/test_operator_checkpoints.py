"""Operators' state at checkpoints: a snapshot taken mid-stream, written and read back as Arrow
IPC (as the runtime does), restores a fresh operator that, fed the rest of the input, gives
exactly what an uninterrupted run gives. Sources resume mid-split; keyed operators keep their
running results and timers, filtered to the restoring subtask's key groups. (Sinks: see
test_sinks.py.)"""

from __future__ import annotations

import json
import pickle
from typing import Any, Callable

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from tests.harness import OperatorHarness
from yarnflow.am.jobmaster.splits import SplitEnumerator
from yarnflow.common.api.functions import KeyedProcessFunction
from yarnflow.common.api.state import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from yarnflow.worker.operators.base import Operator
from yarnflow.worker.operators.keyed import KeyedAggregate, KeyedReduce
from yarnflow.worker.operators.process import KeyedAggregateFunctionOperator, KeyedProcessOperator
from yarnflow.worker.operators.sources import CollectionSource, FileSource, GeneratorSource
from yarnflow.worker.key_assignment import key_group_range, key_groups
from yarnflow.worker.state.errors import StateRestoreError
from yarnflow.worker.state.heap import KEYED_STATE_SCHEMA, TIMERS_SCHEMA
from yarnflow.worker.state.tables import Snapshot, materialize

State = dict[str, pa.Table]


def through_ipc(snapshot: Snapshot) -> State:
    """``snapshot``'s tables written and read back as Arrow IPC files, as the runtime stores them."""
    out = {}
    for name, table in materialize(snapshot).items():
        assert isinstance(table, pa.Table), f"{name} is a {type(table).__name__}"
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        out[name] = ipc.open_file(pa.BufferReader(sink.getvalue())).read_all()
    return out


def assert_typed(state: State) -> None:
    """No table is one opaque blob: several typed columns, a binary cell per entry at most."""
    for name, table in state.items():
        assert table.num_columns >= 1
        if any(pa.types.is_binary(f.type) for f in table.schema):
            assert table.num_columns > 1, f"{name} is a single binary column"


# -- sources ---------------------------------------------------------------------------------------

class Attempt:
    """One attempt of a source subtask, stopped ("failed") at tick ``fail_at`` after taking a
    snapshot at tick ``snapshot_at`` (the runtime takes snapshots in the source's tick)."""

    def __init__(self, op: Operator, restore: State | None = None, snapshot_at: int | None = None,
                 fail_at: int | None = None, on_snapshot: Callable[[], None] = lambda: None, **ctx: Any) -> None:
        self.h = OperatorHarness(op, open=False, **ctx)
        if restore is not None:
            op.initialize_state(restore)
        op.open()
        self.ticks = 0
        self.snapshot: State | None = None
        self.rows_at_snapshot: list[dict[str, Any]] = []

        def tick() -> bool:
            self.ticks += 1
            if self.ticks == snapshot_at:
                self.snapshot = through_ipc(op.snapshot_state(1))
                self.rows_at_snapshot = self.h.rows()
                on_snapshot()
            return fail_at is not None and self.ticks >= fail_at

        self.h.run(tick)

    def rows(self) -> list[dict[str, Any]]:
        return self.h.rows()


def check_resumes_exactly(make: Callable[[], Operator], **ctx: Any) -> None:
    """For snapshots at every tick, a failure a few ticks later and a restore: the rows up to
    the snapshot plus the restored run's rows are the uninterrupted run's rows, in order."""
    full = Attempt(make(), **ctx)
    expected = full.rows()
    assert expected
    for snapshot_at in range(1, full.ticks + 1):
        for fail_after in (0, 2):
            first = Attempt(make(), snapshot_at=snapshot_at, fail_at=snapshot_at + fail_after, **ctx)
            assert first.snapshot is not None
            assert_typed(first.snapshot)
            restored = Attempt(make(), restore=first.snapshot, **ctx)
            assert first.rows_at_snapshot + restored.rows() == expected, (snapshot_at, fail_after)


def test_collection_source_resumes_after_the_rows_it_emitted():
    table = pa.table({"i": list(range(53)), "s": [str(i) for i in range(53)]})
    for subtask in range(2):
        check_resumes_exactly(lambda: CollectionSource(table), batch_size=5, subtask_index=subtask, parallelism=2)
    state = Attempt(CollectionSource(table), snapshot_at=3, batch_size=5).snapshot
    assert state is not None and state["position"].schema == pa.schema([("emitted", pa.int64())])
    assert state["position"].to_pylist() == [{"emitted": 10}]


def test_generator_source_resumes_at_its_next_index():
    def gen(start: int, n: int) -> dict[str, list[int]]:
        return {"i": list(range(start, start + n))}

    for subtask in range(3):
        check_resumes_exactly(lambda: GeneratorSource(gen, count=47), batch_size=4, subtask_index=subtask,
                              parallelism=3)
    state = Attempt(GeneratorSource(gen, count=47), snapshot_at=2, batch_size=4, subtask_index=1,
                    parallelism=3).snapshot
    assert state is not None
    assert state["position"].to_pylist() == [{"next_index": 16, "chunk_size": 4}]  # chunk 1 emitted, 4 next
    # the chunk size is the restored one, whatever the new batch size
    restored = Attempt(GeneratorSource(gen, count=47), restore=state, batch_size=100, subtask_index=1,
                       parallelism=3)
    assert [r["i"] for r in restored.rows()] == [*range(16, 20), *range(28, 32), *range(40, 44)]


def write_inputs(folder, fmt: str) -> None:
    """Three files of 11 rows (parquet: row groups of 4 rows, so 3 splits per file)."""
    folder.mkdir()
    for f in range(3):
        rows = [{"id": f * 100 + r, "name": f"n{f}-{r}"} for r in range(11)]
        table = pa.Table.from_pylist(rows)
        path = folder / f"f{f}.{fmt if fmt != 'text' else 'txt'}"
        if fmt == "parquet":
            pq.write_table(table, path, row_group_size=4)
        elif fmt == "csv":
            pacsv.write_csv(table, path)
        elif fmt == "json":
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        else:
            path.write_text("".join(f"{r['id']},{r['name']}\n" for r in rows))


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json", "text"])
def test_file_source_without_a_split_provider_resumes_mid_split(fmt, tmp_path):
    write_inputs(tmp_path / "in", fmt)
    check_resumes_exactly(lambda: FileSource(str(tmp_path / "in"), fmt), batch_size=3)


class FakeJobMaster:
    """Hands out splits from a SplitEnumerator, told the last barrier the subtask emitted (the
    restored attempt goes on with the restored checkpoint's id)."""

    def __init__(self, enumerator: SplitEnumerator) -> None:
        self.enumerator = enumerator
        self.last_barrier = 0

    def barrier(self) -> None:
        self.last_barrier = 1

    def provider(self, attempt: str) -> Callable[[], Any]:
        def next_split() -> Any:
            resp = self.enumerator.request("v", 0, attempt, self.last_barrier)
            return None if resp.split is None else pickle.loads(resp.split.payload)
        return next_split


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json", "text"])
def test_file_source_with_the_split_enumerator_reads_every_row_once_across_restores(fmt, tmp_path):
    """Splits come from the JobMaster's SplitEnumerator; on a restore, the splits taken after
    the snapshot go back to it, those in the state are resumed at their offsets."""
    write_inputs(tmp_path / "in", fmt)

    def make() -> FileSource:
        return FileSource(str(tmp_path / "in"), fmt)

    expected = Attempt(make(), batch_size=3).rows()
    for snapshot_at in (1, 2, 3, 5, 8, 13):
        enumerator = SplitEnumerator(lambda vertex: make())
        jm = FakeJobMaster(enumerator)
        first = Attempt(make(), snapshot_at=snapshot_at, fail_at=snapshot_at + 2, on_snapshot=jm.barrier,
                        batch_size=3, split_provider=jm.provider("a0"))
        state = first.snapshot
        assert state is not None
        assert state["splits"].schema == pa.schema([("split_id", pa.string()), ("payload", pa.binary()),
                                                    ("offset", pa.int64()), ("watermark", pa.int64())])
        held = state["splits"].column("split_id").to_pylist()
        enumerator.return_splits("a0", restored_checkpoint_id=1, new_attempt_id="a1")
        booked = enumerator.splits_of("a1")  # held ones, and those read to their end before the snapshot
        assert booked[len(booked) - len(held):] == held
        restored = Attempt(make(), restore=state, batch_size=3, split_provider=jm.provider("a1"))
        got = first.rows_at_snapshot + restored.rows()
        assert sorted(got, key=str) == sorted(expected, key=str), snapshot_at
        assert len(got) == len(expected)


@pytest.mark.parametrize("fmt", ["parquet", "text"])
def test_a_new_job_master_restores_the_enumerator_from_the_checkpoint(fmt, tmp_path):
    """A global restore by a JobMaster that did not take the checkpoint (a new leader): its
    enumerator starts from the checkpoint's enumerator state, the source from its own; every
    row is read exactly once."""
    write_inputs(tmp_path / "in", fmt)

    def make() -> FileSource:
        return FileSource(str(tmp_path / "in"), fmt)

    expected = Attempt(make(), batch_size=3).rows()
    for snapshot_at in (1, 2, 4, 7, 11):
        old = SplitEnumerator(lambda vertex: make())
        jm = FakeJobMaster(old)
        first = Attempt(make(), snapshot_at=snapshot_at, fail_at=snapshot_at + 3, on_snapshot=jm.barrier,
                        batch_size=3, split_provider=jm.provider("a0"))
        assert first.snapshot is not None
        state = json.loads(json.dumps(old.snapshot(1)))  # as written into _metadata
        fresh = SplitEnumerator(lambda vertex: pytest.fail("a restored enumerator must not enumerate again"))
        fresh.restore(state)
        restored = Attempt(make(), restore=first.snapshot, batch_size=3,
                           split_provider=FakeJobMaster(fresh).provider("b0"))
        got = first.rows_at_snapshot + restored.rows()
        assert sorted(got, key=str) == sorted(expected, key=str), snapshot_at


def test_file_source_restored_mid_split_skips_exactly_the_emitted_rows(tmp_path):
    write_inputs(tmp_path / "in", "csv")
    file = str(tmp_path / "in" / "f1.csv")
    state = {"splits": pa.table({"split_id": [file], "payload": [pickle.dumps((file, None))], "offset": [7]})}
    restored = Attempt(FileSource(str(tmp_path / "in"), "csv"), restore=state, batch_size=5,
                       split_provider=lambda: None)
    assert [r["id"] for r in restored.rows()] == [107, 108, 109, 110]


def test_a_source_state_without_its_columns_is_refused():
    with pytest.raises(StateRestoreError, match="emitted"):
        CollectionSource(pa.table({"i": [1]})).initialize_state({"position": pa.table({"x": [1]})})


# -- keyed aggregations ----------------------------------------------------------------------------

def batches(n: int, rows_per_batch: int = 7, keys: int = 5) -> list[list[dict[str, Any]]]:
    out, i = [], 0
    for _ in range(n):
        out.append([{"k": f"k{(i + j) % keys}", "v": i + j} for j in range(rows_per_batch)])
        i += rows_per_batch
    return out


def run_split(make: Callable[[], Operator], inputs: list[list[dict[str, Any]]], at: int,
              **ctx: Any) -> tuple[list[Any], list[Any], State]:
    """Rows of an uninterrupted run after batch ``at``, and of a restored one from a snapshot
    taken after batch ``at``; and the snapshot."""
    full = OperatorHarness(make(), **ctx)
    for i, b in enumerate(inputs):
        if i == at:
            full.clear()
        full.batch(b)
    first = OperatorHarness(make(), **ctx)
    for b in inputs[:at]:
        first.batch(b)
    state = through_ipc(first.op.snapshot_state(1))
    first.batch(inputs[at])  # processed after the barrier, then the attempt fails
    restored = OperatorHarness(make(), open=False, **ctx)
    restored.op.initialize_state(state)
    restored.op.open()
    for b in inputs[at:]:
        restored.batch(b)
    return full.rows(), restored.rows(), state


def test_keyed_sum_restored_continues_its_running_sums_exactly():
    inputs = batches(6)
    for at in range(1, 5):
        expected, got, state = run_split(lambda: KeyedAggregate(["k"], [("v", "sum"), ("v", "count")]), inputs, at)
        assert got == expected
    assert state["aggregates"].schema == pa.schema([("key_group", pa.int32()), ("k", pa.string()),
                                                    ("v", pa.int64()), ("count", pa.int64())])


def test_keyed_sum_rescaled_each_subtask_takes_its_key_groups():
    inputs = batches(4, keys=20)
    op = OperatorHarness(KeyedAggregate(["k"], [("v", "sum")]), max_parallelism=16)
    for b in inputs[:2]:
        op.batch(b)
    state = through_ipc(op.op.snapshot_state(1))
    sums = {}
    for subtask in range(2):
        h = OperatorHarness(KeyedAggregate(["k"], [("v", "sum")]), open=False, subtask_index=subtask,
                            parallelism=2, max_parallelism=16)
        h.op.initialize_state(state)
        h.op.open()
        mine = key_group_range(16, 2, subtask)
        for b in inputs[2:]:
            batch = pa.RecordBatch.from_pylist(b)
            owned = [r for r, kg in zip(b, key_groups(batch, ["k"], 16)) if kg in mine]
            if owned:
                h.batch(owned)
        final = materialize(h.op.snapshot_state(2))["aggregates"]
        assert all(kg in mine for kg in final.column("key_group").to_pylist())
        sums.update({r["k"]: r["v"] for r in final.to_pylist()})
    expected: dict[str, int] = {}
    for b in inputs:
        for r in b:
            expected[r["k"]] = expected.get(r["k"], 0) + r["v"]
    assert sums == expected


def test_keyed_sum_in_batch_mode_restores_its_partials():
    inputs = batches(4)
    first = OperatorHarness(KeyedAggregate(["k"], [("v", "max")]), runtime_mode="BATCH")
    for b in inputs[:2]:
        first.batch(b)
    state = through_ipc(first.op.snapshot_state(1))
    h = OperatorHarness(KeyedAggregate(["k"], [("v", "max")]), open=False, runtime_mode="BATCH")
    h.op.initialize_state(state)
    h.op.open()
    for b in inputs[2:]:
        h.batch(b)
    h.finish()
    assert sorted(h.rows(), key=lambda r: r["k"]) == [{"k": f"k{i}", "v": 27 - (27 - i) % 5} for i in range(5)]


def test_keyed_reduce_restored_continues():
    def add(acc: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        return {"k": acc["k"], "v": acc["v"] + row["v"]}

    inputs = batches(5)
    for at in (1, 3):
        expected, got, state = run_split(lambda: KeyedReduce(["k"], add), inputs, at)
        assert got == expected
    assert state["keyed_state"].schema == KEYED_STATE_SCHEMA
    assert set(state["keyed_state"].column("state").to_pylist()) == {"__reduced__"}


# -- keyed process functions and the state backend -------------------------------------------------

class Tally(KeyedProcessFunction):
    """Per key: a count (value), the values (list), a histogram (map); an event-time timer at
    each row's time + 10 and a processing-time timer 100 ms after the key's first row."""

    def open(self, ctx):
        self.count = self.get_state(ValueStateDescriptor("count", default=0))
        self.seen = self.get_state(ListStateDescriptor("seen"))
        self.hist = self.get_state(MapStateDescriptor("hist"))

    def process_element(self, row, ctx, out):
        n = self.count.value() + 1
        self.count.update(n)
        self.seen.add(row["v"])
        self.hist.put(row["v"] % 3, self.hist.get(row["v"] % 3, 0) + 1)
        ctx.timer_service().register_event_time_timer(row["t"] + 10)
        if n == 1:
            ctx.timer_service().register_processing_time_timer(ctx.timer_service().current_processing_time() + 100)
        out.collect({"k": ctx.current_key, "n": n, "last": row["v"], "what": "row"})

    def on_timer(self, ts, ctx, out):
        out.collect({"k": ctx.current_key, "n": self.count.value(), "last": sum(self.seen.get()) + ts
                     + sum(v * 10 for v in self.hist.values()), "what": ctx.time_domain})


def process_inputs() -> list[tuple[str, Any]]:
    steps: list[tuple[str, Any]] = []
    t = 0
    for b in range(6):
        steps.append(("batch", [{"k": f"k{(b * 3 + j) % 4}", "v": b * 3 + j, "t": t + j * 5} for j in range(3)]))
        t += 12
        steps.append(("wm", t - 8))
        steps.append(("tick", 60 * (b + 1)))
    return steps


def feed(h: OperatorHarness, steps: list[tuple[str, Any]]) -> None:
    for kind, arg in steps:
        if kind == "batch":
            h.batch(arg)
        elif kind == "wm":
            h.watermark(arg)
        else:
            h.tick(arg)


def test_process_function_restored_keeps_its_state_and_timers():
    steps = process_inputs()

    def make() -> KeyedProcessOperator:
        return KeyedProcessOperator(["k"], Tally(), time_column="t")

    for at in range(1, len(steps)):
        full = OperatorHarness(make())
        feed(full, steps[:at])
        full.clear()
        feed(full, steps[at:])
        first = OperatorHarness(make())
        feed(first, steps[:at])
        state = through_ipc(first.op.snapshot_state(1))
        restored = OperatorHarness(make(), open=False, now=first.now)
        restored.op.initialize_state(state)
        restored.op.open()
        restored.watermark(max([s[1] for s in steps[:at] if s[0] == "wm"], default=-(2**63)))  # the inputs' again
        restored.clear()
        feed(restored, steps[at:])
        assert restored.trace() == full.trace(), at
    assert state["keyed_state"].schema == KEYED_STATE_SCHEMA
    assert set(state["keyed_state"].column("kind").to_pylist()) == {"value", "list", "map"}
    assert state["timers"].schema == TIMERS_SCHEMA
    assert_typed(state)


def test_process_function_restore_keeps_only_its_key_groups():
    first = OperatorHarness(KeyedProcessOperator(["k"], Tally(), time_column="t"), max_parallelism=8)
    first.batch([{"k": f"k{i}", "v": i, "t": i} for i in range(20)])
    state = through_ipc(first.op.snapshot_state(1))
    counts = 0
    timers = 0
    for subtask in range(3):
        op = KeyedProcessOperator(["k"], Tally(), time_column="t")
        h = OperatorHarness(op, open=False, subtask_index=subtask, parallelism=3, max_parallelism=8)
        op.initialize_state(state)
        mine = key_group_range(8, 3, subtask)
        assert all(kg in mine for kg in op.state_backend.key_groups_with_state())
        counts += sum(1 for _ in op.state_backend.entries("count"))
        timers += sum(op.pending_timers.values())
        h.close()
    assert counts == 20 and timers == 40


def test_keyed_aggregate_function_restored_continues():
    from yarnflow.common.api.functions import AggregateFunction

    class Mean(AggregateFunction):
        def create_accumulator(self):
            return [0, 0]

        def add(self, row, acc):
            return [acc[0] + row["v"], acc[1] + 1]

        def get_result(self, acc):
            return {"mean": acc[0] / acc[1]}

    inputs = batches(5)
    expected, got, _ = run_split(lambda: KeyedAggregateFunctionOperator(["k"], Mean()), inputs, 2)
    assert got == expected


def test_a_snapshot_copies_mutable_state():
    h = OperatorHarness(KeyedProcessOperator(["k"], Tally(), time_column="t"))
    h.batch([{"k": "a", "v": 1, "t": 0}])
    snapshot = h.op.snapshot_state(1)  # made later, as the runtime's writer thread does
    h.batch([{"k": "a", "v": 2, "t": 1}])
    fresh = OperatorHarness(KeyedProcessOperator(["k"], Tally(), time_column="t"), open=False)
    fresh.op.initialize_state(materialize(snapshot))
    assert [v for _, _, v in fresh.op.state_backend.entries("seen")] == [[1]]
