"""The web UI of a YARN session as a user reaches it: from the application's tracking URL (the
ResourceManager's proxy of skein's web UI, which the YARN sandbox serves as YARN does:
sandbox/web_proxy.py), through the link to the yarnflow page, signing in with the REST token
(derived from the application's credentials), to a job named by a deep link, the AppMaster's
logs in the viewer and a TaskExecutor's page, every request under the proxy's prefix (issue 55)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import skein
from selenium.webdriver.common.by import By

from tests.e2e.test_web_ui import browser, console_errors, read, wait_for  # noqa: F401 - the fixture
from tests.harness import wait_until
from tests.integration.test_yarn_jobs import (  # noqa: F401 - the fixture
    YARN_CONF, dconf, report, start_session, wait_final, write_input, yarn_cli)
from yarnflow.common.security import TlsCredentials, rest_token

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.filterwarnings("ignore:distutils Version classes are deprecated:DeprecationWarning")]


def test_a_yarn_sessions_ui_through_the_resourcemanagers_proxy(yarn_cli: Any, sandbox: Any, browser: Any,  # noqa: F811
                                                               tmp_path: Path) -> None:
    write_input(tmp_path / "in", files=2, rows=300)
    app_id, keys, _ = start_session(yarn_cli)
    try:
        ran = yarn_cli.run("run", *keys, "job.py", str(tmp_path / "in"), str(tmp_path / "out"), "BATCH", "0", "ui",
                           timeout=120)
        assert ran.returncode == 0, ran.stderr
        found = re.search(r"Submitted job [^(]*\(([0-9a-f]{32})\)", ran.stderr)
        assert found, ran.stderr
        job_id = found.group(1)
        tracking = report(app_id).tracking_url
        assert tracking.startswith(f"http://127.0.0.1:{sandbox.web_port}/proxy/{app_id}/")

        # the tracking URL: skein's page of the application, linking the yarnflow web UI
        browser.get(tracking)
        [link] = wait_for(browser, "#pages a")
        assert link.text == "yarnflow web UI"
        ui = tracking + "pages/yarnflow/"
        assert link.get_attribute("href") == ui
        # a deep link to the job, signed in on the way
        browser.get(ui + f"#/jobs/{job_id}")
        wait_for(browser, "input#token")
        assert browser.current_url.startswith(ui + "login") and browser.current_url.endswith(f"#/jobs/{job_id}")
        token = rest_token(TlsCredentials(f"{sandbox.config_dir}/skein.crt", f"{sandbox.config_dir}/skein.pem"))
        browser.find_element(By.CSS_SELECTOR, "input#token").send_keys(token)
        browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait_for(browser, "#job-graph g.vertex")
        assert browser.current_url == ui + f"#/jobs/{job_id}"
        wait_until(lambda: "FINISHED" in " ".join(read(browser, "#view")), 20, "the job's state is not shown")
        # the AppMaster's log in the viewer (ranged reads through the proxy)
        browser.get(ui + "#/appmaster/logs")
        wait_for(browser, "#am-logs a")
        browser.find_element(By.CSS_SELECTOR, "#am-logs a").click()
        wait_until(lambda: "published the AppMaster address" in " ".join(read(browser, "#log-view")), 20,
                   "the AppMaster's log is not shown")
        raw = browser.find_element(By.CSS_SELECTOR, "#view p.muted a[target=_blank]").get_attribute("href")
        assert raw.startswith(ui + "jobmanager/logs/"), raw
        # a TaskExecutor by its YARN container id, as `skein container ls` names it
        browser.get(ui + "#/taskmanagers")
        wait_for(browser, "#taskmanagers-table tbody tr")
        shown = " ".join(read(browser, "#taskmanagers-table tbody tr"))
        with skein.Client.from_global_driver() as client:
            containers = client.connect(app_id).get_containers(services=["taskexecutor"])
        assert containers and all(c.yarn_container_id in shown for c in containers), shown
        assert all(u.startswith(tracking) for u in browser.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)")), "a request left the proxy"
        assert console_errors(browser) == []
    finally:
        yarn_cli.run("session", "stop", *keys, timeout=60)
    assert wait_final(app_id).final_status == "SUCCEEDED"
