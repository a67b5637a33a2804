"""A client uploads the job's artifact through the AppMaster's REST API (Flink's BlobServer: a
client on another host may see nothing of the cluster's storage, no HDFS access from a laptop
or a CI runner); the upload is streamed, size-limited and hash-checked. Only an artifact the
AppMaster will not take (too big) is written into the storage dir by the client itself."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import requests

import yarnflow
import yarnflow.packaging
from yarnflow import executors

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def cluster(local_cluster: Any) -> Any:
    c = local_cluster(taskexecutors=1, slots=2, rest__port="0", **{"rest.server.max-content-length": "64 kb"})
    c.web = c.web_url()
    return c


def _run(cluster: Any, conf: dict[str, str]) -> Any:
    executors.set_context(executors.ClusterContext(cluster.address, {"execution.runtime-mode": "BATCH", **conf},
                                                   progress=False))
    try:
        env = yarnflow.StreamExecutionEnvironment(parallelism=2)
        env.from_collection({"v": list(range(100))}).map(lambda r: {"v": r["v"] * 2}).collect()
        return env.execute("uploaded")
    finally:
        executors.set_context(None)


def test_a_client_uploads_through_the_appmaster_and_writes_the_storage_dir_only_when_told(
        cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(data: bytes, storage_dir: str) -> Any:
        raise PermissionError(13, "Permission denied", storage_dir)

    monkeypatch.setattr(yarnflow.packaging, "store_artifact", refused)
    result = _run(cluster, {})  # (the default: auto)
    assert sorted(result.collected().column("v").to_pylist()) == [v * 2 for v in range(100)]
    with pytest.raises(PermissionError):  # said so: the storage dir or nothing
        _run(cluster, {"client.artifact-upload": "storage"})


def test_an_artifact_too_big_for_the_appmaster_is_written_into_the_storage_dir(
        cluster: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bulk = [f"{i:08x}" * 4 for i in range(4000)]  # (in the job's function: ~150 kB of artifact, over 64 kB)
    executors.set_context(executors.ClusterContext(cluster.address, {"execution.runtime-mode": "BATCH"},
                                                   progress=False))
    try:
        env = yarnflow.StreamExecutionEnvironment(parallelism=2)
        env.from_collection({"v": list(range(10))}).map(lambda r: {"v": r["v"] + len(bulk)}).collect()
        result = env.execute("big")
    finally:
        executors.set_context(None)
    assert sorted(result.collected().column("v").to_pylist()) == [v + 4000 for v in range(10)]
    err = capsys.readouterr().err
    assert "the AppMaster refused the job artifact (HTTP 413)" in err and "into the storage dir" in err, err


def test_the_appmaster_can_be_the_only_way_artifacts_arrive(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def never(data: bytes, storage_dir: str) -> Any:
        raise AssertionError("the client wrote the storage dir")

    monkeypatch.setattr(yarnflow.packaging, "store_artifact", never)
    result = _run(cluster, {"client.artifact-upload": "appmaster"})
    assert sorted(result.collected().column("v").to_pylist()) == [v * 2 for v in range(100)]


def test_an_upload_is_hash_checked_and_size_limited(cluster: Any) -> None:
    data = b"PK\x05\x06" + b"\0" * 18  # an empty zip
    sha = hashlib.sha256(data).hexdigest()
    url = f"{cluster.web}/artifacts"
    first = requests.post(url, params={"sha256": sha}, data=data, timeout=10)
    assert first.status_code == 201, first.text
    stored = first.json()
    assert stored["sha256"] == sha and stored["size"] == len(data) and stored["uri"].endswith(f"/artifacts/{sha}.zip")
    assert Path(stored["uri"].removeprefix("file://")).read_bytes() == data
    again = requests.post(url, params={"sha256": sha}, data=data, timeout=10)  # stored once per content
    assert again.status_code == 201 and again.json()["uri"] == stored["uri"]
    corrupt = requests.post(url, params={"sha256": sha}, data=data[:-1] + b"\1", timeout=10)
    assert corrupt.status_code == 400 and "corrupted on the way" in corrupt.json()["errors"][0]
    big = b"x" * (65 * 1024)
    too_big = requests.post(url, params={"sha256": hashlib.sha256(big).hexdigest()}, data=big, timeout=10)
    assert too_big.status_code == 413 and "rest.server.max-content-length" in too_big.json()["errors"][0]
    unnamed = requests.post(url, data=data, timeout=10)
    assert unnamed.status_code == 400 and "sha256" in unnamed.json()["errors"][0]
    leftovers = [p.name for p in Path(stored["uri"].removeprefix("file://")).parent.iterdir()]
    assert leftovers == [f"{sha}.zip"]  # no partial upload left behind


@pytest.mark.parametrize("told", [None, "appmaster"])
def test_an_embedded_clusters_client_writes_its_storage_itself_unless_told(
        monkeypatch: pytest.MonkeyPatch, process_tag: str, told: str | None) -> None:
    """``yarnflow run`` on an embedded cluster: the storage is a folder of this machine, so the
    client writes the artifact there instead of sending it to its own AppMaster over HTTP (issue
    54); ``client.artifact-upload: appmaster`` still sends it."""
    from tests.conftest import TAG_VAR

    monkeypatch.setenv(TAG_VAR, process_tag)
    ways: list[str] = []
    upload, store = yarnflow.packaging.upload_to_appmaster, yarnflow.packaging.store_artifact
    monkeypatch.setattr(yarnflow.packaging, "upload_to_appmaster",
                        lambda *a, **k: (ways.append("appmaster"), upload(*a, **k))[1])
    monkeypatch.setattr(yarnflow.packaging, "store_artifact", lambda *a, **k: (ways.append("storage"), store(*a, **k))[1])
    conf = {"execution.runtime-mode": "BATCH", **({"client.artifact-upload": told} if told else {})}
    executors.set_context(executors.LocalContext(1, 1, conf, progress=False))
    try:
        env = yarnflow.StreamExecutionEnvironment()
        env.from_collection({"v": list(range(10))}).map(lambda r: {"v": r["v"] + 1}).collect()
        result = env.execute("embedded")
    finally:
        executors.set_context(None)
    assert sorted(result.collected().column("v").to_pylist()) == list(range(1, 11))
    assert ways == [told or "storage"]
