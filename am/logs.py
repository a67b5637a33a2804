"""Where the AppMaster finds the log files of its cluster, for ``GET /jobs/:jobid/logs`` (and so
``yarnflow logs JOB_ID``): its own log (the file its output goes to) and, for local
TaskExecutors, ``<work dir>/log/<resource id>.log`` as the LocalProcessDriver writes them.
TaskExecutors in YARN containers log on their nodes: the client reads those through YARN's log
aggregation instead (``yarnflow.yarn.application_logs``)."""

from __future__ import annotations

import glob
import os
import stat

from yarnflow.common.logs import job_lines

APPMASTER = "appmaster"


def _file_of(fd: int) -> str | None:
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
        return path if stat.S_ISREG(os.stat(path).st_mode) else None
    except OSError:
        return None


def own_log_file() -> str | None:
    """The regular file this process's stderr goes to, if it goes to one (else its stdout's)."""
    return _file_of(2) or _file_of(1)


def own_output_file() -> str | None:
    """The regular file this process's stdout goes to, if it goes to one (Flink's ``.out``)."""
    return _file_of(1)


def log_files(work_dir: str) -> dict[str, str]:
    """Source ("appmaster" or a TaskExecutor's resource id) -> its log file."""
    files: dict[str, str] = {}
    own = own_log_file()
    if own is not None:
        files[APPMASTER] = own
    for path in sorted(glob.glob(os.path.join(work_dir, "log", "*.log"))):
        name = os.path.basename(path)[:-len(".log")]
        if not name.startswith(APPMASTER):
            files[name] = path
    return files


def read_job_logs(work_dir: str, job_id: str, taskexecutor: str = "") -> dict[str, list[str]]:
    """Source -> the lines of its log that belong to the job (sources without any are left
    out). ``taskexecutor``: only that TaskExecutor's log (KeyError when it has none here)."""
    files = log_files(work_dir)
    if taskexecutor:
        if taskexecutor not in files or taskexecutor == APPMASTER:
            raise KeyError(taskexecutor)
        files = {taskexecutor: files[taskexecutor]}
    out: dict[str, list[str]] = {}
    for source, path in files.items():
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                lines = job_lines(fh.read(), job_id)
        except OSError:
            continue
        if lines:
            out[source] = lines
    return out
