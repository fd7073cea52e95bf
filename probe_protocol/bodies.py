"""The bodies of the rank-state routes: health, info, ranks, eval, backtrace, collectives, the
canned-query list, trace, doctor, and the watchdog's refusal report (docs/http-api.md).

Each is built by the agent (or its watchdog) and sent with ``to_wire()``; the CLI reads the
same class with ``from_wire()``. Step-boundary actions and profiling are in ``actions``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .envelope import Body, WireBody, as_bool, as_dict, as_dicts, as_int, as_str, sometimes
from .requests import ID_PATTERN, Request, arg


@dataclass(frozen=True, slots=True)
class HealthBody(WireBody):
    """``GET /v1/health``: ``proof`` only when asked with ``?challenge`` and the agent has a
    token (docs/http-api.md, "Access"). With ``?status`` (a liveness probe, `probe health`):
    ``state`` healthy | starting | hung | dead, ``reason``, the last optimizer ``step``,
    ``step_age_s`` (since it last changed), ``heartbeat_age_s`` (since the rank's Python last
    ran) and ``typical_step_s`` (the median gap between steps seen); the HTTP status is 503
    for hung and dead, so a Kubernetes liveness probe or torchelastic can poll it as is."""

    rank: int | None
    status: str = "ok"
    proof: str | None = sometimes()
    state: str | None = sometimes()
    reason: str | None = sometimes()
    step: int | None = sometimes()
    step_age_s: float | None = sometimes()
    heartbeat_age_s: float | None = sometimes()
    typical_step_s: float | None = sometimes()
    host: str | None = sometimes()
    pid: int | None = sometimes()


@dataclass(frozen=True, slots=True)
class PostmortemNowBody(WireBody):
    """``POST /v1/postmortem``: this rank's post-mortem directory (None when the copy is off,
    ``note`` says why) and when the copy was asked for; the copy thread writes it now."""

    rank: int | None
    copy: str | None = None
    requested_at: float | None = None
    note: str | None = sometimes()


@dataclass(frozen=True, slots=True)
class InfoBody(WireBody):
    """``GET /v1/info``: who the rank is (also written to the run dir as ``<pid>.json``)."""

    rank: int | None
    local_rank: int | None = None
    world_size: int | None = None
    pid: int | None = None
    host: str | None = None
    python: str | None = None
    torch: str | None = None
    version: str | None = None
    started_at: float | None = None
    uptime_s: float | None = None
    url: str | None = None
    unix_socket: str | None = None
    argv: tuple[str, ...] = ()
    trace: str | None = None
    watchdog: dict[str, Any] | None = None
    """The watchdog's pid, reader, restarts...; None when the agent runs without one."""
    serve_cpu: float | None = None
    access: dict[str, Any] | None = None
    queued_s: float | None = None
    hot_path: str | None = None
    """The tracer's hot path: ``native`` or ``python (building, 40 s)``, ``python (no compiler:
    ...)``, ``python (build failed: see FILE)``..."""
    format: int | None = None
    """The agent's probe format (probe_protocol/version.py); None from an agent older than it."""
    patches: tuple[dict[str, Any], ...] = ()
    """What the agent replaced in the process now (probe_agent/patches.py): ``target``
    (``torch.nn.modules.module.Module.__call__``), ``by``, ``why``, ``restorable`` and, for one
    kept for the life of the process, ``why_kept``."""
    settings: tuple[dict[str, Any], ...] = ()
    """Process-wide settings the agent changed (a signal handler, faulthandler, atexit, fork
    hooks) or changes for a moment now and then (``temporary``, ``uses``: the switch interval
    during heap walks, the collector off around stack reads)."""

    @property
    def now(self) -> float | None:
        """The agent's clock now (its start plus its uptime): ages computed on it are immune to
        clock skew between this machine and the rank's."""
        if self.started_at is None or self.uptime_s is None:
            return None
        return self.started_at + self.uptime_s


@dataclass(frozen=True, slots=True)
class RankEntry:
    """One rank as ``GET /v1/ranks`` lists it (and as it is published in the job's c10d store);
    ``url`` None: it serves no TCP. ``sig``: the job's token's signature over the other four,
    when the job has a token (probe_protocol/tokens.py); the CLI dials only signed entries."""

    rank: int
    url: str | None = None
    host: str | None = None
    pid: int | None = None
    sig: str | None = None

    def to_wire(self) -> dict[str, Any]:
        out = {"rank": self.rank, "url": self.url, "host": self.host, "pid": self.pid}
        if self.sig is not None:
            out["sig"] = self.sig
        return out

    @classmethod
    def from_wire(cls, entry: Body) -> RankEntry | None:
        rank, url = as_int(entry.get("rank")), entry.get("url")
        if rank is None:
            return None
        return cls(rank, url if isinstance(url, str) and url else None,
                   as_str(entry.get("host")), as_int(entry.get("pid")), as_str(entry.get("sig")))


@dataclass(frozen=True, slots=True)
class RanksBody(WireBody):
    """``GET /v1/ranks``: every rank the answering agent knows, itself included. ``cached``:
    sent by the watchdog, answering from its last copy while the agent does not answer."""

    rank: int | None
    ranks: tuple[RankEntry, ...] = ()
    world_size: int | None = sometimes()
    discovery: dict[str, Any] = field(default_factory=dict)
    cached: bool | None = sometimes()

    def to_wire(self) -> dict[str, Any]:
        out = WireBody.to_wire(self)
        out["ranks"] = [e.to_wire() for e in self.ranks]
        return out

    @classmethod
    def from_wire(cls, body: Body | None) -> RanksBody:
        b = body or {}
        entries = (RankEntry.from_wire(e) for e in as_dicts(b.get("ranks")))
        return cls(rank=as_int(b.get("rank")), ranks=tuple(e for e in entries if e),
                   world_size=as_int(b.get("world_size")), discovery=as_dict(b.get("discovery")),
                   cached=as_bool(b.get("cached")))

    def entry(self, rank: int | None) -> RankEntry | None:
        return next((e for e in self.ranks if e.rank == rank), None)


@dataclass(frozen=True, slots=True)
class EvalRequest(Request):
    """What ``POST /v1/eval`` takes. ``id`` names the eval (the CLI sends one id to every
    rank, so that a runaway eval is cancelled everywhere by the id it names)."""

    code: str = arg("str", required=True,
                    description="Python source; the repr of a trailing expression is returned")
    id: str | None = arg("str", pattern=ID_PATTERN,
                         description="The eval's job id (the CLI sends the same one to every "
                         "rank); default E1, E2…")


@dataclass(frozen=True, slots=True)
class EvalBody(WireBody):
    """``POST /v1/eval`` (and a step-eval action's final state): what the code printed, the
    repr of a trailing expression. Read from an eval's error body too, which carries the
    ``error``, the ``traceback`` and what was printed before it raised."""

    rank: int | None
    id: str | None = None
    result: str | None = None
    stdout: str = ""
    stderr: str = ""
    elapsed_ms: float | None = sometimes()
    traceback: str | None = sometimes()
    error: str | None = sometimes()

    @staticmethod
    def raised(body: Body | None) -> bool:
        """An error body from eval carries what the code printed or its traceback."""
        return bool(body) and ("traceback" in body or "stdout" in body)  # type: ignore[operator]


@dataclass(frozen=True, slots=True)
class EvalJobBody(WireBody):
    """``GET|DELETE /v1/evals/{id}``: one eval as a job (``eval``: its fields as
    docs/http-api.md lists them); ``GET /v1/evals`` sends ``evals``, a list of them."""

    rank: int | None
    eval: dict[str, Any] = field(default_factory=dict)

    @property
    def still_running(self) -> bool:
        return self.eval.get("still_running") is True

    @property
    def cost(self) -> dict[str, Any]:
        return as_dict(self.eval.get("cost"))


@dataclass(frozen=True, slots=True)
class EvalListBody(WireBody):
    """``GET /v1/evals``: this rank's running evals and the last finished ones, each as
    ``EvalJobBody.eval``."""

    rank: int | None
    evals: tuple[dict[str, Any], ...] = ()


def _from_watchdog(b: BacktraceBody) -> bool:
    return b.source == "out-of-process"


def _dead(b: BacktraceBody) -> bool:
    return b.state == "dead"


@dataclass(frozen=True, slots=True)
class BacktraceBody(WireBody):
    """``GET /v1/backtrace``: in-process (``source: "in-process"``), or from the watchdog when
    the rank's Python does not answer (``out-of-process``: the GIL facts are sent even when
    null) or is dead (``watchdog``: the exit and the last stack seen). docs/http-api.md,
    "The watchdog"."""

    rank: int | None
    pid: int | None = None
    host: str | None = None
    source: str | None = None
    route: str | None = None
    reason: str | None = sometimes()
    native: bool | None = sometimes()
    python: str | None = sometimes()
    state: str | None = sometimes()
    stopped: str | None = sometimes(_from_watchdog)
    gil_holder: Any = sometimes(_from_watchdog)
    gil_held: bool | None = sometimes(_from_watchdog)
    heartbeat_age_s: float | None = sometimes(_from_watchdog)
    step: int | None = sometimes(_from_watchdog)
    exit: dict[str, Any] | None = sometimes(_dead)
    last_step: int | None = sometimes(_dead)
    died_at: float | None = sometimes(_dead)
    last_backtrace: dict[str, Any] | None = sometimes(_dead)
    threads: tuple[dict[str, Any], ...] = ()
    #: ``?children=1``: the rank's child processes read by its watchdog (pid, name, state,
    #: kind, worker_id, route, threads, error); absent when not asked or with no watchdog.
    children: tuple[dict[str, Any], ...] | None = sometimes()
    elapsed_ms: float | None = sometimes()

    @property
    def main_thread(self) -> dict[str, Any] | None:
        """The thread marked ``is_main``, else the first one sent."""
        return next((t for t in self.threads if t.get("is_main")),
                    self.threads[0] if self.threads else None)


@dataclass(frozen=True, slots=True)
class CollectivesBody(WireBody):
    """``GET /v1/collectives``: python.collectives rows, oldest first, and the agent's clock
    (so that a client ages pending calls without trusting its own)."""

    rank: int | None
    recording: bool | None = None
    collectives: tuple[dict[str, Any], ...] = ()
    now: float = 0.0


@dataclass(frozen=True, slots=True)
class QueriesBody(WireBody):
    """``GET /v1/queries``: the canned diagnostics, ``{name, description, params}`` each."""

    rank: int | None
    queries: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class TraceRequest(Request):
    """What ``POST /v1/trace`` takes: ``on``, ``off`` or ``every:N``."""

    mode: str = arg("str", required=True, pattern=r"^(on|off|every:[1-9][0-9]*)$",
                    description="on (every module, every step), off, or every:N (every module "
                    "on steps whose number is a multiple of N)")


@dataclass(frozen=True, slots=True)
class TraceBody(WireBody):
    """``GET|POST /v1/trace``: the rank's tracing mode and what the tracer has done."""

    rank: int | None
    mode: str | None = None
    armed: bool | None = None
    tracing_now: bool | None = None
    step: int | None = None
    fallback_steps: bool | None = None
    """True until an optimizer step is seen (steps are counted by root-module calls)."""
    failures: int | None = None
    disabled: bool | None = None
    last_error: str | None = None
    dropped_rows: int | None = None
    cuda_events: bool | None = None
    hot_path: str | None = None
    """The path the traced steps run on now: ``native`` or ``python``."""
    native_build: str | None = None
    """``native``, or why not: ``python (building, 40 s)``, ``python (build failed: see FILE)``"""
    saved_bytes: dict[str, Any] | None = None
    """Whether the saved-for-backward bytes are counted: ``counting``, ``failures``,
    ``last_error``."""


@dataclass(frozen=True, slots=True)
class DoctorBody(WireBody):
    """``GET /v1/doctor``: the training-loop state `probe doctor` needs, read without running
    user code: the step ``clock`` (``GET /v1/step``'s fields), the DataLoader and clipping
    ``loop`` monitor (None when it is not running), optimizer settings, the LR schedulers'
    class names (None before the first step), CUDA totals (MiB), and a DeepSpeed engine's
    settings (None without one: ``zero_stage``, ``gradient_clipping``,
    ``gradient_accumulation_steps``, ``fp16``, ``bf16``, ``global_steps``, ``skipped_steps``,
    ``micro_steps``, ``loss_scale``), and the numerics recorder's state (``GET /v1/numerics``:
    thresholds, the last step's loss and norm, the first non-finite step and its origin, the
    guard; None when it is not running)."""

    rank: int | None
    now: float | None = None
    clock: dict[str, Any] = field(default_factory=dict)
    loop: dict[str, Any] | None = None
    optimizers: tuple[dict[str, Any], ...] = ()
    schedulers: tuple[str, ...] | None = None
    cuda_total_mib: dict[str, Any] = field(default_factory=dict)
    deepspeed: dict[str, Any] | None = None
    numerics: dict[str, Any] | None = None


def _checked(b: GradsBody) -> bool:
    return b.checked


@dataclass(frozen=True, slots=True)
class GradsBody(WireBody):
    """``POST /v1/doctor/grads``: every gradient checked for NaN/Inf right after the next
    optimizer step, or ``checked: false`` and the ``reason``."""

    rank: int | None
    checked: bool = False
    step: int | None = sometimes()
    params: int | None = sometimes(_checked)
    without_grad: int | None = sometimes(_checked)
    nonfinite: int | None = sometimes(_checked)
    norm: float | None = sometimes(_checked)
    """Total norm of the finite gradients; None when none is finite."""
    reason: str | None = sometimes()


def _census_ran(b: TensorsBody) -> bool:
    return b.note is None


@dataclass(frozen=True, slots=True)
class TensorsBody(WireBody):
    """``GET /v1/memory/tensors``: live tensors grouped by device, dtype and shape, largest
    first (``{device, dtype, shape, count, mib, kind, holder, count_change}`` each), and the
    step of the previous census that ``count_change`` compares with (None on the first).
    ``note`` instead of a census when there is nothing to count (torch not imported)."""

    rank: int | None
    step: int | None = None
    previous_step: int | None = sometimes(_census_ran)
    tensors: int = 0
    total_mib: float = 0.0
    groups: tuple[dict[str, Any], ...] = ()
    census_ms: float | None = sometimes()
    note: str | None = sometimes()
    #: tensors left out: torch.compile's fake tensors, and any whose size raised
    skipped: int | None = sometimes()


@dataclass(frozen=True, slots=True)
class NumericsBody(WireBody):
    """``GET /v1/numerics`` and ``POST /v1/numerics``: the numerics recorder's state
    (``thresholds``, ``last``, ``first_nonfinite``, ``anomalies``, ``loss_source``, ``guard``;
    docs/http-api.md), or None when it is not running."""

    rank: int | None
    numerics: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class NumericsRequest(Request):
    """What ``POST /v1/numerics`` takes: thresholds to change while the job runs
    (``{"thresholds": {"spike_factor": 3}}``); the agent names an unknown one."""

    thresholds: dict[str, Any] = arg("object", required=True,
                                     description="NAME: VALUE, each a finite number >= 0")


#: A refused request as the watchdog lists it: each key and its longest text.
REFUSAL_KEYS = {"client": 200, "what": 300, "reason": 40, "message": 1000}


@dataclass(frozen=True, slots=True)
class RefusalReport(Request):
    """``POST /v1/access/refusals`` (watchdog -> its agent, private socket): the requests the
    watchdog refused since its last report, and how many more it only counted. ``id`` is the
    same on every resend of one report (one sent during a GIL hold arrives but is answered
    late); the agent applies each id once. Each refusal has ``REFUSAL_KEYS``, all text."""

    refusals: tuple[dict[str, Any], ...] = arg("objects", (), max_length=1000)
    unlisted: int = arg("int", 0, ge=0, description="refusals counted but not listed")
    id: str = arg("str", "", max_length=64,
                  description="the same on every resend; applied once")

    def check(self) -> str | None:
        for i, r in enumerate(self.refusals):
            for key, most in REFUSAL_KEYS.items():
                v = r.get(key)
                if not isinstance(v, str) or len(v) > most:
                    return f"refusals.{i}.{key}: give text of at most {most} characters"
        return None


@dataclass(frozen=True, slots=True)
class RecordedBody(WireBody):
    """The agent's answer to a refusal report: how many rows it recorded."""

    rank: int | None
    recorded: int = 0
