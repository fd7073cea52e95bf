"""The watchdog owns the public sockets: the same access rule there, also while the rank's GIL
is held and only the watchdog can answer (issue 19). Real rank, real watchdog, real other uid.
"""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from tests.e2e.procs import require_pyspy
from tests.e2e.training import probe
from tests.foreign import (
    FOREIGN_UID,
    check_burst,
    connections_of,
    http_request,
    need_root,
    run_as,
    sweep,
)
from tests.support import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _port(info: dict) -> int:
    return int(info["url"].rsplit(":", 1)[1])


def test_the_watchdog_refuses_a_stranger_on_every_route_even_while_the_gil_is_held(gil_rank):
    need_root()
    require_pyspy()
    info, go, done = gil_rank(spin_s=6.0)
    port = _port(info)
    # GIVEN a healthy rank: a stranger gets 403 on every route but health, the owner gets in
    stranger = run_as(FOREIGN_UID, sweep, "127.0.0.1", port)
    assert stranger.pop("GET /v1/health") == 200
    assert {s for s, _ in stranger.values()} == {403}, stranger
    assert httpx.post(info["url"] + "/v1/eval", json={"code": "1"}).json()["result"] == "1"
    # AND nobody but the watchdog itself may write the audit of refusals
    forged = httpx.post(info["url"] + "/v1/access/refusals", json={"refusals": [
        {"client": "x", "what": "GET /x", "reason": "uid", "message": "forged"}]},
        headers={"x-probe-client": "watchdog"})
    assert forged.status_code == 403, forged.text
    # AND a foreign Host header is refused by the watchdog too
    rebind = httpx.get(info["url"] + "/v1/backtrace?locals=1",
                       headers={"Host": "rebind.attacker.example"})
    assert rebind.status_code == 403

    # WHEN the rank's GIL is held, so that only the watchdog answers
    go.touch()
    wait_until(lambda: not go.exists(), 10, "the program did not take the go file")
    with httpx.Client(base_url=info["url"], timeout=10) as owner:
        body = wait_until(
            lambda: (b := owner.get("/v1/backtrace").json())["source"] == "out-of-process" and b,
            5, "backtrace never came from the watchdog")
    # THEN the owner's backtrace comes from outside, and the stranger still gets 403
    assert body["ok"] is True
    status, reply = run_as(FOREIGN_UID, http_request, "127.0.0.1", port, "GET",
                           "/v1/backtrace?locals=1")
    assert status == 403 and f"uid {FOREIGN_UID}" in reply["error"]

    # AND once the rank runs again, the watchdog's refusals are in the rank's audit table
    wait_until(done.exists, 20, "the C call never returned")

    def audited() -> list | None:
        r = httpx.post(info["url"] + "/v1/query", timeout=30, json={
            "sql": "SELECT client, code FROM python.audit WHERE kind = 'access'"}).json()
        rows = r.get("rows") or []
        return rows if len(rows) >= len(stranger) + 2 else None

    rows = wait_until(audited, 15, "the watchdog's refusals never reached python.audit")
    assert all(f"uid={FOREIGN_UID}" in c or "127.0.0.1" in c for c, _ in rows)
    assert any(code == "GET /v1/backtrace" for _, code in rows)
    access = httpx.get(info["url"] + "/v1/info").json()["access"]
    assert access["refused"] >= len(rows)


def test_refusals_during_a_gil_hold_are_counted_once_each(gil_rank):
    """The watchdog reports its refusals to the agent every second. While the GIL is held its
    report is delivered but not answered in time; it used to count that batch again as
    'unlisted' and send it again, and the agent, once running, applied every copy: a refusal
    was counted once per report attempt of the hold."""
    info, go, done = gil_rank(spin_s=5.0)
    before = httpx.get(info["url"] + "/v1/info").json()["access"]["refused"]
    # WHEN three requests with a foreign Host header are refused while the GIL is held
    go.touch()
    wait_until(lambda: not go.exists(), 10, "the program did not take the go file")
    time.sleep(0.5)  # the C call has the GIL: the report attempts of the next 4 s time out
    for _ in range(3):
        r = httpx.get(info["url"] + "/v1/steps", headers={"Host": "rebind.attacker.example"})
        assert r.status_code == 403, r.text
    wait_until(done.exists, 20, "the C call never returned")

    # THEN once the rank runs again, each is audited once and counted once
    def audited() -> list | None:
        rows = httpx.post(info["url"] + "/v1/query", timeout=30, json={
            "sql": "SELECT code FROM python.audit WHERE kind = 'access'"}).json()["rows"]
        return rows if len(rows) >= 3 else None

    rows = wait_until(audited, 15, "the watchdog's refusals never reached python.audit")
    time.sleep(3.0)  # reports still in flight would have landed by now
    assert len(audited() or []) == 3, rows
    access = httpx.get(info["url"] + "/v1/info").json()["access"]
    assert access["refused"] - before == 3, access


def test_a_strangers_flood_on_the_watchdog_leaves_the_owner_served(gil_rank):
    """Half-open sockets and a burst of requests from another uid: the stranger's class is
    capped with JSON 503s (never resets), and the owner's backtrace answers throughout."""
    need_root()
    info, _go, _done = gil_rank()
    port = _port(info)

    def flood(port: int, half_open: int, burst: int) -> dict:
        held = [socket.create_connection(("127.0.0.1", port), timeout=5)
                for _ in range(half_open)]
        statuses: dict[str, int] = {}
        for _ in range(burst):
            try:
                status, _ = http_request("127.0.0.1", port, "GET", "/v1/health")
                key = str(status)
            except ConnectionResetError:
                key = "reset"
            except OSError as e:
                key = type(e).__name__
            statuses[key] = statuses.get(key, 0) + 1
        answers = []
        for s in held:
            s.setblocking(False)
            try:
                answers.append(s.recv(4096).decode("latin-1"))
            except BlockingIOError:
                answers.append("")
        time.sleep(2)  # hold them while the owner asks
        return {"statuses": statuses, "turned_away": [a for a in answers if a]}

    result: dict = {}
    t = threading.Thread(target=lambda: result.update(run_as(FOREIGN_UID, flood, port, 40, 200)))
    t.start()
    try:
        # WHILE the stranger holds its share of sockets, the owner's `probe backtrace` answers
        wait_until(lambda: connections_of(FOREIGN_UID, port) >= 32, 20, "no flood under way")
        for _ in range(3):
            bt = probe("-t", info["url"].removeprefix("http://"), "backtrace", timeout=30)
            assert bt.returncode == 0 and "waiting_room" in bt.stdout, bt.stdout + bt.stderr
    finally:
        t.join(60)
    # THEN the stranger's extra sockets got the JSON error body, and its burst no resets
    assert len(result["turned_away"]) == 40 - 32
    assert all('"status": 503' in a for a in result["turned_away"])
    assert "reset" not in result["statuses"], result["statuses"]
    assert sum(result["statuses"].values()) == 200


def test_a_burst_of_1000_connections_gets_answers_or_json_503s_never_resets(gil_rank):
    need_root()
    info, _go, _done = gil_rank()
    port = _port(info)
    # WHEN another uid opens 1000 connections at once, and the owner opens as many, THEN every
    # one is answered: 200, or the JSON 503 of a full class; no reset, no silence
    check_burst(port)
    # AND the owner's backtrace answers right after
    assert httpx.get(info["url"] + "/v1/backtrace", timeout=5).status_code == 200
