"""Unaligned checkpoints keep exactly-once (issue 26): a keyed STREAMING job over text files
whose sink side is ~20x slower than its source, so every channel is back-pressured, with
unaligned checkpoints every 300 ms; a TaskExecutor is SIGKILLed at a random moment (also in the
middle of a checkpoint). The job restores the checkpoint's in-flight data with its state and
the committed output holds every key's count exactly once."""

from __future__ import annotations

import random
import time
from contextlib import closing

import pytest

from tests.integration.test_streaming_exactly_once import (
    CHECKPOINTS,
    _job,
    _write,
    assert_upsert_totals,
    run_killing_one_taskexecutor,
)

pytestmark = [pytest.mark.integration]

UNALIGNED = {**CHECKPOINTS, "execution.checkpointing.interval": "300 ms",
             "execution.checkpointing.unaligned.enabled": "true"}


def _slow(batch):
    """~1 ms a row behind the keyed exchange (about 5 s of the job at parallelism 2): the
    source's read and split are far faster, so the exchange is back-pressured throughout."""
    time.sleep(0.001 * batch.num_rows)
    return batch


def _parse(batch):
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = pc.split_pattern(batch.column("line"), " ")
    return pa.record_batch({"k": pc.list_element(parts, 0), "n": pa.array([1] * batch.num_rows, pa.int64())})


def _build(src, out):
    def build(env):
        env.set_runtime_mode("STREAMING")
        (env.read_text(str(src)).map_batches(_parse, name="parse").key_by("k").map_batches(_slow, name="slow")
            .key_by("k").sum("n").sink_to_parquet(str(out)))
    return build


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("seed", "during_checkpoint"), [(4, False), (5, False), (6, True)],
                         ids=["random-kill-1", "random-kill-2", "kill-during-checkpoint"])
def test_unaligned_checkpoints_under_back_pressure_lose_and_repeat_nothing(local_cluster, tmp_path, seed,
                                                                           during_checkpoint):
    rng = random.Random(seed)
    src, out = tmp_path / "in", tmp_path / "out"
    rows = _write(src)
    cluster = local_cluster(taskexecutors=2, slots=2)
    name = f"unaligned-{seed}"
    info = run_killing_one_taskexecutor(cluster, _build(src, out), name, UNALIGNED, rng, (0.2, 1.0),
                                        during_checkpoint)
    assert_upsert_totals(out, rows)
    with closing(cluster.gateway()) as gw:
        info = _job(gw, name)
    # the checkpoints taken while the sources ran were unaligned and stored in-flight data; the
    # restart restored one of them (the final ones, once every source ended, need no overtaking)
    seen = {c.checkpoint_id: c for c in info.checkpoints if c.status == "COMPLETED"}
    assert any(c.unaligned and c.inflight_bytes > 0 for c in seen.values()), list(seen.values())
    restored = {f.restored_checkpoint_id for f in info.failure_history if f.restored_checkpoint_id}
    assert restored and all(seen[i].unaligned for i in restored if i in seen), (restored, list(seen.values()))
