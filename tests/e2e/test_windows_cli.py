"""Each window type through the CLI, on an embedded local cluster with parallelism 2 across
two TaskExecutors, checked against a plain-Python reference."""

from __future__ import annotations

import os
from collections import defaultdict

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.e2e.jobs import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

WINDOWS = os.path.join(REPO, "examples", "windows.py")


def events(n: int = 20_000):
    """Out-of-order events (up to 80 ms) with a few very late ones at the end."""
    keys, values, ts = [], [], []
    for i in range(n):
        keys.append(i % 13)
        values.append(float(i % 5))
        ts.append(i // 4 - (i * 31) % 80)
    for j in range(5):  # far behind the watermark by the time they arrive
        keys.append(j)
        values.append(1000.0)
        ts.append(10 + j)
    return keys, values, ts


BATCH = 100


def reference(kind: str, keys, values, ts, size=1000, slide=500, gap=300, ooo=100):
    """Windows of on-time records; a record is late when the watermark already passed the end
    of every window it belongs to. The source emits a watermark (max ts so far - ooo - 1) after
    each batch of BATCH records, so a record sees the watermark of the batches before its own."""
    out: dict[tuple[int, int, int], float] = defaultdict(float)
    late = 0
    if kind == "session":
        per_key: dict[int, list[tuple[int, float]]] = defaultdict(list)
    max_ts = -(2**63)
    batch_max = -(2**63)
    for i, (k, v, t) in enumerate(zip(keys, values, ts)):
        if i % BATCH == 0:
            max_ts = max(max_ts, batch_max)
        wm = max_ts - ooo - 1
        if kind == "tumbling":
            starts = [t - t % size]
        elif kind == "sliding":
            last = t - t % slide
            starts = [s for s in range(last, t - size, -slide)]
        else:
            starts = None
        if starts is not None:
            if all(s + size - 1 <= wm for s in starts):
                late += 1
            else:
                for s in starts:
                    if s + size - 1 > wm:
                        out[(k, s, s + size)] += v
        else:
            # Flink's merging windows: a record's window merges with the key's open sessions;
            # it is late only when the merged session has already ended for the watermark.
            sessions = per_key[k]
            for s0, e0, tot in [x for x in sessions if x[1] - 1 <= wm]:  # fired and purged
                sessions.remove((s0, e0, tot))
                out[(k, s0, e0)] += tot
            start, end, total = t, t + gap, v
            for s0, e0, tot in [x for x in sessions if x[0] < t + gap and t < x[1]]:
                sessions.remove((s0, e0, tot))
                start, end, total = min(start, s0), max(end, e0), total + tot
            if end - 1 <= wm:
                late += 1
            else:
                sessions.append((start, end, total))
        batch_max = max(batch_max, t)
    if kind == "session":
        for k, sessions in per_key.items():
            for s0, e0, tot in sessions:
                out[(k, s0, e0)] += tot
    return dict(out), late


@pytest.mark.parametrize("kind", ["tumbling", "sliding", "session"])
def test_window_type_end_to_end(cli, tmp_path, kind):
    keys, values, ts = events()
    src = tmp_path / "in"
    src.mkdir()
    # one file, read in order by one split; parallelism 2 still spreads keys over 2 subtasks
    pq.write_table(pa.table({"key": keys, "value": values, "ts": ts}), str(src / "events.parquet"))
    out = tmp_path / "out"
    proc = cli.run("run", "-p", "2", "-D", f"execution.batch-size={BATCH}", WINDOWS, "--window", kind, "--input", str(src), "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    table = pq.read_table(str(out))
    got = {(r["key"], r["window_start"], r["window_end"]): r["value"] for r in table.to_pylist()}
    expected, late = reference(kind, keys, values, ts)
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        assert got[k] == pytest.approx(v, rel=1e-12), k
    late_rows = pq.read_table(str(tmp_path / "out_late")).num_rows if (tmp_path / "out_late").exists() else 0
    assert late_rows == late
    # the 5 very late records: dropped from tumbling and sliding windows; in this data every
    # key's session is still open when they come, so they merge into it (as in Flink)
    assert late == (0 if kind == "session" else 5)
    assert len(os.listdir(out)) == 2  # two sink subtasks, one file each
