"""The REST API and web UI of a cluster with its credentials (issue 31: ``rest.authentication``,
``security.ssl.rest.enabled``), on a real local cluster: without the cluster's token every
endpoint answers 401 JSON (a browser opening the UI is sent to the login page), with it (bearer,
HTTP basic, or the login page's cookie) they work; over HTTPS too; and the web UI in headless
Chromium signs in with the token and shows the cluster."""

from __future__ import annotations

import http.client
import json
import ssl
from pathlib import Path
from typing import Any

import pytest
import requests
from selenium.webdriver.common.by import By

from tests.e2e.test_web_ui import browser, console_errors, wait_for  # noqa: F401 - the fixture
from yarnflow.common.security import rest_token

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TLS = {"security__ssl__internal__enabled": "true", "rest__port": "0"}


@pytest.fixture
def secured(local_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("YARNFLOW_HOME", str(tmp_path / "yarnflow-home"))
    return local_cluster(taskexecutors=1, slots=1, **TLS)


def test_without_the_token_every_endpoint_answers_401_and_with_it_they_work(secured: Any) -> None:
    web, token = secured.web_url(), rest_token(secured.tls)
    assert web.startswith("http://")
    for path in ("/overview", "/jobs/overview", "/v1/taskmanagers", "/config", "/openapi.json"):
        r = requests.get(web + path, timeout=10)
        assert r.status_code == 401 and "authentication required" in r.json()["errors"][0], path
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert requests.patch(web + "/taskmanagers?count=3", timeout=10).status_code == 401
    assert requests.post(web + "/artifacts", data=b"x" * 100, timeout=10).status_code == 401
    wrong = requests.get(web + "/overview", headers={"Authorization": "Bearer not-it"}, timeout=10)
    assert wrong.status_code == 401
    opened = requests.get(web + "/", allow_redirects=False, timeout=10)
    assert opened.status_code == 302 and opened.headers["Location"] in ("login", web + "/login")  # (relative)
    assert requests.get(web + "/login", timeout=10).status_code == 200
    assert requests.get(web + "/web/app.js", timeout=10).status_code == 200  # the UI's code: no data

    bearer = requests.get(web + "/overview", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert bearer.status_code == 200 and bearer.json()["taskmanagers"] == 1
    assert requests.get(web + "/overview", auth=("yarnflow", token), timeout=10).status_code == 200
    with requests.Session() as s:  # the login page's cookie
        assert s.post(web + "/login", data={"token": "wrong"}, timeout=10).status_code == 401
        signed = s.post(web + "/login", data={"token": token}, allow_redirects=False, timeout=10)
        assert signed.status_code == 302 and "HttpOnly" in signed.headers["Set-Cookie"]
        assert s.get(web + "/jobs/overview", timeout=10).status_code == 200


def test_https_serves_the_api_with_the_clusters_certificate(local_cluster: Any, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YARNFLOW_HOME", str(tmp_path / "yarnflow-home"))
    cluster = local_cluster(taskexecutors=1, slots=1, security__ssl__rest__enabled="true", **TLS)
    web = cluster.web_url()
    assert web.startswith("https://")
    with pytest.raises(requests.exceptions.SSLError):  # not a certificate anyone trusts but the cluster
        requests.get(web + "/overview", timeout=10)
    with pytest.raises(requests.exceptions.ConnectionError):  # plain HTTP on the HTTPS port
        requests.get(web.replace("https://", "http://") + "/overview", timeout=10)
    # a client that trusts the cluster's certificate (it names no host: CN skein-internal)
    ctx = ssl.create_default_context(cadata=cluster.tls.cert_pem.decode())
    ctx.check_hostname = False
    host, port = web.removeprefix("https://").rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=10)
    conn.request("GET", "/overview", headers={"Authorization": f"Bearer {rest_token(cluster.tls)}"})
    answer = conn.getresponse()
    assert answer.status == 200 and json.loads(answer.read())["taskmanagers"] == 1
    conn.close()


def test_the_web_ui_signs_in_with_the_token_in_chromium(secured: Any, browser: Any,  # noqa: F811
                                                         tmp_path: Path) -> None:
    web = secured.web_url()
    browser.get(web + "/#/overview")
    wait_for(browser, "input#token")  # sent to the login page
    assert "/login" in browser.current_url
    browser.find_element(By.CSS_SELECTOR, "input#token").send_keys("wrong")
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(browser, "p.error")
    browser.find_element(By.CSS_SELECTOR, "input#token").send_keys(rest_token(secured.tls))
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(browser, "#view table, #view .cards, #view h2")
    assert "/login" not in browser.current_url
    browser.save_screenshot(str(tmp_path / "ui-signed-in.png"))
    errors = [e for e in console_errors(browser) if "401" not in e]  # the wrong token's page answered 401
    assert errors == []


@pytest.mark.parametrize("authentication", ["auto", "none"])
def test_session_token_prints_what_a_script_on_this_machine_needs(cli: Any, authentication: str) -> None:
    """`yarnflow session token` (issue 50): a closed session's token, which the REST API takes;
    for a session open to Flink's tools, one line saying it needs none (and the session's start
    says it is open, with the warning)."""
    import re

    session = cli.start("session", "start", "--taskexecutors", "1", "-D", f"rest.authentication={authentication}")
    lines = [session.stdout.readline() for _ in range(4)]  # type: ignore[union-attr]
    address = re.search(r"running at (\S+:\d+)", lines[0]).group(1)  # type: ignore[union-attr]
    web = re.search(r"web UI:\s+(\S+)", lines[1]).group(1)  # type: ignore[union-attr]
    printed = cli.run("session", "token", "--address", address)
    if authentication == "auto":
        assert printed.returncode == 0, printed.stderr
        token = printed.stdout.strip()
        assert f"token {token} " in lines[3]
        assert requests.get(web + "/overview", timeout=10).status_code == 401
        assert requests.get(web + "/overview", auth=("yarnflow", token), timeout=10).json()["taskmanagers"] == 1
    else:
        assert "REST:    open, no token (rest.authentication: none): anyone who can reach" in lines[3]
        assert printed.returncode == 1
        assert printed.stderr.strip() == f"error: the REST API at {web} is open (rest.authentication: none): " \
                                         "it takes no token"
        assert requests.get(web + "/overview", timeout=10).json()["taskmanagers"] == 1
    cli.run("session", "stop", "--address", address, check=True)


def test_the_metrics_endpoints_ask_for_the_token_too(local_cluster: Any, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The AppMaster's and every TaskExecutor's Prometheus endpoint answered anyone (issue 55):
    with the cluster's credentials a scrape carries its token, as a REST call does."""
    from prometheus_client.parser import text_string_to_metric_families

    from yarnflow.common.metrics import free_port_range

    monkeypatch.setenv("YARNFLOW_HOME", str(tmp_path / "yarnflow-home"))
    low, high = free_port_range(4, 31000)
    cluster = local_cluster(taskexecutors=2, slots=1, metrics__reporter__prom__port=f"{low}-{high}", **TLS)
    token = rest_token(cluster.tls)
    headers = {"Authorization": f"Bearer {token}"}
    tms = requests.get(cluster.web_url() + "/taskmanagers", headers=headers, timeout=10).json()["taskmanagers"]
    addresses = [t["metricsAddress"] for t in tms]
    assert len(addresses) == 2
    for address in [*addresses, f"127.0.0.1:{low}"]:  # the TaskExecutors', and the AppMaster's (first port)
        url = f"http://{address}/metrics"
        refused = requests.get(url, timeout=10)
        assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Basic"), address
        assert requests.get(url, headers={"Authorization": "Bearer not-it"}, timeout=10).status_code == 401
        assert requests.get(url, auth=("prometheus", "not-it"), timeout=10).status_code == 401
        for ok in (requests.get(url, headers=headers, timeout=10), requests.get(url, auth=("prometheus", token),
                                                                                  timeout=10)):
            assert ok.status_code == 200, address
            names = {f.name for f in text_string_to_metric_families(ok.text)}
            assert any(n.startswith("yarnflow_") for n in names), names


def test_a_deep_link_survives_the_login_page_and_the_login_page_is_accessible(secured: Any, browser: Any,  # noqa: F811
                                                                              tmp_path: Path) -> None:
    """A link to a job's tab, opened without the token, landed on the overview after signing in
    (issue 55): it now opens the page it named. The login page passes axe-core too."""
    from tests.e2e.test_accessibility import AXE, violations

    web = secured.web_url()
    browser.get(web + "/#/taskmanagers")
    wait_for(browser, "input#token")
    assert "/login" in browser.current_url and browser.current_url.endswith("#/taskmanagers")
    assert AXE.is_file(), f"{AXE} is missing: run .ci/install-test-deps"
    assert violations(browser) == []
    browser.find_element(By.CSS_SELECTOR, "input#token").send_keys("wrong")  # a wrong token first
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(browser, "p.error")
    browser.find_element(By.CSS_SELECTOR, "input#token").send_keys(rest_token(secured.tls))
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(browser, "#taskmanagers-table tbody tr")  # the page the link named
    assert browser.current_url.endswith("#/taskmanagers") and "/login" not in browser.current_url
    # a "next" that is not one of the UI's views is not followed
    token = rest_token(secured.tls)
    for bad in ("https://elsewhere.example/", "//elsewhere.example/", "#/x\nSet-Cookie: a=b"):
        r = requests.post(web + "/login", data={"token": token, "next": bad}, allow_redirects=False, timeout=10)
        assert r.status_code == 302 and r.headers["Location"] in ("./", web + "/"), (bad, r.headers["Location"])

