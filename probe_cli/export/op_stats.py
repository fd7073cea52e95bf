"""Per-operator totals of one rank's profile, computed from its Chrome trace while it is merged.
Stdlib only.

Why here and not in the agent: torch's own totals (``key_averages()``) first parse every event
into Python objects, which held the rank's GIL for 3 s after a 5-step window of a small GPT and
made its training steps up to 11 times slower meanwhile (bench/bench_profile.py). The CLI has
the events anyway.

Self time: for the complete events (``ph: X``) of one thread, a span's self time is its duration
minus that of the spans directly inside it (the nesting of Kineto's CPU operators). Device rows
(kernels, memcpy) are listed by their own names with their device time. Memory: five numbers per
operator event of one rank (``array``), not the events themselves.
"""

from __future__ import annotations

from array import array
from typing import Any

#: Chrome-trace categories counted as host operators, and as device activity.
HOST = frozenset({"cpu_op", "user_annotation", "python_function"})
DEVICE = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


class OpStats:
    def __init__(self) -> None:
        self._names: dict[str, int] = {}
        self._tids: dict[Any, int] = {}
        self.tid = array("q")
        self.ts = array("d")
        self.dur = array("d")
        self.name = array("q")
        self.device = array("b")

    def add(self, ev: dict[str, Any]) -> None:
        """One trace event (ignored unless it is a host operator or device activity)."""
        cat = ev.get("cat")
        if ev.get("ph") != "X" or (cat not in HOST and cat not in DEVICE):
            return
        name = str(ev.get("name", ""))
        if name.startswith("ProfilerStep#"):
            return  # the step spans: their self time is everything between the operators
        ts, dur = ev.get("ts"), ev.get("dur")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            return
        key = (ev.get("pid"), ev.get("tid"))
        self.tid.append(self._tids.setdefault(key, len(self._tids)))
        self.ts.append(float(ts))
        self.dur.append(float(dur))
        self.name.append(self._names.setdefault(name, len(self._names)))
        self.device.append(1 if cat in DEVICE else 0)

    def top(self, n: int) -> list[dict[str, Any]]:
        """The ``n`` names with the most self time (host + device), with calls and totals."""
        names = list(self._names)
        calls = [0] * len(names)
        self_us = [0.0] * len(names)
        total_us = [0.0] * len(names)
        dev_us = [0.0] * len(names)
        order = sorted(range(len(self.ts)), key=lambda i: (self.tid[i], self.ts[i], -self.dur[i]))
        stack: list[tuple[int, float]] = []  # (event index, end) of the open spans
        child = [0.0] * len(self.ts)
        cur_tid = -1
        for i in order:
            k = self.name[i]
            calls[k] += 1
            if self.device[i]:
                dev_us[k] += self.dur[i]
                continue
            total_us[k] += self.dur[i]
            if self.tid[i] != cur_tid:
                stack.clear()
                cur_tid = self.tid[i]
            start, end = self.ts[i], self.ts[i] + self.dur[i]
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack:
                child[stack[-1][0]] += self.dur[i]
            stack.append((i, end))
        for i in range(len(self.ts)):
            if not self.device[i]:
                self_us[self.name[i]] += max(0.0, self.dur[i] - child[i])
        rows: list[dict[str, Any]] = [
            {"name": names[k], "calls": calls[k], "self_us": round(self_us[k], 3),
             "total_us": round(total_us[k], 3), "self_device_us": round(dev_us[k], 3)}
            for k in range(len(names))]
        rows.sort(key=lambda r: (-(r["self_us"] + r["self_device_us"]), r["name"]))
        return rows[:n]
