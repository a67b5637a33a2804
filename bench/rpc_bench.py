"""RPC benchmark: heartbeat-sized calls over real loopback Thrift, one connection, sequential,
through yarnflow's RPC layer and through bare Thrift in the same run.

A ResourceManagerService runs in a separate process (this file with ``--serve MODE``):

- ``yarnflow``: the way components are called: the generated gateway (message conversion)
  -> ``RpcServer`` (multiplexed) -> the generated handler -> ``RpcEndpoint.rpc_invoke`` (the
  fencing check, a hop to the endpoint's main thread) -> a ``@fenced`` method that validates
  its arguments;
- ``bare``: Thrift alone: the generated client and processor on a plain ``TSimpleServer``,
  the handler validating the same arguments (the token by hand);
- ``tls``: as ``yarnflow``, on mutual TLS with a cluster's credentials
  (``security.ssl.internal.enabled``: made for the run in a temporary folder).

Each heartbeat carries a fencing token, a registration id and a SlotReport of 2-4 SlotStatus.
The two modes alternate (``--rounds`` each) and the best round of each is reported, with
``ratio_to_bare`` (loopback call rates swing between days; the ratio is what compares)::

    python bench/rpc_bench.py [--calls N] [--warmup N] [--rounds N]
    {"name": "rpc", "calls_per_s": ..., "bare_calls_per_s": ..., "ratio_to_bare": ..., "median_us": ...,
     "p95_us": ..., "bare_median_us": ..., "tls_calls_per_s": ..., "tls_ratio_to_bare": ...,
     "tls_median_us": ..., "calls": N, "verified": true}

``verified`` is true only when every call returned without error (and a deliberately malformed
heartbeat and a stale token were rejected, which shows the server really checks what it
receives).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

SERVICE = "resourcemanager"
FENCING_TOKEN = "3f2c9a4e5b6d47e8a1b2c3d4e5f60718"
REGISTRATION_ID = "reg-7d1e0c9b2a384f56"


# ---- the server process -------------------------------------------------------------------

def _check_report(slot_report: Any) -> None:
    from yarnflow.common.errors import InvalidRequestError
    from yarnflow.common.messages import ResourceProfile, SlotReport, SlotStatus
    from yarnflow.common.rpc.gen.yarnflow_rpc import ttypes

    report_type, slot_type, profile_type = ((ttypes.SlotReport, ttypes.SlotStatus, ttypes.ResourceProfile)
                                            if not isinstance(slot_report, SlotReport)
                                            else (SlotReport, SlotStatus, ResourceProfile))
    if not isinstance(slot_report, report_type) or not 2 <= len(slot_report.slots or ()) <= 4:
        raise InvalidRequestError("a heartbeat carries a SlotReport of 2-4 slots")
    for slot in slot_report.slots:
        if not isinstance(slot, slot_type) or not isinstance(slot.profile, profile_type):
            raise InvalidRequestError("malformed SlotStatus")


class _BareHandler:
    """A ResourceManagerService for bare Thrift: checks a heartbeat's arguments, nothing else."""

    def heartbeatFromTaskExecutor(self, fencing_token: Any, registration_id: Any, slot_report: Any) -> None:
        from yarnflow.common.errors import FencingTokenError, InvalidRequestError, YarnflowError
        from yarnflow.common.rpc.errors import to_wire_error

        try:
            if fencing_token != FENCING_TOKEN:
                raise FencingTokenError(f"stale fencing token {fencing_token!r}")
            if not isinstance(registration_id, str) or not registration_id:
                raise InvalidRequestError("no registration id")
            _check_report(slot_report)
        except YarnflowError as exc:
            raise to_wire_error(exc) from None

    def registerTaskExecutor(self, registration: Any) -> Any:
        from yarnflow.common.errors import RefusedError
        from yarnflow.common.rpc.errors import to_wire_error

        raise to_wire_error(RefusedError("benchmark server: heartbeats only"))

    def disconnectTaskExecutor(self, fencing_token: Any, resource_id: Any, reason: Any) -> None:
        return None

    def requestSparkMaster(self, fencing_token: Any, settings: Any) -> str:
        return ""


def _endpoint() -> Any:
    """A ResourceManager endpoint that only takes heartbeats (RpcEndpoint, main thread, fenced)."""
    from yarnflow.common.errors import InvalidRequestError, RefusedError
    from yarnflow.common.messages import SlotReport
    from yarnflow.common.rpc.endpoint import MainThreadExecutor, RpcEndpoint, fenced, rpc

    class HeartbeatOnly(RpcEndpoint):
        fencing_token = FENCING_TOKEN

        def __init__(self) -> None:
            super().__init__("bench ResourceManager", MainThreadExecutor("bench-main").start())

        @rpc
        def register_task_executor(self, registration: Any) -> Any:
            raise RefusedError("benchmark server: heartbeats only")

        @fenced()
        def heartbeat_from_task_executor(self, registration_id: str, report: SlotReport) -> None:
            if not registration_id:
                raise InvalidRequestError("no registration id")
            _check_report(report)

        @fenced()
        def disconnect_task_executor(self, resource_id: str, reason: str) -> None:
            return None

        @fenced()
        def request_spark_master(self, settings: dict[str, str]) -> str:
            return ""

    return HeartbeatOnly()


def _credentials() -> Any:
    """The run's cluster credentials (one folder for the client and its server processes)."""
    import tempfile

    from yarnflow.common.security import TlsCredentials, new_credentials

    folder = os.environ.get("YARNFLOW_BENCH_TLS_DIR")
    if folder:
        return TlsCredentials(os.path.join(folder, "cluster.crt"), os.path.join(folder, "cluster.key"))
    folder = os.path.join(tempfile.mkdtemp(prefix="rpc-bench-"), "tls")
    os.environ["YARNFLOW_BENCH_TLS_DIR"] = folder
    return new_credentials(folder)


def serve(mode: str) -> int:
    """Serve until stdin closes (or the parent kills this process); prints the address first."""
    import threading

    from yarnflow.common.rpc.gen.yarnflow_rpc import ResourceManagerService

    if mode == "bare":
        from thrift.server.TServer import TSimpleServer
        from thrift.transport import TSocket, TTransport

        from yarnflow.common.rpc.server import protocol_factory

        sock = TSocket.TServerSocket(host="127.0.0.1", port=0)
        sock.listen()
        print(f"127.0.0.1:{sock.handle.getsockname()[1]}", flush=True)
        server = TSimpleServer(ResourceManagerService.Processor(_BareHandler()), sock,
                               TTransport.TBufferedTransportFactory(), protocol_factory())
        sock.listen = lambda: None  # already listening
        threading.Thread(target=server.serve, daemon=True).start()
        sys.stdin.read()
        return 0
    from yarnflow.common.rpc.server import RpcServer
    from yarnflow.common.rpc.services import ResourceManagerServiceHandler

    rpc_server = RpcServer("127.0.0.1", 0, {SERVICE: ResourceManagerServiceHandler(_endpoint()).processor()},
                           name="bench-rpc", tls=_credentials() if mode == "tls" else None).start()
    print(rpc_server.address, flush=True)
    try:
        sys.stdin.read()
    finally:
        rpc_server.stop()
    return 0


# ---- the measuring process ----------------------------------------------------------------

def _slot_reports() -> list[Any]:
    from yarnflow.common.ids import AllocationID, JobID
    from yarnflow.common.messages import ResourceProfile, SlotReport, SlotStatus

    profile = ResourceProfile(cpu_cores=1.0, memory_mb=1024)
    job = JobID("b6f0e2d4c8a14e3f9d7c5b3a1f2e4d6c")
    reports = []
    for n in (2, 3, 4):
        slots = [SlotStatus(i, profile, AllocationID(f"alloc-{i:02d}-5e7f9a1c3b") if i % 2 == 0 else None,
                            job if i % 2 == 0 else None) for i in range(n)]
        reports.append(SlotReport(slots))
    return reports


def _start_server(mode: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    address = proc.stdout.readline().strip() if ready else ""
    if not address:
        proc.kill()
        proc.wait()
        raise RuntimeError("the benchmark server did not start")
    return proc, address


def _stop_server(proc: subprocess.Popen[str]) -> None:
    try:
        os.kill(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


def _bare_client(address: str) -> tuple[Any, Any]:
    from thrift.transport import TSocket, TTransport

    from yarnflow.common.rpc.gen.yarnflow_rpc import ResourceManagerService
    from yarnflow.common.rpc.server import protocol_factory

    host, port = address.rsplit(":", 1)
    sock = TSocket.TSocket(host, int(port))
    sock.setTimeout(10_000)
    transport = TTransport.TBufferedTransport(sock)
    transport.open()
    return ResourceManagerService.Client(protocol_factory().getProtocol(transport)), transport


def _round(mode: str, calls: int, warmup: int) -> dict[str, Any]:
    """``calls`` sequential heartbeats on one connection after ``warmup`` untimed ones."""
    from yarnflow.common.errors import FencingTokenError, InvalidRequestError, YarnflowError
    from yarnflow.common.messages import SlotReport, SlotStatus
    from yarnflow.common.rpc.errors import from_wire_error
    from yarnflow.common.rpc.services import ResourceManagerServiceGateway

    reports = _slot_reports()
    errors = 0
    latencies_ns: list[int] = []
    if mode == "tls":
        _credentials()  # made before the server starts: it inherits where they are
    proc, address = _start_server(mode)
    transport = None
    try:
        if mode == "bare":
            client, transport = _bare_client(address)
            wire = [r.to_thrift() for r in reports]

            def heartbeat(token: str, report: Any) -> None:
                try:
                    client.heartbeatFromTaskExecutor(token, REGISTRATION_ID, report)
                except Exception as exc:  # noqa: BLE001 - the same translation a yarnflow client makes
                    raise from_wire_error(exc, address) from None

            bad = SlotReport([SlotStatus(0)]).to_thrift()
        else:
            gateway = ResourceManagerServiceGateway(address, 10_000, service=SERVICE,
                                                    tls=_credentials() if mode == "tls" else None)
            wire = reports

            def heartbeat(token: str, report: Any) -> None:
                gateway.heartbeat_from_task_executor(token, REGISTRATION_ID, report)

            bad = SlotReport([SlotStatus(0)])
        for i in range(warmup):
            heartbeat(FENCING_TOKEN, wire[i % 3])
        perf = time.perf_counter_ns
        started = perf()
        for i in range(calls):
            t0 = perf()
            try:
                heartbeat(FENCING_TOKEN, wire[i % 3])
            except YarnflowError:
                errors += 1
            latencies_ns.append(perf() - t0)
        elapsed_s = (perf() - started) / 1e9
        checks = 0
        for token, report, error in ((FENCING_TOKEN, bad, InvalidRequestError), ("stale", wire[0], FencingTokenError)):
            try:  # the server checks what it receives
                heartbeat(token, report)
            except error:
                checks += 1
        if mode != "bare":
            gateway.close()
    finally:
        if transport is not None:
            transport.close()
        _stop_server(proc)
    latencies_ns.sort()
    return {"calls_per_s": calls / elapsed_s if elapsed_s > 0 else 0.0,
            "median_us": statistics.median(latencies_ns) / 1000 if latencies_ns else 0.0,
            "p95_us": latencies_ns[min(len(latencies_ns) - 1, int(len(latencies_ns) * 0.95))] / 1000,
            "verified": errors == 0 and calls > 0 and checks == 2}


def run_rpc(calls: int = 20000, warmup: int = 1000, rounds: int = 2) -> dict[str, Any]:
    best: dict[str, dict[str, Any]] = {}
    verified = True
    for _ in range(rounds):
        for mode in ("bare", "yarnflow", "tls"):
            r = _round(mode, calls, warmup)
            verified = verified and r["verified"]
            if mode not in best or r["calls_per_s"] > best[mode]["calls_per_s"]:
                best[mode] = r
    ours, bare, tls = best["yarnflow"], best["bare"], best["tls"]
    return {
        "name": "rpc",
        "calls_per_s": round(ours["calls_per_s"], 1),
        "bare_calls_per_s": round(bare["calls_per_s"], 1),
        "ratio_to_bare": round(ours["calls_per_s"] / bare["calls_per_s"], 3) if bare["calls_per_s"] else 0.0,
        "median_us": round(ours["median_us"], 1),
        "p95_us": round(ours["p95_us"], 1),
        "bare_median_us": round(bare["median_us"], 1),
        "tls_calls_per_s": round(tls["calls_per_s"], 1),
        "tls_ratio_to_bare": round(tls["calls_per_s"] / bare["calls_per_s"], 3) if bare["calls_per_s"] else 0.0,
        "tls_median_us": round(tls["median_us"], 1),
        "calls": calls,
        "rounds": rounds,
        "verified": verified,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each mode (the best is reported)")
    parser.add_argument("--serve", choices=["bare", "yarnflow", "tls"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args.serve)
    print(json.dumps(run_rpc(args.calls, args.warmup, args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
