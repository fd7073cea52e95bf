"""The agent as an HTTP server, against a real agent (real DuckDB, real uvicorn on
127.0.0.1:0): health, info and the spec; the serving budget under a crowd; /v1/eval and
/v1/backtrace; and how it listens: the unix socket and its permissions, ports, one agent per
process, forked children. SQL over /v1/query: test_agent_http_query.py."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading

import httpx
import pytest

from probe_agent.errors import AgentStateError, BindError


def test_health_and_info_carry_rank_and_versions(client):
    # WHEN
    health = client.get("/v1/health").json()
    info = client.get("/v1/info").json()
    # THEN
    assert health == {"ok": True, "rank": 0, "status": "ok"}
    assert info["ok"] and info["pid"] == os.getpid()
    assert info["python"].count(".") == 2 and info["version"]
    assert info["url"].startswith("http://127.0.0.1:")
    assert info["uptime_s"] >= 0


def test_openapi_spec_is_served(client):
    spec = client.get("/openapi.json").json()
    routes = {"/v1/query", "/v1/eval", "/v1/backtrace", "/v1/info", "/v1/health"}
    assert routes <= set(spec["paths"])


def test_a_crowd_of_requests_queues_within_the_serving_budget_and_none_is_lost(make_agent):
    import asyncio

    # GIVEN an agent allowed 20% of a core for serving, in bursts of 0.1 s (default: 1 s)
    agent = make_agent(serve_cpu=0.2)
    agent.serve_budget.burst_s = agent.serve_budget.tokens = 0.1
    heavy = {"sql": "SELECT sum(hash(i)) FROM range(4000000) t(i)"}

    async def storm() -> tuple[list[httpx.Response], list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=agent.url, timeout=120) as c:
            for _ in range(4):  # the agent learns what a request costs
                assert (await c.post("/v1/query", json=heavy)).status_code == 200
            queries = [c.post("/v1/query", json=heavy) for _ in range(24)]
            # liveness is exempt: it answers at once while the crowd waits
            health = [c.get("/v1/health") for _ in range(3)]
            return await asyncio.gather(*queries), await asyncio.gather(*health)

    # WHEN 24 CPU-heavy queries arrive at once, after a few
    answers, health = asyncio.run(storm())
    # THEN every one is answered, the later ones after queueing (the header says how long)
    assert [r.status_code for r in answers] == [200] * 24
    queued = [float(r.headers["x-probe-queued-ms"]) for r in answers
              if "x-probe-queued-ms" in r.headers]
    assert queued and max(queued) > 100, queued
    assert all(r.status_code == 200 and "x-probe-queued-ms" not in r.headers for r in health)
    info = httpx.get(f"{agent.url}/v1/info").json()
    assert info["serve_cpu"] == 0.2 and info["queued_s"] > 0.1


def test_serving_budget_must_be_positive():
    from probe_agent.config import AgentConfig
    from probe_agent.errors import ConfigError

    with pytest.raises(ConfigError, match="PROBE_SERVE_CPU=0.0 is invalid"):
        AgentConfig.from_env({"PROBE_SERVE_CPU": "0"})


def test_eval_multiline_prints_and_trailing_expression(client):
    code = (
        "import threading\nfor t in threading.enumerate():\n"
        "    print(f'{t.name}: alive={t.is_alive()}')\n6 * 7"
    )
    body = client.post("/v1/eval", json={"code": code}).json()
    assert body["ok"] and body["result"] == "42"
    assert "MainThread: alive=True" in body["stdout"]


def test_eval_does_not_capture_other_threads_prints(client, capsys):
    # GIVEN a "training" thread printing while the eval runs
    stop = threading.Event()

    def trainer() -> None:
        while not stop.is_set():
            print("training-line")
            stop.wait(0.001)

    th = threading.Thread(target=trainer)
    th.start()
    try:
        body = client.post(
            "/v1/eval",
            json={"code": "import time\nfor i in range(20):\n  print('e', i)\n  time.sleep(0.002)"},
        ).json()
    finally:
        stop.set()
        th.join()
    assert "training-line" not in body["stdout"]
    assert body["stdout"].count("e ") == 20


def test_eval_resolves_names_from_main_thread_frames(client):
    """A script that keeps `model` inside main(): the name still resolves."""
    model = {"layers": 3}  # noqa: F841 - found by the eval through this frame's locals
    body = client.post("/v1/eval", json={"code": "model['layers'] + 1"}).json()
    assert body["result"] == "4"


def test_eval_error_has_traceback_and_is_audited(client):
    r = client.post("/v1/eval", json={"code": "x = 1\n1 / 0"})
    assert r.status_code == 400
    body = r.json()
    assert body["error"] == "ZeroDivisionError: division by zero"
    assert "<probe eval>" in body["traceback"] and "evaluator.py" not in body["traceback"]
    client.post("/v1/eval", json={"code": "1"})
    audit = client.post(
        "/v1/query", json={"sql": "SELECT code, outcome FROM python.evals ORDER BY timestamp"}
    ).json()["rows"]
    assert audit[-2:] == [["x = 1\n1 / 0", "error"], ["1", "ok"]]


def test_eval_syntax_error_is_400(client):
    body = client.post("/v1/eval", json={"code": "def ("}).json()
    assert body["status"] == 400 and body["error"].startswith("SyntaxError")


def test_eval_infinite_loop_is_interrupted(make_agent):
    agent = make_agent(eval_timeout_s=0.5)
    with httpx.Client(base_url=agent.url, timeout=10) as c:
        r = c.post("/v1/eval", json={"code": "while True:\n    pass"})
        after = c.post("/v1/eval", json={"code": "'still here'"})
    assert r.status_code == 408 and "PROBE_EVAL_TIMEOUT_S" in r.json()["error"]
    assert after.json()["result"] == "'still here'"


def test_eval_output_is_capped(make_agent):
    agent = make_agent(eval_output_bytes=1000)
    with httpx.Client(base_url=agent.url, timeout=10) as c:
        body = c.post("/v1/eval", json={"code": "print('x' * 100000)"}).json()
    assert len(body["stdout"]) < 1200 and "PROBE_EVAL_OUTPUT_BYTES" in body["stdout"]


def test_backtrace_marks_main_hides_agent_and_survives_bad_repr(client):
    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no repr for you")

    broken = Broken()  # noqa: F841 - a local whose repr raises
    body = client.get("/v1/backtrace", params={"locals": 1}).json()
    names = [t["thread_name"] for t in body["threads"]]
    assert body["source"] == "in-process"
    assert body["threads"][0]["is_main"] and names[0] == "MainThread"
    assert not any(n.startswith("probe-agent") for n in names)
    frames = body["threads"][0]["frames"]
    mine = next(f for f in frames
                if f["func"] == "test_backtrace_marks_main_hides_agent_and_survives_bad_repr")
    assert "Broken" in mine["locals"]["broken"]  # reprlib names the type instead of failing
    with_agent = client.get("/v1/backtrace", params={"all": 1}).json()
    assert any(t["thread_name"] == "probe-agent.http" for t in with_agent["threads"])


def test_unix_socket_permissions_and_info_file(agent, run_dir):
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(agent.unix_path).st_mode) == 0o600
    with open(os.path.join(run_dir, f"{os.getpid()}.json")) as f:
        assert json.load(f)["url"] == agent.url
    with httpx.Client(transport=httpx.HTTPTransport(uds=agent.unix_path), base_url="http://x") as u:
        assert u.get("/v1/health").json()["ok"]


def test_a_taken_port_moves_the_agent_to_the_next_free_one(make_agent, caplog):
    """Another job on the node holds the base port (issue 20): the agent comes up anyway."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    base = taken.getsockname()[1]
    try:
        agent = make_agent(port=base)
        port = int(agent.url.rsplit(":", 1)[1])
        assert base < port <= base + 64
        assert f"port {base} is taken" in caplog.text and f"listening on {port}" in caplog.text
    finally:
        taken.close()


def test_port_in_use_fails_at_once_with_advice_when_no_port_near_it_is_free(make_agent):
    from probe_agent.serving.ports import PORT_TRIES

    held = []
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    held.append(taken)
    base = taken.getsockname()[1]
    for k in range(1, PORT_TRIES + 1):
        if base + k > 65535:
            break
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", base + k))  # if it fails, someone else holds it: taken too
            s.listen()
            held.append(s)
        except OSError:
            s.close()
    try:
        with pytest.raises(BindError, match=r"could not bind 127.0.0.1:\d+ .*PROBE_PORT=0"):
            make_agent(port=base)
    finally:
        for s in held:
            s.close()


def test_start_twice_is_an_error(agent, make_agent):
    with pytest.raises(AgentStateError, match="already runs"):
        make_agent()


def test_unknown_route_and_malformed_body(client):
    assert client.get("/v1/nope").json()["status"] == 404
    r = client.post("/v1/query", json={"sqll": "SELECT 1"})
    assert r.status_code == 422 and "sql" in r.json()["error"]


def test_forked_child_does_not_inherit_agent(agent):
    """A DataLoader worker forks after the agent started: it must not answer for its parent."""
    import probe_agent.process as agent_mod

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        ok = agent_mod.current() is None and not agent.running
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    verdict = os.read(r, 1)
    os.waitpid(pid, 0)
    assert verdict == b"1"
    assert agent_mod.current() is agent and agent.running


def _as_nobody(fn) -> bytes:
    """Run ``fn`` in a forked child that dropped to uid nobody; return what it wrote."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            out = fn()
        except BaseException as e:  # report any failure to the parent as text
            out = f"EXC {type(e).__name__}: {e}".encode()
        os.write(w, out[:4000])
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 4096):
        chunks.append(chunk)
    os.waitpid(pid, 0)
    return b"".join(chunks)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to switch to uid nobody")
def test_other_uid_cannot_use_unix_socket(agent, run_dir):
    def connect() -> bytes:
        s = socket.socket(socket.AF_UNIX)
        s.connect(agent.unix_path)
        try:
            s.sendall(b"POST /v1/eval HTTP/1.1\r\nhost: x\r\ncontent-length: 12\r\n\r\n"
                      b"{\"code\":\"1\"}")
        except BrokenPipeError:
            pass  # the agent refuses on connect and may have closed before we sent
        return s.recv(4096)

    # GIVEN the run dir's 0700 mode: another uid cannot even reach the socket
    assert _as_nobody(connect).startswith(b"EXC PermissionError")
    # AND with the file modes loosened by mistake, the SO_PEERCRED check still refuses it
    os.chmod(os.path.dirname(run_dir), 0o755)
    os.chmod(run_dir, 0o755)
    os.chmod(agent.unix_path, 0o666)
    answer = _as_nobody(connect)
    assert answer.startswith(b"HTTP/1.1 403"), answer
    assert b"uid 65534 may not use this agent" in answer


@pytest.mark.parametrize("code", ["(" * 5000 + ")" * 5000, "x = 1\x00", "-" * 60000 + "1"],
                         ids=["deep-nesting", "null-byte", "long-unary"])
def test_eval_of_uncompilable_code_is_400_not_500(client, code):
    r = client.post("/v1/eval", json={"code": code})
    assert r.status_code == 400, r.text
