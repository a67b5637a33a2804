"""Jobs on the RocksDB state backend on a real local cluster (issue 12): a keyed job with
incremental checkpoints survives a SIGKILLed TaskExecutor with every row counted once; its
incremental checkpoints reuse unchanged SST files and the files of subsumed checkpoints are
deleted (files on disk counted against the retained checkpoints' ``_metadata``); a corrupt
shared file of the latest checkpoint falls back to the previous one; the working files are
removed when the tasks end, also after a failure; and a savepoint taken on rocksdb restores on
hashmap and back, counting every row once.

The keyed operator is mostly ``key_by().reduce()``: its per-key state is an entry of the backend
(in RocksDB here); one test runs a vectorised ``key_by().sum()``, whose table is a column family
of its own, and checks that the checkpoints hold it."""

from __future__ import annotations

import collections
import functools
import json
import os
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli
from tests.harness import CheckpointRecorder, assert_upsert_counts, frozen_then_one_killed, wait_until
from tests.integration.test_batch_exactly_once import _run_in_thread
from tests.integration.test_cluster_failures import _te_processes
from tests.integration.test_streaming_exactly_once import (
    CHECKPOINTS,
    _job,
    _slow_parse,
    _write,
    run_killing_one_taskexecutor,
)
from yarnflow.common.states import JobStatus

pytestmark = [pytest.mark.integration]


def _add(acc: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "n": acc["n"] + row["n"]}


def _add_failing_once(marker: str, acc: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    if acc["n"] >= 50 and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("failing once, as the test asks")
    return _add(acc, row)


def _build(src: Path, out: Path, fn: Any = _add) -> Any:
    """The job counting each key's rows with ``reduce(fn)``, or with the vectorised ``sum("n")``
    when ``fn`` is None."""
    def build(env: Any) -> None:
        env.set_runtime_mode("STREAMING")
        keyed = env.read_text(str(src)).map_batches(_slow_parse, name="parse").key_by("k")
        counted = keyed.sum("n", name="count") if fn is None else keyed.reduce(fn, name="count")
        counted.sink_to_parquet(str(out))
    return build


def _rocksdb(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**CHECKPOINTS, "state.backend.type": "rocksdb", "execution.checkpointing.incremental": "true",
            "execution.checkpointing.dir": str(tmp_path / "checkpoints"),
            "state.backend.rocksdb.localdir": str(tmp_path / "local"), **extra}


def _counts(rows: list[str]) -> collections.Counter[str]:
    return collections.Counter(line.split()[0] for line in rows)


def _shared_refs(job_dir: Path) -> dict[int, set[str]]:
    """The shared files each retained checkpoint's ``_metadata`` references."""
    refs = {}
    for meta in job_dir.glob("chk-*/_metadata"):
        doc = json.loads(meta.read_text())
        refs[doc["checkpoint_id"]] = {f["path"].removeprefix("file://") for st in doc["subtasks"].values()
                                      for f in st["files"] if f["name"] == "@shared"}
    return refs


def _local_dirs(tmp_path: Path) -> list[str]:
    root = tmp_path / "local" / "yarnflow-rocksdb"
    return sorted(os.listdir(root)) if root.exists() else []


def _removed_soon(tmp_path: Path) -> None:
    """The tasks' working files are gone (a task removes them just after it reports its end)."""
    wait_until(lambda: _local_dirs(tmp_path) == [], 10,
               lambda: f"the tasks' RocksDB working files were not removed: {_local_dirs(tmp_path)}")


@pytest.mark.timeout(240)
def test_a_sigkilled_taskexecutor_on_rocksdb_loses_and_repeats_nothing(local_cluster: Any, tmp_path: Path) -> None:
    import random

    src, out = tmp_path / "in", tmp_path / "out"
    rows = _write(src)
    cluster = local_cluster(taskexecutors=2, slots=2)
    with CheckpointRecorder(tmp_path / "checkpoints") as checkpoints:  # (deleted once the job finished)
        run_killing_one_taskexecutor(cluster, _build(src, out), "rocksdb-kill", _rocksdb(tmp_path),
                                     random.Random(4), (0.0, 1.0))
    assert_upsert_counts(out, _counts(rows))
    assert any(p.endswith(".sst") for p in checkpoints.shared), "no incremental checkpoint"
    wait_until(lambda: not any((tmp_path / "checkpoints").glob("*/chk-*")), 30,
               "the finished job's checkpoints were not deleted")  # (on a thread, once its result is recorded)
    _removed_soon(tmp_path)  # the killed TaskExecutor's too: the restarted tasks removed them


@pytest.mark.timeout(240)
def test_a_vectorised_sum_keeps_its_table_in_rocksdb_and_survives_a_sigkilled_taskexecutor(
        local_cluster: Any, tmp_path: Path) -> None:
    import random

    import pyarrow.dataset as pads

    from yarnflow.common.rocksdb_columnar import columnar_states

    src, out = tmp_path / "in", tmp_path / "out"
    rows = _write(src)
    cluster = local_cluster(taskexecutors=2, slots=2)
    with CheckpointRecorder(tmp_path / "checkpoints", tables=("rocksdb",)) as checkpoints:
        run_killing_one_taskexecutor(cluster, _build(src, out, None), "rocksdb-sum-kill", _rocksdb(tmp_path),
                                     random.Random(5), (0.0, 1.0))
    assert_upsert_counts(out, _counts(rows))
    # the sum's table is a column family in the RocksDB checkpoints, not an Arrow table of its own
    # (a subtask that had finished before a checkpoint has no files in it, FLIP-147: the job's last
    # checkpoints, taken as its tasks finished, may hold none; the latest one with state is looked at)
    with_state = [d for d in checkpoints.docs.values() if any(st["files"] for st in d["subtasks"].values())]
    assert with_state, "no checkpoint held state"
    doc = max(with_state, key=lambda d: d["checkpoint_id"])
    names = collections.Counter(f["name"] for st in doc["subtasks"].values() for f in st["files"])
    assert "aggregates" not in names and names["rocksdb"] >= 1 and names["@shared"] >= 1, names
    committed = pads.dataset(str(out), format="parquet").to_table()
    totals = collections.defaultdict(set)
    for k, n in zip(committed["k"].to_pylist(), committed["n"].to_pylist()):
        totals[k].add(n)
    in_checkpoint = 0
    for st in doc["subtasks"].values():
        for f in st["files"]:
            if f["name"] != "rocksdb":
                continue
            path = f["path"].removeprefix("file://")
            if "aggregates" not in columnar_states(checkpoints.files[path].schema.metadata):
                continue
            for name, batch in checkpoints.canonical[path]:
                assert name == "aggregates"
                for k, n in zip(batch["k"].to_pylist(), batch["n"].to_pylist()):
                    assert n in totals[k], f"{k}: {n} in the checkpoint was never committed"
                    in_checkpoint += 1
    assert in_checkpoint, "no key's total was in the RocksDB checkpoint"


@pytest.mark.timeout(240)
def test_incremental_checkpoints_reuse_files_and_delete_those_of_subsumed_ones(local_cluster: Any,
                                                                               tmp_path: Path, request: Any) -> None:
    """While the job runs, each checkpoint reuses SST files of the one before and the files no
    retained checkpoint references any more are deleted; the job is then cancelled with
    RETAIN_ON_CANCELLATION (issue 30): its two retained checkpoints stay with exactly the shared
    files they reference, and what it committed has every running total once."""
    src, out = tmp_path / "in", tmp_path / "out"
    _write(src)
    cluster = local_cluster(taskexecutors=2, slots=2)
    gw = cluster.gateway()
    request.addfinalizer(gw.close)
    conf = _rocksdb(tmp_path, **{"execution.checkpointing.num-retained": "2",
                                 "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION"})
    thread, outcome = _run_in_thread(cluster, _build(src, out), "incremental", conf, 2)
    seen: set[str] = set()
    seen_local: set[str] = set()
    every: dict[int, set[str]] = {}  # the shared files of every checkpoint completed meanwhile
    while len(every) < 8 and thread.is_alive():
        for shared in (tmp_path / "checkpoints").glob("*/shared"):
            seen.update(str(p) for p in shared.glob("*.sst"))
            try:
                every.update(_shared_refs(shared.parent))
            except (OSError, ValueError):
                pass  # a checkpoint deleted while read
        seen_local.update(_local_dirs(tmp_path))
        time.sleep(0.05)
    info = _job(gw, "incremental")
    gw.cancel_job(info.job_id)
    thread.join(60)
    assert "was canceled" in str(outcome.get("error")), outcome
    [job_dir] = [p for p in (tmp_path / "checkpoints").iterdir() if p.is_dir()]
    refs = _shared_refs(job_dir)
    assert len(refs) == 2, f"retained checkpoints: {sorted(refs)}"
    older, newer = (refs[i] for i in sorted(refs))
    ids = sorted(every)
    reused = [b for a, b in zip(ids, ids[1:]) if every[a] & every[b]]
    assert len(ids) >= 4 and reused, f"no checkpoint of {ids} reused a file of the one before"
    on_disk = {str(p) for p in (job_dir / "shared").glob("*.sst")}
    assert older | newer <= on_disk, "a file a retained checkpoint references was deleted"
    assert on_disk == older | newer, f"unreferenced shared files left: {sorted(on_disk - older - newer)}"
    assert len(seen) > len(on_disk), "no file of a subsumed checkpoint was ever deleted"
    assert seen_local
    import pyarrow.dataset as pads

    table = pads.dataset(str(out), format="parquet").to_table()
    totals = list(zip(table["k"].to_pylist(), table["n"].to_pylist()))
    assert totals and len(totals) == len(set(totals)), "a running total was committed twice"
    _removed_soon(tmp_path)


@pytest.mark.timeout(240)
def test_a_corrupt_shared_file_falls_back_to_the_previous_checkpoint(local_cluster: Any, tmp_path: Path,
                                                                     request: Any) -> None:
    src, out = tmp_path / "in", tmp_path / "out"
    rows = _write(src)
    cluster = local_cluster(taskexecutors=2, slots=2)
    gw = cluster.gateway()
    request.addfinalizer(gw.close)
    conf = _rocksdb(tmp_path, **{"execution.checkpointing.num-retained": "2"})
    thread, outcome = _run_in_thread(cluster, _build(src, out), "corrupt-sst", conf, 2)

    def two_with_new_files() -> Any:
        info = _job(gw, "corrupt-sst")
        if info is None or info.latest_completed_checkpoint_id < 2:
            return None
        refs = _shared_refs(tmp_path / "checkpoints" / info.job_id)
        return info if len(refs) == 2 and refs[max(refs)] - refs[min(refs)] else None
    wait_until(two_with_new_files, 60, "two checkpoints never completed", interval_s=0.01)
    with frozen_then_one_killed(_te_processes(cluster)):
        info = _job(gw, "corrupt-sst")
        refs = _shared_refs(tmp_path / "checkpoints" / info.job_id)
        latest = max(refs)
        only_latest = refs[latest] - set().union(*(r for i, r in refs.items() if i != latest))
        assert only_latest
        for path in only_latest:
            data = bytearray(Path(path).read_bytes())
            data[len(data) // 2] ^= 0xFF
            Path(path).write_bytes(bytes(data))
    thread.join(200)
    assert "error" not in outcome, outcome.get("error")
    info = _job(gw, "corrupt-sst")
    assert info.status == JobStatus.FINISHED
    corrupt = [f for f in info.failure_history if f.error.error_class == "StateRestoreError"]
    assert corrupt and any(p in corrupt[0].error.message for p in only_latest), info.failure_history
    restored = [f.restored_checkpoint_id for f in info.failure_history if f.restored_checkpoint_id]
    assert restored and restored[-1] < latest
    assert_upsert_counts(out, _counts(rows))


@pytest.mark.timeout(240)
def test_working_files_are_removed_after_a_failure_and_the_restart_counts_every_row_once(
        local_cluster: Any, tmp_path: Path, request: Any) -> None:
    src, out = tmp_path / "in", tmp_path / "out"
    rows = _write(src)
    cluster = local_cluster(taskexecutors=1, slots=2)
    gw = cluster.gateway()
    request.addfinalizer(gw.close)
    fn = functools.partial(_add_failing_once, str(tmp_path / "failed-once"))
    thread, outcome = _run_in_thread(cluster, _build(src, out, fn), "fail-once", _rocksdb(tmp_path), 2)
    seen: set[str] = set()
    while thread.is_alive():
        seen.update(_local_dirs(tmp_path))
        time.sleep(0.05)
    assert "error" not in outcome, outcome.get("error")
    info = _job(gw, "fail-once")
    assert info.status == JobStatus.FINISHED
    assert any("failing once" in f.error.message for f in info.failure_history)
    assert len(seen) > 2, f"attempt folders seen: {seen}"  # those of the failed attempts and the restarted ones
    _removed_soon(tmp_path)
    assert_upsert_counts(out, _counts(rows))


# argv: SRC OUT; parallelism 2; about 0.2 s per 50-row batch
JOB = textwrap.dedent("""\
    import sys, time
    import pyarrow as pa, pyarrow.compute as pc
    import yarnflow

    def parse(batch):
        time.sleep(0.2)
        parts = pc.split_pattern(batch.column("line"), " ")
        return pa.record_batch({"k": pc.list_element(parts, 0), "n": pa.array([1] * batch.num_rows, pa.int64())})

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(2)
    env.set_runtime_mode("STREAMING")
    (env.read_text(sys.argv[1]).uid("source").map_batches(parse, name="parse")
        .key_by("k").reduce(lambda a, r: {"k": r["k"], "n": a["n"] + r["n"]}).uid("count")
        .sink_to_parquet(sys.argv[2]).uid("sink"))
    env.execute("backends")
""")


@pytest.mark.timeout(300)
def test_a_savepoint_taken_on_rocksdb_restores_on_hashmap_and_back(cli: Cli, local_cluster: Any,
                                                                   tmp_path: Path) -> None:
    cluster = local_cluster(taskexecutors=2, slots=2)
    src = tmp_path / "in"
    src.mkdir()
    expected: collections.Counter[str] = collections.Counter()
    for f in range(6):
        keys = [f"k{(f * 1500 + r) % 13}" for r in range(1500)]
        expected.update(keys)
        (src / f"part-{f}.txt").write_text("".join(f"{k} {f} {r}\n" for r, k in enumerate(keys)))
    (tmp_path / "job.py").write_text(JOB)
    base = ["-D", "execution.checkpointing.interval=200 ms", "-D", "execution.batch-size=50",
            "-D", f"execution.checkpointing.dir={tmp_path / 'checkpoints'}"]
    rocksdb = ["-D", "state.backend.type=rocksdb", "-D", "execution.checkpointing.incremental=true",
               "-D", f"state.backend.rocksdb.localdir={tmp_path / 'local'}"]
    hashmap = ["-D", "state.backend.type=hashmap"]
    args = ["job.py", str(src), str(tmp_path / "out")]

    def job_id() -> str:
        listed = cli.run("list", "-a", cluster.address, "--json", check=True).stdout.splitlines()
        return [json.loads(line)["id"] for line in listed][-1]

    def savepoint_and_cancel(backend: list[str], restore: list[str], name: str) -> Path:
        cli.run("run", "-a", cluster.address, "--detached", *base, *backend, *restore, *args, check=True)

        def checkpointed() -> str | None:
            job = job_id()
            info = cli.run("info", "-a", cluster.address, job, check=True).stdout
            return job if "RUNNING" in info and "COMPLETED" in info else None
        job = wait_until(checkpointed, 60, "the job never checkpointed", interval_s=0.2)
        time.sleep(1.0)  # more rows counted after the restore
        [path] = cli.run("savepoint", "-a", cluster.address, job, str(tmp_path / name), check=True).stdout.split()
        cli.run("cancel", "-a", cluster.address, job, check=True)
        wait_until(lambda: cli.job_status("-a", cluster.address, job) == "CANCELED", 30, "not cancelled")
        return Path(path.removeprefix("file://"))

    on_rocksdb = savepoint_and_cancel(rocksdb, [], "sp1")
    names = sorted(p.name for p in on_rocksdb.rglob("*.arrow"))
    assert "keyed_state.arrow" in names and "rocksdb.arrow" not in names  # canonical, never the SST files
    assert "shared" not in (on_rocksdb / "_metadata").read_text()
    on_hashmap = savepoint_and_cancel(hashmap, ["-s", str(on_rocksdb)], "sp2")
    assert "keyed_state.arrow" in sorted(p.name for p in on_hashmap.rglob("*.arrow"))
    done = cli.run("run", "-a", cluster.address, "--no-progress", "-s", str(on_hashmap), *base, *rocksdb, *args,
                   timeout=150)
    assert done.returncode == 0, done.stderr
    assert "FINISHED" in done.stderr
    assert_upsert_counts(tmp_path / "out", expected)
