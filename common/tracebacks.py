"""What a user is shown of a failure: the frames of their own code, never yarnflow's.

A task that fails on a TaskExecutor sends its whole traceback (``ErrorInfo.traceback``): the
user's function raised inside yarnflow's operator, task and runtime frames, and yarnflow wrapped
it (``UserFunctionError``), so the text is two chained tracebacks of which the user wrote a
few lines. ``user_traceback`` keeps, of each traceback in the chain, only the frames outside
yarnflow, and drops the tracebacks that have none left (the wrapper's: the headline says what
it says). The whole text stays in the job's failure history (``yarnflow info``) and the logs.

A frame is yarnflow's when its file lies in one of yarnflow's package folders as this process
sees them, or under a ``yarnflow`` folder elsewhere (a TaskExecutor in a YARN container runs
its own copy), or is the interpreter's ``runpy`` (which ran the job file)."""

from __future__ import annotations

import os
import re
import traceback
from types import TracebackType

#: the lines Python puts between the tracebacks of a chain
SEPARATORS = ("The above exception was the direct cause of the following exception:",
              "During handling of the above exception, another exception occurred:")
_HEADER = "Traceback (most recent call last):"
_FRAME = re.compile(r'^  File "(?P<file>.+)", line \d+, in .+$')
#: the folders of yarnflow's packages next to this one (a source checkout: client/, am/, ...;
#: an installed copy: all under yarnflow/)
_PACKAGE_FOLDERS = ("client", "am", "worker", "common", "conf", "sandbox")


def _own_roots() -> tuple[str, ...]:
    here = os.path.dirname(os.path.realpath(__file__))
    parent = os.path.dirname(here)
    if os.path.basename(here) == "common" and os.path.isdir(os.path.join(parent, "client")):
        return tuple(os.path.join(parent, name) + os.sep for name in _PACKAGE_FOLDERS)
    return (parent + os.sep,)


_ROOTS = _own_roots()


def is_internal(filename: str) -> bool:
    """Whether a frame in ``filename`` is yarnflow's own (or runpy's) rather than the user's."""
    if filename in ("<frozen runpy>",) or filename.endswith(f"{os.sep}runpy.py"):
        return True
    path = os.path.realpath(filename) if os.path.isabs(filename) else filename
    if path.startswith(_ROOTS):
        return True
    return f"{os.sep}yarnflow{os.sep}" in filename


def user_traceback(text: str) -> str:
    """``text`` (a formatted traceback, possibly a chain) with only the user's frames; the
    tracebacks of the chain left without a frame are dropped. "" when none is left."""
    sections: list[tuple[str, list[str]]] = []  # (the separator before it, its lines)
    separator, lines = "", list[str]()
    for line in text.rstrip("\n").splitlines():
        if line.strip() in SEPARATORS:
            sections.append((separator, lines))
            separator, lines = line.strip(), []
        else:
            lines.append(line)
    sections.append((separator, lines))
    out: list[str] = []
    for separator, section in sections:
        kept = _user_section(section)
        if kept:
            if out:
                out += ["", separator, ""]
            out += kept
    return "\n".join(out)


def _user_section(lines: list[str]) -> list[str]:
    """One traceback of a chain with yarnflow's frames taken out; [] when no frame is left."""
    while lines and not lines[0].strip():
        lines = lines[1:]
    if not lines or lines[0] != _HEADER:
        return []
    kept, frames, i = [_HEADER], 0, 1
    while i < len(lines):
        match = _FRAME.match(lines[i])
        if match is None:
            break  # the exception's lines follow the last frame
        j = i + 1
        while j < len(lines) and lines[j].startswith("    "):
            j += 1
        if not is_internal(match.group("file")):
            kept += lines[i:j]
            frames += 1
        i = j
    if not frames:
        return []
    while i < len(lines) and not lines[i].strip():
        i += 1
    return kept + [ln for ln in lines[i:] if ln.strip()]


def user_frames(tb: TracebackType | None) -> list[traceback.FrameSummary]:
    """The frames of a local traceback that are not yarnflow's."""
    return [f for f in traceback.extract_tb(tb) if not is_internal(f.filename)]
