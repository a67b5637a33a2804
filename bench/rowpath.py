"""rowpath: the per-row W1 pipeline (the README's first example): a plain Python ``map`` that
makes each row ``{"word": ..., "count": 1}``, then ``key_by("word").sum("count")``, on W1's
Parquet data. In the same run it times a single-process plain-Python loop that reads the same
files batch by batch, calls the same function on the same rows (dicts) and counts with a dict:
the per-row Python ceiling of one core. Both results are checked against pyarrow's group_by."""

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
                mode: str = "BATCH") -> dict[str, Any]:
    folder, owned, n = _prepare("w1", records, input_dir)
    try:
        loop_counts, loop_s = in_child(python_loop, folder)  # off the client's measured memory

        def build(env: Any) -> None:
            (env.read_parquet(folder, columns=["word"])
                .map(lambda row: {"word": row["word"], "count": 1})
                .key_by("word").sum("count").collect())

        table, seconds, peak = _run_job(build, parallelism, "rowpath", mode)
        expected, _ = _reference("w1", folder)
        if mode == "STREAMING":  # an upsert stream: the final count of a word is its largest
            table = table.group_by("word").aggregate([("count", "max")]).rename_columns(["word", "count"])
        got = dict(zip(table["word"].to_pylist(), table["count"].to_pylist()))
        verified = got == expected and len(got) == table.num_rows and loop_counts == expected
        rate, loop_rate = n / seconds, n / loop_s
        return {"name": "rowpath", "mode": mode, "records": n, "parallelism": parallelism,
                "seconds": round(seconds, 3), "records_per_s": round(rate),
                "python_loop_records_per_s": round(loop_rate), "ratio_to_python_loop": round(rate / loop_rate, 2),
                "peak_rss_mb": round(peak / 2**20), "distinct_words": len(got), "verified": verified}
    finally:
        if owned:
            shutil.rmtree(folder, ignore_errors=True)
