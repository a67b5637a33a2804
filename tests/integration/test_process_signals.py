"""The AppMaster's and TaskExecutor's signal handling (common/process.py): SIGTERM or SIGINT
calls shutdown once, on its own thread, whatever the main thread holds at that moment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import TAG_VAR

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# The main thread waits as the AppMaster's does. shutdown() reports the thread it runs on, then
# a second signal comes while it is still running: it must not call shutdown() again.
PROGRAM = textwrap.dedent("""\
    import os, sys, threading, time
    from yarnflow.common.process import shutdown_on_signals

    calls, stopped = [], threading.Event()

    def shutdown(reason):
        calls.append(reason)
        print(f"{reason} on {threading.current_thread().name}", flush=True)
        time.sleep(1.0)
        print(f"calls {len(calls)}", flush=True)
        os._exit(0)

    shutdown_on_signals(shutdown)
    print("ready", flush=True)
    while not stopped.wait(1.0):
        pass
""")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_calls_shutdown_once_on_its_own_thread(process_tag, signum):
    env = {**os.environ, TAG_VAR: process_tag}
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signum)
        assert proc.stdout.readline() == f"signal {signum.name} on signal-shutdown\n"
        proc.send_signal(signum)  # while shutdown() runs
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        assert out == "calls 1\n", out + err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
