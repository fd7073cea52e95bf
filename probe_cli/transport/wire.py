"""The agent's wire bodies as types: what the CLI reads out of every answer (docs/http-api.md).

Every command reads a rank's body through one of these ``from_wire`` constructors, never by
indexing the dict itself, so a change of the wire format is a change here (and in the agent's
own body builders), and mypy follows it into every reader.

The dicts themselves are kept as they came (``RankResult.data``): ``--json`` prints them
unchanged, byte for byte, because the wire body *is* the JSON output (DESIGN.md, "CLI output").
These types are read-only views over them, tolerant in the way the renderers always were: a
missing or null key becomes the field's empty value, never a KeyError, so an older or newer
agent still renders. Nested items that the renderers and verdicts walk as mappings (threads,
frames, collectives, actions) stay mappings; their keys are listed in docs/http-api.md.

Pure dataclasses, stdlib only: testable against recorded bodies without a server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Body = Mapping[str, Any]


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _dicts(value: Any) -> tuple[dict[str, Any], ...]:
    return tuple(v for v in _list(value) if isinstance(v, dict))


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True, slots=True)
class Envelope:
    """What every body carries: ``ok``, ``rank``; error bodies add ``status`` and ``error``."""

    ok: bool | None
    """As sent: True, False, or None when the body did not say (not a probe body)."""
    rank: int | None
    status: int | None = None
    error: str | None = None
    host: str | None = None
    """``info`` and ``backtrace`` bodies say where the rank runs (the ``Rank N (host:pid)``
    header); None elsewhere."""
    pid: int | None = None

    @classmethod
    def from_wire(cls, body: Body | None) -> Envelope:
        b = body or {}
        err = b.get("error")
        ok = b.get("ok")
        return cls(ok=ok if isinstance(ok, bool) else None, rank=_int(b.get("rank")),
                   status=_int(b.get("status")),
                   error=None if err is None else str(err), host=b.get("host"),
                   pid=_int(b.get("pid")))


@dataclass(frozen=True, slots=True)
class QueryBody:
    """``POST /v1/query`` and ``POST /v1/queries/{name}``: datasette's shape plus ``rank``."""

    rank: int | None
    columns: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    rows: tuple[list[Any], ...] = ()
    truncated: bool = False
    elapsed_ms: float | None = None
    #: The cap that cut the rows (PROBE_MAX_ROWS or PROBE_MAX_RESULT_BYTES, with its value).
    truncated_by: str | None = None

    @classmethod
    def from_wire(cls, body: Body | None) -> QueryBody:
        b = body or {}
        by = b.get("truncated_by")
        return cls(rank=_int(b.get("rank")), columns=tuple(str(c) for c in _list(b.get("columns"))),
                   types=tuple(str(t) for t in _list(b.get("types"))),
                   rows=tuple(list(r) for r in _list(b.get("rows"))),
                   truncated=bool(b.get("truncated")), elapsed_ms=b.get("elapsed_ms"),
                   truncated_by=str(by) if by else None)

    def records(self) -> list[dict[str, Any]]:
        """Rows as ``{column: value}`` dicts (for the verdicts, which read by column name)."""
        return [dict(zip(self.columns, row)) for row in self.rows]

    def column(self, name: str) -> int:
        return self.columns.index(name)


@dataclass(frozen=True, slots=True)
class ArrowBody:
    """``POST /v1/query`` with ``Accept: application/vnd.apache.arrow.stream``: the stream's
    bytes plus what the ``X-Probe-Rank`` and ``X-Probe-Truncated`` headers said."""

    rank: int | None
    truncated: bool
    arrow: bytes

    def to_wire(self) -> dict[str, Any]:
        """The dict fan-out keeps per rank (``--json`` drops the bytes)."""
        return {"ok": True, "rank": self.rank, "truncated": self.truncated, "arrow": self.arrow}

    @classmethod
    def from_wire(cls, body: Body | None) -> ArrowBody:
        b = body or {}
        return cls(rank=_int(b.get("rank")), truncated=bool(b.get("truncated")),
                   arrow=b.get("arrow") or b"")


@dataclass(frozen=True, slots=True)
class GatheredBody:
    """``probe query --gather SQL --json``: not an agent's body but the CLI's own answer, every
    rank's rows merged and queried again locally; ``ranks`` are the ranks it came from."""

    ranks: tuple[int | None, ...]
    columns: tuple[str, ...]
    types: tuple[str, ...]
    rows: tuple[list[Any], ...]

    def to_wire(self) -> dict[str, Any]:
        return {"ok": True, "ranks": list(self.ranks), "columns": list(self.columns),
                "types": list(self.types), "rows": list(self.rows)}


@dataclass(frozen=True, slots=True)
class EvalBody:
    """``POST /v1/eval`` (and a step-eval action's final state): what the code printed, the
    repr of a trailing expression, and on failure the traceback."""

    rank: int | None
    result: str | None = None
    stdout: str = ""
    stderr: str = ""
    traceback: str | None = None
    error: str | None = None

    @classmethod
    def from_wire(cls, body: Body | None) -> EvalBody:
        b = body or {}
        result, tb, err = b.get("result"), b.get("traceback"), b.get("error")
        return cls(rank=_int(b.get("rank")), result=None if result is None else str(result),
                   stdout=b.get("stdout") or "", stderr=b.get("stderr") or "",
                   traceback=None if tb is None else str(tb),
                   error=None if err is None else str(err))

    @staticmethod
    def raised(body: Body | None) -> bool:
        """An error body from eval carries what the code printed or its traceback."""
        return bool(body) and ("traceback" in body or "stdout" in body)  # type: ignore[operator]


@dataclass(frozen=True, slots=True)
class BacktraceBody:
    """``GET /v1/backtrace``, in-process or from the watchdog (docs/http-api.md, "watchdog")."""

    rank: int | None
    pid: int | None = None
    host: str | None = None
    threads: tuple[dict[str, Any], ...] = ()
    source: str | None = None
    route: str | None = None
    gil_holder: Any = None
    native: bool | None = None
    state: str | None = None
    stopped: str | None = None
    exit: dict[str, Any] = field(default_factory=dict)
    last_step: int | None = None
    last_backtrace: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, body: Body | None) -> BacktraceBody:
        b = body or {}
        native = b.get("native")
        return cls(rank=_int(b.get("rank")), pid=_int(b.get("pid")), host=b.get("host"),
                   threads=_dicts(b.get("threads")), source=b.get("source"),
                   route=b.get("route"), gil_holder=b.get("gil_holder"),
                   native=native if isinstance(native, bool) else None, state=b.get("state"),
                   stopped=b.get("stopped") or None, exit=_dict(b.get("exit")),
                   last_step=_int(b.get("last_step")),
                   last_backtrace=_dict(b.get("last_backtrace")))

    @property
    def main_thread(self) -> dict[str, Any] | None:
        """The thread marked ``is_main``, else the first one sent."""
        return next((t for t in self.threads if t.get("is_main")),
                    self.threads[0] if self.threads else None)


@dataclass(frozen=True, slots=True)
class InfoBody:
    """``GET /v1/info``: who the rank is."""

    rank: int | None
    host: str | None = None
    pid: int | None = None
    python: str | None = None
    torch: str | None = None
    version: str | None = None
    uptime_s: float | None = None
    started_at: float | None = None
    access: dict[str, Any] | None = None
    watchdog: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, body: Body | None) -> InfoBody:
        b = body or {}
        access = b.get("access")
        return cls(rank=_int(b.get("rank")), host=b.get("host"), pid=_int(b.get("pid")),
                   python=b.get("python"), torch=b.get("torch"), version=b.get("version"),
                   uptime_s=_number(b.get("uptime_s")), started_at=_number(b.get("started_at")),
                   access=access if isinstance(access, dict) else None,
                   watchdog=_dict(b.get("watchdog")))

    @property
    def now(self) -> float | None:
        """The agent's clock now (its start plus its uptime): ages computed on it are immune to
        clock skew between this machine and the rank's."""
        if self.started_at is None or self.uptime_s is None:
            return None
        return self.started_at + self.uptime_s


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class RankEntry:
    """One rank as ``GET /v1/ranks`` lists it."""

    rank: int
    url: str | None = None
    host: str | None = None
    pid: int | None = None


@dataclass(frozen=True, slots=True)
class RanksBody:
    """``GET /v1/ranks``: every rank the answering agent knows, itself included."""

    rank: int | None
    ranks: tuple[RankEntry, ...] = ()
    world_size: int | None = None
    discovery: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, body: Body | None) -> RanksBody:
        b = body or {}
        entries = []
        for e in _dicts(b.get("ranks")):
            rank, url = _int(e.get("rank")), e.get("url")
            if rank is not None:
                entries.append(RankEntry(rank, url if isinstance(url, str) and url else None,
                                         e.get("host"), e.get("pid")))
        return cls(rank=_int(b.get("rank")), ranks=tuple(entries),
                   world_size=_int(b.get("world_size")), discovery=_dict(b.get("discovery")))

    def entry(self, rank: int | None) -> RankEntry | None:
        return next((e for e in self.ranks if e.rank == rank), None)


@dataclass(frozen=True, slots=True)
class CollectivesBody:
    """``GET /v1/collectives``: python.collectives rows, oldest first, and the agent's clock."""

    rank: int | None
    collectives: tuple[dict[str, Any], ...] = ()
    now: float = 0.0
    recording: Any = None

    @classmethod
    def from_wire(cls, body: Body | None) -> CollectivesBody:
        b = body or {}
        return cls(rank=_int(b.get("rank")), collectives=_dicts(b.get("collectives")),
                   now=float(b.get("now") or 0.0), recording=b.get("recording"))


@dataclass(frozen=True, slots=True)
class StepBody:
    """``GET /v1/step``: where the rank's step clock is."""

    rank: int | None
    step: int | None = None
    paused_at: int | None = None

    @classmethod
    def from_wire(cls, body: Body | None) -> StepBody:
        return cls(**_step_fields(body or {}))


def _step_fields(b: Body) -> dict[str, Any]:
    """The step clock's fields, which every action answer carries too."""
    return {"rank": _int(b.get("rank")), "step": _int(b.get("step")),
            "paused_at": _int(b.get("paused_at"))}


@dataclass(frozen=True, slots=True)
class ActionBody(StepBody):
    """``POST /v1/actions``, ``GET|DELETE /v1/actions/{id}``: the rank's step and one action
    (``action`` is None when the answer carried none: a refusal's error body). ``reason`` is
    set on a 409 refusal (``past``, ``duplicate``, ``running``, ``no-step-hook``)."""

    action: dict[str, Any] | None = None
    reason: str | None = None

    @classmethod
    def from_wire(cls, body: Body | None) -> ActionBody:
        b = body or {}
        action = b.get("action")
        return cls(**_step_fields(b), action=action if isinstance(action, dict) else None,
                   reason=b.get("reason"))

    @property
    def state(self) -> str | None:
        return (self.action or {}).get("state")


@dataclass(frozen=True, slots=True)
class ActionListBody(StepBody):
    """``GET /v1/actions``: queued, running and the last finished actions of one rank."""

    actions: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_wire(cls, body: Body | None) -> ActionListBody:
        b = body or {}
        return cls(**_step_fields(b), actions=_dicts(b.get("actions")))


@dataclass(frozen=True, slots=True)
class FinishedAction:
    """A step-boundary action's final state as the CLI keeps it per rank (step_actions.py
    merges the action's fields with the rank and the step it was at): ``data`` is the built-in
    action's report (lr, checkpoint, pause)."""

    rank: int | None
    state: str | None = None
    current_step: int | None = None
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, body: Body | None) -> FinishedAction:
        b = body or {}
        return cls(rank=_int(b.get("rank")), state=b.get("state"),
                   current_step=_int(b.get("current_step")), data=_dict(b.get("data")))


@dataclass(frozen=True, slots=True)
class ResumeBody:
    """``POST /v1/resume``."""

    rank: int | None
    was_paused_at: int | None = None
    note: str | None = None
    cancelled: tuple[str, ...] = ()

    @classmethod
    def from_wire(cls, body: Body | None) -> ResumeBody:
        b = body or {}
        return cls(rank=_int(b.get("rank")), was_paused_at=_int(b.get("was_paused_at")),
                   note=b.get("note"), cancelled=tuple(str(c) for c in _list(b.get("cancelled"))))


@dataclass(frozen=True, slots=True)
class TraceBody:
    """``GET|POST /v1/trace``: the rank's tracing mode and what the tracer has done."""

    rank: int | None
    mode: str | None = None
    tracing_now: Any = None
    step: int | None = None
    failures: Any = None
    disabled: Any = None
    dropped_rows: Any = None
    hot_path: str | None = None

    @classmethod
    def from_wire(cls, body: Body | None) -> TraceBody:
        b = body or {}
        return cls(rank=_int(b.get("rank")), mode=b.get("mode"), tracing_now=b.get("tracing_now"),
                   step=b.get("step"), failures=b.get("failures"), disabled=b.get("disabled"),
                   dropped_rows=b.get("dropped_rows"), hot_path=b.get("hot_path"))
