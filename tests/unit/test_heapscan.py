"""A heap scan from one thread never breaks a tuple another thread is building.

``tuple(generator)`` grows its tuple in place, which CPython allows only while it holds the only
reference; ``gc.get_objects()`` on another thread holds one more, and the builder fails with
``SystemError: ... bad argument to internal function`` (rank 1 of the demo job died in
``import torch._dynamo`` this way while an eval discovered the script's objects).
"""

from __future__ import annotations

import gc
import threading
import time

import pytest

from probe_agent.heapscan import live_objects


class Marker:
    pass


def _build_tuples(stop: threading.Event, errors: list[BaseException]) -> None:
    def slow() -> object:
        # each item takes a moment, so the other thread often runs mid-tuple
        for i in range(200):
            if i % 20 == 0:
                time.sleep(0)
            yield i

    while not stop.is_set():
        try:
            tuple(slow())
        except SystemError as e:  # what the training thread got
            errors.append(e)
            return


def _race(scan, seconds: float) -> list[BaseException]:
    stop, errors = threading.Event(), []
    builder = threading.Thread(target=_build_tuples, args=(stop, errors))
    builder.start()
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end and not errors:
            scan()
    finally:
        stop.set()
        builder.join()
    return errors


def _naive_scan() -> None:
    kept = []
    for o in gc.get_objects():  # what the discovery and the census did before
        if issubclass(type(o), Marker):
            kept.append(o)


def test_the_naive_scan_breaks_a_tuple_being_built():
    """The hazard is real here: without it the next test would prove nothing."""
    assert _race(_naive_scan, 20.0), "no SystemError in 20 s of racing the naive scan"


def test_live_objects_never_does():
    # GIVEN objects of a type to find, and a thread building tuples from a generator
    keep = [Marker() for _ in range(3)]
    found: list[list[object]] = []
    # WHEN the heap is scanned again and again from this thread
    errors = _race(lambda: found.append(live_objects({"m": (Marker,)})["m"]), 8.0)
    # THEN the builder never fails, and every scan finds the objects
    assert not errors, errors
    assert found and all(len(f) >= 3 and all(k in f for k in keep) for f in found)


def test_tuples_are_never_kept():
    with pytest.raises(ValueError, match="no tuples"):
        live_objects({"t": (tuple,)})
