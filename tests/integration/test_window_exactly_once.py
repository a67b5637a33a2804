"""Event-time windows with checkpoints on a real local cluster: a TaskExecutor SIGKILLed while
windows are open (their contents, fired flags and timers in the state backend) and the committed
output still holds every window result exactly once, with every input row counted in it.

Input: text files whose lines carry a key and an event time (file f covers [1000 f, 1000 f + 1000)
ms); 500 ms tumbling windows per key; the watermark trails by 5 s, so windows fire while the
job runs and several are open at every checkpoint. Two pipelines: the vectorised engine (a sum)
and the row-by-row one (a user AggregateFunction, with per-key timers); the vectorised one on the
RocksDB backend too, whose open windows are then a column family of its checkpoints."""

from __future__ import annotations

import collections
import random
import time
from pathlib import Path

import pyarrow.dataset as pads
import pytest

from tests.harness import CheckpointRecorder
from tests.integration.test_streaming_exactly_once import CHECKPOINTS, run_killing_one_taskexecutor
from yarnflow.common.api import AggregateFunction
from yarnflow.common.rocksdb_columnar import columnar_states

pytestmark = [pytest.mark.integration]

FILES, PER_FILE, KEYS, WINDOW_MS = 12, 1000, 17, 500


def _write(folder) -> list[tuple[str, int]]:
    folder.mkdir(parents=True)
    events = []
    for f in range(FILES):
        lines = []
        for r in range(PER_FILE):
            key, ts = f"k{(f * 7 + r) % KEYS}", f * 1000 + r
            events.append((key, ts))
            lines.append(f"{key} {ts}")
        (folder / f"in-{f:02d}.txt").write_text("\n".join(lines) + "\n")
    return events


def _slow_parse(batch):
    """``key ts`` lines as columns; ~60 ms per 100-row batch, so kills land mid-stream."""
    import pyarrow as pa
    import pyarrow.compute as pc

    time.sleep(0.06)
    parts = pc.split_pattern(batch.column("line"), " ")
    return pa.record_batch({"k": pc.list_element(parts, 0),
                            "ts": pc.cast(pc.list_element(parts, 1), pa.int64()),
                            "n": pa.array([1] * batch.num_rows, pa.int64())})


class Count(AggregateFunction):
    def create_accumulator(self):
        return [0]

    def add(self, row, acc):
        acc[0] += row["n"]  # in place: the backend copies a checkpointed accumulator first
        return acc

    def get_result(self, acc):
        return {"n": acc[0]}

    def merge(self, a, b):
        return [a[0] + b[0]]


def _build(src, out, engine: str):
    def build(env):
        from yarnflow.windows import TumblingEventTimeWindows, WatermarkStrategy

        env.set_runtime_mode("STREAMING")
        strategy = WatermarkStrategy.for_bounded_out_of_orderness(5000).with_timestamp_column("ts")
        windows = (env.read_text(str(src)).map_batches(_slow_parse, name="parse")
                   .assign_timestamps_and_watermarks(strategy)
                   .key_by("k").window(TumblingEventTimeWindows.of(WINDOW_MS)))
        result = windows.sum("n") if engine == "vector" else windows.aggregate(Count())
        result.sink_to_parquet(str(out))
    return build


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("engine", "seed", "backend"), [("vector", 5, "hashmap"), ("rows", 6, "hashmap"),
                                                         ("vector", 7, "rocksdb"), ("rows", 8, "unaligned")])
def test_windows_survive_a_sigkill_with_every_result_committed_once(local_cluster, tmp_path, engine, seed, backend):
    """(``unaligned``: the hashmap backend with unaligned checkpoints: open windows, their
    timers and the in-flight data restored together.)"""
    rng = random.Random(seed)
    src, out = tmp_path / "in", tmp_path / "out"
    events = _write(src)
    cluster = local_cluster(taskexecutors=2, slots=2)
    unaligned = backend == "unaligned"
    backend = "hashmap" if unaligned else backend
    conf = {**CHECKPOINTS, "execution.checkpointing.dir": str(tmp_path / "checkpoints"), "state.backend.type": backend}
    if unaligned:
        conf["execution.checkpointing.unaligned.enabled"] = "true"
    if backend == "rocksdb":  # every checkpoint retained, to look for open windows in them
        conf.update({"execution.checkpointing.incremental": "true", "state.backend.rocksdb.localdir": str(tmp_path / "local"),
                     "execution.checkpointing.num-retained": "1000"})
    with CheckpointRecorder(tmp_path / "checkpoints", tables=("rocksdb",)) as checkpoints:  # (gone once it ended)
        info = run_killing_one_taskexecutor(cluster, _build(src, out, engine), f"windows-{engine}", conf, rng,
                                            (0.5, 1.5))
    expected = collections.Counter((k, ts - ts % WINDOW_MS) for k, ts in events)
    table = pads.dataset(str(out), format="parquet").to_table()
    results = list(zip(table["k"].to_pylist(), table["window_start"].to_pylist(), table["n"].to_pylist()))
    windows = collections.Counter((k, start) for k, start, _ in results)
    twice = [w for w, c in windows.items() if c > 1]
    assert not twice, f"{len(twice)} window results committed more than once, e.g. {twice[:3]}"
    assert {(k, start): n for k, start, n in results} == dict(expected)
    # batches from the other TaskExecutor are aligned where they are received: Acero warned about
    # each one (most of a TaskExecutor's log lines in a windowed job)
    te_logs = "".join(p.read_text(errors="replace") for p in Path(cluster.work_dir, "log").glob("te-*.log"))
    assert te_logs and "poorly aligned" not in te_logs
    # the split enumerator's part of the checkpoint is in its _metadata, for a JobMaster that
    # would start the job again from it
    metadata = checkpoints.latest()
    [source] = [v.vertex_id for v in info.vertices if v.name.startswith("read_text")]
    assert source in metadata["split_enumerator"]
    if backend == "rocksdb":
        _check_open_windows_in_rocksdb(checkpoints, expected)
    if unaligned:  # the restart restored an unaligned checkpoint
        kinds = {c.checkpoint_id: c.unaligned for c in info.checkpoints}
        restored = [f.restored_checkpoint_id for f in info.failure_history if f.restored_checkpoint_id]
        assert restored and any(kinds.values()) and all(kinds.get(i, True) for i in restored), (restored, kinds)


def _check_open_windows_in_rocksdb(checkpoints: CheckpointRecorder, expected) -> None:
    """The open windows are a column family of the RocksDB checkpoints (no Arrow table of their
    own), and each holds partial counts of windows that were open then."""
    open_rows = 0
    for doc in checkpoints.docs.values():
        files = [f for st in doc["subtasks"].values() for f in st["files"]]
        assert "__window_partials__" not in {f["name"] for f in files}
        for f in files:
            if f["name"] != "rocksdb":
                continue
            path = f["path"].removeprefix("file://")
            assert columnar_states(checkpoints.files[path].schema.metadata) == {"__window_partials__": "namespaced_tables"}
            for name, batch in checkpoints.canonical[path]:
                assert name == "__window_partials__"
                # the vectorised engine's partials: key as __k0, the partial sum as __p0
                for k, start, n in zip(batch["__k0"].to_pylist(), batch["namespace"].to_pylist(),
                                       batch["__p0"].to_pylist()):
                    assert 0 < n <= expected[(k, start)]
                    open_rows += 1
    assert open_rows, "no checkpoint held an open window"
