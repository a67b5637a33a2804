"""Savepoints: a completed checkpoint copied into a folder of its own, self-contained and keyed
by operator uid, so that another JobGraph (the same pipeline, resubmitted, possibly changed
around its uids) can start from it, from wherever the folder was moved.

Layout::

    <target dir>/savepoint-<job id prefix>-<random>/_metadata                JSON, written last
    <target dir>/savepoint-.../<operator uid>/<subtask>/<state name>.arrow  the state tables

``_metadata``: ``{"version", "kind": "savepoint", "job_id", "checkpoint_id", "operators": {uid:
{"parallelism", "max_parallelism", "subtasks": {index: {"finished", "files": [{"name", "path"
(relative to the folder), "size_bytes", "redistribute"}]}}}}, "split_enumerator": {source uid:
splits}}``. The state tables are the backend-independent Arrow tables every checkpoint holds.

Rescaling: a job may restore a savepoint at another parallelism (same max parallelism). Each
file's ``redistribute`` says how (read from its schema when the savepoint is written):
``keyed`` (a ``key_group`` column) goes to every new subtask whose key-group range overlaps the
old subtask's, which keeps the rows of its own key groups; ``list`` (operator state: a file
source's held splits and offsets, a sink's pending files) goes whole from old subtask ``i`` to
new subtask ``i % parallelism``; ``none`` (a per-subtask position in a collection or generator)
cannot be redistributed, and such a restore is refused. An unaligned checkpoint's in-flight
data (``inflight-input`` / ``inflight-output``, see ``_copy_inflight`` and ``_goes_to``) is dealt
as Flink's rescaling deals it. User operator state
(``common/keygroups.py``): ``split`` and ``union`` files go to every new subtask (which keeps its
share of a split list), ``broadcast`` ones from old subtask ``j % old parallelism`` to new ``j``. The split enumerator's unassigned
splits do not depend on the parallelism.

A RocksDB backend's checkpoint holds its native snapshot (a manifest of SST files, some in the
job's shared folder): the savepoint holds its canonical tables instead (``keyed_state``,
``timers``, the same as the heap backend's), made here by reading the SST files, so a savepoint
is the same whichever backend took it, and restores on either.

Every function here does I/O: the JobMaster shell calls them off its main thread."""

from __future__ import annotations

import json
import logging
import posixpath
import uuid
from collections.abc import Mapping
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.ipc as ipc

from yarnflow.am.checkpoint.storage import METADATA
from yarnflow.common.errors import YarnflowError
from yarnflow.common.keygroups import BROADCAST, REDISTRIBUTE_KEY, SPLIT, UNION, key_group_range
from yarnflow.common.messages import SHARED_STATE_FILE, JobGraph, JobVertex
from yarnflow.common.states import Partitioner
from yarnflow.common.rocksdb_snapshot import NATIVE_TABLE, CorruptStateFileError, native_to_canonical

VERSION = 1
#: ``redistribute`` of an unaligned checkpoint's in-flight data (``_copy_inflight``)
INFLIGHT_INPUT, INFLIGHT_OUTPUT = "inflight-input", "inflight-output"

log = logging.getLogger(__name__)


class SavepointError(YarnflowError):
    """A savepoint cannot be written, read, or restored into this job (the message says why)."""


def write_savepoint(target_dir: str, job_id: str, metadata: dict[str, Any]) -> str:
    """Copy checkpoint ``metadata``'s state files into a new savepoint folder under
    ``target_dir`` and write its ``_metadata``; returns the folder's URL."""
    fs, root = fsspec.core.url_to_fs(target_dir)
    folder = posixpath.join(root, f"savepoint-{job_id[:6]}-{uuid.uuid4().hex[:12]}")
    vertices: dict[str, Any] = metadata.get("vertices", {})
    operators: dict[str, dict[str, Any]] = {}
    try:
        fs.makedirs(folder, exist_ok=True)
        for key, entry in sorted(metadata["subtasks"].items()):
            vertex, _, index = key.rpartition("#")
            v = vertices[vertex]
            for uid in v["operator_uids"]:
                op = operators.setdefault(uid, {"parallelism": v["parallelism"],
                                                "max_parallelism": v["max_parallelism"], "subtasks": {}})
                op["subtasks"][index] = {"finished": bool(entry["finished"]), "files": []}
            for f in entry["files"]:
                if str(f["name"]).startswith(("@in-", "@out-")):
                    operators[v["operator_uids"][0]]["subtasks"][index]["files"].append(
                        _copy_inflight(fs, folder, f"{v['operator_uids'][0]}/{index}", f, metadata["checkpoint_id"]))
                    continue
                uid = v["operator_uids"][int(f["operator_index"])]
                if f["name"] == SHARED_STATE_FILE:
                    continue  # an SST file the RocksDB manifest references: converted below
                if f["name"] == NATIVE_TABLE:
                    operators[uid]["subtasks"][index]["files"] += _write_canonical(fs, folder, f"{uid}/{index}",
                                                                                   f["path"])
                    continue
                rel = f"{uid}/{index}/{f['name']}.arrow"
                dest = _copy_into(fs, folder, rel, f["path"])
                with fs.open(dest, "rb") as fh:
                    mode = _redistribution(ipc.open_file(pa.PythonFile(fh, mode="r")).schema)
                operators[uid]["subtasks"][index]["files"].append(
                    {"name": f["name"], "path": rel, "size_bytes": int(f["size_bytes"]), "redistribute": mode})
        splits = {vertices[vertex]["operator_uids"][0]: state
                  for vertex, state in (metadata.get("split_enumerator") or {}).items() if vertex in vertices}
        doc = {"version": VERSION, "kind": "savepoint", "job_id": job_id,
               "checkpoint_id": int(metadata["checkpoint_id"]), "operators": operators, "split_enumerator": splits}
        tmp = posixpath.join(folder, f".{METADATA}.inprogress")
        with fs.open(tmp, "w") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
        fs.mv(tmp, posixpath.join(folder, METADATA))
    except (OSError, KeyError, IndexError, ValueError, pa.ArrowException) as exc:
        raise SavepointError(f"writing the savepoint to {target_dir} failed: {type(exc).__name__}: {exc}") from exc
    return str(fs.unstrip_protocol(folder))


def _copy_inflight(fs: Any, folder: str, rel_dir: str, f: dict[str, Any], checkpoint_id: Any) -> dict[str, Any]:
    """An unaligned checkpoint's in-flight data file, copied, with how it is dealt when the job
    starts at another parallelism: ``inflight-input`` (what the subtask had taken from a channel
    of vertex input ``input`` and not processed) or ``inflight-output`` (what writer ``writer``
    had not sent yet). Raises SavepointError for a file that does not name its input (written
    before in-flight data could be rescaled)."""
    name = str(f["name"])
    parts = name[1:].split("-")
    if parts[0] == "in" and len(parts) == 3:
        entry: dict[str, Any] = {"redistribute": INFLIGHT_INPUT, "input": int(parts[1])}
    elif parts[0] == "out" and len(parts) == 3:
        entry = {"redistribute": INFLIGHT_OUTPUT, "writer": int(parts[1])}
    else:
        raise SavepointError(f"checkpoint {checkpoint_id} was taken unaligned by an earlier version, whose in-flight "
                             f"data ({name}) does not say which input it belongs to: it can only be restored at the "
                             "parallelism it ran at")
    rel = f"{rel_dir}/{name}.arrow"
    _copy_into(fs, folder, rel, f["path"])
    return {"name": name, "path": rel, "size_bytes": int(f["size_bytes"]), **entry}


def _copy_into(fs: Any, folder: str, rel: str, source_url: str) -> str:
    """Copy the file at ``source_url`` to ``folder/rel`` on ``fs``; returns the copy's path."""
    dest = posixpath.join(folder, rel)
    fs.makedirs(posixpath.dirname(dest), exist_ok=True)
    with fsspec.open(source_url, "rb") as src, fs.open(dest, "wb") as dst:
        while chunk := src.read(1 << 22):
            dst.write(chunk)
    return dest


def _write_canonical(fs: Any, folder: str, rel_dir: str, manifest_url: str) -> list[dict[str, Any]]:
    """Write the canonical tables of a RocksDB backend's native snapshot (its manifest at
    ``manifest_url``) under ``rel_dir``, a batch at a time: a savepoint never references the
    checkpoints' files."""
    with fsspec.open(manifest_url, "rb") as fh:
        manifest = ipc.open_file(pa.PythonFile(fh, mode="r")).read_all()
    files: dict[str, tuple[Any, Any, pa.Schema]] = {}
    out = []
    try:
        for name, batch in native_to_canonical(manifest):
            if name not in files:
                dest = posixpath.join(folder, f"{rel_dir}/{name}.arrow")
                fs.makedirs(posixpath.dirname(dest), exist_ok=True)
                handle = fs.open(dest, "wb")
                files[name] = (handle, ipc.new_file(handle, batch.schema), batch.schema)
            files[name][1].write_batch(batch)
    except CorruptStateFileError as exc:
        raise SavepointError(f"cannot convert the RocksDB state of {manifest_url}: {exc}") from exc
    finally:
        for name, (handle, writer, schema) in sorted(files.items()):
            writer.close()
            out.append({"name": name, "path": f"{rel_dir}/{name}.arrow", "size_bytes": handle.tell(),
                        "redistribute": _redistribution(schema)})
            handle.close()
    return out


def _redistribution(schema: pa.Schema) -> str:
    """How a state table of this schema is dealt to another parallelism (see the module doc)."""
    if "key_group" in schema.names:
        return "keyed"
    mode = (schema.metadata or {}).get(REDISTRIBUTE_KEY, b"").decode()
    return mode if mode in ("none", SPLIT, UNION, BROADCAST) else "list"


def _folder(path: str) -> tuple[Any, str]:
    """(filesystem, folder) of a savepoint or checkpoint given as its folder or its ``_metadata``."""
    fs, root = fsspec.core.url_to_fs(path)
    root = root.rstrip("/")
    return fs, root[: -len(METADATA) - 1] if root.endswith(f"/{METADATA}") else root


def resume_point(config: Mapping[str, str], storage_dir: str, job_id: str) -> str:
    """A savepoint written from job ``job_id``'s latest retained checkpoint (in its checkpoint
    folder: under ``execution.checkpointing.dir``, else the storage dir's), or "" when it has
    none: where a job started again after its AppMaster died without high availability resumes.
    Raises SavepointError when that checkpoint cannot become a savepoint."""
    from yarnflow.am.checkpoint.storage import job_checkpoint_dir
    from yarnflow.common.config import Options

    folder = job_checkpoint_dir(config.get(Options.CHECKPOINT_DIR.key) or f"{storage_dir.rstrip('/')}/checkpoints",
                                job_id)
    try:
        savepoint = savepoint_of_checkpoint(folder)
    except SavepointError as exc:
        raise SavepointError(f"cannot resume job {job_id} from its checkpoints in {folder}: {exc}") from None
    if savepoint is None:
        log.info("job %s has no retained checkpoint in %s: it starts from the beginning", job_id, folder)
        return ""
    log.info("job %s resumes from its latest checkpoint in %s (savepoint %s)", job_id, folder, savepoint)
    return savepoint


def savepoint_of_checkpoint(path: str) -> str | None:
    """When ``path`` is a retained checkpoint (a ``chk-<n>`` folder or its ``_metadata``; or a
    job's checkpoint folder, meaning its latest complete ``chk-<n>``), write a savepoint of it
    beside it (``<job's checkpoint folder>/savepoint-...``, the state copied as
    ``write_savepoint`` copies it: a RocksDB snapshot as canonical tables, each file marked with
    how it is dealt to another parallelism) and return the savepoint's URL, so a job starts
    from it as from any savepoint (mapped by uid, rescaled) while the checkpoint stays as it was.
    None when ``path`` holds no checkpoint (a savepoint, or nothing: ``read_savepoint`` says
    which). Raises SavepointError when the checkpoint cannot become a savepoint (in-flight data
    of an earlier version, which does not name its input)."""
    fs, root = _folder(path)
    if not fs.exists(posixpath.join(root, METADATA)):  # a job's checkpoint folder: its latest chk-<n>
        try:
            ids = [int(posixpath.basename(p)[4:]) for p in fs.ls(root, detail=False)
                   if posixpath.basename(p).startswith("chk-") and posixpath.basename(p)[4:].isdigit()
                   and fs.exists(posixpath.join(p, METADATA))]
        except OSError:
            return None
        if not ids:
            return None
        root = posixpath.join(root, f"chk-{max(ids)}")
    try:
        with fs.open(posixpath.join(root, METADATA), "r") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("kind") == "savepoint" or not {"subtasks", "vertices"} <= doc.keys():
        return None
    return write_savepoint(str(fs.unstrip_protocol(posixpath.dirname(root))), str(doc.get("job_id", "")), doc)


def read_savepoint(path: str) -> dict[str, Any]:
    """The ``_metadata`` of the savepoint folder ``path`` (any fsspec URL)."""
    fs, root = _folder(path)
    try:
        with fs.open(posixpath.join(root, METADATA), "r") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise SavepointError(f"no savepoint at {path} (no {METADATA} file there)") from None
    except (OSError, ValueError) as exc:
        raise SavepointError(f"cannot read the savepoint at {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "savepoint" or not isinstance(doc.get("operators"), dict):
        raise SavepointError(f"{path} is not a yarnflow savepoint")
    if doc.get("version") != VERSION:
        raise SavepointError(f"the savepoint at {path} has format version {doc.get('version')}, this yarnflow "
                             f"reads version {VERSION}")
    doc["_folder"] = str(fs.unstrip_protocol(root))
    return doc


def dispose_savepoint(path: str) -> bool:
    """Delete the savepoint folder ``path`` (Flink's savepoint disposal): only a yarnflow savepoint
    (``read_savepoint`` says what else it is), never a checkpoint or another folder."""
    read_savepoint(path)
    fs, root = _folder(path)
    fs.rm(root, recursive=True)
    log.info("savepoint %s disposed of", path)
    return True


def restore_metadata(savepoint: dict[str, Any], job_graph: JobGraph, allow_non_restored: bool) -> dict[str, Any]:
    """The savepoint (from ``read_savepoint``) as the checkpoint metadata of ``job_graph``: the
    state of each operator goes to the operator with its uid (wherever it is chained now), its
    files named by absolute URL, dealt to the subtasks of a changed parallelism as the module
    doc says. Raises SavepointError when the state of an operator has no operator to go to
    (unless ``allow_non_restored``), or cannot go to the new parallelism."""
    folder = savepoint["_folder"].rstrip("/")
    placed: dict[str, tuple[Any, int]] = {}
    for v in job_graph.vertices:
        for index, uid in enumerate(v.operator_uids):
            placed[uid] = (v, index)
    operators: dict[str, Any] = savepoint["operators"]
    unclaimed = sorted(uid for uid, op in operators.items() if uid not in placed
                       and any(s["files"] for s in op["subtasks"].values()))
    if unclaimed and not allow_non_restored:
        raise SavepointError(f"the savepoint has state for operators this job does not have (uids: "
                             f"{', '.join(unclaimed)}); give them their uid() again, or start with "
                             "--allow-non-restored-state to drop that state")
    subtasks: dict[str, dict[str, Any]] = {}
    finished: dict[str, dict[str, list[bool]]] = {}
    for uid, op in sorted(operators.items()):
        if uid not in placed:
            continue
        v, index = placed[uid]
        for new, old, entry in _dealt(uid, op, v):
            key = f"{v.vertex_id}#{new}"
            target = subtasks.setdefault(key, {"finished": False, "files": []})
            finished.setdefault(key, {}).setdefault(uid, []).append(bool(entry["finished"]))
            for f in entry["files"]:
                if _goes_to(f, int(op["parallelism"]), v, old, new, job_graph):
                    target["files"].append({"operator_index": index, "name": _restored_name(f, old),
                                            "path": f"{folder}/{f['path']}", "size_bytes": int(f["size_bytes"])})
    for v in job_graph.vertices:  # a subtask is restored as finished when every operator of it had finished
        for sub in range(v.parallelism):
            key = f"{v.vertex_id}#{sub}"
            flags = finished.get(key, {})
            if key in subtasks:
                subtasks[key]["finished"] = all(all(flags.get(uid, [False])) for uid in v.operator_uids)
    splits = {str(placed[uid][0].vertex_id): state for uid, state in (savepoint.get("split_enumerator") or {}).items()
              if uid in placed and placed[uid][1] == 0}
    return {"version": 1, "job_id": str(job_graph.job_id), "checkpoint_id": int(savepoint["checkpoint_id"]),
            "subtasks": subtasks, "split_enumerator": splits, "restored_from_savepoint": folder,
            "vertices": {str(v.vertex_id): {"name": v.name, "parallelism": v.parallelism,
                                            "max_parallelism": v.max_parallelism,
                                            "operator_uids": list(v.operator_uids)} for v in job_graph.vertices}}


def _dealt(uid: str, op: dict[str, Any], v: JobVertex) -> list[tuple[int, int, dict[str, Any]]]:
    """(new subtask, old subtask, old subtask's entry) for every old subtask whose state may go
    to the new subtask; raises SavepointError when the operator's state cannot be rescaled."""
    old_p, new_p = int(op["parallelism"]), v.parallelism
    entries = {int(sub): entry for sub, entry in op["subtasks"].items()}
    modes = {f.get("redistribute") for entry in entries.values() for f in entry["files"]}
    every = UNION in modes or SPLIT in modes  # (every old subtask's files go to every new one)
    if old_p == new_p:
        if UNION in modes:
            return [(new, old, entry) for old, entry in sorted(entries.items()) for new in range(new_p)]
        return [(sub, sub, entry) for sub, entry in sorted(entries.items())]
    if int(op["max_parallelism"]) != v.max_parallelism:
        raise SavepointError(f"operator {uid!r} ('{v.name}') had max parallelism {op['max_parallelism']} in the "
                             f"savepoint and has {v.max_parallelism} now: key groups differ, so its state cannot "
                             "be rescaled (keep pipeline.max-parallelism as it was)")
    fixed = sorted({f["name"] for entry in entries.values() for f in entry["files"]
                    if f.get("redistribute") == "none"})
    if fixed:
        raise SavepointError(f"operator {uid!r} ('{v.name}') ran with parallelism {old_p} in the savepoint and has "
                             f"{new_p} now, but its state ({', '.join(fixed)}) is a position in a per-subtask "
                             "slice of its input that another parallelism slices differently; keep the "
                             f"parallelism at {old_p}")
    return [(new, old, entry) for old, entry in sorted(entries.items()) for new in range(new_p)
            if every or new == old % new_p or _overlap(v.max_parallelism, old_p, old, new_p, new)
            or ((BROADCAST in modes or INFLIGHT_INPUT in modes) and old == new % old_p)]


def _restored_name(f: dict[str, Any], old: int) -> str:
    """A file's name in the restored subtask: in-flight data becomes ``@rin-<input>-<old>-<channel>``
    / ``@rout-<writer>-<old>-<i>`` (``worker/runtime/checkpoints.ChannelState``: rows to replay on
    the input, or to send again through the writer, whatever the channels are now)."""
    name = str(f["name"])
    if f.get("redistribute") in (INFLIGHT_INPUT, INFLIGHT_OUTPUT):
        kind, _, rest = name[1:].partition("-")
        first, _, last = rest.partition("-")
        return f"@r{kind}-{first}-{old}-{last}"
    return name


def _input_partitioner(job_graph: JobGraph, v: JobVertex, input_index: int) -> Partitioner | None:
    return next((e.partitioner for e in job_graph.edges
                 if e.target_vertex_id == v.vertex_id and e.input_index == input_index), None)


def _goes_to(f: dict[str, Any], old_p: int, v: JobVertex, old: int, new: int, job_graph: JobGraph) -> bool:
    """Whether the state file ``f`` of old subtask ``old`` is restored by new subtask ``new``."""
    mode = f.get("redistribute")
    if mode == UNION:
        return True
    if old_p == v.parallelism:
        return old == new
    if mode == INFLIGHT_INPUT:
        # a keyed input's rows go to the subtasks of their key groups (each keeps its own), a
        # broadcast input's to those that take the old subtask's broadcast state, others' i % p
        partitioner = _input_partitioner(job_graph, v, int(f["input"]))
        if partitioner == Partitioner.HASH:
            return _overlap(v.max_parallelism, old_p, old, v.parallelism, new)
        if partitioner == Partitioner.BROADCAST:
            return old == new % old_p
        return new == old % v.parallelism
    if mode == SPLIT:
        return True
    if mode == BROADCAST:
        return old == new % old_p
    if mode == "keyed":
        return _overlap(v.max_parallelism, old_p, old, v.parallelism, new)
    return new == old % v.parallelism


def _overlap(max_parallelism: int, old_p: int, old: int, new_p: int, new: int) -> bool:
    a, b = key_group_range(max_parallelism, old_p, old), key_group_range(max_parallelism, new_p, new)
    return a.start < b.stop and b.start < a.stop
