"""The collect protocol: how the rows of ``collect()`` / ``print()`` sinks reach the client.

Three sides use it, and only through this module:

- a worker's collect sink writes Arrow IPC files (``open_writer``) into
  ``collect_dir(job storage dir, sink uid)``, under hidden names while its subtask runs, renamed
  to ``part-<subtask>.arrow`` when the subtask finishes; with checkpoints it is two-phase, as
  the file sinks: ``part-<subtask>-<n>.arrow`` files are committed when the checkpoint that
  covers them completes (and at the end of input), so the rows of a failed attempt after its
  last completed checkpoint are never seen (see ``worker/operators/sinks.py``);
- the JobMaster, once the job is FINISHED, lists the committed files of every collect sink
  (``list_collected``) into the JobResult;
- the client reads a sink's committed files back as one table (``read_collected``), in
  the order ``sort_parts`` gives (by subtask, then part number).

A file is committed when its name is visible: names starting with ``.`` or ``_`` are staging
files of running (or failed) attempts and are never listed or read.
"""

from __future__ import annotations

import logging
import posixpath
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.ipc as ipc

__all__ = ["EXTENSION", "collect_dir", "collect_root", "is_committed", "list_collected", "open_writer",
           "read_collected", "sort_parts"]

log = logging.getLogger(__name__)

EXTENSION = ".arrow"


def collect_root(job_storage_dir: str) -> str:
    """The folder holding one folder per collect sink of the job."""
    return f"{job_storage_dir.rstrip('/')}/collect"


def collect_dir(job_storage_dir: str, uid: str) -> str:
    """The folder of the collect sink ``uid``."""
    return f"{collect_root(job_storage_dir)}/{uid}"


def is_committed(path: str) -> bool:
    """Whether ``path`` names a committed file (not a hidden staging file)."""
    return not posixpath.basename(path).startswith((".", "_"))


def _part_key(path: str) -> tuple[Any, ...]:
    """``part-00001-10.arrow`` -> (0, "part", 1, 10): numbers compare as numbers."""
    name = posixpath.basename(path)
    stem = name[:-len(EXTENSION)] if name.endswith(EXTENSION) else name
    pieces = stem.split("-")
    if all(p.isdigit() for p in pieces[1:]):
        return (0, pieces[0], *(int(p) for p in pieces[1:]))
    return (1, name)


def sort_parts(paths: list[str]) -> list[str]:
    """``paths`` by subtask, then part number (``part-0-10`` after ``part-0-9``), others last by name."""
    return sorted(paths, key=_part_key)


def open_writer(fh: Any, schema: pa.Schema) -> Any:
    """A writer of record batches in the collect format onto the open binary file ``fh``."""
    return ipc.new_file(fh, schema)


def list_collected(job_storage_dir: str) -> dict[str, list[str]]:
    """The committed files of every collect sink of the job: sink uid -> sorted file URLs.
    A storage error is logged and gives what could be listed (the JobMaster must still end
    the job)."""
    out: dict[str, list[str]] = {}
    try:
        fs, root = fsspec.core.url_to_fs(collect_root(job_storage_dir))
        if not fs.exists(root):
            return out
        for d in fs.ls(root, detail=False):
            out[posixpath.basename(d)] = [fs.unstrip_protocol(f) for f in sort_parts(fs.ls(d, detail=False))
                                          if is_committed(f)]
    except OSError as exc:
        log.warning("listing collected results under %s: %s", job_storage_dir, exc)
    return out


def read_collected(job_storage_dir: str, uid: str) -> pa.Table | None:
    """The rows the collect sink ``uid`` committed, or None when it committed nothing.
    Raises ``OSError`` when the storage cannot be read."""
    fs, directory = fsspec.core.url_to_fs(collect_dir(job_storage_dir, uid))
    if not fs.exists(directory):
        return None
    tables = []
    for f in sort_parts(fs.ls(directory, detail=False)):
        if not is_committed(f):
            continue
        with fs.open(f, "rb") as fh:
            tables.append(ipc.open_file(pa.BufferReader(fh.read())).read_all())
    return pa.concat_tables(tables, promote_options="default") if tables else None
