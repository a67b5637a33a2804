"""A job configured from its own code, as Flink's API does (issue 56: "the same features
through yarnflow's own API"): ``enable_checkpointing``, ``get_checkpoint_config()``,
``set_state_backend`` and ``set_restart_strategy`` take effect on a session whose configuration
has none of them. The REST API shows them; a TaskExecutor SIGKILLed mid-job is survived by
restarting from the job's RocksDB checkpoints, and the committed output is exact."""

from __future__ import annotations

import collections
import re
import signal
import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest
import requests

import yarnflow
from tests.harness import wait_until
from tests.integration.test_cluster_failures import _te_processes
from tests.rest import submit
from yarnflow.common.errors import JobDefinitionError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FILES, LINES, KEYS = 4, 2000, 13


def _write(folder: Path) -> None:
    folder.mkdir()
    for f in range(FILES):
        (folder / f"part-{f}.txt").write_text("".join(f"k{(f * LINES + i) % KEYS} {f} {i}\n" for i in range(LINES)))


def _build(src: Path, out: Path) -> Any:
    def build(env: Any) -> None:
        env.enable_checkpointing(200)
        env.get_checkpoint_config().set_min_pause_between_checkpoints(50).set_checkpoint_timeout(30_000) \
            .set_externalized_checkpoint_retention(yarnflow.ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION)
        env.set_state_backend(yarnflow.EmbeddedRocksDBStateBackend(enable_incremental_checkpointing=True))
        env.set_restart_strategy(yarnflow.RestartStrategies.fixed_delay_restart(4, 200))

        def parse(row: dict[str, Any]) -> dict[str, Any]:
            time.sleep(0.0005)  # (long enough for checkpoints, and a kill between them)
            k, f, i = row["line"].split()
            return {"k": k, "f": int(f), "i": int(i), "n": 1}

        rows = env.read_text(str(src)).uid("src").map(parse, name="parse").uid("parse")
        rows.sink_to_parquet(str(out)).uid("rows")
        rows.key_by("k").sum("n").uid("sum").sink_to_parquet(str(out) + "-sums").uid("sums")
    return build


def test_checkpoints_state_backend_and_restarts_set_in_the_jobs_code_take_effect(
        local_cluster: Any, tmp_path: Path) -> None:
    src, out = tmp_path / "in", tmp_path / "out"
    _write(src)
    cluster = local_cluster(taskexecutors=2, slots=2, rest__port="0", rest__authentication="none")
    web = cluster.web_url()
    job_id = submit(cluster, _build(src, out), "configured-in-code", {"restart-strategy.type": "none"})
    config = requests.get(f"{web}/jobs/{job_id}/checkpoints/config", timeout=10).json()
    assert (config["interval"], config["mode"], config["state_backend"]) == (200, "EXACTLY_ONCE", "rocksdb")
    assert config["externalization"] == {"enabled": True, "delete_on_cancellation": False}
    wait_until(lambda: requests.get(f"{web}/jobs/{job_id}/checkpoints", timeout=10).json()["counts"]["completed"] >= 2,
               60, "no checkpoints: the job's enable_checkpointing did not take effect")
    _te_processes(cluster)[0].send_signal(signal.SIGKILL)
    wait_until(lambda: requests.get(f"{web}/jobs/{job_id}", timeout=10).json()["state"] == "FINISHED", 120,
               "the job did not finish after the kill (its code's restart strategy did not take effect)")
    exceptions = requests.get(f"{web}/jobs/{job_id}/exceptions", timeout=10).json()["exceptionHistory"]["entries"]
    assert exceptions, "the kill did not hit the job"
    info = requests.get(f"{web}/jobs/{job_id}/config", timeout=10).json()["execution-config"]
    assert info["restart-strategy"].startswith("fixed-delay"), info

    table = pads.dataset(str(out), format="parquet").to_table()
    seen = collections.Counter(zip(table["f"].to_pylist(), table["i"].to_pylist()))
    assert len(seen) == FILES * LINES and set(seen.values()) == {1}
    sums = pads.dataset(str(out) + "-sums", format="parquet").to_table()
    final: dict[str, int] = collections.defaultdict(int)
    for k, n in zip(sums["k"].to_pylist(), sums["n"].to_pylist()):
        final[k] = max(final[k], n)
    assert final == collections.Counter(f"k{r % KEYS}" for r in range(FILES * LINES))


@pytest.mark.parametrize("call, message", [
    (lambda env: env.enable_checkpointing(5), "at least 10 ms"),
    (lambda env: env.enable_checkpointing("1 s"), "takes milliseconds"),
    (lambda env: env.enable_checkpointing(1000, "EVENTUALLY"), "EXACTLY_ONCE, AT_LEAST_ONCE"),
    (lambda env: env.get_checkpoint_config().set_max_concurrent_checkpoints(0), "at least 1"),
    (lambda env: env.set_state_backend("rocksdb"), "HashMapStateBackend() or EmbeddedRocksDBStateBackend()"),
    (lambda env: env.set_restart_strategy(3), "RestartStrategies"),
    (lambda env: yarnflow.RestartStrategies.fixed_delay_restart(-1, 10), "restart_attempts"),
    (lambda env: yarnflow.RestartStrategies.exponential_delay_restart(10, 100, 0.5, 1000, 0.1), "backoff_multiplier"),
])
def test_a_bad_setting_in_code_is_refused_naming_the_call(call: Any, message: str) -> None:
    env = yarnflow.StreamExecutionEnvironment()
    with pytest.raises(JobDefinitionError, match=re.escape(message)):
        call(env)


def test_the_codes_settings_win_over_the_command_lines() -> None:
    from yarnflow import executors

    executors.set_context(executors.ClusterContext("127.0.0.1:1", {"execution.checkpointing.interval": "10 s",
                                                                   "state.backend.type": "rocksdb"}, progress=False))
    try:
        env = yarnflow.StreamExecutionEnvironment()
        assert env.get_checkpoint_interval() == 10_000  # (what -D said, until the code says otherwise)
        env.enable_checkpointing(250, yarnflow.CheckpointingMode.AT_LEAST_ONCE).set_state_backend(
            yarnflow.HashMapStateBackend()).set_restart_strategy(yarnflow.RestartStrategies.no_restart())
        assert env.get_checkpoint_config().get_checkpointing_mode() == yarnflow.CheckpointingMode.AT_LEAST_ONCE
        assert {k: env.conf[k] for k in ("execution.checkpointing.interval", "state.backend.type",
                                         "restart-strategy.type")} == {
            "execution.checkpointing.interval": "250 ms", "state.backend.type": "hashmap", "restart-strategy.type": "none"}
    finally:
        executors.set_context(None)
