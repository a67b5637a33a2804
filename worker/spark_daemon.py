"""The Spark standalone master and workers the AppMaster runs for Spark stages, in YARN
containers of the application or as local processes: ``python -m yarnflow.worker.spark_daemon
master|worker ...`` starts Spark's own daemon (``spark-class``, shipped with the pyspark
package) and stays its parent until it ends, handing on SIGTERM.

``master --host H``: the master listens on a free port; its URL (``spark://H:port``) is reported
once it accepts connections: to the application's skein key-value store (``--report-key``, in a
YARN container) or to a file (``--report-file``, local processes). ``worker --host H --master
URL --cores C --memory M``: a worker that registers with that master and runs the executors of
the applications it assigns (each a child JVM of the worker, so in the same container).

The daemons' own JVMs take ``SPARK_DAEMON_MEMORY`` (256m unless set); executors take what the
Spark application asks (``spark.executor.memory``), within the worker's ``--memory``."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["free_port", "main", "spark_class"]


def spark_class() -> str:
    """The ``spark-class`` script of the installed pyspark."""
    import pyspark

    path = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
    if not os.path.exists(path):
        raise FileNotFoundError(f"pyspark has no spark-class at {path}: Spark's standalone daemons cannot start")
    return path


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _report(url: str, args: argparse.Namespace) -> None:
    if args.report_file:
        tmp = f"{args.report_file}.tmp"
        with open(tmp, "w") as fh:
            fh.write(url)
        os.replace(tmp, args.report_file)
    if args.report_key:
        import skein

        skein.ApplicationClient.from_current().kv[args.report_key] = url.encode()


def _run(cmd: list[str], args: argparse.Namespace,
         on_started: Callable[[subprocess.Popen[bytes]], None] | None = None) -> int:
    env = {**os.environ, "SPARK_DAEMON_MEMORY": os.environ.get("SPARK_DAEMON_MEMORY", "256m"),
           "SPARK_LOCAL_IP": args.host, "SPARK_NO_DAEMONIZE": "1"}
    proc = subprocess.Popen(cmd, env=env)

    def forward(signum: int, _frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    if args.parent_pid:  # a local daemon of an AppMaster: it goes when that process goes, even SIGKILLed
        def watch() -> None:
            while proc.poll() is None:
                if os.getppid() != args.parent_pid:
                    proc.terminate()
                    return
                time.sleep(0.5)

        threading.Thread(target=watch, daemon=True).start()
    if on_started is not None:
        on_started(proc)
    return proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m yarnflow.worker.spark_daemon")
    sub = parser.add_subparsers(dest="role", required=True)
    master = sub.add_parser("master", help="Spark's standalone master")
    master.add_argument("--host", default="127.0.0.1")
    master.add_argument("--report-file", default="")
    master.add_argument("--report-key", default="")
    master.add_argument("--parent-pid", type=int, default=0)
    worker = sub.add_parser("worker", help="a Spark standalone worker")
    worker.add_argument("--host", default="127.0.0.1")
    worker.add_argument("--master", required=True)
    worker.add_argument("--cores", type=int, default=1)
    worker.add_argument("--memory", default="1g")
    worker.add_argument("--work-dir", default="spark-work")
    worker.add_argument("--parent-pid", type=int, default=0)
    args = parser.parse_args(argv)
    if args.role == "master":
        port = free_port(args.host)
        cmd = [spark_class(), "org.apache.spark.deploy.master.Master", "--host", args.host, "--port", str(port),
               "--webui-port", "0"]

        def started(proc: subprocess.Popen[bytes]) -> None:
            while proc.poll() is None and not _listening(args.host, port):
                time.sleep(0.1)
            if proc.poll() is None:
                _report(f"spark://{args.host}:{port}", args)

        return _run(cmd, args, started)
    os.makedirs(args.work_dir, exist_ok=True)
    cmd = [spark_class(), "org.apache.spark.deploy.worker.Worker", "--host", args.host, "--cores", str(args.cores),
           "--memory", args.memory, "--webui-port", "0", "--work-dir", os.path.abspath(args.work_dir), args.master]
    return _run(cmd, args)


if __name__ == "__main__":
    sys.exit(main())
