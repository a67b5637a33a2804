"""The job artifact cache of a TaskExecutor / JobMaster: fetch once, check the hash, load
entries, and fail with ArtifactError (never a bare exception) when the artifact is wrong."""

from __future__ import annotations

import io
import subprocess
import sys
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


@pytest.mark.parametrize("name", ["../escape.py", "/etc/evil.py", "a/../../b.py", "C:/evil.py", "..\\win.py"])
def test_an_artifact_with_a_path_outside_its_folder_is_refused_and_nothing_is_written(tmp_path, name):
    uri, sha = _artifact(tmp_path, {chain_entry("v"): cloudpickle.dumps([1]), name: b"print('owned')"})
    cache = ArtifactCache(str(tmp_path / "cache"))
    with pytest.raises(ArtifactError, match="holds a path outside its folder"):
        cache.load_chain(uri, sha, "v")
    assert not (tmp_path / "escape.py").exists() and not list((tmp_path / "cache").glob("*/"))


def test_an_artifact_that_unpacks_beyond_the_cache_is_refused(tmp_path):
    uri, sha = _artifact(tmp_path, {chain_entry("v"): cloudpickle.dumps([1]), "zeros.bin": bytes(2_000_000)})
    with pytest.raises(ArtifactError, match=r"unpacks to 2000017 bytes, .* \(blob.cache.max-size: 1000000 bytes\)"):
        ArtifactCache(str(tmp_path / "cache"), max_bytes=1_000_000).load_chain(uri, sha, "v")
    assert ArtifactCache(str(tmp_path / "cache2"), max_bytes=10_000_000).load_chain(uri, sha, "v") == [1]


# ---- the bound (blob.cache.max-size) and the cleanup (blob.service.cleanup.interval) ----------

def _distinct(tmp_path, i: int) -> tuple[str, str]:
    """An artifact of its own (about 10 KB unpacked), as each job's is."""
    return _artifact(tmp_path, {chain_entry("v"): cloudpickle.dumps([i]), "src/job.py": b"#" * 10_000 + b"%d" % i})


def test_the_cache_stays_under_its_bound_across_50_jobs_and_keeps_the_running_ones(tmp_path):
    running: set[str] = set()
    cache = ArtifactCache(str(tmp_path / "cache"), max_bytes=50_000, in_use=lambda: running)
    artifacts = [_distinct(tmp_path, i) for i in range(50)]
    running.add(artifacts[0][1])  # job 0 still runs here all along
    most = 0
    for uri, sha in artifacts:
        assert cache.load_chain(uri, sha, "v")  # each job's tasks load their chain
        most = max(most, cache.cached_bytes)
        assert sum(f.stat().st_size for f in (tmp_path / "cache").rglob("*") if f.is_file()) == cache.cached_bytes
    assert most <= 50_000 + 11_000  # the bound, plus the one just fetched, which always stays
    assert artifacts[0][1] in cache.cached() and artifacts[-1][1] in cache.cached()
    assert len(cache.cached()) < 10
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == cache.cached()  # deleted from disk too
    uri, sha = artifacts[5]  # an evicted one is fetched again when a job needs it
    assert cache.load_chain(uri, sha, "v") == [5]


def test_artifacts_unused_for_the_cleanup_interval_are_deleted(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("yarnflow.common.artifacts.time.monotonic", lambda: clock[0])
    running: set[str] = set()
    cache = ArtifactCache(str(tmp_path / "cache"), ttl_s=3600, in_use=lambda: running)
    (u1, s1), (u2, s2), (u3, s3) = (_distinct(tmp_path, i) for i in range(3))
    cache.fetch(u1, s1)
    cache.fetch(u2, s2)
    running.add(s2)
    clock[0] += 1800
    assert cache.clean_up() == []
    cache.fetch(u1, s1)  # used again: its hour starts over
    clock[0] += 3600
    cache.fetch(u3, s3)  # a fetch cleans up too; s2 stays while its job runs here
    assert cache.cached() == sorted([s2, s3])
    running.clear()
    clock[0] += 3600
    assert sorted(cache.clean_up()) == sorted([s2, s3])
    assert cache.cached() == [] and list((tmp_path / "cache").iterdir()) == []


def test_pickled_job_functions_keep_their_file_name_for_tracebacks() -> None:
    """cloudpickle 3 writes "<dynamic-code>" as a pickled function's file: a job function's
    traceback on a TaskExecutor then named no file (issue 32). The artifact's pickler keeps it."""
    import pickle

    from yarnflow.packaging import dumps

    def parse(row):  # type: ignore[no-untyped-def]
        return [lambda: int(row)]

    parse.__module__ = "__main__"  # (as a job file's function: pickled by value)
    back = pickle.loads(dumps(parse))
    assert back.__code__.co_filename == __file__
    nested = [c for c in back.__code__.co_consts if hasattr(c, "co_filename")]
    assert nested and all(c.co_filename == __file__ for c in nested)


# ---- the blob service's side: reads through the AppMaster, a cache shared by a host --------

def _reader(data: bytes, calls: list[tuple[int, int]]):
    def read(offset: int, length: int) -> bytes:
        calls.append((offset, length))
        return data[offset:offset + length]
    return read


def test_an_artifact_is_read_in_chunks_through_the_blob_service_and_checked(tmp_path, monkeypatch):
    monkeypatch.setattr("yarnflow.common.artifacts.READ_CHUNK", 1000)
    uri, sha = _artifact(tmp_path, {chain_entry("v"): cloudpickle.dumps([7]), "src/big.bin": bytes(range(256)) * 20})
    data = (tmp_path / "storage" / "artifacts" / f"{sha}.zip").read_bytes()
    (tmp_path / "storage").rename(tmp_path / "elsewhere")  # this host cannot read the storage
    calls: list[tuple[int, int]] = []
    cache = ArtifactCache(str(tmp_path / "cache"))
    assert cache.load_chain(uri, sha, "v", _reader(data, calls)) == [7]
    assert calls == [(i * 1000, 1000) for i in range(len(data) // 1000 + 1)]
    tampered = data[:-1] + bytes([data[-1] ^ 1])
    with pytest.raises(ArtifactError, match="is corrupt: sha256"):
        ArtifactCache(str(tmp_path / "cache2")).load_chain(uri, sha, "v", _reader(tampered, []))
    assert not list((tmp_path / "cache2").iterdir())


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_corrupt_cache_entry_is_detected_at_its_next_use_and_fetched_again(tmp_path, caplog, damage):
    uri, sha = _artifact(tmp_path, {chain_entry("v"): cloudpickle.dumps([1]), "src/helper.py": b"X = 1\n" * 100})
    cache = ArtifactCache(str(tmp_path / "cache"))
    assert cache.load_chain(uri, sha, "v") == [1]
    helper = tmp_path / "cache" / sha / "src" / "helper.py"
    if damage == "flip":
        helper.write_bytes(b"X = 2\n" * 100)  # (same size, other content)
    elif damage == "truncate":
        helper.write_bytes(b"X")
    else:
        helper.unlink()
    caplog.set_level("WARNING", "yarnflow.common.artifacts")
    assert cache.load_chain(uri, sha, "v") == [1]
    assert f"the cached job artifact {sha[:12]} is corrupt" in caplog.text
    assert helper.read_bytes() == b"X = 1\n" * 100  # fetched again
    caplog.clear()
    cache.fetch(uri, sha)
    assert "corrupt" not in caplog.text  # (intact now: used as is)


def test_the_last_process_of_a_host_to_stop_using_an_artifact_deletes_it(tmp_path):
    """Two TaskExecutors of one host share the cache: the artifact stays while either's tasks
    use it; a process that died does not keep it."""
    uri, sha = _artifact(tmp_path, {chain_entry("v"): cloudpickle.dumps([1])})
    running: set[str] = {sha}
    mine = ArtifactCache(str(tmp_path / "cache"), in_use=lambda: running)
    mine.fetch(uri, sha)
    users = tmp_path / "cache" / sha / ".yarnflow-users"
    (users / "999999999").touch()  # a TaskExecutor of this host that died (no such pid)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (users / str(other.pid)).touch()  # another live TaskExecutor of this host uses it too
        assert mine.release_unused() == []  # my task still runs
        running.clear()
        assert mine.release_unused() == [] and (tmp_path / "cache" / sha).is_dir()  # the other one's tasks do
    finally:
        other.kill()
        other.wait()
    mine.fetch(uri, sha)
    assert mine.release_unused() == [sha]
    assert list((tmp_path / "cache").iterdir()) == []
