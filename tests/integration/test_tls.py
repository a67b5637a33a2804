"""Mutual TLS inside a cluster (issue 31, ``security.ssl.internal.enabled``), on a real local
cluster: its Thrift ports (AppMaster, TaskExecutors) and its TaskExecutors' Arrow Flight data
ports refuse a client without the cluster's certificate, and one with another cluster's, at
the handshake (logged once, no traceback), while a job shuffling between two TaskExecutors
counts every row exactly once and the CLI, finding the session's credentials by its address,
works."""

from __future__ import annotations

import collections
import glob
import os
import re
import socket

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from tests.integration.test_batch_exactly_once import _committed_counts, _pipeline, _to_row, _write_files
from tests.integration.test_failover_jobs import _run
from tests.integration.test_ha_failover import ha_cluster  # noqa: F401 - the fixture
from yarnflow.common.config import Configuration
from yarnflow.common.errors import RpcConnectionError
from yarnflow.common.rpc.gateways import RemoteDispatcherGateway, RemoteTaskExecutorGateway
from yarnflow.common.security import new_credentials, storage_folder
from yarnflow.common.states import JobStatus
from yarnflow.connection import ClusterConnection

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TLS = {"security__ssl__internal__enabled": "true"}


@pytest.fixture
def tls_cluster(local_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("YARNFLOW_HOME", str(tmp_path / "yarnflow-home"))  # as the cli fixture's
    return local_cluster(taskexecutors=2, slots=1, **TLS)


def _taskexecutor_addresses(cluster) -> list[tuple[str, str]]:
    """(rpc, data) address of each TaskExecutor, from their logs."""
    found = []
    for path in glob.glob(os.path.join(cluster.work_dir, "**", "*.log"), recursive=True):
        with open(path, errors="replace") as fh:
            found += re.findall(r"started: rpc (\S+), data (\S+),", fh.read())
    return found


def _logs(cluster) -> str:
    text = ""
    for path in glob.glob(os.path.join(cluster.work_dir, "**", "*.log"), recursive=True):
        with open(path, errors="replace") as fh:
            text += fh.read()
    return text


def test_a_job_runs_exactly_over_tls_and_the_cli_finds_the_credentials(tls_cluster, cli, tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    expected = _write_files(src, files=6, rows=6000)
    # the artifact goes through the REST API, which wants the cluster's token: the client has it
    result = _run(tls_cluster, _pipeline(src, out, _to_row), "over-tls", {"client.artifact-upload": "appmaster"},
                  parallelism=2)
    assert result.status == JobStatus.FINISHED
    got = _committed_counts(out)
    assert sum(got.values()) == 6000 and got == expected
    listed = cli.run("list", "--address", tls_cluster.address, check=True).stdout
    assert "over-tls" in listed and "FINISHED" in listed
    assert len(_taskexecutor_addresses(tls_cluster)) == 2  # the shuffle went between two processes


def test_clients_without_the_clusters_certificate_are_refused_at_the_handshake(tls_cluster, tmp_path):
    plain = RemoteDispatcherGateway(tls_cluster.address, 3000)
    with pytest.raises(RpcConnectionError, match="as a cluster with mutual TLS does to a client without its"):
        plain.cluster_info()
    plain.close()
    other = new_credentials(str(tmp_path / "other-cluster"))
    stranger = RemoteDispatcherGateway(tls_cluster.address, 3000, tls=other)
    with pytest.raises(RpcConnectionError, match="TLS handshake failed"):
        stranger.cluster_info()
    stranger.close()
    ok = RemoteDispatcherGateway(tls_cluster.address, 3000, tls=tls_cluster.tls)
    assert ok.cluster_info().leader_session_id
    ok.close()

    [(rpc, data), _] = _taskexecutor_addresses(tls_cluster)
    for creds in (None, other):
        te = RemoteTaskExecutorGateway(rpc, 3000, tls=creds)
        with pytest.raises(RpcConnectionError):
            te.free_slot("x", "none", "probe")
        te.close()
    # a raw TCP client that sends Thrift bytes without TLS gets nothing back
    host, port = rpc.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(b"\x80\x01\x00\x01\x00\x00\x00\x0bclusterInfo\x00\x00\x00\x00\x00")
        raw.settimeout(5)
        try:
            answer = raw.recv(1024)
        except ConnectionResetError:
            answer = b""
        assert answer[:1] in (b"", b"\x15")  # closed, reset or a TLS alert: never a Thrift answer

    # the data port: plain gRPC, TLS without a client certificate, another cluster's certificate
    attempts = [flight.connect(f"grpc+tcp://{data}"),
                flight.connect(f"grpc+tls://{data}", tls_root_certs=tls_cluster.tls.cert_pem,
                               override_hostname="skein-internal"),
                flight.connect(f"grpc+tls://{data}", **other.flight_client_options())]
    for client in attempts:
        with pytest.raises(flight.FlightError):
            client.list_actions(options=flight.FlightCallOptions(timeout=5))
        client.close()
    good = flight.connect(f"grpc+tls://{data}", **tls_cluster.tls.flight_client_options())
    with pytest.raises(pa.ArrowNotImplementedError):  # through the handshake: the service itself answers
        good.list_actions(options=flight.FlightCallOptions(timeout=5))
    good.close()

    logs = _logs(tls_cluster)
    assert "refused a connection from" in logs and "Traceback" not in logs
    refusals = collections.Counter(re.findall(r"(\S+): refused a connection from", logs))
    assert all(n == 1 for n in refusals.values()), refusals  # once per server and host


def test_a_certificate_that_is_not_the_clusters_cannot_be_used_to_start_one(tmp_path):
    from yarnflow.local_cluster import ClusterStartError, LocalCluster

    (tmp_path / "cert.pem").write_text("not a certificate")
    (tmp_path / "key.pem").write_text("not a key")
    with pytest.raises(ClusterStartError, match="cannot use the TLS credentials"):
        LocalCluster(1, 1, {"security.ssl.internal.enabled": "true",
                            "security.ssl.internal.cert-file": str(tmp_path / "cert.pem"),
                            "security.ssl.internal.key-file": str(tmp_path / "key.pem")},
                     work_dir=str(tmp_path / "cluster"))


def test_a_high_availability_cluster_keeps_its_credentials_beside_its_job_data_for_its_clients(
        ha_cluster, tmp_path, monkeypatch):  # noqa: F811
    """A client that knows only the HA keys finds the leader in ZooKeeper and the credentials in
    the cluster's storage dir; they go with the cluster."""
    monkeypatch.setenv("YARNFLOW_HOME", str(tmp_path / "yarnflow-home"))
    cluster = ha_cluster(standby=1, taskexecutors=1, slots=1, security__ssl__internal__enabled="true")
    stored = storage_folder(Configuration.load(cluster.ha_keys)).removeprefix("file://")
    assert os.path.exists(os.path.join(stored, "cluster.key"))
    assert oct(os.stat(os.path.join(stored, "cluster.key")).st_mode & 0o777) == "0o600"
    plain = RemoteDispatcherGateway(cluster.address, 3000)
    with pytest.raises(RpcConnectionError):
        plain.cluster_info()
    plain.close()
    conn = ClusterConnection(Configuration.load(cluster.ha_keys), "")
    try:
        assert conn.call(lambda gw: gw.list_jobs(), "listJobs") == []
    finally:
        conn.close()
    cluster.stop()
    assert not os.path.exists(stored)
