"""`probe memory`: where memory goes (by kind, per rank), memory growth per step (leaks), what
would free memory (--advice), the live tensors (--tensors), per-module CUDA memory (--modules)
and the CUDA allocator's history (--snapshot)."""

from __future__ import annotations

from typing import Any

import click

from probe_protocol.envelope import Envelope
from probe_protocol.query import QueryBody

from ..diagnose.memory_growth import MEMORY_WARMUP_STEPS, MEMORY_WINDOW_STEPS
from ..diagnose.memory_use import BREAKDOWN_STEPS, TOP_ACTIVATIONS, Breakdown, breakdown
from ..errors import RankError
from ..outcome import Outcome, finish
from ..render.memory import render_breakdown
from ..render.text import query_notes
from ..result import RankResult
from ..transport.fanout import Call, RankTarget, fan_out, resolve_ranks
from ..transport.rank_client import RankClient
from ..transport.session import Session
from . import pass_session
from ._canned import canned_outcome, comm_row, render_rows
from ._window import last_option


@click.command("memory")
@last_option(None, 2, "Look at the last N steps (default: 1000, the window `probe doctor` "
             "judges; with --modules: the last N traced steps, default 50).")
@click.option("--modules", "by_module", is_flag=True,
              help="CUDA memory per module (allocated when calls end, allocator peak) instead "
                   "of growth per step.")
@click.option("--limit", type=click.IntRange(min=1), default=15, show_default=True,
              help="With --modules: modules shown per rank.")
@click.option("--warmup", type=click.IntRange(min=0), default=MEMORY_WARMUP_STEPS,
              show_default=True,
              help="Leave out the first N steps each rank recorded (optimizer state and caches "
                   "grow there); the defaults show the numbers `probe doctor` judged.")
@click.option("--advice", is_flag=True,
              help="Also list what would free memory on each rank, most bytes first, each with "
                   "its estimate and the numbers it rests on.")
@click.option("--tensors", is_flag=True,
              help="The live tensors instead, grouped by device, dtype and shape (count, bytes, "
                   "parameters/gradients/optimizer state labelled, a holder where cheap) and "
                   "how each group's count changed since the previous --tensors call.")
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True,
              help="With --tensors: groups shown per rank, largest first.")
@click.option("--snapshot", is_flag=True,
              help="CUDA: record the allocator's history (every alloc and free, with stacks) "
                   "over the next --for steps and write it with -o, one file per rank "
                   "(FILE.rankN.pickle when several answer); pytorch.org/memory_viz opens it.")
@click.option("--for", "for_steps", type=click.IntRange(min=1, max=1000), default=1,
              show_default=True, help="With --snapshot: steps to record.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="With --snapshot: the file to write (required).")
@click.option("--overwrite", is_flag=True,
              help="With --snapshot: replace an existing file (never written through a "
                   "symlink).")
@pass_session
def command(session: Session, last: int | None, by_module: bool, limit: int,
            warmup: int, advice: bool, tensors: bool, top: int, snapshot: bool,
            for_steps: int, output: str | None, overwrite: bool) -> Outcome:
    """Where each rank's memory goes, then its growth per step.

    Breakdown (from the traced steps; `probe trace every 10` traces one step in ten): parameters,
    gradients, optimizer state (this rank's local shard under FSDP2), activations saved for
    backward (and the modules that save the most, with their share), and the rest (CUDA:
    allocated minus those; CPU: the job's memory minus those, the interpreter and torch
    included); on CUDA the total against the device's capacity.

    Growth: the job's memory (CUDA allocated, or RSS minus the agent's share and malloc's free
    heap) with a robust growth per step (Theil-Sen; mem_mib_per_step, late_mib_per_step for the
    second half, rising_quarters), the raw RSS, the agent's own MiB and threads, CUDA reserved,
    peak, alloc retries and OOMs (canned query memory_growth).

    --json: one object per rank: the memory_growth query body (columns, rows) plus
    "breakdown" (null before a traced step was counted) with rank, device, step,
    parameters_mib, gradients_mib, optimizer_mib, activations_mib, other_mib, total_mib,
    capacity_mib and used_share (CUDA; else null), allocated_mib, reserved_mib, peak_mib,
    params_fp32_mib, sharded, bytes ({parameters, gradients, optimizer, activations}: the
    same in exact bytes; the _mib fields are rounded to 0.01), activations_mib null and
    activations_note (why) when activations were not counted (under torch.compile they cannot
    be), cause (the largest of
    parameters, gradients, optimizer,
    activations), top_activations [{module, saved_mib, share, input_mib,
    checkpoint_saves_mib}] and advice [{lever, saves_mib, basis, action, acts_on}], most bytes
    first (lever: checkpoint, micro_batch, shard_optimizer, bf16, expandable_segments).
    --csv: the growth table.
    """
    if snapshot:
        if not output:
            raise click.UsageError("--snapshot needs -o FILE (where to write the pickle)")
        from ._memory_snapshot import snapshot_outcome

        return snapshot_outcome(session, for_steps, output, overwrite)
    if tensors:
        from ._memory_tensors import tensors_outcome

        return tensors_outcome(session, top)
    if by_module:
        return canned_outcome(
            session, "memory_by_module",
            "no traced steps yet (`probe trace on` traces every step from the next one)",
            last=last or 50, limit=limit,
        )
    if session.output == "csv":
        return canned_outcome(
            session, "memory_growth",
            "no optimizer step seen yet (python.memory gets one row per optimizer step)",
            last=last or MEMORY_WINDOW_STEPS, warmup=warmup,
        )
    growth = {"last": last or MEMORY_WINDOW_STEPS, "warmup": warmup}
    results = fan_out(session, resolve_ranks(session), _gather(growth))
    from ..diagnose.isolated import not_data_parallel

    comm = {r.rank: r.data.pop("_comm", None) if r.ok and r.data else None for r in results}
    alone = not_data_parallel(comm)
    world = 1 if alone else len(results)  # ranks of their own model each: nothing to shard
    bds: dict[Any, Breakdown] = {}
    for r in results:
        if r.ok and r.data is not None:
            bd = r.data.pop("_breakdown", None)
            r.data["breakdown"] = bd.to_json(world) if bd is not None else None
            if bd is not None:
                bds[r.rank] = bd
    out = finish(session, results, lambda ok: _render(session, ok, bds, world, advice))
    ok = [r for r in results if r.ok]
    out.stderr[:0] = query_notes(ok)
    if ok and session.output == "text":
        if not any(QueryBody.from_wire(r.data).rows for r in ok if r.data):
            out.stderr.insert(0, "probe: no rows yet: no optimizer step seen yet "
                                 "(python.memory gets one row per optimizer step)")
        elif not any((r.data or {}).get("breakdown") for r in ok):
            out.stderr.insert(0, "probe: no breakdown yet: memory by kind is counted on traced "
                                 "steps (`probe trace every 10` traces one step in ten)")
    return out


def _gather(growth: dict[str, Any]) -> Call:
    def call(client: RankClient, target: RankTarget) -> dict[str, Any]:
        body = client.canned("memory_growth", **growth)
        try:
            rows = QueryBody.from_wire(client.canned("memory_breakdown",
                                                     last=BREAKDOWN_STEPS)).records()
            acts = QueryBody.from_wire(client.canned("memory_activations",
                                                     top=TOP_ACTIVATIONS)).records()
        except RankError:  # an agent without these queries: growth only
            rows, acts = [], []
        rank = Envelope.from_wire(body).rank  # every body carries its rank
        rank = target.rank if rank is None else rank
        body["_breakdown"] = (breakdown(rank, rows[0], acts)
                              if rows and rank is not None else None)
        body["_comm"] = comm_row(client)
        return body

    return call


def _render(session: Session, ok: list[RankResult], bds: dict[Any, Breakdown], world: int,
            advice: bool) -> list[str]:
    lines: list[str] = []
    for r in ok:
        b = bds.get(r.rank)
        if b is not None:
            lines += render_breakdown(b, world, advice)
    if lines:
        lines += ["", "memory growth per step:"]
    return lines + render_rows(session, ok)
