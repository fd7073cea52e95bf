"""`probe backtrace` answers in every state of a live rank (issue 20, item 4).

Real processes: ``tests/programs/watchdog_train.py`` (a torch loop with its agent and watchdog),
signalled for real (SIGSTOP, SIGKILL of the watchdog), and the real CLI in a subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.procs import kill_all, probe, require_pyspy, spawn, wait_json
from tests.e2e.test_cluster import torchrun_job
from tests.support import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

#: Blocks the agent's event loop (found as the one running asyncio loop in the rank) for
#: ``WEDGE_S`` from ``DELAY_S`` on: a route that made a blocking call would do the same. The
#: delay lets this eval's own answer leave first. time.sleep releases the GIL, so training and
#: its heartbeat go on: the "wedged loop, heartbeat alive" state.
WEDGE = """import asyncio, gc, time
loops = [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running()]
for loop in loops:
    loop.call_soon_threadsafe(loop.call_later, {delay}, time.sleep, {wedge})
len(loops)"""


@pytest.fixture
def train_rank(tmp_path: Path):
    """``start(**env)`` -> the rank's ready info; killed (with its watchdogs) at teardown."""
    procs = []

    def start(**env: str) -> dict:
        ready = tmp_path / "ready.json"
        proc = spawn("watchdog_train.py", ["--ready-file", str(ready)], tmp_path / "run",
                     PROBE_WATCHDOG="1", PROBE_WATCHDOG_GRACE_S="5", **env)
        procs.append(proc)
        return wait_json(ready, proc, timeout=60)

    yield start
    for proc in procs:
        try:
            os.kill(proc.pid, signal.SIGCONT)  # a stopped rank would not die of SIGTERM
        except OSError:
            pass
        kill_all(proc, tmp_path / "run")


def _target(info: dict) -> str:
    return info["url"].removeprefix("http://")


def _proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: _proc_state(pid) == "T", 5, "the rank never showed state T")


def test_stopped_rank_answers_through_pyspy_nonblocking(train_rank, tmp_path):
    require_pyspy()
    # GIVEN a training rank that someone stopped (kill -STOP, a Ctrl-Z)
    info = train_rank()
    pid = info["pid"]
    _stop(pid)
    # WHEN the operator asks for its backtrace
    res = probe("-t", _target(info), "backtrace", run_dir=tmp_path / "run", timeout=30)
    # THEN it answers with the Python frames, and says the rank is stopped and how to resume it
    assert res.returncode == 0, res.stderr
    assert "train_forever" in res.stdout and "out-of-process via py-spy" in res.stdout, res
    assert f"resume it with `kill -CONT {pid}`" in res.stderr, res.stderr
    # AND other routes say the same at once, not that a C call holds the GIL
    r = httpx.get(f"{info['url']}/v1/info", timeout=10).json()
    assert r["status"] == 504 and "stopped" in r["error"] and "kill -CONT" in r["error"], r
    # AND once resumed, the in-process route answers again
    os.kill(pid, signal.SIGCONT)
    body = wait_until(
        lambda: (b := httpx.get(f"{info['url']}/v1/backtrace", timeout=10).json())
        ["source"] == "in-process" and b, 10, "the in-process route did not come back")
    assert body["ok"]


def test_stopped_rank_without_pyspy_answers_from_proc(train_rank, tmp_path):
    """faulthandler needs the rank to run its signal handler, which a stopped rank does not:
    /proc still says where each thread waits in the kernel."""
    info = train_rank(PROBE_WATCHDOG_READER="faulthandler")
    pid = info["pid"]
    _stop(pid)
    body = httpx.get(f"{info['url']}/v1/backtrace", timeout=10).json()
    assert body["ok"] and body["state"] == "stopped" and body["route"] == "proc", body
    assert f"kill -CONT {pid}" in body["stopped"] and "PROBE_WATCHDOG_READER" in body["reason"]
    main = next(t for t in body["threads"] if t["is_main"])
    assert main["state"] == "T" and main["frames"][0]["frame_type"] == "Native", main


def test_wedged_event_loop_with_live_heartbeat(train_rank, tmp_path):
    # GIVEN a rank whose agent event loop is blocked while training (and its heartbeat) go on
    info = train_rank()
    wedge = WEDGE.format(delay=0.5, wedge=20)
    r = httpx.post(f"{info['url']}/v1/eval", json={"code": wedge}, timeout=30).json()
    assert r.get("result") == "1", r
    body = wait_until(
        lambda: (b := httpx.get(f"{info['url']}/v1/backtrace", timeout=10).json())
        ["source"] == "out-of-process" and b, 10, "the event loop never wedged")
    assert body["heartbeat_age_s"] < 1.0, body  # training runs: not a held GIL
    # WHEN the operator runs `probe backtrace` (discovery first, then the stacks)
    res = probe("-t", _target(info), "backtrace", run_dir=tmp_path / "run", timeout=30)
    # THEN it answers (before issue 20: "did not answer within 5 s", exit 1)
    assert res.returncode == 0, res.stderr
    assert "train_forever" in res.stdout and "out-of-process" in res.stdout, res
    # AND discovery itself answers from the watchdog's last known ranks, within its deadline
    ranks = httpx.get(f"{info['url']}/v1/ranks", timeout=10).json()
    assert ranks["ok"] and ranks["cached"] is True and ranks["ranks"][0]["pid"] == info["pid"]
    # AND the owner's other routes get a 504 that says why within 1.5 deadlines (1 s here),
    # instead of no answer at all
    for method, path, body in (("GET", "/v1/info", None),
                               ("POST", "/v1/query", {"sql": "SELECT 1"})):
        t0 = time.monotonic()
        r = httpx.request(method, f"{info['url']}{path}", json=body, timeout=30)
        took = time.monotonic() - t0
        assert r.status_code == 504 and r.json()["loop_wedged"] is True, (path, r.text)
        assert "event loop" in r.json()["error"] and took < 3.0, (path, took)


def test_wedged_target_still_reaches_the_other_ranks(tmp_path):
    """Two ranks under torchrun: rank 0's loop is wedged; `probe -t rank0 backtrace` still
    shows both (rank 0 out-of-process, rank 1 through the watchdog's last known ranks)."""
    env = {"PROBE_WATCHDOG": "1", "PROBE_WATCHDOG_GRACE_S": "5"}
    try:
        with torchrun_job(tmp_path, "toy_train.py", 2, env=env) as (_proc, infos):
            url = infos[0]["url"]
            # GIVEN discovery through rank 0's watchdog lists both ranks (it keeps that answer)
            wait_until(lambda: len(httpx.get(f"{url}/v1/ranks", timeout=10).json()["ranks"]) == 2,
                       30, "rank 1 was never discovered")
            # WHEN rank 0's event loop wedges
            r = httpx.post(f"{url}/v1/eval", json={"code": WEDGE.format(delay=0.5, wedge=20)},
                           timeout=30).json()
            assert r.get("result") == "1", r
            wait_until(lambda: httpx.get(f"{url}/v1/ranks", timeout=10).json().get("cached"), 10,
                       "rank 0's event loop never wedged")
            # THEN `probe backtrace` through rank 0 answers for both ranks
            res = probe("-t", url.removeprefix("http://"), "--json", "backtrace",
                        run_dir=tmp_path / "run", timeout=30)
            assert res.returncode == 0, res.stderr
            bodies = {b["rank"]: b for b in json.loads(res.stdout)}
            assert sorted(bodies) == [0, 1], res.stdout[:2000]
            assert bodies[0]["source"] == "out-of-process" and bodies[1]["source"] == "in-process"
    finally:
        kill_all_watchdogs(tmp_path / "run")


def kill_all_watchdogs(run_dir: Path) -> None:
    for rec in run_dir.glob("*.watchdog.json") if run_dir.exists() else []:
        try:
            os.kill(int(json.loads(rec.read_text())["watchdog_pid"]), signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            pass


def _watchdog_pid(run_dir: Path, pid: int) -> int | None:
    try:
        return json.loads((run_dir / f"{pid}.watchdog.json").read_text())["watchdog_pid"]
    except (OSError, ValueError, KeyError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_watchdog(run_dir: Path, pid: int) -> int:
    """SIGKILL the rank's watchdog; its pid."""
    old = _watchdog_pid(run_dir, pid)
    assert old is not None
    os.kill(old, signal.SIGKILL)
    return old


def _restarted(run_dir: Path, pid: int, old: int, url: str | None = None,
               count: int = 0) -> int:
    """The new watchdog's pid, once it is alive and, given ``url``, once the agent has counted
    restart ``count``: a watchdog killed before it said "ready" is a failed restart, not one
    (on a loaded machine the test could otherwise kill it mid-start)."""
    def new() -> int | None:
        w = _watchdog_pid(run_dir, pid)
        if w in (None, old) or not _alive(w):
            return None
        if url is not None:
            try:
                restarts = httpx.get(f"{url}/v1/info", timeout=5).json()["watchdog"]["restarts"]
            except (httpx.HTTPError, KeyError, ValueError):
                return None
            if restarts < count:
                return None
        return w

    return wait_until(new, 15, "the watchdog was not restarted")


def test_killed_watchdog_is_restarted_and_probe_info_says_so(train_rank, tmp_path):
    run = tmp_path / "run"
    # GIVEN a rank whose watchdog is SIGKILLed
    info = train_rank()
    old = _kill_watchdog(run, info["pid"])
    # WHEN the agent notices, THEN a new watchdog serves the same sockets
    _restarted(run, info["pid"], old)
    res = probe("-t", _target(info), "backtrace", run_dir=run, timeout=30)
    assert res.returncode == 0 and "train_forever" in res.stdout, res
    # AND `probe info` says it was restarted, and why it died
    res = probe("-t", _target(info), "info", run_dir=run, timeout=30)
    assert res.returncode == 0, res.stderr
    assert "rank 0: its watchdog was restarted 1 time (last: killed by SIGKILL" in res.stderr, res
    # AND it is the out-of-process reader again, not the in-process fallback
    wd = httpx.get(f"{info['url']}/v1/info", timeout=10).json()["watchdog"]
    assert wd["restarts"] == 1 and wd["in_process_fallback"] is False, wd


def test_the_watchdog_waits_for_a_heap_walk_and_a_stopped_one_is_taken_over(train_rank,
                                                                           tmp_path):
    """One rank for two findings (suite time). Before, `probe memory --tensors` on a large heap
    held the GIL longer than the watchdog's deadline, and the watchdog answered 504 "GIL held"
    instead of the census it had asked for: the agent now says in its heartbeat that it is
    busy on purpose. And a SIGSTOPped watchdog kept the rank's sockets, the agent taking over
    only from a dead one: every request waited in the backlog for good."""
    run = tmp_path / "run"
    info = train_rank(PROBE_BACKTRACE_DEADLINE_MS="100")
    with httpx.Client(base_url=info["url"], timeout=60) as c:
        # GIVEN a heap large enough that a walk outlasts the 100 ms deadline: 3 million objects
        # more each round. Empty lists, not dicts: the collector untracks a dict of atoms, so a
        # heap of `{}` never reached gc.get_objects() and the walk stayed at ~85 ms however big.
        # The collector is off meanwhile: each full collection of millions of lists holds the
        # GIL 0.2 s, past the deadline, and a 504 "GIL held" then is right, but not this test
        answers: list[httpx.Response] = []
        for size in (3_000_000, 6_000_000, 9_000_000, 12_000_000):
            for _ in range(20):  # a 504 here (a held GIL) is fine: that eval still runs
                c.post("/v1/eval", json={"code": (
                    "import builtins, gc\ngc.disable()\n"
                    "builtins.probe_heap = getattr(builtins, 'probe_heap', [])\n"
                    "builtins.probe_heap += [[] for _ in range(150_000)]")})

            def heap(size: int = size) -> bool:
                r = c.post("/v1/eval", json={"code": "import builtins\n"
                                             "len(getattr(builtins, 'probe_heap', ()))"})
                return r.status_code == 200 and int(r.json()["result"]) >= size

            wait_until(heap, 60, "the heap was never made")
            # WHEN the tensor census walks it, through the watchdog
            answers = [c.get("/v1/memory/tensors", params={"top": 3}) for _ in range(6)]
            # THEN a census that outlasts the deadline is answered, not refused as a held GIL.
            # A 504 before a census began is allowed: with millions of objects alive the
            # rank's Python can stall past 100 ms on its own (seen once: heartbeat 0.164 s old
            # when the request came); a watchdog that refused the census itself would never
            # give a 200 with census_ms above the deadline
            assert all(a.status_code in (200, 504) for a in answers), \
                [a.text[:300] for a in answers]
            answers = [a for a in answers if a.status_code == 200]
            if answers and max(a.json()["census_ms"] for a in answers) > 100:
                break  # it outlasted the deadline: what this test needs
        assert answers and max(a.json()["census_ms"] for a in answers) > 100, \
            [a.json() for a in answers]
        c.post("/v1/eval", json={"code": "import builtins, gc\n"
                                     "del builtins.probe_heap\ngc.enable()"})
    old = _watchdog_pid(run, info["pid"])
    assert old is not None
    # WHEN someone stops the watchdog (kill -STOP)
    os.kill(old, signal.SIGSTOP)
    # THEN the agent kills it and a new one serves the same sockets, within seconds
    _restarted(run, info["pid"], old, info["url"], 1)
    res = probe("-t", _target(info), "backtrace", run_dir=run, timeout=30)
    assert res.returncode == 0 and "train_forever" in res.stdout, res
    wd = httpx.get(f"{info['url']}/v1/info", timeout=10).json()["watchdog"]
    assert wd["last_death"].startswith("stopped (SIGSTOP"), wd


def test_watchdog_that_keeps_dying_is_replaced_by_in_process_serving(train_rank, tmp_path):
    from probe_agent.serving.watchdog_restarts import MAX_RESTARTS

    run = tmp_path / "run"
    info = train_rank()
    # GIVEN a watchdog killed each time it comes back, MAX_RESTARTS times
    for n in range(1, MAX_RESTARTS + 1):
        _restarted(run, info["pid"], _kill_watchdog(run, info["pid"]), info["url"], n)
    # WHEN it is killed once more
    _kill_watchdog(run, info["pid"])

    # THEN the agent serves its public sockets itself, and says so
    def fallback() -> dict | None:
        try:
            body = httpx.get(f"{info['url']}/v1/info", timeout=5).json()
        except httpx.HTTPError:
            return None
        return body if body.get("watchdog", {}).get("gave_up") else None

    wd = wait_until(fallback, 15, "the in-process fallback never answered")["watchdog"]
    assert wd["in_process_fallback"] is True and wd["restarts"] == MAX_RESTARTS, wd
    res = probe("-t", _target(info), "backtrace", run_dir=run, timeout=30)
    assert res.returncode == 0 and "train_forever" in res.stdout, res
    res = probe("-t", _target(info), "info", run_dir=run, timeout=30)
    assert "it kept dying, so the agent serves in-process now" in res.stderr, res
