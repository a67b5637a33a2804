"""``yarnflow yarn-sandbox``: a skein-compatible stand-in for Hadoop YARN, for tests and for
machines without a cluster. The unmodified skein client talks to it as to skein's Java driver
and ApplicationMaster: submit, reports, kill, logs, and inside containers
``skein.ApplicationClient.from_current()`` with its key-value store, scaling and shutdown.
Containers are local processes (each in its own process group, dying with the sandbox), killed
like YARN kills them when they outgrow their memory.

    with Sandbox(config_dir=os.environ["SKEIN_CONFIG"]) as sandbox:
        client = skein.Client(address=sandbox.address)   # or skein.Client.from_global_driver()
        app_id = client.submit(spec)

Modules: server.py (Sandbox, run_sandbox, the gRPC Driver and AppMaster services),
applications.py (applications and their attempts, nodes, queues), appmaster.py (one attempt:
services, containers, the master script), kv.py (the key-value store, and the errors),
processes.py (starting, watching and killing container processes; localization)."""

from __future__ import annotations

from yarnflow.sandbox.kv import RequestRejected, SandboxError
from yarnflow.sandbox.server import Sandbox, run_sandbox

__all__ = ["RequestRejected", "Sandbox", "SandboxError", "run_sandbox"]
