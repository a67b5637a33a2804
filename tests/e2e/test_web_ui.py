"""The web UI in headless Chromium (Debian's chromium and chromium-driver, which
.ci/install-test-deps installs: these tests fail, not skip, without them). Against a real local
cluster running a STREAMING job: every page loads without console errors, the job graph shows
the job's vertices with their figures, and the cancel button cancels the job. Screenshots of each
page are saved under the test's tmp_path (``ui-*.png``)."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.harness import wait_until
from tests.integration.test_rest_api import cluster  # noqa: F401 - the fixture
from tests.rest import generator_job, get, submit, wait_flowing

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    for path in (CHROMIUM, CHROMEDRIVER):
        assert shutil.which(path), f"{path} is missing: run .ci/install-test-deps (Debian chromium, chromium-driver)"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: webdriver.Chrome) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def wait_for(driver: webdriver.Chrome, css: str, timeout: float = 20) -> Any:
    return WebDriverWait(driver, timeout).until(lambda d: d.find_elements(By.CSS_SELECTOR, css) or None)


def read(driver: webdriver.Chrome, css: str, what: str = "textContent") -> list[str]:
    """``what`` of every element matching ``css``, read at once (the page redraws every 2 s, which
    makes element handles stale)."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => arguments[1].startsWith('data-') ? "
        "e.getAttribute(arguments[1]) : e[arguments[1]])", css, what)


def click(driver: webdriver.Chrome, css: str, timeout: float = 20) -> None:
    """Click the first element matching ``css`` as a user would, again if a redraw replaced it."""
    def clicked() -> bool:
        try:
            wait_for(driver, css, timeout)[0].click()
            return True
        except StaleElementReferenceException:
            return False
    wait_until(clicked, timeout, f"could not click {css}", interval_s=0.05)


def test_pages_graph_and_cancel_in_chromium(cluster: Any, browser: webdriver.Chrome,  # noqa: F811
                                            tmp_path: Path) -> None:
    web = cluster.web
    job_id = submit(cluster, generator_job(str(tmp_path / "out")), "ui job",
                    {"execution.checkpointing.interval": "300 ms"})
    details = wait_flowing(web, job_id)

    browser.get(f"{web}/")
    wait_for(browser, "#card-taskmanagers")
    cards = dict(zip(read(browser, ".card", "id"), read(browser, ".card .num")))
    assert {k: cards[k] for k in ("card-taskmanagers", "card-slots-total", "card-slots-available",
                                  "card-jobs-running")} == {"card-taskmanagers": "2", "card-slots-total": "4",
                                                            "card-slots-available": "2", "card-jobs-running": "1"}
    assert "ui job" in read(browser, "#running-jobs")[0]
    browser.save_screenshot(str(tmp_path / "ui-overview.png"))

    click(browser, "#running-jobs tr.link")  # to the job's page
    wait_for(browser, "#job-graph g.vertex")
    assert read(browser, "#job-graph g.vertex", "data-vertex-id") == [v["id"] for v in details["vertices"]]
    assert read(browser, "#job-graph g.vertex", "data-status") == ["RUNNING", "RUNNING"]
    texts = read(browser, "#job-graph g.vertex")
    assert "generator -> identity" in texts[0] and "parallelism 2" in texts[0]
    assert "sum(v) -> parquet_sink" in texts[1]
    assert "back-pressure ok" in texts[0]
    assert browser.execute_script("return [...document.querySelectorAll('#job-graph .vertex-backpressure')]"
                                  ".map(e => e.getAttribute('class'))") == ["vertex-backpressure bp-ok"] * 2
    wait_until(lambda: "in 0/s" not in read(browser, "#job-graph g.vertex .vertex-rates")[1], 20,
               "the graph never showed records flowing into the sink")
    assert len(read(browser, "#job-graph path.edge")) == 1
    wait_for(browser, "#subtasks-table tbody tr")
    assert len(read(browser, "#subtasks-table tbody tr")) == 4
    browser.save_screenshot(str(tmp_path / "ui-job.png"))

    click(browser, "#tab-checkpoints")
    wait_for(browser, "#checkpoints-table tbody tr.link")
    click(browser, "#checkpoints-table tbody tr.link")  # a checkpoint's part per subtask
    wait_until(lambda: len(read(browser, "#checkpoint-subtasks tbody tr")) == 4, 20,
               lambda: f"no per-subtask checkpoint details: {read(browser, '#tab-content')}")
    assert all("completed" in r or "pending_or_failed" in r for r in read(browser, "#checkpoint-subtasks tbody tr"))
    headers = read(browser, "#checkpoint-subtasks thead th")
    assert "Start delay" in headers and "Sync / async" in headers
    delays = read(browser, f"#checkpoint-subtasks tbody td:nth-child({headers.index('Start delay') + 1})")
    assert delays and all(re.fullmatch(r"(\d+|-) ms", d) for d in delays), delays
    click(browser, "#tab-exceptions")
    wait_for(browser, "#no-exceptions")
    browser.get(f"{web}/#/taskmanagers")
    wait_for(browser, "#taskmanagers-table tbody tr")
    assert len(read(browser, "#taskmanagers-table tbody tr")) == 2
    click(browser, "#taskmanagers-table tbody tr")
    wait_for(browser, "#slots-table tbody tr")
    assert len(read(browser, "#slots-table tbody tr")) == 2
    assert read(browser, "#tm-memory-used .num") and read(browser, "#tm-logs a")  # its memory and its log files
    browser.save_screenshot(str(tmp_path / "ui-taskexecutor.png"))
    click(browser, "#tm-thread-dump")  # its threads and their stacks
    wait_until(lambda: any(r.startswith("te-heartbeat") for r in read(browser, "#thread-dump tbody tr")), 20,
               lambda: f"no thread dump: {read(browser, '#view')}")
    assert any(r.startswith("task ") for r in read(browser, "#thread-dump tbody tr"))
    # a vertex's flame graph: "sampling" first, then bars, the root spanning the whole width
    browser.get(f"{web}/#/jobs/{job_id}/flamegraph")
    wait_until(lambda: read(browser, "#flamegraph .flame"), 40,
               lambda: f"no flame graph: {read(browser, '#tab-content')}")
    assert browser.execute_script("return [...document.querySelectorAll('#flamegraph .flame')]"
                                  ".find(e => e.textContent === 'root').style.width") == "100%"
    assert "samples, taken" in read(browser, "#flame-status")[0]
    click(browser, "#flame-OFF_CPU")
    wait_until(lambda: "/flamegraph/" in browser.current_url and "OFF_CPU" in browser.current_url, 10, "no OFF_CPU")
    browser.save_screenshot(str(tmp_path / "ui-flamegraph.png"))
    browser.get(f"{web}/#/jobs/{job_id}/configuration")
    wait_for(browser, "#config-table tbody tr")
    assert "execution.checkpointing.interval" in read(browser, "#config-table")[0]
    assert "300 ms" in read(browser, "#checkpoint-config")[0] or "every 300" in read(browser, "#checkpoint-config")[0]

    browser.get(f"{web}/#/jobs/{job_id}")
    click(browser, "#cancel-job")
    WebDriverWait(browser, 10).until(lambda d: d.switch_to.alert).dismiss()  # asked first: not cancelled
    time.sleep(0.5)
    assert get(f"{web}/jobs/{job_id}")["state"] == "RUNNING"
    click(browser, "#cancel-job")
    alert = WebDriverWait(browser, 10).until(lambda d: d.switch_to.alert)
    assert "Cancel job ui job?" in alert.text
    alert.accept()
    wait_until(lambda: get(f"{web}/jobs/{job_id}")["state"] == "CANCELED", 30, "the UI's cancel did not cancel")
    wait_until(lambda: read(browser, "h2 + .state") == ["CANCELED"] and set(read(
        browser, "#job-graph g.vertex", "data-status")) == {"CANCELED"}, 20,
        lambda: f"the page does not show the job cancelled: {read(browser, '#view')}")
    assert not read(browser, "#cancel-job")
    browser.save_screenshot(str(tmp_path / "ui-cancelled.png"))
    assert console_errors(browser) == []
    assert read(browser, "#error", "hidden") == [True]


def test_an_ended_jobs_page_keeps_its_scroll_and_open_traces_across_refreshes(
        cluster: Any, browser: webdriver.Chrome, tmp_path: Path) -> None:  # noqa: F811
    """The page is updated in place: it rebuilt itself every few seconds, so the scroll position
    and an open stack trace jumped back to the top, even on an ended job (issue 32)."""
    web = cluster.web
    job_id = submit(cluster, generator_job(str(tmp_path / "out"), fail_after=600), "failing ui job",
                    {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": "5",
                     "restart-strategy.fixed-delay.delay": "50 ms"})
    wait_until(lambda: get(f"{web}/jobs/{job_id}")["state"] == "FAILED", 60, "the job did not fail")
    browser.set_window_size(1200, 500)
    browser.get(f"{web}/#/jobs/{job_id}/exceptions")
    wait_for(browser, "#exceptions-table details.trace")
    assert len(read(browser, "#exceptions-table tbody tr")) == 6
    # open the last trace, scroll to the bottom, mark the table's element
    browser.execute_script("const d = [...document.querySelectorAll('details.trace')].pop(); d.open = true;"
                           "document.getElementById('exceptions-table').kept = 'kept';"
                           "window.scrollTo(0, document.body.scrollHeight);")
    scrolled = browser.execute_script("return window.scrollY")
    assert scrolled > 100
    time.sleep(2.0 * 2.5)  # two refreshes or more (every 2 s)
    assert browser.execute_script("return window.scrollY") == scrolled
    assert read(browser, "details.trace", "open")[-1] is True and read(browser, "details.trace", "open")[0] is False
    assert read(browser, "#exceptions-table", "kept") == ["kept"]  # the same element, not a new page
    assert "boom at row" in read(browser, "details.trace pre")[-1]
    # an unknown job's page: what the server said, and nothing of the previous page under it
    browser.get(f"{web}/#/jobs/{'0' * 32}")
    wait_for(browser, "#job-missing")
    assert "404" in read(browser, "#job-missing")[0] and "exceptions-table" not in browser.page_source
    assert read(browser, "#view a") == ["All jobs"]
    browser.save_screenshot(str(tmp_path / "ui-404.png"))
    # (the browser reports the fetch that got the 404 itself; nothing else)
    assert all("/jobs/" + "0" * 32 in e and "404" in e for e in console_errors(browser)), console_errors(browser)


def test_the_submit_page_uploads_plans_and_runs_a_job_file(cluster: Any, browser: webdriver.Chrome,  # noqa: F811
                                                          tmp_path: Path) -> None:
    web = cluster.web
    out = tmp_path / "out"
    job = tmp_path / "doubled.py"
    job.write_text("import sys\nimport yarnflow\n\nenv = yarnflow.StreamExecutionEnvironment.get_execution_environment()\n"
                   "env.from_collection({'v': list(range(int(sys.argv[2])))}).map(lambda r: {'v': 2 * r['v']})"
                   ".sink_to_parquet(sys.argv[1])\nenv.execute('from the ui')\n")
    browser.get(f"{web}/#/submit")
    wait_for(browser, "#no-jars")
    wait_for(browser, "#jar-file")[0].send_keys(str(job))
    click(browser, "#jar-upload")
    wait_for(browser, "#jars-table tbody tr")
    assert "doubled.py" in read(browser, "#jars-table tbody tr")[0]
    browser.find_element(By.CSS_SELECTOR, ".jar-args").send_keys(f"{out} 300")
    browser.find_element(By.CSS_SELECTOR, ".jar-parallelism").send_keys("2")
    time.sleep(2.5)  # a refresh in between keeps what was typed (the page is updated in place)
    assert read(browser, ".jar-args", "value") == [f"{out} 300"]
    click(browser, ".jar-plan")
    wait_for(browser, "#jar-plan li", timeout=60)
    assert "parallelism 2" in read(browser, "#jar-plan li")[0]
    click(browser, ".jar-run")
    wait_for(browser, "#submitted a", timeout=60)
    job_id = read(browser, "#submitted a")[0]
    wait_until(lambda: get(f"{web}/jobs/{job_id}/status")["status"] == "FINISHED", 60, "the job did not finish")
    import pyarrow.dataset as pads
    assert sorted(pads.dataset(str(out), format="parquet").to_table()["v"].to_pylist()) == [2 * v for v in range(300)]
    browser.save_screenshot(str(tmp_path / "ui-submit.png"))
    click(browser, ".jar-delete")
    wait_for(browser, "#no-jars")
    assert console_errors(browser) == []


def test_failures_read_at_a_glance_and_an_opened_trace_stays_on_its_entry(
        cluster: Any, browser: webdriver.Chrome, tmp_path: Path) -> None:  # noqa: F811
    """Each failure shows its exception's type and message without opening anything; a trace
    opened at 1,400 px wraps inside its column (the page does not grow wider than the window and
    the Task column keeps its width); when a newer failure arrives above it, the opened trace
    stays open on the entry it belongs to (issue 55)."""
    web = cluster.web
    long_path = "/".join(f"part-{i:05d}" for i in range(40))  # one unbroken word, ~400 characters
    job_id = submit(cluster, generator_job(str(tmp_path / "out"), fail_after=600, detail=f": cannot read {long_path}"),
                    "failing slowly",
                    {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": "3",
                     "restart-strategy.fixed-delay.delay": "4 s"})
    browser.set_window_size(1400, 1000)
    browser.get(f"{web}/#/jobs/{job_id}/exceptions")
    wait_for(browser, "#exceptions-table details.trace", timeout=60)
    [summary] = read(browser, "#exceptions-table details.trace summary")[:1]
    assert summary.startswith("UserFunctionError: user function rows in operator 'generator' raised RuntimeError: "
                              "boom at row"), summary  # type and message in view
    [first_row] = read(browser, "#exceptions-table tbody tr", "id")[:1]
    browser.execute_script("document.querySelector('#exceptions-table details.trace').open = true")
    # the trace's longest line is wider than the window: it wraps, nothing scrolls sideways
    assert long_path in read(browser, "#exceptions-table details.trace pre")[0]
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    task_width = browser.execute_script("return document.querySelector('#exceptions-table td.exc-task')"
                                        ".getBoundingClientRect().width")
    assert task_width >= 200, task_width
    browser.save_screenshot(str(tmp_path / "ui-exceptions-open.png"))
    # the next failure arrives above it: the opened one is still open, on its own entry
    wait_until(lambda: len(read(browser, "#exceptions-table tbody tr")) >= 2, 60, "no second failure came")
    time.sleep(2.5)  # (a refresh after it came)
    rows = read(browser, "#exceptions-table tbody tr", "id")
    opened = read(browser, "#exceptions-table details.trace", "open")
    assert rows.index(first_row) >= 1 and opened[rows.index(first_row)] is True, (rows, opened, first_row)
    assert opened[0] is False  # the new entry came closed
    assert console_errors(browser) == []


def test_the_submit_page_says_why_an_upload_or_a_run_failed(cluster: Any, browser: webdriver.Chrome,  # noqa: F811
                                                           tmp_path: Path) -> None:
    """A failed action's message replaces what the previous one said (it stayed on screen, and
    the failure said nothing: issue 55)."""
    web = cluster.web
    good, bad = tmp_path / "fine.py", tmp_path / "broken.py"
    good.write_text("import sys\nimport yarnflow\n\nenv = yarnflow.StreamExecutionEnvironment.get_execution_environment()\n"
                    "env.from_collection({'v': [1, 2, 3]}).sink_to_parquet(sys.argv[1])\nenv.execute('fine')\n")
    bad.write_text("import yarnflow\nprint('never closed'\n")
    browser.get(f"{web}/#/submit")
    click(browser, "#jar-upload")  # no file chosen
    wait_for(browser, "#submit-error")
    assert read(browser, "#submit-error") == ["Upload failed: choose a job file first"]
    wait_for(browser, "#jar-file")[0].send_keys(str(good))
    click(browser, "#jar-upload")
    wait_until(lambda: read(browser, "#submit-result") == ["Uploaded fine.py."], 20, "the upload did not say it worked")
    browser.find_element(By.CSS_SELECTOR, ".jar-args").send_keys(str(tmp_path / "out"))
    click(browser, ".jar-run")
    wait_for(browser, "#submitted a", timeout=60)
    browser.execute_script("document.getElementById('jar-file').value = ''")
    wait_for(browser, "#jar-file")[0].send_keys(str(bad))
    click(browser, "#jar-upload")
    wait_until(lambda: len(read(browser, "#jars-table tbody tr")) == 2, 20, "the second file was not uploaded")
    row = [i for i, t in enumerate(read(browser, "#jars-table tbody tr")) if "broken.py" in t][0]
    browser.find_elements(By.CSS_SELECTOR, ".jar-run")[row].click()
    wait_for(browser, "#submit-error", timeout=60)
    message = read(browser, "#submit-error")[0]
    assert message.startswith("Run failed: 400") and "never closed" in message, message
    assert not read(browser, "#submitted")  # the earlier "Submitted job" is gone
    time.sleep(2.5)  # and the message outlives a refresh
    assert read(browser, "#submit-error") == [message]
    browser.save_screenshot(str(tmp_path / "ui-submit-error.png"))


def test_the_history_servers_pages_say_what_an_archive_lacks(cli: Any, browser: webdriver.Chrome,
                                                            tmp_path: Path) -> None:
    """In the history server, a tab the archive has nothing for says so under the job's header and
    tabs (the flame graph and Spark tabs, and an unknown job, replaced the whole page with a 404),
    and its TaskExecutors page says why it is empty (issue 55)."""
    archive = f"file://{tmp_path / 'archive'}"
    job = tmp_path / "archived.py"
    job.write_text("import sys\nimport yarnflow\nenv = yarnflow.StreamExecutionEnvironment.get_execution_environment()\n"
                   "env.from_collection({'v': list(range(50))}).map(lambda r: {'v': r['v'] + 1})"
                   ".sink_to_parquet(sys.argv[1])\nenv.execute('archived ok')\n")
    ok = cli.run("run", "-D", f"jobmanager.archive.fs.dir={archive}", str(job), str(tmp_path / "out"))
    assert ok.returncode == 0, ok.stderr
    job_id = re.search(r"\(([0-9a-f]{32})\)", ok.stderr).group(1)
    server = cli.start("history-server", "-D", f"historyserver.archive.fs.dir={archive}", "-D",
                       "historyserver.web.port=0")
    url = re.search(r"at (http://\S+)", server.stdout.readline()).group(1)

    browser.get(f"{url}/#/jobs/{job_id}")
    wait_for(browser, "#subtasks-table tbody tr")
    assert read(browser, ".tabs a", "id") == ["tab-subtasks", "tab-exceptions", "tab-checkpoints", "tab-configuration",
                                              "tab-spark"]  # no flame graph: nothing runs to sample
    assert not read(browser, "#cancel-job")
    click(browser, "#tab-spark")  # archived now: the job ran no Spark stage
    wait_for(browser, "#no-spark")
    browser.get(f"{url}/#/jobs/{job_id}/flamegraph")  # (a link kept from the live cluster)
    wait_for(browser, "#flame-status")
    assert "history server has only the job's archive" in read(browser, "#flame-status")[0]
    assert read(browser, "h2") == ["archived ok"] and read(browser, "#graph g.vertex")  # header, graph, tabs stay
    assert read(browser, "#error", "hidden") == [True]
    browser.save_screenshot(str(tmp_path / "ui-history-flamegraph.png"))
    browser.get(f"{url}/#/jobs/{'0' * 32}")
    wait_for(browser, "#job-missing")
    assert "is not in the job archives" in read(browser, "#job-missing")[0]
    browser.get(f"{url}/#/taskmanagers")
    wait_for(browser, "#no-taskmanagers")
    assert "it has no TaskExecutors" in read(browser, "#no-taskmanagers")[0]
    assert not read(browser, "#taskmanagers-table")
    assert all("/jobs/" + "0" * 32 in e and "404" in e for e in console_errors(browser)), console_errors(browser)


def slow_map_job(out: str) -> Any:
    """An unbounded source, rebalanced into a map sleeping a millisecond a row (Python's per-row
    path): the map sets the pace, the source waits for room."""
    def build(env: Any) -> None:
        def rows(start: int, n: int) -> dict[str, list[int]]:
            return {"v": list(range(start, start + n))}

        def slow(row: dict[str, int]) -> dict[str, int]:
            time.sleep(0.001)
            return row

        env.from_generator(rows, count=None).rebalance().map(slow, name="slow map").sink_to_parquet(out)
    return build


def test_a_slow_operators_rate_and_the_back_pressure_behind_it_are_shown_as_they_are(
        cluster: Any, browser: webdriver.Chrome, tmp_path: Path) -> None:  # noqa: F811
    """Its records were counted a 65,536-row batch at a time, so the map read 0/s for a minute
    and then spiked; the source blocked behind it read "busy 1000 ms/s, back-pressure ok"
    (issue 55). Now, 5 s after it starts: the map's rate within 20% of the truth, the source
    back-pressured."""
    started = time.perf_counter()
    for _ in range(200):
        time.sleep(0.001)
    per_row = (time.perf_counter() - started) / 200  # what a millisecond's sleep takes here
    truth = 2 / per_row  # rows/s of the map's two subtasks
    web = cluster.web
    job_id = submit(cluster, slow_map_job(str(tmp_path / "out")), "slow map")
    try:
        wait_until(lambda: all(v["status"] == "RUNNING" for v in get(f"{web}/jobs/{job_id}")["vertices"]), 60,
                   "the job did not start")
        browser.get(f"{web}/#/jobs/{job_id}")
        wait_for(browser, "#job-graph g.vertex")
        time.sleep(5.0)

        def shown() -> tuple[float, str, str] | None:
            source, slow = read(browser, "#job-graph g.vertex")
            m = re.search(r"in ([\d.]+)(k?)/s", slow)
            if not m:
                return None
            rate = float(m.group(1)) * (1000 if m.group(2) else 1)
            return (rate, source, slow) if abs(rate - truth) <= 0.2 * truth and "back-pressure high" in source else None

        rate, source, slow = wait_until(shown, 10, lambda: f"the graph shows {read(browser, '#job-graph g.vertex')}, "
                                                           f"the map really does {truth:.0f} rows/s")
        browser.save_screenshot(str(tmp_path / "ui-slow-map.png"))
        # the source's subtasks: back-pressured, not busy
        wait_for(browser, "#subtasks-table tbody tr")
        rows = [r for r in read(browser, "#subtasks-table tbody tr") if r.startswith("generator")]
        assert len(rows) == 2 and all("high" in r for r in rows), rows
        busy = browser.execute_script(
            "return [...document.querySelectorAll('#subtasks-table tbody tr')].filter(r => r.textContent.startsWith("
            "'generator')).map(r => Number(r.children[11].textContent))")
        assert all(b <= 100 for b in busy), busy
    finally:
        requests.patch(f"{web}/jobs/{job_id}?mode=cancel", timeout=10)


def test_a_cleanly_finished_jobs_checkpoints_show_no_failure_their_subtasks_and_that_they_are_gone(
        cluster: Any, browser: webdriver.Chrome, tmp_path: Path) -> None:  # noqa: F811
    """A job that finished cleanly showed "Failed 1" (the checkpoint its end overtook), its
    checkpoints' per-subtask details were gone once it ended, and its deleted checkpoints were
    not marked discarded (issue 55)."""
    def bounded(env: Any) -> None:
        def rows(start: int, n: int) -> dict[str, list[int]]:
            return {"k": [i % 7 for i in range(start, start + n)], "v": list(range(start, start + n))}

        (env.from_generator(rows, count=2500, rate_per_s=1000).key_by("k").sum("v")
            .sink_to_parquet(str(tmp_path / "out")))

    web = cluster.web
    job_id = submit(cluster, bounded, "bounded", {"execution.checkpointing.interval": "200 ms"})
    wait_until(lambda: get(f"{web}/jobs/{job_id}")["state"] == "FINISHED", 60, "the job did not finish")
    browser.get(f"{web}/#/jobs/{job_id}/checkpoints")
    wait_for(browser, "#checkpoints-table tbody tr.link")
    cards = dict(zip(read(browser, ".card", "id"), read(browser, ".card .num")))
    assert cards["ck-failed"] == "0" and int(cards["ck-completed"]) >= 3, cards
    rows = read(browser, "#checkpoints-table tbody tr")
    assert rows and all("COMPLETED" in r and "(discarded)" in r for r in rows), rows  # a finished job's go
    acknowledged = read(browser, "#checkpoints-table tbody td:nth-child(4)")
    assert all(a == "4/4" for a in acknowledged), acknowledged  # every subtask of the job, every time
    click(browser, "#checkpoints-table tbody tr.link")  # its part per subtask, after the job's end
    wait_until(lambda: len(read(browser, "#checkpoint-subtasks tbody tr")) == 4, 20,
               lambda: f"no per-subtask details of an ended job's checkpoint: {read(browser, '#tab-content')}")
    assert all("completed" in r or "finished" in r for r in read(browser, "#checkpoint-subtasks tbody tr"))
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    browser.save_screenshot(str(tmp_path / "ui-checkpoints-finished.png"))
    assert console_errors(browser) == []


GRAPH_GEOMETRY = """
const boxes = [...document.querySelectorAll('#job-graph g.vertex')].map(g => {
  const r = g.querySelector('rect').getBBox(); return {id: g.dataset.vertexId, x: r.x, y: r.y, w: r.width, h: r.height};
});
const edges = [...document.querySelectorAll('#job-graph g.edge-group')];
const samples = edges.map(e => {
  const p = e.querySelector('path.edge'), n = p.getTotalLength(), pts = [];
  for (let i = 0; i <= 200; i++) { const q = p.getPointAtLength(n * i / 200); pts.push([q.x, q.y]); }
  return pts;
});
const near = (pts, x, y) => Math.min(...pts.map(([a, b]) => Math.hypot(a - x, b - y)));
return edges.map((e, k) => {
  const t = e.querySelector('text.edge-label').getBBox();
  const cx = t.x + t.width / 2, cy = t.y + t.height / 2;
  const through = boxes.filter(b => b.id !== e.dataset.from && b.id !== e.dataset.to && samples[k].some(
    ([x, y]) => x > b.x + 2 && x < b.x + b.w - 2 && y > b.y + 2 && y < b.y + b.h - 2)).map(b => b.id);
  return {from: e.dataset.from, to: e.dataset.to, strategy: e.dataset.strategy,
          label: e.querySelector('text.edge-label').textContent, own: near(samples[k], cx, cy),
          nearestOther: Math.min(Infinity, ...samples.filter((_, j) => j !== k).map(s => near(s, cx, cy))), through};
});
"""


def test_a_six_vertex_graphs_edges_say_their_strategy_beside_them_and_run_around_boxes(
        cluster: Any, browser: webdriver.Chrome, tmp_path: Path) -> None:  # noqa: F811
    """Issue 55: a BROADCAST edge read "HASH" (its label sat nearer another edge) and an edge
    that skips a column ran under the boxes in between. Each label now sits on its own edge, and
    no edge crosses a box it does not join."""
    from yarnflow.common.api.co_functions import KeyedBroadcastProcessFunction
    from yarnflow.common.api.state import MapStateDescriptor

    class Enrich(KeyedBroadcastProcessFunction):  # type: ignore[misc]
        def process_element(self, row: Any, ctx: Any, out: Any) -> None:
            out.collect(row)

        def process_broadcast_element(self, row: Any, ctx: Any, out: Any) -> None:
            pass

    def six(env: Any) -> None:
        def rows(start: int, n: int) -> dict[str, list[int]]:
            return {"k": [i % 7 for i in range(start, start + n)], "v": list(range(start, start + n))}

        events = env.from_generator(rows, count=None, rate_per_s=500, name="events")
        rules = env.from_generator(rows, count=None, rate_per_s=10, name="rules").set_parallelism(1)
        enriched = events.key_by("k").connect(rules.broadcast(MapStateDescriptor("rules"))).process(Enrich())
        scored = enriched.rebalance().map(lambda r: r, name="score")
        (scored.union(events.rebalance().map(lambda r: r, name="raw").set_parallelism(1)).key_by("k").sum("v")
            .rebalance().map(lambda r: r, name="format").sink_to_parquet(str(tmp_path / "out")))

    web = cluster.web
    job_id = submit(cluster, six, "six vertices")
    try:
        plan = get(f"{web}/jobs/{job_id}/plan")["plan"]["nodes"]
        assert len(plan) >= 6, [n["description"] for n in plan]
        wanted = {(i["id"], n["id"]): i["ship_strategy"] for n in plan for i in n["inputs"]}
        assert "BROADCAST" in wanted.values() and "HASH" in wanted.values()
        browser.get(f"{web}/#/jobs/{job_id}")
        wait_until(lambda: len(read(browser, "#job-graph g.edge-group")) == len(wanted), 30, "no graph")
        edges = browser.execute_script(GRAPH_GEOMETRY)
        assert {(e["from"], e["to"]): e["label"] for e in edges} == wanted
        for e in edges:
            assert e["own"] <= 8 and e["own"] < e["nearestOther"], e  # the label is on its own edge
            assert e["through"] == [], e  # and the edge crosses no box it does not join
        browser.save_screenshot(str(tmp_path / "ui-six-vertices.png"))
        assert get(f"{web}/jobs/{job_id}")["state"] == "RUNNING"
        assert console_errors(browser) == []
    finally:
        requests.patch(f"{web}/jobs/{job_id}?mode=cancel", timeout=10)


def test_running_and_completed_jobs_are_listed_apart_searchable_sortable_and_reachable_by_keyboard(
        cluster: Any, browser: webdriver.Chrome, tmp_path: Path) -> None:  # noqa: F811
    """Issue 55: one list of every job; rows a mouse could click and nothing else could reach."""
    from selenium.webdriver.common.keys import Keys

    web = cluster.web
    ended = []
    for name in ("beta ended", "alpha ended"):
        def bounded(env: Any, out: str = str(tmp_path / name.replace(" ", "-"))) -> None:
            env.from_collection({"v": [1, 2, 3]}).sink_to_parquet(out)
        ended.append(submit(cluster, bounded, name))
    running = submit(cluster, generator_job(str(tmp_path / "out")), "gamma running")
    try:
        wait_until(lambda: all(get(f"{web}/jobs/{j}")["state"] == "FINISHED" for j in ended), 60,
                   "a job did not finish")
        browser.get(f"{web}/#/jobs")
        wait_until(lambda: len(read(browser, "#completed-jobs tbody tr")) == 2 and read(
            browser, "#running-jobs tbody tr"), 30, lambda: f"the lists: {read(browser, '#view')}")
        assert [r.split()[0] for r in read(browser, "#running-jobs tbody tr")] == ["gamma"]
        # sorted by name, then the other way
        # (the default order, newest first, is alpha then beta: each step waits for its header first)
        click(browser, "#completed-jobs button[data-sort=name]")
        wait_until(lambda: read(browser, "#completed-jobs th[aria-sort=ascending]") == ["Name ▲"], 10,
                   lambda: f"not sorted by name: {read(browser, '#completed-jobs thead')}")
        assert read(browser, "#completed-jobs a.job-link") == ["alpha ended", "beta ended"]
        click(browser, "#completed-jobs button[data-sort=name]")
        wait_until(lambda: read(browser, "#completed-jobs th[aria-sort=descending]") == ["Name ▼"], 10,
                   "not sorted the other way")
        assert read(browser, "#completed-jobs a.job-link") == ["beta ended", "alpha ended"]
        # searched: the lists keep what matches (and the search outlives a refresh)
        wait_for(browser, "#job-search")[0].send_keys("alpha")
        wait_until(lambda: read(browser, "#completed-jobs a.job-link") == ["alpha ended"], 10, "not searched")
        assert read(browser, "#running-jobs-none") == ["No running job matches."]
        time.sleep(2.5)
        assert read(browser, "#completed-jobs a.job-link") == ["alpha ended"]
        assert read(browser, "#job-search", "value") == ["alpha"]
        # the keyboard reaches a job: Tab from the search box onto its link, Enter opens it
        browser.find_element(By.CSS_SELECTOR, "#job-search").send_keys(Keys.TAB)
        for _ in range(12):
            if browser.execute_script("return document.activeElement.classList.contains('job-link')"):
                break
            browser.switch_to.active_element.send_keys(Keys.TAB)
        assert browser.execute_script("return document.activeElement.textContent") == "alpha ended"
        assert browser.execute_script("return document.activeElement.getAttribute('href')") == f"#/jobs/{ended[1]}"
        browser.switch_to.active_element.send_keys(Keys.ENTER)
        wait_until(lambda: browser.current_url.endswith(f"#/jobs/{ended[1]}"), 10, "Enter did not open the job")
        wait_for(browser, "#job-graph g.vertex")
        assert console_errors(browser) == []
    finally:
        requests.patch(f"{web}/jobs/{running}?mode=cancel", timeout=10)


def test_savepoint_rescale_and_stop_from_the_job_page_and_the_checkpoint_overview(
        cluster: Any, browser: webdriver.Chrome, tmp_path: Path) -> None:  # noqa: F811
    """Issue 55: the REST API could take a savepoint, rescale and stop with a savepoint; the UI
    could not, and the checkpoints tab had no overview of the latest ones or their spread."""
    from selenium.webdriver.support.ui import WebDriverWait as Wait

    web = cluster.web
    job_id = submit(cluster, generator_job(str(tmp_path / "out")), "operated",
                    {"execution.checkpointing.interval": "300 ms"})
    wait_flowing(web, job_id)
    browser.get(f"{web}/#/jobs/{job_id}/checkpoints")
    wait_for(browser, "#checkpoint-latest")
    wait_until(lambda: read(browser, "#checkpoint-summary"), 20, "no summary of the completed checkpoints")
    latest = read(browser, "#checkpoint-latest tbody tr")
    assert latest[0].startswith("Completed") and "ms" in latest[0] and "none" in latest[1]  # no savepoint yet
    assert read(browser, "#checkpoint-summary tbody th") == ["End to end duration", "State size", "Alignment",
                                                             "Start delay", "In-flight data"]

    def answer(text: str | None, accept: bool = True) -> None:
        alert = Wait(browser, 10).until(lambda d: d.switch_to.alert)
        if text is not None:
            alert.send_keys(text)
        alert.accept() if accept else alert.dismiss()

    # a savepoint into a folder given
    click(browser, "#savepoint-job")
    answer(str(tmp_path / "savepoints"))
    wait_until(lambda: read(browser, "#savepoint-location"), 60,
               lambda: f"no savepoint: {read(browser, '#job-action-result')}")
    location = read(browser, "#savepoint-location code")[0]
    assert location.startswith(f"file://{tmp_path / 'savepoints'}/savepoint-")
    assert (Path(location.removeprefix("file://")) / "_metadata").is_file()
    wait_until(lambda: location in read(browser, "#checkpoint-latest tbody tr")[1], 20, "not the latest savepoint")
    # a wrong parallelism is said, not sent; then a rescale to 1
    click(browser, "#rescale-job")
    answer("two")
    wait_until(lambda: "is not a parallelism" in read(browser, "#job-action-result")[0], 10, "no error shown")
    # a rescale the job's state refuses says why (a generator's position is per slice of its input)
    click(browser, "#rescale-job")
    answer("1")
    wait_until(lambda: "the rescale failed" in read(browser, "#job-action-result")[0], 120,
               lambda: f"no failure shown: {read(browser, '#job-action-result')}")
    assert "keep the parallelism at 2" in read(browser, "#job-action-result")[0]
    wait_until(lambda: get(f"{web}/jobs/{job_id}")["state"] == "RUNNING", 60, "the job did not run on")
    click(browser, "#rescale-job")  # (to the parallelism it has: restarted from a savepoint, it runs on)
    answer("2")
    wait_until(lambda: "Rescaled to parallelism 2" in read(browser, "#job-action-result")[0], 120,
               lambda: f"not rescaled: {read(browser, '#job-action-result')}")
    wait_until(lambda: get(f"{web}/jobs/{job_id}")["state"] == "RUNNING", 60, "the job did not run on")
    # stop with a savepoint: asked twice (folder, then are you sure); the job ends with it
    click(browser, "#stop-job")
    answer(str(tmp_path / "final"))
    answer(None)
    wait_until(lambda: read(browser, "#savepoint-location") and "the job stopped" in read(
        browser, "#savepoint-location")[0], 120, lambda: f"not stopped: {read(browser, '#job-action-result')}")
    wait_until(lambda: get(f"{web}/jobs/{job_id}")["state"] == "FINISHED", 30, "the job did not stop")
    assert not read(browser, "#stop-job")
    click(browser, "#tab-checkpoints")  # the final savepoint stays (the user's), the job's checkpoints go
    wait_until(lambda: len(read(browser, "#checkpoint-latest tbody tr")) == 4 and "final" in read(
        browser, "#checkpoint-latest tbody tr")[1], 20, "the final savepoint is not the latest")
    latest = read(browser, "#checkpoint-latest tbody tr")
    assert "(discarded)" in latest[0] and "(discarded)" not in latest[1], latest
    maximum = int(read(browser, "#checkpoint-summary tbody tr td:last-child")[0].split()[0])
    assert maximum < 60_000, maximum  # (a recovered checkpoint's duration read as the time since 1970)
    browser.save_screenshot(str(tmp_path / "ui-operated.png"))
    assert console_errors(browser) == []


def test_the_appmaster_page_and_the_log_viewer(cluster: Any, browser: webdriver.Chrome,  # noqa: F811
                                               tmp_path: Path) -> None:
    """Issue 55: the AppMaster had no page (its logs, configuration, metrics and threads were REST
    paths only), and a TaskExecutor's log opened as raw text in a new tab."""
    web = cluster.web
    browser.get(f"{web}/#/overview")
    click(browser, 'nav a[data-nav="appmaster"]')
    wait_for(browser, "#am-logs a")
    click(browser, "#am-logs a")  # its log, in the viewer
    wait_until(lambda: "AppMaster" in " ".join(read(browser, "#log-view")), 20, "no log shown")
    assert "serving on" in read(browser, "#log-view")[0]
    wait_for(browser, "#log-filter")[0].send_keys("Prometheus")
    wait_until(lambda: read(browser, "#log-view") and all(
        "Prometheus" in line for line in read(browser, "#log-view")[0].splitlines() if line), 10, "not filtered")
    assert read(browser, "#log-view")[0].strip() and "matching" in read(browser, "#view p.muted")[0]
    time.sleep(2.5)  # the filter outlives a refresh
    assert read(browser, "#log-filter", "value") == ["Prometheus"]
    browser.get(f"{web}/#/appmaster/metrics")
    wait_for(browser, "#am-metrics tbody tr")
    metrics = dict(r.split(maxsplit=1) for r in read(browser, "#am-metrics tbody tr", "innerText"))
    assert float(metrics["numRegisteredTaskManagers"]) == 2.0
    browser.get(f"{web}/#/appmaster/configuration")
    wait_for(browser, "#am-config tbody tr")
    assert any(r.startswith("rest.port") for r in read(browser, "#am-config tbody tr"))
    browser.get(f"{web}/#/appmaster/thread-dump")
    wait_for(browser, "#am-threads tbody tr")
    assert any(r.startswith("rest-server") for r in read(browser, "#am-threads tbody tr"))
    # a TaskExecutor's log in the same viewer
    tm = get(f"{web}/taskmanagers")["taskmanagers"][0]["id"]
    browser.get(f"{web}/#/taskmanagers/{tm}")
    click(browser, "#tm-logs a")
    wait_until(lambda: f"TaskExecutor {tm} started" in " ".join(read(browser, "#log-view")), 20,
               lambda: f"no TaskExecutor log: {read(browser, '#view')}")
    assert browser.current_url.endswith(f"#/logs/taskmanager/{tm}/{tm}.log") or "#/logs/taskmanager/" in browser.current_url
    browser.save_screenshot(str(tmp_path / "ui-log-viewer.png"))
    # a long log: its end is fetched (an HTTP range), all of it on request; warnings are marked
    log_file = Path(cluster.work_dir) / "log" / f"{tm}.log"
    with log_file.open("a") as f:
        for i in range(40_000):
            f.write(f"2026-12-05 00:00:00,000 INFO filler yarnflow.test: line {i} {'x' * 60}\n")
        f.write("2026-12-05 00:00:01,000 WARNING main yarnflow.test: the last warning\n")
    browser.refresh()
    wait_until(lambda: "its end" in " ".join(read(browser, "#view p.muted")), 20,
               lambda: f"not the log's end: {read(browser, '#view p.muted')}")
    assert read(browser, "#log-view .log-warning")[-1].endswith("the last warning")
    assert "line 0 " not in read(browser, "#log-view")[0]
    click(browser, "#log-all")
    wait_until(lambda: "line 0 " in read(browser, "#log-view")[0], 30, "Show all did not show the whole log")
    assert console_errors(browser) == []


def test_a_vertex_opens_its_panel_with_subtasks_places_and_charts(cluster: Any, browser: webdriver.Chrome,  # noqa: F811
                                                                  tmp_path: Path) -> None:
    """Issue 55: a click on a vertex did nothing; Flink's opens its subtasks, TaskExecutors,
    watermarks, back-pressure, accumulators and metric charts."""
    web = cluster.web
    job_id = submit(cluster, slow_map_job(str(tmp_path / "out")), "panelled")
    try:
        details = wait_flowing(web, job_id)
        browser.get(f"{web}/#/jobs/{job_id}")
        wait_for(browser, "#job-graph g.vertex")
        source = details["vertices"][0]
        browser.find_elements(By.CSS_SELECTOR, "#job-graph a.vertex-link")[0].click()
        wait_until(lambda: browser.current_url.endswith(f"/vertex/{source['id']}"), 10, "no panel opened")
        wait_for(browser, "#vertex-subtasks tbody tr")
        assert read(browser, "#vertex-name") == [source["name"]]
        rows = read(browser, "#vertex-subtasks tbody tr")
        assert len(rows) == 2 and all("RUNNING" in r for r in rows)
        places = {s["taskmanager-id"] for s in get(f"{web}/jobs/{job_id}/vertices/{source['id']}")["subtasks"]}
        assert set(read(browser, "#vertex-subtasks tbody td:nth-child(4) a")) == places
        assert set(read(browser, "#vertex-taskmanagers tbody td:first-child a")) == places
        # the source waits behind the slow map: its back-pressure shows, and its chart fills in
        wait_until(lambda: all("high" in r for r in read(browser, "#vertex-subtasks tbody tr")), 30,
                   lambda: f"no back-pressure shown: {read(browser, '#vertex-subtasks tbody tr')}")
        wait_until(lambda: len([p for p in read(browser, "#vertex-charts path", "outerHTML") if " L" in p]) == 3, 20,
                   "the charts did not fill in")
        assert [c.split(":")[0] for c in read(browser, "#vertex-charts figcaption")] == [
            "Records in", "Records out", "Back-pressured"]
        # the keyboard reaches a vertex too
        assert browser.execute_script("const a = document.querySelector('#job-graph a.vertex-link'); a.focus();"
                                      "return document.activeElement === a")
        browser.save_screenshot(str(tmp_path / "ui-vertex-panel.png"))
        assert console_errors(browser) == []
    finally:
        requests.patch(f"{web}/jobs/{job_id}?mode=cancel", timeout=10)
