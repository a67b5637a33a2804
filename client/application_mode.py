"""``yarnflow run --target yarn-application``: Flink's application mode on YARN.

The client does not run the job's ``main()``: it ships the job file with the Python modules
beside it (its folder's ``.py`` files and packages) and the job's arguments, and YARN starts
an AppMaster that runs ``main()`` in its own container against its own cluster (the compiling
and the job's dependencies are the cluster's business, not the gateway host's). The
application ends with ``main()``: SUCCEEDED once it returned (every job it ran ended), FAILED
with ``main()``'s traceback as the diagnostics when it raised or a job failed. The client
follows the application to its end (or returns at once with ``--detached``).
"""

from __future__ import annotations

import io
import os
import sys
import zipfile
from collections.abc import Sequence

from yarnflow.common.config import Configuration
from yarnflow.common.errors import ConfigurationError
from yarnflow.yarn import ApplicationLocator, Submission, skein_client, submit_application

__all__ = ["MAX_APPLICATION_BYTES", "package_job", "run_application"]

#: the most code an application ships (its job file's folder, zipped)
MAX_APPLICATION_BYTES = 64 * 1024 * 1024
_SKIPPED = {"__pycache__", ".git", ".hg", ".svn", ".venv", "venv", ".tox", "node_modules"}


def package_job(job_file: str) -> bytes:
    """A zip of ``job_file`` and the Python modules beside it (``.py`` files and packages,
    folders with an ``__init__.py``), as ``main()`` imports them; data files are not taken."""
    folder = os.path.dirname(os.path.abspath(job_file))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.write(os.path.abspath(job_file), os.path.basename(job_file))
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if name.endswith(".py") and os.path.isfile(path) and name != os.path.basename(job_file):
                zf.write(path, name)
            elif os.path.isdir(path) and name not in _SKIPPED and os.path.isfile(os.path.join(path, "__init__.py")):
                for root, dirs, files in os.walk(path):
                    dirs[:] = sorted(d for d in dirs if d not in _SKIPPED)
                    for f in sorted(files):
                        if f.endswith(".py"):
                            full = os.path.join(root, f)
                            zf.write(full, os.path.relpath(full, folder))
    data = buffer.getvalue()
    if len(data) > MAX_APPLICATION_BYTES:
        raise ConfigurationError(f"the job's code ({len(data) / 2**20:.0f} MB zipped: {job_file} and the modules "
                                 f"beside it) is over {MAX_APPLICATION_BYTES // 2**20} MB: ship large dependencies "
                                 "with yarn.ship-archives or yarn.ship-venv")
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
    diagnostics = (report.diagnostics or "").rstrip()
    print(f"YARN application {app_id} {report.state} (final status {status})"
          + (f":\n{diagnostics}" if diagnostics and status != "SUCCEEDED" else ""), file=sys.stderr)
    return 0 if status == "SUCCEEDED" else 1
