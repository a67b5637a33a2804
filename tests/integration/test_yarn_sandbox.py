"""The YARN sandbox (yarnflow.sandbox) seen through the unmodified skein client only: submit,
reports, the key-value store, scaling and killing containers, shutdown, retries, kills, limits,
localization, logs, the global driver file, and that no process outlives the sandbox (also a
SIGKILLed one). Containers run Python scripts that use ``ApplicationClient.from_current()``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import skein
import skein.core
from skein.exceptions import DriverError

from tests.conftest import live_tagged
from tests.harness import wait_until
from tests.yarn import MAX_MEMORY_MB, MAX_VCORES
from yarnflow.sandbox import Sandbox

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60),
              # skein's client compares grpc's version with distutils' LooseVersion (setuptools warns)
              pytest.mark.filterwarnings("ignore:distutils Version classes are deprecated:DeprecationWarning")]

PY = sys.executable


# The master: puts a key, scales "worker" to 2, waits until both run and wrote their keys, reports
# what it saw, then waits for the test's "go" and shuts the application down.
MASTER = textwrap.dedent("""\
    import os, time, skein
    app = skein.ApplicationClient.from_current()
    app.kv["master"] = " ".join([os.environ["SKEIN_APPLICATION_ID"], os.environ["CONTAINER_ID"],
                                 os.environ["SKEIN_RESOURCE_MEMORY"], str(os.getpid())]).encode()
    app.set_progress(0.5)
    started = app.scale("worker", count=2)
    seen = [app.kv.wait(c.id).decode() for c in started]
    running = app.get_containers(services=["worker"], states=["RUNNING"])
    app.kv["seen"] = ";".join([f"{c.id}={c.yarn_container_id}" for c in running] + seen).encode()
    app.kv.wait("go")
    app.shutdown("SUCCEEDED", "master saw " + str(len(running)) + " workers")
    time.sleep(600)  # the shutdown stops the master
""")
# A service container: puts its pid and environment under its own id (a key it owns), then sleeps.
WORKER = textwrap.dedent("""\
    import os, time, skein
    app = skein.ApplicationClient.from_current()
    cid = os.environ["SKEIN_CONTAINER_ID"]
    app.kv.put(cid, " ".join([str(os.getpid()), os.environ["CONTAINER_ID"], os.environ["SKEIN_RESOURCE_VCORES"],
                              os.environ["LOG_DIRS"]]).encode(), owner=cid)
    time.sleep(600)
""")
# A master with a child in a session of its own (it leaves the process group): both must die on kill.
SPAWNER = textwrap.dedent("""\
    import os, subprocess, time, skein
    app = skein.ApplicationClient.from_current()
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    app.kv["pids"] = f"{os.getpid()} {child.pid}".encode()
    time.sleep(600)
""")


@pytest.fixture
def client(sandbox: Sandbox) -> Iterator[skein.Client]:
    c = skein.Client(address=sandbox.address)
    yield c
    c.close()


def script_file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def wait_final(client: skein.Client, app_id: str, timeout: float = 30) -> skein.model.ApplicationReport:
    return wait_until(lambda: (r := client.application_report(app_id)).final_status != "UNDEFINED" and r,
                      timeout, lambda: f"{app_id} did not end: {client.application_report(app_id)}")


def gone(*pids: int) -> bool:
    def dead(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True
    return all(dead(p) for p in pids)


def test_an_application_sees_every_step_through_skein(client: skein.Client, tmp_path: Path) -> None:
    spec = skein.ApplicationSpec(
        name="steps", tags=["sandbox"],
        master=skein.Master(script=f"{PY} master.py", files={"master.py": script_file(tmp_path, "m.py", MASTER)},
                            resources=skein.Resources(memory=384, vcores=1)),
        services={"worker": skein.Service(instances=0, script=f"{PY} worker.py",
                                          resources=skein.Resources(memory=256, vcores=2),
                                          files={"worker.py": script_file(tmp_path, "w.py", WORKER)})})
    app_id = client.submit(spec)
    assert re.fullmatch(r"application_\d+_0001", app_id)
    assert client.application_report(app_id).state in ("ACCEPTED", "RUNNING")
    with client.connect(app_id) as app:
        report = client.application_report(app_id)
        assert (report.state, report.final_status, report.name, report.queue) == ("RUNNING", "UNDEFINED", "steps",
                                                                                  "default")
        assert report.tags == {"sandbox"} and report.user and report.start_time is not None
        assert f"{report.host}:{report.port}" == app.address
        assert app_id in {r.id for r in client.get_applications()}

        seen = wait_until(lambda: app.kv.get("seen"), 30, "the master did not see its workers").decode()
        master_app, master_container, memory, _ = app.kv["master"].decode().split()
        assert master_app == app_id and memory == "384"
        assert re.fullmatch(r"container_\d+_0001_01_000001", master_container)
        workers = {c.id: c for c in app.get_containers()}
        assert sorted(workers) == ["worker_0", "worker_1"]
        assert all(c.state == "RUNNING" and c.yarn_container_id.startswith("container_") for c in workers.values())
        pids = []
        for cid, c in workers.items():
            assert f"{cid}={c.yarn_container_id}" in seen
            pid, yarn_id, vcores, log_dir = app.kv[cid].decode().split()
            assert (yarn_id, vcores) == (c.yarn_container_id, "2") and log_dir.endswith(yarn_id)
            assert app.kv.get(cid, return_owner=True).owner == cid
            pids.append(int(pid))
        assert client.application_report(app_id).progress == pytest.approx(0.5)
        remote = app.get_specification()  # as skein's driver hands it on: credentials as files, not bytes
        assert remote.services["worker"].resources.vcores == 2
        assert remote.master.security.cert_bytes is None and remote.master.security.cert_file.source.startswith("file")

        app.kv["go"] = b"1"
        report = wait_final(client, app_id)
    assert (report.state, report.final_status) == ("FINISHED", "SUCCEEDED")
    assert report.diagnostics == "master saw 2 workers"
    assert report.finish_time is not None and report.progress == 1.0
    assert app_id in {r.id for r in client.get_applications(states=["FINISHED"])}
    assert app_id not in {r.id for r in client.get_applications()}
    wait_until(lambda: gone(*pids), 10, "the workers outlived their application")
    logs = client.application_logs(app_id)
    assert master_container in logs and "LogType:stderr" in logs[master_container]


def test_a_failing_master_is_retried_then_the_application_fails(client: skein.Client) -> None:
    spec = skein.ApplicationSpec(name="failing", max_attempts=2, master=skein.Master(
        script='echo "attempt in $CONTAINER_ID" >&2; exit 3'))
    app_id = client.submit(spec)
    report = wait_final(client, app_id)
    # as skein's ApplicationMaster does on its last attempt: unregisters with FAILED
    assert (report.state, report.final_status) == ("FINISHED", "FAILED")
    assert "exit code 3" in report.diagnostics and "attempt 2 of 2" in report.diagnostics
    assert re.search(r"attempt in container_\d+_0001_02_000001", report.diagnostics), report.diagnostics
    logs = client.application_logs(app_id)
    first, second = sorted(k for k in logs if k.endswith("_000001"))
    assert "_01_" in first and "_02_" in second
    assert "Application attempt 1 out of 2 failed, will retry" in logs[first]


def test_kill_stops_every_process_of_the_application(client: skein.Client, tmp_path: Path) -> None:
    spec = skein.ApplicationSpec(name="killed", master=skein.Master(
        script=f"{PY} spawner.py", files={"spawner.py": script_file(tmp_path, "s.py", SPAWNER)}))
    app_id = client.submit(spec)
    with client.connect(app_id) as app:
        pids = [int(p) for p in wait_until(lambda: app.kv.get("pids"), 30, "no pids").split()]
    assert not gone(*pids)
    client.kill_application(app_id)
    report = client.application_report(app_id)
    assert (report.state, report.final_status) == ("KILLED", "KILLED")
    assert "killed by user" in report.diagnostics
    assert gone(*pids), [psutil.Process(p).cmdline() for p in pids if not gone(p)]
    client.kill_application(app_id)  # a no-op once it ended


def test_containers_are_killed_fail_and_restart(client: skein.Client) -> None:
    spec = skein.ApplicationSpec(name="containers", services={
        "sleeper": skein.Service(instances=2, script="sleep 600", resources=skein.Resources(memory=128, vcores=1)),
        "crasher": skein.Service(instances=1, script="echo boom >&2; exit 7", max_restarts=1, allow_failures=True,
                                 resources=skein.Resources(memory=128, vcores=1), depends=["sleeper"]),
    })
    app_id = client.submit(spec)
    with client.connect(app_id) as app:
        wait_until(lambda: len(app.get_containers(services=["sleeper"], states=["RUNNING"])) == 2, 20,
                   "the sleepers did not start")
        crashed = wait_until(lambda: len(c := app.get_containers(services=["crasher"], states=["FAILED"])) == 2 and c,
                             20, lambda: f"crasher: {app.get_containers(services=['crasher'], states=['FAILED'])}")
        assert [c.id for c in crashed] == ["crasher_0", "crasher_1"]  # crasher_1 replaced crasher_0
        assert all("exit code 7" in c.exit_message for c in crashed)

        app.kill_container("sleeper_0")
        killed = app.get_containers(states=["KILLED"])
        assert [(c.id, c.exit_message) for c in killed] == [("sleeper_0", "Killed by user request.")]
        assert killed[0].finish_time is not None
        assert [c.id for c in app.get_containers()] == ["sleeper_1"]
        with pytest.raises(ValueError, match="Unknown service 'nope'"):
            app.scale("nope", count=1)
        app.shutdown("KILLED", "the test is over")
        report = wait_final(client, app_id)
    assert (report.state, report.final_status, report.diagnostics) == ("FINISHED", "KILLED", "the test is over")


def test_a_container_over_its_memory_is_killed_as_yarn_does(client: skein.Client) -> None:
    spec = skein.ApplicationSpec(name="hungry", services={"hog": skein.Service(
        script=f"{PY} -c 'b = bytearray(200 * 2**20); import time; time.sleep(60)'",
        resources=skein.Resources(memory=64, vcores=1))})
    app_id = client.submit(spec)
    report = wait_final(client, app_id)
    assert (report.state, report.final_status) == ("FINISHED", "FAILED")
    assert report.diagnostics == "Failure in service hog, see logs for more information."
    (master,) = [log for cid, log in client.application_logs(app_id).items() if cid.endswith("_000001")]
    assert re.search(r"FAILED: hog_0 - [\d.]+ MB of 64.0 MB physical memory used", master), master


def test_an_oversized_container_is_refused_naming_the_limit(client: skein.Client) -> None:
    big = skein.ApplicationSpec(name="big", services={"s": skein.Service(
        script="true", resources=skein.Resources(memory=MAX_MEMORY_MB + 1, vcores=1))})
    with pytest.raises(DriverError, match=rf"service 's'.*maximum allowed allocation=<memory:{MAX_MEMORY_MB}, "
                                          rf"vCores:{MAX_VCORES}>"):
        client.submit(big)
    greedy = skein.ApplicationSpec(name="greedy", master=skein.Master(
        script="true", resources=skein.Resources(memory=128, vcores=MAX_VCORES + 1)))
    with pytest.raises(DriverError, match=r"Invalid resource request for the application master.*vcores"):
        client.submit(greedy)
    assert client.get_applications(states=["ACCEPTED", "RUNNING", "FINISHED", "FAILED", "KILLED"]) == []


def test_an_unknown_application_raises_what_skein_raises(client: skein.Client) -> None:
    # skein's Java driver answers INVALID_ARGUMENT, which skein's client raises as ValueError
    with pytest.raises(ValueError, match="Unknown ApplicationId 'application_1_9999'"):
        client.application_report("application_1_9999")
    with pytest.raises(ValueError, match="Unknown ApplicationId"):
        client.kill_application("application_1_9999")
    with pytest.raises(ValueError, match="Invalid ApplicationId 'nonsense'"):
        client.connect("nonsense")
    assert [q.name for q in client.get_all_queues()] == ["default"]
    with pytest.raises(ValueError, match="Queue 'nope' does not exist"):
        client.get_queue("nope")
    assert [n.state for n in client.get_nodes()] == ["RUNNING"]


def test_skein_finds_the_sandbox_as_its_global_driver(skein_config: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    driver_file = os.path.join(skein_config, "driver")
    with Sandbox(skein_config, work_dir=str(tmp_path / "work")) as sb:
        with skein.Client.from_global_driver() as c:
            assert c.address == sb.address
            assert c.get_applications() == []
        for name, value in sb.client_env().items():  # skein.Client() starts a "driver": the stand-in
            monkeypatch.setenv(name, value)
        with skein.Client() as c:
            assert c.address == f"127.0.0.1:{sb.port}"
            c.get_queue("default")
    assert not os.path.exists(driver_file)
    with pytest.raises(skein.exceptions.DriverNotRunningError):
        skein.Client.from_global_driver()


def test_files_are_localized_and_archives_extracted(client: skein.Client, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("from the tarball\n")
    with tarfile.open(tmp_path / "data.tar.gz", "w:gz") as tf:
        tf.add(tmp_path / "a.txt", arcname="inner/a.txt")
    with zipfile.ZipFile(tmp_path / "more.zip", "w") as zf:
        zf.writestr("b.txt", "from the zip\n")
    spec = skein.ApplicationSpec(name="files", master=skein.Master(
        script="cat data/inner/a.txt more/b.txt plain.txt && test -f .skein.crt",
        files={"data": str(tmp_path / "data.tar.gz"), "more": str(tmp_path / "more.zip"),
               "plain.txt": script_file(tmp_path, "p.txt", "plain\n")}))
    app_id = client.submit(spec)
    report = wait_final(client, app_id)
    assert report.final_status == "SUCCEEDED", report.diagnostics
    (master,) = client.application_logs(app_id).values()
    assert "from the tarball\nfrom the zip\nplain\n" in master


def _start_sandbox_process(config: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([PY, "-c", f"from yarnflow.sandbox import run_sandbox; raise SystemExit("
                                       f"run_sandbox({config!r}, max_memory_mb=1024))"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.match(r"yarn-sandbox running at (\S+) ", line)
    assert match, line
    return proc, match.group(1)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_no_container_outlives_the_sandbox_process(skein_config: str, tmp_path: Path, process_tag: str,
                                                   signum: int) -> None:
    proc, address = _start_sandbox_process(skein_config)
    try:
        with skein.Client(address=address) as c:
            app_id = c.submit(skein.ApplicationSpec(name="orphan", master=skein.Master(
                script=f"{PY} spawner.py", files={"spawner.py": script_file(tmp_path, "s.py", SPAWNER)})))
            with c.connect(app_id) as app:
                pids = [int(p) for p in wait_until(lambda: app.kv.get("pids"), 30, "no pids").split()]
        proc.send_signal(signum)
        assert proc.wait(30) == (0 if signum == signal.SIGTERM else -signal.SIGKILL)
        wait_until(lambda: gone(*pids) and not live_tagged(process_tag), 15,
                   lambda: f"left behind: {[p.cmdline() for p in live_tagged(process_tag)]}")
        assert os.path.exists(os.path.join(skein_config, "driver")) == (signum == signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()


# A master that serves a small web app (echoes each request; "/go" redirects relatively; it
# sets a cookie without a path), links it as a page of the application's web UI and waits.
WEB_MASTER = textwrap.dedent("""\
    import http.server, json, skein, time
    class H(http.server.BaseHTTPRequestHandler):
        def _echo(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            if self.path.startswith("/go"):
                self.send_response(302); self.send_header("Location", "there"); self.send_header("Content-Length", "0")
                self.end_headers(); return
            out = json.dumps({"method": self.command, "path": self.path, "body": body,
                              "auth": self.headers.get("Authorization")}).encode()
            self.send_response(201 if self.command == "POST" else 200)
            self.send_header("Set-Cookie", "seen=1; HttpOnly")
            self.send_header("Content-Length", str(len(out))); self.end_headers(); self.wfile.write(out)
        do_GET = do_POST = do_PATCH = do_DELETE = _echo
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    app = skein.ApplicationClient.from_current()
    app.ui.add_page("echo", f"http://127.0.0.1:{server.server_address[1]}", link_name="Echo & co")
    app.ui.add_page("hidden", f"http://127.0.0.1:{server.server_address[1]}/sub/")  # proxied, not linked
    app.kv["ready"] = b"1"
    server.serve_forever()
""")


def test_the_tracking_url_is_the_resourcemanagers_proxy_of_the_applications_pages(
        client: skein.Client, sandbox: Sandbox, tmp_path: Path) -> None:
    """As on YARN: a running application's tracking URL is ``http://<rm>:<port>/proxy/<id>/``
    (skein's web UI, linking the pages added with ``ui.add_page``), and a page's address under
    it forwards every method, query, header and body to the page's target, its answers as they
    are (status, relative redirect, cookie); an ended application's pages are gone (404)."""
    import requests

    spec = skein.ApplicationSpec(name="web", master=skein.Master(
        script=f"{PY} master.py", files={"master.py": script_file(tmp_path, "web.py", WEB_MASTER)}))
    app_id = client.submit(spec)
    with client.connect(app_id) as app:
        app.kv.wait("ready")
        base = f"http://127.0.0.1:{sandbox.web_port}/proxy/{app_id}/"
        assert client.application_report(app_id).tracking_url == base
        index = requests.get(base, timeout=10)
        assert index.status_code == 200 and '<a href="pages/echo/">Echo &amp; co</a>' in index.text
        assert "hidden" not in index.text
        pages = app.ui.get_pages()
        assert pages["echo"].address == base + "pages/echo/" and app.ui.address == base

        echo = base + "pages/echo/"
        got = requests.get(echo + "a/b?x=1&y=%20", headers={"Authorization": "Bearer t"}, timeout=10)
        assert got.status_code == 200 and got.json() == {"method": "GET", "path": "/a/b?x=1&y=%20", "body": "",
                                                         "auth": "Bearer t"}
        assert "seen=1" in got.headers["Set-Cookie"] and "Path" not in got.headers["Set-Cookie"]
        posted = requests.post(echo + "jobs", data="payload", timeout=10)
        assert posted.status_code == 201 and posted.json()["body"] == "payload"
        assert requests.patch(echo + "jobs/1?mode=cancel", timeout=10).json()["method"] == "PATCH"
        moved = requests.get(echo + "go", allow_redirects=False, timeout=10)
        assert moved.status_code == 302 and moved.headers["Location"] == "there"
        assert requests.get(base + "pages/hidden/x", timeout=10).json()["path"] == "/sub/x"
        assert requests.get(base + "pages/echo", allow_redirects=False, timeout=10).headers["Location"] == \
            f"/proxy/{app_id}/pages/echo/"
        missing = requests.get(base + "pages/nope/", timeout=10)
        assert missing.status_code == 404 and "has no page 'nope'" in missing.text
        unknown = requests.get(base.replace(app_id, "application_1_9999"), timeout=10)
        assert unknown.status_code == 404 and "is not running" in unknown.text
        app.shutdown("SUCCEEDED")
    wait_final(client, app_id)
    assert client.application_report(app_id).tracking_url == ""
    ended = requests.get(base + "pages/echo/", timeout=10)
    assert ended.status_code == 404 and f"Application {app_id} is not running" in ended.text
