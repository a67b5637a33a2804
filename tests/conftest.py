"""Shared fixtures: processes started by a test are tagged through their environment
(YARNFLOW_TEST_TAG, inherited by every child), so a test can find, check and kill by pid
everything it started, and no process outlives its test."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import psutil
import pytest

from tests.harness import wait_until

pytest_plugins = ["tests.zookeeper", "tests.yarn", "tests.kafka"]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAG_VAR = "YARNFLOW_TEST_TAG"


def _yarnflow_outside_this_environment() -> str | None:
    """Where the interpreter this virtualenv was made from finds yarnflow, if it does. A copy
    there would leak into every virtualenv a test makes with ``--system-site-packages``, and so
    let the suite pass where a newcomer's fresh machine fails (issue 50)."""
    base = getattr(sys, "_base_executable", sys.executable)
    if sys.prefix == sys.base_prefix or not os.path.exists(base):
        return None
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    found = subprocess.run([base, "-c", "import importlib.util as u; s = u.find_spec('yarnflow'); "
                            "print(s.origin or list(s.submodule_search_locations) if s else '')"],
                           capture_output=True, text=True, timeout=60, env=env, cwd="/")
    return found.stdout.strip() or None


def pytest_configure(config: pytest.Config) -> None:
    leaked = _yarnflow_outside_this_environment()
    if leaked:
        pytest.exit(f"yarnflow is installed outside this virtualenv ({leaked}, seen by "
                    f"{getattr(sys, '_base_executable', '')}): uninstall it there (pip uninstall yarnflow with that "
                    "interpreter); the suite must use only what the README's commands installed", returncode=4)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """Keep each phase's report on the test item (``item.report_call``), so a fixture's teardown
    knows whether the test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def _log_tails(folder: str, lines: int = 40) -> str:
    """The warnings and errors of every log in ``folder`` and the end of the AppMaster's, for a
    failed test's report: a failure on a CI machine is explained by what the cluster logged."""
    out = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        path = os.path.join(folder, name)
        if not name.endswith(".log") or not os.path.isfile(path):
            continue
        with open(path, errors="replace") as f:
            text = f.read().splitlines()
        flagged = [line for line in text if " WARNING " in line or " ERROR " in line or " CRITICAL " in line]
        if flagged:
            out.append(f"---- {path}: warnings and errors")
            out += flagged[-lines:]
        if name == "appmaster.log":
            out.append(f"---- {path}: last lines")
            out += text[-lines:]
    return "\n".join(out)


def tagged_processes(tag: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(TAG_VAR) == tag:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def kill_tagged(tag: str) -> list[str]:
    """Kill (SIGKILL, by pid) every live process carrying ``tag``; returns what was killed."""
    killed = []
    for proc in tagged_processes(tag):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            killed.append(" ".join(proc.cmdline()[:6]))
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    return killed


def live_tagged(tag: str) -> list[psutil.Process]:
    return [p for p in tagged_processes(tag) if _alive(p)]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@dataclass
class Cli:
    """Runs ``yarnflow`` as a user would, in a fresh process tagged for this test."""

    tag: str
    env: dict[str, str]
    cwd: str
    background: list[subprocess.Popen[str]] = field(default_factory=list)
    #: run before the command (a sandbox host's entry: the CLI then runs on that host)
    prefix: list[str] = field(default_factory=list)

    def run(self, *args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*self.prefix, sys.executable, "-m", "yarnflow", *args], capture_output=True, text=True,
                              timeout=timeout, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise AssertionError(f"yarnflow {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def job_status(self, *args: str) -> str:
        """The job's own status (RUNNING, FINISHED, ...) from ``yarnflow info ARGS``: the first
        line's, not a vertex's (a finished source's vertex says FINISHED while its job runs)."""
        first = self.run("info", *args).stdout.partition("\n")[0]
        return first.rpartition(": ")[2].strip() if first.startswith("job ") else ""

    def start(self, *args: str) -> subprocess.Popen[str]:
        # (SIGINT as a terminal's Ctrl-C: a suite started in the background by a non-interactive
        # shell has it ignored, which its children would inherit, and Python then never raises
        # KeyboardInterrupt)
        proc = subprocess.Popen([*self.prefix, sys.executable, "-m", "yarnflow", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env, cwd=self.cwd,
                                stdin=subprocess.DEVNULL,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # noqa: PLW1509
        self.background.append(proc)
        return proc


@pytest.fixture
def process_tag() -> Iterator[str]:
    """A tag for the processes of this test; on teardown, none may be left (they are killed
    and the test fails if any were)."""
    tag = uuid.uuid4().hex
    yield tag
    try:
        wait_until(lambda: not live_tagged(tag), 15.0, "processes outlived the test", interval_s=0.1)
    except AssertionError:
        killed = kill_tagged(tag)
        pytest.fail(f"processes outlived the test and were killed: {killed}")


@pytest.fixture
def cli(process_tag: str, tmp_path) -> Iterator[Cli]:  # type: ignore[no-untyped-def]
    env = dict(os.environ)
    env[TAG_VAR] = process_tag
    env["YARNFLOW_LOG_LEVEL"] = "INFO"
    env["YARNFLOW_HOME"] = str(tmp_path / "yarnflow-home")  # where sessions leave their credentials
    env.pop("PYTHONHASHSEED", None)
    # the clusters' work dirs (and a session's logs, kept after it stops) go here, removed after
    # the test; short, for the Unix sockets made under it
    scratch = tempfile.mkdtemp(prefix="yfcli-")
    env["TMPDIR"] = scratch
    c = Cli(process_tag, env, str(tmp_path))
    yield c
    for proc in c.background:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()
    shutil.rmtree(scratch, ignore_errors=True)


# Fast failure detection for tests that kill things on purpose.
FAST_CONF = {
    "heartbeat.interval": "200 ms",
    "heartbeat.timeout": "2 s",
    "taskmanager.registration.timeout": "5 s",
    "slot.request.timeout": "60 s",
}


@pytest.fixture
def local_cluster(process_tag: str, tmp_path, monkeypatch, request):  # type: ignore[no-untyped-def]
    """Factory: ``local_cluster(taskexecutors=2, slots=2, standby=0, appmaster_in_process=False,
    prestart=False, **conf)`` starts a LocalCluster whose processes carry this test's tag; all are stopped on
    teardown (after a failed test, with its logs' warnings and errors on stderr)."""
    from yarnflow.local_cluster import LocalCluster

    monkeypatch.setenv(TAG_VAR, process_tag)
    started: list[LocalCluster] = []

    def start(taskexecutors: int = 2, slots: int = 2, standby: int = 0, appmaster_in_process: bool = False,
              prestart: bool = False, **conf: str) -> LocalCluster:
        merged = {**FAST_CONF, **{k.replace("__", "."): v for k, v in conf.items()}}
        cluster = LocalCluster(taskexecutors, slots, merged, work_dir=str(tmp_path / f"cluster{len(started)}"),
                               standby=standby, appmaster_in_process=appmaster_in_process)
        started.append(cluster)
        if prestart:  # (what `yarnflow run` does: its TaskExecutor processes start ahead of the cluster)
            cluster.prestart_taskexecutors(taskexecutors)
        return cluster.start()

    yield start
    failed = getattr(request.node, "report_call", None)
    for cluster in started:
        cluster.stop()
        if failed is not None and failed.failed:
            print(_log_tails(os.path.dirname(cluster.log_path)), file=sys.stderr)


@pytest.fixture
def run(local_cluster):  # type: ignore[no-untyped-def]
    """``run(build_fn, name="test", parallelism=2, conf=None)`` builds a pipeline with
    ``build_fn(env)`` and runs it on a local cluster of 2 TaskExecutors x 2 slots (started once
    per test); returns the JobExecutionResult, raises JobFailedError when the job fails."""
    import yarnflow
    from yarnflow import executors

    cluster = local_cluster(taskexecutors=2, slots=2)

    def go(build, name="test", parallelism=2, conf=None):  # type: ignore[no-untyped-def]
        ctx = executors.ClusterContext(cluster.address, conf or {}, progress=False)
        executors.set_context(ctx)
        try:
            env = yarnflow.StreamExecutionEnvironment(parallelism=parallelism)
            build(env)
            return env.execute(name)
        finally:
            executors.set_context(None)

    go.cluster = cluster  # type: ignore[attr-defined]
    return go
