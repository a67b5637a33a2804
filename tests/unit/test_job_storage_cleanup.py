"""An ended job's intermediate data is deleted from its storage dir (stored result partitions,
Spark stages' files); what users still read (collected rows, Spark reports, checkpoints) stays."""

from __future__ import annotations

import logging
from pathlib import Path

import fsspec
import pytest

from yarnflow.am.checkpoint.storage import checkpoints_retained
from yarnflow.am.dispatcher.job_data import delete_checkpoints, delete_intermediate_data
from yarnflow.common.states import JobStatus

pytestmark = pytest.mark.timeout(30)


def _job_dir(root: Path) -> Path:
    job = root / "jobs" / "j1"
    for sub in ("partitions/p1/0.arrow", "intermediate/stage/in/orders/part-00000.parquet",
                "intermediate/stage/output/part-0.parquet", "collect/collect-1/rows.arrow",
                "spark/stage.json", "checkpoints/chk-3/_metadata"):
        (job / sub).parent.mkdir(parents=True, exist_ok=True)
        (job / sub).write_bytes(b"x" * 10)
    return job


def test_partitions_and_spark_files_go_the_rest_stays(tmp_path: Path) -> None:
    job = _job_dir(tmp_path)
    delete_intermediate_data(str(job))
    assert sorted(str(p.relative_to(job)) for p in job.rglob("*") if p.is_file()) == [
        "checkpoints/chk-3/_metadata", "collect/collect-1/rows.arrow", "spark/stage.json"]


def test_a_job_without_intermediate_data_and_other_filesystems(tmp_path: Path) -> None:
    delete_intermediate_data(str(tmp_path / "never-written"))  # nothing there: nothing to do
    fs = fsspec.filesystem("memory")
    fs.pipe("/store/jobs/j2/partitions/p/0.arrow", b"x")
    fs.pipe("/store/jobs/j2/spark/s.json", b"{}")
    delete_intermediate_data("memory://store/jobs/j2")
    assert not fs.exists("/store/jobs/j2/partitions") and fs.exists("/store/jobs/j2/spark/s.json")


def test_a_filesystem_error_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from fsspec.implementations.local import LocalFileSystem

    job = _job_dir(tmp_path)
    real_rm = LocalFileSystem.rm

    def rm(self: LocalFileSystem, path: str, recursive: bool = False, **kw: object) -> None:
        if str(path).endswith("partitions"):
            raise PermissionError(13, "Permission denied", path)
        real_rm(self, path, recursive=recursive, **kw)

    monkeypatch.setattr(LocalFileSystem, "rm", rm)
    with caplog.at_level(logging.WARNING):
        delete_intermediate_data(str(job))
    assert f"could not delete {job}/partitions" in caplog.text
    assert (job / "partitions").exists() and not (job / "intermediate").exists()  # the next one still went


def test_an_artifact_goes_with_the_last_job_that_uses_it_and_never_one_stored_elsewhere(tmp_path: Path) -> None:
    from yarnflow.am.dispatcher.job_data import delete_unreferenced_artifact
    from yarnflow.common.artifacts import store_artifact
    from yarnflow.common.ha import EmbeddedHaServices
    from yarnflow.common.ids import JobID, JobVertexID
    from yarnflow.common.messages import JobGraph, JobVertex

    storage = (tmp_path / "storage").as_uri()
    shared, _ = store_artifact(b"the code of two jobs", storage)
    own, _ = store_artifact(b"the code of one job", storage)
    ha = EmbeddedHaServices()

    def graph(job_id: str, uri: str) -> JobGraph:
        return JobGraph(JobID(job_id), job_id, [JobVertex(JobVertexID("v"), "v", 1, 128, ["v"], is_source=True)], [],
                        artifact_uri=uri)

    for job_id, uri in (("a", shared), ("b", shared), ("c", own)):
        ha.job_graph_store().put(graph(job_id, uri))
    ha.job_graph_store().remove("a")
    assert not delete_unreferenced_artifact(ha, storage, shared)  # job b still runs with it
    ha.job_graph_store().remove("b")
    assert delete_unreferenced_artifact(ha, storage, shared)
    assert sorted(p.name for p in (tmp_path / "storage" / "artifacts").iterdir()) == [own.rsplit("/", 1)[1]]
    elsewhere = tmp_path / "mine.zip"
    elsewhere.write_bytes(b"a user's own artifact")
    assert not delete_unreferenced_artifact(ha, storage, elsewhere.as_uri()) and elsewhere.exists()


@pytest.mark.parametrize("retention, kept", [
    ("NO_EXTERNALIZED_CHECKPOINTS", set()),
    ("DELETE_ON_CANCELLATION", {"FAILED"}),
    ("RETAIN_ON_CANCELLATION", {"FAILED", "CANCELED"}),
])
def test_an_ended_jobs_checkpoints_stay_as_their_retention_says(retention: str, kept: set[str]) -> None:
    """Flink's rules: a finished job's go with every retention; a suspended job's (its next leader
    restores from them) and a running one's stay."""
    ended = {s.name for s in (JobStatus.FINISHED, JobStatus.CANCELED, JobStatus.FAILED)
             if checkpoints_retained(s, retention)}
    assert ended == kept
    assert checkpoints_retained(JobStatus.SUSPENDED, retention) and checkpoints_retained(JobStatus.RUNNING, retention)


def test_deleting_an_ended_jobs_checkpoints_takes_the_whole_folder_and_never_raises(tmp_path: Path, caplog) -> None:
    folder = tmp_path / "chk" / "j1"
    for sub in ("chk-3/_metadata", "chk-4/v#0/op0-s.arrow", "shared/abc.sst"):
        (folder / sub).parent.mkdir(parents=True, exist_ok=True)
        (folder / sub).write_bytes(b"x")
    delete_checkpoints(str(folder))
    assert not folder.exists() and (tmp_path / "chk").exists()
    delete_checkpoints(str(folder))  # gone already: nothing to do
    with caplog.at_level(logging.WARNING):
        delete_checkpoints("nosuchprotocol://x/y")  # a filesystem error is logged
    assert "could not delete the checkpoints" in caplog.text


def test_checkpoint_files_written_or_removed_while_the_folder_is_deleted_do_not_leave_it_behind(tmp_path: Path,
                                                                                                 monkeypatch) -> None:
    """A checkpoint in flight when the job ended is written (or discarded) by its JobMaster
    while the Dispatcher deletes the folder: a file vanishing under the removal, and a
    checkpoint written just after it, are both dealt with by trying again."""
    import threading

    from yarnflow.am.dispatcher import job_data

    folder = tmp_path / "chk" / "j1"
    (folder / "chk-23").mkdir(parents=True)
    (folder / "chk-23" / "_metadata").write_bytes(b"x")
    real_rm = job_data.fsspec.implementations.local.LocalFileSystem.rm
    calls = []

    def racing_rm(self, path, recursive=False, **kw):  # type: ignore[no-untyped-def]
        calls.append(path)
        if len(calls) == 1:  # the JobMaster discards chk-24 under the first removal
            raise FileNotFoundError(2, "No such file or directory", "chk-24")
        real_rm(self, path, recursive=recursive, **kw)
        if len(calls) == 2:  # ... and writes a late one just after the second
            threading.Timer(0.02, lambda: (folder / "chk-25").mkdir(parents=True)).start()

    monkeypatch.setattr(job_data.fsspec.implementations.local.LocalFileSystem, "rm", racing_rm)
    job_data.delete_checkpoints(str(folder), settle_s=0.2)
    assert not folder.exists() and len(calls) == 3
