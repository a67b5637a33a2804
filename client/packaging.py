"""The job artifact (Flink's "jar"): a zip of the user's job file and the pickled operator
chains, content-addressed by sha256 and stored under the cluster's storage dir, where every
TaskExecutor (and a standby AppMaster) can fetch it."""

from __future__ import annotations

import dataclasses
import io
import os
import site
import sys
import sysconfig
import types
import zipfile

import cloudpickle

from yarnflow.common.errors import JobDefinitionError
from yarnflow.compiler import CompiledJob
from yarnflow.common.artifacts import chain_entry, source_entry, store_artifact
from yarnflow.worker.operators.base import SourceOperator


def _user_modules() -> list[types.ModuleType]:
    """Modules of the user's own code (not the standard library, not installed packages, not
    yarnflow): the TaskExecutors cannot import them, so their functions travel by value."""
    roots = {os.path.realpath(p) for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib",
                                                                              "platlib")}}
    roots |= {os.path.realpath(p) for p in site.getsitepackages() + [site.getusersitepackages()]}
    found = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not path or name == "__main__" or name.split(".")[0] == "yarnflow" or not path.endswith(".py"):
            continue
        real = os.path.realpath(path)
        if any(real.startswith(root + os.sep) for root in roots):
            continue
        found.append(module)
    return found


def build_artifact(job: CompiledJob, job_file: str | None) -> bytes:
    modules = _user_modules()
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    try:
        return _build(job, job_file)
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)


def _build(job: CompiledJob, job_file: str | None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for vertex_id, chain in sorted(job.chains.items()):
            try:
                data = cloudpickle.dumps(chain)
            except Exception as exc:
                names = ", ".join(op.name for op in chain)
                raise JobDefinitionError(f"cannot serialise the operators [{names}]: {type(exc).__name__}: {exc}"
                                         ) from exc
            info = zipfile.ZipInfo(chain_entry(vertex_id), date_time=(1980, 1, 1, 0, 0, 0))
            zf.writestr(info, data)
            head = chain[0]
            if isinstance(head, SourceOperator) and head.dynamic_splits:
                info = zipfile.ZipInfo(source_entry(vertex_id), date_time=(1980, 1, 1, 0, 0, 0))
                zf.writestr(info, cloudpickle.dumps(head))
        if job_file and os.path.isfile(job_file):
            info = zipfile.ZipInfo(f"src/{os.path.basename(job_file)}", date_time=(1980, 1, 1, 0, 0, 0))
            with open(job_file, "rb") as fh:
                zf.writestr(info, fh.read())
    return buf.getvalue()


def upload_artifact(job: CompiledJob, job_file: str | None, storage_dir: str) -> CompiledJob:
    """Store the artifact and return the job with the JobGraph pointing at it."""
    uri, digest = store_artifact(build_artifact(job, job_file), storage_dir)
    jg = dataclasses.replace(job.job_graph, artifact_uri=uri, artifact_sha256=digest)
    return dataclasses.replace(job, job_graph=jg)
