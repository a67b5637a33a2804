"""YARN through skein, the client's side: the ApplicationSpec of a yarnflow application, its
submission, and finding a running application's AppMaster.

A yarnflow application's spec is built in code from the configuration (nothing hand-written to
keep in step):

- the master (``jobmanager.memory.process.size``, ``yarn.appmaster.vcores``) runs
  ``python -m yarnflow.am --target yarn``; for a per-job application with the job's JobGraph
  and artifact, shipped as files;
- the service ``taskexecutor`` (``taskmanager.memory.process.size``, ``taskmanager.cpu.cores``)
  starts with no instances: the AppMaster's SkeinDriver adds a container per TaskExecutor it
  needs, with its own address in the container's environment, and YARN's container id becomes
  the TaskExecutor's ResourceID;
- every container gets the client's configuration (``yarnflow.yaml`` in its working directory), the archives
  of ``yarn.ship-archives`` unpacked, and with ``yarn.ship-venv`` the client's virtual environment
  packed by venv-pack (unpacked as ``environment``, whose Python then runs everything);
- name, queue, tags and ``yarn.application-attempts`` (the master's attempts) from configuration.

skein validates the spec before anything is submitted. The application's files are uploaded by
skein at submission (to the cluster's staging directory on Hadoop), so the local copies made
here are removed once ``submit`` returned.

Finding an AppMaster: the leading AppMaster publishes its RPC address in the application's
key-value store (``yarnflow.common.yarn.ADDRESS_KEY``); ``ApplicationLocator`` reads it, and
says in one line why it cannot (no skein driver, unknown application, application not running).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from yarnflow.common.config import Configuration, Options, taskexecutor_cores
from yarnflow.common.errors import ConfigurationError, YarnError
from yarnflow.common.kerberos import KEYTAB_FILE, delegation_file_systems, login
from yarnflow.common.yarn import ADDRESS_KEY, TLS_KEY

__all__ = ["ApplicationLocator", "Submission", "application_spec", "skein_client", "submit_application"]

log = logging.getLogger(__name__)

TASKEXECUTOR_SERVICE = "taskexecutor"  # the SkeinDriver's service
SPARK_MASTER_SERVICE, SPARK_WORKER_SERVICE = "spark-master", "spark-worker"  # and Spark's daemons
_SPARK_DAEMON_MB = 256  # SPARK_DAEMON_MEMORY of the standalone master's and workers' own JVMs
CONF_FILE = "yarnflow.yaml"  # in the container's working directory, which is YARNFLOW_CONF_DIR
VENV_DIR = "environment"
JOB_GRAPH_FILE = "jobgraph.bin"
ARTIFACT_FILE = "artifact.zip"
APPLICATION_DIR = "application"  # application mode: the job file and its modules, unpacked
_RESERVED = (CONF_FILE, VENV_DIR, JOB_GRAPH_FILE, ARTIFACT_FILE, APPLICATION_DIR, "work", "appmaster", KEYTAB_FILE)
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
_MIB = 1024 * 1024
# keys that describe the client's connection to a cluster, not the cluster
_CLIENT_ONLY = ("yarn.application.id",)


def skein_client(config: Configuration | None = None) -> Any:
    """The skein driver this machine is configured for ($SKEIN_CONFIG/driver): the one started
    with ``skein driver start`` on a Hadoop edge node, or ``yarnflow yarn-sandbox``. With the
    Kerberos keys (``security.kerberos.login.*``) and no such driver, one of its own, logged in
    with the keytab (``skein.Client(principal=..., keytab=...)``)."""
    import skein
    from skein.exceptions import ConnectionError as SkeinConnectionError
    from skein.exceptions import DriverNotRunningError

    from yarnflow.common.kerberos import login

    kerberos = login(config) if config is not None else None
    where = os.environ.get("SKEIN_CONFIG") or "~/.skein"
    try:
        return skein.Client.from_global_driver()
    except (DriverNotRunningError, SkeinConnectionError) as exc:
        if kerberos is not None:
            principal, keytab = kerberos
            log.info("no skein driver running: starting one logged in as %s (keytab %s)", principal, keytab)
            try:
                return skein.Client(principal=principal, keytab=keytab)
            except Exception as start_exc:  # noqa: BLE001 - skein.DriverError and Java's errors
                raise YarnError(f"cannot start a skein driver as {principal} with {keytab}: {start_exc}") from None
        raise YarnError(f"no skein driver reachable (from {where}: {exc}): on a Hadoop cluster start one with "
                        f"`skein driver start`, on this machine `yarnflow yarn-sandbox`") from None


def _mib(n_bytes: int) -> int:
    return max(1, math.ceil(n_bytes / _MIB))


def _archive_name(path: str) -> str:
    base = os.path.basename(path.rstrip("/"))
    for suffix in _ARCHIVE_SUFFIXES:
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base


def _parse_archives(value: str) -> list[tuple[str, str]]:
    """``yarn.ship-archives``: ``path[#name],...`` -> [(absolute path, name in the container)]."""
    out: list[tuple[str, str]] = []
    for item in (s.strip() for s in value.split(",")):
        if not item:
            continue
        path, _, name = item.partition("#")
        path = os.path.abspath(os.path.expanduser(path))
        if not os.path.exists(path):
            raise ConfigurationError(f"yarn.ship-archives: {path} does not exist")
        if not path.endswith(_ARCHIVE_SUFFIXES):
            raise ConfigurationError(f"yarn.ship-archives: {path} is not a .zip, .tar.gz, .tgz or .tar archive")
        name = name or _archive_name(path)
        if name in _RESERVED or "/" in name or not name:
            raise ConfigurationError(f"yarn.ship-archives: {name!r} cannot name an archive in the container")
        out.append((path, name))
    names = [n for _, n in out]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"yarn.ship-archives: two archives unpack as the same name ({', '.join(names)}); "
                                 "name them with path#name")
    return out


def pack_venv(cache_dir: str) -> str:
    """The client's virtual environment packed with venv-pack (cached while it is unchanged)."""
    import venv_pack

    prefix = sys.prefix
    if prefix == getattr(sys, "base_prefix", prefix):
        raise ConfigurationError("yarn.ship-venv: the client does not run in a virtual environment (python -m venv): "
                                 "nothing to pack; ship an archive with yarn.ship-archives, or set python.executable")
    stamp = hashlib.sha256(prefix.encode())
    for root in sorted({os.path.dirname(p) for p in sys.path if p.startswith(prefix) and os.path.isdir(p)}):
        stamp.update(f"{root}:{os.stat(root).st_mtime_ns}".encode())
    os.makedirs(cache_dir, exist_ok=True)
    target = os.path.join(cache_dir, f"venv-{stamp.hexdigest()[:16]}.tar.gz")
    if not os.path.exists(target):
        log.info("packing the virtual environment %s with venv-pack (once while it is unchanged)", prefix)
        try:
            venv_pack.pack(prefix=prefix, output=target + ".part", format="tar.gz", force=True)
        except venv_pack.VenvPackException as exc:
            raise ConfigurationError(f"yarn.ship-venv: venv-pack cannot pack {prefix}: {exc}") from None
        os.replace(target + ".part", target)
    return target


def _python(config: Configuration) -> str:
    if config[Options.PYTHON_EXECUTABLE]:
        return config[Options.PYTHON_EXECUTABLE]
    if config[Options.YARN_SHIP_VENV]:
        return f"{VENV_DIR}/bin/python"
    return sys.executable


def _script(config: Configuration, command: list[str]) -> str:
    """A container's script: the configuration shipped beside it, then ``command``. The
    container binds to its NodeManager's host (NM_HOST, set by YARN)."""
    python = _python(config)
    lines = [
        "set -e",
        'export YARNFLOW_CONF_DIR="$PWD"',
        'YARNFLOW_HOST="${NM_HOST:-$(hostname -f)}"',
    ]
    if config[Options.YARN_SHIP_VENV] and not config[Options.PYTHON_EXECUTABLE]:
        lines.append(f'export PATH="$PWD/{VENV_DIR}/bin:$PATH"')
    lines.append("exec " + " ".join([shlex.quote(python), *command]))
    return "\n".join(lines) + "\n"


def _spark_services(config: Configuration, files: dict[str, Any]) -> tuple[Any, Any]:
    """The services of the Spark standalone master and workers that the AppMaster starts for
    Spark stages (no instances until a stage asks; see am/resourcemanager/spark_cluster.py). A
    worker's container holds the worker's JVM and one executor of ``spark.executor.memory``
    (with Spark's executor overhead: 10%, at least 384 MB)."""
    import skein

    executor_mb = _spark_memory_mb(config.to_strings().get("spark.executor.memory") or "1g")
    cores = int(config.to_strings().get("spark.executor.cores") or 1)
    worker_mb = executor_mb + max(384, executor_mb // 10) + _SPARK_DAEMON_MB + 128
    master_args = ["-m", "yarnflow.worker.spark_daemon", "master", "--host", '"$YARNFLOW_HOST"',
                   "--report-key", '"$YARNFLOW_SPARK_KEY"']
    worker_args = ["-m", "yarnflow.worker.spark_daemon", "worker", "--host", '"$YARNFLOW_HOST"',
                   "--master", '"$YARNFLOW_SPARK_MASTER"', "--memory", '"$YARNFLOW_SPARK_MEMORY"',
                   "--cores", '"$YARNFLOW_SPARK_CORES"', "--work-dir", '"$PWD/spark-work"']
    common = dict(instances=0, max_restarts=0, allow_failures=True, files=files)
    master = skein.Service(resources=skein.Resources(memory=_SPARK_DAEMON_MB + 256, vcores=1),
                           script=_script(config, master_args), **common)
    worker = skein.Service(resources=skein.Resources(memory=worker_mb, vcores=max(1, cores)),
                           script=_script(config, worker_args), **common)
    return master, worker


def _spark_memory_mb(value: str) -> int:
    from yarnflow.am.resourcemanager.spark_cluster import executor_memory_mb

    try:
        return executor_memory_mb(value)
    except ValueError:
        raise ConfigurationError(f"spark.executor.memory: {value!r} is not a memory size (e.g. 512m, 2g)") from None


@dataclass
class Submission:
    """What a yarnflow application ships: a per-job application's JobGraph and artifact (as
    bytes); an application-mode application's code (a zip of the job file and its modules),
    the job file's name in it and its arguments; or nothing for a session."""

    name: str
    job_graph: bytes | None = None
    artifact: bytes | None = None
    detached: bool = False
    application: bytes | None = None
    main: str = ""
    args: tuple[str, ...] = ()


def application_spec(config: Configuration, submission: Submission, staging_dir: str) -> Any:
    """The skein ApplicationSpec of a yarnflow application, with its files written to
    ``staging_dir``; validated by skein (raises ConfigurationError with skein's reason)."""
    import skein

    os.makedirs(staging_dir, exist_ok=True)
    conf_file = os.path.join(staging_dir, CONF_FILE)
    shipped = {k: v for k, v in config.to_strings().items() if k not in _CLIENT_ONLY}
    if shipped.get(Options.KRB_KEYTAB.key):  # the containers find the shipped copy in their directory
        shipped[Options.KRB_KEYTAB.key] = KEYTAB_FILE
    with open(conf_file, "w", encoding="utf-8") as fh:
        fh.write("# the configuration of the client that submitted this application\n")
        yaml.safe_dump(shipped, fh, sort_keys=True)
    files: dict[str, Any] = {CONF_FILE: skein.File(conf_file, type="file")}
    for path, name in _parse_archives(config[Options.YARN_SHIP_ARCHIVES]):
        files[name] = skein.File(path, type="archive")
    if config[Options.YARN_SHIP_VENV]:
        cache = os.path.join(os.path.expanduser("~"), ".cache", "yarnflow")
        files[VENV_DIR] = skein.File(pack_venv(cache), type="archive")
    kerberos = login(config)
    if kerberos is not None:  # private: readable by the application's user only, on every node
        files[KEYTAB_FILE] = skein.File(kerberos[1], type="file", visibility="private")
    master_files = dict(files)
    # the AppMaster listens and is reached at its host's address (as Flink's YarnEntrypointUtils sets them)
    master_args = ["-m", "yarnflow.am", "--target", "yarn", "-D", 'jobmanager.rpc.address="$YARNFLOW_HOST"',
                   "-D", 'rest.address="$YARNFLOW_HOST"']
    if not config.is_set(Options.REST_BIND_ADDRESS):
        master_args += ["-D", 'rest.bind-address="$YARNFLOW_HOST"']
    if not config.is_set(Options.PROM_HOST):  # (scraped from another host)
        master_args += ["-D", 'metrics.reporter.prom.host="$YARNFLOW_HOST"']
    if submission.job_graph is not None:
        assert submission.artifact is not None
        for rel, data in ((JOB_GRAPH_FILE, submission.job_graph), (ARTIFACT_FILE, submission.artifact)):
            path = os.path.join(staging_dir, rel)
            with open(path, "wb") as fh:
                fh.write(data)
            master_files[rel] = skein.File(path, type="file")
        master_args += ["--job-graph", JOB_GRAPH_FILE, "--artifact", ARTIFACT_FILE]
        if submission.detached:
            master_args.append("--detached")
    if submission.application is not None:
        path = os.path.join(staging_dir, APPLICATION_DIR + ".zip")
        with open(path, "wb") as fh:
            fh.write(submission.application)
        master_files[APPLICATION_DIR] = skein.File(path, type="archive")
        master_args += ["--application", shlex.quote(f"{APPLICATION_DIR}/{submission.main}"),
                        "--application-args", shlex.quote(json.dumps(list(submission.args)))]
    te_args = ["-m", "yarnflow.worker", "--resource-id", '"$CONTAINER_ID"', "--rm-address",
               '"$YARNFLOW_RM_ADDRESS"', "--work-dir", '"$PWD/work"', "-D", 'taskmanager.host="$YARNFLOW_HOST"']
    if not config.is_set(Options.PROM_HOST):
        te_args += ["-D", 'metrics.reporter.prom.host="$YARNFLOW_HOST"']
    tags = {t.strip() for t in config[Options.YARN_TAGS].split(",") if t.strip()} | {"yarnflow"}
    try:
        master = skein.Master(
            resources=skein.Resources(memory=_mib(config[Options.JM_MEMORY]), vcores=config[Options.YARN_AM_VCORES]),
            files=master_files, script=_script(config, master_args))
        taskexecutor = skein.Service(
            # the ResourceManager replaces failed containers itself (yarn.maximum-failed-containers):
            # skein must neither restart them nor end the application for a failure
            instances=0, max_restarts=0, allow_failures=True,
            resources=skein.Resources(memory=_mib(config[Options.TM_MEMORY]),
                                      vcores=max(1, math.ceil(taskexecutor_cores(config)))),
            files=files, script=_script(config, te_args))
        spark_master, spark_worker = _spark_services(config, files)
        spec = skein.ApplicationSpec(
            name=config[Options.YARN_APP_NAME] or f"yarnflow {submission.name}",
            queue=config[Options.YARN_QUEUE] or "default", tags=sorted(tags),
            max_attempts=config[Options.YARN_ATTEMPTS], master=master,
            file_systems=delegation_file_systems(config),
            services={TASKEXECUTOR_SERVICE: taskexecutor, SPARK_MASTER_SERVICE: spark_master,
                      SPARK_WORKER_SERVICE: spark_worker})
        spec._validate()
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"the YARN application spec is not valid: {exc}") from None
    return spec


def submit_application(config: Configuration, submission: Submission, client: Any = None) -> str:
    """Submit a yarnflow application; returns its YARN application id. Raises YarnError when
    there is no skein driver or YARN refuses the application (e.g. a container larger than
    the cluster allows), ConfigurationError for a spec that cannot be built."""
    staging = tempfile.mkdtemp(prefix="yarnflow-submit-")
    if not config.is_set(Options.SSL_INTERNAL):  # on YARN the application's skein credentials close it
        config = config.with_overrides({Options.SSL_INTERNAL.key: "true"}, source="yarnflow on YARN")
    try:
        spec = application_spec(config, submission, staging)
        client = client or skein_client()
        try:
            app_id = str(client.submit(spec))
        except (ValueError, KeyError) as exc:  # skein: INVALID_ARGUMENT / FAILED_PRECONDITION / NOT_FOUND
            raise YarnError(f"YARN refused the application: {_refusal(_message(exc), config)}") from None
        except Exception as exc:  # noqa: BLE001 - skein.DriverError and its connection errors
            message = _message(exc)
            if "allowed allocation" in message or "Invalid resource request" in message:
                raise YarnError(f"YARN refused the application: {_refusal(message, config)}") from None
            raise YarnError(f"submitting the application failed: {message}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("submitted YARN application %s (%s)", app_id, spec.name)
    return app_id


def _message(exc: BaseException) -> str:
    """The driver's message on one line (skein's driver prefixes YARN's own with a line of its own)."""
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    if len(lines) > 1 and lines[0].startswith("Failed to submit application"):
        lines = lines[1:]
    return " ".join(lines) or type(exc).__name__


def _refusal(message: str, config: Configuration) -> str:
    """YARN's reason, with the keys that size the containers when one is too large."""
    if "allowed allocation" not in message:
        return message
    return (f"a container is larger than the cluster allows (AppMaster: jobmanager.memory.process.size="
            f"{_mib(config[Options.JM_MEMORY])} MiB, yarn.appmaster.vcores={config[Options.YARN_AM_VCORES]}; "
            f"TaskExecutor: taskmanager.memory.process.size={_mib(config[Options.TM_MEMORY])} MiB, "
            f"taskmanager.cpu.cores={taskexecutor_cores(config):g}): {message}")


class ApplicationLocator:
    """A running yarnflow application, by YARN application id: its state and its AppMaster's
    address (published by the leading AppMaster in the application's key-value store)."""

    def __init__(self, app_id: str, client: Any = None) -> None:
        self.app_id = app_id
        self.client = client or skein_client()
        self._app: Any = None

    def report(self) -> Any:
        try:
            return self.client.application_report(self.app_id)
        except (KeyError, ValueError) as exc:
            raise YarnError(f"unknown YARN application {self.app_id!r} ({_message(exc)}): see `skein application ls` "
                            "for the running ones") from None
        except Exception as exc:  # noqa: BLE001 - the driver went away
            raise YarnError(f"cannot ask the skein driver about {self.app_id}: {_message(exc)}") from None

    def check_running(self, report: Any = None) -> Any:
        """The application's report; YarnError when it ended (with its final status and
        diagnostics)."""
        report = report or self.report()
        state = str(report.state)
        if state in ("FINISHED", "FAILED", "KILLED"):
            diagnostics = (report.diagnostics or "").strip().splitlines()
            why = f": {diagnostics[-1]}" if diagnostics else ""
            raise YarnError(f"YARN application {self.app_id} is not running: {state} "
                            f"(final status {report.final_status}){why}")
        return report

    def address(self, timeout_s: float) -> str:
        """The leading AppMaster's HOST:PORT, waiting up to ``timeout_s`` for the application
        to start and its AppMaster to publish it."""
        deadline = time.monotonic() + timeout_s
        while True:
            report = self.check_running()
            if str(report.state) == "RUNNING":
                value = self._read_address()
                if value:
                    return value
            if time.monotonic() >= deadline:
                raise YarnError(f"YARN application {self.app_id} is {report.state} but no yarnflow AppMaster "
                                f"published its address within {timeout_s:.0f} s (is it a yarnflow application?)")
            time.sleep(0.2)

    def credentials(self) -> Any:
        """The credentials a client needs for the application's RPC: the skein client's (the
        application was submitted with them, so its containers hold them), unless its AppMaster
        published that it runs without TLS (also while it has not published anything yet: a
        next attempt after a failover starts with an empty key-value store, and TLS is the
        default on YARN)."""
        from yarnflow.common.security import skein_client_credentials

        value = self._kv(TLS_KEY)  # (none between attempts, or once ended: the default)
        return None if value == b"off" else skein_client_credentials(self.client.security)

    def _read_address(self) -> str:
        value = self._kv(ADDRESS_KEY)  # (none between attempts, or while ending: asked again)
        return value.decode() if value else ""

    def _kv(self, key: str) -> bytes | None:
        """``key`` of the application's key-value store; None when unset or unreadable now."""
        try:
            if self._app is None:
                self._app = self.client.connect(self.app_id, wait=False)
            return self._app.kv.get(key)  # type: ignore[no-any-return]
        except Exception as exc:  # noqa: BLE001 - skein's errors: the caller decides what none means
            log.debug("reading %s of %s: %s", key, self.app_id, exc)
            self._app = None
            return None

    def kill(self) -> None:
        try:
            self.client.kill_application(self.app_id)
        except Exception as exc:  # noqa: BLE001 - ended meanwhile
            log.debug("killing %s: %s", self.app_id, exc)

    def wait_final(self, timeout_s: float) -> Any | None:
        """The report once the application ended (None after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            report = self.report()
            if str(report.state) in ("FINISHED", "FAILED", "KILLED"):
                return report
            time.sleep(0.2)
        return None


def describe(config: Mapping[str, str]) -> str:
    """``-D yarn.application.id=...`` plus any high-availability keys, for printed commands."""
    return " ".join(f"-D {k}={v}" for k, v in config.items())
