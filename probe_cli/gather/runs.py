"""One run's evidence for `probe compare`: what a live job or a post-mortem copy kept, per step.

``gather_run(session, last)`` asks every rank of one target (a live job, or a job's post-mortem
directory: both answer the same queries) for its last ``last`` steps, the per-step self time of
its modules on traced steps, its memory by kind, where its steps go, its LR schedule and what
it runs (versions, command line). ``RunEvidence`` holds it job-wide, ready to be compared:

- the job's step time for a step is its slowest rank's (the job moves at that pace);
- its tokens per second add every rank's tokens of that step over that time;
- a module's self time in a step is the mean over the ranks that traced it;
- memory, shares and settings are medians over the ranks.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import median
from typing import Any

from probe_protocol.query import QueryBody

from ..diagnose.compare import MEMORY_KINDS, SHARES, RunEvidence
from ..errors import ProbeCLIError
from ..result import RankResult
from ..transport.fanout import RankTarget, fan_out, resolve_ranks
from ..transport.rank_client import RankClient
from ..transport.session import Session

STEPS_SQL = """
SELECT rank, step, duration, tokens, samples, micro_batches, context_len, compute_dtype, mfu,
       coalesce(flops_measured, false) AS flops_measured, cpu_wait_ms
FROM python.steps WHERE duration IS NOT NULL
QUALIFY row_number() OVER (PARTITION BY rank ORDER BY step DESC) <= {last}
"""
#: Whether it runs compiled, as torch reported it last (python.compile_state).
COMPILE_SQL = """
SELECT compiled_root, compiled_modules, graph_breaks, recompiles FROM python.compile_state
ORDER BY step DESC LIMIT 1
"""
#: Host syncs per step (.item(), .cpu(), ...: python.host_syncs), median over the steps kept.
SYNCS_SQL = """
SELECT median(n) AS host_syncs_per_step FROM (
    SELECT step, sum(calls) AS n FROM python.host_syncs GROUP BY step
    QUALIFY row_number() OVER (ORDER BY step DESC) <= {last})
"""
#: What the job runs, from each rank's /v1/info (or its copy's meta).
INFO_KEYS = ("torch", "python", "version", "world_size")


def gather_run(session: Session, last: int, label: str) -> RunEvidence:
    """Ask every rank of ``session``'s target; a rank that fails is listed, never raised."""

    def ask(client: RankClient, _target: RankTarget) -> dict[str, Any]:
        steps = client.query(STEPS_SQL.format(last=int(last)))
        body: dict[str, Any] = {"ok": True, "rank": QueryBody.from_wire(steps).rank,
                                "steps": steps}
        # The rest is optional: an older agent or copy may lack a table or a query.
        for key, fetch in (("modules", lambda: client.canned("module_self_steps", last=last)),
                           ("memory", lambda: client.canned("memory_breakdown", last=20)),
                           ("throughput", lambda: client.canned("throughput", last=last)),
                           ("schedule", lambda: client.canned("schedule")),
                           ("compile", lambda: client.query(COMPILE_SQL)),
                           ("syncs", lambda: client.query(SYNCS_SQL.format(last=int(last)))),
                           ("info", client.info)):
            try:
                body[key] = fetch()
            except ProbeCLIError:
                body[key] = None
        return body

    results = fan_out(session, resolve_ranks(session), ask)
    run = RunEvidence(label=label)
    ok = [r for r in results if r.ok and r.data]
    run.failed = [r for r in results if not r.ok]
    run.ranks = sorted(r.rank for r in ok if r.rank is not None)
    _steps(run, [_rows(r.data, "steps") for r in ok])
    _modules(run, [_rows(r.data, "modules") for r in ok])
    _medians(run.memory, [_rows(r.data, "memory") for r in ok], MEMORY_KINDS)
    _medians(run.shares, [_rows(r.data, "throughput") for r in ok], SHARES)
    _settings(run, ok)
    return run


def _rows(data: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    body = (data or {}).get(key)
    if not body or not body.get("ok", True):
        return []
    q = QueryBody.from_wire(body)
    return [dict(zip(q.columns, row)) for row in q.rows]


def _steps(run: RunEvidence, per_rank: list[list[dict[str, Any]]]) -> None:
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for rows in per_rank:
        for row in rows:
            if not row.get("flops_measured"):  # the FLOP-measured step costs more: left out
                by_step[int(row["step"])].append(row)
    job_tokens: list[float] = []
    cpu_wait: list[float] = []  # per step: the largest share of it a rank waited for a CPU
    for step, rows in by_step.items():
        if len(rows) < len(per_rank):
            continue  # not every rank kept this step: its job-wide time is not known
        slowest = max(float(r["duration"]) for r in rows)
        run.step_s[step] = slowest
        tokens = [float(r["tokens"]) for r in rows if r.get("tokens") is not None]
        if len(tokens) == len(rows):
            job_tokens.append(sum(tokens))
            if slowest > 0:
                run.tokens_per_s[step] = sum(tokens) / slowest
        waits = [float(r["cpu_wait_ms"]) / 1e3 / slowest for r in rows
                 if r.get("cpu_wait_ms") is not None and slowest > 0]
        if waits:
            cpu_wait.append(max(waits))
        mfus = [float(r["mfu"]) for r in rows if r.get("mfu") is not None]
        if mfus:
            run.mfu.append(median(mfus))
    if cpu_wait:  # a busy machine, not the code: compare says so beside a change
        run.shares["cpu_wait_share"] = median(cpu_wait)
    if job_tokens:  # the global batch in tokens: every rank's tokens of one optimizer step
        run.settings["global_batch_tokens"] = median(job_tokens)
    # what each rank last recorded (samples and tokens are known on traced steps only)
    for key in ("micro_batches", "context_len", "compute_dtype", "samples"):
        values = []
        for rows in per_rank:
            known = [r for r in rows if r.get(key) is not None]
            if known:
                values.append(max(known, key=lambda r: int(r["step"]))[key])
        if values:
            run.settings[key] = values[0] if isinstance(values[0], str) else median(values)


def _modules(run: RunEvidence, per_rank: list[list[dict[str, Any]]]) -> None:
    acc: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    steps: set[int] = set()
    for rows in per_rank:
        for row in rows:
            step = int(row["step"])
            steps.add(step)
            acc[(str(row["module"]), str(row["part"]))][step].append(float(row["self_s"]))
    run.traced_steps = len(steps)
    for key, per_step in acc.items():
        # a step where a traced module did not run counts 0 for it (a branch not taken)
        run.modules[key] = {s: sum(per_step.get(s, [])) / max(len(per_step.get(s, [])), 1)
                            for s in steps}


def _medians(into: dict[str, float], per_rank: list[list[dict[str, Any]]],
             keys: tuple[str, ...]) -> None:
    # one row per rank: memory_breakdown has one per device (a CUDA job's 'cpu' row too): the
    # largest is the device the job's memory is on
    firsts = [max(rows, key=lambda r: r.get("total_mib") or 0) for rows in per_rank if rows]
    for key in keys:
        values = [float(row[key]) for row in firsts if row.get(key) is not None]
        if values:
            into[key] = median(values)


def _settings(run: RunEvidence, ok: list[RankResult]) -> None:
    infos = [(r.data or {}).get("info") or {} for r in ok]
    for key in INFO_KEYS:
        values = {str(i[key]) for i in infos if i.get(key) is not None}
        if values:
            run.settings[key] = ", ".join(sorted(values))
    run.settings.setdefault("world_size", len(ok))
    argv = next((i.get("argv") for i in infos if i.get("argv")), None)
    if argv:
        run.settings["command"] = " ".join(str(a) for a in argv)
    for key, columns in (("compile", ("compiled_root", "compiled_modules", "graph_breaks",
                                      "recompiles")), ("syncs", ("host_syncs_per_step",))):
        firsts = [rows[0] for rows in (_rows(r.data, key) for r in ok) if rows]
        for col in columns:
            found: list[Any] = [row[col] for row in firsts if row.get(col) is not None]
            numbers = [float(v) for v in found
                       if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if numbers and len(numbers) == len(found):
                run.settings[col] = median(numbers)
            elif found:
                run.settings[col] = found[0]
    sched = next((rows for rows in (_rows(r.data, "schedule") for r in ok) if rows), [])
    if sched:
        top = sched[0]
        for key in ("kind", "warmup_steps", "end_step", "framework", "lr_peak"):
            if top.get(key) is not None:
                run.settings[f"schedule_{key}" if key != "framework" else key] = top[key]
