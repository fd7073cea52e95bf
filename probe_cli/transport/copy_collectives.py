"""A dead rank's collectives as it last saw them: the copied ``python.collectives`` rows, brought
up to its end with what the copy could not hold (pure; transport/postmortem.py reads the files).

Two corrections, each from evidence the rank left:

- **The black box** (``collectives.strip``, probe_agent/collectors/collective_strip.py): the
  explicit calls as they started and ended, written through a shared mapping that outlives a
  rank the backend aborted. A call the copy lacks is added; a call it holds takes the strip's
  state, end and error (the strip saw the call end; the copy may be a refresh older).
- **The rank's own end**: when it died of an exception a collective raised (a timeout, a reset
  connection, a size check), its last collective is the one that raised. gloo's Flight Recorder
  marks a collective whose work failed as completed, so a DDP gradient all-reduce that timed
  out reads "done" in the copy; the end says otherwise, and that row is marked failed with the
  exception. A timed-out call is then a wait the process group's timeout ended (pending to the
  hang verdict, aged on the rank's own clock).
"""

from __future__ import annotations

from typing import Any

#: Words of the errors a collective raises when a peer is gone, late or mismatched (gloo, NCCL).
_COLLECTIVE_ERRORS = ("timed out", "timeout", "connection reset", "connection closed",
                      "closed by peer", "read error", "write error", "collective", "nccl",
                      "gloo", "watchdog caught")


def merge_strip(rows: list[dict[str, Any]], strip: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with the strip's records folded in (matched on group and seq)."""
    if not strip:
        return rows
    at = {(str(r.get("pg")), r.get("seq")): i for i, r in enumerate(rows)
          if not r.get("is_p2p") and r.get("seq") is not None}
    out = [dict(r) for r in rows]
    for rec in strip:
        if rec.get("seq") is None:
            continue
        key = (str(rec.get("pg")), rec.get("seq"))
        state = "done" if rec.get("state") == "issued" else rec.get("state")
        if key in at:
            row = out[at[key]]
            row.update(state=state, end_time=rec.get("end_time"), error=rec.get("error"),
                       callsite=rec.get("callsite") or row.get("callsite"))
            row["source"] = "both" if row.get("source") == "flight_recorder" else row.get(
                "source")
            continue
        out.append({
            "pg": str(rec.get("pg")), "pg_desc": None, "seq": rec.get("seq"),
            "op": rec.get("op"), "is_p2p": False, "shapes": rec.get("shapes") or "[]",
            "dtype": rec.get("dtype"), "start_time": rec.get("start_time"),
            "end_time": rec.get("end_time"), "state": state, "error": rec.get("error"),
            "thread_name": rec.get("thread_name"), "callsite": rec.get("callsite"),
            "source": "strip", "group_ranks": _group_ranks(out, str(rec.get("pg"))),
            "duration": None, "rank": out[0].get("rank") if out else None})
    out.sort(key=lambda r: float(r.get("start_time") or 0.0))
    return out


def _group_ranks(rows: list[dict[str, Any]], pg: str) -> Any:
    for r in reversed(rows):
        if str(r.get("pg")) == pg and r.get("group_ranks"):
            return r["group_ranks"]
    return None


def merge_end_rows(rows: list[dict[str, Any]], end: dict[str, Any]) -> list[dict[str, Any]]:
    """``rows`` with the last collectives the rank's end recorded (end.json ``collectives``:
    the recorder's rows at its end, fresher than a table copy a refresh old)."""
    last = [r for r in end.get("collectives") or () if isinstance(r, dict)]
    if not last:
        return rows
    key = lambda r: (str(r.get("pg")), r.get("seq"), bool(r.get("is_p2p")))  # noqa: E731
    fresh = {key(r): r for r in last}
    out = [fresh.pop(key(r), r) for r in rows]
    out += fresh.values()
    out.sort(key=lambda r: float(r.get("start_time") or 0.0))
    return out


def is_collective_error(text: str) -> bool:
    low = text.lower()
    return any(w in low for w in _COLLECTIVE_ERRORS)


def mark_end(rows: list[dict[str, Any]], end: dict[str, Any]) -> list[dict[str, Any]]:
    """The rank's last collective marked failed when its end was an exception a collective
    raised and no row says so already."""
    exc = str(end.get("exception") or "")
    if end.get("kind") != "exception" or not is_collective_error(exc):
        return rows
    at = float(end.get("at") or 1e18)
    cands = [i for i, r in enumerate(rows) if not r.get("is_p2p")
             and float(r.get("start_time") or 0.0) <= at]
    if not cands:
        return rows
    last = max(cands, key=lambda i: float(rows[i].get("start_time") or 0.0))
    if rows[last].get("state") in ("failed", "pending"):
        return rows
    out = list(rows)
    out[last] = {**rows[last], "state": "failed", "error": exc[:300], "end_time": at}
    return out

