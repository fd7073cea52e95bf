"""The node route (``POST /v1/node/fanout``): one agent per node asks its node's ranks and sends
one merged answer. Writer and reader together, stdlib only (the watchdog, the CLI and the bench's
simulated ranks all import this).

Request: ``{"route": "backtrace" | "query" | "collectives", "params": {...}, "ranks": [...]}``.
``params`` are the backtrace's query parameters (``locals``, ``native``, ``all``, ``secrets``),
the query's body (``{"sql", "max_rows"}``) or the collectives' (``limit``, ``state``), and
``timeout_s``, each rank's time. ``ranks`` are the ranks the caller wants from this node; the
node agent asks only those its own job's rank list places on its host (see ``local_ranks``).

Answer (``merge``): ``{"ok": true, "rank", "host", "route", "answers": [{"rank", "status",
"body"}], ...}`` with one of:

- backtrace: ``stacks``, the distinct frame lists; each thread in each answer's body carries
  ``"frames": <index into stacks>``. Ranks stopped at the same place send their frames once, so
  the answer grows with the distinct stacks, not with the ranks (the grouping the CLI prints);
- query: ``columns`` = ``["rank", ...the query's columns]``, ``types`` likewise and ``rows``,
  every rank's rows with its rank first; each answer's body keeps its keys, ``rows`` being its
  row count there.
  A rank whose columns differ keeps its rows in its own body;
- collectives (what ``probe hang`` reads beside the stacks): each rank's body as sent.

``split`` undoes either exactly: the per-rank bodies, as each rank sent them. ``status`` 0 in
an answer means the node agent could not get one (``body.error`` says why).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from .tokens import entry_signed

#: What a node agent relays: read-only routes only, so the node route can never carry an eval
#: or an action to a rank.
NODE_ROUTES = ("backtrace", "query", "collectives")
#: Ranks one node request may name (a node with more local ranks than this is split by the CLI).
MAX_NODE_RANKS = 256


def request(route: str, params: Mapping[str, Any], ranks: Iterable[int]) -> dict[str, Any]:
    return {"route": route, "params": dict(params), "ranks": sorted(set(ranks))}


def read_request(body: Any) -> tuple[str, dict[str, Any], list[int]] | str:
    """``(route, params, ranks)``, or a one-line reason the body is not a node request."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    route, params, ranks = body.get("route"), body.get("params") or {}, body.get("ranks")
    if route not in NODE_ROUTES:
        return f"route must be one of {', '.join(NODE_ROUTES)}"
    if not isinstance(params, dict):
        return "params must be an object"
    if (not isinstance(ranks, list) or not ranks or len(ranks) > MAX_NODE_RANKS
            or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0
                       for r in ranks)):
        return f"ranks must be a list of 1 to {MAX_NODE_RANKS} rank numbers"
    return route, params, sorted(set(ranks))


def local_ranks(entries: Iterable[Mapping[str, Any]], host: str | None,
                token: str | None) -> dict[int, int]:
    """``{rank: pid}`` of the job's ranks on ``host``, from its rank list (``GET /v1/ranks``'s
    ``ranks``). With a token only entries signed with it count: the list comes from the job's
    c10d store, which anyone who reaches it can write, and a forged entry must not point the node
    agent at another job's socket."""
    out: dict[int, int] = {}
    for e in entries:
        rank, pid = e.get("rank"), e.get("pid")
        if not (isinstance(rank, int) and isinstance(pid, int) and pid > 0):
            continue
        if host is None or e.get("host") != host:
            continue
        if token is not None and not entry_signed(token, e):
            continue
        out[rank] = pid
    return out


def _stack_key(frames: Any) -> str:
    return json.dumps(frames, sort_keys=True, separators=(",", ":"))


def merge(route: str, me: Mapping[str, Any], answers: list[tuple[int, int, dict[str, Any]]]
          ) -> dict[str, Any]:
    """One answer from ``(rank, status, body)`` per rank; ``me`` gives ``rank`` and ``host``."""
    out: dict[str, Any] = {"ok": True, "rank": me.get("rank"), "host": me.get("host"),
                           "route": route}
    rows: list[dict[str, Any]] = []
    if route == "backtrace":
        stacks: list[Any] = []
        index: dict[str, int] = {}
        for rank, status, body in answers:
            threads = body.get("threads") if status == 200 else None
            if isinstance(threads, list):
                slim = []
                for t in threads:
                    if isinstance(t, dict) and "frames" in t:
                        key = _stack_key(t["frames"])
                        if key not in index:
                            index[key] = len(stacks)
                            stacks.append(t["frames"])
                        t = {**t, "frames": index[key]}
                    slim.append(t)
                body = {**body, "threads": slim}
            rows.append({"rank": rank, "status": status, "body": body})
        out["stacks"] = stacks
    elif route == "query":
        columns: list[Any] | None = None
        merged: list[list[Any]] = []
        for rank, status, body in answers:
            cols, got = body.get("columns"), body.get("rows")
            if status == 200 and isinstance(cols, list) and isinstance(got, list):
                if columns is None:
                    columns = cols
                    out["columns"] = ["rank", *cols]
                    out["types"] = ["INTEGER", *(body.get("types") or ())]
                if cols == columns:
                    merged.extend([rank, *row] for row in got)
                    body = {**body, "rows": len(got)}  # in place: key order kept
            rows.append({"rank": rank, "status": status, "body": body})
        out["rows"] = merged
    else:
        rows = [{"rank": rank, "status": status, "body": body} for rank, status, body in answers]
    out["answers"] = rows
    return out


def split(body: Mapping[str, Any]) -> list[tuple[int, int, dict[str, Any]]]:
    """``(rank, status, body)`` per rank, each body as its rank sent it. Malformed entries are
    left out (the CLI asks those ranks directly)."""
    answers = body.get("answers")
    if not isinstance(answers, list):
        return []
    got = body.get("stacks")
    stacks: list[Any] = got if isinstance(got, list) else []
    by_rank: dict[int, list[list[Any]]] = {}
    if isinstance(body.get("rows"), list):
        for row in body["rows"]:
            if isinstance(row, list) and row and isinstance(row[0], int):
                by_rank.setdefault(row[0], []).append(row[1:])
    out = []
    for a in answers:
        if not isinstance(a, dict):
            continue
        rank, status, b = a.get("rank"), a.get("status"), a.get("body")
        if not (isinstance(rank, int) and isinstance(status, int) and isinstance(b, dict)):
            continue
        if isinstance(b.get("threads"), list):
            b = {**b, "threads": [_with_frames(t, stacks) for t in b["threads"]]}
        if isinstance(b.get("rows"), int) and not isinstance(b["rows"], bool):
            b = {**b, "rows": by_rank.get(rank, [])}
        out.append((rank, status, b))
    return out


def _with_frames(thread: Any, stacks: list[Any]) -> Any:
    if isinstance(thread, dict):
        i = thread.get("frames")
        if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(stacks):
            return {**thread, "frames": stacks[i]}
    return thread
