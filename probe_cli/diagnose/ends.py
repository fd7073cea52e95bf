"""How each rank of a dead job ended, first to go wrong first, and what the copy lacks. Pure:
from a post-mortem JobCopy's records (transport/postmortem.py) to lines."""

from __future__ import annotations

import time
from typing import Any

#: A copy written longer than this many refresh periods before the death is called old.
STALE_PERIODS = 1.5


def describe_end(end: dict[str, Any], death: dict[str, Any]) -> str:
    """One phrase: the watchdog's account when there is one (it saw the exit status), else the
    rank's own, else "killed (no trace)"."""
    exit_ = death.get("exit") or {}
    own = end.get("kind")
    status = (f"; killed by {exit_.get('signal_name') or exit_['signal']}" if exit_.get("signal")
              else f"; exit code {exit_['code']}" if exit_.get("code") is not None else "")
    if own == "signal":
        sender = end.get("sender")
        return (f"{end.get('signal_name')} received" + (f" from {sender}" if sender else
                                                         " (sender unknown)") + status)
    if own in ("exception", "oom", "nan"):
        return f"uncaught {str(end.get('exception'))[:300]}{status}"
    if exit_.get("description"):
        return str(exit_["description"])
    if own == "exit":
        return "exited (no error seen)"
    return "killed (no trace)"


def _when(rank: Any) -> float:
    return float(rank.end.get("at") or rank.death.get("at") or 1e18)


#: What a rank's exception says when its peer's process vanished (gloo, NCCL, the TCP store):
#: the survivor's view of another rank's death, not a cause of its own.
PEER_LOST = ("connection reset by peer", "connection closed by peer", "broken pipe",
             "remote process exited", "peer closed", "connection refused")


def peer_lost(rank: Any) -> bool:
    """The rank died of an exception that says its peer went away."""
    text = str(rank.end.get("exception") or "").lower()
    return rank.end.get("kind") == "exception" and any(p in text for p in PEER_LOST)


def _culprit_first(rank: Any) -> tuple[int, float]:
    """An exception or fatal signal is the news; an exception saying a peer went away is what
    the survivors of that news saw (a SIGKILLed rank's death is seen late, by its watchdog, so
    time alone put the survivor first); a SIGTERM (the launcher tearing the job down after
    another rank failed) and a clean exit come after."""
    kind = rank.end.get("kind")
    exit_ = rank.death.get("exit") or {}
    wrong = kind in ("exception", "oom", "nan") or exit_.get("signal") not in (None, 15, 2)
    return (1 if peer_lost(rank) else 0 if wrong else 2, _when(rank))


def went_wrong(job: Any) -> list[Any]:
    """The ranks whose end was an error (not a clean exit, not the launcher's SIGTERM), those
    that lost a peer after the others."""
    return [r for r in sorted(job.ranks.values(), key=_culprit_first)
            if _culprit_first(r)[0] < 2]


def check_ends(report: Any, job: Any) -> None:
    """doctor on a dead job: each rank whose end was an error is a finding (critical), so the
    summary line counts what the report shows; ranks torn down after it are not."""
    from .findings import CRITICAL, Finding

    wrong = went_wrong(job)
    cause = _first_death(wrong)
    lost = {r.rank for r in wrong if peer_lost(r)}
    for rank in wrong:
        tb = rank.end.get("traceback") or rank.end.get("stack") or \
            next((t.get("frames") for t in (rank.death.get("backtrace") or {}).get("threads")
                  or () if t.get("is_main")), None) or []
        evidence = [f"{f.get('func')} ({f.get('file')}:{f.get('lineno')})" for f in tb[:6]]
        # The rank that died first leads, above the hang check's "a collective failed on the
        # survivors" (score 1e9): that failure is how they saw this death.
        score = (2e9 if lost else 1e8) - _when(rank) / 1e3
        if rank.rank in lost:
            evidence.insert(0, f"lost its peer: {cause}" if cause else "lost its peer")
            score = 1e8 - _when(rank) / 1e3
        report.findings.append(Finding(
            CRITICAL, "ended", f"rank {rank.rank} died: {describe_end(rank.end, rank.death)[:300]}",
            evidence, f"probe -t {job.label} hang", [rank.rank], score=score))
    hang = next((f for f in report.findings if f.check == "hang"), None)
    line = survivors_line(job, hang.ranks) if hang is not None else None
    if hang is not None and line:  # the survivors' failed collective: whose death it was
        hang.evidence.insert(0, line)


def _first_death(wrong: list[Any]) -> str:
    first = [r for r in wrong if not peer_lost(r)]
    return (f"rank {first[0].rank} died first ({describe_end(first[0].end, first[0].death)})"
            if first else "")


def survivors_line(job: Any, culprits: list[int]) -> str | None:
    """When a hang verdict blames only ranks that lost their peer (their collective failed
    because another rank's process vanished): whose death it was. `probe hang` and doctor on a
    copy print it; the verdict itself, built from each copy alone, cannot know."""
    wrong = went_wrong(job)
    lost = {r.rank for r in wrong if peer_lost(r)}
    cause = _first_death(wrong)
    if not (cause and culprits and set(culprits) <= lost):
        return None
    return f"{cause}: the failed collective is the survivors' view of it"


def ends_lines(job: Any, now: float | None = None) -> list[str]:
    """Every rank's end, first to go wrong first, then what is missing from the copy."""
    now = time.time() if now is None else now
    lines = [f"post-mortem of job {job.job} ({job.label}):"]
    for rank in sorted(job.ranks.values(), key=_culprit_first):
        at = _when(rank)
        when = f" at {time.strftime('%H:%M:%S', time.localtime(at))}" if at < 1e18 else ""
        step = rank.meta.get("step")
        if getattr(rank, "running", False):  # a live job's copy: no end to describe
            copied = rank.copied_at
            lines.append(f"  rank {rank.rank}: running (pid {rank.meta.get('pid')}), not ended"
                         + (f"; copy of {time.strftime('%H:%M:%S', time.localtime(copied))}"
                            if copied else "") + (f", step {step}" if step is not None else ""))
            continue
        elsewhere = getattr(rank, "maybe_running_on", None)
        if elsewhere:
            lines.append(f"  rank {rank.rank}: no end recorded; its copy was refreshed "
                         f"{now - float(rank.copied_at or now):.0f} s ago on {elsewhere} "
                         "(still running there?)" + (f", step {step}" if step is not None else ""))
            continue
        # a rank that recorded its own end was copied at it; one killed outright (SIGKILL) was
        # last copied up to a refresh period before: its step is the copy's, not the death's
        # (litgpt: "step 1489" for a rank killed near step 1614)
        at_step = ", step " if rank.end.get("kind") else ", last copied at step "
        lines.append(f"  rank {rank.rank}: {describe_end(rank.end, rank.death)}{when}"
                     + (f"{at_step}{step}" if step is not None else ""))
        # an exception's traceback, or where a signal (torchrun's SIGTERM) found the rank
        for f in (rank.end.get("traceback") or rank.end.get("stack") or [])[:6]:
            lines.append(f"      {f.get('func')} ({f.get('file')}:{f.get('lineno')})")
    lines += missing_lines(job)
    return lines


def evidence_at(rank: Any) -> float | None:
    """The moment the copy's account of ``rank`` describes: its own end (stack and tables are
    copied at it), else the watchdog's last stack (the black box of collectives runs to the
    death), else the last table refresh. A table copy older than that is missing_lines'."""
    for t in (rank.end.get("at"), (rank.death.get("backtrace") or {}).get("taken_at"),
              rank.death.get("at"), rank.copied_at):
        if t:
            return float(t)
    return None


def ages_lines(job: Any) -> list[str]:
    """When each rank's copy was taken, and a warning when a verdict mixes copies taken
    further apart than a refresh period (their states are not one moment of the job)."""
    at = {r.rank: evidence_at(r) for r in job.ranks.values()}
    known = {r: t for r, t in at.items() if t is not None}
    if not known:
        return []
    last = max(known.values())
    parts = [f"rank {r} {time.strftime('%H:%M:%S', time.localtime(t))}"
             + (f" ({last - t:.1f} s older)" if last - t >= 0.05 else "")
             for r, t in sorted(known.items())]
    lines = ["copies taken: " + ", ".join(parts)]
    every = max((float(r.meta.get("every_s") or 0) for r in job.ranks.values()), default=0.0)
    spread = last - min(known.values())
    if len(known) > 1 and spread > max(every, 1.0):
        old = min(known, key=lambda r: known[r])
        lines.append(f"this verdict mixes copies taken {spread:.1f} s apart (rank {old}'s is "
                     "the oldest): the ranks' states are not from one moment")
    return lines


def rank_ranges(ranks: list[int]) -> str:
    """``0-3, 7, 9-1023``: a list of a million ranks stays one short line."""
    spans: list[list[int]] = []
    for r in sorted(ranks):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = [f"{a}-{b}" if b > a else str(a) for a, b in spans[:20]]
    return ", ".join(text) + (f" and {len(spans) - 20} more ranges" if len(spans) > 20 else "")


def missing_lines(job: Any) -> list[str]:
    out = []
    if job.missing:
        out.append(f"  missing: rank(s) {rank_ranges(job.missing)} left no directory "
                   f"(world size {job.world_size})")
    for rank in sorted(job.ranks.values(), key=lambda r: r.rank):
        every = float(rank.meta.get("every_s") or 0)
        # Against the last end the rank saw itself (its hooks copy after it), else its death.
        died, copied = rank.end.get("at") or rank.death.get("at"), rank.copied_at
        if died and copied and every and died - copied > STALE_PERIODS * every:
            out.append(f"  rank {rank.rank}: its copy is {died - copied:.1f} s older than its "
                       f"end (refreshed every {every:g} s)")
        elif not copied:
            out.append(f"  rank {rank.rank}: no table copy was written")
        failing = rank.meta.get("failing_since")
        if isinstance(failing, (int, float)):
            out.append(f"  rank {rank.rank}: its copy failed to refresh from "
                       f"{time.strftime('%H:%M:%S', time.localtime(failing))} on (last error: "
                       f"{str(rank.meta.get('last_error'))[:200]}): rows after that are missing")
        for problem in getattr(rank, "problems", ()):
            out.append(f"  rank {rank.rank}: {problem}")
        lost = rank.meta.get("lost_rows")
        if isinstance(lost, int) and lost > 0:
            out.append(f"  rank {rank.rank}: {lost} rows were trimmed by the agent's retention "
                       "before a refresh copied them (PROBE_RETENTION_MB, "
                       "PROBE_POSTMORTEM_EVERY_S)")
        if rank.meta.get("truncated") and rank.meta.get("dropped_bytes"):
            out.append(f"  rank {rank.rank}: the copy hit its budget "
                       f"({int(rank.meta.get('budget_bytes', 0)) >> 20} MiB): "
                       f"{int(rank.meta.get('dropped_bytes', 0)) >> 10} KiB of the oldest rows "
                       "were dropped")
    return out


def timeout_line(job: Any, waited: dict[str, Any] | None,
                 mismatch: dict[str, Any] | None = None) -> str | None:
    """"the job was aborted by the collective timeout N s later", when a rank's end says a
    collective timed out; ``waited``: the verdict's waiting collective (its ``age_s``);
    ``mismatch``: the verdict's, when ranks met with different calls (an abort is then the
    backend's check, not a timeout)."""
    if mismatch is not None:
        for rank in sorted(job.ranks.values(), key=_when):
            if (rank.death.get("exit") or {}).get("signal") == 6:
                return (f"rank {rank.rank} was aborted (SIGABRT) by the backend on this "
                        "mismatch instead of hanging (gloo checks the size it receives; NCCL's "
                        "async error handling aborts too)")
        return None
    for rank in sorted(job.ranks.values(), key=_when):
        exit_ = rank.death.get("exit") or {}
        text = f"{rank.end.get('exception') or ''} {exit_.get('description') or ''}"
        age = f" {waited['age_s']:.0f} s later" if waited and waited.get("age_s") else ""
        if "timed out" in text.lower() or "timeout" in text.lower():
            return (f"the job was aborted by the collective timeout{age} (rank {rank.rank}: "
                    f"{describe_end(rank.end, rank.death)[:160].rstrip(';')})")
        if (rank.death.get("exit") or {}).get("signal") == 6:
            # SIGABRT is what the process group does on a collective timeout (NCCL), but not
            # only that: say what is known.
            return (f"rank {rank.rank} was aborted (SIGABRT){age}, as the process group does "
                    "on a collective timeout")
    return None
