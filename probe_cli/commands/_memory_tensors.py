"""`probe memory --tensors`: the live tensors of every rank grouped by device, dtype and shape."""

from __future__ import annotations

from typing import Any

from probe_protocol.bodies import TensorsBody

from ..outcome import Outcome, finish
from ..render.text import format_table
from ..result import RankResult
from ..transport.client import ProbeClient
from ..transport.fanout import run_live_on_ranks
from ..transport.session import Session

_COLS = ("rank", "count", "change", "mib", "device", "dtype", "shape", "kind", "holder")


def tensors_outcome(session: Session, top: int) -> Outcome:
    results = run_live_on_ranks(session, ProbeClient.memory_tensors, top)
    return finish(session, results, lambda ok: _render(ok))


def _change(v: Any) -> str:
    return "" if v is None else f"{v:+d}"


def _render(ok: list[RankResult]) -> list[str]:
    rows = []
    notes = []
    for r in ok:
        d = TensorsBody.from_wire(r.data)
        for g in d.groups:
            rows.append([r.rank, g["count"], _change(g.get("count_change")), g["mib"],
                         g["device"], g["dtype"], g["shape"], g["kind"], g.get("holder") or ""])
        since = d.previous_step
        notes.append(f"rank {r.rank}: {d.tensors} tensors, {d.total_mib} MiB at "
                     f"step {d.step}; change since "
                     + ("the previous call" + (f" (step {since})" if since not in (None, -1)
                                               else "") if since is not None
                        else "the previous call: none yet (run it again to see growth)")
                     + f"; census {d.census_ms} ms")
    return [*format_table(list(_COLS), rows), "", *notes]
