"""Throughput per rank and for the job, and the biggest lever. Pure: the rows of the canned query
``throughput`` in, ``RankThroughput``s, a ``JobThroughput`` and doctor's LOW THROUGHPUT finding
out (`probe throughput` and `probe doctor` both use these).

Where a step goes (shares of a traced step's time, medians over traced steps): forward,
backward and optimizer compute; input (DataLoader wait); collectives (explicit calls timed by
the agent); host (the rest: Python outside modules, waits nothing else saw). The lever is the
largest non-compute share when it is at least ``LEVER_SHARE``. When compute dominates but runs
far below the peak (``compute_flops_per_s`` under ``HOST_EFFICIENCY`` of it: the FLOPs are
spread over many tiny ops, each paying Python and dispatch overhead), the lever is host
overhead inside the modules: fewer, larger ops (fusion, torch.compile, a larger micro-batch).
A job whose compute dominates and runs near the peak has no lever: the hardware is busy.

Checkpoint saves and eval intervals are pauses: shares of the wall time of every step in the
window (not medians of traced steps: a save every 10 steps is 10% of the time and in no median).
A pause of at least ``PAUSE_SHARE`` is a lever too (nothing trains during it, and the remedy,
saving or evaluating less often or asynchronously, is cheap); against a traced-step lever the
larger in seconds per step wins: the pause's mean cost per step against the share x the
median step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .checks import Context, DoctorCheck, Evidence
from .findings import INFO, Finding, RankDoc, Report, num
from .levers import LEVER_EVIDENCE, LEVER_KEYS, Extras, extras_of, small_ops

#: A non-compute share of the step at least this large is the lever (and doctor's finding).
LEVER_SHARE = 0.3
#: A checkpoint or eval share of the wall time at least this large is a lever.
PAUSE_SHARE = 0.1
PAUSES = ("checkpoint", "eval")
#: Compute (forward + backward) reaching less than this share of the peak is host-bound.
HOST_EFFICIENCY = 0.02
#: Traced steps the breakdown needs before it is trusted.
MIN_TRACED = 2
SHARES = ("forward", "backward", "optimizer", "input", "collective", "host")
NEXT = {
    "input": "probe flame   (where the DataLoader's time goes; then more workers, pin_memory)",
    "collective": "probe query \"SELECT op, count(*), round(sum(duration), 3) AS s FROM "
                  "python.collectives GROUP BY op ORDER BY s DESC\"",
    "host": "probe flame   (the Python outside modules; then torch.compile or CUDA graphs)",
    "small_ops": "model = torch.compile(model)   (fuses the small ops; `probe slow` shows the "
                 "modules; or fewer, larger ops: a larger micro-batch)",
    "small_ops_compiled": "probe slow   (the modules; fewer, larger ops: a larger micro-batch)",
    "graph_breaks": "TORCH_LOGS=graph_breaks python train.py   (each break names the Python "
                    "line that splits the graph: fix it or move it out of the model)",
    "module_host": "probe flame   (the Python inside that module's forward: move the host work "
                   "out of the step, into the DataLoader, or onto the device)",
    "host_syncs": "probe query \"SELECT file, line, kind, sum(calls) AS calls FROM "
                  "python.host_syncs GROUP BY ALL ORDER BY calls DESC LIMIT 10\"",
    "checkpoint": "probe query \"SELECT step, round(ckpt_wait, 3) AS s FROM python.step_stats "
                  "WHERE ckpt_wait > 0 ORDER BY step DESC LIMIT 10\"   (then save less often, or "
                  "with torch.distributed.checkpoint.async_save)",
    "eval": "probe query \"SELECT step, round(eval_wait, 3) AS s FROM python.step_stats WHERE "
            "eval_wait > 0 ORDER BY step DESC LIMIT 10\"   (then evaluate less often or on fewer "
            "batches)",
}
#: Levers another doctor check already reports as its own finding.
SAME_AS = {"input": "dataloader", "collective": "collectives"}
WHAT = {
    "input": "waiting for input (DataLoader __next__)",
    "collective": "in collectives",
    "host": "in host code outside the modules",
    "small_ops": "in many small ops",
    "graph_breaks": "in many small ops around graph breaks",
    "module_host": "in host code inside one module's forward",
    "host_syncs": "in host syncs (each waits for the device on a GPU)",
    "checkpoint": "saving checkpoints",
    "eval": "evaluating (model.eval() to model.train())",
}
#: On CUDA the stage times are GPU time (CUDA events around the outermost modules), so the
#: remainder is the GPU's time outside the model's forward, backward and optimizer spans.
WHAT_CUDA = {**WHAT, "host": "with the GPU outside the model's kernels (idle while the host "
                             "launches or syncs, or running work outside modules)"}
NEXT_CUDA = {**NEXT, "host": "probe profile --for 5   (the GPU timeline's gaps; then CUDA graphs, "
                             "torch.compile, fewer host syncs such as .item())"}


def _f(v: Any) -> float | None:
    return num(v)


@dataclass(slots=True)
class RankThroughput:
    rank: Any
    row: dict[str, Any]
    peak_override: float | None = None
    extras: Extras | None = None
    shares: dict[str, float] = field(default_factory=dict)
    pauses: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        r = self.row
        self.shares = {k: v for k in SHARES if (v := _f(r.get(f"{k}_share"))) is not None}
        self.pauses = {k: v for k in PAUSES if (v := _f(r.get(f"{k}_share"))) is not None}

    @property
    def on_cuda(self) -> bool:
        return bool(self.row.get("on_cuda"))

    def what(self, name: str) -> str:
        return (WHAT_CUDA if self.on_cuda else WHAT)[name]

    def next(self, name: str) -> str:
        ex = self.extras
        if name == "small_ops" and ex is not None and ex.compiled is not None \
                and ex.compiled.compiled:
            name = "small_ops_compiled"
        return (NEXT_CUDA if self.on_cuda else NEXT)[name]

    @property
    def peak(self) -> float | None:
        return self.peak_override or _f(self.row.get("peak_flops"))

    @property
    def peak_source(self) -> str | None:
        if self.peak_override:
            return "--peak-tflops"
        return self.row.get("peak_source")

    @property
    def mfu(self) -> float | None:
        fps, peak = _f(self.row.get("flops_per_s")), self.peak
        return fps / peak if fps and peak else None

    def lever(self) -> tuple[str, float, str] | None:
        """(lever, share of the step, evidence) or None: see the module docstring."""
        pause = max(((k, v) for k, v in self.pauses.items() if v >= PAUSE_SHARE),
                    key=lambda kv: kv[1], default=None)
        ex = self.extras or Extras()
        if int(_f(self.row.get("traced_steps")) or 0) < MIN_TRACED or not self.shares:
            return self._pause(pause) if pause else self._syncs(ex)
        name, share = max(((k, self.shares.get(k, 0.0)) for k in ("input", "collective", "host")),
                          key=lambda kv: kv[1])
        compute = sum(self.shares.get(k, 0.0) for k in ("forward", "backward", "optimizer"))
        if pause and (share < LEVER_SHARE or self._pause_wins(pause[0], share)):
            return self._pause(pause)
        if share >= LEVER_SHARE and name != "host":
            return name, share, (f"{share:.0%} of the step {self.what(name)}; compute "
                                 f"(forward+backward+optimizer) {compute:.0%}")
        host = share if name == "host" and share >= LEVER_SHARE else 0.0
        # A module that waits on host code, or compute spread over many small ops, is a more
        # precise lever than the host remainder when it takes more of the step (the remainder
        # also holds DDP's wait at the end of backward and the gaps between modules).
        if ex.module is not None and ex.module.share >= host:
            m = ex.module
            return "module_host", m.share, (
                f"{m.module}: {m.ms:.1f} ms per step with no tensor work ({m.flops_share:.1%} "
                f"of the step's FLOPs, {m.op_ms:.1f} ms in its own ops): host code in its "
                "forward")
        if host and ex.syncs is not None and ex.syncs.many:
            return "host_syncs", host, (f"{host:.0%} of the step in host code outside the "
                                        f"modules, with {self._sync_text(ex)}")
        cfs, peak = _f(self.row.get("compute_flops_per_s")), self.peak
        step_ms = _f(self.row.get("step_ms")) or 0.0
        fb = self.shares.get("forward", 0.0) + self.shares.get("backward", 0.0)
        small, ops_text = small_ops(ex.ops, fb * step_ms)
        if cfs is not None and peak and cfs / peak < HOST_EFFICIENCY and small and \
                compute > host:
            base = (f"compute is {compute:.0%} of the step but reaches {cfs / 1e9:.2f} GFLOP/s, "
                    f"{cfs / peak:.1%} of the peak ({peak / 1e12:.2f} TFLOP/s, "
                    f"{self.peak_source}); {ops_text}: the time goes {self.what('small_ops')}")
            c = ex.compiled
            if c is not None and c.compiled and c.breaks:
                top = c.row.get("top_break") or "see TORCH_LOGS=graph_breaks"
                return "graph_breaks", compute, (f"{base}; {c.what()} (most often: {top})")
            if c is not None and c.compiled:
                return "small_ops", compute, f"{base}; {c.what()}"
            return "small_ops", compute, f"{base}; the model is not compiled: torch.compile " \
                "fuses them into fewer kernels"
        if host:
            return "host", host, (f"{host:.0%} of the step {self.what('host')}; compute "
                                  f"(forward+backward+optimizer) {compute:.0%}")
        return self._syncs(ex)

    def _sync_text(self, ex: Extras) -> str:
        sy = ex.syncs
        assert sy is not None
        return (f"{sy.per_step:g} host syncs per step ({sy.top()}; {sy.ms_per_step:.2f} ms a "
                f"step inside them{' waiting for the GPU' if self.on_cuda else ''}): "
                f"{sy.advice()}")

    def _syncs(self, ex: Extras) -> tuple[str, float, str] | None:
        """Many host syncs with no larger lever: named with what they cost here."""
        sy = ex.syncs
        if sy is None or not sy.many:
            return None
        step_ms = _f(self.row.get("step_ms")) or 0.0
        share = min(sy.ms_per_step / step_ms, 1.0) if step_ms else 0.0
        return "host_syncs", share, self._sync_text(ex)

    def _pause_wins(self, name: str, share: float) -> bool:
        """A pause against a traced-step share, both in seconds per step: the pause's mean
        cost per step against the share of the median step (a share of the wall time and a
        median share are not the same unit: the fault suite's checkpoint job had checkpoints
        at 29% of the wall time, 7.3 ms a step, and host at 47% of its 6.1 ms median step)."""
        per_step = _f(self.row.get(f"{name}_ms_per_step"))
        step_ms = _f(self.row.get("step_ms"))
        if per_step is None or not step_ms:
            return self.pauses.get(name, 0.0) >= share * (1 - sum(self.pauses.values()))
        return per_step >= share * step_ms

    def _pause(self, pause: tuple[str, float]) -> tuple[str, float, str]:
        name, share = pause
        n = self.row.get("checkpoint_steps" if name == "checkpoint" else "eval_steps")
        ms = _f(self.row.get(f"{name}_ms_per_step"))
        return name, share, (f"{share:.0%} of the wall time of the last {self.row.get('steps')} "
                             f"steps {self.what(name)} ({n} of them paused"
                             + (f", {ms:.1f} ms a step on average" if ms is not None else "")
                             + ")")

    def to_json(self) -> dict[str, Any]:
        lv = self.lever()
        return {**self.row, "peak_flops": self.peak, "peak_source": self.peak_source,
                "mfu": self.mfu,
                "lever": None if lv is None else {"lever": lv[0], "share": lv[1],
                                                  "evidence": lv[2], "next": self.next(lv[0])}}


@dataclass(slots=True)
class JobThroughput:
    """The job: sums over ranks (tokens/s, samples/s, FLOP/s), GB_tok, MFU of the sum.

    ``layout``: the ``parallel`` canned query's row of one rank (tp, pp, world, source, mesh),
    or None when no rank has one (a single process, or an older agent).
    """

    ranks: list[RankThroughput]
    world: int
    layout: dict[str, Any] | None = None
    #: isolated.not_data_parallel's reason: the ranks never communicate (one model each)
    isolated: str | None = None

    def data_parallel(self) -> tuple[int, int, int, str]:
        """(dp world, tp, pp, how it was known)."""
        if self.isolated:  # each rank's model sees its own tokens only: a replica of one
            return 1, 1, 1, self.isolated
        lay = self.layout or {}
        tp, pp = int(_f(lay.get("tp")) or 1), int(_f(lay.get("pp")) or 1)
        world = int(_f(lay.get("world")) or self.world)
        if lay.get("source"):
            return max(world // (tp * pp), 1), tp, pp, f"{lay['source']}: {lay.get('mesh')}"
        return self.world, 1, 1, "assumed = ranks reached (no tensor/pipeline groups detected)"

    def to_json(self) -> dict[str, Any]:
        rs = self.ranks

        missing = max(self.world - len(rs), 0)

        def total(key: str) -> float | None:
            # A rank that did not answer counts as the median of those that did (as in GB_tok):
            # the sum of the answering ranks alone printed half a 2-rank job as "job:".
            vals = [v for r in rs if (v := _f(r.row.get(key))) is not None]
            if not vals or len(vals) != len(rs):
                return None
            return sum(vals) + sorted(vals)[len(vals) // 2] * missing

        tokens = [int(v) for r in rs if (v := _f(r.row.get("tokens"))) is not None]
        dp, tp, pp, dp_source = self.data_parallel()
        # GB_tok: micro-batch x accumulation x data-parallel world x context = the tokens of
        # one optimizer step summed over the DP ranks; ranks that did not answer count as the
        # median of those that did. With tensor/pipeline groups, the ranks of one replica feed
        # the same tokens (or, past the first stage, none): a replica counts once.
        gb = None
        if tokens:
            med = sorted(tokens)[len(tokens) // 2]
            if tp * pp > 1 or self.isolated:
                gb = med * dp
            else:
                gb = sum(tokens) + med * max(self.world - len(tokens), 0)
        fps = total("flops_per_s")
        peaks = [r.peak for r in rs]
        peak = sum(p for p in peaks if p) * self.world / len(peaks) \
            if all(peaks) and peaks else None
        mb = [_f(r.row.get("micro_batches")) for r in rs]
        first = rs[0].row if rs else {}
        samples = _f(first.get("samples"))
        micro = _f(first.get("micro_batches"))
        return {
            "ranks": len(rs), "world": self.world, "estimated_ranks": missing,
            "dp_world": dp, "dp_source": dp_source, "tp": tp, "pp": pp,
            "tokens_per_s": total("tokens_per_s"),
            "samples_per_s": total("samples_per_s"), "gb_tok": gb,
            "micro_batch": samples / micro if samples and micro else None,
            "accumulation": int(mb[0]) if mb and mb[0] else None,
            "context_len": first.get("context_len"),
            "flops_per_s": fps, "peak_flops": peak, "mfu": fps / peak if fps and peak else None,
        }


def from_rows(rows: dict[Any, dict[str, Any]], world: int, peak_tflops: float | None = None,
              layout: dict[str, Any] | None = None, extras: dict[Any, Extras] | None = None,
              isolated: str | None = None) -> tuple[list[RankThroughput], JobThroughput]:
    override = peak_tflops * 1e12 if peak_tflops else None
    ranks = [RankThroughput(r, row, override, (extras or {}).get(r))
             for r, row in sorted(rows.items())]
    return ranks, JobThroughput(ranks, world, layout, isolated)


def doc_answers(d: RankDoc) -> dict[str, list[dict[str, Any]] | None]:
    """The lever's other evidence that doctor asked one rank for."""
    return {key: d.rows(key) for key in LEVER_KEYS}


def check_throughput(report: Report, docs: list[RankDoc]) -> None:
    """LOW THROUGHPUT: a rank whose lever takes a large share of its step (or whose compute
    runs far below the peak), named with its evidence and the next command."""
    rows = {d.rank: d.throughput[0] for d in docs if d.throughput}
    if not rows:
        why = ("no traced steps yet" if any(d.throughput is not None for d in docs)
               else "no rank answered the throughput query")
        report.unchecked.append(f"throughput: {why}")
        return
    extras = {d.rank: extras_of(doc_answers(d), _f(rows[d.rank].get("step_ms")))
              for d in docs if d.rank in rows}
    ranks, _ = from_rows(rows, len(docs), extras=extras)
    hits = [(r, lv) for r in ranks if (lv := r.lever()) is not None]
    if not hits:
        mfus = [f"rank {r.rank} {m:.0%}" for r in ranks if (m := r.mfu) is not None]
        report.fine.append("throughput: compute dominates the step"
                           + (f" (MFU {', '.join(mfus)})" if mfus else ""))
        return
    by: dict[str, list[tuple[RankThroughput, tuple[str, float, str]]]] = {}
    for r, lv in hits:
        by.setdefault(lv[0], []).append((r, lv))
    name, group = max(by.items(), key=lambda kv: (len(kv[1]), max(x[1][1] for x in kv[1])))
    same = SAME_AS.get(name)
    if same and any(f.check == same for f in report.findings):
        # The same lever already has its own finding (DATA-BOUND, collective wait): one
        # problem, one finding.
        report.fine.append(f"throughput: the lever is {WHAT[name]} (the {same} finding)")
        return
    top = max(lv[1] for _, lv in group)
    evidence = [f"rank {r.rank}: {lv[2]}" + (f"; MFU {r.mfu:.1%}" if r.mfu is not None else "")
                for r, lv in group]
    label = {"input": "input-bound", "collective": "communication-bound", "host": "host-bound",
             "small_ops": "host-bound (small ops)", "checkpoint": "checkpoint pauses",
             "eval": "eval pauses", "graph_breaks": "graph breaks (small ops)",
             "host_syncs": "host syncs", "module_host": "bottleneck"}[name]
    # Info, not a warning: a slow job is not a broken one (like the slowest modules, this is
    # where the time goes), and the fault suite's healthy jobs sleep as their "work".
    first = group[0][0]
    title = (f"LOW THROUGHPUT: {label}: {first.what(name)} takes {top:.0%} of the "
             f"{'wall time' if name in PAUSES else 'step'}")
    ex = first.extras
    if name == "module_host" and ex is not None and ex.module is not None:
        title = (f"LOW THROUGHPUT: bottleneck: {ex.module.module}: {ex.module.ms:.0f} ms per "
                 "step with no tensor work: host code in its forward")
    elif name == "host_syncs" and ex is not None and ex.syncs is not None:
        title = f"LOW THROUGHPUT: host syncs: {ex.syncs.top()}"
    report.findings.append(Finding(
        INFO, "throughput", title, evidence, first.next(name),
        sorted(r.rank for r, _ in group), score=top, detail={"lever": name, "share": top}))


def _throughput(report: Report, ctx: Context) -> None:
    if not ctx.verdict.problem:  # a hung job's throughput is the hang's
        check_throughput(report, ctx.docs)


#: The check of this module, for doctor.py's registry (checks.py).
CHECKS = (
    DoctorCheck("throughput", 110, _throughput,
                evidence=(Evidence("throughput", "throughput", lambda last: {"last": last}),
                          *LEVER_EVIDENCE)),
)
