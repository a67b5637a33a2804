"""Every page of the web UI checked by axe-core (Deque's accessibility engine, from npm:
.ci/install-test-deps puts it under ~/.cache/yarnflow-test/axe) in headless Chromium: no
violation of impact "serious" or "critical" (issue 55). The pages hold a running job, a failed
one, an uploaded job file and a TaskExecutor, so their tables, graph, forms and traces are all
there when checked."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from selenium import webdriver

from tests.e2e.test_web_ui import browser, wait_for  # noqa: F401 - the fixture
from tests.harness import wait_until
from tests.integration.test_rest_api import cluster  # noqa: F401 - the fixture
from tests.rest import generator_job, get, submit, wait_flowing

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

AXE = Path(os.environ.get("YARNFLOW_AXE_JS", Path.home() / ".cache/yarnflow-test/axe/node_modules/axe-core/axe.min.js"))


def violations(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations of the page as it is now."""
    driver.execute_script(AXE.read_text())
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']}).then(r => done(r.violations.map(v => ({"
        "id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 3).map(n => n.html.slice(0, 160))}))))"
        ".catch(e => done([{id: 'axe-error', impact: 'critical', help: String(e), nodes: []}]));")
    return [v for v in result if v["impact"] in ("serious", "critical")]


def test_every_page_has_no_serious_accessibility_violation(cluster: Any, browser: webdriver.Chrome,  # noqa: F811
                                                           tmp_path: Path) -> None:
    assert AXE.is_file(), f"{AXE} is missing: run .ci/install-test-deps (it installs axe-core from npm)"
    web = cluster.web
    running = submit(cluster, generator_job(str(tmp_path / "out")), "accessible job",
                     {"execution.checkpointing.interval": "300 ms"})
    failed = submit(cluster, generator_job(str(tmp_path / "out2"), fail_after=600), "failing job")
    wait_flowing(web, running)
    wait_until(lambda: get(f"{web}/jobs/{failed}")["state"] == "FAILED", 60, "the job did not fail")
    job = tmp_path / "uploaded.py"
    job.write_text("import yarnflow\n")
    with job.open("rb") as f:
        assert requests.post(f"{web}/jars/upload", files={"jarfile": ("uploaded.py", f)}, timeout=10).ok
    tm = get(f"{web}/taskmanagers")["taskmanagers"][0]["id"]
    browser.set_window_size(1400, 1000)
    pages = {"overview": ("", "#card-taskmanagers"), "jobs": ("#/jobs", "#running-jobs"),
             "job": (f"#/jobs/{running}", "#subtasks-table tbody tr"),
             "vertex": (f"#/jobs/{running}/vertex/{get(f'{web}/jobs/{running}')['vertices'][0]['id']}",
                        "#vertex-subtasks tbody tr"),
             "exceptions": (f"#/jobs/{failed}/exceptions", "#exceptions-table details"),
             "checkpoints": (f"#/jobs/{running}/checkpoints", "#checkpoints-table tbody tr"),
             "configuration": (f"#/jobs/{running}/configuration", "#config-table tbody tr"),
             "flamegraph": (f"#/jobs/{running}/flamegraph", "#flame-status"),
             "spark": (f"#/jobs/{running}/spark", "#no-spark"),
             "taskmanagers": ("#/taskmanagers", "#taskmanagers-table tbody tr"),
             "taskmanager": (f"#/taskmanagers/{tm}", "#slots-table"),
             "thread dump": (f"#/taskmanagers/{tm}/thread-dump", "#thread-dump tbody tr"),
             "submit": ("#/submit", "#jars-table tbody tr"),
             "appmaster": ("#/appmaster/logs", "#am-logs a"),
             "appmaster metrics": ("#/appmaster/metrics", "#am-metrics tbody tr"),
             "log viewer": (f"#/logs/taskmanager/{tm}/{tm}.log", "#log-view")}
    found = {}
    try:
        for name, (route, ready) in pages.items():
            browser.get(f"{web}/{route}")
            wait_for(browser, ready, timeout=40)
            time.sleep(0.3)
            if name == "exceptions":  # a trace opened, as a reader would
                browser.execute_script("document.querySelector('#exceptions-table details').open = true")
            problems = violations(browser)
            if problems:
                found[name] = problems
    finally:
        requests.patch(f"{web}/jobs/{running}?mode=cancel", timeout=10)
    assert not found, "\n".join(f"{page}: {v['impact']} {v['id']}: {v['help']} {v['nodes']}"
                                for page, vs in found.items() for v in vs)
