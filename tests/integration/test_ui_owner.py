"""`probe ui` is its owner's alone (probe_cli/ui/server.py): another uid gets 403 on every route,
even with the secret; the owner's browser gets the page once the secret in the URL has become its
cookie; a cross-site request runs nothing.

The dashboard is a real `probe ui` process over a real agent; the stranger is a real process of
uid 65534 (tests/foreign.py). Before, uid 65534 read every table through the owner's dashboard,
and ``GET /api/query.csv`` ran SQL for a cross-site request.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from tests.foreign import FOREIGN_UID, http_request, need_root, run_as
from tests.support import python_env, wait_until

pytest.importorskip("duckdb")
SQL = "SELECT 'the owner''s rows' AS secret"


@pytest.fixture
def dashboard(make_agent) -> Iterator[str]:
    """The URL a real `probe ui --port 0` prints for a real agent."""
    agent = make_agent()
    proc = subprocess.Popen(
        [sys.executable, "-m", "probe_cli", "-t", agent.url.removeprefix("http://"),
         "--timeout", "5", "ui", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=python_env())
    try:
        line = proc.stdout.readline()
        m = re.search(r"dashboard at (\S+)", line)
        assert m, line + (proc.stderr.read() if proc.poll() is not None else "")
        yield m.group(1)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
            proc.stdout.close()
            proc.stderr.close()


def page_key(html: str) -> str:
    """The key the dashboard's page sends in X-Probe-UI-Key (a <meta> of the page)."""
    m = re.search(r'name="probe-ui-key" content="([^"]+)"', html)
    assert m, html[:300]
    return m.group(1)


def _routes(secret: str) -> list[tuple[str, str, object, dict]]:
    cookie = {"Cookie": "probe_ui_0=x"}
    return [
        ("GET", "/", None, {}),
        ("GET", f"/?token={secret}", None, {}),
        ("GET", "/static/app.js", None, {}),
        ("GET", "/api/snapshot", None, {}),
        ("GET", f"/api/query.csv?sql={SQL}", None, {}),
        ("POST", "/api/query", {"sql": SQL}, {}),
        ("GET", "/api/snapshot", None, cookie),
    ]


def _sweep(host: str, port: int, routes: list) -> list:
    out = []
    for method, path, body, headers in routes:
        status, reply = http_request(host, port, method, path.replace(" ", "%20"), body,
                                     {"Host": f"{host}:{port}", **headers})
        out.append([method, path, status, str(reply)[:200]])
    return out


def test_another_uid_is_refused_on_every_route_even_with_the_secret(dashboard):
    need_root()
    parts = urlsplit(dashboard)
    secret = parts.query.removeprefix("token=")
    # WHEN uid 65534 tries every route, the secret-bearing URL included
    seen = run_as(FOREIGN_UID, _sweep, parts.hostname, parts.port, _routes(secret))
    # THEN every one is refused, and none of the owner's data comes back
    for method, path, status, reply in seen:
        assert status == 403, (method, path, status, reply)
        assert f"uid {FOREIGN_UID} is not this dashboard's owner" in reply
        assert "the owner's rows" not in reply


def test_the_owner_gets_the_page_with_the_secret_and_nothing_without(dashboard):
    parts = urlsplit(dashboard)
    base = f"http://{parts.netloc}/"
    with httpx.Client(timeout=15) as owner:
        # GIVEN no cookie yet: data routes are refused, the SQL console too
        assert owner.get(base + "api/snapshot").status_code == 403
        assert owner.post(base + "api/query", json={"sql": SQL}).status_code == 403
        assert owner.get(base + "?token=wrong").status_code == 403
        # WHEN the owner opens the URL probe ui printed
        first = owner.get(dashboard)
        # THEN the secret becomes a SameSite=Strict HttpOnly cookie and the page follows
        assert first.status_code == 303 and first.headers["location"] == "/"
        cookie = first.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        page = owner.get(base)
        assert page.status_code == 200 and "<html" in page.text.lower()
        # AND the page carries the key its JS sends on every data request
        key = {"X-Probe-UI-Key": page_key(page.text)}
        assert owner.get(base + "api/snapshot", headers=key).status_code == 200
        rows = owner.post(base + "api/query", json={"sql": SQL}, headers=key).json()
        assert "the owner's rows" in str(rows["rows"])
        # AND a cross-site request runs nothing, whatever the browser sends with it
        for headers in ({"Sec-Fetch-Site": "cross-site", **key},
                        {"Origin": "http://evil.example", **key}):
            csv = owner.get(base + "api/query.csv", params={"sql": SQL}, headers=headers)
            assert csv.status_code == 403 and "the owner's rows" not in csv.text
            post = owner.post(base + "api/query", json={"sql": SQL}, headers=headers)
            assert post.status_code == 403 and "the owner's rows" not in post.text
    # AND a cross-site GET of the CSV without the cookie (what a browser sends) runs nothing
    csv = httpx.get(base + "api/query.csv", params={"sql": SQL}, timeout=15)
    assert csv.status_code == 403 and "the owner's rows" not in csv.text


def test_a_same_site_page_cannot_ride_the_cookie(dashboard):
    """Another port of 127.0.0.1 is the same site: a page any uid serves there makes the owner's
    browser send the SameSite=Strict cookie with a GET (an <img>, a no-cors fetch, a link) or a
    form. Before, that ran the page's SQL (``Sec-Fetch-Site: same-site``, no Origin, as Chromium
    sends for an <img>) and the CSV of the owner's rows came back 200."""
    parts = urlsplit(dashboard)
    base = f"http://{parts.netloc}/"
    with httpx.Client(timeout=15) as browser:
        browser.get(dashboard)  # the owner opened the dashboard: the browser holds the cookie
        # WHEN a same-site page makes that browser ask for data, cookie and all
        for method, headers in (("GET", {"Sec-Fetch-Site": "same-site",
                                         "Sec-Fetch-Dest": "image"}),
                                ("POST", {"Sec-Fetch-Site": "same-site",
                                          "Origin": "http://127.0.0.1:1"})):
            if method == "GET":
                r = browser.get(base + "api/query.csv", params={"sql": SQL}, headers=headers)
            else:
                r = browser.post(base + "api/query", json={"sql": SQL}, headers=headers)
            # THEN nothing runs: the page's key header is missing
            assert r.status_code == 403, (method, r.status_code, r.text[:200])
            assert "the owner's rows" not in r.text
        assert "X-Probe-UI-Key" in browser.get(base + "api/snapshot").text


def test_open_puts_only_a_one_time_link_on_the_browsers_command_line(make_agent, tmp_path):
    """Before, ``probe ui --open`` ran the browser with the secret URL as its argument, which
    every uid reads in ``ps``. The browser here is a script that records its command line
    (``$BROWSER``, which Python's webbrowser honours)."""
    agent = make_agent()
    seen = tmp_path / "argv"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$@" > {seen}.tmp && mv {seen}.tmp {seen}\n')
    browser.chmod(0o700)
    proc = subprocess.Popen(
        [sys.executable, "-m", "probe_cli", "-t", agent.url.removeprefix("http://"),
         "--timeout", "5", "ui", "--port", "0", "--open"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**python_env(), "BROWSER": f"{browser} %s", "DISPLAY": ""})
    try:
        printed = re.search(r"dashboard at (\S+)", proc.stdout.readline()).group(1)
        wait_until(seen.exists, 20, "the browser was never started")
        argv = seen.read_text().strip()
        secret = urlsplit(printed).query.removeprefix("token=")
        # THEN the browser's command line has a one-time link, not the secret
        assert secret not in argv and "?once=" in argv, argv
        # AND that link opens the dashboard once, and is useless afterwards
        first = httpx.get(argv, timeout=15)
        assert first.status_code == 303 and "HttpOnly" in first.headers["set-cookie"]
        again = httpx.get(argv, timeout=15)
        assert again.status_code == 403 and "used already" in again.text
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        finally:  # a CLI that outlived its Ctrl-C must not outlive the test, nor its pipes
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
            proc.stdout.close()
            proc.stderr.close()
