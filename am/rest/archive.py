"""Job archives for the history server (Flink's HistoryServerArchivist, issue 32).

When a job ends FINISHED, FAILED or CANCELED, the AppMaster asks its own REST API (in process,
through Flask's test client: the very answers a user got) for every read-only path of the job
and writes them, as Flink's archives are, to ``<jobmanager.archive.fs.dir>/<job id>``:
``{"archive": [{"path": "/jobs/<id>", "json": "<the answer>"}, ...]}``, one JSON file written
to a temporary name and renamed into place, so a reader never sees half of one. The history
server (``history.py``) serves them after the AppMaster (a per-job application's) is gone."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from typing import TYPE_CHECKING, Any

import fsspec

if TYPE_CHECKING:
    from flask import Flask

log = logging.getLogger(__name__)

#: the paths of a job's archive besides its vertices'
JOB_PATHS = ("", "/status", "/plan", "/exceptions", "/checkpoints", "/config", "/jobmanager/config",
             "/checkpoints/config", "/execution-result", "/accumulators", "/spark")
VERTEX_PATHS = ("", "/backpressure", "/taskmanagers", "/watermarks", "/metrics", "/subtasktimes")


class JobArchivist:
    def __init__(self, app: Flask, archive_dir: str, token: str | None) -> None:
        self._app = app
        self._dir = archive_dir.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._lock = threading.Lock()
        self._pending: list[threading.Thread] = []

    def archive(self, job_id: str) -> None:
        """Archive the ended job ``job_id`` (on a thread of its own: its answers come from the
        Dispatcher, which calls this on its main thread)."""
        t = threading.Thread(target=self._write, args=(str(job_id),), name=f"archive-{job_id}", daemon=True)
        with self._lock:
            self._pending = [p for p in self._pending if p.is_alive()] + [t]
        t.start()

    def flush(self, timeout_s: float) -> None:
        """Wait (up to ``timeout_s``) for the archives being written: the AppMaster is stopping."""
        with self._lock:
            pending = list(self._pending)
        for t in pending:
            t.join(timeout_s)

    def entries(self, job_id: str) -> list[dict[str, str]]:
        """``[{"path", "json"}]``: the job's answers, as its REST API gives them now."""
        client = self._app.test_client()
        out: list[dict[str, str]] = []

        def take(path: str) -> Any:
            response = client.get(path, headers=self._headers)
            if response.status_code != 200:  # (a path with nothing for this job: no checkpoints)
                return None
            out.append({"path": path, "json": response.get_data(as_text=True)})
            return response.get_json()

        base = f"/jobs/{job_id}"
        overview = client.get("/jobs/overview", headers=self._headers).get_json() or {}
        for entry in overview.get("jobs", []):
            if entry.get("jid") == job_id:
                out.append({"path": "/jobs/overview", "json": json.dumps({"jobs": [entry]})})
        details = None
        for suffix in JOB_PATHS:
            answer = take(base + suffix)
            if suffix == "":
                details = answer
            elif suffix == "/checkpoints" and answer:
                for h in answer.get("history", []):
                    take(f"{base}/checkpoints/details/{h['id']}")
                    for v in (details or {}).get("vertices", []):  # (each checkpoint's part per subtask)
                        take(f"{base}/checkpoints/details/{h['id']}/subtasks/{v['id']}")
        for v in (details or {}).get("vertices", []):
            for suffix in VERTEX_PATHS:
                take(f"{base}/vertices/{v['id']}{suffix}")
            for i in range(v.get("parallelism", 0)):
                take(f"{base}/vertices/{v['id']}/subtasks/{i}")
        return out

    def _write(self, job_id: str) -> None:
        try:
            entries = self.entries(job_id)
            fs, root = fsspec.core.url_to_fs(self._dir)
            fs.makedirs(root, exist_ok=True)
            tmp, final = f"{root}/.{job_id}.{uuid.uuid4().hex}.inprogress", f"{root}/{job_id}"
            with fs.open(tmp, "w") as fh:
                json.dump({"archive": entries}, fh)
            fs.mv(tmp, final)
            log.info("job %s archived for the history server: %s (%d answers)", job_id, f"{self._dir}/{job_id}",
                     len(entries))
        except Exception as exc:  # noqa: BLE001 - an archive is a copy: its failure must not touch the cluster
            log.warning("job %s could not be archived into %s: %s", job_id, self._dir, exc)
