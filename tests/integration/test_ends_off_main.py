"""An agent stopped from another thread (an eval, `probe inject` detaching) cannot undo its
signal hooks: only the main thread may. It used to close its wakeup pipe anyway, leaving the
signal module's wakeup fd naming a closed descriptor: the next file to get that number took a
byte per signal, and the next agent's start failed ("the fd must be in non-blocking mode")."""

from __future__ import annotations

import os
import signal
import stat
import threading
import time

import pytest


def _wakeup_fd() -> int:
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd


def test_stopped_off_the_main_thread_signals_still_work_and_the_next_agent_takes_over(
        make_agent, tmp_path):
    import probe_agent

    if _wakeup_fd() != -1:
        pytest.skip("the wakeup fd is someone else's here: the agent leaves it alone")
    before = signal.getsignal(signal.SIGINT)
    # GIVEN an agent whose end hooks own the wakeup fd and the SIGINT handler
    make_agent()
    pipe = _wakeup_fd()
    assert pipe != -1
    # WHEN it is stopped from another thread, and the job opens a file right after
    stopper = threading.Thread(target=probe_agent.stop)
    stopper.start()
    stopper.join(30)
    with open(tmp_path / "data.bin", "wb") as f:
        # THEN the wakeup fd still names the agent's pipe, not the job's new file
        assert _wakeup_fd() == pipe and stat.S_ISFIFO(os.fstat(pipe).st_mode)
        assert f.fileno() != pipe
        # AND Ctrl-C still reaches the job's own handler (KeyboardInterrupt), recorded by no one
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
            time.sleep(1)
        assert os.path.getsize(tmp_path / "data.bin") == 0
    # AND the next agent, started from the main thread, takes the hooks over, and its stop
    # gives back what the first one found
    make_agent()
    assert _wakeup_fd() not in (-1, pipe)
    probe_agent.stop()
    assert _wakeup_fd() == -1
    assert signal.getsignal(signal.SIGINT) is before
    assert not any(t.name == "probe-ends-orphan" for t in threading.enumerate())
