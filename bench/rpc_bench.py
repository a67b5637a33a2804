"""RPC benchmark: heartbeat-sized calls over real loopback Thrift, one connection, sequential.

A ResourceManagerService runs in a separate process (this file with ``--serve``); its
``heartbeatFromTaskExecutor`` only validates its arguments. This process calls it through
``RpcClient`` with a fencing token, a registration id and a SlotReport of 2-4 SlotStatus, and
reports calls/s and the median and p95 latency::

    python bench/rpc_bench.py [--calls N] [--warmup N]
    {"name": "rpc", "calls_per_s": ..., "median_us": ..., "p95_us": ..., "calls": N, "verified": true}

``verified`` is true only when every call returned without error (and a deliberately malformed
heartbeat was rejected, which shows the server really checks what it receives).
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

class _HeartbeatOnlyHandler:
    """A ResourceManagerService that checks a heartbeat's arguments and does nothing else."""

    def heartbeatFromTaskExecutor(self, fencing_token: Any, registration_id: Any, slot_report: Any) -> None:
        from yarnflow.common.errors import FencingTokenError, InvalidRequestError
        from yarnflow.common.rpc.errors import to_wire_error
        from yarnflow.common.rpc.gen.yarnflow_rpc import ttypes

        if fencing_token != FENCING_TOKEN:
            raise to_wire_error(FencingTokenError(f"stale fencing token {fencing_token!r}"))
        if not isinstance(registration_id, str) or not registration_id:
            raise to_wire_error(InvalidRequestError("no registration id"))
        if not isinstance(slot_report, ttypes.SlotReport) or not 2 <= len(slot_report.slots or ()) <= 4:
            raise to_wire_error(InvalidRequestError("a heartbeat carries a SlotReport of 2-4 slots"))
        for slot in slot_report.slots:
            if not isinstance(slot, ttypes.SlotStatus) or not isinstance(slot.profile, ttypes.ResourceProfile):
                raise to_wire_error(InvalidRequestError("malformed SlotStatus"))

    def registerTaskExecutor(self, registration: Any) -> Any:
        from yarnflow.common.errors import RefusedError
        from yarnflow.common.rpc.errors import to_wire_error

        raise to_wire_error(RefusedError("benchmark server: heartbeats only"))

    def disconnectTaskExecutor(self, fencing_token: Any, resource_id: Any, reason: Any) -> None:
        return None


def serve() -> int:
    """Serve until stdin closes (or the parent kills this process); prints the address first."""
    from yarnflow.common.rpc.gen.yarnflow_rpc import ResourceManagerService
    from yarnflow.common.rpc.server import RpcServer

    processor = ResourceManagerService.Processor(_HeartbeatOnlyHandler())
    server = RpcServer("127.0.0.1", 0, {SERVICE: processor}, name="bench-rpc").start()
    print(server.address, flush=True)
    try:
        sys.stdin.read()
    finally:
        server.stop()
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
        reports.append(SlotReport(slots).to_thrift())
    return reports


def _start_server() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"], stdin=subprocess.PIPE,
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


def run_rpc(calls: int = 20000, warmup: int = 1000) -> dict:
    """Time ``calls`` sequential heartbeats on one connection after ``warmup`` untimed ones."""
    from yarnflow.common.errors import InvalidRequestError, YarnflowError
    from yarnflow.common.messages import SlotReport, SlotStatus
    from yarnflow.common.rpc.client import RpcClient
    from yarnflow.common.rpc.gen.yarnflow_rpc import ResourceManagerService

    reports = _slot_reports()
    errors = 0
    latencies_ns: list[int] = []
    proc, address = _start_server()
    client = RpcClient(address, SERVICE, ResourceManagerService.Client, timeout_ms=10_000)
    try:
        heartbeat = client.method("heartbeatFromTaskExecutor")
        for i in range(warmup):
            heartbeat(FENCING_TOKEN, REGISTRATION_ID, reports[i % 3])
        perf = time.perf_counter_ns
        started = perf()
        for i in range(calls):
            t0 = perf()
            try:
                heartbeat(FENCING_TOKEN, REGISTRATION_ID, reports[i % 3])
            except YarnflowError:
                errors += 1
            latencies_ns.append(perf() - t0)
        elapsed_s = (perf() - started) / 1e9
        try:  # the server checks what it receives: a one-slot report must be refused
            heartbeat(FENCING_TOKEN, REGISTRATION_ID, SlotReport([SlotStatus(0)]).to_thrift())
            rejects_bad_input = False
        except InvalidRequestError:
            rejects_bad_input = True
    finally:
        client.close()
        _stop_server(proc)
    latencies_ns.sort()
    p95 = latencies_ns[min(len(latencies_ns) - 1, int(len(latencies_ns) * 0.95))] if latencies_ns else 0
    return {
        "name": "rpc",
        "calls_per_s": round(calls / elapsed_s, 1) if elapsed_s > 0 else 0.0,
        "median_us": round(statistics.median(latencies_ns) / 1000, 1) if latencies_ns else 0.0,
        "p95_us": round(p95 / 1000, 1),
        "calls": calls,
        "verified": errors == 0 and calls > 0 and rejects_bad_input,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve()
    print(json.dumps(run_rpc(args.calls, args.warmup)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
