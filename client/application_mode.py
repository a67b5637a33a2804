"""``yarnflow run --target yarn-application``: Flink's application mode on YARN.

The client does not run the job's ``main()``: it ships the job file's folder (every file in it
and below, but hidden ones and virtualenv, VCS and cache folders: the job's modules and the
data files it reads by paths relative to itself) and the job's arguments, and YARN starts an
AppMaster that runs ``main()`` in its own container, in the unpacked folder, against its own
cluster (the compiling and the job's dependencies are the cluster's business, not the gateway
host's). The application ends with ``main()``: SUCCEEDED once it returned (every job it ran
ended), FAILED with ``main()``'s traceback as the diagnostics when it raised or a job failed.
The client follows the application to its end (or returns at once with ``--detached``), then
prints what ``main()`` printed (its standard output, e.g. a ``print()`` sink's rows) and its
error output (the jobs' ends), read from the AppMaster container's logs through YARN's log
aggregation (``main.out`` and ``main.err``).
"""

from __future__ import annotations

import io
import os
import sys
import time
import zipfile
from collections.abc import Sequence
from typing import Any

from yarnflow.common.config import Configuration
from yarnflow.common.errors import ConfigurationError
from yarnflow.common.yarn import MAIN_ERR, MAIN_OUT
from yarnflow.yarn import ApplicationLocator, Submission, skein_client, submit_application

__all__ = ["MAX_APPLICATION_BYTES", "MAIN_ERR", "MAIN_OUT", "main_output", "package_job", "run_application"]

#: the most code an application ships (its job file's folder, zipped)
MAX_APPLICATION_BYTES = 64 * 1024 * 1024
_SKIPPED = {"__pycache__", ".git", ".hg", ".svn", ".venv", "venv", ".tox", "node_modules"}


def package_job(job_file: str) -> bytes:
    """A zip of the folder of ``job_file``: every file in it and below, but hidden ones and
    the folders in ``_SKIPPED`` (what ``main()`` imports and the data it reads beside itself).
    Raises ConfigurationError when it is over ``MAX_APPLICATION_BYTES`` zipped."""
    folder = os.path.dirname(os.path.abspath(job_file))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for root, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d not in _SKIPPED and not d.startswith("."))
            for name in sorted(files):
                full = os.path.join(root, name)
                if name.startswith(".") or name.endswith(".pyc") or not os.path.isfile(full):
                    continue
                zf.write(full, os.path.relpath(full, folder))
                if buffer.tell() > MAX_APPLICATION_BYTES:
                    break
    data = buffer.getvalue()
    if len(data) > MAX_APPLICATION_BYTES:
        raise ConfigurationError(f"the job's folder ({os.path.dirname(os.path.abspath(job_file))}, over "
                                 f"{MAX_APPLICATION_BYTES // 2**20} MB zipped) is too large to ship with the "
                                 "application: keep the job file in a folder of its own, read large inputs "
                                 "from a shared filesystem (hdfs://...), ship dependencies with yarn.ship-archives "
                                 "or yarn.ship-venv")
    return data


def run_application(config: Configuration, job_file: str, job_args: Sequence[str], detached: bool) -> int:
    """Submit ``job_file`` in application mode; attached, follow the application to its end.
    Returns the command's exit status (0: SUCCEEDED)."""
    client = skein_client(config)
    name = os.path.splitext(os.path.basename(job_file))[0]
    app_id = submit_application(config, Submission(name, detached=detached, application=package_job(job_file),
                                                   main=os.path.basename(job_file), args=tuple(job_args)), client)
    print(f"Submitted {job_file} as YARN application {app_id} (application mode: its main() runs in the "
          "application's AppMaster)", file=sys.stderr)
    if detached:
        print(f"Follow it with `yarnflow list -D yarn.application.id={app_id}` or "
              f"`skein application status {app_id}`", file=sys.stderr)
        return 0
    locator = ApplicationLocator(app_id, client)
    try:
        while True:
            report = locator.wait_final(5.0)
            if report is not None:
                break
    except KeyboardInterrupt:
        print(f"\nkilling YARN application {app_id} ...", file=sys.stderr)
        locator.kill()
        raise
    status = str(report.final_status)
    output = main_output(client, app_id)
    if output is not None:  # what main() printed, as a local `yarnflow run` would have shown it
        out, err = output
        sys.stdout.write(out)
        sys.stdout.flush()
        sys.stderr.write(err)
    diagnostics = (report.diagnostics or "").rstrip() if output is None else ""
    print(f"YARN application {app_id} {report.state} (final status {status})"
          + (f":\n{diagnostics}" if diagnostics and status != "SUCCEEDED" else ""), file=sys.stderr)
    if output is None:
        print(f"(main()'s output is in the AppMaster container's logs: `yarn logs -applicationId {app_id}`)",
              file=sys.stderr)
    return 0 if status == "SUCCEEDED" else 1


#: how long the client waits for YARN to aggregate the AppMaster container's logs
LOG_WAIT_S = 30.0


def main_output(client: Any, app_id: str, wait_s: float = LOG_WAIT_S) -> tuple[str, str] | None:
    """``main()``'s standard and error output from the AppMaster container's aggregated logs;
    None when YARN has not aggregated them within ``wait_s`` (a cluster without log
    aggregation, or one that is slow to do it)."""
    from yarnflow.cli_logs import split_container_log

    deadline = time.monotonic() + wait_s
    while True:
        try:
            containers = dict(client.application_logs(app_id))
        except Exception:  # noqa: BLE001 - skein: not aggregated yet (or no aggregation at all)
            containers = {}
        for _, text in sorted(containers.items()):
            files = split_container_log(text)
            if MAIN_OUT in files or MAIN_ERR in files:
                return _lines(files.get(MAIN_OUT, "")), _lines(files.get(MAIN_ERR, ""))
        if time.monotonic() > deadline:
            return None
        time.sleep(1.0)


def _lines(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"

