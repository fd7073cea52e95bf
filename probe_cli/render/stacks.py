"""Backtraces as text (pure; stdlib only), in py-spy ``dump``'s shape.

One rank, or ``--all``: every rank in full, every thread::

    Rank 0 (node1:4242) http://10.0.0.1:9700
    Thread 140234 (MainThread) [main]
        all_reduce (torch/distributed/distributed_c10d.py:2501)
        train (train.py:88)

Several ranks: main-thread stacks grouped into classes of identical (func, file, line)
sequences, smallest class first: the rank that is not where the others are is the one to
look at, and it comes first.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from probe_protocol.bodies import BacktraceBody
from probe_protocol.envelope import Body

from ..group import group_by, outliers_first, rank_label
from ..result import RankResult
from .text import paint, rank_header

IN_PROCESS = "in-process"


def main_thread(body: Body | None) -> dict[str, Any] | None:
    return BacktraceBody.from_wire(body).main_thread


#: Parts of a frame's file that mark the agent's own code (its package, the tracer's C++
#: extension). Agents hide these frames themselves; an older agent's answer may still carry them.
AGENT_FILES = ("/probe_agent/", "\\probe_agent\\", "probe_trace_native_")


def is_agent_frame(frame: dict[str, Any]) -> bool:
    file = str(frame.get("file") or "")
    return any(part in file for part in AGENT_FILES)


def _frames(thread: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A thread's frames, innermost (depth 0) first; in the user's threads, without the
    agent's own frames (the tracer's call wrapper is not where the job is)."""
    frames = [f for f in (thread or {}).get("frames") or [] if isinstance(f, dict)]
    if not (thread or {}).get("is_agent"):
        frames = [f for f in frames if not is_agent_frame(f)]
    return sorted(frames, key=lambda f: f.get("depth", 0))


def stack_key(body: Body | None) -> tuple[tuple[Any, Any, Any], ...]:
    """The main thread's stack as comparable (func, file, lineno) triples, innermost first."""
    frames = _frames(main_thread(body))
    return tuple((f.get("func"), f.get("file"), f.get("lineno")) for f in frames)


def _locals(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def format_frames(
    frames: Sequence[dict[str, Any]], *, show_locals: bool = False, colour: bool = False
) -> list[str]:
    """``    func (file:line)`` per frame, locals indented under it when asked for."""
    out = []
    for f in frames:
        where = paint(f"({f.get('file')}:{f.get('lineno')})", "dim", colour)
        native = " [native]" if f.get("frame_type") == "Native" else ""
        out.append(f"    {paint(str(f.get('func')), 'green', colour)} {where}{native}")
        if show_locals:
            for name, rep in _locals(f.get("locals")).items():
                out.append(f"        {name} = {rep}")
    return out


def thread_header(thread: dict[str, Any], gil_holder: Any = None, colour: bool = False) -> str:
    """``Thread 123 (MainThread) [main]``; tags: main, agent, gil (holds the GIL)."""
    tags = [
        tag
        for tag, on in (
            ("main", thread.get("is_main")),
            ("agent", thread.get("is_agent")),
            ("gil", gil_holder is not None and thread.get("thread_id") == gil_holder),
        )
        if on
    ]
    text = f"Thread {thread.get('thread_id')} ({thread.get('thread_name')})"
    return paint(text, "bold", colour) + "".join(f" [{t}]" for t in tags)


def source_note(body: Body | None) -> str:
    """``[out-of-process via py-spy; GIL held by thread 7]`` for a stack not read in-process;
    empty for the usual in-process answer (or an agent that does not say)."""
    bt = BacktraceBody.from_wire(body)
    if bt.state == "dead":  # answered by the dead rank's watchdog
        return "[" + "; ".join(dead_facts(body)) + "]"
    if not bt.source or bt.source == IN_PROCESS:
        return ""
    parts = [str(bt.source) + (f" via {bt.route}" if bt.route else "")]
    if bt.gil_holder is not None:
        parts.append(f"GIL held by thread {bt.gil_holder}")
    return "[" + "; ".join(parts) + "]"


def dead_facts(body: Body | None) -> list[str]:
    """``DEAD: killed by signal 9 (SIGKILL)``, the last step, where the last stack came from."""
    bt = BacktraceBody.from_wire(body)
    facts = ["DEAD: " + str((bt.exit or {}).get("description") or "exited")]
    if bt.last_step is not None:
        facts.append(f"last step {bt.last_step}")
    route = (bt.last_backtrace or {}).get("route")
    if route:
        facts.append(f"last stack: {route}")
    return facts


def render_rank_stacks(
    r: RankResult, *, show_locals: bool = False, colour: bool = False
) -> list[str]:
    """One rank in full: its header, then every thread it reported."""
    bt = BacktraceBody.from_wire(r.data)
    out = [rank_header(r, colour, source_note(r.data))]
    gil = bt.gil_holder
    for t in bt.threads:
        out.append(thread_header(t, gil, colour))
        out += format_frames(_frames(t), show_locals=show_locals, colour=colour)
    return out


def render_backtrace(
    results: Sequence[RankResult],
    *,
    show_all: bool = False,
    show_locals: bool = False,
    colour: bool = False,
) -> list[str]:
    """One rank or ``show_all``: every rank in full. Otherwise main-thread classes, outliers
    first, each headed by its ranks in compact form."""
    out: list[str] = []
    if show_all or len(results) == 1:
        for r in results:
            out += [*render_rank_stacks(r, show_locals=show_locals, colour=colour), ""]
        return out[:-1]
    total = len(results)
    groups = outliers_first(group_by(results, lambda r: stack_key(r.data)), lambda r: r.rank)
    for g in groups:
        members = list(g.members)
        head = f"{rank_label([m.rank for m in members])} ({len(members)}/{total} ranks) main thread"
        dead = [m for m in members if BacktraceBody.from_wire(m.data).state == "dead"]
        other = [m for m in members if source_note(m.data) and m not in dead]
        if dead:
            head += f" [{dead_facts(dead[0].data)[0]}: {rank_label([m.rank for m in dead])}]"
        if other:
            source = BacktraceBody.from_wire(other[0].data).source
            head += f" [{source}: {rank_label([m.rank for m in other])}]"
        if show_locals and len(members) > 1:
            head += f" (locals from rank {g.first.rank})"
        out.append(paint(head + ":", "bold", colour))
        frames = _frames(main_thread(g.first.data))
        out += format_frames(frames, show_locals=show_locals, colour=colour) or ["    (no frames)"]
        out.append("")
    return out[:-1]
