"""The agent's background work yields the CPU to training: its SQL and export threads run with
the kernel's idle policy.

A heavy query (a large join: seconds of DuckDB work, which releases the GIL) competes for the
cores with the training threads like any other thread: on a busy 2-core machine it stretched one
step to 0.68 s against a median of 0.08 s. ``SCHED_IDLE`` on the thread that runs it (Linux:
``sched_setscheduler`` on its tid applies to that thread alone) has the kernel run it only on
CPU time no normal thread wants; where that is refused, ``nice 19`` on the thread's tid. Only
threads that do bulk work get it (the SQL pool, the profile export): a backtrace, a memory
census or an eval still run at the job's own priority, so a busy job still answers them at once.

A query there waits for CPU time training does not want, so its deadline counts its own CPU
time (store.py, ``_under_deadline``). Threads of the SQL pool are reused: ``background()`` runs
before each task and changes nothing when the thread is already in the wanted state.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

#: Set False to run background work at normal priority (bench/bench_query_priority.py's
#: baseline arm; restoring SCHED_OTHER from SCHED_IDLE needs root or RLIMIT_NICE there).
ENABLED = True

_state = threading.local()


def background() -> str:
    """Put the calling thread in the background (or back, when ``ENABLED`` is False); what it
    is now: 'idle' (SCHED_IDLE), 'nice' (nice 19), 'normal', or 'unchanged' (not possible)."""
    want = "idle" if ENABLED else "normal"
    have = getattr(_state, "mode", "normal")
    if have == want or (want == "idle" and have == "nice"):
        return have
    tid = threading.get_native_id()
    try:
        if want == "idle":
            try:
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            except (AttributeError, OSError):
                os.setpriority(os.PRIO_PROCESS, tid, 19)
                want = "nice"
        else:
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, 0)
    except (AttributeError, OSError) as e:
        log.debug("probe agent: cannot change the priority of thread %d: %s", tid, e)
        return "unchanged"
    _state.mode = want
    return want


def in_background() -> bool:
    """Whether the calling thread yields the CPU to training now."""
    return getattr(_state, "mode", "normal") in ("idle", "nice")
