"""Retained checkpoints (issue 30): ``execution.checkpointing.externalized-checkpoint-retention``
decides whether an ended job's checkpoints stay, and ``yarnflow run -s`` starts a job from a
retained one as from a savepoint. On a real local cluster through the CLI, with the job of
test_savepoints.py (text files -> a keyed running count -> an exactly-once Parquet sink): a job
cancelled (RETAIN_ON_CANCELLATION) or failed for good by a SIGKILLed TaskExecutor
(DELETE_ON_CANCELLATION, no restarts) is started again from its checkpoint folder, at another
parallelism, and every key's running totals are committed once each, ending at its count;
cancelling with the default (NO_EXTERNALIZED_CHECKPOINTS) deletes the checkpoints, and with
DELETE_ON_CANCELLATION too."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli, tagged_processes
from tests.harness import assert_upsert_counts, wait_until
from tests.integration.test_savepoints import CHECKPOINTS, _running_with_checkpoints, write_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

RETENTION = "execution.checkpointing.externalized-checkpoint-retention"


@pytest.fixture
def setup(cli: Cli, local_cluster: Any, tmp_path: Path) -> tuple[Cli, str, Path, Any]:
    cluster = local_cluster(taskexecutors=2, slots=2)
    return cli, cluster.address, tmp_path, write_job(tmp_path)



def _start(cli: Any, address: str, tmp_path: Path, retention: str | None, *extra: str) -> tuple[str, Path]:
    """Start the job detached with its checkpoints in ``tmp_path/chk``; once it runs with a
    completed checkpoint and committed output: (job id, its checkpoint folder)."""
    conf = ["-D", f"execution.checkpointing.dir={tmp_path / 'chk'}", *(["-D", f"{RETENTION}={retention}"]
                                                                        if retention else [])]
    cli.run("run", "-a", address, "--detached", *CHECKPOINTS, *conf, *extra, "job.py", str(tmp_path / "in"),
            str(tmp_path / "out"), check=True)
    job = _running_with_checkpoints(cli, address)
    wait_until(lambda: any((tmp_path / "out").glob("part-*")), 30, "nothing was committed")
    return job, tmp_path / "chk" / job


def _checkpoints(folder: Path) -> list[Path]:
    return sorted(folder.glob("chk-*/_metadata"))


def _restore(cli: Any, address: str, tmp_path: Path, path: Path, parallelism: str) -> str:
    restored = cli.run("run", "-a", address, "--no-progress", "-s", str(path), *CHECKPOINTS, "job.py",
                       str(tmp_path / "in"), str(tmp_path / "out"), "sum", parallelism, timeout=150)
    assert restored.returncode == 0, restored.stderr
    assert "FINISHED" in restored.stderr
    return restored.stderr


def test_a_cancelled_job_is_started_again_from_its_retained_checkpoint(setup: Any) -> None:
    cli, address, tmp_path, expected = setup
    job, folder = _start(cli, address, tmp_path, "RETAIN_ON_CANCELLATION")
    cli.run("cancel", "-a", address, job, check=True)
    wait_until(lambda: cli.job_status("-a", address, job) == "CANCELED", 30, "not cancelled")
    kept = _checkpoints(folder)
    assert kept, "the cancelled job's checkpoints were deleted"
    latest = kept[-1].parent
    said = _restore(cli, address, tmp_path, latest, "3")  # the chk-<n> folder, at another parallelism
    assert f"{latest} is a retained checkpoint" in said
    assert_upsert_counts(tmp_path / "out", expected)
    assert _checkpoints(folder)[-1] == kept[-1]  # the old job's checkpoint stays as it was


def test_a_job_that_failed_for_good_starts_again_from_its_latest_checkpoint(setup: Any, process_tag: str) -> None:
    cli, address, tmp_path, expected = setup
    job, folder = _start(cli, address, tmp_path, "DELETE_ON_CANCELLATION", "-D", "restart-strategy.type=none")
    # (a TaskExecutor of this test's cluster: an earlier test's processes may still be exiting)
    worker = next(c for c in tagged_processes(process_tag) if "yarnflow.worker" in " ".join(c.cmdline()))
    os.kill(worker.pid, signal.SIGKILL)
    wait_until(lambda: cli.job_status("-a", address, job) == "FAILED", 60, "the job did not fail")
    assert _checkpoints(folder), "the failed job's checkpoints were deleted"
    said = _restore(cli, address, tmp_path, folder, "1")  # the job's folder: its latest checkpoint
    assert "is a retained checkpoint" in said
    assert_upsert_counts(tmp_path / "out", expected)


@pytest.mark.parametrize("retention", [None, "DELETE_ON_CANCELLATION"], ids=["default", "delete-on-cancellation"])
def test_cancelling_deletes_the_checkpoints_unless_they_are_retained(setup: Any, retention: str | None) -> None:
    cli, address, tmp_path, _ = setup
    job, folder = _start(cli, address, tmp_path, retention)
    assert _checkpoints(folder)
    cli.run("cancel", "-a", address, job, check=True)
    wait_until(lambda: cli.job_status("-a", address, job) == "CANCELED", 30, "not cancelled")
    wait_until(lambda: not folder.exists(), 20, f"the checkpoints of the cancelled job stayed in {folder}")
    refused = cli.run("run", "-a", address, "--no-progress", "-s", str(folder), "job.py", str(tmp_path / "in"),
                      str(tmp_path / "out2"))
    assert refused.returncode != 0 and "no savepoint" in refused.stderr


def test_a_retained_incremental_rocksdb_checkpoint_keeps_its_shared_files_and_restores(setup: Any) -> None:
    """An incremental RocksDB checkpoint references SST files in the job's ``shared/`` folder
    that earlier checkpoints uploaded: retained, every one of them stays, and the job starts
    again from it (at another parallelism) exactly."""
    import json

    cli, address, tmp_path, expected = setup
    job, folder = _start(cli, address, tmp_path, "RETAIN_ON_CANCELLATION", "-D", "state.backend.type=rocksdb",
                         "-D", "execution.checkpointing.incremental=true")
    wait_until(lambda: len(_checkpoints(folder)) >= 1 and any((folder / "shared").glob("*")), 30,
               "no incremental checkpoint with shared files")
    cli.run("cancel", "-a", address, job, check=True)
    wait_until(lambda: cli.job_status("-a", address, job) == "CANCELED", 30, "not cancelled")
    latest = _checkpoints(folder)[-1]
    referenced = [f["path"] for entry in json.loads(latest.read_text())["subtasks"].values() for f in entry["files"]]
    shared = [p for p in referenced if "/shared/" in p]
    assert shared, f"the latest checkpoint references no shared file: {referenced}"
    missing = [p for p in referenced if not Path(p.removeprefix("file://")).exists()]
    assert not missing, f"files the retained checkpoint needs are gone: {missing}"
    _restore(cli, address, tmp_path, latest.parent, "3")
    assert_upsert_counts(tmp_path / "out", expected)
