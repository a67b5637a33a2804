"""yarnflow on YARN through skein (issue 10), against the YARN sandbox (yarnflow.sandbox) that
the unmodified skein client talks to as to a Hadoop cluster: every command goes through the
`yarnflow` CLI in a process of its own, the AppMaster and the TaskExecutors run in sandbox
containers, and the outputs come from text files and are checked row for row.

Per-job applications (exact word counts, the job's end as the application's final status, a
failure's cause as its diagnostics, shipped archives), a session with two jobs and the
list/info/cancel/stop commands, a TaskExecutor container SIGKILLed and replaced, the AppMaster
container SIGKILLed with ZooKeeper high availability (the second attempt recovers the job) and
without it (the application fails saying why), idle TaskExecutor containers released, and the
errors a user hits."""

from __future__ import annotations

import collections
import json
import re
import shutil
import signal
import subprocess
import time
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import psutil
import pyarrow.dataset as pads
import pyarrow.flight as flight
import pytest
import requests
import skein

from tests.conftest import REPO, Cli
from tests.harness import assert_upsert_counts, wait_until
from tests.integration.test_ha_failover import ha_conf
from tests.yarn import MAX_MEMORY_MB
from yarnflow.common.config import Configuration
from yarnflow.common.errors import RpcConnectionError
from yarnflow.common.rpc.gateways import RemoteDispatcherGateway
from yarnflow.common.security import TlsCredentials, new_credentials, rest_token, skein_client_credentials
from yarnflow.common.yarn import ADDRESS_KEY
from yarnflow.common.states import JobStatus
from yarnflow.connection import ClusterConnection
from yarnflow.sandbox import Sandbox

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180),
              pytest.mark.filterwarnings("ignore:distutils Version classes are deprecated:DeprecationWarning")]

FILES, ROWS, KEYS = 8, 6000, 37
# small containers (the sandbox allows 2 GiB), quick failure detection, one slot per TaskExecutor
# so a job of parallelism 2 runs in two containers
YARN_CONF = {
    "jobmanager.memory.process.size": "512 mb",
    "taskmanager.memory.process.size": "512 mb",
    "taskmanager.numberOfTaskSlots": "1",
    "heartbeat.interval": "200 ms",
    "heartbeat.timeout": "3 s",
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.attempts": "5",
    "restart-strategy.fixed-delay.delay": "200 ms",
    "execution.batch-size": "100",
}
CHECKPOINTS = {"execution.checkpointing.interval": "200 ms"}

# The job: key -> count over text files of lines "k<n> <file> <row>"; argv: SRC OUT MODE SLEEP NAME
# [LOOKUP]. With LOOKUP (a file in a shipped archive) each count is multiplied by its number;
# a line "k<n> fail" makes the job fail.
JOB = textwrap.dedent("""\
    import sys
    import time

    import pyarrow as pa
    import pyarrow.compute as pc

    import yarnflow

    src, out, mode, sleep_s, name = sys.argv[1:6]
    lookup = sys.argv[6] if len(sys.argv) > 6 else None

    def parse(batch):
        time.sleep(float(sleep_s))
        parts = pc.split_pattern(batch.column("line"), " ")
        if pc.any(pc.equal(pc.list_element(parts, 1), "fail")).as_py():
            raise ValueError("a line says fail")
        factor = 1
        if lookup:
            with open(lookup) as fh:  # relative to the container's working directory
                factor = int(fh.read())
        return pa.record_batch({"k": pc.list_element(parts, 0),
                                "n": pa.array([factor] * batch.num_rows, pa.int64())})

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(2)
    env.set_runtime_mode(mode)
    env.read_text(src).map_batches(parse, name="parse").key_by("k").sum("n").sink_to_parquet(out)
    env.execute(name)
""")


def write_input(folder: Path, files: int = FILES, rows: int = ROWS) -> collections.Counter:
    """Text files of ``rows`` lines in all; the expected count per key."""
    folder.mkdir(parents=True)
    expected: collections.Counter = collections.Counter()
    per_file = rows // files
    for f in range(files):
        keys = [f"k{(f * per_file + r) % KEYS}" for r in range(per_file)]
        expected.update(keys)
        (folder / f"in-{f:02d}.txt").write_text("".join(f"{k} {f} {r}\n" for r, k in enumerate(keys)))
    return expected


def final_counts(out: Path) -> collections.Counter:
    """Each key's last committed total; BATCH output holds each key once."""
    table = pads.dataset(str(out), format="parquet").to_table()
    return collections.Counter(dict(zip(table["k"].to_pylist(), table["n"].to_pylist())))


def assert_batch_exact(out: Path, expected: collections.Counter) -> None:
    table = pads.dataset(str(out), format="parquet").to_table()
    keys = table["k"].to_pylist()
    assert len(keys) == len(set(keys)), "a key was committed twice"
    assert final_counts(out) == expected


def dconf(conf: dict[str, str]) -> list[str]:
    return [arg for k, v in conf.items() for arg in ("-D", f"{k}={v}")]


@pytest.fixture
def yarn_cli(cli: Cli, sandbox: Sandbox, tmp_path: Path) -> Cli:
    """The CLI of a user whose skein driver is the sandbox; the job file is ``tmp_path/job.py``."""
    cli.env["SKEIN_CONFIG"] = sandbox.config_dir
    (tmp_path / "job.py").write_text(JOB)
    return cli


def app_id_of(text: str) -> str:
    found = re.search(r"YARN application (application_\d+_\d+)", text)
    assert found, f"no application id in:\n{text}"
    return found.group(1)


def start_session(yarn_cli: Cli, conf: dict[str, str] = YARN_CONF) -> tuple[str, list[str], Any]:
    """A detached session application: its id, the -D keys that name it, what the CLI said."""
    started = yarn_cli.run("session", "start", "--target", "yarn", "--detached", *dconf(conf), timeout=90)
    assert started.returncode == 0, started.stderr
    app_id = app_id_of(started.stdout)
    return app_id, ["-D", f"yarn.application.id={app_id}"], started


def _run_once_then_stop(yarn_cli: Cli, keys: list[str], tmp_path: Path, expected: Any, app_id: str) -> None:
    """A BATCH job on the session counts every row once; then the session stops, SUCCEEDED."""
    ran = yarn_cli.run("run", *keys, "job.py", str(tmp_path / "in"), str(tmp_path / "out"), "BATCH", "0", "once",
                       timeout=90)
    assert ran.returncode == 0, ran.stderr
    assert_batch_exact(tmp_path / "out", expected)
    yarn_cli.run("session", "stop", *keys, check=True)
    assert wait_final(app_id).final_status == "SUCCEEDED"


def report(app_id: str) -> Any:
    with skein.Client.from_global_driver() as client:
        return client.application_report(app_id)


def wait_final(app_id: str, timeout: float = 60) -> Any:
    return wait_until(lambda: (r := report(app_id)).final_status != "UNDEFINED" and r, timeout,
                      lambda: f"{app_id} did not end: {report(app_id)}")


def containers_started(sandbox: Sandbox, app_id: str) -> list[str]:
    """The YARN ids of every container the application ever had (their log folders)."""
    logs = Path(sandbox.work_dir) / "logs" / app_id
    return sorted(p.name for p in logs.iterdir()) if logs.exists() else []


def container_processes(app_id: str, module: str) -> list[psutil.Process]:
    """Live processes running ``python -m <module>`` in the application's containers."""
    prefix = "container_" + app_id[len("application_"):]
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmd = proc.info["cmdline"] or []
            if module in cmd and proc.environ().get("CONTAINER_ID", "").startswith(prefix):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def job_info(app_id: str, name: str, extra: dict[str, str] | None = None) -> Any:
    """The job's status as the AppMaster reports it (found through the application id)."""
    conn = ClusterConnection(Configuration.load({"yarn.application.id": app_id, "client.timeout": "20 s",
                                                 **(extra or {})}), "")
    try:
        return next((j for j in conn.call(lambda gw: gw.list_jobs(), "listJobs") if j.name == name), None)
    finally:
        conn.close()


def wait_checkpointed(app_id: str, name: str, extra: dict[str, str] | None = None) -> None:
    wait_until(lambda: (j := job_info(app_id, name, extra)) is not None and j.status == JobStatus.RUNNING
               and j.latest_completed_checkpoint_id >= 1, 60, f"{name} never completed a checkpoint", interval_s=0.05)


def test_a_per_job_application_counts_every_row_and_ends_with_the_job(yarn_cli: Cli, sandbox: Sandbox,
                                                                       tmp_path: Path) -> None:
    expected = write_input(tmp_path / "in")
    out = tmp_path / "out"
    proc = yarn_cli.run("run", "--target", "yarn-per-job", *dconf(YARN_CONF), "-D", "yarn.tags=nightly,wc",
                        "job.py", str(tmp_path / "in"), str(out), "BATCH", "0", "wordcount", timeout=120)
    assert proc.returncode == 0, proc.stderr
    app_id = app_id_of(proc.stderr)
    assert f"YARN application {app_id} FINISHED (final status SUCCEEDED)" in proc.stderr
    assert_batch_exact(out, expected)
    r = report(app_id)
    assert (r.state, r.final_status, r.name) == ("FINISHED", "SUCCEEDED", "yarnflow wordcount")
    assert {"nightly", "wc", "yarnflow"} <= set(r.tags)
    started = containers_started(sandbox, app_id)
    assert started[0].endswith("_01_000001") and len(started) == 3, started  # the AppMaster, two TaskExecutors


def test_with_kerberos_keys_the_keytab_reaches_every_container_privately_and_the_job_runs(
        yarn_cli: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    """The spec that reaches skein (issue 31, Kerberos): the keytab is a private application file
    in the AppMaster's and each TaskExecutor's container, each of which starts renewing its ticket
    from it (this machine has no kinit: each says so once), the file systems to get delegation
    tokens for are in the application's spec, and the job counts every row once."""
    expected = write_input(tmp_path / "in", files=2, rows=400)
    keytab = tmp_path / "etl.keytab"
    keytab.write_bytes(b"\x05\x02 a keytab")
    keytab.chmod(0o600)
    conf = {**YARN_CONF, "security.kerberos.login.keytab": str(keytab),
            "security.kerberos.login.principal": "etl@EXAMPLE.COM",
            "security.kerberos.access.hadoopFileSystems": "hdfs://namenode:8020"}
    proc = yarn_cli.run("run", "--target", "yarn-per-job", "--detached", *dconf(conf), "job.py",
                        str(tmp_path / "in"), str(tmp_path / "out"), "BATCH", "1", "kerberized", timeout=120)
    assert proc.returncode == 0, proc.stderr
    app_id = app_id_of(proc.stderr)
    with skein.Client.from_global_driver() as client:
        spec = client.connect(app_id).get_specification()
        assert spec.file_systems == ["hdfs://namenode:8020"]
        assert str(spec.master.files["krb5.keytab"].visibility).lower() == "private"
    assert wait_final(app_id).final_status == "SUCCEEDED"
    assert_batch_exact(tmp_path / "out", expected)
    containers = sorted((Path(sandbox.work_dir) / "local" / app_id).glob("container_*"))
    assert len(containers) == 3 and all((c / "krb5.keytab").read_bytes() == keytab.read_bytes() for c in containers)
    logs = Path(sandbox.work_dir) / "logs" / app_id
    said = [p for p in logs.rglob("*") if p.is_file() and "no kinit in this container" in p.read_text(errors="replace")]
    assert len(said) == 3, said


def test_a_failed_job_fails_its_application_with_the_cause_as_diagnostics(yarn_cli: Cli, tmp_path: Path) -> None:
    write_input(tmp_path / "in", files=2, rows=200)
    (tmp_path / "in" / "in-01.txt").write_text("k1 fail 0\n")
    proc = yarn_cli.run("run", "--target", "yarn-per-job", *dconf({**YARN_CONF, "restart-strategy.type": "none"}),
                        "job.py", str(tmp_path / "in"), str(tmp_path / "out"), "BATCH", "0", "failing", timeout=120)
    assert proc.returncode == 1
    assert "a line says fail" in proc.stderr
    r = wait_final(app_id_of(proc.stderr))
    assert (r.state, r.final_status) == ("FINISHED", "FAILED")
    assert "ValueError: a line says fail" in r.diagnostics
    assert not (tmp_path / "out").exists() or final_counts(tmp_path / "out") == {}


def test_shipped_archives_are_unpacked_for_the_job(yarn_cli: Cli, tmp_path: Path) -> None:
    expected = write_input(tmp_path / "in", files=2, rows=400)
    archive = tmp_path / "lookup.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("factor.txt", "3")
    out = tmp_path / "out"
    proc = yarn_cli.run("run", "--target", "yarn-per-job", *dconf(YARN_CONF),
                        "-D", f"yarn.ship-archives={archive}#tables", "job.py", str(tmp_path / "in"), str(out),
                        "BATCH", "0", "lookup", "tables/factor.txt", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert final_counts(out) == collections.Counter({k: 3 * n for k, n in expected.items()})


VENV_JOB = textwrap.dedent("""\
    import sys
    import pyarrow as pa
    import yarnflow

    def where(b):
        import only_in_the_client_venv  # installed in the client's environment and nowhere else
        n = b.num_rows
        return pa.record_batch({"x": b.column("x"), "python": pa.array([sys.executable] * n),
                                "prefix": pa.array([sys.prefix] * n),
                                "yarnflow": pa.array([yarnflow.__file__] * n),
                                "marker": pa.array([only_in_the_client_venv.__file__] * n)})

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(1)
    env.from_collection({"x": [1, 2, 3]}).map_batches(where, name="where").print()
    env.execute("venv")
""")

# yarnflow's own sources, as `pip install .` reads them (copied, so the build writes nothing into the checkout)
SOURCES = ("setup.py", "pyproject.toml", "README.md", "client", "am", "worker", "common", "conf", "sandbox")


def client_venv(tmp_path: Path) -> Path:
    """A virtualenv of the user's own, made as a newcomer makes one (`python -m venv`, then
    `pip install .` of yarnflow with its dependencies, and a package of the user's): nothing in
    it comes from the environment running the suite or from the system interpreter. pip takes
    the dependencies from its cache (the suite's own install put them there)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    src = tmp_path / "yarnflow-src"
    src.mkdir()
    for name in SOURCES:
        source = Path(REPO) / name
        if source.is_dir():
            shutil.copytree(source, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(source, src / name)
    marker = tmp_path / "marker-src"
    (marker / "only_in_the_client_venv").mkdir(parents=True)
    (marker / "only_in_the_client_venv" / "__init__.py").write_text("")
    (marker / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools>=64"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "only-in-the-client-venv"
        version = "1.0"
        """))
    installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                                "--disable-pip-version-check", f"{src}/", f"{marker}/"],
                               timeout=600, capture_output=True, text=True)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return venv


@pytest.mark.timeout(900)
def test_the_clients_virtualenv_is_shipped_and_runs_the_containers(yarn_cli: Cli, sandbox: Sandbox,
                                                                    tmp_path: Path) -> None:
    venv = client_venv(tmp_path)
    venv_site = next((venv / "lib").glob("python3*/site-packages"))
    check = subprocess.run([str(venv / "bin" / "python"), "-c", "import yarnflow; print(yarnflow.__file__)"],
                           capture_output=True, text=True, timeout=60, check=True)
    assert check.stdout.strip().startswith(str(venv_site)), check.stdout  # the client runs its own copy
    assert subprocess.run([sys.executable, "-c", "import only_in_the_client_venv"], capture_output=True,
                          timeout=60).returncode == 1  # the suite's environment lacks the user's package
    (tmp_path / "venv_job.py").write_text(VENV_JOB)
    env = dict(yarn_cli.env, HOME=str(tmp_path / "home"))  # venv-pack's cache goes there
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "yarnflow", "run", "--target", "yarn-per-job",
                           "--no-progress", *dconf(YARN_CONF), "-D", "yarn.ship-venv=true", "venv_job.py"],
                          capture_output=True, text=True, timeout=420, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in proc.stdout.splitlines()[1:]]
    assert sorted(int(r[0]) for r in rows) == [1, 2, 3]
    app_id = app_id_of(proc.stderr)
    containers = Path(sandbox.work_dir) / "local" / app_id
    for _, python, prefix, yarnflow_file, marker in rows:  # the TaskExecutor ran the unpacked environment
        assert python.startswith(str(containers)) and python.endswith("/environment/bin/python"), python
        assert prefix.startswith(str(containers)) and prefix.endswith("/environment"), prefix
        # yarnflow and the user's package came out of the shipped archive, not from the client's folders
        assert yarnflow_file.startswith(prefix + "/lib/") and "site-packages/yarnflow/" in yarnflow_file, yarnflow_file
        assert marker.startswith(prefix + "/lib/") and "site-packages/only_in_the_client_venv/" in marker, marker
    assert list((tmp_path / "home" / ".cache" / "yarnflow").glob("venv-*.tar.gz"))  # packed once, cached


def test_a_session_runs_two_jobs_and_answers_list_info_cancel_and_stop(yarn_cli: Cli, sandbox: Sandbox,
                                                                         tmp_path: Path) -> None:
    expected = write_input(tmp_path / "in", files=2, rows=1000)
    app_id, keys, started = start_session(yarn_cli)
    assert f"yarnflow run {' '.join(keys)} JOB.py" in started.stdout
    # mutual TLS with the application's skein credentials (issue 31): refused without them, or with
    # another cluster's; the CLI below finds them through its skein driver
    address = re.search(r"AppMaster at (\S+:\d+)", started.stdout).group(1)  # type: ignore[union-attr]
    for tls in (None, new_credentials(str(tmp_path / "other"))):
        stranger = RemoteDispatcherGateway(address, 5000, tls=tls)
        with pytest.raises(RpcConnectionError):
            stranger.cluster_info()
        stranger.close()
    member = RemoteDispatcherGateway(address, 5000, tls=TlsCredentials(f"{sandbox.config_dir}/skein.crt",
                                                                        f"{sandbox.config_dir}/skein.pem"))
    assert member.cluster_info().leader_session_id
    member.close()
    # a long STREAMING job (about 15 s: it must outlast the next job and the list / info below on a
    # loaded machine), detached, then a BATCH job beside it, attached
    slow = yarn_cli.run("run", "--target", "yarn-session", "--detached", *keys, "job.py", str(tmp_path / "in"),
                        str(tmp_path / "slow"), "STREAMING", "3", "slow", timeout=60)
    assert slow.returncode == 0, slow.stderr
    slow_id = re.search(r"Job slow \(([0-9a-f]{32})\) submitted detached", slow.stderr).group(1)  # type: ignore[union-attr]
    quick = yarn_cli.run("run", *keys, "job.py", str(tmp_path / "in"), str(tmp_path / "quick"), "BATCH", "0",
                         "quick", timeout=90)
    assert quick.returncode == 0, quick.stderr
    assert_batch_exact(tmp_path / "quick", expected)

    listed = yarn_cli.run("list", "--json", *keys, check=True)
    states = {(j := json.loads(line))["name"]: j["state"] for line in listed.stdout.splitlines()}
    assert states == {"slow": "RUNNING", "quick": "FINISHED"}
    info = yarn_cli.run("info", slow_id, *keys, check=True)
    assert "RUNNING" in info.stdout and "parse" in info.stdout
    # a TaskExecutor container's data port refuses Flight clients without the application's
    # credentials (plain, or another cluster's certificate)
    logs = Path(sandbox.work_dir) / "logs" / app_id
    data = next(m.group(1) for p in logs.rglob("*") if p.is_file()
                if (m := re.search(r"started: rpc \S+, data (\S+),", p.read_text(errors="replace"))))
    for client in (flight.connect(f"grpc+tcp://{data}"),
                   flight.connect(f"grpc+tls://{data}", **new_credentials(str(tmp_path / "other-te")).flight_client_options())):
        with pytest.raises(flight.FlightError):
            client.list_actions(options=flight.FlightCallOptions(timeout=5))
        client.close()
    assert yarn_cli.run("cancel", slow_id, *keys, check=True).stdout.strip() == f"cancelling job {slow_id}"
    wait_until(lambda: job_info(app_id, "slow").status == JobStatus.CANCELED, 30, "the job was not cancelled")

    stopped = yarn_cli.run("session", "stop", *keys, check=True)
    assert "stopping the session" in stopped.stdout
    r = wait_final(app_id)
    assert (r.state, r.final_status) == ("FINISHED", "SUCCEEDED")
    after = yarn_cli.run("list", *keys)
    assert after.returncode == 1
    assert after.stderr.strip() == (f"error: YARN application {app_id} is not running: FINISHED (final status "
                                    "SUCCEEDED): the cluster was shut down")
    wait_until(lambda: not container_processes(app_id, "yarnflow.worker"), 20, "TaskExecutors outlived the session")


def test_an_attached_session_stops_its_application_on_ctrl_c(yarn_cli: Cli, tmp_path: Path) -> None:
    expected = write_input(tmp_path / "in", files=2, rows=400)
    proc = yarn_cli.start("session", "start", "--target", "yarn", *dconf(YARN_CONF))
    first = proc.stdout.readline()  # type: ignore[union-attr]
    app_id = app_id_of(first)
    assert "yarnflow session running" in proc.stdout.readline()  # type: ignore[union-attr]
    ran = yarn_cli.run("run", "-D", f"yarn.application.id={app_id}", "job.py", str(tmp_path / "in"),
                       str(tmp_path / "out"), "BATCH", "0", "attached", timeout=90)
    assert ran.returncode == 0, ran.stderr
    assert_batch_exact(tmp_path / "out", expected)
    info = yarn_cli.run("info", "-D", f"yarn.application.id={app_id}",
                        json.loads(yarn_cli.run("list", "--json", "-D", f"yarn.application.id={app_id}",
                                                check=True).stdout.splitlines()[0])["id"], check=True)
    # a TaskExecutor's ResourceID is its YARN container id
    assert "container_" + app_id[len("application_"):] in info.stdout, info.stdout
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert f"session stopped (SIGINT): YARN application {app_id} FINISHED (final status SUCCEEDED)" in out
    assert proc.returncode == 0
    wait_until(lambda: not container_processes(app_id, "yarnflow.worker")
               and not container_processes(app_id, "yarnflow.am"), 20, "the session's containers outlived it")


def test_a_killed_taskexecutor_container_is_replaced_and_the_job_stays_exact(yarn_cli: Cli, sandbox: Sandbox,
                                                                             tmp_path: Path) -> None:
    expected = write_input(tmp_path / "in")
    out = tmp_path / "out"
    proc = yarn_cli.start("run", "--target", "yarn-per-job", *dconf({**YARN_CONF, **CHECKPOINTS}), "job.py",
                          str(tmp_path / "in"), str(out), "STREAMING", "0.1", "te-kill")
    app_id = wait_until(lambda: next((a for a in _apps(sandbox) if a), None), 30, "no application was submitted")
    wait_checkpointed(app_id, "te-kill")
    assert 0 < report(app_id).progress < 1  # the AppMaster reports its job's progress to YARN
    [victim, *_] = container_processes(app_id, "yarnflow.worker")
    killed = victim.environ()["CONTAINER_ID"]
    victim.send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert_upsert_counts(out, expected)
    started = containers_started(sandbox, app_id)
    assert killed in started and len(started) == 4, started  # the AppMaster, two TaskExecutors, a replacement
    assert (report(app_id).final_status) == "SUCCEEDED"


def test_with_flinks_default_restart_strategy_a_lost_container_restarts_the_job_exactly_and_is_named(
        yarn_cli: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    # no restart-strategy.* keys: a job that takes checkpoints restarts (exponential-delay) and its
    # failure history names the lost container, not what its consumers saw of the loss
    expected = write_input(tmp_path / "in")
    out = tmp_path / "out"
    conf = {k: v for k, v in YARN_CONF.items() if not k.startswith("restart-strategy.")}
    proc = yarn_cli.start("run", "--target", "yarn-per-job", *dconf({**conf, **CHECKPOINTS}), "job.py",
                          str(tmp_path / "in"), str(out), "STREAMING", "0.1", "default-restart")
    app_id = wait_until(lambda: next((a for a in _apps(sandbox) if a), None), 30, "no application was submitted")
    wait_checkpointed(app_id, "default-restart")
    [victim, *_] = container_processes(app_id, "yarnflow.worker")
    killed = victim.environ()["CONTAINER_ID"]
    victim.send_signal(signal.SIGKILL)
    def first_failure() -> Any:
        job = job_info(app_id, "default-restart")
        return job.failure_history[0] if job is not None and job.failure_history else None

    # what a consumer saw first (a connection refused) is recorded at once, then explained by the
    # loss of the container once it is known (its heartbeat timeout or YARN's report)
    wait_until(lambda: (f := first_failure()) is not None and f.error.error_class == "TaskExecutorLostError", 30,
               lambda: f"the failure does not name the lost container: {first_failure()}")
    assert killed in first_failure().error.message
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert_upsert_counts(out, expected)  # every row once, after the restart from the latest checkpoint
    assert report(app_id).final_status == "SUCCEEDED"


def test_more_failed_containers_than_allowed_fail_the_application(yarn_cli: Cli, sandbox: Sandbox,
                                                                   tmp_path: Path) -> None:
    write_input(tmp_path / "in")
    conf = {**YARN_CONF, **CHECKPOINTS, "yarn.maximum-failed-containers": "1"}
    proc = yarn_cli.start("run", "--target", "yarn-per-job", *dconf(conf), "job.py", str(tmp_path / "in"),
                          str(tmp_path / "out"), "STREAMING", "0.1", "flaky")
    app_id = wait_until(lambda: next((a for a in _apps(sandbox) if a), None), 30, "no application was submitted")
    killed: set[str] = set()
    for _ in range(2):  # the first failure is replaced, the second is one too many
        wait_checkpointed(app_id, "flaky")
        victim = wait_until(lambda: next((p for p in container_processes(app_id, "yarnflow.worker")
                                          if p.environ()["CONTAINER_ID"] not in killed), None), 30, "no TaskExecutor")
        killed.add(victim.environ()["CONTAINER_ID"])
        victim.send_signal(signal.SIGKILL)
        if len(killed) == 1:
            wait_until(lambda: len(containers_started(sandbox, app_id)) == 4, 30, "no replacement container")
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1
    r = wait_final(app_id)
    assert (r.state, r.final_status) == ("FINISHED", "FAILED")
    assert "2 TaskExecutor containers failed, more than yarn.maximum-failed-containers (1)" in r.diagnostics
    assert "yarn.maximum-failed-containers" in stderr


def _apps(sandbox: Sandbox) -> list[str]:
    logs = Path(sandbox.work_dir) / "logs"
    return sorted(p.name for p in logs.iterdir()) if logs.exists() else []


@pytest.mark.parametrize("mode", ["per-job", "application"])
def test_the_second_attempt_recovers_the_job_when_the_appmaster_dies_with_ha(yarn_cli: Cli, sandbox: Sandbox,
                                                                             zk_chroot: Any, tmp_path: Path,
                                                                             mode: str) -> None:
    """With ZooKeeper HA YARN's next attempt recovers the job (JobGraph, artifact, latest
    checkpoint); in application mode it runs main() again, whose execute() finds the recovered
    job by its fixed id and follows it (Flink's application mode does the same)."""
    expected = write_input(tmp_path / "in")
    out = tmp_path / "out"
    ha = {k: v for k, v in ha_conf(zk_chroot).items() if k != "high-availability.cluster-id"}  # the app id
    conf = {**YARN_CONF, **CHECKPOINTS, **ha, "yarn.application-attempts": "2",
            "taskmanager.registration.timeout": "20 s"}
    proc = yarn_cli.start("run", "--target", f"yarn-{mode}", *dconf(conf), "job.py", str(tmp_path / "in"), str(out),
                          "STREAMING", "0.1", "am-kill")
    app_id = wait_until(lambda: next((a for a in _apps(sandbox) if a), None), 60,
                        lambda: "no application was submitted" + (f": the client exited {proc.returncode}: "
                                                                   f"{proc.communicate()[1][-3000:]}"
                                                                   if proc.poll() is not None else ""))
    wait_checkpointed(app_id, "am-kill", ha)
    [am] = container_processes(app_id, "yarnflow.am")
    assert am.environ()["CONTAINER_ID"].endswith("_01_000001")
    am.send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=150)
    assert proc.returncode == 0, stderr
    assert_upsert_counts(out, expected)
    r = report(app_id)
    assert (r.state, r.final_status) == ("FINISHED", "SUCCEEDED")
    assert any(c.endswith("_02_000001") for c in containers_started(sandbox, app_id)), "no second attempt"
    # the job's ZooKeeper entries were cleaned up with it: nothing would recover it again
    assert not [p for p in zk_chroot.tree() if "/jobgraphs/" in p]
    if mode == "application":  # main() ran again and followed the recovered job (no second job)
        again = "".join(p.read_text(errors="replace") for p in (Path(sandbox.work_dir) / "logs" / app_id).rglob("*")
                        if p.is_file() and "_02_000001" in str(p))
        assert "was submitted by an earlier run of main() and recovered: following it" in again, again[-3000:]


def test_without_ha_a_dead_session_appmaster_fails_the_application_saying_why(yarn_cli: Cli,
                                                                              tmp_path: Path) -> None:
    """A session's jobs came from clients that are gone: without high availability nothing can
    bring them back, and the next attempt says so rather than serve an empty session."""
    app_id, keys, _ = start_session(yarn_cli, {**YARN_CONF, "yarn.application-attempts": "2"})
    [am] = wait_until(lambda: container_processes(app_id, "yarnflow.am"), 30, "no AppMaster")
    am.send_signal(signal.SIGKILL)
    r = wait_final(app_id)
    assert (r.state, r.final_status) == ("FINISHED", "FAILED")  # the second attempt ended it, saying why
    assert "without high availability (high-availability.type: zookeeper)" in r.diagnostics, r.diagnostics
    wait_until(lambda: not container_processes(app_id, "yarnflow.worker"), 20, "TaskExecutors outlived the AppMaster")


@pytest.mark.parametrize("mode", ["per-job", "application"])
def test_without_ha_the_next_attempt_starts_the_job_again_from_its_latest_checkpoint(
        yarn_cli: Cli, sandbox: Sandbox, tmp_path: Path, mode: str) -> None:
    """As Flink: an AppMaster container that dies without high availability takes nothing with
    it that a retained checkpoint does not hold. YARN's next attempt runs the same job (per-job:
    the JobGraph shipped with the application; application mode: main() again, whose job gets
    the same fixed id) from the latest checkpoint in execution.checkpointing.dir, exactly."""
    expected = write_input(tmp_path / "in")
    out = tmp_path / "out"
    conf = {**YARN_CONF, **CHECKPOINTS, "yarn.application-attempts": "2",
            "execution.checkpointing.dir": f"file://{tmp_path}/checkpoints"}
    (tmp_path / "app.py").write_text(JOB)
    proc = yarn_cli.start("run", "--target", f"yarn-{mode}", *dconf(conf), "app.py", str(tmp_path / "in"), str(out),
                          "STREAMING", "0.1", "no-ha")
    app_id = wait_until(lambda: next((a for a in _apps(sandbox) if a), None), 30, "no application was submitted")
    wait_checkpointed(app_id, "no-ha")
    first = job_info(app_id, "no-ha")
    [am] = container_processes(app_id, "yarnflow.am")
    am.send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=150)
    assert proc.returncode == 0, stderr
    assert_upsert_counts(out, expected)
    assert any(c.endswith("_02_000001") for c in containers_started(sandbox, app_id)), "no second attempt"
    logs = "".join(p.read_text(errors="replace") for p in (Path(sandbox.work_dir) / "logs" / app_id).rglob("*")
                   if p.is_file() and "_02_000001" in str(p))
    assert f"job {first.job_id} resumes from its latest checkpoint" in logs or \
        f"job {first.job_id} resumes from its latest retained checkpoint" in logs, logs[-3000:]
    assert (report(app_id).final_status) == "SUCCEEDED"


def test_idle_taskexecutor_containers_are_released(yarn_cli: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    expected = write_input(tmp_path / "in", files=2, rows=400)
    app_id, keys, _ = start_session(yarn_cli, {**YARN_CONF, "resourcemanager.taskmanager-timeout": "1 s"})
    ran = yarn_cli.run("run", *keys, "job.py", str(tmp_path / "in"), str(tmp_path / "out"), "BATCH", "0", "once",
                       timeout=90)
    assert ran.returncode == 0, ran.stderr
    assert_batch_exact(tmp_path / "out", expected)
    with skein.Client.from_global_driver() as client:
        app = client.connect(app_id)
        wait_until(lambda: len(app.get_containers(services=["taskexecutor"], states=["SUCCEEDED", "KILLED"])) == 2,
                   30, "idle TaskExecutor containers were not released")
        assert not app.get_containers(services=["taskexecutor"])  # none running, none requested
    wait_until(lambda: not container_processes(app_id, "yarnflow.worker"), 10, "released TaskExecutors still run")
    yarn_cli.run("session", "stop", *keys, check=True)
    assert wait_final(app_id).final_status == "SUCCEEDED"


def test_a_taskexecutor_started_by_scaling_the_service_joins_the_session_whose_ui_yarn_links(
        yarn_cli: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    # `skein container scale --service taskexecutor`: the container is not the ResourceManager's
    # request, so it has no --rm-address; it finds the AppMaster in the application's KV store
    expected = write_input(tmp_path / "in", files=2, rows=300)
    app_id, keys, _ = start_session(yarn_cli)
    with skein.Client.from_global_driver() as client:
        app = client.connect(app_id)
        dispatcher = RemoteDispatcherGateway(app.kv.wait(ADDRESS_KEY).decode(),
                                             tls=skein_client_credentials(client.security))
        assert dispatcher.cluster_info().registered_taskexecutors == 0
        app.scale("taskexecutor", count=1)
        wait_until(lambda: dispatcher.cluster_info().registered_taskexecutors == 1, 60,
                   "the scaled TaskExecutor never registered")
        assert [c.state for c in app.get_containers(services=["taskexecutor"])] == ["RUNNING"]
        dispatcher.close()
    # YARN's tracking URL is its proxy of the application's web UI (skein's), which links the
    # yarnflow web UI; that asks for the cluster's REST token (derived from the application's credentials)
    proxied = report(app_id).tracking_url
    assert proxied == f"http://127.0.0.1:{sandbox.web_port}/proxy/{app_id}/", proxied
    index = requests.get(proxied, timeout=10)
    assert index.status_code == 200 and '<a href="pages/yarnflow/">yarnflow web UI</a>' in index.text, index.text
    tracking = proxied + "pages/yarnflow/"
    with skein.Client.from_global_driver() as client:
        assert client.connect(app_id).ui.get_pages()["yarnflow"].address == tracking
    page = requests.get(tracking, timeout=10)
    assert page.status_code == 200 and "<title>yarnflow: sign in" in page.text, tracking
    token = rest_token(TlsCredentials(f"{sandbox.config_dir}/skein.crt", f"{sandbox.config_dir}/skein.pem"))
    signed = {"Authorization": f"Bearer {token}"}
    assert "<title>yarnflow</title>" in requests.get(tracking, headers=signed, timeout=10).text
    assert requests.get(tracking.rstrip("/") + "/overview", timeout=10).status_code == 401
    assert requests.get(tracking.rstrip("/") + "/overview", headers=signed, timeout=10).json()["taskmanagers"] == 1
    # a TaskExecutor's id in the REST API and web UI is its YARN container id, as `skein container
    # ls` shows it (issue 55: a user matches the two)
    shown = {t["id"] for t in requests.get(tracking.rstrip("/") + "/taskmanagers", headers=signed,
                                           timeout=10).json()["taskmanagers"]}
    with skein.Client.from_global_driver() as client:
        containers = client.connect(app_id).get_containers(services=["taskexecutor"])
    assert shown == {c.yarn_container_id for c in containers} and all(i.startswith("container_") for i in shown)
    _run_once_then_stop(yarn_cli, keys, tmp_path, expected, app_id)


def test_application_mode_runs_main_in_the_appmaster_and_counts_every_row(yarn_cli: Cli, sandbox: Sandbox,
                                                                          tmp_path: Path) -> None:
    expected = write_input(tmp_path / "in")
    (tmp_path / "naming.py").write_text("def job_name(tag):\n    return f'app-{tag}'\n")  # a module beside it
    (tmp_path / "app.py").write_text(JOB.replace("env.execute(name)", "import naming\nenv.execute(naming.job_name(name))"))
    ran = yarn_cli.run("run", "--target", "yarn-application", *dconf(YARN_CONF), "app.py", str(tmp_path / "in"),
                       str(tmp_path / "out"), "BATCH", "0", "mode", timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert_batch_exact(tmp_path / "out", expected)
    app_id = app_id_of(ran.stderr)
    assert "final status SUCCEEDED" in ran.stderr and "application mode" in ran.stderr
    # compiled and submitted in the AppMaster: its main()'s error output, printed by the client once the
    # application ended, says so
    assert ran.stderr.index("application mode") < ran.stderr.index("Submitted job app-mode") < \
        ran.stderr.index("final status SUCCEEDED")
    assert report(app_id).diagnostics.startswith("main() of app.py returned")


def test_the_word_count_example_runs_in_application_mode_and_its_printed_counts_come_back(
        yarn_cli: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    """The README's example as written: its data file (read beside the job file) is shipped with
    the job's folder, and what main() printed comes back to the client with the jobs' ends."""
    example = Path(REPO) / "examples" / "wordcount.py"
    ran = yarn_cli.run("run", "--target", "yarn-application", *dconf(YARN_CONF), str(example), "--parallelism", "2",
                       timeout=150)
    assert ran.returncode == 0, ran.stderr
    text = (Path(REPO) / "examples" / "data" / "sample.txt").read_text().lower()
    expected = collections.Counter(re.findall(r"\w+", text))
    lines = ran.stdout.splitlines()
    assert lines[0].split("\t") == ["word", "count"]
    assert {w: int(n) for w, n in (line.split("\t") for line in lines[1:])} == dict(expected)
    assert re.search(r"Job wordcount \([0-9a-f]{32}\) FINISHED in ", ran.stderr), ran.stderr
    assert "final status SUCCEEDED" in ran.stderr


def test_an_application_whose_main_raises_fails_with_the_traceback(yarn_cli: Cli, sandbox: Sandbox,
                                                                     tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("import sys\n\ndef check(args):\n    raise RuntimeError(f'no input in {args}')\n\n"
                                     "check(sys.argv[1:])\n")
    ran = yarn_cli.run("run", "--target", "yarn-application", *dconf(YARN_CONF), "bad.py", "/nowhere", timeout=120)
    assert ran.returncode == 1, ran.stderr
    app_id = app_id_of(ran.stderr)
    final = report(app_id)
    assert str(final.final_status) == "FAILED"
    assert "main() of bad.py failed" in final.diagnostics and "RuntimeError: no input in ['/nowhere']" in final.diagnostics
    assert "line 4, in check" in final.diagnostics  # where in main() it raised
    assert "RuntimeError: no input in ['/nowhere']" in ran.stderr  # the client shows it too


def test_a_detached_application_returns_its_id_and_runs_on(yarn_cli: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    expected = write_input(tmp_path / "in", files=2, rows=300)
    ran = yarn_cli.run("run", "--target", "yarn-application", "--detached", *dconf(YARN_CONF), "job.py",
                       str(tmp_path / "in"), str(tmp_path / "out"), "BATCH", "0", "detached", timeout=60)
    assert ran.returncode == 0, ran.stderr
    app_id = app_id_of(ran.stderr)
    assert f"yarn.application.id={app_id}" in ran.stderr
    assert str(wait_final(app_id, 120).final_status) == "SUCCEEDED"
    assert_batch_exact(tmp_path / "out", expected)


def test_errors_a_user_hits_are_one_clear_line(yarn_cli: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    write_input(tmp_path / "in", files=1, rows=10)
    unknown = yarn_cli.run("list", "-D", "yarn.application.id=application_1_0099")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == ("error: unknown YARN application 'application_1_0099' (Unknown ApplicationId "
                                      "'application_1_0099'): see `skein application ls` for the running ones")

    too_big = yarn_cli.run("run", "--target", "yarn-per-job", *dconf(YARN_CONF),
                           "-D", f"taskmanager.memory.process.size={2 * MAX_MEMORY_MB} mb", "job.py",
                           str(tmp_path / "in"), str(tmp_path / "out"), "BATCH", "0", "big")
    assert too_big.returncode == 1
    [line] = too_big.stderr.strip().splitlines()
    assert line.startswith("error: YARN refused the application: ")
    assert f"maximum allowed allocation=<memory:{MAX_MEMORY_MB}" in line, line
    assert _apps(sandbox) == []  # nothing was started

    no_driver = dict(yarn_cli.env, SKEIN_CONFIG=str(tmp_path / "no-skein"))
    yarn_cli.env, saved = no_driver, yarn_cli.env
    try:
        for args in (("run", "--target", "yarn-per-job", "job.py", str(tmp_path / "in"), str(tmp_path / "out"),
                      "BATCH", "0", "x"),
                     ("session", "start", "--target", "yarn"),
                     ("list", "-D", "yarn.application.id=application_1_0001")):
            proc = yarn_cli.run(*args)
            assert proc.returncode == 1, args
            [line] = proc.stderr.strip().splitlines()
            assert line.startswith("error: no skein driver reachable") and "yarnflow yarn-sandbox" in line, line
    finally:
        yarn_cli.env = saved


def test_no_container_process_outlives_a_killed_application(yarn_cli: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    write_input(tmp_path / "in")
    started = yarn_cli.run("session", "start", "--target", "yarn", "--detached", *dconf(YARN_CONF), timeout=90)
    app_id = app_id_of(started.stdout)
    yarn_cli.run("run", "--detached", "-D", f"yarn.application.id={app_id}", "job.py", str(tmp_path / "in"),
                 str(tmp_path / "out"), "STREAMING", "1", "long", check=True, timeout=60)
    wait_until(lambda: len(container_processes(app_id, "yarnflow.worker")) == 2, 60, "no TaskExecutors started")
    with skein.Client.from_global_driver() as client:
        client.kill_application(app_id)
    assert wait_final(app_id).state == "KILLED"
    wait_until(lambda: not container_processes(app_id, "yarnflow.worker")
               and not container_processes(app_id, "yarnflow.am"), 20, "container processes outlived the kill")


# ---- Spark stages on executors in containers of the application (issue 25) --------------------

SPARK_JOB = textwrap.dedent("""\
    import sys

    import yarnflow

    src, out, sleep_s = sys.argv[1:4]

    def count(df):
        import time

        from pyspark.sql import functions as F, types as T

        def slow(k):
            time.sleep(float(sleep_s))
            return k

        slowly = F.udf(slow, T.StringType())
        return (df.select(slowly(F.col("k")).alias("k"), "v").groupBy("k")
                .agg(F.count("*").alias("n"), F.sum("v").alias("s")))

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(2)
    env.read_parquet(src, name="rows").spark(count, name="count").sink_to_parquet(out)
    env.execute("spark-on-yarn")
""")
SPARK_CONF = {**YARN_CONF, "spark.executor.memory": "512m", "spark.executor.instances": "2",
              "spark.driver.memory": "512m", "taskmanager.memory.process.size": "1 gb"}


def spark_input(folder: Path, files: int = 8, rows: int = 4000) -> dict[str, tuple[int, int]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    expected: dict[str, tuple[int, int]] = {}
    for f in range(files):
        ks = [f"k{(f * rows + r) % KEYS}" for r in range(rows // files)]
        vs = list(range(f * rows, f * rows + rows // files))
        pq.write_table(pa.table({"k": ks, "v": vs}), folder / f"part-{f}.parquet")
        for k, v in zip(ks, vs):
            n, s = expected.get(k, (0, 0))
            expected[k] = (n + 1, s + v)
    return expected


def spark_counts(out: Path) -> dict[str, tuple[int, int]]:
    table = pads.dataset(str(out), format="parquet").to_table()
    keys = table["k"].to_pylist()
    assert len(keys) == len(set(keys)), "a key was committed twice"
    return dict(zip(keys, zip(table["n"].to_pylist(), table["s"].to_pylist())))


def spark_reports(storage: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(storage.glob("jobs/*/spark/*.json"))]


@pytest.mark.timeout(240)
def test_a_spark_stage_runs_on_executors_in_containers_of_the_application(yarn_cli: Cli, sandbox: Sandbox,
                                                                         tmp_path: Path) -> None:
    expected = spark_input(tmp_path / "in")
    out, storage = tmp_path / "out", tmp_path / "storage"
    (tmp_path / "spark_job.py").write_text(SPARK_JOB)
    proc = yarn_cli.run("run", "--target", "yarn-per-job", *dconf(SPARK_CONF), "-D",
                        f"high-availability.storageDir=file://{storage}", "spark_job.py", str(tmp_path / "in"),
                        str(out), "0", timeout=200)
    assert proc.returncode == 0, proc.stderr
    assert spark_counts(out) == expected
    [report_] = spark_reports(storage)
    assert report_["master"].startswith("spark://") and report_["executors"] == 2, report_
    app_id = app_id_of(proc.stderr)
    # the AppMaster, two TaskExecutors, and the Spark master and its two workers
    assert len(containers_started(sandbox, app_id)) == 6, containers_started(sandbox, app_id)
    assert report(app_id).final_status == "SUCCEEDED"


@pytest.mark.timeout(240)
def test_a_killed_spark_executor_container_is_retried_by_spark_and_the_result_stays_exact(
        yarn_cli: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    expected = spark_input(tmp_path / "in", files=8, rows=4000)
    out, storage = tmp_path / "out", tmp_path / "storage"
    (tmp_path / "spark_job.py").write_text(SPARK_JOB)
    proc = yarn_cli.start("run", "--target", "yarn-per-job", *dconf(SPARK_CONF), "-D",
                          f"high-availability.storageDir=file://{storage}", "spark_job.py", str(tmp_path / "in"),
                          str(out), "0.004")
    app_id = wait_until(lambda: next((a for a in _apps(sandbox) if a), None), 30, "no application was submitted")

    prefix = "container_" + app_id[len("application_"):]

    def in_containers(marker: str) -> list[tuple[psutil.Process, str]]:
        """Live processes whose command line has ``marker``, in the application's containers,
        with their container's id (inherited down the process tree, to the executors)."""
        found = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if marker in " ".join(p.info["cmdline"] or []):
                    container = p.environ().get("CONTAINER_ID", "")
                    if container.startswith(prefix):
                        found.append((p, container))
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
        return found

    def busy_executor() -> list[tuple[psutil.Process, str]]:
        if proc.poll() is not None:  # the job ended before an executor was seen: say how
            raise AssertionError(f"the job ended (exit {proc.returncode}) before a Spark executor was seen: "
                                 f"{proc.communicate()[1][-3000:]}")
        return in_containers("CoarseGrainedExecutorBackend")

    [(_, killed), *_] = wait_until(
        busy_executor, 150, lambda: f"no Spark executor ever ran in a worker container; Spark processes in "
                                    f"the containers: {[(c, p.name()) for p, c in in_containers('spark')]}",
        interval_s=0.2)
    time.sleep(1.0)  # its tasks are under way
    for p, container in in_containers(""):  # the whole container: its daemon, worker JVM and executor
        if container == killed:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
    _, stderr = proc.communicate(timeout=200)
    assert proc.returncode == 0, stderr
    assert spark_counts(out) == expected
    started = containers_started(sandbox, app_id)
    assert killed in started and len(started) >= 7, started  # and a worker that replaced it
    assert report(app_id).final_status == "SUCCEEDED"


def test_session_scale_asks_yarn_for_taskexecutor_containers_and_releases_them(yarn_cli: Cli, sandbox: Sandbox,
                                                                                tmp_path: Path) -> None:
    """``yarnflow session scale`` on YARN: containers are requested up to the count and killed
    down to it (issue 30); a job then runs on what is there."""
    expected = write_input(tmp_path / "in", files=2, rows=300)
    app_id, keys, _ = start_session(yarn_cli)
    with skein.Client.from_global_driver() as client:
        app = client.connect(app_id)
        grown = yarn_cli.run("session", "scale", *keys, "--taskexecutors", "2", timeout=60)
        assert grown.returncode == 0, grown.stderr
        assert grown.stdout.strip() == "the session runs 2 TaskExecutors"
        wait_until(lambda: len(app.get_containers(services=["taskexecutor"], states=["RUNNING"])) == 2, 60,
                   "no 2 TaskExecutor containers")
        yarn_cli.run("session", "scale", *keys, "--taskexecutors", "1", check=True, timeout=60)
        wait_until(lambda: len(app.get_containers(services=["taskexecutor"], states=["RUNNING"])) == 1
                   and len(app.get_containers(services=["taskexecutor"], states=["KILLED", "SUCCEEDED"])) == 1,
                   30, "the surplus TaskExecutor container was not released")
    _run_once_then_stop(yarn_cli, keys, tmp_path, expected, app_id)
