"""Merge per-rank torch.profiler (Kineto) Chrome traces into one Perfetto/Chrome trace, streaming.

Memory: a rank's trace can be hundreds of MB, and ``json.load`` of that takes several times as
much. Each file is read in 1 MiB chunks and decoded one event at a time (``JSONDecoder
.raw_decode`` on a sliding buffer), and each event is written out at once, so memory stays at a
chunk plus the largest single event, whatever the number of ranks.

Layout: one process per rank (``pid`` = rank, ``process_name`` "rank N", sorted by rank). CPU
threads keep their thread ids; device rows (Kineto gives each GPU its own pid) become threads
``GPU d stream s`` of the rank's process. Flow ids (CPU -> GPU arrows) are made unique per rank.

Clock: Kineto writes ``ts`` in microseconds from ``baseTimeNanoseconds``, which is wall-clock
(epoch) time on the rank's host, so ``ts + base/1000`` is the event's epoch time there. Each
rank's host clock is corrected by ``clock_offset_s`` (the agent's ``time.time()`` minus the CLI's
at the same moment, estimated from the round trip of a request, NTP style: error <= RTT/2), and
the result is shifted so that 0 is the earliest window start of all ranks. Ranks on one host
share a clock, so their offsets are equal up to the round-trip noise.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from ..output_files import output_file, private_dir
from .op_stats import OpStats

CHUNK = 1 << 20
#: Inputs larger than this are converted by several processes (merge_traces' ``workers``).
PARALLEL_BYTES = 16 << 20
#: Operators kept per rank for the CLI's table (op_stats.py).
TOP_OPS = 25
_WS = " \t\r\n"
#: Device rows become threads of the rank's process: tid = _DEVICE_TID + device * 1000 + stream.
_DEVICE_TID = 1_000_000_000
#: Flow ids of rank r are offset by r * _FLOW_SPAN so ranks never share an arrow.
_FLOW_SPAN = 1 << 40
_KINETO_PROCESS_META = ("process_name", "process_labels", "process_sort_index")


class TraceFormatError(ValueError):
    """A file that is not a Chrome trace object with a ``traceEvents`` array."""


class _Chunks:
    """A sliding text buffer over a file, for raw_decode one value at a time."""

    def __init__(self, f: IO[str]) -> None:
        self.f, self.buf, self.pos, self.eof = f, "", 0, False
        self.dec = json.JSONDecoder()

    def _fill(self) -> bool:
        chunk = self.f.read(CHUNK)
        if not chunk:
            self.eof = True
            return False
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next non-blank character ('' at the end of the file)."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _WS:
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._fill():
                return ""

    def take(self, ch: str) -> None:
        if self.peek() != ch:
            got = self.buf[self.pos:self.pos + 20] or "the end of the file"
            raise TraceFormatError(f"expected {ch!r} at {got!r}")
        self.pos += 1

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                v, end = self.dec.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if self._fill():
                    continue
                raise TraceFormatError(f"bad JSON: {e}") from None
            # A number at the buffer's end may continue in the next chunk.
            if end == len(self.buf) and not self.eof and self._fill():
                continue
            self.pos = end
            return v


def read_trace(f: IO[str]) -> Iterator[tuple[str, Any]]:
    """Yield ``("key", (name, value))`` for top-level entries and ``("event", dict)`` for each
    trace event, in file order."""
    c = _Chunks(f)
    c.take("{")
    while c.peek() != "}":
        key = c.value()
        c.take(":")
        if key == "traceEvents":
            c.take("[")
            while c.peek() != "]":
                yield "event", c.value()
                if c.peek() == ",":
                    c.pos += 1
                elif c.peek() != "]":
                    raise TraceFormatError("expected ',' or ']' between trace events")
            c.take("]")
        else:
            yield "key", (key, c.value())
        if c.peek() == ",":
            c.pos += 1
        elif c.peek() not in ("}", ""):
            raise TraceFormatError("expected ',' or '}' between top-level entries")


@dataclass
class RankTrace:
    """One rank's downloaded trace and what the merge needs to place it."""

    rank: int
    path: str
    pid: int | None = None  # the rank's OS pid: its CPU rows; other pids are devices
    clock_offset_s: float = 0.0  # the rank host's clock minus the CLI's
    window_start: float | None = None  # epoch seconds (rank's clock) of the window start
    host: str | None = None


@dataclass
class MergeReport:
    path: str
    bytes: int = 0
    origin_epoch_s: float = 0.0
    events: dict[int, int] = field(default_factory=dict)
    steps: dict[int, list[str]] = field(default_factory=dict)
    #: Per rank: the operators with the most self time (op_stats.OpStats.top).
    ops: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def merge_traces(traces: list[RankTrace], out_path: str, workers: int = 1,
                 overwrite: bool = False) -> MergeReport:
    """Write one Chrome trace of every rank to ``out_path`` (atomically); see the module doc.

    Args:
        workers: ranks converted in parallel, each by a process of its own into a part file
            (decoding and encoding JSON is CPU-bound Python); the parts are then copied into
            the output in rank order. Only for inputs over ``PARALLEL_BYTES`` (a spawned worker
            costs a Python start-up); 1 converts them here, one after the other.
    """
    starts = [t.window_start - t.clock_offset_s for t in traces if t.window_start is not None]
    origin_s = min(starts) if starts else 0.0
    report = MergeReport(out_path, origin_epoch_s=origin_s)
    # The per-rank parts live in a private directory: a name beside -o could be a planted link.
    scratch = private_dir(out_path)
    jobs = [(t, origin_s, os.path.join(scratch, f"rank{t.rank}.part"))
            for t in sorted(traces, key=lambda t: t.rank)]
    try:
        size = sum(os.path.getsize(t.path) for t in traces)
        if workers > 1 and len(jobs) > 1 and size > PARALLEL_BYTES:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawn, not fork: the CLI has HTTP threads, and a fork copies their locks
            with ProcessPoolExecutor(min(workers, len(jobs)),
                                     mp_context=multiprocessing.get_context("spawn")) as pool:
                done = list(pool.map(_convert_rank, jobs))
        else:
            done = [_convert_rank(j) for j in jobs]
        with output_file(out_path, overwrite=overwrite) as out:
            out.write('{"traceEvents":[\n')
            for i, (_, _, part) in enumerate(jobs):
                if i:
                    out.write(",\n")
                with open(part, encoding="utf-8") as f:
                    shutil.copyfileobj(f, out, CHUNK)
            meta = {"probe": {
                "origin_epoch_s": origin_s,
                "clock": "ts = kineto ts + baseTimeNanoseconds/1000 - clock_offset - origin (us)",
                "ranks": {str(t.rank): {"host": t.host, "pid": t.pid,
                                        "clock_offset_s": t.clock_offset_s} for t in traces},
            }}
            out.write('\n],"displayTimeUnit":"ms","otherData":' + json.dumps(meta) + "}\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for r, n, steps, ops, notes in done:
        report.events[r], report.steps[r], report.ops[r] = n, steps, ops
        report.notes += notes
    report.bytes = os.path.getsize(out_path)
    return report


def _convert_rank(job: tuple[RankTrace, float, str]) -> tuple[int, int, list[str], list[Any],
                                                                list[str]]:
    """One rank's events, placed, into the part file; (rank, events, steps, top ops, notes).
    Its events are never empty: the rank's own process metadata comes first."""
    t, origin_s, part = job
    report = MergeReport(part)
    enc = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode
    with open(part, "w", encoding="utf-8") as out:
        first = True
        for ev in _rank_events(t, origin_s, report):
            out.write(("" if first else ",\n") + enc(ev))
            first = False
    r = t.rank
    return r, report.events[r], report.steps[r], report.ops[r], report.notes


def _rank_events(t: RankTrace, origin_s: float, report: MergeReport) -> Iterator[dict[str, Any]]:
    r = t.rank
    yield {"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}}
    yield {"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0,
           "args": {"sort_index": r}}
    if t.host or t.pid:
        yield {"ph": "M", "name": "process_labels", "pid": r, "tid": 0,
               "args": {"labels": f"{t.host or '?'} pid {t.pid or '?'}"}}
    base_us: float | None = None
    n = 0
    steps: list[str] = []
    stats = OpStats()
    with open(t.path, encoding="utf-8") as f:
        for what, item in read_trace(f):
            if what == "key":
                if item[0] == "baseTimeNanoseconds":
                    base_us = float(item[1]) / 1e3
                continue
            if base_us is None:
                base_us = 0.0
                report.notes.append(f"rank {r}: its trace has no baseTimeNanoseconds before "
                                    "its events; its times are taken as epoch microseconds")
            ev = _place(item, t, base_us - (t.clock_offset_s + origin_s) * 1e6)
            if ev is None:
                continue
            if ev.get("ph") == "X" and str(ev.get("name", "")).startswith("ProfilerStep#"):
                steps.append(ev["name"])
            stats.add(ev)
            n += 1
            yield ev
    report.events[r] = n
    report.steps[r] = steps
    report.ops[r] = stats.top(TOP_OPS)


def _place(ev: dict[str, Any], t: RankTrace, shift_us: float) -> dict[str, Any] | None:
    pid = ev.get("pid")
    # an event of another process id is the profiler's device lane (kineto: pid = device index)
    device = pid if isinstance(pid, int) and t.pid is not None and pid != t.pid else None
    on_cpu = device is None
    if ev.get("ph") == "M":
        if ev.get("name") in _KINETO_PROCESS_META:
            return None  # replaced by the rank's own process metadata
        if not on_cpu and ev.get("name") == "thread_name":
            ev["args"] = {"name": f"GPU {pid} {ev.get('args', {}).get('name', '')}".strip()}
    if not on_cpu:
        tid = ev.get("tid")
        ev["tid"] = _DEVICE_TID + (device or 0) * 1000 + (tid if isinstance(tid, int) else 0)
    ev["pid"] = t.rank
    ts = ev.get("ts")
    if isinstance(ts, (int, float)):
        ev["ts"] = round(ts + shift_us, 3)
    if "id" in ev and isinstance(ev["id"], int) and ev.get("ph") in ("s", "t", "f"):
        ev["id"] = ev["id"] + t.rank * _FLOW_SPAN
    return ev
