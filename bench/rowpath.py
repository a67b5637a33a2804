"""rowpath: the per-row W1 pipeline (the README's first example): a plain Python ``map`` that
makes each row ``{"word": ..., "count": 1}``, then ``key_by("word").sum("count")``, on W1's
Parquet data. In the same run it times a single-process plain-Python loop that reads the same
files batch by batch, calls the same function on the same rows (dicts) and counts with a dict:
the per-row Python ceiling of one core. Both results are checked against pyarrow's group_by.

The job runs twice: as users get it (``records_per_s``: the map's function is a plain column
expression, so it runs as Arrow compute, ``python.row-functions.vectorize``) and with that
option off (``per_row_records_per_s``: the function called once per row, as any function that
is not such an expression is)."""

from __future__ import annotations

import shutil
import time
from typing import Any

import pyarrow.parquet as pq
from workloads import _prepare, _reference, _run_job, in_child


def to_count(row: dict[str, Any]) -> dict[str, Any]:
    return {"word": row["word"], "count": 1}


def python_loop(folder: str) -> tuple[dict[str, int], float]:
    """The plain-Python ceiling: one process, the same function on the same rows as dicts."""
    t0 = time.perf_counter()
    counts: dict[str, int] = {}
    dataset = pq.ParquetDataset(folder)
    for fragment in dataset.fragments:
        for batch in pq.ParquetFile(fragment.path).iter_batches(batch_size=65536, columns=["word"]):
            for row in batch.to_pylist():
                out = to_count(row)
                counts[out["word"]] = counts.get(out["word"], 0) + out["count"]
    return counts, time.perf_counter() - t0


def run_rowpath(records: int = 5_000_000, parallelism: int = 2, input_dir: str | None = None,
                mode: str = "BATCH", conf: dict[str, str] | None = None) -> dict[str, Any]:
    folder, owned, n = _prepare("w1", records, input_dir)
    try:
        loop_counts, loop_s = in_child(python_loop, folder)  # off the client's measured memory

        def build(env: Any) -> None:
            (env.read_parquet(folder, columns=["word"])
                .map(lambda row: {"word": row["word"], "count": 1})
                .key_by("word").sum("count").collect())

        expected, _ = _reference("w1", folder)
        runs = {}
        for label, vectorize in (("", "true"), ("per_row_", "false")):
            table, seconds, peak = _run_job(build, parallelism, "rowpath", mode,
                                            {**(conf or {}), "python.row-functions.vectorize": vectorize})
            if mode == "STREAMING":  # an upsert stream: the final count of a word is its largest
                table = table.group_by("word").aggregate([("count", "max")]).rename_columns(["word", "count"])
            got = dict(zip(table["word"].to_pylist(), table["count"].to_pylist()))
            runs[label] = (n / seconds, peak, got == expected and len(got) == table.num_rows)
        loop_rate = n / loop_s
        out: dict[str, Any] = {"name": "rowpath", "mode": mode, "records": n, "parallelism": parallelism,
                               "python_loop_records_per_s": round(loop_rate)}
        for label, (rate, peak, _ok) in runs.items():
            out[f"{label}records_per_s"] = round(rate)
            out[f"{label}ratio_to_python_loop"] = round(rate / loop_rate, 2)
            out[f"{label}peak_rss_mb"] = round(peak.peak_bytes / 2**20)
            out[f"{label}peak_pss_mb"] = round(peak.peak_pss_bytes / 2**20)
        out["distinct_words"] = len(expected)
        out["verified"] = all(ok for _, _, ok in runs.values()) and loop_counts == expected
        return out
    finally:
        if owned:
            shutil.rmtree(folder, ignore_errors=True)
