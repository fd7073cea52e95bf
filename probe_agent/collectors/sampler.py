"""StackSampler: Python stacks of the rank's threads, sampled in-process at HZ.

What gets captured
------------------
Every ``1/HZ`` seconds, ``sys._current_frames()``: for each Python thread that is not the
agent's own (threads named ``probe-agent.*``), the chain of code objects from the innermost frame
out. A sample is counted under (thread name, stack); frames are named when the session ends
(``qualname (dir/file.py:first line)``), so a sample costs a dict lookup per thread, not string
work. Frames of the agent's own code (its hooks on the training thread: the step clock, the
module tracer's wrappers) are dropped from the stacks, so the graph shows the program.

Cost (bench/bench_profile.py, side by side with ``py-spy record --nonblocking``)
-----------------------------------------------------------------------------
Each sample holds the GIL for the walk, and the training thread must hand it over: at 100 Hz on
a 30 ms CPU step that cost the training thread x1.01-x1.05 in wall time (x1.00-x1.03 in its own
CPU time) over three runs, against x1.00-x1.02 (CPU x0.99-1.00) for py-spy, which reads the
stacks from outside without the GIL. The sampler thread itself used 2-3% of a core, py-spy
12-15%. So `probe flame` uses py-spy where it may read the rank (profiling/pyspy.py), and this
sampler where it may not: no ptrace needed (containers without SYS_PTRACE, Yama), no process.

Wall-clock samples: a thread blocked in ``all_reduce`` or a DataLoader wait is counted where it
waits, which is what a flame graph of a slow step should show.
"""

from __future__ import annotations

import os
import threading
import time
from types import CodeType, FrameType

from ..thread_frames import current_frames
from .stacks import AGENT_THREAD_PREFIXES

#: Threads whose names start with these are the agent's own and are never sampled: its named
#: threads, and the AnyIO worker threads its HTTP server runs blocking route code on.
AGENT_THREADS = (*AGENT_THREAD_PREFIXES, "AnyIO worker thread")
#: Unique stacks kept; samples of further ones are counted under "[other stacks]".
MAX_STACKS = 20_000
AGENT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def frame_label(code: CodeType) -> str:
    path = code.co_filename
    short = "/".join(path.replace("\\", "/").split("/")[-2:]) if "/" in path else path
    name = getattr(code, "co_qualname", code.co_name)
    return f"{name} ({short}:{code.co_firstlineno})"


class StackSampler:
    """Counts (thread, stack) samples; ``run`` samples until ``seconds`` pass or ``stop`` is set.

    Args:
        rate_hz: samples per second; the loop sleeps to absolute ticks, so a slow sample does
            not shift the next ones (a late tick is skipped, not queued).
        hide_dir: frames whose file is under this directory are dropped (the agent's own).
    """

    def __init__(self, rate_hz: float, hide_dir: str = AGENT_DIR) -> None:
        self.rate_hz = rate_hz
        self.hide_dir = hide_dir
        self.counts: dict[tuple[str, tuple[CodeType, ...]], int] = {}
        self.samples = 0
        self.missed_ticks = 0
        self.other = 0
        self.cpu_s = 0.0
        self.elapsed_s = 0.0
        self._names: dict[int, str] = {}
        self._hidden: dict[CodeType, bool] = {}

    def _refresh_names(self) -> None:
        self._names = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}

    def sample_once(self, me: int) -> None:
        names, hidden, counts = self._names, self._hidden, self.counts
        for tid, frame in current_frames().items():
            if tid == me:
                continue
            name = names.get(tid)
            if name is None:
                name = f"thread {tid}"
            elif name.startswith(AGENT_THREADS):
                continue
            codes = []
            f: FrameType | None = frame
            while f is not None:
                code = f.f_code
                hide = hidden.get(code)
                if hide is None:
                    hide = hidden[code] = code.co_filename.startswith(self.hide_dir)
                if not hide:
                    codes.append(code)
                f = f.f_back
            key = (name, tuple(codes))
            n = counts.get(key)
            if n is not None:
                counts[key] = n + 1
            elif len(counts) < MAX_STACKS:
                counts[key] = 1
            else:
                self.other += 1
        self.samples += 1

    def run(self, seconds: float, stop: threading.Event) -> None:
        """Sample on the calling thread (the agent's ``probe-agent.sampler``)."""
        me = threading.get_ident()
        period = 1.0 / self.rate_hz
        c0, t0 = time.thread_time(), time.monotonic()
        end = t0 + seconds
        tick = t0
        self._refresh_names()
        while not stop.is_set():
            now = time.monotonic()
            if now >= end:
                break
            if now < tick:
                if stop.wait(tick - now):
                    break
            if self.samples % 50 == 0:
                self._refresh_names()  # threads come and go (DataLoader pin threads)
            self.sample_once(me)
            tick += period
            late = time.monotonic() - tick
            if late > period:  # skip the ticks we slept through instead of bursting
                skipped = int(late / period)
                self.missed_ticks += skipped
                tick += skipped * period
        self.elapsed_s = time.monotonic() - t0
        self.cpu_s = time.thread_time() - c0

    def folded(self) -> dict[str, int]:
        """``thread;outer frame;...;inner frame`` -> samples (Brendan Gregg's folded format)."""
        out: dict[str, int] = {}
        labels: dict[CodeType, str] = {}
        for (thread, codes), n in self.counts.items():
            parts = [thread.replace(";", ":")]
            for code in reversed(codes):
                label = labels.get(code)
                if label is None:
                    label = labels[code] = frame_label(code).replace(";", ":")
                parts.append(label)
            key = ";".join(parts)
            out[key] = out.get(key, 0) + n
        if self.other:
            out["[other stacks]"] = self.other
        return out
