"""Runs the commands of the README's blocks and of the examples' headers as a user types them
(tests/e2e/test_readme.py): the blocks are read from the files, never copied into the tests.

A command is a block's line (with its ``\\`` continuations), run by bash in a folder of the
test's own. What a user fills in is filled in from what the earlier commands printed or from
what the test made, by the names the README gives them:

- ``HOST:PORT`` the session a ``session start`` printed, ``$WEB`` its web UI, ``HOST:2181`` the
  test's ZooKeeper, ``APP_ID`` the YARN application a command printed;
- ``JOB_ID`` / ``$JOB`` a running job of the session (``JOB.py``, submitted by the test with a
  slow map whenever none runs: a command may have ended the previous one), ``$V`` its first
  vertex, ``$ID`` a TaskExecutor, ``$NAME`` a log file, ``$N`` the current attempt;
- ``$REQUEST_ID``, ``$JAR``, ``SAVEPOINT``, ``SAVEPOINT_FOLDER`` and a savepoint's location
  (``/tmp/savepoints/savepoint-...``) from the answers of the commands before (an answer
  ``IN_PROGRESS`` is asked again until it is not, as the README says to);
- ``JOB.py`` the test's job file (a word count of text files, args ``SRC OUT DELAY``), ``[args]``
  its arguments; ``N`` a number, ``DIR`` a folder, optional ``[...]`` parts left out
  (``[--detached]`` taken); paths the README gives as examples of shared or system folders
  (``file:///shared/yarnflow``, ``/tmp/savepoints``, ``hdfs:///...``) are the test's folders.

A command must exit 0 (curl with ``--fail-with-body`` from a ``.curlrc`` of the test's, so an
HTTP error fails it too). A command ending in ``&`` starts in the background and is stopped at
the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tests.harness import wait_until

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Block:
    lang: str
    lines: list[str]
    line: int  # where it starts in its file (1-based)

    @property
    def first(self) -> str:
        return self.lines[0].strip() if self.lines else ""

    def commands(self) -> list[str]:
        """Its shell commands: continuation lines joined, comment-only lines left out."""
        out: list[str] = []
        pending = ""
        for raw in self.lines:
            line = raw.strip()
            if not pending and (not line or line.startswith("#")):
                continue
            if line.endswith("\\"):
                pending += line[:-1].rstrip() + " "
                continue
            out.append(pending + line)
            pending = ""
        return out


def without_comment(command: str) -> str:
    """``command`` without its trailing ``# ...`` comment (a ``#`` outside quotes, after a space)."""
    quote = ""
    for i, ch in enumerate(command):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or command[i - 1].isspace()):
            return command[:i].rstrip()
    return command.rstrip()


def fenced_blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown text (also those indented under a list item)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if opening:
            indent = len(opening.group(1))
            j = i + 1
            while not re.match(r"^\s*```\s*$", lines[j]):
                j += 1
            blocks.append(Block(opening.group(2), [ln[indent:] for ln in lines[i + 1:j]], i + 1))
            i = j
        i += 1
    return blocks


def readme_blocks() -> list[Block]:
    return fenced_blocks((REPO / "README.md").read_text())


def header_commands(example: Path) -> list[str]:
    """The commands in an example's docstring (indented lines starting with a command name)."""
    import ast

    doc = ast.get_docstring(ast.parse(example.read_text()), clean=False) or ""
    block = Block("", [ln for ln in doc.splitlines() if ln.startswith("    ")], 1)
    return [c for c in block.commands() if c.split()[0] in ("yarnflow", "python")]


#: the test's job file: a word count of the text files SRC (default in/) into OUT (default out/),
#: its map sleeping DELAY seconds per batch, every operator with a uid (savepoints map by them)
JOB = """\
import sys
import time

import yarnflow

src = sys.argv[1] if len(sys.argv) > 1 else "in/"
out = sys.argv[2] if len(sys.argv) > 2 else "out/"
delay = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0


def slow(batch):
    time.sleep(delay)
    return batch


env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
env.set_runtime_mode("STREAMING")
(env.read_text(src).uid("source").map_batches(slow, name="slow").uid("slow")
    .flat_map(lambda r: ({"word": w, "count": 1} for w in r["line"].split()), name="words").uid("words")
    .key_by("word").sum("count").uid("sum").sink_to_parquet(out).uid("sink"))
env.execute("readme")
"""


@dataclass
class Runner:
    """Runs commands in ``cwd`` with ``env`` (the test's, with yarnflow on PATH)."""

    cwd: Path
    env: dict[str, str]
    values: dict[str, str] = field(default_factory=dict)  # placeholder -> what it stands for
    background: list[subprocess.Popen[str]] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    took: list[tuple[float, str]] = field(default_factory=list)  # (seconds, command): where a slow test spends
    #: called before a command that needs a running job (it sets JOB_ID and the $ variables)
    ensure_job: Callable[[Runner], None] | None = None
    job_counter: int = 0

    @classmethod
    def make(cls, cwd: Path, env: dict[str, str]) -> Runner:
        env = dict(env)
        env["PATH"] = f"{os.path.dirname(sys.executable)}:{env.get('PATH', '')}"
        curl = cwd / ".curl"
        curl.mkdir(parents=True, exist_ok=True)
        (curl / ".curlrc").write_text("--fail-with-body\n--silent\n--show-error\n--max-time 60\n")
        env["CURL_HOME"] = str(curl)
        (cwd / "job.py").write_text(JOB)
        (cwd / "in").mkdir(exist_ok=True)
        for i in range(3):
            (cwd / "in" / f"part-{i}.txt").write_text("".join(f"w{(i * 7 + j) % 11} x{j % 3}\n" for j in range(40)))
        return cls(cwd, env)

    # -- filling in ------------------------------------------------------------------------------
    def fill(self, command: str) -> str:
        v = self.values
        if " [job args]" in command or " [args]" in command:
            args = " in/ " + self.fresh_out()
            command = command.replace(" [job args]", args).replace(" [args]", args)
        replacements = [
            ("[options] ", ""),
            (" [--drain]", ""), (" [--detached]", " --detached"), (" [--taskexecutor ID]", ""),
            (" [--taskexecutor CONTAINER_ID]", ""), (" [DIR]", f" {self.cwd / 'savepoints'}"),
            ("HOST:2181", v.get("ZK", "HOST:2181")), ("file:///shared/yarnflow", f"file://{self.cwd / 'shared'}"),
            ("/tmp/savepoints/savepoint-...", v.get("LOCATION", "")), ("/tmp/savepoints", str(self.cwd / "savepoints")),
            ("SAVEPOINT_FOLDER", v.get("SAVEPOINT", "")), ("SAVEPOINT", v.get("SAVEPOINT", "")),
            ("HOST:PORT", v.get("HOST:PORT", "HOST:PORT")), ("APP_ID", v.get("APP_ID", "APP_ID")),
            ("JOB_ID", v.get("JOB_ID", "JOB_ID")), ("JOB.py", "job.py"),
            ("-p N", "-p 1"), ("--taskexecutors N", "--taskexecutors 3"), (" DIR ", f" {self.cwd / 'savepoints'} "),
        ]
        for old, new in replacements:
            command = command.replace(old, new)
        return command

    def fresh_out(self) -> str:
        self.job_counter += 1
        return f"out-{self.job_counter}/"

    def shell_env(self) -> dict[str, str]:
        env = dict(self.env)
        for name in ("WEB", "JOB", "V", "ID", "NAME", "N", "REQUEST_ID", "JAR", "TOKEN"):
            if name in self.values:
                env[name] = self.values[name]
        return env

    # -- running ---------------------------------------------------------------------------------
    def needs_job(self, command: str) -> bool:
        return "JOB_ID" in command or "$JOB" in command or "$V" in command or "$N" in command

    def run(self, raw: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        raw = without_comment(raw)
        if self.needs_job(raw) and self.ensure_job is not None:
            self.ensure_job(self)
        command = self.fill(raw)
        if command.endswith("&"):
            return self._start(command[:-1].strip())
        if command.startswith("TOKEN=$("):  # a variable for the commands after it
            inner = command[len("TOKEN=$("):command.index(")")]
            done = self._bash(inner, timeout)
            self.values["TOKEN"] = done.stdout.strip()
            return done
        done = self._bash(command, timeout)
        deadline = time.monotonic() + 60
        while _in_progress(done.stdout) and time.monotonic() < deadline:  # asked again, as a user polls
            time.sleep(0.5)
            done = self._bash(command, timeout)
        self._learn(done.stdout + done.stderr)
        if self.needs_job(raw) and re.search(r"\bcancel\b|\bstop\b|/stop\b", raw):
            self.values.pop("JOB_ID", None)  # it ends: a later command gets another (not one that is ending)
        return done

    def _bash(self, command: str, timeout: float) -> subprocess.CompletedProcess[str]:
        self.ran.append(command)
        started = time.monotonic()
        done = subprocess.run(["bash", "-c", command], cwd=self.cwd, env=self.shell_env(), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"$ {command}\nexit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        self.took.append((time.monotonic() - started, command))
        return done

    def _start(self, command: str) -> subprocess.CompletedProcess[str]:
        self.ran.append(command + " &")
        proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=self.cwd, env=self.shell_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.background.append(proc)
        if " session start" in command:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            found = re.search(r"running at (\S+:\d+)", line)
            assert found, f"$ {command}\n{line}{proc.stderr.read() if proc.poll() is not None else ''}"  # type: ignore[union-attr]
            self.values["HOST:PORT"] = found.group(1)
            for _ in range(6):
                more = proc.stdout.readline()  # type: ignore[union-attr]
                web = re.search(r"web UI:\s+(\S+)", more)
                if web:
                    self.values["WEB"] = web.group(1)
                if "stop:" in more or not more:
                    break
        return subprocess.CompletedProcess(command, 0, "", "")

    def _learn(self, text: str) -> None:
        """What a command printed that later ones use."""
        for pattern, name in ((r'"request-id":\s*"([0-9a-f]{32})"', "REQUEST_ID"),
                              (r"YARN application (application_\d+_\d+)", "APP_ID"),
                              (r"Submitted job [^(]*\(([0-9a-f]{32})\)", "SUBMITTED"),
                              (r'"location":\s*"([^"]+)"', "LOCATION"),
                              (r"^(file://\S+/savepoint-\S+)$", "SAVEPOINT")):
            found = re.findall(pattern, text, re.M)
            if found:
                self.values[name] = found[-1]
        jar = re.search(r'"filename":\s*"[^"]*/([0-9a-f]{32}_[^"/]+)"', text)
        if jar:
            self.values["JAR"] = jar.group(1)

    def stop_background(self) -> None:
        for proc in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.background:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


def _in_progress(answer: str) -> bool:
    """An asynchronous operation's status that says to ask again (``{"status": {"id": "IN_PROGRESS"}}``)."""
    try:
        status = json.loads(answer).get("status")
    except (ValueError, AttributeError):
        return False
    return isinstance(status, dict) and status.get("id") == "IN_PROGRESS"


def running_job_on_session(runner: Runner) -> None:
    """A job of the session that runs (for a command that acts on one): the test's job over a
    long input, its map sleeping per batch, taking checkpoints; submitted when none runs."""
    values = runner.values
    if values.get("JOB_ID") and _state(runner, values["JOB_ID"]) == "RUNNING":
        return
    long = runner.cwd / "long"
    if not long.exists():
        long.mkdir()
        for i in range(2):
            (long / f"part-{i}.txt").write_text("".join(f"w{j % 13} y{j % 5}\n" for j in range(3000)))
    done = runner._bash(f"yarnflow run --address {values['HOST:PORT']} --detached -D execution.checkpointing.interval=300ms "
                        f"-D execution.batch-size=10 -p 2 job.py long/ {runner.fresh_out()} 0.2", 120)
    job_id = re.search(r"\(([0-9a-f]{32})\) submitted detached", done.stderr).group(1)  # type: ignore[union-attr]
    values["JOB_ID"] = values["JOB"] = job_id
    wait_until(lambda: _state(runner, job_id) == "RUNNING" and _checkpointed(runner, job_id), 60,
               f"job {job_id} did not run and take a checkpoint")
    if "WEB" in values:
        details = _rest(runner, f"/jobs/{job_id}")
        vertex = details["vertices"][0]["id"]
        values["V"] = vertex
        values["N"] = str(_rest(runner, f"/jobs/{job_id}/vertices/{vertex}/subtasks/0")["attempt"])
        values["ID"] = _rest(runner, "/taskmanagers")["taskmanagers"][0]["id"]
        values["NAME"] = _rest(runner, "/jobmanager/logs")["logs"][0]["name"]


def _state(runner: Runner, job_id: str) -> str:
    done = subprocess.run(["yarnflow", "list", "--address", runner.values["HOST:PORT"], "--json"], cwd=runner.cwd,
                          env=runner.shell_env(), capture_output=True, text=True, timeout=60)
    for line in done.stdout.splitlines():
        job = json.loads(line)
        if job["id"] == job_id:
            return str(job["state"])
    return ""


def _checkpointed(runner: Runner, job_id: str) -> bool:
    done = subprocess.run(["yarnflow", "info", "--address", runner.values["HOST:PORT"], job_id], cwd=runner.cwd,
                          env=runner.shell_env(), capture_output=True, text=True, timeout=60)
    return "completed" in done.stdout


def _rest(runner: Runner, path: str) -> Any:
    """A REST answer of the session (with its token when it is closed: the test's own look)."""
    import requests

    auth = ("yarnflow", runner.values["_AUTH"]) if "_AUTH" in runner.values else None
    answer = requests.get(runner.values["WEB"] + path, auth=auth, timeout=10)
    if answer.status_code == 401:
        token = runner._bash(f"yarnflow session token --address {runner.values['HOST:PORT']}", 60).stdout.strip()
        runner.values["_AUTH"] = token
        answer = requests.get(runner.values["WEB"] + path, auth=("yarnflow", token), timeout=10)
    return answer.json()


def wait_for_file(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)
