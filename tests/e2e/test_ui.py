"""`probe ui` (issue 15) in a real browser (Debian's chromium driven by Playwright) against
live 2-rank torchrun jobs: tiles with advancing steps, the SQL console, and a hang banner that
names the culprit. Screenshots are kept under the test's tmp dir (and /tmp/probe-ui-hang.png)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.attackers import serve_page
from tests.e2e.test_cluster import torchrun_job
from tests.e2e.training import probe
from tests.foreign import FOREIGN_UID, need_root, run_as
from tests.support import wait_until
from tests.unit.cli_server import closed_port

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _need_browser() -> object:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (docker/setup.sh installs Debian's chromium)")
    return pytest.importorskip("playwright.sync_api", reason="playwright (test extra) missing")


@contextmanager
def dashboard(agent_url: str) -> Iterator[str]:
    """`probe -t ADDR ui --port 0` as an operator runs it; yields the URL it prints."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "probe_cli", "-t", agent_url.removeprefix("http://"),
         "--timeout", "5", "ui", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"dashboard at (http://127\.0\.0\.1:\d+/\?token=\S+)", line)
        assert m, line + proc.stderr.read() if proc.poll() is not None else line
        yield m.group(1)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            # Ctrl-C ends it at once, even with a browser connection and a doctor round open
            assert proc.wait(15) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
            proc.stdout.close()  # else a ResourceWarning fails a later test
            proc.stderr.close()


#: Records every text the banner area shows, from the page's first paint on.
RECORD_BANNERS = """
window.__banners = [];
new MutationObserver(() => {
  const b = document.getElementById("banners");
  const t = b ? b.innerText : null;
  if (t !== null && window.__banners[window.__banners.length - 1] !== t) window.__banners.push(t);
}).observe(document, {subtree: true, childList: true, characterData: true});
"""


#: Records every Content-Security-Policy violation the page causes (the server's policy stays
#: on in these tests: with it off, the stacked bars' blocked inline styles went unseen).
RECORD_CSP = """
window.__csp = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__csp.push(e.violatedDirective + " " + (e.blockedURI || e.sample || "")));
"""


def wait_js(page: object, expr: str, timeout_s: float) -> object:
    """Poll a JS expression from here (``page.evaluate``, which the page's CSP does not
    govern; ``wait_for_function`` compiles its string in the page, which the CSP refuses)."""
    return wait_until(lambda: page.evaluate(expr), timeout_s, f"never true: {expr}")


@contextmanager
def page_at(url: str, tmp: Path, init_script: str | None = None) -> Iterator[object]:
    sync_api = _need_browser()
    with sync_api.sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp / "chromium-profile"), executable_path=CHROMIUM, headless=True, args=ARGS,
            viewport={"width": 1400, "height": 1300})  # the page's own CSP applies
        try:
            ctx.add_init_script(RECORD_CSP)
            if init_script:
                ctx.add_init_script(init_script)
            page = ctx.new_page()
            page.goto(url)
            yield page
        finally:
            ctx.close()


def _step(page: object, rank: int) -> int:
    text = page.locator(f'.tile[data-rank="{rank}"] .step').inner_text()
    return int(text) if text.isdigit() else -1


@pytest.mark.timeout(150)
def test_tiles_advance_and_sql_console_returns_rows(tmp_path):
    _need_browser()
    with torchrun_job(tmp_path, "toy_train.py", 2, "--step-sleep", "0.05",
                      env={"PROBE_TRACE": "on"}) as (_, infos), \
            dashboard(infos[0]["url"]) as url, page_at(url, tmp_path) as page:
        # GIVEN the page of a healthy 2-rank job: both tiles show a step
        wait_js(page, "document.querySelectorAll('.tile[data-rank] .step').length === 2 && "
            "[...document.querySelectorAll('.tile[data-rank] .step')]"
            ".every(e => /^[0-9]+$/.test(e.textContent))", 30)
        first = [_step(page, r) for r in (0, 1)]
        # WHEN the job trains on, THEN both tiles' steps advance (the page refreshes itself)
        wait_js(page,
                f"+document.querySelector('.tile[data-rank=\"0\"] .step').textContent > "
                f"{first[0]} && +document.querySelector('.tile[data-rank=\"1\"] .step')"
                f".textContent > {first[1]}", 20)
        assert page.locator(".tile.training[data-rank], .tile.waiting[data-rank]").count() == 2
        # AND the throughput bars are drawn under the page's own CSP: coloured segments that
        # take room (style attributes in markup were blocked, leaving empty frames)
        wait_js(page, "document.querySelectorAll('#throughput .tpbar .seg').length >= 2", 90)
        widths = page.evaluate("[...document.querySelectorAll('#throughput .tpbar .seg')]"
                               ".map(e => e.getBoundingClientRect().width)")
        assert sum(widths) > 50, widths
        colours = page.evaluate("[...document.querySelectorAll('#throughput .kind i')]"
                                ".map(e => getComputedStyle(e).backgroundColor)")
        assert colours and all(c not in ("", "rgba(0, 0, 0, 0)") for c in colours), colours
        assert page.evaluate("window.__csp") == []
        # AND the SQL console answers from every rank, as `probe query`
        page.fill("#sql", "SELECT count(*) AS n FROM python.steps")
        page.click("#run")
        page.wait_for_selector("#sqltable")
        rows = page.locator("#sqltable tr").all_inner_texts()
        assert rows[0].split() == ["rank", "n"]
        assert sorted(r.split()[0] for r in rows[1:]) == ["0", "1"]
        assert all(int(r.split()[1]) > 0 for r in rows[1:])
        # AND its CSV download carries the same columns
        assert page.locator("#csv").get_attribute("href").startswith("/api/query.csv?sql=")
        with httpx.Client(timeout=15, follow_redirects=True) as owner:
            page_html = owner.get(url).text  # the secret in the URL becomes the cookie
            key = re.search(r'name="probe-ui-key" content="([^"]+)"', page_html).group(1)
            csv = owner.get(url.split("?")[0] + "api/query.csv",
                            params={"sql": "SELECT 7 AS seven"},
                            headers={"X-Probe-UI-Key": key})  # what the page's JS sends
        assert csv.headers["content-disposition"].startswith("attachment")
        assert csv.text.splitlines() == ["rank,seven", "0,7", "1,7"]
        # AND clicking the link downloads it (a fetch with the page's key, saved as a file)
        page.fill("#sql", "SELECT 7 AS seven")
        with page.expect_download() as dl:
            page.click("#csv")
        assert Path(dl.value.path()).read_text().splitlines() == ["rank,seven", "0,7", "1,7"]
        # AND the slowest modules' heatmap fills once the doctor round has traced steps
        page.wait_for_selector("#heatmap rect", timeout=30_000)
        _drawing_checks(page)
        # AND memory by kind is one stacked bar per rank, its parameters drawn
        page.wait_for_selector('.membar[data-rank="1"]', timeout=30_000)
        assert page.locator("#memkinds .membar").count() == 2
        # AND throughput is one bar per rank: where a traced step goes, tokens/s and MFU
        page.wait_for_selector('.tpbar[data-rank="1"] .seg[data-part="forward"]', timeout=30_000)
        assert page.locator(".tpbar").count() == 2
        assert page.locator('.membar[data-rank="0"] .seg[data-kind="parameters"]').count() == 1
        page.screenshot(path=str(tmp_path / "probe-ui-healthy.png"), full_page=True)
        shutil.copy(tmp_path / "probe-ui-healthy.png", "/tmp/probe-ui-healthy.png")


def _drawing_checks(page: object) -> None:
    """What the healthy page draws: no literal backticks, both ranks' lines over the same
    steps, heatmap labels inside their drawing, a banner that agrees with the findings."""
    wait_js(page, "!document.getElementById('findings').textContent.startsWith('waiting')", 60)
    shown = page.evaluate("['banners', 'findings', 'memkinds', 'throughput', 'heatmap']"
                          ".map(i => document.getElementById(i).innerText).join('\\n')")
    assert "`" not in shown, shown  # commands are <code>, not backticks
    # each rank sends its own last steps: the chart starts where every rank has one
    starts = page.evaluate("[...document.querySelectorAll('#steptime polyline')].map(p => "
                           "+p.getAttribute('points').split(' ')[0].split(',')[0])")
    assert len(starts) == 2 and max(starts) - min(starts) < 0.5, starts
    cut = page.evaluate("""(() => {
        const s = document.querySelector('#heatmap svg').getBoundingClientRect();
        return [...document.querySelectorAll('#heatmap svg text')]
          .map(t => [t.textContent, t.getBoundingClientRect()])
          .filter(([_, r]) => r.right > s.right + 0.5 || r.left < s.left - 0.5
                              || r.top < s.top - 0.5).map(([t]) => t); })()""")
    assert cut == [], cut
    banner = page.locator("#banners").inner_text()
    straggler = page.locator("#ev-straggler summary").inner_text()
    if "no straggler" in banner:  # only when the straggler round said so
        assert straggler.startswith("straggler: no straggler"), (banner, straggler)
    assert not straggler.startswith("STRAGGLER:") or page.locator("#banner-straggler").count()


@pytest.mark.timeout(120)
def test_a_page_on_another_loopback_port_cannot_ride_the_cookie(make_agent, tmp_path):
    """127.0.0.1:OTHER is the same site as the dashboard, so the browser sends the
    SameSite=Strict cookie with a no-cors fetch or a link from a page there. Before, such a
    page, served by uid 65534, made the owner's browser run its SQL: /api/query.csv answered 200
    with the owner's rows (the page cannot read them, but the SQL ran)."""
    need_root()
    _need_browser()
    agent = make_agent()
    port, stop = closed_port(), f"/tmp/probe-page-{uuid.uuid4().hex}"
    with dashboard(agent.url) as url:
        ui = urlsplit(url).port
        sql = f"http://127.0.0.1:{ui}/api/query.csv?sql=SELECT%20'owner%20rows'%20AS%20x"
        html = (f'<script>fetch("{sql}&via=fetch", {{mode: "no-cors", credentials: "include"}});'
                f'</script><a id="go" href="{sql}&via=link">csv</a>'
                '<script>setTimeout(() => document.getElementById("go").click(), 500);</script>')
        served: dict = {}
        t = threading.Thread(target=lambda: served.update(
            n=run_as(FOREIGN_UID, serve_page, port, html, 60, stop, timeout=75)))
        t.start()
        try:
            wait_until(lambda: _listening(port), 10, "the other uid's page never listened")
            with page_at(url, tmp_path) as page:  # the owner opened the dashboard: cookie set
                page.wait_for_selector("#sql")
                responses: list = []
                page.context.on("response", lambda r: responses.append(r)
                                if "/api/query.csv" in r.url else None)
                # WHEN the owner's browser visits the other uid's page on another port
                page.goto(f"http://127.0.0.1:{port}/")
                # (sync Playwright delivers events only while it is called: wait through it)
                wait_until(lambda: page.wait_for_timeout(100) or len(responses) >= 2, 20,
                           f"the page's requests never went: {[r.url for r in responses]}")
                seen = [(r.url.rsplit("via=", 1)[-1], r.status,
                         bool(r.request.all_headers().get("cookie"))) for r in responses]
        finally:
            open(stop, "w").close()
            t.join(30)
            os.unlink(stop)
    # THEN the browser did send them with the cookie (same site), and the dashboard ran neither
    assert {via for via, _, _ in seen} == {"fetch", "link"}, seen
    assert all(status == 403 for _, status, _ in seen), seen
    assert any(cookie for _, _, cookie in seen), seen  # (the fetch's headers are not all shown)


def _listening(port: int) -> bool:
    with socket.socket() as c:
        return c.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.timeout(150)
def test_hang_banner_names_the_culprit(tmp_path):
    _need_browser()
    # GIVEN a 2-rank job whose rank 1 sleeps before the all_reduce rank 0 waits in
    with torchrun_job(tmp_path, "hang_sleep_before_allreduce.py", 2) as (_, infos):
        # AND the hang is established by the verdict's own rule (`probe hang`, default
        # threshold: the job's rhythm) before the page is opened: its first paint is during the
        # hang. Before that moment "No hang." is the truth, on a loaded machine for seconds.
        target = infos[0]["url"].removeprefix("http://")
        wait_until(lambda: probe("-t", target, "--timeout", "5", "hang").returncode == 4, 90,
                   "probe hang never called the hang")
        with dashboard(infos[0]["url"]) as url, page_at(url, tmp_path, RECORD_BANNERS) as page:
            _hang_banner_checks(page, tmp_path)


def _hang_banner_checks(page, tmp_path):
    """The hang banner from the first paint of a page opened during a hang."""
    # WHEN the page has refreshed
    banner = page.locator("#banner-hang")
    banner.wait_for(timeout=60_000)
    page.wait_for_selector('.tile.hung[data-rank="1"]', timeout=30_000)
    assert page.locator('.tile[data-rank="0"]').get_attribute("class") == "tile waiting"
    shot = tmp_path / "probe-ui-hang.png"
    page.screenshot(path=str(shot), full_page=True)
    shutil.copy(shot, "/tmp/probe-ui-hang.png")
    # THEN the banner names rank 1 (the verdict `probe hang` prints), linking to evidence
    text = banner.inner_text()
    assert text.startswith("HANG: rank 1"), text
    assert banner.locator("a").get_attribute("href") == "#ev-hang"
    assert "rank 1" in page.locator("#ev-hang summary").inner_text()
    # AND from its first paint on, the page never said the job was fine: before the first
    # snapshot it says it is checking
    seen = page.evaluate("window.__banners")
    assert seen and seen[0].startswith("Checking the job"), seen
    assert not any("No hang" in t for t in seen), seen
    # AND once the doctor and straggler round is in, no straggler is named under the hang
    wait_js(page, "!document.getElementById('findings').textContent.startsWith('waiting')", 60)
    assert page.locator("#banner-straggler").count() == 0
