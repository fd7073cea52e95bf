"""The two samplers of `probe flame` (issue 16) give the same folded format: the in-process
StackSampler on a real thread, and py-spy's raw output as parse_raw reads it. Stdlib only."""

from __future__ import annotations

import threading
import time

from probe_agent.collectors.sampler import AGENT_DIR, StackSampler
from probe_agent.profiling.pyspy import parse_raw


def busy_leaf(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(200))


def busy_root(stop: threading.Event) -> None:
    busy_leaf(stop)


def test_in_process_sampler_counts_a_threads_stack_and_skips_agent_threads():
    # GIVEN a busy thread and an agent-named one
    stop = threading.Event()
    work = threading.Thread(target=busy_root, args=(stop,), name="worker")
    agent = threading.Thread(target=stop.wait, name="probe-agent.fake")
    work.start()
    agent.start()
    try:
        # WHEN it samples (in windows of 0.3 s until 20 samples: on a loaded machine one window
        # at 200 Hz gave 8, the sampling thread waiting for a core)
        sampler = StackSampler(200)
        cpu, deadline = 0.0, time.monotonic() + 60
        while sampler.samples < 20 and time.monotonic() < deadline:
            sampler.run(0.3, threading.Event())
            cpu += sampler.cpu_s
    finally:
        stop.set()
        work.join()
        agent.join()
    folded = sampler.folded()
    # THEN
    assert sampler.samples >= 20 and cpu > 0
    stacks = [s for s in folded if s.startswith("worker;")]
    assert stacks and all("busy_root (" in s and "busy_leaf (" in s for s in stacks), folded
    assert not any(s.startswith("probe-agent") for s in folded)
    assert all(AGENT_DIR not in s for s in folded)


def test_pyspy_raw_lines_become_the_same_folded_format():
    raw = "\n".join([
        "thread (101): MainThread;<module> (/job/train.py:1);step (/job/train.py:40);"
        f"_on_step ({AGENT_DIR}/clock.py:160);slow (/job/train.py:9) 70",
        "thread (102): probe-agent.writer;run (/x/store.py:3) 50",
        "thread (103): ;run (/x/y.py:3) 5",
        "not a stack line",
    ])
    assert parse_raw(raw) == {
        "MainThread;<module> (job/train.py:1);step (job/train.py:40);slow (job/train.py:9)": 70,
        "thread 103;run (x/y.py:3)": 5,
    }
