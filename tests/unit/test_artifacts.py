"""The job artifact cache of a TaskExecutor / JobMaster: fetch once, check the hash, load
entries, and fail with ArtifactError (never a bare exception) when the artifact is wrong."""

from __future__ import annotations

import io
import threading
import time
import zipfile

import cloudpickle
import pytest

from yarnflow.common.artifacts import ArtifactCache, ArtifactError, chain_entry, store_artifact

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

_active = 0
_most = 0
_guard = threading.Lock()


def _slow_import(value: int) -> int:
    """Stands in for a module import done while unpickling: records how many run at once."""
    global _active, _most
    with _guard:
        _active += 1
        _most = max(_most, _active)
    time.sleep(0.05)
    with _guard:
        _active -= 1
    return value


class _Loaded:
    def __init__(self, value: int) -> None:
        self.value = value

    def __reduce__(self) -> tuple[object, tuple[int]]:
        return _slow_import, (self.value,)


def _artifact(tmp_path, entries: dict[str, bytes]) -> tuple[str, str]:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return store_artifact(buf.getvalue(), f"file://{tmp_path}/storage")


def test_chains_loaded_by_tasks_starting_together_are_unpickled_one_at_a_time(tmp_path):
    # two tasks of one TaskExecutor unpickling at once could each import half of a package
    # whose __init__ imports its submodules (seen as "partially initialized module" errors)
    global _most
    _most = 0
    uri, sha = _artifact(tmp_path, {chain_entry(f"v{i}"): cloudpickle.dumps([_Loaded(i)]) for i in range(4)})
    cache = ArtifactCache(str(tmp_path / "cache"))
    results: dict[int, int] = {}
    start = threading.Barrier(4)

    def load(i: int) -> None:
        start.wait()
        results[i] = cache.load_chain(uri, sha, f"v{i}")[0]

    threads = [threading.Thread(target=load, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == {0: 0, 1: 1, 2: 2, 3: 3}
    assert _most == 1


def test_an_artifact_whose_content_does_not_match_its_hash_is_refused(tmp_path):
    uri, sha = _artifact(tmp_path, {chain_entry("v"): cloudpickle.dumps([1])})
    with open(uri.removeprefix("file://"), "ab") as fh:
        fh.write(b"tampered")
    with pytest.raises(ArtifactError, match="corrupt"):
        ArtifactCache(str(tmp_path / "cache")).load_chain(uri, sha, "v")


def test_a_missing_chain_or_artifact_names_what_is_missing(tmp_path):
    uri, sha = _artifact(tmp_path, {chain_entry("v"): cloudpickle.dumps([1])})
    cache = ArtifactCache(str(tmp_path / "cache"))
    with pytest.raises(ArtifactError, match="no operator chain for vertex other"):
        cache.load_chain(uri, sha, "other")
    with pytest.raises(ArtifactError, match="cannot fetch"):
        ArtifactCache(str(tmp_path / "other-cache")).load_chain(f"file://{tmp_path}/nowhere.zip", sha, "v")


def test_a_chain_that_cannot_be_unpickled_is_an_artifact_error(tmp_path):
    uri, sha = _artifact(tmp_path, {chain_entry("v"): b"not a pickle"})
    with pytest.raises(ArtifactError, match="cannot load the operators of vertex v"):
        ArtifactCache(str(tmp_path / "cache")).load_chain(uri, sha, "v")
