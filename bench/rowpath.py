r"""rowpath: per-row Python functions on W1's Parquet data (5M words, parallelism 2).

``--function map`` (the default) is the README's first example: a plain Python ``map`` that
makes each row ``{"word": ..., "count": 1}``, then ``key_by("word").sum("count")``. In the same
run it times a single-process plain-Python loop that reads the same files batch by batch, calls
the same function on the same rows (dicts) and counts with a dict: the per-row Python ceiling
of one core. The job runs twice: as users get it (``records_per_s``: the map's function is a
plain column expression, so it runs as Arrow compute, ``python.row-functions.vectorize``) and
with that option off (``per_row_records_per_s``: the function called once per row, as any
function that is not such an expression is).

``--function realistic`` is the same with a method call in it,
``map(lambda r: {"word": r["word"].strip(), "count": 1})``: no plain column expression, but
one the vectoriser reads (``str.strip`` has Python's exact meaning on ASCII text); timed both
ways as ``map``, and its loop calls the same function. Both ways it also runs on a cluster of
one TaskExecutor with two slots (``1x2_``: the two subtasks share one Python process and its
GIL) and of two TaskExecutors with one slot each (``2x1_``), and ``layout_ratio`` /
``per_row_layout_ratio`` are the 1 x 2 speed over the 2 x 1 speed (with ``-D
taskmanager.slot-processes=true`` the 1 x 2 worker runs a TaskExecutor process per slot). With a Python that has
Bytewax 0.21 (``--bytewax-python``, or ``$BYTEWAX_PYTHON``; Bytewax is not a yarnflow
dependency, so it lives in an environment of its own), the same word count runs as a Bytewax
dataflow of two processes (``bytewax_wordcount.py``) in the same run: ``bytewax_records_per_s``
(process start to result, interpreter start included) and ``ratio_to_bytewax``. It also runs
the realistic flat_map, ``flat_map(lambda r: [{"word": w, "count": 1} for w in
re.findall(r"\w+", r["line"])])`` then the keyed sum, over the same words as lines of 8
(``findall_*``: words per second; the function is one the vectoriser reads, ``lifting_flat.py``,
so ``findall_per_row_*`` also times it called once per line; in the default layout (one
TaskExecutor of one slot per subtask, what ``env.execute()`` starts: the same as 2 x 1 at
parallelism 2) and in 1 x 2 and 2 x 1, against its own single-core loop and Bytewax's
``flat_map`` of ``re.findall``).

The other functions time the per-row path of each kind of user function (the option off, so
every function is called once per row), each followed by the same vectorised keyed count:

- ``filter``: ``filter(lambda r: not r["word"].endswith("7"))`` then ``key_by("word").count()``
- ``flat_map``: ``flat_map(lambda r: [{"word": r["word"], "count": 1}])`` then the keyed sum
- ``reduce``: a ``count`` column of ones (``map_batches``), then
  ``key_by("word").reduce(lambda a, b: {"word": a["word"], "count": a["count"] + b["count"]})``
- ``process``: ``key_by("word").process(WordCounter())``: a KeyedProcessFunction that keeps
  each word's count in a ValueState and emits it from an event-time timer at the input's end
- ``all``: each of the five in turn (``functions``: the figures of each).

Every job (and Bytewax's dataflow) runs ``--repeat`` times (default 3) and each figure is the
median of its runs; the two layouts' runs alternate. Every result is checked against pyarrow's
group_by of the same files."""

from __future__ import annotations

import os
import re
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from workloads import _prepare, _reference, _run_job, in_child

from yarnflow.common.api.functions import KeyedProcessFunction
from yarnflow.common.api.state import ValueStateDescriptor

FUNCTIONS = ("map", "filter", "flat_map", "reduce", "process")  # "all" runs these; "realistic" on its own
END_OF_INPUT = 2**62  # an event-time timer there fires when a bounded input ends (its last watermark)


WORD = re.compile(r"\w+")
WORDS_PER_LINE = 8


def split_words(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The realistic flat_map: the words of a line (``re.findall``), each counted once."""
    return [{"word": w, "count": 1} for w in WORD.findall(row["line"])]


def to_count(row: dict[str, Any]) -> dict[str, Any]:
    return {"word": row["word"], "count": 1}


def strip_count(row: dict[str, Any]) -> dict[str, Any]:
    return {"word": row["word"].strip(), "count": 1}


def keep(row: dict[str, Any]) -> bool:
    return not row["word"].endswith("7")


def one_count(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"word": row["word"], "count": 1}]


def add_counts(acc: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    return {"word": acc["word"], "count": acc["count"] + row["count"]}


def with_ones(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("count", pa.array(np.ones(batch.num_rows, np.int64)))


class WordCounter(KeyedProcessFunction):
    """Counts each word in keyed state; emits (word, count) once, when the input ends."""

    def open(self, ctx: Any) -> None:
        self.count = self.get_state(ValueStateDescriptor("count", 0))

    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        n = self.count.value()
        if n == 0:
            ctx.timer_service().register_event_time_timer(END_OF_INPUT)
        self.count.update(n + 1)

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        out.collect({"word": ctx.current_key, "count": self.count.value()})


PIPELINES: dict[str, Callable[[Any], Any]] = {
    "map": lambda s: s.map(to_count).key_by("word").sum("count"),
    "realistic": lambda s: s.map(strip_count).key_by("word").sum("count"),
    "findall": lambda s: s.flat_map(split_words).key_by("word").sum("count"),
    "filter": lambda s: s.filter(keep).key_by("word").count(),
    "flat_map": lambda s: s.flat_map(one_count).key_by("word").sum("count"),
    "reduce": lambda s: s.map_batches(with_ones).key_by("word").reduce(add_counts),
    "process": lambda s: s.key_by("word").process(WordCounter()),
}


def python_loop(folder: str, function: str = "map") -> tuple[dict[str, int], float]:
    """The plain-Python ceiling: one process, the map's (or the flat_map's) function on the same
    rows as dicts."""
    to_count_fn = strip_count if function == "realistic" else to_count
    t0 = time.perf_counter()
    counts: dict[str, int] = {}
    dataset = pq.ParquetDataset(folder)
    column = "line" if function == "findall" else "word"
    for fragment in dataset.fragments:
        for batch in pq.ParquetFile(fragment.path).iter_batches(batch_size=65536, columns=[column]):
            for row in batch.to_pylist():
                for out in split_words(row) if function == "findall" else (to_count_fn(row),):
                    counts[out["word"]] = counts.get(out["word"], 0) + out["count"]
    return counts, time.perf_counter() - t0


def write_lines(words_folder: str) -> str:
    """The words of ``words_folder`` as text lines of ``WORDS_PER_LINE`` words each, with a comma
    and a full stop (column ``line``, one Parquet file per words file), in a new folder: the
    flat_map's input."""
    folder = tempfile.mkdtemp(prefix="yarnflow-lines-")
    for name in sorted(os.listdir(words_folder)):
        if not name.endswith(".parquet"):
            continue
        words = pq.read_table(os.path.join(words_folder, name), columns=["word"])["word"].to_pylist()
        # text as people write it: a comma after the 4th word, a full stop at the end of a line
        lines = [" ".join(words[i:i + WORDS_PER_LINE // 2]) + ", " + " ".join(words[i + WORDS_PER_LINE // 2:
                                                                                 i + WORDS_PER_LINE]) + "."
                 for i in range(0, len(words), WORDS_PER_LINE)]
        pq.write_table(pa.table({"line": lines}), os.path.join(folder, name))
    return folder


def run_bytewax(python: str, folder: str, processes: int = 2, findall: bool = False) -> tuple[float, dict[str, int]]:
    """(seconds, counts) of ``bytewax_wordcount.py`` over ``folder`` in ``processes`` processes."""
    out = tempfile.mkdtemp(prefix="yarnflow-bytewax-")
    ports = []
    for _ in range(processes):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    addresses = ";".join(f"127.0.0.1:{p}" for p in ports)
    env = {**os.environ, "WC_INPUT": folder, "WC_OUTPUT": out, "WC_FINDALL": "1" if findall else "",
           "PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}
    try:
        t0 = time.perf_counter()
        procs = [subprocess.Popen([python, "-m", "bytewax.run", "bytewax_wordcount:flow", "-i", str(i), "-a", addresses],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for i in range(processes)]
        try:
            errors = [p.communicate(timeout=600)[1] for p in procs]
        finally:
            for p in procs:  # nothing outlives the benchmark
                if p.poll() is None:
                    p.kill()
                    p.wait()
        seconds = time.perf_counter() - t0
        failed = [(p.returncode, e.decode(errors="replace")[-500:]) for p, e in zip(procs, errors) if p.returncode]
        if failed:
            raise RuntimeError(f"the Bytewax dataflow failed: {failed}")
        counts: dict[str, int] = {}
        for name in os.listdir(out):
            with open(os.path.join(out, name), encoding="utf-8") as fh:
                for line in fh:
                    word, count = line.rstrip("\n").split("\t")
                    counts[word] = counts.get(word, 0) + int(count)
        return seconds, counts
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _expected(function: str, word_counts: dict[str, int]) -> dict[str, int]:
    if function == "filter":
        return {w: c for w, c in word_counts.items() if keep({"word": w})}
    return word_counts


def _time_job(function: str, folder: str, n: int, parallelism: int, mode: str, conf: dict[str, str],
              expected: dict[str, int], layout: tuple[int, int] | None = None,
              repeat: int = 1) -> tuple[float, dict[str, int], bool]:
    """(records/s, peaks in bytes, verified) of a job run ``repeat`` times, each from a fresh
    client process (what an earlier job left in a client's heap is not counted again): the median
    rate, the largest peaks, and whether every run's result was right."""
    runs = [in_child(_job_in_child, function, folder, n, parallelism, mode, conf, expected, layout)
            for _ in range(repeat)]
    peaks = {key: max(run[1][key] for run in runs) for key in runs[0][1]}
    return statistics.median(run[0] for run in runs), peaks, all(run[2] for run in runs)


def _layout_rates(function: str, folder: str, n: int, parallelism: int, mode: str, conf: dict[str, str],
                  expected: dict[str, int], repeat: int) -> tuple[dict[tuple[int, int], float], bool]:
    """The median records/s on 1 x 2 and on 2 x 1, their runs taken in turn (1x2, 2x1, 1x2, ...)
    so that a slow minute of the machine falls on both layouts alike."""
    runs: dict[tuple[int, int], list[float]] = {(1, 2): [], (2, 1): []}
    verified = True
    for _ in range(repeat):
        for layout, rates in runs.items():
            rate, _, ok = _time_job(function, folder, n, parallelism, mode, conf, expected, layout)
            rates.append(rate)
            verified = verified and ok
    return {layout: statistics.median(rates) for layout, rates in runs.items()}, verified


def _bytewax(python: str, folder: str, processes: int, findall: bool, repeat: int) -> tuple[float, dict[str, int]]:
    """The median seconds of ``repeat`` Bytewax runs, and the counts of the last (all are checked)."""
    runs = [run_bytewax(python, folder, processes, findall) for _ in range(repeat)]
    counts = runs[-1][1] if all(run[1] == runs[-1][1] for run in runs) else {}
    return statistics.median(run[0] for run in runs), counts


def _job_in_child(function: str, folder: str, n: int, parallelism: int, mode: str, conf: dict[str, str],
                  expected: dict[str, int], layout: tuple[int, int] | None = None) -> tuple[float, dict[str, int], bool]:
    def build(env: Any) -> None:
        column = "line" if function == "findall" else "word"
        PIPELINES[function](env.read_parquet(folder, columns=[column])).collect()

    with PythonWorkerMemory() as workers:
        table, seconds, peak = _run_job(build, parallelism, f"rowpath-{function}", mode, conf, layout=layout)
    if mode == "STREAMING":  # an upsert stream: the final count of a word is its largest
        table = table.group_by("word").aggregate([("count", "max")]).rename_columns(["word", "count"])
    got = dict(zip(table["word"].to_pylist(), table["count"].to_pylist()))
    want = _expected(function, expected)
    peaks = {"rss": peak.peak_bytes, "pss": peak.peak_pss_bytes, **workers.peaks}
    return n / seconds, peaks, got == want and len(got) == table.num_rows


class PythonWorkerMemory:
    """Samples (every 100 ms, while the job runs) the PSS of the TaskExecutors' Python worker
    processes and of their fork servers (the fork server is a child of a TaskExecutor, the
    workers its children): the peak of each kind, and how many workers were seen."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {"python_workers": 0, "python_worker_pss": 0, "fork_server_pss": 0}
        self._stop = threading.Event()
        self._seen: set[int] = set()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PythonWorkerMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peaks["python_workers"] = len(self._seen)

    def _run(self) -> None:
        import psutil

        while not self._stop.wait(0.1):
            for proc in psutil.process_iter(["cmdline"]):
                try:
                    if "forkserver" not in " ".join(proc.info["cmdline"] or []):
                        continue
                    worker = "yarnflow.worker" not in psutil.Process(proc.ppid()).cmdline()
                    pss = proc.memory_full_info().pss
                except psutil.Error:
                    continue
                key = "python_worker_pss" if worker else "fork_server_pss"
                self.peaks[key] = max(self.peaks[key], pss)
                if worker:
                    self._seen.add(proc.pid)


def run_layout(records: int, parallelism: int, layout: tuple[int, int], mode: str, conf: dict[str, str] | None,
               input_dir: str | None = None) -> dict[str, Any]:
    """The realistic map called per row (the vectoriser off, unless ``-D
    python.row-functions.vectorize=true`` says otherwise) on one cluster layout (TaskExecutors x
    slots), with the memory of the Python workers its tasks started (``python.execution-mode``
    decides whether they may)."""
    folder, owned, n = _prepare("w1", records, input_dir)
    try:
        expected, _ = _reference("w1", folder)
        per_row = {"python.row-functions.vectorize": "false", **(conf or {})}
        vectorised = per_row["python.row-functions.vectorize"].lower() == "true"
        rate, peaks, ok = _time_job("realistic", folder, n, parallelism, mode, per_row, expected, layout)
        return {"name": "rowpath-layout", "function": "realistic", "mode": mode, "records": n,
                "parallelism": parallelism, "layout": f"{layout[0]}x{layout[1]}",
                "execution_mode": per_row.get("python.execution-mode", "process"),
                "slot_processes": per_row.get("taskmanager.slot-processes", "false").lower() == "true",
                "records_per_s" if vectorised else "per_row_records_per_s": round(rate),
                "peak_rss_mb": round(peaks["rss"] / 2**20),
                "peak_pss_mb": round(peaks["pss"] / 2**20), "python_workers": peaks["python_workers"],
                "python_worker_peak_pss_mb": round(peaks["python_worker_pss"] / 2**20),
                "fork_server_peak_pss_mb": round(peaks["fork_server_pss"] / 2**20), "verified": ok}
    finally:
        if owned:
            shutil.rmtree(folder, ignore_errors=True)


def _findall(words_folder: str, n: int, parallelism: int, mode: str, conf: dict[str, str],
             expected: dict[str, int], bytewax_python: str | None, repeat: int) -> tuple[dict[str, Any], bool]:
    """The realistic flat_map (``split_words``: ``re.findall`` over lines of 8 words, the same
    words), per row, in the default layout and in 1 x 2 and 2 x 1, with its own loop and Bytewax
    in the same run: ``findall_*`` figures, in words (the flat_map's output records) per second."""
    folder = in_child(write_lines, words_folder)
    try:
        loop_counts, loop_s = in_child(python_loop, folder, "findall")
        out: dict[str, Any] = {"findall_python_loop_records_per_s": round(n / loop_s)}
        verified = loop_counts == expected
        default_rate, _, ok = _time_job("findall", folder, n, parallelism, mode, conf, expected, repeat=repeat)
        rates, layouts_ok = _layout_rates("findall", folder, n, parallelism, mode, conf, expected, repeat)
        verified = verified and ok and layouts_ok
        out["findall_records_per_s"] = round(default_rate)
        out["findall_ratio_to_python_loop"] = round(default_rate / (n / loop_s), 2)
        out["findall_1x2_records_per_s"] = round(rates[(1, 2)])
        out["findall_2x1_records_per_s"] = round(rates[(2, 1)])
        out["findall_layout_ratio"] = round(rates[(1, 2)] / rates[(2, 1)], 2)
        per_row = {**conf, "python.row-functions.vectorize": "false"}  # the function called once per line
        rate, _, ok = _time_job("findall", folder, n, parallelism, mode, per_row, expected, repeat=repeat)
        out["findall_per_row_records_per_s"] = round(rate)
        out["findall_per_row_ratio_to_python_loop"] = round(rate / (n / loop_s), 2)
        verified = verified and ok
        if bytewax_python:
            seconds, counts = _bytewax(bytewax_python, folder, parallelism, True, repeat)
            out["findall_bytewax_records_per_s"] = round(n / seconds)
            out["findall_ratio_to_bytewax"] = round(default_rate / (n / seconds), 2)
            out["findall_per_row_ratio_to_bytewax"] = round(out["findall_per_row_records_per_s"] / (n / seconds), 2)
            verified = verified and counts == expected
        return out, verified
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_rowpath(records: int = 5_000_000, parallelism: int = 2, input_dir: str | None = None,
                mode: str = "BATCH", conf: dict[str, str] | None = None, function: str = "map",
                bytewax_python: str | None = None, repeat: int = 3) -> dict[str, Any]:
    if function not in (*FUNCTIONS, "realistic", "all"):
        raise ValueError(f"unknown function {function!r}: expected one of {FUNCTIONS} or 'all'")
    folder, owned, n = _prepare("w1", records, input_dir)
    try:
        loop_counts, loop_s = in_child(python_loop, folder, function)  # off the client's measured memory
        expected, _ = _reference("w1", folder)
        loop_rate = n / loop_s
        out: dict[str, Any] = {"name": "rowpath", "function": function, "mode": mode, "records": n,
                               "parallelism": parallelism, "repeat": repeat,
                               "python_loop_records_per_s": round(loop_rate)}
        verified = loop_counts == expected
        per_row = {**(conf or {}), "python.row-functions.vectorize": "false"}
        if function in ("map", "realistic"):
            runs = {label: _time_job(function, folder, n, parallelism, mode, c, expected, repeat=repeat)
                    for label, c in (("", {**(conf or {}), "python.row-functions.vectorize": "true"}),
                                     ("per_row_", per_row))}
            for label, (rate, peak, ok) in runs.items():
                out[f"{label}records_per_s"] = round(rate)
                out[f"{label}ratio_to_python_loop"] = round(rate / loop_rate, 2)
                out[f"{label}peak_rss_mb"] = round(peak["rss"] / 2**20)
                out[f"{label}peak_pss_mb"] = round(peak["pss"] / 2**20)
                verified = verified and ok
            if function == "realistic":  # the two layouts of two slots, both ways
                for label, c in (("", {**(conf or {}), "python.row-functions.vectorize": "true"}), ("per_row_", per_row)):
                    rates, ok = _layout_rates(function, folder, n, parallelism, mode, c, expected, repeat)
                    verified = verified and ok
                    for layout, rate in rates.items():
                        out[f"{label}{layout[0]}x{layout[1]}_records_per_s"] = round(rate)
                    out[f"{label}layout_ratio"] = round(rates[(1, 2)] / rates[(2, 1)], 2)
                python = bytewax_python or os.environ.get("BYTEWAX_PYTHON")
                if not python:
                    out["bytewax"] = ("skipped: give a Python with bytewax 0.21 installed (--bytewax-python or "
                                      "$BYTEWAX_PYTHON)")
                else:
                    seconds, counts = _bytewax(python, folder, parallelism, False, repeat)
                    out["bytewax_records_per_s"] = round(n / seconds)
                    out["ratio_to_bytewax"] = round(out["records_per_s"] / (n / seconds), 2)
                    out["per_row_ratio_to_bytewax"] = round(out["per_row_records_per_s"] / (n / seconds), 2)
                    verified = verified and counts == expected
                figures, ok = _findall(folder, n, parallelism, mode, conf or {}, expected, python, repeat)
                out.update(figures)
                verified = verified and ok
        else:
            figures = {}
            for name in (FUNCTIONS if function == "all" else (function,)):
                rate, peak, ok = _time_job(name, folder, n, parallelism, mode, per_row, expected, repeat=repeat)
                figures[name] = {"records_per_s": round(rate), "ratio_to_python_loop": round(rate / loop_rate, 2),
                                 "peak_rss_mb": round(peak["rss"] / 2**20), "verified": ok}
                verified = verified and ok
            if function == "all":
                out["functions"] = figures
            else:
                out.update({k: v for k, v in figures[function].items() if k != "verified"})
        out["distinct_words"] = len(expected)
        out["verified"] = verified
        return out
    finally:
        if owned:
            shutil.rmtree(folder, ignore_errors=True)
