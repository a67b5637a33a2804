"""Log lines tagged with the job they belong to, and picking a job's lines out of a log.

A thread that works for one job (a task thread, a JobMaster's main and I/O threads) calls
``bind_job``; ``JobTagFilter`` (installed on the process's log handlers by ``install``) then adds
`` [job <id>]`` after the thread's name in every line it logs. ``job_lines`` keeps the lines of
a log that carry the tag or name the job, with the lines that continue them (tracebacks).
"""

from __future__ import annotations

import logging
import re
import threading

FORMAT = "%(asctime)s %(levelname)s %(threadName)s%(job)s %(name)s: %(message)s"
#: a log line's start (a new record); other lines continue the record before them
_RECORD_START = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")

#: the job the current thread works for (a thread-local: it ends with its thread)
_bound = threading.local()
#: the calling thread's binding (``job``: the id or None), for code that stands in for another thread
bound = _bound


def bind_job(job_id: str) -> None:
    """The calling thread works for ``job_id`` from now on (until ``unbind_job``)."""
    _bound.job = str(job_id)


def unbind_job() -> None:
    _bound.job = None


class JobTagFilter(logging.Filter):
    """Sets ``record.job`` (`` [job <id>]`` or empty) from the logging thread's binding (log
    handlers run on the thread that logs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        job = getattr(_bound, "job", None)
        record.job = f" [job {job}]" if job else ""
        return True


def install() -> None:
    """Tag every line of this process's root log handlers (call after ``basicConfig``)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, JobTagFilter) for f in handler.filters):
            handler.addFilter(JobTagFilter())


def job_lines(text: str, job_id: str) -> list[str]:
    """The lines of ``text`` that belong to ``job_id``: every record tagged with it or naming
    it, with its continuation lines."""
    out: list[str] = []
    keep = False
    for line in text.splitlines():
        if _RECORD_START.match(line):
            keep = job_id in line
        if keep:
            out.append(line)
    return out
