"""The history server (Flink's HistoryServer, issue 32): ``yarnflow history-server`` serves the
jobs the AppMasters archived (``archive.py``) into ``historyserver.archive.fs.dir`` with the
same REST paths and the same web UI as an AppMaster, so the jobs of ended per-job applications
stay inspectable.

It reads every archive folder (any fsspec URL) at start and then every
``historyserver.archive.fs.refresh-interval``: a new archive appears, a deleted one goes. It
serves what the archives hold, read-only: ``/jobs/overview`` and ``/jobs`` list every archived
job (newest first), ``/overview`` counts them, each job's paths answer as its AppMaster did,
anything else is a 404 JSON error; ``/config`` says ``web-history`` (the UI hides what does not
apply: no cancel, no submit). It has no authentication: it binds to
``historyserver.web.address`` (127.0.0.1 by default)."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import fsspec
from flask import Flask, Response, jsonify, request, send_from_directory
from werkzeug.serving import BaseWSGIServer, make_server

from yarnflow.am.rest.access_log import AccessLogHandler
from yarnflow.common.config import Configuration, Options
from yarnflow.common.version import __version__

log = logging.getLogger(__name__)


class Archives:
    """The archived jobs of some folders: job id -> (path -> answer text)."""

    def __init__(self, folders: list[str]) -> None:
        self.folders = folders
        self.jobs: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def refresh(self) -> int:
        """Read the folders again; returns how many jobs they hold."""
        found: dict[str, dict[str, str]] = {}
        for folder in self.folders:
            try:
                fs, root = fsspec.core.url_to_fs(folder)
                names = fs.ls(root, detail=False) if fs.exists(root) else []
            except OSError as exc:
                log.warning("history server: cannot list %s: %s", folder, exc)
                continue
            for path in names:
                job_id = path.rstrip("/").rsplit("/", 1)[-1]
                if job_id.startswith("."):
                    continue  # (being written)
                known = self.jobs.get(job_id)
                if known is not None:
                    found[job_id] = known
                    continue
                try:
                    with fs.open(path, "r") as fh:
                        doc = json.load(fh)
                    found[job_id] = {e["path"]: e["json"] for e in doc["archive"]}
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    log.warning("history server: %s is not a job archive (%s): skipped", path, exc)
        with self._lock:
            added = set(found) - set(self.jobs)
            self.jobs = found
        if added:
            log.info("history server: %d new job archive(s), %d in all", len(added), len(found))
        return len(found)

    def answer(self, path: str) -> str | None:
        parts = path.split("/")
        if len(parts) < 3 or parts[1] != "jobs":
            return None
        with self._lock:
            return self.jobs.get(parts[2].lower(), {}).get(path)

    def overviews(self) -> list[dict[str, Any]]:
        with self._lock:
            entries = [json.loads(j["/jobs/overview"])["jobs"][0] for j in self.jobs.values() if "/jobs/overview" in j]
        return sorted(entries, key=lambda e: -int(e.get("start-time") or 0))


def history_app(archives: Archives, refresh_ms: int) -> Flask:
    from yarnflow.am.rest.server import WEB_DIR

    app = Flask("yarnflow.history", static_folder=str(WEB_DIR), static_url_path="/web")
    app.json.sort_keys = False  # type: ignore[attr-defined]

    def error(status: int, message: str) -> tuple[Response, int]:
        return jsonify(errors=[message]), status

    @app.route("/")
    def index() -> Response:
        return send_from_directory(WEB_DIR, "index.html")

    @app.route("/<path:path>", methods=["GET", "POST", "PATCH", "PUT", "DELETE"])
    def serve(path: str) -> Any:
        path = "/" + path.removeprefix("v1/")
        if request.method != "GET":
            return error(405, "the history server is read-only")
        if path == "/config":
            return jsonify({"refresh-interval": refresh_ms, "timezone-name": "UTC", "timezone-offset": 0,
                            "flink-version": __version__, "flink-revision": f"yarnflow {__version__}",
                            "features": {"web-submit": False, "web-cancel": False, "web-history": True},
                            "cluster-id": "history server", "leader": True})
        if path == "/jobs/overview":
            return jsonify(jobs=archives.overviews())
        if path == "/jobs":
            return jsonify(jobs=[{"id": e["jid"], "status": e["state"]} for e in archives.overviews()])
        if path == "/overview":
            states = [e["state"] for e in archives.overviews()]
            return jsonify({"taskmanagers": 0, "slots-total": 0, "slots-available": 0, "jobs-running": 0,
                            "jobs-finished": states.count("FINISHED"), "jobs-cancelled": states.count("CANCELED"),
                            "jobs-failed": states.count("FAILED"), "flink-version": __version__,
                            "flink-commit": f"yarnflow {__version__}"})
        if path == "/taskmanagers":
            return jsonify(taskmanagers=[])  # (an archive has no cluster)
        text = archives.answer(path)
        if text is None:
            return error(404, f"{path[:200]} is not in the job archives")
        return Response(text, mimetype="application/json")

    return app


class HistoryServer:
    def __init__(self, config: Configuration) -> None:
        folders = [f.strip() for f in config[Options.HISTORY_DIRS].split(",") if f.strip()]
        if not folders:
            from yarnflow.common.errors import ConfigurationError

            raise ConfigurationError("the history server needs historyserver.archive.fs.dir: the folder(s) the "
                                     "AppMasters archive into (their jobmanager.archive.fs.dir)")
        self.archives = Archives(folders)
        self._refresh_s = config[Options.HISTORY_REFRESH] / 1000.0
        self._stopped = threading.Event()
        self.app = history_app(self.archives, config[Options.HISTORY_REFRESH])
        self._server: BaseWSGIServer = make_server(config[Options.HISTORY_ADDRESS], config[Options.HISTORY_PORT],
                                                   self.app, threaded=True, request_handler=AccessLogHandler)
        self.url = f"http://{config[Options.HISTORY_ADDRESS]}:{self._server.port}"

    def serve(self) -> None:
        """Serve until ``stop()``: archives read now and every refresh interval."""
        self.archives.refresh()
        threading.Thread(target=self._server.serve_forever, name="history-server", daemon=True).start()
        log.info("history server at %s, reading %s", self.url, ", ".join(self.archives.folders))
        while not self._stopped.wait(self._refresh_s):
            self.archives.refresh()
        self._server.shutdown()
        self._server.server_close()

    def stop(self) -> None:
        self._stopped.set()
