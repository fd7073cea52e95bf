"""current_frames(): sys._current_frames() with the collector off on 3.11 (CPython gh-106883)."""

from __future__ import annotations

import gc
import sys
import threading

import pytest

from probe_agent import thread_frames
from probe_agent.thread_frames import current_frames


def test_every_thread_is_there_and_the_collector_is_as_it_was():
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="waiter")
    t.start()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            got = current_frames()
            assert gc.isenabled() is enabled
            assert set(got) >= {threading.get_ident(), t.ident}
            assert got[t.ident].f_code.co_name == "wait"
    finally:
        gc.enable()
        stop.set()
        t.join()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 needs no guard")
def test_no_collection_can_start_inside_the_read(monkeypatch):
    # GIVEN a collector that would run at the first allocation (threshold 1)
    seen: list[bool] = []
    real = sys._current_frames

    def spy() -> dict:
        seen.append(gc.isenabled())
        return real()

    monkeypatch.setattr(thread_frames.sys, "_current_frames", spy)
    old = gc.get_threshold()
    gc.set_threshold(1)
    try:
        current_frames()
    finally:
        gc.set_threshold(*old)
    # THEN the read ran with the collector off, and it is on again
    assert seen == [False] and gc.isenabled()
