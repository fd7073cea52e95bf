"""What the dashboard shows, gathered the way the commands gather it.

One fan-out per refresh (``/v1/backtrace`` + ``/v1/collectives``, as `probe hang`, plus one
query for the recent steps and memory), cached; the page only reads the cache, so N viewers cost
the agents the same as one. Doctor and straggler (heavier: a second round, a gradient check)
run every ``slow_every`` refreshes. The verdicts are the objects diagnose/ returns
(``to_dict()``): one diagnosis code path, two renderers. Gathering stops when no page has asked
for ``idle_s``, so an open terminal with no browser costs the job nothing.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from probe_protocol.bodies import BacktraceBody, CollectivesBody
from probe_protocol.envelope import Envelope
from probe_protocol.query import QueryBody

from ..diagnose.doctor import diagnose as diagnose_doctor
from ..diagnose.doctor import rank_doc
from ..diagnose.hang import diagnose as diagnose_hang
from ..diagnose.hang_state import rank_state
from ..diagnose.isolated import docs_not_data_parallel
from ..diagnose.rhythm import FALLBACK_WAIT_S
from ..diagnose.throughput import from_rows
from ..errors import ProbeCLIError, RankError
from ..gather.evidence import (
    doctor_evidence,
    hang_evidence,
    straggler_evidence,
    straggler_verdict,
)
from ..result import RankResult
from ..transport.fanout import RankTarget, fan_out, resolve_ranks
from ..transport.rank_client import RankClient
from ..transport.session import Session

#: Steps of history per rank drawn in the charts.
HISTORY = 60


def _fast_call(client: RankClient, target: RankTarget) -> dict[str, Any]:
    out = hang_evidence(client, target)
    try:
        out["series"] = client.canned("dashboard_series", last=HISTORY)
    except RankError as e:  # GIL held or no steps table yet: the tile still shows its state
        out["series_error"] = e.reason
    return out


def _state_of(r: RankResult, culprits: set[int], waiting_ranks: set[int], now: float,
              stuck_s: float) -> str:
    """``stuck_s``: the hang verdict's own threshold (the job's rhythm, ``normal_wait``), so a
    tile never says "waiting" about a wait `probe hang` calls normal."""
    data = r.data or {}
    bt = BacktraceBody.from_wire(data.get("backtrace"))
    if not r.ok or bt.state == "dead":
        return "dead"
    if r.rank in culprits:
        return "hung"
    if bt.gil_holder or data.get("collectives_error"):
        return "gil"
    if r.rank in waiting_ranks:
        return "waiting"  # a hang's victim: it waits in the collective the culprit never reached
    body = CollectivesBody.from_wire(data.get("collectives"))
    then = body.now or now
    # A collective pending as long as the verdict's rule calls stuck, not a healthy job's
    # all_reduce (a job with 8 s steps waits seconds in each).
    if any(c.get("end_time") is None and c.get("state") not in ("completed", "failed")
           and then - (c.get("start_time") or then) >= stuck_s
           for c in body.collectives[-8:]):
        return "waiting"
    return "training"


def _series(data: dict[str, Any]) -> list[dict[str, Any]]:
    return QueryBody.from_wire(data.get("series")).records()


def _stacks(data: dict[str, Any]) -> list[str]:
    """The main thread's frames as 'func (file:line)', outermost first."""
    frames = (BacktraceBody.from_wire(data.get("backtrace")).main_thread or {}).get("frames") or []
    ordered = sorted(frames, key=lambda f: -int(f.get("depth", 0)))
    return [f"{f.get('func')} ({str(f.get('file', '')).rsplit('/', 1)[-1]}:{f.get('lineno')})"
            for f in ordered]


def build_tiles(results: list[RankResult], hang: dict[str, Any], now: float
                ) -> list[dict[str, Any]]:
    culprits = set(hang.get("culprits") or []) if hang.get("problem") else set()
    waiting = set((hang.get("waiting") or {}).get("ranks") or []) if hang.get("problem") else set()
    stuck_s = float(hang.get("threshold_s") or FALLBACK_WAIT_S)
    tiles = []
    for r in results:
        data = r.data or {}
        series = _series(data)
        last = series[-1] if series else {}
        tiles.append({
            "rank": r.rank, "host": r.host or data.get("host") or "?", "url": r.url,
            "state": _state_of(r, culprits, waiting, now, stuck_s),
            "step": last.get("step"), "step_time": last.get("duration"),
            "since": None if not last.get("end_time") else round(now - last["end_time"], 1),
            "series": series, "stack": _stacks(data),
            "error": None if r.ok else (r.error.message if r.error else "no answer"),
        })
    return tiles


class Snapshotter:
    """Refreshes the snapshot on a daemon thread while the page is being looked at."""

    def __init__(self, session: Session, refresh_s: float = 1.5, slow_every: int = 8,
                 idle_s: float = 10.0) -> None:
        self.session = session
        self.refresh_s = refresh_s
        self.slow_every = slow_every
        self.idle_s = idle_s
        self.lock = threading.Lock()  # one user of the session at a time
        self.snapshot: dict[str, Any] = {"tiles": [], "verdicts": {}, "refreshed_at": None}
        self.slow_state: dict[str, Any] = {}
        self.wanted_at = 0.0
        self.wake = threading.Event()
        self.stopping = False
        self.slow_session = dataclasses.replace(session, _clients={}, _lock=threading.Lock(),
                                                notes=[])
        self.slow_thread: threading.Thread | None = None
        self.slow_next = 0.0
        self.thread = threading.Thread(target=self._run, name="probe-ui.refresh", daemon=True)

    def start(self) -> Snapshotter:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping = True
        self.wake.set()
        self.slow_session.close()

    def current(self) -> dict[str, Any]:
        """The cached snapshot; asking for it keeps the refresh going. One older than
        ``stale_after_s`` (nobody looked for a while, so nothing was asked: the job may have
        hung since) is not shown as the job's state: its tiles and verdicts are withheld and
        ``stale_s`` says how old it is, until a fresh round is in (a page opened during a hang
        painted the last green snapshot, 72 s old)."""
        self.wanted_at = time.monotonic()
        self.wake.set()
        snap = self.snapshot
        at = snap.get("refreshed_at")
        age = time.time() - at if at is not None else None
        if age is not None and age > self.stale_after_s:
            return {"tiles": [], "verdicts": {}, "refreshed_at": None,
                    "stale_s": round(age, 1)}
        return snap

    @property
    def stale_after_s(self) -> float:
        """A snapshot this old was not being refreshed: a few missed refreshes past the idle
        time (a slow round at scale takes seconds, and is not stale)."""
        return self.idle_s + 4 * self.refresh_s

    def refresh_once(self, slow: bool = True, wait_slow: bool = True) -> dict[str, Any]:
        """One refresh; ``slow`` also starts the doctor/straggler round on its own thread (its
        second round takes seconds at scale: the tiles must not wait for it)."""
        with self.lock:
            targets = resolve_ranks(self.session)
            t0 = time.monotonic()
            results = fan_out(self.session, targets, _fast_call)
            verdict = diagnose_hang([rank_state(r) for r in results])
            if slow and not (self.slow_thread and self.slow_thread.is_alive()):
                self.slow_thread = threading.Thread(
                    target=self._slow_job, args=(targets, results, verdict),
                    name="probe-ui.slow", daemon=True)
                self.slow_thread.start()
                if wait_slow:
                    self.slow_thread.join()
            now = time.time()
            hang = verdict.to_dict()
            snap = {
                "refreshed_at": now, "fanout_ms": round(1e3 * (time.monotonic() - t0), 1),
                "tiles": build_tiles(results, hang, now),
                "verdicts": {"hang": hang, **self.slow_state.get("verdicts", {})},
                "slow": self.slow_state.get("slow", {}),
                "throughput": self.slow_state.get("throughput"),
                "slow_at": self.slow_state.get("at"),
            }
            self.snapshot = snap
            return snap

    def _slow_job(self, targets: list[RankTarget], first: list[RankResult],
                  verdict: Any) -> None:
        t0 = time.time()
        try:
            self.slow_state = self._slow_round(targets, first, verdict)
        except ProbeCLIError as e:
            self.slow_state = {**self.slow_state, "error": e.message}
        self.slow_next = time.time() + 4 * (time.time() - t0)

    def _slow_round(self, targets: list[RankTarget], first: list[RankResult],
                    verdict: Any) -> dict[str, Any]:
        """Doctor's and straggler's own gathering and diagnosis, reusing the hang round, on a
        session of its own (its own connections) so that the per-refresh round goes on."""
        answered = [r for r in first if r.ok]
        urls = {r.url for r in answered}
        live = [t for t in targets if t.endpoint.label in urls]
        grad_wait = max(0.1, min(1.0, self.session.timeout / 4))
        second = {r.rank: r for r in fan_out(self.slow_session, live,
                                             doctor_evidence(50, grad_wait))}
        docs = []
        for r in answered:
            d = second.get(r.rank)
            docs.append(rank_doc(rank_state(r), d.data if d is not None and d.ok else None))
        report = diagnose_doctor(verdict, docs, verdict.threshold_s or 5.0)
        strag = fan_out(self.slow_session, live, straggler_evidence(50))
        straggler, _ = straggler_verdict(strag, 200, 0.1)  # what `probe straggler` prints
        slow = {d.rank: d.slow or [] for d in docs}
        # `probe throughput`'s numbers per rank, from the same answers doctor judged
        ranks, job = from_rows({d.rank: d.throughput[0] for d in docs if d.throughput},
                               len(targets), isolated=docs_not_data_parallel(docs))
        throughput = {"ranks": [t.to_json() for t in ranks], "job": job.to_json()}
        return {"verdicts": {"doctor": report.to_dict(), "straggler": straggler.to_dict()},
                "slow": slow, "throughput": throughput, "at": time.time()}

    def _run(self) -> None:
        n = 0
        while not self.stopping:
            self.wake.wait(self.refresh_s)
            self.wake.clear()
            if self.stopping:
                return
            if time.monotonic() - self.wanted_at > self.idle_s:
                continue  # nobody is looking: ask the agents nothing
            t0 = time.monotonic()
            try:
                # Every slow_every refreshes, and never more than a fifth of the time: at 64
                # ranks on a small machine one slow round takes seconds.
                due = n % self.slow_every == 0 and time.time() >= self.slow_next
                self.refresh_once(slow=due, wait_slow=False)
            except ProbeCLIError as e:
                self.snapshot = {**self.snapshot, "error": e.message}
            n += 1
            time.sleep(max(0.0, self.refresh_s - (time.monotonic() - t0)))


def run_sql(session: Session, lock: threading.Lock, sql: str, max_rows: int = 1000
            ) -> dict[str, Any]:
    """`probe query` from the page: every rank's rows, a leading rank column (read-only:
    the agents allow only read statements)."""
    with lock:
        results = fan_out(session, resolve_ranks(session),
                          lambda c, _t: c.query(sql, max_rows=max_rows))
    columns: list[str] = []
    rows: list[list[Any]] = []
    errors = []
    for r in results:
        if r.ok and r.data:
            q = QueryBody.from_wire(r.data)
            columns = ["rank", *q.columns]
            rows.extend([r.rank, *row] for row in q.rows)
        else:
            msg = Envelope.from_wire(r.data).error or (r.error.message if r.error else "no answer")
            errors.append(f"rank {r.rank}: {msg}")
    return {"columns": columns, "rows": rows, "errors": errors}
