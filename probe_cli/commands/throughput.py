"""`probe throughput`: tokens/s, the global batch in tokens, FLOPs per token (measured against
6N), achieved TFLOP/s and MFU per rank and for the job, where the step goes and the lever."""

from __future__ import annotations

from typing import Any

import click

from probe_protocol.query import QueryBody

from ..diagnose.findings import num
from ..diagnose.isolated import not_data_parallel
from ..diagnose.levers import extras_of
from ..diagnose.schedule import schedules
from ..diagnose.throughput import RankThroughput, from_rows
from ..errors import RankError
from ..gather.evidence import lever_answers
from ..outcome import Outcome, finish
from ..render.text import query_notes
from ..render.throughput import render_throughput
from ..result import RankResult
from ..transport.fanout import Call, RankTarget, fan_out, resolve_ranks
from ..transport.rank_client import RankClient
from ..transport.session import Session
from . import pass_session
from ._canned import comm_row
from ._window import last_option


@click.command("throughput")
@last_option(100, 2, "Look at the last N steps of each rank (medians).")
@click.option("--peak-tflops", type=click.FloatRange(min=0, min_open=True), default=None,
              help="The peak TFLOP/s of one rank's device to judge MFU against, instead of the "
                   "data sheet table (GPUs) or the CPU matmul each node measured once.")
@pass_session
def command(session: Session, last: int, peak_tflops: float | None) -> Outcome:
    """Throughput per rank and for the job, and the biggest lever.

    Per rank: tokens per optimizer step (B x T of the root model's integer input summed over
    its micro-batches, or probe_agent.log(tokens=N)), tokens/s, samples/s, FLOPs per token
    measured with FlopCounterMode over one whole step against 6N, achieved TFLOP/s, MFU (the
    peak and its source), the cost of the measured step, and where a traced step goes:
    forward, backward, optimizer, input (DataLoader), collectives, host (the rest); and the
    pauses, as shares of the window's wall time: checkpoint saves (torch.save, DCP, safetensors
    on the training thread) and eval (model.eval() to model.train() between steps). The lever
    is the largest non-compute share (at least 30%; a pause at least 10%), or many small ops
    when compute runs under 2% of the peak. The job: summed tokens/s, samples/s and TFLOP/s,
    MFU of the sum, and GB_tok = micro-batch x accumulation x data-parallel ranks x context.

    The data-parallel world is the ranks reached unless tensor or pipeline groups are detected
    (a DeviceMesh with dims named tp/pp, Megatron's parallel_state, DeepSpeed's pipeline
    engine): then it is world / (tp x pp), and each replica's tokens count once in GB_tok.
    The output says which ("assumed = ranks reached" when none was found). Ranks that never
    communicate (0 collectives recorded on each over 20+ steps) each train a model of their
    own: the data-parallel world is 1 and GB_tok one rank's tokens ("not data-parallel").

    --json: one object per rank: its "throughput" (the throughput query's columns; mfu,
    peak_flops and peak_source after --peak-tflops; "lever": null or {lever (input |
    collective | host | small_ops | checkpoint | eval), share, evidence, next}; checkpoint_share
    and eval_share: the pauses' share of the window's wall time, checkpoint_steps and
    eval_steps: the steps that had one; on_cuda: the stage times are GPU time, so host is the
    GPU outside the model's spans) and "job" (ranks: those that answered, world, and
    estimated_ranks: the others, each counted as the median of those that answered in the sums;
    dp_world, dp_source, tp, pp, tokens_per_s, samples_per_s, gb_tok, micro_batch,
    accumulation, context_len, flops_per_s, peak_flops, mfu, schedule), the same in every
    rank's object.

    The LR schedule (job "schedule": a list, one object per LR scheduler of the stepping
    optimizers, as the lowest rank read it): scheduler, location, kind, method (read from its
    settings | measured by calling a LambdaLR's function | opaque), warmup_steps, end_step,
    after_end (constant | rises | raises), sched_steps and read_at_step (its own count against
    the optimizer step: per_optimizer_step), total_steps and total_source (the framework's
    max_steps), warmup_tokens, decay_tokens, end_tokens, total_tokens (steps x GB_tok), and
    check: null, or the trap in words (a schedule ending before or after the job's own total,
    or a job already past the schedule's end); observed: the LR as recorded (lr_first,
    lr_first_step, lr_peak, lr_peak_step, lr_last, lr_last_step, and warmup_steps and
    warmup_tokens when it rose from step 1 to a later peak, since_peak), null before any; for
    a loop that sets the LR itself it is the only schedule there is.
    """
    results = fan_out(session, resolve_ranks(session), _gather(last))
    world = len(results)
    rows = {r.rank: r.data.pop("_row") for r in results if r.ok and r.data and r.data.get("_row")}
    extras = {r.rank: extras_of(r.data.pop("_levers", None) or {},
                                num(rows[r.rank].get("step_ms")))
              for r in results if r.ok and r.data and r.rank in rows}
    layout = next((r.data["_parallel"] for r in sorted(results, key=lambda r: str(r.rank))
                   if r.ok and r.data and r.data.get("_parallel")), None)
    comm = {r.rank: r.data.pop("_comm", None) if r.ok and r.data else None for r in results}
    ranks, job = from_rows(rows, world, peak_tflops, layout, extras, not_data_parallel(comm))
    by_rank = {t.rank: t for t in ranks}
    job_json = job.to_json()
    # The schedule is the job's: the lowest rank that has read one speaks for it.
    by_rank_order = sorted(results, key=lambda r: str(r.rank))
    sched: list[Any] = next((r.data["_schedule"] for r in by_rank_order
                             if r.ok and r.data and r.data.get("_schedule")), [])
    now = max((int(t.row["last_step"]) for t in ranks if t.row.get("last_step") is not None),
              default=None)
    job_json["schedule"] = schedules(sched, job_json.get("gb_tok"), now)
    for r in results:
        if r.ok and r.data is not None:
            r.data.pop("_row", None)
            r.data.pop("_schedule", None)
            r.data.pop("_parallel", None)
            r.data.pop("_levers", None)
            r.data.pop("_comm", None)
            t = by_rank.get(r.rank)
            r.data["throughput"] = t.to_json() if t is not None else None
            r.data["job"] = job_json
    out = finish(session, results, lambda ok: _render(ok, by_rank, job_json))
    ok = [r for r in results if r.ok]
    out.stderr[:0] = query_notes(ok)
    if ok and not rows and session.output == "text":
        out.stderr.insert(0, "probe: no rows yet: no optimizer step seen yet (python.steps gets "
                             "one row per optimizer step)")
    return out


def _gather(last: int) -> Call:
    def call(client: RankClient, target: RankTarget) -> dict[str, Any]:
        body = client.canned("throughput", last=last)
        recs = QueryBody.from_wire(body).records()
        body["_row"] = recs[0] if recs else None
        try:
            sched = QueryBody.from_wire(client.canned("schedule")).records()
        except RankError:  # an agent without the table: the rest still stands
            sched = []
        body["_schedule"] = [s for s in sched if s.get("scheduler") is not None or
                             s.get("kind") == "none"]
        try:
            lay = QueryBody.from_wire(client.canned("parallel")).records()
        except RankError:  # as above
            lay = []
        body["_parallel"] = lay[0] if lay else None
        body["_levers"] = lever_answers(client, last)
        body["_comm"] = comm_row(client)
        return body

    return call


def _render(ok: list[RankResult], by_rank: dict[Any, RankThroughput],
            job: dict[str, Any]) -> list[str]:
    return render_throughput([by_rank[r.rank] for r in ok if r.rank in by_rank], job)
