"""Each finding of the local red-team pass, attacked for real, and what came of it.

The attacker is a real process of uid 65534 (tests/foreign.py); the agents are real, in this
process. One row per finding: what the attacker got. Run it on two checkouts to compare:

    sudo python bench/security_findings.py                      # this checkout
    sudo PROBE_SRC=/path/to/old/checkout python bench/security_findings.py
    sudo python bench/security_findings.py pm copy native runs  # only the findings named so

The post-mortem, native-build and copy-reading findings are in bench/findings_disk.py; the c10d
store's and the dashboard's of the third pass in bench/findings_serving.py.

Needs root (setuid to 65534) and torch (the c10d store row).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
ROOT = Path(os.environ.get("PROBE_SRC") or HERE)
sys.path.insert(0, str(ROOT))

from findings_support import attackers  # noqa: E402 - bench/, this script's directory
from findings_support import cli as _cli  # noqa: E402

from tests.foreign import FOREIGN_UID, http_request, run_as  # noqa: E402

TOKEN = "findings-" + os.urandom(8).hex()
CODE = "'the owner''s code'"


def _wait_listening(host: str, port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as c:
            if c.connect_ex((host, port)) == 0:
                return
        time.sleep(0.05)


class Squatter:
    def __init__(self, seconds: float) -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.out: dict[str, Any] = {}
        self.t = threading.Thread(target=lambda: self.out.update(
            got=run_as(FOREIGN_UID, attackers.squat, self.port, seconds, timeout=seconds + 30)))
        self.t.start()
        _wait_listening("127.0.0.1", self.port)

    def received(self) -> str:
        self.t.join()
        return self.out.get("got", "")


def _agent(**kw: Any) -> Any:
    import probe_agent
    from probe_agent.config import AgentConfig

    run_dir = tempfile.mkdtemp(prefix="probe-findings-")
    kw.setdefault("port", 0)
    return probe_agent.start(AgentConfig(run_dir=run_dir, watchdog=False, serve_cpu=1.0,
                                         trace_native="off", **kw))


def _stop() -> None:
    import probe_agent

    probe_agent.stop()


def spellings() -> str:
    names = ["127.0.0.1", "127.1", "2130706433", "[::ffff:127.0.0.1]", "[::1]", "localhost",
             "127.0.0.2"]
    reached = []
    for n in names:
        sq = Squatter(3)
        code, out, _ = _cli(f"{n}:{sq.port}", "eval", CODE)  # no token: the report's case
        if "owner" in sq.received():
            reached.append(n + (" (forged answer printed)" if "pwned" in out else ""))
    sq = Squatter(10)
    for n in names:
        _cli(f"{n}:{sq.port}", "--token", TOKEN, "eval", CODE)
    got = sq.received()
    return (f"code sent to the squatter via {len(reached)}/{len(names)} spellings "
            f"{reached}; with a token: token {'SENT' if TOKEN in got else 'not sent'}, "
            f"{len(got)} bytes received")


def store(token: str | None = TOKEN) -> str:
    import torch.distributed as dist

    sq = Squatter(12)
    agent = _agent(token=token)
    st = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, wait_for_workers=False)
    evil = {"rank": 1, "url": f"http://[::ffff:127.0.0.1]:{sq.port}", "host": "h", "pid": 1}
    dist.PrefixStore("probe_agent", st).set("rank1", json.dumps(evil))
    dist.init_process_group("gloo", store=st, rank=0, world_size=1)
    try:
        deadline = time.monotonic() + 20
        while not {0, 1} <= set(agent.peers) and time.monotonic() < deadline:
            time.sleep(0.1)
        code, out, err = _cli(agent.url.removeprefix("http://"),
                              *(["--token", token] if token else []), "eval", CODE)
    finally:
        dist.destroy_process_group()
        _stop()
    got = sq.received()
    why = re.search(r"failed: 1 \(([^)]*)\)", err)
    return (f"{'token' if token else 'no token'}: exit {code}; 'pwned' printed: "
            f"{'pwned' in out}; squatter got token: {TOKEN in got}, code: {'owner' in got}; "
            "stderr: "
            f"{why.group(1)[:60] if why else err.strip()[:60]!r}")


def relay() -> str:
    from probe_cli.transport.targets import Endpoint
    from probe_cli.transport.trust import check_agent

    agent = _agent(token=TOKEN, host="127.0.0.2")
    port = agent.tcp_port
    stop = threading.Event()
    threading.Thread(target=attackers.relay, daemon=True,
                     args=(("127.0.0.1", port), ("127.0.0.2", port), stop)).start()
    _wait_listening("127.0.0.1", port)
    import httpx

    def health(params: dict) -> dict:
        return httpx.get(f"http://127.0.0.1:{port}/v1/health", params=params, timeout=5).json()

    try:
        try:  # the check as made for another node's address
            from probe_cli.transport.guard import Dialled
            check_agent(Endpoint(f"http://127.0.0.1:{port}"), token=TOKEN, cacert=None,
                        health=health, dialled=Dialled("127.0.0.1", local=False))
        except ImportError:  # before: no Dialled; a name that is not this machine's
            check_agent(Endpoint(f"http://node-a.invalid:{port}"), token=TOKEN, cacert=None,
                        health=health)
        verdict = "ACCEPTED (the token would be sent)"
    except Exception as e:  # noqa: BLE001 - the refusal is the measurement
        verdict = f"refused ({type(e).__name__})"
    finally:
        stop.set()
        _stop()
    return f"proof relayed from 127.0.0.2 to 127.0.0.1: {verdict}"


def flip() -> str:
    agent = _agent()
    dir_ = f"/tmp/probe-flip-{uuid.uuid4().hex[:8]}"
    link = os.path.join(dir_, f"{os.getpid()}.sock")
    out: dict[str, str] = {}
    t = threading.Thread(target=lambda: out.update(
        got=run_as(FOREIGN_UID, attackers.flip, dir_, link, agent.unix_path, 60, timeout=80)))
    t.start()
    while not os.path.lexists(link):
        time.sleep(0.01)
    try:
        for _ in range(200):
            _cli(f"unix:{link}", "eval", CODE)
        os.environ["PROBE_RUN_DIR"] = dir_  # the attacker's dir, holding only the link
        for _ in range(20):
            _cli("--timeout", "2", "eval", CODE)
        del os.environ["PROBE_RUN_DIR"]
        open(dir_ + "-evil/stop", "w").close()
        t.join()
    finally:
        _stop()
        shutil.rmtree(dir_, ignore_errors=True)
        shutil.rmtree(dir_ + "-evil", ignore_errors=True)
    return (f"200 evals via unix:LINK + 20 with the attacker's run dir (default target): "
            f"{out.get('got', '').count('POST /v1/eval')} reached the attacker")


def ui() -> str:
    "localhost".encode("idna")  # the uid-65534 child cannot import the codec from /root
    agent = _agent()
    proc = subprocess.Popen([sys.executable, "-m", "probe_cli", "-t",
                             agent.url.removeprefix("http://"), "ui", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    try:
        url = re.search(r"dashboard at (\S+)", proc.stdout.readline()).group(1)
        host, port = re.match(r"http://([^:/]+):(\d+)/", url).groups()
        sql = "/api/query.csv?sql=SELECT%20code%20FROM%20python.evals%20LIMIT%201"
        other = run_as(FOREIGN_UID, http_request, host, int(port), "GET", sql, None,
                       {"Host": f"{host}:{port}"})
        cross = http_request(host, int(port), "GET", sql, None,
                             {"Host": f"{host}:{port}", "Sec-Fetch-Site": "cross-site"})
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(15)
        _stop()
    return (f"uid 65534 GET /api/query.csv: HTTP {other[0]}; owner's browser, cross-site, "
            f"no cookie: HTTP {cross[0]}")


def escapes() -> str:
    agent = _agent()
    try:
        code, out, err = _cli(agent.url.removeprefix("http://"), "eval",
                              "print('\\x1b]0;pwned\\x07\\x1b[2J')")
    finally:
        _stop()
    raw = sum((out + err).count(c) for c in ("\x1b", "\x07"))
    return f"eval printing an OSC title + clear screen: {raw} raw control bytes on the terminal"


def planted_link() -> str:
    agent = _agent()
    d = Path(f"/tmp/probe-shared-{uuid.uuid4().hex[:8]}")
    d.mkdir()
    d.chmod(0o777)
    victim = Path(tempfile.mkdtemp()) / "victim"
    victim.write_text("the owner's file\n")
    run_as(FOREIGN_UID, os.symlink, str(victim), str(d / "out.csv"))
    try:
        code, _, _ = _cli(agent.url.removeprefix("http://"), "query", "SELECT 1", "--format",
                          "csv", "-o", str(d / "out.csv"))
    finally:
        _stop()
        shutil.rmtree(d, ignore_errors=True)
    kept = victim.read_text() == "the owner's file\n"
    return (f"query -o onto a planted link: exit {code}; the linked file "
            f"{'kept' if kept else 'OVERWRITTEN'}")


def _findings(module: str) -> list[tuple[str, Any]]:
    """Another file of findings beside this one (``FINDINGS``), loaded from this checkout."""
    spec = importlib.util.spec_from_file_location(module, HERE / "bench" / f"{module}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return list(mod.FINDINGS)


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("needs root: the attacker runs as uid 65534")
    print(f"code under test: {ROOT}")
    only = sys.argv[1:]  # names (or prefixes) of the findings to run; all by default
    for name, fn in [("ui", ui), ("loopback spellings", spellings),
                     ("c10d store", lambda: store(None)), ("c10d store", store),
                     ("relayed proof", relay), ("run-dir link flip", flip),
                     ("escapes", escapes), ("-o symlink", planted_link),
                     *_findings("findings_disk"), *_findings("findings_serving")]:
        if only and not any(name.startswith(o) for o in only):
            continue
        try:
            print(f"{name:20} {fn()}", flush=True)
        except Exception as e:  # noqa: BLE001 - one finding's failure must not hide the rest
            print(f"{name:20} could not measure: {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
