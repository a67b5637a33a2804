"""W1 (keyed word count) and W2 (1 s tumbling event-time window sums): the workloads used to
compare yarnflow with other engines on this machine. Data is generated as Parquet (or read
from --input), the job runs on a local session cluster (2 TaskExecutors x 2 slots), and the
throughput is measured from job submit to result in hand; the peak of the summed resident
memory (RSS) of the whole cluster and the client is sampled while the job runs, and beside it
the peak of their summed proportional set size (PSS, shared library pages counted once)."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from typing import Any, Callable

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROW_GROUP = 250_000


# ---- data ------------------------------------------------------------------------------------

def generate_w1(folder: str, records: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    vocab = pa.array([f"word{i:05d}" for i in range(10_000)])
    weights = 1.0 / np.arange(1, 10_001) ** 1.1
    weights /= weights.sum()
    _write_chunks(folder, records, lambda start, n: pa.table({
        "word": pc.take(vocab, pa.array(rng.choice(10_000, n, p=weights))),
        "ts": pa.array(np.arange(start, start + n, dtype=np.int64) // 100),
    }))


def generate_w2(folder: str, records: int, seed: int = 2) -> None:
    rng = np.random.default_rng(seed)
    _write_chunks(folder, records, lambda start, n: pa.table({
        "key": pa.array(rng.integers(0, 10_000, n, dtype=np.int64)),
        "value": pa.array(rng.random(n) * 100.0),
        "ts": pa.array(np.arange(start, start + n, dtype=np.int64) // 100 - rng.integers(0, 151, n)),
    }))


def _write_chunks(folder: str, records: int, make: Callable[[int, int], pa.Table]) -> None:
    os.makedirs(folder, exist_ok=True)
    per_file = ROW_GROUP * 4
    for f, start in enumerate(range(0, records, per_file)):
        n = min(per_file, records - start)
        table = pa.concat_tables([make(s, min(ROW_GROUP, start + n - s)) for s in range(start, start + n, ROW_GROUP)])
        pq.write_table(table, os.path.join(folder, f"part-{f:03d}.parquet"), row_group_size=ROW_GROUP)


# ---- reference computations (the single-process pyarrow ceiling) ------------------------------

def reference_w1(folder: str) -> tuple[dict[str, int], float]:
    t0 = time.perf_counter()
    table = pq.read_table(folder, columns=["word"])
    counts = table.group_by("word").aggregate([("word", "count")])
    seconds = time.perf_counter() - t0
    return dict(zip(counts["word"].to_pylist(), counts["word_count"].to_pylist())), seconds


def reference_w2(folder: str) -> tuple[dict[tuple[int, int], float], float]:
    t0 = time.perf_counter()
    table = pq.read_table(folder, columns=["key", "value", "ts"])
    start = pc.subtract(table["ts"], pc.add(pc.remainder(table["ts"], 1000), 0))
    start = pc.if_else(pc.less(pc.remainder(table["ts"], 1000), 0), pc.subtract(start, 1000), start)
    sums = pa.table({"key": table["key"], "start": start, "value": table["value"]}).group_by(
        ["key", "start"]).aggregate([("value", "sum")])
    seconds = time.perf_counter() - t0
    return dict(zip(zip(sums["key"].to_pylist(), sums["start"].to_pylist()), sums["value_sum"].to_pylist())), seconds


# ---- measurement -----------------------------------------------------------------------------

class RssSampler:
    """Peaks of the summed memory of the given root processes and all their descendants: RSS
    (what the targets are stated in: each process counts every shared library page it touched,
    so four processes count pyarrow's libraries four times) sampled every ``interval_s``, and PSS
    (shared pages split between the processes that map them: the physical memory the cluster
    takes) every tenth sample, as reading it costs ~2 ms a process. The processes are listed
    again at those samples only (listing reads every process of the machine): the sampler takes
    ~1.5% of one core, not the ~12% it took reading PSS every other sample and listing every
    time (it shares the cores with the job it measures)."""

    def __init__(self, roots: list[int], interval_s: float = 0.05) -> None:
        self._roots = [psutil.Process(p) for p in roots]
        self._interval = interval_s
        self.peak_bytes = 0
        self.peak_pss_bytes = 0
        #: each process's own peak RSS, by pid (TaskExecutors: without the Spark JVMs they start)
        self.peak_by_pid: dict[int, int] = {}
        self._kinds: dict[int, str] = {}
        self._procs: list[psutil.Process] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _list(self) -> list[psutil.Process]:
        procs: dict[int, psutil.Process] = {}
        for root in self._roots:
            try:
                procs.update((p.pid, p) for p in [root, *root.children(recursive=True)])
            except psutil.NoSuchProcess:
                continue
        for pid, p in procs.items():
            if pid not in self._kinds:
                try:
                    self._kinds[pid] = "taskexecutor" if "yarnflow.worker" in " ".join(p.cmdline()) else "other"
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
        return list(procs.values())

    def _sample(self, pss: bool) -> tuple[int, int]:
        total = total_pss = 0
        if pss or not self._procs:
            self._procs = self._list()
        for p in self._procs:
            try:
                if pss:
                    info = p.memory_full_info()
                    total, total_pss = total + info.rss, total_pss + info.pss
                    if info.rss > self.peak_by_pid.get(p.pid, 0):
                        self.peak_by_pid[p.pid] = info.rss
                else:
                    rss = p.memory_info().rss
                    total += rss
                    if rss > self.peak_by_pid.get(p.pid, 0):
                        self.peak_by_pid[p.pid] = rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return total, total_pss

    def _record(self, pss: bool) -> None:
        rss, pss_bytes = self._sample(pss)
        self.peak_bytes = max(self.peak_bytes, rss)
        self.peak_pss_bytes = max(self.peak_pss_bytes, pss_bytes)

    def _run(self) -> None:
        tick = 0
        while not self._stop.is_set():
            self._record(tick % 10 == 0)
            tick += 1
            self._stop.wait(self._interval)

    def taskexecutor_peak_bytes(self) -> int:
        """The highest peak of a single TaskExecutor process, by itself (no child process)."""
        return max((b for pid, b in self.peak_by_pid.items() if self._kinds.get(pid) == "taskexecutor"), default=0)

    def __enter__(self) -> RssSampler:
        self._record(True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._record(True)


def _run_job(build: Callable[[Any], None], parallelism: int, name: str, mode: str,
             conf: dict[str, str] | None = None,
             watch: Callable[[Any], Callable[[], None]] | None = None,
             layout: tuple[int, int] | None = None) -> tuple[pa.Table, float, RssSampler]:
    """Runs the pipeline ``build(env)`` on a fresh local session (configured with ``conf``);
    returns (collected result, seconds from submit to result in hand, the memory peaks). The
    job's final status is left in ``LAST_JOB``. ``watch(cluster)``, when given, starts watching
    the cluster before the submit and returns what stops it. ``layout``: (TaskExecutors, slots
    each) of the cluster; default: what ``env.execute()`` starts, one TaskExecutor of one slot
    per subtask (``parallelism`` x 1). The AppMaster runs on this
    process's threads, as under ``env.execute()``, except when watched (the watcher counts the
    CPU of the cluster's processes by their pids) or with high availability."""
    import yarnflow
    from yarnflow.common.rpc.gateways import RemoteDispatcherGateway
    from yarnflow.common.states import JobStatus
    from yarnflow.compiler import compile_job
    from yarnflow.local_cluster import LocalCluster
    from yarnflow.packaging import upload_artifact
    from yarnflow.worker.operators.sinks import read_collected

    from yarnflow.common.config import Configuration
    from yarnflow.common.ha import ha_enabled

    in_process = watch is None and not ha_enabled(Configuration.load(conf or {}))
    layout = layout or (parallelism, 1)
    with LocalCluster(layout[0], layout[1], conf or {}, appmaster_in_process=in_process) as cluster:
        gw = RemoteDispatcherGateway(cluster.address, 600_000, tls=cluster.tls)
        storage = gw.cluster_info().storage_dir
        env = yarnflow.StreamExecutionEnvironment(parallelism=parallelism, runtime_mode=mode)
        build(env)
        job = upload_artifact(compile_job(env, name), None, storage)
        stop_watching = watch(cluster) if watch is not None else None
        with RssSampler([os.getpid(), cluster.proc.pid]) as rss:
            t0 = time.perf_counter()
            job_id = gw.submit_job(job.job_graph)
            result = gw.request_job_result(job_id, 600_000)
            if stop_watching is not None:
                stop_watching()
            if result.status != JobStatus.FINISHED:
                raise RuntimeError(f"{name} ended {result.status.name}: {result.failure_cause}")
            table = read_collected(f"{storage}/jobs/{job_id}", next(iter(job.collect_sinks)))
            seconds = time.perf_counter() - t0
            LAST_JOB[:] = [gw.get_job(job_id)]
        gw.close()
    assert table is not None
    return table, seconds, rss


LAST_JOB: list[Any] = []


def _data_dir(name: str, records: int, input_dir: str | None, gen: Callable[[str, int], None]) -> tuple[str, bool]:
    if input_dir:
        return input_dir, False
    folder = tempfile.mkdtemp(prefix=f"yarnflow-{name}-")
    gen(folder, records)
    return folder, True


def in_child(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a fresh Python process (a plain subprocess: multiprocessing would leave its
    resource tracker running under the client, where the benchmark counts its memory)."""
    import pickle
    import subprocess
    import sys

    code = ("import importlib, pickle, sys\n"
            "path, module, name, args = pickle.load(sys.stdin.buffer)\n"
            "sys.path[:0] = path\n"
            "result = getattr(importlib.import_module(module), name)(*args)\n"
            "sys.stdout.buffer.write(pickle.dumps(result))\n")
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(([here], fn.__module__, fn.__name__, args)),
                          capture_output=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"{fn.__name__} failed in a child process:\n{proc.stderr.decode(errors='replace')}")
    return pickle.loads(proc.stdout)


def _prepare(name: str, records: int, input_dir: str | None) -> tuple[str, bool, int]:
    """Generate the data (unless given) in a child process, so that the client's own memory,
    which the benchmark counts, holds none of it."""
    return in_child(_prepare_in_child, name, records, input_dir)  # type: ignore[no-any-return]


def _prepare_in_child(name: str, records: int, input_dir: str | None) -> tuple[str, bool, int]:
    folder, owned = _data_dir(name, records, input_dir, generate_w1 if name == "w1" else generate_w2)
    return folder, owned, pq.ParquetDataset(folder).read(columns=["ts"]).num_rows


def _reference(name: str, folder: str) -> tuple[Any, float]:
    """The pyarrow reference (result, seconds), computed in a child process once the job's
    memory has been measured: the client holds the expected result only after that (for W2 at
    20M records it is a dict of 2M windows, ~400 MB of Python objects)."""
    return in_child(reference_w1 if name == "w1" else reference_w2, folder)  # type: ignore[no-any-return]


def run_w1(records: int = 5_000_000, parallelism: int = 2, input_dir: str | None = None,
           mode: str = "BATCH", conf: dict[str, str] | None = None,
           watch: Callable[[Any], Callable[[], None]] | None = None) -> dict[str, Any]:
    folder, owned, n = _prepare("w1", records, input_dir)
    try:

        def build(env: Any) -> None:
            env.read_parquet(folder, columns=["word"]).key_by("word").count().collect()

        table, seconds, peak = _run_job(build, parallelism, "w1", mode, conf, watch)
        expected, ref_s = _reference("w1", folder)
        if mode == "STREAMING":  # an upsert stream: the final count of a word is its largest
            table = table.group_by("word").aggregate([("count", "max")]).rename_columns(["word", "count"])
        got = dict(zip(table["word"].to_pylist(), table["count"].to_pylist()))
        verified = got == expected and len(got) == table.num_rows
        return {"name": "w1", "mode": mode, "records": n, "parallelism": parallelism, "seconds": round(seconds, 3),
                "records_per_s": round(n / seconds), "peak_rss_mb": round(peak.peak_bytes / 2**20),
                "peak_pss_mb": round(peak.peak_pss_bytes / 2**20),
                "pyarrow_records_per_s": round(n / ref_s), "distinct_words": len(got), "verified": verified}
    finally:
        if owned:
            shutil.rmtree(folder, ignore_errors=True)


def run_w2(records: int = 5_000_000, parallelism: int = 2, input_dir: str | None = None,
           mode: str = "STREAMING", conf: dict[str, str] | None = None) -> dict[str, Any]:
    folder, owned, n = _prepare("w2", records, input_dir)
    try:

        def build(env: Any) -> None:
            from yarnflow.windows import TumblingEventTimeWindows, WatermarkStrategy

            strategy = WatermarkStrategy.for_bounded_out_of_orderness(200).with_timestamp_column("ts")
            (env.read_parquet(folder).assign_timestamps_and_watermarks(strategy)
                .key_by("key").window(TumblingEventTimeWindows.of(1000)).sum("value").collect())

        table, seconds, peak = _run_job(build, parallelism, "w2", mode, conf)
        expected, ref_s = _reference("w2", folder)
        got = dict(zip(zip(table["key"].to_pylist(), table["window_start"].to_pylist()), table["value"].to_pylist()))
        verified = len(got) == table.num_rows and got.keys() == expected.keys() and all(
            abs(got[k] - v) <= 1e-9 * max(1.0, abs(v)) for k, v in expected.items())
        return {"name": "w2", "mode": mode, "records": n, "parallelism": parallelism, "seconds": round(seconds, 3),
                "records_per_s": round(n / seconds), "peak_rss_mb": round(peak.peak_bytes / 2**20),
                "peak_pss_mb": round(peak.peak_pss_bytes / 2**20),
                "pyarrow_records_per_s": round(n / ref_s), "windows": len(got), "verified": verified}
    finally:
        if owned:
            shutil.rmtree(folder, ignore_errors=True)
