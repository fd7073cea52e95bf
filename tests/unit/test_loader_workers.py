"""Which DataLoader worker a stuck rank waits for (diagnose/loader_workers.py) and how the hang
verdict and `probe backtrace --children` say it (pure; children shaped as the watchdog sends
them: py-spy's frames, innermost first, the rank's fork-time frames outside _worker_loop)."""

from __future__ import annotations

from probe_cli.diagnose.hang import RankState, diagnose
from probe_cli.diagnose.loader_workers import is_idle, loader_place, own_frames
from probe_cli.render.children import NO_CHILDREN_READ, render_children
from probe_cli.result import RankResult

LIB = "/venv/lib/python3.11/site-packages/torch/utils/data"
PY = "/usr/lib/python3.11"
NOW = 1_000.0
FORKED = [{"func": "start", "file": f"{PY}/multiprocessing/process.py", "lineno": 121},
          {"func": "<module>", "file": "/job/train.py", "lineno": 39}]


def _stack(*inner: dict) -> list[dict]:
    loop = {"func": "_worker_loop", "file": f"{LIB}/_utils/worker.py", "lineno": 374}
    frames = [*inner, loop, *FORKED]
    return [{**f, "depth": i, "frame_type": "Python", "locals": None} for i, f in enumerate(frames)]


def worker(wid: int, pid: int, *inner: dict, route: str = "py-spy") -> dict:
    return {"pid": pid, "name": "pt_data_worker", "state": "S", "kind": "dataloader_worker",
            "worker_id": wid, "route": route, "error": None,
            "threads": [{"thread_id": pid, "thread_name": "MainThread", "is_main": True,
                         "frames": _stack(*inner)}]}


IDLE = ({"func": "poll", "file": f"{PY}/multiprocessing/connection.py", "lineno": 257},
        {"func": "get", "file": f"{PY}/multiprocessing/queues.py", "lineno": 113})
BUSY = ({"func": "read_remote_shard", "file": "/job/data.py", "lineno": 71},
        {"func": "__getitem__", "file": "/job/data.py", "lineno": 65},
        {"func": "fetch", "file": f"{LIB}/_utils/fetch.py", "lineno": 54})
MAIN_WAITS = ({"func": "_try_get_data", "file": f"{LIB}/dataloader.py", "lineno": 1291},
              {"func": "main", "file": "/job/train.py", "lineno": 90})


def test_idle_and_busy_workers_are_told_apart_and_fork_frames_cut():
    idle, busy = worker(0, 10, *IDLE), worker(1, 11, *BUSY)
    assert is_idle(idle) is True and is_idle(busy) is False
    assert [f["func"] for f in own_frames(busy)] == ["read_remote_shard", "__getitem__",
                                                     "fetch", "_worker_loop"]
    # no Python stack (py-spy refused): unknown, not idle
    assert is_idle({**busy, "route": "proc"}) is None


def test_the_one_busy_worker_is_named_with_the_line_it_is_stuck_at():
    place, lines = loader_place((worker(0, 10, *IDLE), worker(1, 11, *BUSY)))
    assert place == ("in the DataLoader, waiting for a batch from DataLoader worker 1 (pid 11), "
                     "stuck in read_remote_shard (data.py:71)")
    assert lines[0] == "DataLoader worker 1 (pid 11), state S, is making a batch:"
    assert "    __getitem__ (data.py:65)" in lines
    assert lines[-1] == "DataLoader worker 0 (pid 10): waits for work (index_queue.get)"


def test_every_worker_idle_or_several_busy_are_said_as_such():
    place, _ = loader_place((worker(0, 10, *IDLE), worker(1, 11, *IDLE)))
    assert place == ("in the DataLoader, waiting for a batch, while its 2 workers wait for work")
    place, _ = loader_place((worker(0, 10, *BUSY), worker(1, 11, *BUSY)))
    assert "workers 0, 1 are each making one" in place
    assert loader_place(()) is None
    assert loader_place(({"pid": 5, "kind": "process", "threads": []},)) is None


def test_hang_verdict_names_the_stuck_worker_of_the_rank_the_others_wait_for():
    def coll(seq, state="done", started=NOW - 60):
        return {"pg": "0", "seq": seq, "op": "all_reduce", "state": state, "start_time": started,
                "callsite": "/job/train.py:47 step", "group_ranks": [0, 1], "is_p2p": False}

    rank0 = RankState(0, frames=MAIN_WAITS[1:], now=NOW,
                      collectives=(coll(11), coll(12, "pending", NOW - 30)))
    rank1 = RankState(1, frames=MAIN_WAITS, collectives=(coll(11),), now=NOW,
                      children=(worker(0, 10, *IDLE), worker(1, 11, *BUSY)))
    v = diagnose([rank0, rank1], min_wait_s=5)
    assert v.culprits == [1]
    assert v.headline == ("HANG: rank 1 never reached all_reduce #12; it is in the DataLoader, "
                          "waiting for a batch from DataLoader worker 1 (pid 11), stuck in "
                          "read_remote_shard (data.py:71). 1 rank waits for it, for 30.0 s")
    assert "    DataLoader worker 1 (pid 11), state S, is making a batch:" in v.details
    # without the children (no watchdog): the old phrase, nothing invented
    v = diagnose([rank0, RankState(1, frames=MAIN_WAITS, collectives=(coll(11),), now=NOW)],
                 min_wait_s=5)
    assert "it is in the DataLoader, waiting for a batch. 1 rank" in v.headline


def test_backtrace_children_text_per_rank():
    body = {"ok": True, "rank": 1, "pid": 4242, "source": "in-process",
            "children": [worker(0, 10, *IDLE), worker(1, 11, *BUSY),
                         {"pid": 12, "name": "sh", "cmdline": "sh -c true", "state": "S",
                          "kind": "process", "worker_id": None, "route": "py-spy",
                          "threads": [], "error": None}]}
    lines = render_children([RankResult(rank=1, url="u", ok=True, data=body),
                             RankResult(rank=0, url="v", ok=True,
                                        data={"ok": True, "rank": 0, "pid": 4241})])
    assert lines[0] == f"Rank 0 (pid 4241): {NO_CHILDREN_READ}"
    text = "\n".join(lines)
    assert "Rank 1 (pid 4242): 3 child processes, read from outside by its watchdog" in text
    assert "  DataLoader worker 1 (pid 11), state S: making a batch" in text
    assert "  DataLoader worker 0 (pid 10), state S: waits for work" in text
    assert "        read_remote_shard (/job/data.py:71)" in text
    assert "(2 frames under _worker_loop: the rank's, copied at fork)" in text
    assert "  child process pid 12 (sh), state S: sh -c true" in text
