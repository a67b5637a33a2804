"""checkpoint-overhead: W1 and W2 in STREAMING mode with checkpoints every ``interval`` against
the same job without checkpoints, in the same run, on the same generated data. After one
warm-up run (page cache, first imports), the two variants alternate ``rounds`` times and the
median throughput of each is compared, so neither pays for going first."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any


def run_checkpoint_overhead(records: int = 5_000_000, parallelism: int = 2, interval: str = "1 s",
                            rounds: int = 3, unaligned: bool = False) -> dict[str, Any]:
    import statistics

    import workloads

    out: dict[str, Any] = {"name": "checkpoint-overhead", "records": records, "parallelism": parallelism,
                           "interval": interval, "unaligned": unaligned}
    verified = True
    for name, run, gen in (("w1", workloads.run_w1, workloads.generate_w1),
                           ("w2", workloads.run_w2, workloads.generate_w2)):
        folder = tempfile.mkdtemp(prefix=f"yarnflow-{name}-ckpt-")
        try:
            gen(folder, records)
            run(records, parallelism, folder, mode="STREAMING")  # warm-up, not counted
            plain_runs, checked_runs, completed_runs, latest = [], [], [], 0
            error = ""
            for _ in range(rounds):
                plain_runs.append(run(records, parallelism, folder, mode="STREAMING"))
                try:
                    checked_runs.append(run(records, parallelism, folder, mode="STREAMING",
                                            conf={"execution.checkpointing.interval": interval,
                                                  "execution.checkpointing.unaligned.enabled": str(unaligned).lower()}))
                except RuntimeError as exc:
                    error = str(exc)[:300]
                    break
                info = workloads.LAST_JOB[0] if workloads.LAST_JOB else None
                completed_runs.append(sum(1 for c in (info.checkpoints if info else []) if c.status == "COMPLETED"))
                latest = info.latest_completed_checkpoint_id if info else 0
            plain = statistics.median(r["records_per_s"] for r in plain_runs)
            if error:
                out[name] = {"records_per_s_no_checkpoints": plain, "error": error, "verified": False}
                verified = False
                continue
            checked = statistics.median(r["records_per_s"] for r in checked_runs)
            out[name] = {"records_per_s": round(checked),
                         "records_per_s_no_checkpoints": round(plain),
                         "overhead_pct": round(100.0 * (plain - checked) / plain, 1),
                         "checkpoints_completed": min(completed_runs),
                         "runs_records_per_s": [r["records_per_s"] for r in plain_runs],
                         "runs_records_per_s_checkpoints": [r["records_per_s"] for r in checked_runs],
                         "latest_checkpoint_id": latest,
                         # a run that completed no checkpoint measured nothing
                         "verified": all(r["verified"] for r in plain_runs + checked_runs) and min(completed_runs) > 0}
            verified = verified and out[name]["verified"]
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    out["verified"] = verified
    return out
