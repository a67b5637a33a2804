"""The job artifact (Flink's "jar"): a zip of the user's job file and the pickled operator
chains, content-addressed by sha256 and stored under the cluster's storage dir, where every
TaskExecutor (and a standby AppMaster) can fetch it."""

from __future__ import annotations

import collections
import dataclasses
import io
import pickle
import os
import site
import sys
import sysconfig
import types
import zipfile

from typing import Any

import cloudpickle

from yarnflow.common.errors import JobDefinitionError
from yarnflow.compiler import CompiledJob
from yarnflow.common.artifacts import chain_entry, source_entry, store_artifact
from yarnflow.worker.operators.base import SourceOperator


def upload_to_appmaster(data: bytes, web_url: str, rest: Any = None) -> tuple[str, str]:
    """Stream the artifact to the AppMaster's REST API (``POST /artifacts``); its URI and sha256."""
    import hashlib
    import json
    import urllib.error
    import urllib.request

    digest = hashlib.sha256(data).hexdigest()
    request = urllib.request.Request(f"{web_url.rstrip('/')}/artifacts?sha256={digest}", data=data, method="POST",
                                     headers={"Content-Type": "application/octet-stream",
                                              **(rest.headers if rest is not None else {})})
    try:
        with urllib.request.urlopen(request, timeout=300,  # noqa: S310 - the cluster's own URL
                                    context=rest.context if rest is not None else None) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            why = "; ".join(json.loads(exc.read()).get("errors", []))
        except ValueError:
            why = str(exc)
        raise OSError(f"the AppMaster refused the job artifact (HTTP {exc.code}): {why}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise OSError(f"uploading the job artifact to {web_url} failed: {exc}") from None
    return str(body["uri"]), digest


def _user_modules() -> list[types.ModuleType]:
    """Modules of the user's own code (not the standard library, not installed packages, not
    yarnflow): the TaskExecutors cannot import them, so their functions travel by value.

    Installed means: under one of this interpreter's site directories, under any other
    ``site-packages``/``dist-packages`` folder on ``sys.path`` (one lent by a .pth file or
    PYTHONPATH), or owned by an installed distribution. Pickling an installed library by value
    would copy it (or recurse through it) instead of importing it where the job runs."""
    roots = {os.path.realpath(p) for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib",
                                                                              "platlib")}}
    roots |= {os.path.realpath(p) for p in site.getsitepackages() + [site.getusersitepackages()]}
    roots |= {os.path.realpath(p) for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")}
    found = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not path or name == "__main__" or name.split(".")[0] == "yarnflow" or not path.endswith(".py"):
            continue
        real = os.path.realpath(path)
        if any(real.startswith(root + os.sep) for root in roots):
            continue
        found.append(module)
    if found:  # only then: reading every distribution's metadata costs some 50 ms
        import importlib.metadata

        installed = importlib.metadata.packages_distributions()
        found = [m for m in found if m.__name__.split(".")[0] not in installed]
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


def _code_reduce(code: types.CodeType) -> Any:
    """cloudpickle's reduction of a code object, with its file name kept: cloudpickle 3 writes
    "<dynamic-code>" instead (for byte-identical pickles), so the traceback of a job's function
    on a TaskExecutor named no file (issue 32); the line numbers were kept either way."""
    ctor, args = _CLOUDPICKLE_CODE(code)
    if "<dynamic-code>" in args and code.co_filename != "<dynamic-code>":
        at = args.index("<dynamic-code>")
        args = (*args[:at], code.co_filename, *args[at + 1:])
    return ctor, args


_CLOUDPICKLE_CODE = cloudpickle.Pickler.dispatch_table[types.CodeType]


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # (cloudpickle is untyped)
    dispatch_table = collections.ChainMap({types.CodeType: _code_reduce}, cloudpickle.Pickler.dispatch_table)


def dumps(obj: Any) -> bytes:
    """``cloudpickle.dumps`` keeping the file names of the code it pickles (``_code_reduce``)."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.DEFAULT_PROTOCOL).dump(obj)
    return buf.getvalue()


def _build(job: CompiledJob, job_file: str | None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for vertex_id, chain in sorted(job.chains.items()):
            try:
                data = dumps(chain)
            except Exception as exc:
                names = ", ".join(op.name for op in chain)
                raise JobDefinitionError(f"cannot serialise the operators [{names}]: {type(exc).__name__}: {exc}"
                                         ) from exc
            info = zipfile.ZipInfo(chain_entry(vertex_id), date_time=(1980, 1, 1, 0, 0, 0))
            zf.writestr(info, data)
            head = chain[0]
            if isinstance(head, SourceOperator) and head.dynamic_splits:
                info = zipfile.ZipInfo(source_entry(vertex_id), date_time=(1980, 1, 1, 0, 0, 0))
                zf.writestr(info, dumps(head))
        if job_file and os.path.isfile(job_file):
            info = zipfile.ZipInfo(f"src/{os.path.basename(job_file)}", date_time=(1980, 1, 1, 0, 0, 0))
            with open(job_file, "rb") as fh:
                zf.writestr(info, fh.read())
    return buf.getvalue()


def upload_artifact(job: CompiledJob, job_file: str | None, storage_dir: str, web_url: str = "",
                    how: str = "auto", rest: Any = None) -> CompiledJob:
    """Store the artifact and return the job with the JobGraph pointing at it: streamed to the
    AppMaster at ``web_url`` (Flink's BlobServer: a client on another host than the AppMaster
    may see none of its storage), or written into ``storage_dir`` by the client itself.
    ``how``: ``appmaster``, ``storage``, or ``auto``: through the AppMaster when the cluster
    serves its REST API, else (or when that upload fails: too big for
    ``rest.server.max-content-length``, say) into the storage dir."""
    data = build_artifact(job, job_file)
    if how == "appmaster" and not web_url:
        raise JobDefinitionError("client.artifact-upload is appmaster, but the cluster serves no REST API "
                                 "(rest.enabled: false)")
    if how == "storage" or not web_url:
        uri, digest = store_artifact(data, storage_dir)
    else:
        try:
            uri, digest = upload_to_appmaster(data, web_url, rest)
        except OSError as exc:
            if how == "appmaster":
                raise
            print(f"{exc}: writing the job artifact into the storage dir {storage_dir} instead "
                  "(client.artifact-upload: auto)", file=sys.stderr)
            uri, digest = store_artifact(data, storage_dir)
    jg = dataclasses.replace(job.job_graph, artifact_uri=uri, artifact_sha256=digest)
    return dataclasses.replace(job, job_graph=jg)
