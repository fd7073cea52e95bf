"""The agent's own frames are hidden from the user's threads in every stack view (issue 17):
py-spy's and faulthandler's out-of-process stacks (watchdog) and the CLI's rendering."""

from __future__ import annotations

from probe_agent.watchdog.reader import parse_faulthandler, thread_from_pyspy
from probe_cli.render.stacks import stack_key

HOT = "/venv/lib/python3.11/site-packages/probe_agent/collectors/tracer/trace_hot.py"


def pyspy_thread(name: str) -> dict:
    return {"thread_id": 7, "os_thread_id": 42, "thread_name": name, "owns_gil": True,
            "frames": [
                {"name": "forward", "filename": "/job/model.py", "line": 10},
                {"name": "native_call", "filename": HOT, "line": 160},
                {"name": "call", "filename": "", "module": "/c/probe_trace_native_ab.so"},
                {"name": "train", "filename": "/job/train.py", "line": 88}]}


def test_pyspy_stacks_drop_agent_frames_and_count_depth_again():
    t = thread_from_pyspy(pyspy_thread("MainThread"), pid=42)
    assert [(f["depth"], f["func"]) for f in t["frames"]] == [(0, "forward"), (1, "train")]
    # an agent thread (asked for with --all) keeps its frames
    agent = thread_from_pyspy(pyspy_thread("probe-agent.http"), pid=1)
    assert len(agent["frames"]) == 4


def test_faulthandler_stacks_drop_agent_frames():
    text = (f'Current thread 0x000000000000002a (most recent call first):\n'
            f'  File "/job/model.py", line 10 in forward\n'
            f'  File "{HOT}", line 160 in native_call\n'
            f'  File "/job/train.py", line 88 in <module>\n')
    [t] = parse_faulthandler(text, {42: "MainThread"})
    assert [f["func"] for f in t["frames"]] == ["forward", "<module>"]
    assert t["is_main"]


def test_cli_rendering_hides_agent_frames_of_an_older_agent():
    body = {"ok": True, "rank": 0, "threads": [{
        "thread_id": 1, "thread_name": "MainThread", "is_main": True, "is_agent": False,
        "frames": [{"depth": 0, "func": "forward", "file": "/job/model.py", "lineno": 10},
                   {"depth": 1, "func": "native_call", "file": HOT, "lineno": 160},
                   {"depth": 2, "func": "train", "file": "/job/train.py", "lineno": 88}]}]}
    assert [k[0] for k in stack_key(body)] == ["forward", "train"]


def test_the_native_builder_thread_is_the_agents_in_every_stack_view():
    """`probe backtrace` listed ``Thread … (probe-native-build)`` with is_agent false."""
    import threading

    from probe_agent.collectors.stacks import snapshot

    # GIVEN a live thread named as the C++ hot path's builder
    stop = threading.Event()
    th = threading.Thread(target=stop.wait, name="probe-native-build", daemon=True)
    th.start()
    try:
        # THEN the in-process snapshot hides it from the user's threads, and marks it with --all
        assert "probe-native-build" not in [s.thread_name for s in snapshot()]
        mine = [s for s in snapshot(include_agent=True) if s.thread_name == "probe-native-build"]
        assert len(mine) == 1 and mine[0].is_agent
    finally:
        stop.set()
        th.join(5)
    # AND so do the watchdog's out-of-process readers (py-spy, faulthandler)
    assert thread_from_pyspy(pyspy_thread("probe-native-build"), pid=1)["is_agent"]
    [t] = parse_faulthandler('Thread 0x0000000000000007 (most recent call first):\n'
                             '  File "/x/trace_native.py", line 1 in _load\n',
                             {7: "probe-native-build"})
    assert t["is_agent"]
