"""The savepoint format (am/checkpoint/savepoints.py): a checkpoint's state copied into a folder
keyed by operator uid with relative paths, read back from wherever the folder went, and mapped
onto another JobGraph by uid (chaining and vertex ids may differ)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from yarnflow.am.checkpoint.savepoints import SavepointError, read_savepoint, restore_metadata, write_savepoint
from yarnflow.common.ids import JobID, JobVertexID
from yarnflow.common.messages import JobEdge, JobGraph, JobVertex
from yarnflow.common.states import Partitioner
from yarnflow.worker.state.tables import not_redistributable


def _state_file(path: Path, rows: int, table: pa.Table | None = None) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"key_group": list(range(rows))}) if table is None else table
    with ipc.new_file(str(path), table.schema) as w:
        w.write_table(table)
    return path.as_uri()


def _graph(chained: bool) -> JobGraph:
    if chained:  # source and sum in one vertex now
        v = JobVertex(JobVertexID.generate(), "src -> sum", 2, 128, ["src", "sum"], operator_uids=["src", "sum"])
        return JobGraph(JobID.generate(), "j", [v], [])
    a = JobVertex(JobVertexID.generate(), "src", 2, 128, ["src"], operator_uids=["src"], is_source=True)
    b = JobVertex(JobVertexID.generate(), "sum", 2, 128, ["sum"], operator_uids=["sum"])
    return JobGraph(JobID.generate(), "j", [a, b], [JobEdge(a.vertex_id, b.vertex_id, Partitioner.HASH)])


def _checkpoint(tmp_path: Path, graph: JobGraph) -> dict:
    src, total = graph.vertices
    subtasks = {}
    for i in range(2):
        held = pa.table({"split_id": [f"f{i}"], "offset": [10 * i]})  # operator state: no key groups
        subtasks[f"{src.vertex_id}#{i}"] = {"finished": i == 0, "files": [
            {"operator_index": 0, "name": "splits", "size_bytes": 10,
             "path": _state_file(tmp_path / "chk-7" / f"src-{i}" / "op0-splits.arrow", 1, held)}]}
        subtasks[f"{total.vertex_id}#{i}"] = {"finished": False, "files": [
            {"operator_index": 0, "name": "values", "size_bytes": 20,
             "path": _state_file(tmp_path / "chk-7" / f"sum-{i}" / "op0-values.arrow", 3 + i)}]}
    return {"version": 1, "job_id": str(graph.job_id), "checkpoint_id": 7, "subtasks": subtasks,
            "split_enumerator": {str(src.vertex_id): [{"split_id": "a", "payload": "eA=="}]},
            "vertices": {str(v.vertex_id): {"name": v.name, "parallelism": v.parallelism,
                                            "max_parallelism": v.max_parallelism,
                                            "operator_uids": list(v.operator_uids)} for v in graph.vertices}}


def test_a_savepoint_is_self_contained_and_maps_by_uid_into_another_graph(tmp_path: Path) -> None:
    old = _graph(chained=False)
    url = write_savepoint(str(tmp_path / "sps"), str(old.job_id), _checkpoint(tmp_path, old))
    shutil.rmtree(tmp_path / "chk-7")  # the checkpoint is gone: the savepoint holds copies
    moved = tmp_path / "moved"
    shutil.move(url.removeprefix("file://"), moved)
    doc = read_savepoint(str(moved))
    assert doc["checkpoint_id"] == 7 and set(doc["operators"]) == {"src", "sum"}
    new = _graph(chained=True)
    meta = restore_metadata(doc, new, allow_non_restored=False)
    [v] = new.vertices
    sub0, sub1 = meta["subtasks"][f"{v.vertex_id}#0"], meta["subtasks"][f"{v.vertex_id}#1"]
    assert sorted((f["operator_index"], f["name"]) for f in sub0["files"]) == [(0, "splits"), (1, "values")]
    assert all(f["path"].startswith(moved.as_uri()) and Path(f["path"].removeprefix("file://")).exists()
               for f in sub0["files"] + sub1["files"])
    assert not sub0["finished"]  # the source had finished, the sum chained to it had not
    assert meta["split_enumerator"] == {str(v.vertex_id): [{"split_id": "a", "payload": "eA=="}]}
    with (moved / "_metadata").open() as fh:
        assert all(not f["path"].startswith("/") for op in json.load(fh)["operators"].values()
                   for s in op["subtasks"].values() for f in s["files"])


def test_a_savepoint_copied_to_another_filesystem_restores_from_there(tmp_path: Path) -> None:
    import fsspec

    from yarnflow.common.messages import OperatorStateFile, TaskRestore
    from yarnflow.worker.runtime.checkpoints import read_task_state

    old = _graph(chained=False)
    url = write_savepoint(str(tmp_path / "sps"), str(old.job_id), _checkpoint(tmp_path, old))
    local = Path(url.removeprefix("file://"))
    expected = {p.relative_to(local): ipc.open_file(str(p)).read_all() for p in local.rglob("*.arrow")}
    memory = fsspec.filesystem("memory")
    target = f"/sp-{old.job_id}"
    memory.put(str(local), target, recursive=True)
    shutil.rmtree(local)
    shutil.rmtree(tmp_path / "chk-7")  # nothing left on the local disk
    try:
        doc = read_savepoint(f"memory://{target}")
        meta = restore_metadata(doc, _graph(chained=False), allow_non_restored=False)
        read = 0
        for sub in meta["subtasks"].values():
            assert all(f["path"].startswith(f"memory://{target}/") for f in sub["files"]), sub["files"]
            restore = TaskRestore(7, [OperatorStateFile(f["operator_index"], f["name"], f["path"]) for f in sub["files"]])
            for f, tables in zip(sub["files"], [t for op in read_task_state(restore, 1) for t in op.values()]):
                assert tables.equals(expected[Path(f["path"].removeprefix(f"memory://{target}/"))])
                read += 1
        assert read == len(expected) == 4
    finally:
        memory.rm(target, recursive=True)


def test_unclaimed_state_is_refused_unless_allowed(tmp_path: Path) -> None:
    old = _graph(chained=False)
    doc = read_savepoint(write_savepoint(str(tmp_path / "sps"), str(old.job_id), _checkpoint(tmp_path, old)))
    renamed = _graph(chained=False)
    renamed.vertices[1].operator_uids[0] = "totals"
    with pytest.raises(SavepointError, match=r"state for operators this job does not have \(uids: sum\)"):
        restore_metadata(doc, renamed, allow_non_restored=False)
    meta = restore_metadata(doc, renamed, allow_non_restored=True)
    assert all(f["name"] == "splits" for s in meta["subtasks"].values() for f in s["files"])


def _rescaled(doc: dict, parallelism: int, max_parallelism: int = 128) -> tuple[JobVertex, dict]:
    v = JobVertex(JobVertexID.generate(), "src -> sum", parallelism, max_parallelism, operator_uids=["src", "sum"])
    return v, restore_metadata(doc, JobGraph(JobID.generate(), "j", [v], []), allow_non_restored=False)


def _files(meta: dict, v: JobVertex, sub: int) -> list[tuple[str, str]]:
    """(state name, old subtask folder) of the files new subtask ``sub`` restores."""
    entry = meta["subtasks"].get(f"{v.vertex_id}#{sub}", {"files": []})
    return sorted((f["name"], f["path"].split("/")[-2]) for f in entry["files"])


def test_a_rescaled_restore_deals_keyed_state_by_key_group_range_and_operator_state_round_robin(tmp_path):
    old = _graph(chained=False)
    doc = read_savepoint(write_savepoint(str(tmp_path / "sps"), str(old.job_id), _checkpoint(tmp_path, old)))
    modes = {f["name"]: f["redistribute"] for op in doc["operators"].values() for s in op["subtasks"].values()
             for f in s["files"]}
    assert modes == {"splits": "list", "values": "keyed"}  # read from each file's schema
    # 2 -> 3 over 128 key groups: old 0 owns 0-63, old 1 64-127; new 0-42, 43-85, 86-127
    v, meta = _rescaled(doc, 3)
    assert _files(meta, v, 0) == [("splits", "0"), ("values", "0")]
    assert _files(meta, v, 1) == [("splits", "1"), ("values", "0"), ("values", "1")]
    assert _files(meta, v, 2) == [("values", "1")]  # no held splits: it asks the enumerator for work
    assert not any(s["finished"] for s in meta["subtasks"].values())  # old source 1 had not finished
    # 2 -> 1: everything to the one subtask
    v, meta = _rescaled(doc, 1)
    assert _files(meta, v, 0) == [("splits", "0"), ("splits", "1"), ("values", "0"), ("values", "1")]


def test_user_operator_state_is_split_united_or_copied_as_its_mode_says(tmp_path: Path) -> None:
    """List state (split) and union-list state go from every old subtask to every new one;
    broadcast state from old subtask ``j % old`` to new ``j``; union state also at the same
    parallelism (every subtask gets all of it on every restore, as Flink's)."""
    from yarnflow.worker.state.operator_state import OperatorStateStore
    from yarnflow.common.api import ListStateDescriptor, MapStateDescriptor

    old = _graph(chained=False)
    checkpoint = _checkpoint(tmp_path, old)
    for i in range(2):
        store = OperatorStateStore(i, 2, "src")
        store.get_list_state(ListStateDescriptor("offsets")).update([i])
        store.get_union_list_state(ListStateDescriptor("seen")).update([i])
        store.get_broadcast_state(MapStateDescriptor("rules")).put("r", i)
        files = checkpoint["subtasks"][f"{old.vertices[0].vertex_id}#{i}"]["files"] = []
        for name, table in store.snapshot().items():
            files.append({"operator_index": 0, "name": name, "size_bytes": 1,
                          "path": _state_file(tmp_path / "chk-7" / f"src-{i}" / f"{name}.arrow", 1, table)})
    doc = read_savepoint(write_savepoint(str(tmp_path / "sps"), str(old.job_id), checkpoint))
    modes = {f["name"]: f["redistribute"] for s in doc["operators"]["src"]["subtasks"].values() for f in s["files"]}
    assert modes == {"operator.split.offsets": "split", "operator.union.seen": "union",
                     "operator.broadcast.rules": "broadcast"}
    v, meta = _rescaled(doc, 3)
    for new in range(3):
        files = [f for f in _files(meta, v, new) if f[0].startswith("operator.")]
        assert files == sorted([("operator.broadcast.rules", str(new % 2)), ("operator.split.offsets", "0"),
                                ("operator.split.offsets", "1"), ("operator.union.seen", "0"),
                                ("operator.union.seen", "1")]), (new, files)
    v, meta = _rescaled(doc, 2)
    assert [f for f in _files(meta, v, 1) if f[0].startswith("operator.")] == [
        ("operator.broadcast.rules", "1"), ("operator.split.offsets", "1"), ("operator.union.seen", "0"),
        ("operator.union.seen", "1")]


def test_state_that_cannot_be_rescaled_is_refused_naming_the_operator(tmp_path: Path) -> None:
    old = _graph(chained=False)
    checkpoint = _checkpoint(tmp_path, old)
    position = not_redistributable(pa.table({"emitted": [5]}))  # a collection source's slice position
    for i in range(2):
        checkpoint["subtasks"][f"{old.vertices[0].vertex_id}#{i}"]["files"][0]["path"] = _state_file(
            tmp_path / "chk-7" / f"src-{i}" / "op0-position.arrow", 1, position)
    doc = read_savepoint(write_savepoint(str(tmp_path / "sps"), str(old.job_id), checkpoint))
    with pytest.raises(SavepointError, match=r"operator 'src' \('src -> sum'\) ran with parallelism 2 in the "
                                             r"savepoint and has 3 now, but its state \(splits\) is a position"):
        _rescaled(doc, 3)
    _rescaled(doc, 2)  # unchanged parallelism: fine
    ok = read_savepoint(write_savepoint(str(tmp_path / "sps2"), str(old.job_id), _checkpoint(tmp_path, old)))
    with pytest.raises(SavepointError, match="had max parallelism 128 in the savepoint and has 256 now"):
        _rescaled(ok, 3, max_parallelism=256)


def test_what_is_not_a_savepoint(tmp_path: Path) -> None:
    with pytest.raises(SavepointError, match="no savepoint at"):
        read_savepoint(str(tmp_path / "nothing"))
    (tmp_path / "chk").mkdir()
    (tmp_path / "chk" / "_metadata").write_text('{"checkpoint_id": 3, "subtasks": {}}')
    with pytest.raises(SavepointError, match="is not a yarnflow savepoint"):
        read_savepoint(str(tmp_path / "chk"))
    (tmp_path / "chk" / "_metadata").write_text('{"kind": "savepoint", "operators": {}, "version": 99}')
    with pytest.raises(SavepointError, match="format version 99"):
        read_savepoint(str(tmp_path / "chk"))


def _with_inflight(tmp_path: Path, graph: JobGraph, names: dict[int, list[str]]) -> dict:
    """The checkpoint of ``_checkpoint`` taken unaligned: the sum's subtasks (old index ->
    file names) hold in-flight data too."""
    metadata = _checkpoint(tmp_path, graph)
    total = graph.vertices[1]
    for sub, files in names.items():
        for name in files:
            path = tmp_path / "chk-7" / f"sum-{sub}" / f"{name}.arrow"
            _state_file(path, 1)
            metadata["subtasks"][f"{total.vertex_id}#{sub}"]["files"].append(
                {"operator_index": 0, "name": name, "size_bytes": 5, "path": f"file://{path}"})
    return metadata


def test_an_unaligned_checkpoints_in_flight_data_is_dealt_to_another_parallelism(tmp_path: Path) -> None:
    """Issue 51: in-flight input of a keyed input goes to the new subtasks whose key groups
    overlap the old subtask's (each keeps the rows of its own), in-flight output from old
    subtask i to new i % p; both renamed so the task replays them whatever its channels are now."""
    old = _graph(chained=False)
    metadata = _with_inflight(tmp_path, old, {0: ["@in-0-0", "@in-0-1", "@out-0-1"], 1: ["@in-0-1"]})
    doc = read_savepoint(write_savepoint(str(tmp_path / "sps"), str(old.job_id), metadata))
    modes = {(f["name"], f["redistribute"], f.get("input", f.get("writer")))
             for s in doc["operators"]["sum"]["subtasks"].values() for f in s["files"] if f["name"].startswith("@")}
    assert modes == {("@in-0-0", "inflight-input", 0), ("@in-0-1", "inflight-input", 0),
                     ("@out-0-1", "inflight-output", 0)}
    src, total = old.vertices
    for parallelism, expected in (
            (3, {0: ["@rin-0-0-0", "@rin-0-0-1", "@rout-0-0-1"],  # old 0 owned key groups 0-63: new 0 and 1
                 1: ["@rin-0-0-0", "@rin-0-0-1", "@rin-0-1-1"], 2: ["@rin-0-1-1"]}),
            (1, {0: ["@rin-0-0-0", "@rin-0-0-1", "@rin-0-1-1", "@rout-0-0-1"]})):
        a = JobVertex(src.vertex_id, "src", parallelism, 128, ["src"], operator_uids=["src"], is_source=True)
        b = JobVertex(total.vertex_id, "sum", parallelism, 128, ["sum"], operator_uids=["sum"])
        graph = JobGraph(JobID.generate(), "j", [a, b], [JobEdge(a.vertex_id, b.vertex_id, Partitioner.HASH)])
        meta = restore_metadata(doc, graph, allow_non_restored=False)
        got = {sub: sorted(f["name"] for f in meta["subtasks"].get(f"{b.vertex_id}#{sub}", {"files": []})["files"]
                           if f["name"].startswith("@"))
               for sub in range(parallelism)}
        assert got == expected, parallelism


def test_in_flight_input_of_a_forward_input_goes_round_robin(tmp_path: Path) -> None:
    old = _graph(chained=False)
    old = JobGraph(old.job_id, "j", old.vertices, [JobEdge(old.vertices[0].vertex_id, old.vertices[1].vertex_id,
                                                           Partitioner.REBALANCE)])
    doc = read_savepoint(write_savepoint(str(tmp_path / "sps"), str(old.job_id),
                                         _with_inflight(tmp_path, old, {0: ["@in-0-0"], 1: ["@in-0-1"]})))
    a, b = (JobVertex(v.vertex_id, v.name, 3, 128, list(v.operator_names), operator_uids=list(v.operator_uids),
                      is_source=v.is_source) for v in old.vertices)
    meta = restore_metadata(doc, JobGraph(JobID.generate(), "j", [a, b], old.edges), allow_non_restored=False)
    got = {sub: [f["name"] for f in meta["subtasks"].get(f"{b.vertex_id}#{sub}", {"files": []})["files"]
                 if f["name"].startswith("@")] for sub in range(3)}
    assert got == {0: ["@rin-0-0-0"], 1: ["@rin-0-1-1"], 2: []}


def test_in_flight_data_of_an_earlier_version_does_not_become_a_savepoint(tmp_path: Path) -> None:
    """In-flight data written before it named its input (``@in-<channel>``) cannot be dealt:
    refused, saying why (it still restores at the parallelism it was taken at)."""
    old = _graph(chained=False)
    with pytest.raises(SavepointError, match="checkpoint 7 was taken unaligned by an earlier version"):
        write_savepoint(str(tmp_path / "sps"), str(old.job_id), _with_inflight(tmp_path, old, {0: ["@in-1"]}))


def test_a_retained_checkpoint_becomes_a_savepoint_beside_it_and_the_latest_is_found(tmp_path: Path) -> None:
    """``run -s`` of a retained checkpoint (``restore_from_checkpoint``): given a ``chk-<n>`` folder,
    its ``_metadata``, or the job's checkpoint folder (its latest complete checkpoint: a folder
    without ``_metadata`` is one that did not complete), a savepoint is written beside it and
    the job's config points at it; the checkpoint is left as it was. A savepoint, or a path
    with no checkpoint, is left to ``read_savepoint``; in-flight data of an earlier version is
    refused."""
    from yarnflow.executors import restore_from_checkpoint
    from yarnflow.common.errors import JobDefinitionError

    graph = _graph(chained=False)
    job_dir = tmp_path / "chk" / str(graph.job_id)
    metadata = _checkpoint(job_dir, graph)
    (job_dir / "chk-7" / "_metadata").write_text(json.dumps(metadata))
    (job_dir / "chk-9").mkdir()  # an incomplete one
    for given in (job_dir / "chk-7", job_dir / "chk-7" / "_metadata", job_dir):
        config = {"execution.savepoint.path": str(given)}
        restore_from_checkpoint(config)
        savepoint = read_savepoint(config["execution.savepoint.path"])
        assert savepoint["checkpoint_id"] == 7 and savepoint["_folder"].startswith(f"file://{job_dir}/savepoint-")
        restored = restore_metadata(savepoint, graph, False)
        assert sorted(restored["subtasks"]) == sorted(metadata["subtasks"])
    assert json.loads((job_dir / "chk-7" / "_metadata").read_text()) == metadata
    for untouched in (savepoint["_folder"], str(tmp_path / "nothing"), ""):
        config = {"execution.savepoint.path": untouched}
        restore_from_checkpoint(config)
        assert config == {"execution.savepoint.path": untouched}
    metadata["subtasks"][next(iter(metadata["subtasks"]))]["files"].append(
        {"operator_index": 0, "name": "@out-1", "size_bytes": 5,
         "path": _state_file(job_dir / "chk-7" / "x" / "@out-1.arrow", 1)})
    (job_dir / "chk-7" / "_metadata").write_text(json.dumps(metadata))
    with pytest.raises(JobDefinitionError, match="cannot start from the checkpoint at .*taken unaligned"):
        restore_from_checkpoint({"execution.savepoint.path": str(job_dir / "chk-7")})
