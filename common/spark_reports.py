"""What a job's Spark stages report about their runs: ``<job storage>/spark/<stage uid>.json``,
written by the stage's driver subtask (``worker/operators/spark.py``) and read by ``yarnflow
info`` and the REST API (``/jobs/<id>/spark``): the Spark application and master, its executors,
the Spark jobs and stages of the run, seconds, output files, the attempt, and in STREAMING jobs
the micro-batches run so far."""

from __future__ import annotations

import json
from typing import Any

import fsspec

__all__ = ["read_spark_reports"]


def read_spark_reports(storage_dir: str, job_id: str) -> list[dict[str, Any]]:
    """The job's Spark stage reports, by stage uid; none when there are none or the storage is
    out of reach."""
    try:
        fs, path = fsspec.core.url_to_fs(f"{storage_dir.rstrip('/')}/jobs/{job_id}/spark")
        out = []
        for name in sorted(fs.glob(f"{path}/*.json")):
            with fs.open(name, "r") as fh:
                report = json.load(fh)
            if isinstance(report, dict):
                out.append(report)
        return out
    except (OSError, ValueError):
        return []
