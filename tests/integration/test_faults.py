"""Faults an agent must survive with a clear message, while the host process carries on."""

from __future__ import annotations

import socket
import subprocess
import sys

import httpx

from tests.support import python_env


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_ten_million_rows_are_truncated_without_memory_blowup(client):
    before = rss_mib()
    sql = "SELECT range AS i, 'x' || range AS s FROM range(10000000)"
    body = client.post("/v1/query", json={"sql": sql}).json()
    assert body["ok"] and body["truncated"] is True and len(body["rows"]) == 10_000
    assert rss_mib() - before < 300, "fetching a capped result must not materialise 10M rows"


def test_eval_printing_100_mb_is_capped(client):
    body = client.post("/v1/eval", json={"code": "print('x' * 100_000_000)"}).json()
    assert body["ok"]
    assert len(body["stdout"]) < 1.1 * (1 << 20)
    assert "output cut" in body["stdout"] and "PROBE_EVAL_OUTPUT_BYTES" in body["stdout"]


def test_client_disconnecting_mid_response_leaves_agent_serving(agent):
    # GIVEN a client that asks for a large result and hangs up before reading it
    host, port = agent.url.removeprefix("http://").rsplit(":", 1)
    payload = b'{"sql": "SELECT range, repeat(\'y\', 50) FROM range(10000)"}'
    for _ in range(20):
        s = socket.create_connection((host, int(port)))
        s.sendall(
            b"POST /v1/query HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
        )
        s.recv(10)  # the first bytes of the answer, then gone
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()  # RST
    # THEN the agent still answers everything
    with httpx.Client(base_url=agent.url) as c:
        assert c.get("/v1/health").json()["ok"]
        assert c.post("/v1/query", json={"sql": "SELECT 1"}).json()["rows"] == [[1]]


def test_port_taken_under_probe_1_says_which_port_it_took_and_training_runs(tmp_path):
    """Another job holds the base port (issue 20): the agent takes the next free one and says
    so in one line; the program runs as ever."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        env = python_env(PROBE="1", PROBE_PORT=str(port), PROBE_RUN_DIR=str(tmp_path / "r"))
        out = subprocess.run(
            [sys.executable, "-c", "print(sum(range(10)))"],
            env=env, capture_output=True, text=True, timeout=60,
        )
    finally:
        taken.close()
    assert out.returncode == 0 and out.stdout.strip() == "45"
    lines = [ln for ln in out.stderr.splitlines() if "probe" in ln]
    assert len(lines) == 1, out.stderr
    assert f"port {port} is taken" in lines[0] and "listening on" in lines[0], lines[0]

def test_a_request_while_the_process_exits_is_a_503_without_a_traceback(make_agent, capfd):
    """A wikitext job that crashed printed the agent's traceback for a query that arrived
    while the interpreter shut its pools ("cannot schedule new futures after shutdown")."""
    import httpx

    agent = make_agent()
    # GIVEN the agent's query pools are shut, as at interpreter exit
    agent.query_pool.shutdown(wait=True)
    agent.sql_pool.shutdown(wait=True)
    # WHEN a query arrives
    with httpx.Client(base_url=agent.url, timeout=10) as c:
        r = c.post("/v1/query", json={"sql": "SELECT 1"})
    # THEN it is told the agent is stopping, and nothing is printed into the job's output
    assert r.status_code == 503 and "stopping" in r.json()["error"], r.text
    assert "Traceback" not in capfd.readouterr().err
