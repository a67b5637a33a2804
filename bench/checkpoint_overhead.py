"""checkpoint-overhead: W1 and W2 in STREAMING mode with checkpoints every ``interval`` against
the same job without checkpoints, in the same run, on the same generated data."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any


def run_checkpoint_overhead(records: int = 5_000_000, parallelism: int = 2, interval: str = "1 s") -> dict[str, Any]:
    import workloads

    out: dict[str, Any] = {"name": "checkpoint-overhead", "records": records, "parallelism": parallelism,
                           "interval": interval}
    verified = True
    for name, run, gen in (("w1", workloads.run_w1, workloads.generate_w1),
                           ("w2", workloads.run_w2, workloads.generate_w2)):
        folder = tempfile.mkdtemp(prefix=f"yarnflow-{name}-ckpt-")
        try:
            gen(folder, records)
            plain = run(records, parallelism, folder, mode="STREAMING")
            try:
                checked = run(records, parallelism, folder, mode="STREAMING",
                              conf={"execution.checkpointing.interval": interval})
            except RuntimeError as exc:  # e.g. windows, whose state has no checkpoint support yet
                out[name] = {"records_per_s_no_checkpoints": plain["records_per_s"], "error": str(exc)[:300],
                             "verified": False}
                verified = False
                continue
            info = workloads.LAST_JOB[0] if workloads.LAST_JOB else None
            completed = sum(1 for c in (info.checkpoints if info else []) if c.status == "COMPLETED")
            overhead = 100.0 * (plain["records_per_s"] - checked["records_per_s"]) / plain["records_per_s"]
            out[name] = {"records_per_s": checked["records_per_s"],
                         "records_per_s_no_checkpoints": plain["records_per_s"],
                         "overhead_pct": round(overhead, 1),
                         "checkpoints_completed": completed,
                         "latest_checkpoint_id": info.latest_completed_checkpoint_id if info else 0,
                         # a run that completed no checkpoint measured nothing
                         "verified": plain["verified"] and checked["verified"] and completed > 0}
            verified = verified and out[name]["verified"]
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    out["verified"] = verified
    return out
