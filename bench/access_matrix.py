"""Route × client → answer, measured on a real agent (issue 19's closing table).

Clients: the owner (this uid, loopback), another uid (65534, loopback), another host (a network
namespace this script makes, joined to this one by a veth pair on link-local addresses: no
packet leaves the machine), each with and without the job's token. Agents: the default
(loopback, no token), loopback with a token, and 0.0.0.0 with a token (0.0.0.0 without one does
not listen on TCP at all; the script checks that too).

Needs root (setuid, ip netns). Run: ``sudo python bench/access_matrix.py``
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.foreign import FOREIGN_UID, PROTECTED_ROUTES, run_as, sweep  # noqa: E402

NS = "probe-access-h2"
HOST_IP, NS_IP = "169.254.213.1", "169.254.213.2"
TOKEN = "matrix-" + os.urandom(8).hex()


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def netns_up() -> None:
    netns_down()
    _sh("ip", "netns", "add", NS)
    _sh("ip", "link", "add", "probe-v0", "type", "veth", "peer", "name", "probe-v1")
    _sh("ip", "link", "set", "probe-v1", "netns", NS)
    _sh("ip", "addr", "add", f"{HOST_IP}/30", "dev", "probe-v0")
    _sh("ip", "link", "set", "probe-v0", "up")
    _sh("ip", "netns", "exec", NS, "ip", "addr", "add", f"{NS_IP}/30", "dev", "probe-v1")
    _sh("ip", "netns", "exec", NS, "ip", "link", "set", "probe-v1", "up")
    _sh("ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up")


def netns_down() -> None:
    subprocess.run(["ip", "link", "del", "probe-v0"], capture_output=True)
    subprocess.run(["ip", "netns", "del", NS], capture_output=True)


def start_agent(run_dir: str, **env: str) -> tuple[subprocess.Popen[str], dict]:
    ready = Path(run_dir) / "ready.json"
    code = ("import json, os, time, probe_agent\n"
            "a = probe_agent.start()\n"
            f"open({str(ready)!r} + '.tmp', 'w').write(json.dumps("
            "{'port': a.tcp_port, 'url': a.url}))\n"
            f"os.replace({str(ready)!r} + '.tmp', {str(ready)!r})\n"
            "time.sleep(600)\n")
    child_env = {**os.environ, "PROBE_RUN_DIR": run_dir, "PROBE_PORT": "0",
                 "PROBE_TRACE": "off", **env}
    proc = subprocess.Popen([sys.executable, "-c", code], env=child_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for _ in range(600):
        if ready.exists():
            return proc, json.loads(ready.read_text())
        if proc.poll() is not None:
            raise SystemExit(f"agent exited: {proc.stdout.read()}")  # type: ignore[union-attr]
        time.sleep(0.05)
    raise SystemExit("agent never became ready")


def remote_sweep(port: int, token: str | None) -> dict:
    """sweep() from inside the other namespace, through the veth."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "from tests.foreign import sweep\n"
            f"print(json.dumps(sweep({HOST_IP!r}, {port}, {headers!r})))\n")
    out = subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1]}
    return json.loads(out.stdout)


def short(answer: object) -> str:
    status = answer[0] if isinstance(answer, list) else answer
    return str(status)


def main() -> None:
    if os.geteuid() != 0:
        raise SystemExit("run as root: the other uid is a setuid child, the other host a netns")
    netns_up()
    rows: dict[str, dict[str, str]] = {}
    try:
        for label, env in (("loopback", {}),
                           ("loopback+token", {"PROBE_TOKEN": TOKEN}),
                           ("0.0.0.0+token", {"PROBE_HOST": "0.0.0.0", "PROBE_TOKEN": TOKEN})):
            with tempfile.TemporaryDirectory() as run_dir:
                os.chmod(run_dir, 0o755)
                proc, info = start_agent(run_dir, **env)
                try:
                    port = info["port"]
                    auth = {"Authorization": f"Bearer {TOKEN}"}
                    cols = {
                        "owner": sweep("127.0.0.1", port),
                        "other uid": run_as(FOREIGN_UID, sweep, "127.0.0.1", port),
                        "other uid + token": run_as(FOREIGN_UID, sweep, "127.0.0.1", port, auth),
                    }
                    if label.startswith("0.0.0.0"):
                        cols["other host"] = remote_sweep(port, None)
                        cols["other host + token"] = remote_sweep(port, TOKEN)
                    for col, answers in cols.items():
                        for route, answer in answers.items():
                            rows.setdefault(route, {})[f"{label}: {col}"] = short(answer)
                finally:
                    proc.kill()
                    proc.wait()
        with tempfile.TemporaryDirectory() as run_dir:
            proc = subprocess.run(
                [sys.executable, "-c", "import probe_agent; a = probe_agent.start(); "
                 "print('url', a.url); probe_agent.stop()"],
                env={**os.environ, "PROBE_RUN_DIR": run_dir, "PROBE_PORT": "0",
                     "PROBE_HOST": "0.0.0.0", "PROBE_TRACE": "off"},
                capture_output=True, text=True, timeout=120)
            no_token = proc.stdout.strip() + " | " + proc.stderr.strip().splitlines()[0]
    finally:
        netns_down()
    columns = sorted({c for r in rows.values() for c in r}, key=lambda c: list(
        next(iter(rows.values()))).index(c) if c in next(iter(rows.values())) else 99)
    print("| route | " + " | ".join(columns) + " |")
    print("| --- |" + " --- |" * len(columns))
    order = [f"{m} {p}" for m, p, _ in PROTECTED_ROUTES] + ["GET /v1/health"]
    for route in order:
        print(f"| `{route}` | " + " | ".join(rows[route].get(c, "") for c in columns) + " |")
    print(f"\n0.0.0.0 without a token: {no_token}")


if __name__ == "__main__":
    main()
