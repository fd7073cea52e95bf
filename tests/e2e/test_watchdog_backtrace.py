"""Backtrace that always answers: a rank whose GIL is held by a C call (issue 5).

Real processes: ``tests/programs/gil_holder.py`` with its agent and watchdog; a C library
compiled here; py-spy (or faulthandler) reading the stacks from outside.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from probe_protocol import nodefan
from probe_protocol.bodies import BacktraceBody
from tests.e2e.procs import require_pyspy
from tests.support import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _timed_get(client: httpx.Client, path: str, **params: int) -> tuple[dict, float]:
    t0 = time.monotonic()
    body = client.get(path, params=params).json()
    return body, time.monotonic() - t0


def _main(body: dict) -> dict:
    return next(t for t in body["threads"] if t["is_main"])


def test_gil_held_backtrace_answers_out_of_process_then_in_process_again(gil_rank, capsys):
    require_pyspy()
    info, go, done = gil_rank(spin_s=6.0, workers=2)
    with httpx.Client(base_url=info["url"], timeout=10) as client:
        # GIVEN the main thread waits in time.sleep: the in-process route answers, with locals
        body, _ = _timed_get(client, "/v1/backtrace", locals=1)
        assert body["source"] == "in-process", body
        waiting = _main(body)["frames"]
        assert waiting[0]["func"] == "waiting_room"  # time.sleep is C: no frame of its own
        assert "waiting-for-go" in waiting[0]["locals"]["marker"]

        # WHEN the main thread enters a C call that holds the GIL
        go.touch()
        wait_until(lambda: not go.exists(), 10, "the program did not take the go file")

        # THEN backtrace answers within 2 s, from outside, naming the GIL holder
        def out_of_process() -> dict | None:
            b, took = _timed_get(client, "/v1/backtrace")
            assert took <= 2.0, f"backtrace took {took:.2f} s"
            return b if b["source"] == "out-of-process" else None

        body = wait_until(out_of_process, 4, "backtrace never came from the watchdog")
        # AND the rank's DataLoader workers come with it, read from outside, pid and worker id
        kids, took = _timed_get(client, "/v1/backtrace", children=1)
        assert kids["source"] == "out-of-process" and took <= 4.0, (took, kids)
        workers = [c for c in kids["children"] if c["kind"] == "dataloader_worker"]
        assert sorted(c["worker_id"] for c in workers) == [0, 1], kids["children"]
        for c in workers:
            assert c["route"] == "py-spy" and c["name"] == "pt_data_worker", c
            frames = c["threads"][0]["frames"]
            assert "_worker_loop" in [f["func"] for f in frames], frames
            assert all(f["locals"] is None for f in frames)  # read with locals, not sent
            stat = Path(f"/proc/{c['pid']}/stat").read_text()
            assert stat.rsplit(")", 1)[1].split()[1] == str(info["pid"])  # the rank's child
        main = _main(body)
        assert body["route"] == "py-spy"
        assert body["gil_holder"] == main["thread_id"] and body["gil_held"] is True
        assert [f["func"] for f in main["frames"][:3]] == ["spin_in_c", "hold_gil", "main"]
        assert "GIL" in body["reason"]
        # the out-of-process body is the protocol's BacktraceBody, key for key
        again = BacktraceBody.from_wire(body).to_wire()
        assert again == body and list(again) == list(body)

        # AND other routes say the rank's Python is not answering, at once
        q, took = _timed_get(client, "/v1/info")
        assert q["status"] == 504 and "GIL" in q["error"] and took <= 2.0, q

        # AND the health route a scheduler polls answers within 1 s, from the watchdog: with a
        # 1 s stall limit the rank is hung (its Python has not run), 503 for a liveness probe
        t0 = time.monotonic()
        h = client.get("/v1/health", params={"status": 1, "stall": 1})
        took = time.monotonic() - t0
        assert took <= 1.0, f"health took {took:.2f} s"
        assert h.status_code == 503 and h.json()["state"] == "hung", h.text
        assert "has not run" in h.json()["reason"] and h.json()["heartbeat_age_s"] > 1.0
        h = client.get("/v1/health", params={"status": 1})  # the default limit: not hung
        assert h.status_code == 200 and h.json()["state"] in ("starting", "healthy"), h.text

        # AND stuck requests do not exhaust anything: 16 evals in flight, backtrace still quick
        async def flood() -> list[int]:
            async with httpx.AsyncClient(base_url=info["url"], timeout=10) as ac:
                rs = await asyncio.gather(*(ac.post("/v1/eval", json={"code": "1"})
                                            for _ in range(16)))
                return [r.status_code for r in rs]

        assert set(asyncio.run(flood())) <= {200, 504}
        body, took = _timed_get(client, "/v1/backtrace")
        assert took <= 2.0 and body["ok"], body

        # AND the CLI shows it, saying where the answer came from
        from probe_cli.main import main as probe_main

        host_port = info["url"].removeprefix("http://")
        capsys.readouterr()
        assert probe_main(["-t", host_port, "backtrace"]) == 0
        out = capsys.readouterr().out
        if "out-of-process" in out:  # the C call may just have ended
            assert "via py-spy; GIL held by thread" in out and "spin_in_c" in out

        # WHEN the C call returns, THEN the in-process route answers again
        wait_until(done.exists, 15, "the C call never returned")
        body = wait_until(
            lambda: (b := client.get("/v1/backtrace").json())["source"] == "in-process" and b,
            5, "the in-process route did not come back")
        assert body["route"] == "sys._current_frames"


def test_without_ptrace_the_faulthandler_route_answers(gil_rank):
    """PROBE_WATCHDOG_READER=faulthandler is what a container without SYS_PTRACE gets."""
    info, go, _ = gil_rank(reader="faulthandler", spin_s=3.0)
    with httpx.Client(base_url=info["url"], timeout=10) as client:
        go.touch()
        wait_until(lambda: not go.exists(), 10, "the program did not take the go file")
        body = wait_until(
            lambda: (b := client.get("/v1/backtrace").json())["source"] == "out-of-process" and b,
            4, "backtrace never came from the watchdog")
    assert body["route"] == "faulthandler" and body["gil_holder"] is None
    assert "PROBE_WATCHDOG_READER=faulthandler" in body["reason"]
    funcs = [f["func"] for f in _main(body)["frames"]]
    assert funcs[:2] == ["spin_in_c", "hold_gil"], funcs


def test_the_node_route_answers_from_the_watchdog_while_the_gil_is_held(gil_rank):
    """`POST /v1/node/fanout` is the watchdog's: it reaches its node's ranks over their unix
    sockets, this one included, and answers while the serving rank's own Python is stuck."""
    require_pyspy()
    info, go, _done = gil_rank(spin_s=4.0)
    with httpx.Client(base_url=info["url"], timeout=10) as client:
        rank = client.get("/v1/ranks").json()["rank"]
        ask = nodefan.request("backtrace", {"timeout_s": 3}, [rank])
        # GIVEN the rank is idle: its own in-process stack, through the node route
        body = client.post("/v1/node/fanout", json=ask).json()
        [(r, status, bt)] = nodefan.split(body)
        assert (r, status, bt["source"]) == (rank, 200, "in-process"), body
        assert _main(bt)["frames"][0]["func"] == "waiting_room"
        # AND a query, which the agent streams (chunked), comes back as its rows
        rows = client.post("/v1/node/fanout", json=nodefan.request(
            "query", {"sql": "SELECT 41 + 1 AS answer", "timeout_s": 3}, [rank])).json()
        assert rows["rows"] == [[rank, 42]] and rows["answers"][0]["status"] == 200, rows
        # WHEN its main thread holds the GIL in a C call
        go.touch()
        wait_until(lambda: not go.exists(), 10, "the program did not take the go file")

        # THEN the node route still answers, with the stack read from outside
        def from_outside() -> dict | None:
            [(_, _, b)] = nodefan.split(client.post("/v1/node/fanout", json=ask).json())
            return b if b.get("source") == "out-of-process" else None

        bt = wait_until(from_outside, 6, "the node route never answered from outside")
        assert [f["func"] for f in _main(bt)["frames"][:2]] == ["spin_in_c", "hold_gil"]
