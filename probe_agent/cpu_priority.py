"""The agent's background work yields the CPU to training: its SQL threads run at nice 10.

A heavy query (a large join: seconds of DuckDB work, which releases the GIL) competes for the
cores with the training threads like any other thread: on a busy 2-core machine it stretched one
step to 0.68 s against a median of 0.08 s. ``SCHED_IDLE`` on the thread that runs it (Linux:
``sched_setscheduler`` on its tid applies to that thread alone) has the kernel run it only on
CPU time no normal thread wants; where that is refused, ``nice 19`` on the thread's tid. Only
threads that do bulk work get it (the SQL pools): a backtrace, a memory
census or an eval still run at the job's own priority, so a busy job still answers them at once.

Two levels, because idle is too little for what an operator waits on. On a machine training
keeps saturated (both cores of this VM, or every core a rank's DataLoader workers use), a thread
at SCHED_IDLE gets almost nothing: a query of 0.1 s took 17-18 s there
(bench/bench_query_priority.py), and `probe doctor`'s ~20 canned queries 48 s. At nice 10
(weight 110 against 1024) the query took 0.3-0.6 s with the median step x1.04-1.18 meanwhile
(x1.9-2.0 at the job's priority, x1.00 at idle); doctor 5.3 s with the job at 81% of its step
rate (docs/decisions/serving.md). So SQL, ad-hoc and canned, runs at ``"nice"``.

Never for work that holds the GIL for long: the holder then runs below the training thread that
waits for it (priority inversion). DuckDB releases the GIL while it executes; Kineto's trace
save and a full ``gc.collect()`` do not, and the profile export at SCHED_IDLE beside two busy
loops held the training thread for minutes (profiling/window.py). So nothing uses ``"idle"``
today; it stays for bulk work that is GIL-free from end to end. An unprivileged
thread cannot go back up (SCHED_IDLE to normal, or to a lower nice, needs RLIMIT_NICE): threads
of one pool keep one level.

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
#: The nice value of the ``"nice"`` level (canned diagnostics).
NICE = 10

_state = threading.local()


def background(level: str = "idle") -> str:
    """Put the calling thread in the background at ``level`` ('idle' or 'nice'), or back to
    normal when ``ENABLED`` is False; what it is now: 'idle' (SCHED_IDLE), 'nice' (nice 10, or
    nice 19 where SCHED_IDLE is refused), 'normal', or 'unchanged' (not possible)."""
    want = level if ENABLED else "normal"
    have = getattr(_state, "mode", "normal")
    if have == want or (want == "idle" and have == "nice19"):
        return "nice" if have == "nice19" else have
    tid = threading.get_native_id()
    try:
        if want == "nice":  # from idle: refused without RLIMIT_NICE (the thread stays idle)
            if have == "idle":
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, NICE)
        elif want == "idle":
            try:
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            except (AttributeError, OSError):
                os.setpriority(os.PRIO_PROCESS, tid, 19)
                want = "nice19"
        else:
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, 0)
    except (AttributeError, OSError) as e:
        log.debug("probe agent: cannot change the priority of thread %d: %s", tid, e)
        return "unchanged"
    _state.mode = want
    return "nice" if want == "nice19" else want


def in_background() -> bool:
    """Whether the calling thread yields the CPU to training now."""
    return getattr(_state, "mode", "normal") in ("idle", "nice", "nice19")
