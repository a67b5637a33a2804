"""Job submission over REST (issue 32): Flink's ``/jars`` endpoints for Python jobs. A job file
(``.py``), or a zip holding one with the modules it imports, is uploaded (``POST /jars/upload``,
multipart, the one file whatever its field's name), listed (``GET /jars``), shown as a plan (``GET|POST
/jars/:jarid/plan``), run (``POST /jars/:jarid/run``: program arguments, parallelism, a
savepoint to start from, configuration keys) and deleted (``DELETE /jars/:jarid``).

Uploads are kept under ``<AppMaster work dir>/jars/<jar id>/`` (Flink's ``web.upload.dir``); a
jar id is ``<32 hex>_<file name>``. A zip is checked before it is unpacked (no absolute path or
``..``, at most ``rest.server.max-content-length`` unpacked) and its job file is its
``__main__.py``, else its one top-level ``.py`` file that calls ``execute()``, else the one
``entryClass`` names.

The job file never runs in the AppMaster: ``yarnflow run --detached`` (or ``yarnflow plan``)
runs it in a process of its own against this cluster, as application mode runs main(), so its
imports, memory and errors are its own; the job id it submitted is the answer, its error
output (the job file's traceback) the error when it fails."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from typing import TYPE_CHECKING, Any, Callable

from flask import Response, jsonify, request

from yarnflow.am.rest.api_error import ApiError
from yarnflow.common.artifacts import leaves_folder
from yarnflow.common.config import Options

if TYPE_CHECKING:
    from yarnflow.am.rest.server import RestServer

log = logging.getLogger(__name__)
_ID = re.compile(r"[0-9a-f]{32}_[A-Za-z0-9._-]{1,200}")
_SUBMITTED = re.compile(r"Submitted job .* \(([0-9a-f]{32})\) to ")
_CONFIG_KEY = re.compile(r"[A-Za-z0-9_.-]{1,200}")
#: how long a job file may take to submit its job (or to show its plan)
RUN_TIMEOUT_S = 300.0
#: the lines of a failed job file's error output given back
ERROR_LINES = 40


def _text(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read(1 << 20)
    except OSError:
        return ""


class JarApi:
    def __init__(self, rest: RestServer) -> None:
        self._r = rest
        self.folder = os.path.join(rest.appmaster.work_dir, "jars")

    def routes(self) -> list[tuple[str, Callable[..., Any], tuple[str, ...]]]:
        if not self._r.configuration[Options.WEB_SUBMIT]:
            return []  # (404, as in Flink with web.submit.enable off)
        return [("/jars", self.list_jars, ("GET",)), ("/jars/upload", self.upload, ("POST",)),
                ("/jars/<jarid>", self.delete, ("DELETE",)), ("/jars/<jarid>/plan", self.plan, ("GET", "POST")),
                ("/jars/<jarid>/run", self.run, ("POST",))]

    # -- storage ---------------------------------------------------------------------------------
    def _dir(self, jarid: str) -> str:
        if not _ID.fullmatch(jarid):
            raise ApiError(400, f"{jarid[:100]!r} is not a jar id (as /jars/upload answered: <32 hex>_<file name>)")
        path = os.path.join(self.folder, jarid)
        if not os.path.isdir(path):
            raise ApiError(404, f"no uploaded job {jarid}")
        return path

    def upload(self) -> Response:
        limit = self._r.configuration[Options.REST_MAX_CONTENT_LENGTH]
        if request.content_length is None:
            raise ApiError(411, "an upload needs its Content-Length")
        if request.content_length > limit:
            raise ApiError(413, f"the upload is over rest.server.max-content-length ({limit} bytes)")
        upload = self._uploaded_file()
        name = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(upload.filename))[:200]
        if not name.endswith((".py", ".zip")):
            raise ApiError(400, f"{name!r}: upload a Python job file (.py) or a zip with one and its modules (.zip)")
        jarid = f"{uuid.uuid4().hex}_{name}"
        folder = os.path.join(self.folder, jarid)
        os.makedirs(folder)
        try:
            path = os.path.join(folder, name)
            upload.save(path)
            if name.endswith(".zip"):
                self._unpack(path, os.path.join(folder, "job"))
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return jsonify({"filename": os.path.join(self.folder, jarid), "status": "success"})

    @staticmethod
    def _uploaded_file() -> Any:
        """The one file of the multipart upload, whatever its field's name (Flink takes it so:
        its web UI names the field ``jarfile``, other clients ``file``)."""
        files = [f for _, f in request.files.items(multi=True) if f.filename]
        if "jarfile" in request.files and request.files["jarfile"].filename:
            return request.files["jarfile"]
        if len(files) != 1:
            raise ApiError(400, "send one job file as a multipart form upload (curl -F jarfile=@job.py)"
                           if not files else f"send one job file, not {len(files)} (curl -F jarfile=@job.py)")
        return files[0]

    def _unpack(self, path: str, into: str) -> None:
        limit = self._r.configuration[Options.REST_MAX_CONTENT_LENGTH]
        try:
            with zipfile.ZipFile(path) as zf:
                bad = next((n for n in zf.namelist() if leaves_folder(n)), None)
                if bad is not None:
                    raise ApiError(400, f"the zip holds a path outside its folder: {bad[:200]!r}")
                if sum(i.file_size for i in zf.infolist()) > limit:
                    raise ApiError(413, f"the zip unpacks to more than rest.server.max-content-length ({limit} bytes)")
                zf.extractall(into)
        except zipfile.BadZipFile as exc:
            raise ApiError(400, f"not a zip file: {exc}") from None
        if not self._entries(into):
            raise ApiError(400, "the zip holds no Python job file (__main__.py, or a .py file at its top)")

    @staticmethod
    def _entries(job_dir: str) -> list[str]:
        if not os.path.isdir(job_dir):
            return []
        names = sorted(n for n in os.listdir(job_dir) if n.endswith(".py") and os.path.isfile(os.path.join(job_dir, n)))
        if "__main__.py" in names:
            return ["__main__.py"]
        jobs = [n for n in names if "execute(" in _text(os.path.join(job_dir, n))]  # (not its helper modules)
        return jobs or names

    def list_jars(self) -> Response:
        files: list[tuple[int, dict[str, Any]]] = []
        for jarid in sorted(os.listdir(self.folder)) if os.path.isdir(self.folder) else []:
            if not _ID.fullmatch(jarid):
                continue
            name = jarid.split("_", 1)[1]
            entries = [name] if name.endswith(".py") else self._entries(os.path.join(self.folder, jarid, "job"))
            uploaded = int(os.path.getmtime(os.path.join(self.folder, jarid)) * 1000)
            files.append((uploaded, {"id": jarid, "name": name, "uploaded": uploaded,
                                     "entry": [{"name": e, "description": None} for e in entries]}))
        files.sort(key=lambda f: -f[0])  # newest first
        return jsonify({"address": self._r.url, "files": [f for _, f in files]})

    def delete(self, jarid: str) -> Response:
        shutil.rmtree(self._dir(jarid), ignore_errors=True)
        return jsonify({})

    # -- plan and run ----------------------------------------------------------------------------
    def _request(self) -> dict[str, Any]:
        """The run's parameters: the JSON body's, or the query's (Flink takes both)."""
        body = self._r.body() if request.get_data() else {}
        q = request.args
        args = body.get("programArgsList")
        if args is None:
            raw = body.get("programArgs", q.get("programArg", q.get("program-args", "")))
            if not isinstance(raw, str):
                raise ApiError(400, "programArgs must be a string")
            args = raw.replace(",", " ").split() if "programArg" in q and "programArgs" not in body else raw.split()
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ApiError(400, "programArgsList must be a list of strings")
        parallelism = body.get("parallelism", q.get("parallelism"))
        if parallelism is not None:
            if isinstance(parallelism, str) and parallelism.isdigit():
                parallelism = int(parallelism)
            if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
                raise ApiError(400, "parallelism must be a positive integer")
        savepoint = body.get("savepointPath", q.get("savepointPath"))
        if savepoint is not None and not isinstance(savepoint, str):
            raise ApiError(400, "savepointPath must be a string")
        allow = body.get("allowNonRestoredState", q.get("allowNonRestoredState", False))
        if isinstance(allow, str):
            allow = allow.lower() == "true"
        if not isinstance(allow, bool):
            raise ApiError(400, "allowNonRestoredState must be true or false")
        config = body.get("flinkConfiguration") or {}
        if not isinstance(config, dict) or not all(isinstance(k, str) and _CONFIG_KEY.fullmatch(k) and
                                                   isinstance(v, (str, int, float, bool)) for k, v in config.items()):
            raise ApiError(400, "flinkConfiguration must map configuration keys to values")
        entry = body.get("entryClass", q.get("entry-class"))
        if entry is not None and (not isinstance(entry, str) or leaves_folder(entry) or not entry.endswith(".py")):
            raise ApiError(400, "entryClass must name the job's .py file inside the uploaded zip")
        return {"args": args, "parallelism": parallelism, "savepoint": savepoint, "allow": allow,
                "config": {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in config.items()},
                "entry": entry}

    def _job_file(self, folder: str, jarid: str, entry: str | None) -> tuple[str, str]:
        """(the job file, the folder it runs in) of an upload."""
        name = jarid.split("_", 1)[1]
        if name.endswith(".py"):
            return os.path.join(folder, name), folder
        job_dir = os.path.join(folder, "job")
        entries = self._entries(job_dir)
        chosen = entry or (entries[0] if len(entries) == 1 else None)
        if chosen is None:
            raise ApiError(400, f"the zip holds several job files ({', '.join(entries)}): name one as entryClass")
        path = os.path.join(job_dir, chosen)
        if not os.path.isfile(path):
            raise ApiError(400, f"the zip holds no {chosen!r}")
        return path, os.path.dirname(path)

    def _yarnflow(self, command: list[str], cwd: str) -> str:
        """Run ``yarnflow <command>`` against this cluster; its standard output, or an ApiError
        with the end of its error output."""
        try:
            proc = subprocess.run([sys.executable, "-m", "yarnflow", *command], cwd=cwd, capture_output=True,
                                  text=True, errors="replace", timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL,
                                  env={**os.environ, "YARNFLOW_PROGRESS": "0"})
        except subprocess.TimeoutExpired:
            raise ApiError(400, f"the job file did not submit a job within {RUN_TIMEOUT_S:.0f} s") from None
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.rstrip().splitlines()[-ERROR_LINES:])
            raise ApiError(400, f"the job file failed (exit status {proc.returncode}):\n{tail}")
        return proc.stdout + proc.stderr

    @staticmethod
    def _options(req: dict[str, Any]) -> list[str]:
        out = ["-p", str(req["parallelism"])] if req["parallelism"] else []
        for k, v in req["config"].items():
            out += ["-D", f"{k}={v}"]
        return out

    def plan(self, jarid: str) -> Response:
        folder = self._dir(jarid)
        req = self._request()
        job_file, cwd = self._job_file(folder, jarid, req["entry"])
        out = self._yarnflow(["plan", *self._options(req), job_file, *req["args"]], cwd)
        try:
            return jsonify(json.loads(out[out.index("{"):out.rindex("}") + 1]))
        except ValueError:
            raise ApiError(400, "the job file's plan could not be read") from None

    def run(self, jarid: str) -> Response:
        folder = self._dir(jarid)
        req = self._request()
        job_file, cwd = self._job_file(folder, jarid, req["entry"])
        command = ["run", "--target", "remote", "--address", self._r.appmaster.address, "--detached", "--no-progress",
                   *self._options(req)]
        if req["savepoint"]:
            command += ["-s", req["savepoint"]]
            if req["allow"]:
                command.append("--allow-non-restored-state")
        started = time.monotonic()
        out = self._yarnflow([*command, job_file, *req["args"]], cwd)
        submitted = _SUBMITTED.findall(out)
        if not submitted:
            raise ApiError(400, "the job file ran without submitting a job (it never called execute())")
        log.info("REST: %s submitted job %s in %.1f s", jarid, ", ".join(submitted), time.monotonic() - started)
        return jsonify({"jobid": submitted[0]})
