"""A post-mortem directory as a target: `probe -t DIR hang|doctor|steps|query ...` on a dead job.

The reading side of the transport, beside the live client (client.py): both answer the read
methods of ``RankClient`` (rank_client.py), so a command reaches a dead rank as it reaches a
live one.

``find_job(path)`` reads a job's directory (probe_protocol/postmortem.py: ``rank-<r>/`` with
Parquet parts, ``meta.json``, ``end.json``, ``death.json``). Each rank then answers through a
``PostmortemClient``: the ``ProbeClient`` methods the diagnosis commands call (query, canned,
backtrace, collectives...), answered from a local DuckDB (imported lazily) whose ``python.*``
views read that rank's files. The commands, their verdicts and their renderers do not change:
a dead job is one more source of the same evidence.

The copy's clock is its own: ``now`` of the collectives is when the rank's copy ends (its death,
or its last refresh), so waits are aged as they were when the rank went.
"""

from __future__ import annotations

import os
import socket
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe_protocol import postmortem as layout
from probe_protocol import runfiles, sqlfiles
from probe_protocol.bodies import BacktraceBody, CollectivesBody
from probe_protocol.query import QueryBody
from probe_protocol.version import disagreement, format_of

from ..errors import MissingDependencyError, RankError, UsageProblemError
from . import copy_db
from .copy_collectives import mark_end, merge_end_rows, merge_strip
from .untrusted_text import escape_body, escape_controls

PREFIX = "postmortem:"
#: How a table the copy does not hold is reported (``RankError.reason`` starts with it).
NOT_RECORDED = "not recorded in this copy"
#: The largest world size a copy's ``meta.json`` is believed about (a crafted one said 10**18).
MAX_WORLD_SIZE = 1 << 20


@dataclass
class RankCopy:
    rank: int
    path: str
    meta: dict[str, Any]
    end: dict[str, Any]
    death: dict[str, Any]
    #: What could not be read (a record that is not JSON, a part that is not Parquet): one
    #: line each, listed with the rank's end.
    problems: list[str] = field(default_factory=list)

    @property
    def running(self) -> bool:
        """The rank's process still runs on this machine (its copy is a live one, not an end):
        its pid is alive and started before the copy's agent did (not a reused pid)."""
        pid, host, started = (self.meta.get(k) for k in ("pid", "host", "started_at"))
        if not isinstance(pid, int) or pid <= 0 or host != socket.gethostname() or \
                self.end or self.death:
            return False
        return runfiles.runs(pid, float(started) if isinstance(started, (int, float)) else 0.0)

    @property
    def maybe_running_on(self) -> str | None:
        """Another host, when this rank left no end and its copy is fresher than two refresh
        periods: it may be running there (a pid on another host cannot be checked)."""
        host, every, copied = (self.meta.get(k) for k in ("host", "every_s", "refreshed_at"))
        if self.end or self.death or not isinstance(host, str) or host == socket.gethostname() \
                or not isinstance(every, (int, float)) or not isinstance(copied, (int, float)):
            return None
        return host if time.time() - copied < 2 * every + 1 else None

    @property
    def died_at(self) -> float | None:
        return self.death.get("at") or self.end.get("at")

    @property
    def copied_at(self) -> float | None:
        return self.meta.get("refreshed_at")


@dataclass
class JobCopy:
    path: str
    job: str
    ranks: dict[int, RankCopy] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``path`` as shown: a name planted in a shared root is text, not terminal control."""
        return escape_controls(self.path)

    @property
    def world_size(self) -> int:
        sizes = [ws for c in self.ranks.values() if isinstance(ws := c.meta.get("world_size"), int)
                 and 0 < ws <= MAX_WORLD_SIZE]
        return max([*sizes, max(self.ranks, default=-1) + 1])

    @property
    def missing(self) -> list[int]:
        return [r for r in range(self.world_size) if r not in self.ranks]


def _owned(path: str) -> str | None:
    """Why ``path`` must not be read as our post-mortem copy (another uid's, or writable by
    others: on a shared filesystem anyone may plant a directory), or None."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"{escape_controls(path)}: {e.strerror}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{escape_controls(path)} is not a directory"
    if st.st_uid not in (os.getuid(), 0):
        return f"{escape_controls(path)} belongs to uid {st.st_uid}, not to you"
    if st.st_mode & 0o022:
        return (f"{escape_controls(path)} is writable by others "
                f"(mode {stat.S_IMODE(st.st_mode):o})")
    return None


def is_copy(path: str) -> bool:
    """True when ``path`` is a post-mortem job directory, a rank's, or a root with one job."""
    return os.path.isdir(path) and (
        any(layout.rank_of(n) is not None for n in _names(path))
        or os.path.exists(os.path.join(path, layout.META))
        or len(jobs_in(path)) == 1)


def _names(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def jobs_in(root: str) -> list[str]:
    """Job directories under a post-mortem root."""
    return [os.path.join(root, n) for n in _names(root)
            if any(layout.rank_of(m) is not None for m in _names(os.path.join(root, n)))]


def find_job(path: str) -> JobCopy:
    """The job copy at ``path`` (a job directory; a rank's directory means its job; a root
    holding exactly one job means that job)."""
    path = os.path.abspath(path)
    if os.path.exists(os.path.join(path, layout.META)) and layout.rank_of(
            os.path.basename(path)) is not None:
        path = os.path.dirname(path)
    if not any(layout.rank_of(n) is not None for n in _names(path)):
        jobs = jobs_in(path)
        if len(jobs) != 1:
            raise UsageProblemError(
                f"{escape_controls(path)} holds {len(jobs)} post-mortem jobs" if jobs else
                f"{escape_controls(path)} is not a post-mortem directory (no rank-N/ in it)",
                help_text="`probe postmortem` lists them; pass one job's directory to -t")
        path = jobs[0]
    problem = _owned(path)
    if problem is not None:
        raise UsageProblemError(f"not reading {escape_controls(path)}: {problem}",
                                help_text="only your own post-mortem copies are read")
    job = JobCopy(path, escape_controls(os.path.basename(path)))
    for name in _names(path):
        rank = layout.rank_of(name)
        rpath = os.path.join(path, name)
        if rank is None or _owned(rpath) is not None:
            continue
        problems: list[str] = []
        # Text a job wrote (its exception, the audit of refused requests) is data: escaped
        # as the live client escapes an agent's answers (transport/untrusted_text.py).
        meta, end, death = (escape_body(layout.read_json(os.path.join(rpath, name), problems))
                            for name in (layout.META, layout.END, layout.DEATH))
        ws = meta.get("world_size")
        if ws is not None and not (isinstance(ws, int) and 0 < ws <= MAX_WORLD_SIZE):
            problems.append(f"meta.json's world_size {str(ws)[:40]} is not believed "
                            f"(not a count up to {MAX_WORLD_SIZE})")
        problems = [escape_controls(p) for p in problems]
        copy_db.table_parts(rpath, problems)  # a broken part is listed with the rank's end
        job.ranks[rank] = RankCopy(rank, rpath, meta, end, death, problems)
    return job


def _queries_dir() -> Path:
    try:
        return sqlfiles.queries_dir()  # the agent's finder too: one place knows where sql/ is
    except FileNotFoundError as e:
        raise MissingDependencyError(str(e)) from None


def schema_text() -> str:
    """sql/schema.sql: every table and column the agents write, with its documentation."""
    return (_queries_dir().parent / "schema.sql").read_text(encoding="utf-8")


def schema_views() -> list[str]:
    """The ``CREATE VIEW`` and ``CREATE ... MACRO`` statements of schema.sql (python.job_memory,
    python.module_calls): views and macros are not copied, they are made again over the copied
    tables."""
    lines = [ln for ln in schema_text().splitlines() if not ln.lstrip().startswith("--")]
    return [st.strip() for st in "\n".join(lines).split(";")
            if "CREATE VIEW" in st.upper() or "MACRO" in st.upper().split("AS", 1)[0]]


def canned_sql(name: str) -> str:
    path = _queries_dir() / f"{name}.sql"
    if not path.is_file():
        raise UsageProblemError(f"no canned query {name!r}")
    return path.read_text(encoding="utf-8")


class PostmortemClient:
    """``ProbeClient``'s read methods, answered from one rank's copy."""

    def __init__(self, copy: RankCopy, raw: bool = False) -> None:
        self.copy = copy
        self.label = PREFIX + escape_controls(copy.path)
        self.raw = raw  # --raw: the copy's strings keep their control characters
        self._db: Any = None

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _conn(self) -> Any:
        if self._db is None:
            try:
                import duckdb  # noqa: F401 - lazy: the CLI needs it only for a copy
            except ImportError:
                raise MissingDependencyError("reading a post-mortem copy needs duckdb") from None
            self._db = copy_db.connect(copy_db.table_parts(self.copy.path, self.copy.problems),
                                       schema_views(),
                                       self.copy.problems)
        return self._db

    def _fail(self, message: str) -> RankError:
        return RankError(f"rank {self.copy.rank} ({self.label}): {message}", url=self.label,
                         reason=message.split("\n")[0][:160])

    def _run(self, sql: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        import duckdb

        try:
            rel = self._conn().execute(sql, params or {})
            cols = [d[0] for d in rel.description or ()]
            types = [str(d[1]) for d in rel.description or ()]
            rows = [list(r) for r in rel.fetchall()]
        except duckdb.CatalogException as e:
            # a table this copy does not hold (never written, or an older format without it)
            note = disagreement(self.copy.meta.get("format"), "this copy")
            raise self._fail(f"{NOT_RECORDED} ({escape_controls(copy_db.one_line(e))})"
                             + (f"; {note}" if note else "")) from None
        except duckdb.Error as e:
            raise self._fail(escape_controls(copy_db.one_line(e))) from None
        body = QueryBody(self.copy.rank, tuple(cols), tuple(types), tuple(rows), False,
                         0.0).to_wire()
        return body if self.raw else escape_body(body)

    def query(self, sql: str, max_rows: int | None = None) -> dict[str, Any]:
        try:
            copy_db.check(self._conn(), sql)  # the user's SQL: one read statement
        except copy_db.SqlRefusedError as e:
            raise self._fail(escape_controls(str(e))) from None
        return self._run(sql)

    def canned(self, name: str, **params: Any) -> dict[str, Any]:
        return self._run(canned_sql(name), params)

    def info(self) -> dict[str, Any]:
        m = self.copy.meta
        return {"ok": True, "rank": self.copy.rank, "pid": m.get("pid"), "host": m.get("host"),
                "world_size": m.get("world_size"), "source": "postmortem",
                "format": format_of(m.get("format")),
                "path": self.copy.path}

    def _now(self) -> float:
        return float(self.copy.died_at or self.copy.copied_at or 0.0)

    def collectives(self, *, limit: int = 200, state: str | None = None) -> dict[str, Any]:
        strip = layout.read_strip(self.copy.path)
        if "collectives" not in layout.table_files(self.copy.path) and not strip and \
                not self.copy.end.get("collectives"):
            return CollectivesBody(self.copy.rank, recording=False, now=self._now()).to_wire()
        copied = QueryBody.from_wire(self._run(
            "SELECT * FROM python.collectives ORDER BY start_time")).records() \
            if "collectives" in layout.table_files(self.copy.path) else []
        rows = []
        merged = merge_strip(merge_end_rows(copied, self.copy.end), strip)
        for r in mark_end(merged, self.copy.end):
            if r.get("state") == "failed" and "timed out" in str(r.get("error") or "").lower():
                # The process group's timeout ended this wait: until then the rank waited in
                # it, which is what the hang verdict reads as pending.
                r = {**r, "state": "pending", "end_time": None, "duration": None}
            rows.append(r)
        if state:
            rows = [r for r in rows if r["state"] == state]
        return CollectivesBody(self.copy.rank, recording=True, collectives=tuple(rows[-limit:]),
                               now=self._timeout_now(rows)).to_wire()

    def _timeout_now(self, rows: list[dict[str, Any]]) -> float:
        """The clock of the collectives: when the rank's own end came (a timed-out wait raised
        there), else its death, else its last copy."""
        return float(self.copy.end.get("at") or self._now())

    def backtrace(self, **_: Any) -> dict[str, Any]:
        threads = self._threads()
        m = self.copy.meta
        return BacktraceBody(self.copy.rank, pid=m.get("pid"), host=m.get("host"),
                             source="postmortem", route=self._route(),
                             threads=tuple(threads)).to_wire()

    def _route(self) -> str:
        end = self.copy.end
        return ("the copy written at its end" if end else
                "the watchdog's last stack" if self.copy.death else "the last copy")

    def _threads(self) -> list[dict[str, Any]]:
        """The main thread where the rank's end found it (the frame a signal interrupted, an
        uncaught exception's traceback), the other threads of the last copy; without the
        rank's own account, the watchdog's last stacks, else the copy's."""
        end = self.copy.end
        main = end.get("stack") or end.get("traceback")
        if main:
            others = [t for t in self._copied_threads() if not t["is_main"]]
            return [{"thread_id": None, "thread_name": "MainThread", "is_main": True,
                     "is_agent": False, "frames": [{**f, "frame_type": "Python"} for f in main]},
                    *others]
        died = list((self.copy.death.get("backtrace") or {}).get("threads") or [])
        return died or self._copied_threads()

    def _copied_threads(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if "backtrace" in layout.table_files(self.copy.path):
            body = QueryBody.from_wire(self._run(
                "SELECT thread_id, thread_name, is_main, depth, func, file, lineno, frame_type "
                "FROM python.backtrace ORDER BY thread_id, depth"))
            by: dict[Any, dict[str, Any]] = {}
            for r in body.records():
                t = by.setdefault(r["thread_id"], {
                    "thread_id": r["thread_id"], "thread_name": r["thread_name"],
                    "is_main": bool(r["is_main"]), "is_agent": False, "frames": []})
                t["frames"].append({k: r[k] for k in ("func", "file", "lineno", "frame_type")})
            for t in by.values():
                t["frames"] = [{**f, "depth": i} for i, f in enumerate(t["frames"])]
                out.append(t)
        return out

    def doctor(self) -> dict[str, Any]:
        raise self._fail("the live loop state is not in a post-mortem copy")

    def doctor_grads(self, wait: float) -> dict[str, Any]:
        raise self._fail("gradients cannot be checked on a dead rank")

    def needs_live(self, name: str) -> RankError:
        """The error for ``name``, a method only a live rank answers (rank_client.live)."""
        return self._fail(f"`{name}` needs a live rank; this is a post-mortem copy")
