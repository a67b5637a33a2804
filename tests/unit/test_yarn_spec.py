"""The YARN application spec the client builds from configuration (validated by skein itself,
offline), the attempt number of a YARN container id, and how an application id shapes the
cluster's configuration."""

from __future__ import annotations

import os
import time
import tarfile
import zipfile

import pytest
import skein

from yarnflow.common.config import Configuration, Options
from yarnflow.common.errors import ConfigurationError
from yarnflow.common.yarn import application_config, container_attempt
from yarnflow.yarn import TASKEXECUTOR_SERVICE, Submission, application_spec

pytestmark = pytest.mark.timeout(30)


def spec_of(tmp_path, conf=None, submission=None):
    config = Configuration.load(conf or {})
    return application_spec(config, submission or Submission("wordcount", b"graph", b"artifact"), str(tmp_path / "s"))


def test_spec_comes_from_configuration_and_passes_skein_validation(tmp_path):
    spec = spec_of(tmp_path, {
        "yarn.application.name": "nightly-wordcount", "yarn.application.queue": "etl", "yarn.tags": "team-a, nightly",
        "yarn.application-attempts": "3", "jobmanager.memory.process.size": "1536 mb", "yarn.appmaster.vcores": "2",
        "taskmanager.memory.process.size": "2 gb", "taskmanager.cpu.cores": "1.5",
    })
    assert isinstance(spec, skein.ApplicationSpec)
    again = skein.ApplicationSpec.from_yaml(spec.to_yaml())  # skein parses and validates its own form
    assert again.name == "nightly-wordcount" and again.queue == "etl"
    assert set(again.tags) == {"team-a", "nightly", "yarnflow"}
    assert again.max_attempts == 3
    assert (again.master.resources.memory, again.master.resources.vcores) == (1536, 2)
    te = again.services[TASKEXECUTOR_SERVICE]
    # the AppMaster adds and replaces containers itself; a failed one must not end the application
    assert te.instances == 0 and te.max_restarts == 0 and te.allow_failures
    assert (te.resources.memory, te.resources.vcores) == (2048, 2)
    assert "-m yarnflow.am --target yarn" in again.master.script
    assert "--job-graph jobgraph.bin --artifact artifact.zip" in again.master.script
    assert '--resource-id "$CONTAINER_ID"' in te.script and '"$YARNFLOW_RM_ADDRESS"' in te.script
    assert set(again.master.files) == {"yarnflow.yaml", "jobgraph.bin", "artifact.zip"}
    assert set(te.files) == {"yarnflow.yaml"}


def test_shipped_configuration_is_what_the_client_resolved(tmp_path):
    spec = spec_of(tmp_path, {"parallelism.default": "3", "yarn.application.id": "application_1_0001"})
    path = spec.master.files["yarnflow.yaml"].source.removeprefix("file://")
    shipped = Configuration.load(conf_file=path)
    assert shipped[Options.PARALLELISM] == 3
    assert shipped[Options.YARN_APPLICATION_ID] == ""  # names the client's target, not the cluster


def test_session_spec_ships_no_job(tmp_path):
    spec = spec_of(tmp_path, submission=Submission("session"))
    assert "--job-graph" not in spec.master.script
    assert "artifact.zip" not in spec.master.files


def test_detached_per_job_tells_the_appmaster_not_to_wait_for_a_client(tmp_path):
    spec = spec_of(tmp_path, submission=Submission("j", b"g", b"a", detached=True))
    assert "--detached" in spec.master.script


def test_ship_archives_unpack_in_every_container(tmp_path):
    zipped = tmp_path / "lookup.zip"
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.writestr("factor.txt", "3")
    tarred = tmp_path / "models.tar.gz"
    with tarfile.open(tarred, "w:gz") as tf:
        tf.add(str(zipped), arcname="x.zip")
    spec = spec_of(tmp_path, {"yarn.ship-archives": f"{zipped}, {tarred}#weights"})
    for files in (spec.master.files, spec.services[TASKEXECUTOR_SERVICE].files):
        assert str(files["lookup"].type) == "ARCHIVE" and str(files["weights"].type) == "ARCHIVE"


@pytest.mark.parametrize("value, message", [
    ("/nonexistent/deps.zip", "does not exist"),
    ("{file}", "is not a .zip, .tar.gz"),
    ("{zip}#environment", "cannot name an archive"),
    ("{zip},{zip}", "unpack as the same name"),
])
def test_bad_ship_archives_are_refused_in_one_line(tmp_path, value, message):
    plain = tmp_path / "notes.txt"
    plain.write_text("x")
    zipped = tmp_path / "deps.zip"
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.writestr("a.txt", "a")
    with pytest.raises(ConfigurationError, match=message):
        spec_of(tmp_path, {"yarn.ship-archives": value.format(file=plain, zip=zipped)})


def test_python_executable_and_shipped_venv(tmp_path):
    spec = spec_of(tmp_path, {"python.executable": "/opt/python3.11/bin/python3"})
    assert spec.master.script.splitlines()[-1].startswith("exec /opt/python3.11/bin/python3 -m yarnflow.am")


def test_ship_venv_outside_a_virtual_environment_says_so(tmp_path, monkeypatch):
    import sys

    monkeypatch.setattr(sys, "prefix", sys.base_prefix)
    with pytest.raises(ConfigurationError, match="does not run in a virtual environment"):
        spec_of(tmp_path, {"yarn.ship-venv": "true"})


def test_ship_venv_packs_the_virtual_environment_once(tmp_path, monkeypatch):
    import subprocess
    import sys

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    monkeypatch.setattr(sys, "prefix", str(venv))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    spec = spec_of(tmp_path, {"yarn.ship-venv": "true"})
    env_file = spec.services[TASKEXECUTOR_SERVICE].files["environment"]
    assert str(env_file.type) == "ARCHIVE"
    packed = env_file.source.removeprefix("file://")
    with tarfile.open(packed) as tf:
        names = tf.getnames()
    assert "bin/activate" in names and any(n.startswith("bin/python") for n in names)
    assert "exec environment/bin/python -m yarnflow.worker" in spec.services[TASKEXECUTOR_SERVICE].script
    mtime = os.stat(packed).st_mtime_ns
    assert spec_of(tmp_path, {"yarn.ship-venv": "true"}).master.files["environment"].source.removeprefix(
        "file://") == packed
    assert os.stat(packed).st_mtime_ns == mtime  # cached while the environment is unchanged


def test_container_attempt():
    assert container_attempt("container_1700000000000_0001_01_000001") == 1
    assert container_attempt("container_1700000000000_0001_02_000001") == 2
    assert container_attempt("container_e17_1700000000000_0042_03_000007") == 3
    assert container_attempt("") == 1 and container_attempt("taskexecutor_0") == 1


def test_application_config():
    config = application_config(Configuration.load({"yarn.staging-directory": "hdfs:///user/etl/.yarnflow"}),
                                "application_1_0007")
    assert config[Options.HA_CLUSTER_ID] == "application_1_0007"
    assert config[Options.HA_STORAGE_DIR] == "hdfs:///user/etl/.yarnflow/application_1_0007"
    kept = application_config(Configuration.load({"high-availability.cluster-id": "etl",
                                                  "high-availability.storageDir": "file:///data/ha"}), "application_1_7")
    assert kept[Options.HA_CLUSTER_ID] == "etl" and kept[Options.HA_STORAGE_DIR] == "file:///data/ha"


def test_the_spark_daemons_services_are_sized_from_spark_executor_keys(tmp_path):
    from yarnflow.yarn import SPARK_MASTER_SERVICE, SPARK_WORKER_SERVICE

    spec = skein.ApplicationSpec.from_yaml(spec_of(tmp_path, {"spark.executor.memory": "2g",
                                                              "spark.executor.cores": "2"}).to_yaml())
    master, worker = spec.services[SPARK_MASTER_SERVICE], spec.services[SPARK_WORKER_SERVICE]
    # none until a Spark stage asks; the AppMaster replaces a lost worker itself
    assert master.instances == worker.instances == 0 and worker.allow_failures and worker.max_restarts == 0
    # a worker's container: its own JVM (256 MB), one executor of 2 GB and Spark's overhead (10%, >= 384 MB)
    assert (worker.resources.memory, worker.resources.vcores) == (2048 + 384 + 256 + 128, 2)
    assert "-m yarnflow.worker.spark_daemon worker" in worker.script and '"$YARNFLOW_SPARK_MASTER"' in worker.script
    assert '--report-key "$YARNFLOW_SPARK_KEY"' in master.script
    with pytest.raises(ConfigurationError, match="spark.executor.memory: 'lots' is not a memory size"):
        spec_of(tmp_path, {"spark.executor.memory": "lots"})


class _RecordingClient:
    """A skein client that keeps the configuration an application would ship."""

    def submit(self, spec):
        path = spec.master.files["yarnflow.yaml"].source.removeprefix("file://")
        self.shipped = Configuration.load(conf_file=path)
        return "application_1_0001"


@pytest.mark.parametrize("conf, on", [({}, True), ({"security.ssl.internal.enabled": "false"}, False)],
                         ids=["default", "turned-off"])
def test_an_application_runs_mutual_tls_unless_told_not_to(conf, on):
    from yarnflow.yarn import submit_application

    client = _RecordingClient()
    assert submit_application(Configuration.load(conf), Submission("session"), client) == "application_1_0001"
    assert client.shipped[Options.SSL_INTERNAL] is on


def test_in_a_skein_container_the_applications_credentials_are_the_clusters(tmp_path, monkeypatch):
    from yarnflow.common.security import internal_credentials, new_credentials, skein_client_credentials

    made = new_credentials(str(tmp_path / "made"))
    (tmp_path / ".skein.crt").write_bytes(made.cert_pem)
    (tmp_path / ".skein.pem").write_bytes(made.key_pem)
    on = Configuration.load({"security.ssl.internal.enabled": "true"})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PWD", str(tmp_path))
    monkeypatch.delenv("SKEIN_APPLICATION_ID", raising=False)
    with pytest.raises(ConfigurationError, match="give both"):  # not in a container: nothing to use
        internal_credentials(on)
    monkeypatch.setenv("SKEIN_APPLICATION_ID", "application_1_0001")
    found = internal_credentials(on)
    assert found is not None and found.cert_file == str(tmp_path / ".skein.crt")
    # the client's side: its skein security, as files or as bytes
    assert skein_client_credentials(skein.Security(cert_file=made.cert_file, key_file=made.key_file)).cert_pem == \
        made.cert_pem
    from_bytes = skein_client_credentials(skein.Security(cert_bytes=made.cert_pem, key_bytes=made.key_pem))
    assert from_bytes.key_pem == made.key_pem and oct(os.stat(from_bytes.key_file).st_mode & 0o777) == "0o600"


# ---- Kerberos (security.kerberos.*) -------------------------------------------------------------

def _keytab(tmp_path):
    path = tmp_path / "me.keytab"
    path.write_bytes(b"\x05\x02 not a real keytab")
    path.chmod(0o600)
    return str(path)


def test_with_kerberos_the_keytab_ships_privately_and_the_file_systems_get_tokens(tmp_path):
    spec = spec_of(tmp_path, {"security.kerberos.login.keytab": _keytab(tmp_path),
                              "security.kerberos.login.principal": "etl@EXAMPLE.COM",
                              "security.kerberos.access.hadoopFileSystems": "hdfs://nn1:8020, viewfs://cluster",
                              "high-availability.storageDir": "hdfs://nn2:9000/yarnflow/ha",
                              "execution.checkpointing.dir": "file:///local/checkpoints"})
    again = skein.ApplicationSpec.from_yaml(spec.to_yaml())
    assert sorted(again.file_systems) == ["hdfs://nn1:8020", "hdfs://nn2:9000", "viewfs://cluster"]
    for files in (again.master.files, again.services[TASKEXECUTOR_SERVICE].files):
        assert str(files["krb5.keytab"].visibility).lower() == "private"
    shipped = Configuration.load(conf_file=spec.master.files["yarnflow.yaml"].source.removeprefix("file://"))
    assert shipped[Options.KRB_KEYTAB] == "krb5.keytab"  # the containers' copy, not the client's path
    assert shipped[Options.KRB_PRINCIPAL] == "etl@EXAMPLE.COM"
    plain = skein.ApplicationSpec.from_yaml(spec_of(tmp_path / "plain").to_yaml())
    assert plain.file_systems == [] and "krb5.keytab" not in plain.master.files


@pytest.mark.parametrize("conf, message", [
    ({"security.kerberos.login.principal": "etl@EXAMPLE.COM"}, "needs both"),
    ({"security.kerberos.login.keytab": "/nowhere/etl.keytab", "security.kerberos.login.principal": "etl@X"},
     "cannot read the keytab /nowhere/etl.keytab"),
])
def test_kerberos_keys_that_cannot_work_are_refused_before_anything_is_submitted(tmp_path, conf, message):
    with pytest.raises(ConfigurationError, match=message):
        spec_of(tmp_path, conf)


def test_without_a_running_driver_the_client_starts_one_logged_in_with_the_keytab(tmp_path, monkeypatch):
    from skein.exceptions import DriverNotRunningError

    from yarnflow.yarn import skein_client

    started = []

    class FakeClient:
        def __init__(self, **kwargs):
            started.append(kwargs)

        @classmethod
        def from_global_driver(cls):
            raise DriverNotRunningError("no driver")

    monkeypatch.setattr(skein, "Client", FakeClient)
    keytab = _keytab(tmp_path)
    skein_client(Configuration.load({"security.kerberos.login.keytab": keytab,
                                     "security.kerberos.login.principal": "etl@EXAMPLE.COM"}))
    assert started == [{"principal": "etl@EXAMPLE.COM", "keytab": keytab}]


def test_a_container_renews_its_ticket_from_the_shipped_keytab_every_period(tmp_path, monkeypatch, caplog):
    from yarnflow.common.kerberos import TicketRenewal

    calls = tmp_path / "kinit-calls"
    kinit = tmp_path / "bin" / "kinit"
    kinit.parent.mkdir()
    kinit.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    kinit.chmod(0o755)
    (tmp_path / "krb5.keytab").write_bytes(b"keytab")
    monkeypatch.setenv("PATH", f"{kinit.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("PWD", str(tmp_path))
    monkeypatch.setenv("SKEIN_APPLICATION_ID", "application_1_0001")
    config = Configuration.load({"security.kerberos.login.principal": "etl@EXAMPLE.COM",
                                 "security.kerberos.relogin.period": "100 ms"})
    renewal = TicketRenewal.in_container(config)
    assert renewal is not None
    try:
        deadline = time.monotonic() + 10
        while renewal.renewals < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        renewal.stop()
    assert renewal.renewals >= 3
    assert calls.read_text().splitlines()[0] == f"-kt {tmp_path / 'krb5.keytab'} etl@EXAMPLE.COM"
    # no kinit in the container: said once, then nothing more is tried
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    quiet = TicketRenewal("etl@EXAMPLE.COM", str(tmp_path / "krb5.keytab"), 0.05)
    assert quiet.renew() is False and "no kinit in this container" in caplog.text
    monkeypatch.delenv("SKEIN_APPLICATION_ID")
    assert TicketRenewal.in_container(config) is None  # not in a YARN container
