"""The race fixed in session 19 (a checkpoint triggered directly at a task whose upstream had
finished, while that upstream's barrier was still queued to it), stressed on a real cluster: a
STREAMING job whose sources end at different times feed a slow task (its own, behind a
rebalance) in front of a two-phase Parquet sink; the TaskExecutor running a slow subtask is
SIGKILLed right after the first source subtask finished, or right after both did while the
slow task still drains its input (when direct triggers are pending).
Every input row must be committed exactly once."""

from __future__ import annotations

import signal

import pytest

from tests.harness import wait_until
from tests.integration.test_batch_exactly_once import _run_in_thread
from tests.integration.test_cluster_failures import _resource_id, _te_processes
from tests.integration.test_ha_failover import exact_rows
from tests.integration.test_task_reconciliation import slow_parse  # ~50 ms a 100-row batch
from yarnflow.common.states import ExecutionState, JobStatus

pytestmark = [pytest.mark.integration]

CONF = {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": "5",
        "restart-strategy.fixed-delay.delay": "200 ms", "execution.checkpointing.interval": "100 ms",
        "execution.batch-size": "100", "heartbeat.timeout": "4 s"}


def write_uneven(folder) -> list[str]:
    """Two files of very different lengths: one source subtask finishes long before the other."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for f, n in enumerate((3000, 12000)):
        lines = [f"k{r % 7} {f} {r}" for r in range(n)]
        rows.extend(lines)
        (folder / f"in-{f}.txt").write_text("\n".join(lines) + "\n")
    return rows


def build(src, out):
    def pipeline(env):
        env.set_runtime_mode("STREAMING")
        (env.read_text(str(src)).rebalance().map_batches(slow_parse, name="slow")
         .sink_to_parquet(str(out)))
    return pipeline


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("sources_done", "victim"), [(1, 0), (1, 1), (2, 0)])
def test_a_kill_just_after_a_source_finished_commits_every_row_once(local_cluster, tmp_path, request, sources_done,
                                                                    victim):
    """``sources_done``: 1, the first source subtask finished (the slow subtasks align on the
    other's barriers); 2, both (the slow subtasks drain their input and are triggered
    directly)."""
    src, out = tmp_path / "in", tmp_path / "out"
    rows = write_uneven(src)
    cluster = local_cluster(taskexecutors=2, slots=2)
    gw = cluster.gateway()
    request.addfinalizer(gw.close)
    thread, outcome = _run_in_thread(cluster, build(src, out), "direct-trigger", CONF, 2)

    def a_source_finished():
        info = next((j for j in gw.list_jobs() if j.name == "direct-trigger"), None)
        if info is None or info.status != JobStatus.RUNNING:
            return None
        source = next(v for v in info.vertices if "read_text" in v.name)
        slow = next(v for v in info.vertices if "slow" in v.name)
        finished = source.state_counts.get(ExecutionState.FINISHED, 0) >= sources_done
        running = slow.subtask_states[victim] == ExecutionState.RUNNING
        return info if finished and running and info.latest_completed_checkpoint_id >= 1 else None

    info = wait_until(a_source_finished, 60, "no source subtask finished after a checkpoint while the job ran",
                      interval_s=0.005)
    slow = next(v for v in info.vertices if "slow" in v.name)
    where = slow.subtask_locations[victim]
    [proc] = [p for p in _te_processes(cluster) if _resource_id(p) == where]
    proc.send_signal(signal.SIGKILL)
    thread.join(200)
    assert not thread.is_alive(), "the job did not end"
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].status == JobStatus.FINISHED
    exact_rows(out, rows)
