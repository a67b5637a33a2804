"""A JobMaster that loses its ResourceManager (a new leader takes over) reconnects: it
registers again and repeats the slot requests it still waits for, and the TaskExecutors
re-register with the new leader, so the job goes on."""

from __future__ import annotations

import threading

import pytest

import yarnflow
from tests.harness import wait_until
from yarnflow import executors
from yarnflow.am.appmaster import AppMaster
from yarnflow.common.config import Configuration

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def test_jobmaster_reconnects_to_a_new_resource_manager(process_tag, tmp_path, monkeypatch):
    from tests.conftest import FAST_CONF, TAG_VAR

    monkeypatch.setenv(TAG_VAR, process_tag)
    conf = Configuration.load({**FAST_CONF, "slotmanager.number-of-slots.min": "0",
                               "taskmanager.numberOfTaskSlots": "2"})
    am = AppMaster(conf, "rm-change", work_dir=str(tmp_path / "am")).start()
    try:
        outcome: dict[str, object] = {}

        def run() -> None:
            ctx = executors.ClusterContext(am.address, {}, progress=False)
            executors.set_context(ctx)
            try:
                env = yarnflow.StreamExecutionEnvironment(parallelism=2, runtime_mode="STREAMING")
                env.from_collection({"x": list(range(50))}).map(lambda r: {"x": r["x"] + 1}).collect()
                outcome["result"] = env.execute("survivor")
            except BaseException as exc:  # noqa: BLE001
                outcome["error"] = exc
            finally:
                executors.set_context(None)

        old = am.rm
        t = threading.Thread(target=run, daemon=True)
        t.start()
        # the job's slot requests reach the first ResourceManager, which starts a TaskExecutor ...
        wait_until(lambda: old.slot_manager.pending, 20, "the job never asked for slots", interval_s=0.01)
        # ... and is replaced before that TaskExecutor registers: the new leader knows nothing
        new = am.replace_resource_manager()
        assert new.fencing_token != old.fencing_token
        t.join(60)
        assert "result" in outcome, outcome
        assert sorted(outcome["result"].collected()["x"].to_pylist()) == list(range(1, 51))
        assert new.overview()[0] >= 1  # the TaskExecutors now belong to the new leader
    finally:
        am.shutdown()
