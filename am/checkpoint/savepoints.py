"""Savepoints: a completed checkpoint copied into a folder of its own, self-contained and keyed
by operator uid, so that another JobGraph (the same pipeline, resubmitted, possibly changed
around its uids) can start from it, from wherever the folder was moved.

Layout::

    <target dir>/savepoint-<job id prefix>-<random>/_metadata                JSON, written last
    <target dir>/savepoint-.../<operator uid>/<subtask>/<state name>.arrow  the state tables

``_metadata``: ``{"version", "kind": "savepoint", "job_id", "checkpoint_id", "operators": {uid:
{"parallelism", "max_parallelism", "subtasks": {index: {"finished", "files": [{"name", "path"
(relative to the folder), "size_bytes"}]}}}}, "split_enumerator": {source uid: splits}}``. The
state tables are the backend-independent Arrow tables every checkpoint holds. Every function
here does I/O: the JobMaster shell calls them off its main thread."""

from __future__ import annotations

import json
import posixpath
import uuid
from typing import Any

import fsspec

from yarnflow.am.checkpoint.storage import METADATA
from yarnflow.common.errors import YarnflowError
from yarnflow.common.messages import JobGraph

VERSION = 1


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
                uid = v["operator_uids"][int(f["operator_index"])]
                rel = f"{uid}/{index}/{f['name']}.arrow"
                dest = posixpath.join(folder, rel)
                fs.makedirs(posixpath.dirname(dest), exist_ok=True)
                with fsspec.open(f["path"], "rb") as src, fs.open(dest, "wb") as dst:
                    while chunk := src.read(1 << 22):
                        dst.write(chunk)
                operators[uid]["subtasks"][index]["files"].append(
                    {"name": f["name"], "path": rel, "size_bytes": int(f["size_bytes"])})
        splits = {vertices[vertex]["operator_uids"][0]: state
                  for vertex, state in (metadata.get("split_enumerator") or {}).items() if vertex in vertices}
        doc = {"version": VERSION, "kind": "savepoint", "job_id": job_id,
               "checkpoint_id": int(metadata["checkpoint_id"]), "operators": operators, "split_enumerator": splits}
        tmp = posixpath.join(folder, f".{METADATA}.inprogress")
        with fs.open(tmp, "w") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
        fs.mv(tmp, posixpath.join(folder, METADATA))
    except (OSError, KeyError, IndexError, ValueError) as exc:
        raise SavepointError(f"writing the savepoint to {target_dir} failed: {type(exc).__name__}: {exc}") from exc
    return str(fs.unstrip_protocol(folder))


def read_savepoint(path: str) -> dict[str, Any]:
    """The ``_metadata`` of the savepoint folder ``path`` (any fsspec URL)."""
    fs, root = fsspec.core.url_to_fs(path)
    root = root.rstrip("/")
    if root.endswith(f"/{METADATA}"):
        root = root[: -len(METADATA) - 1]
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


def restore_metadata(savepoint: dict[str, Any], job_graph: JobGraph, allow_non_restored: bool) -> dict[str, Any]:
    """The savepoint (from ``read_savepoint``) as the checkpoint metadata of ``job_graph``: the
    state of each operator goes to the operator with its uid (wherever it is chained now), its
    files named by absolute URL. Raises SavepointError when the state of an operator has no
    operator to go to (unless ``allow_non_restored``) or an operator's parallelism changed."""
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
    finished: dict[str, list[bool]] = {}
    for uid, op in sorted(operators.items()):
        if uid not in placed:
            continue
        v, index = placed[uid]
        if int(op["parallelism"]) != v.parallelism:
            raise SavepointError(f"operator {uid!r} ('{v.name}') ran with parallelism {op['parallelism']} in the "
                                 f"savepoint and has {v.parallelism} now: rescaling on restore is not supported "
                                 "yet; keep the parallelism")
        for sub, entry in op["subtasks"].items():
            key = f"{v.vertex_id}#{int(sub)}"
            target = subtasks.setdefault(key, {"finished": False, "files": []})
            finished.setdefault(key, []).append(bool(entry["finished"]))
            for f in entry["files"]:
                target["files"].append({"operator_index": index, "name": f["name"],
                                        "path": f"{folder}/{f['path']}", "size_bytes": int(f["size_bytes"])})
    for v in job_graph.vertices:  # a subtask is restored as finished when every operator of it had finished
        for sub in range(v.parallelism):
            key = f"{v.vertex_id}#{sub}"
            flags = finished.get(key, [])
            if key in subtasks:
                subtasks[key]["finished"] = len(flags) == len(v.operator_uids) and all(flags)
    splits = {str(placed[uid][0].vertex_id): state for uid, state in (savepoint.get("split_enumerator") or {}).items()
              if uid in placed and placed[uid][1] == 0}
    return {"version": 1, "job_id": str(job_graph.job_id), "checkpoint_id": int(savepoint["checkpoint_id"]),
            "subtasks": subtasks, "split_enumerator": splits, "restored_from_savepoint": folder,
            "vertices": {str(v.vertex_id): {"name": v.name, "parallelism": v.parallelism,
                                            "max_parallelism": v.max_parallelism,
                                            "operator_uids": list(v.operator_uids)} for v in job_graph.vertices}}
