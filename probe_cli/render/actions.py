"""Pure rendering for step-boundary actions: lr, checkpoint, pause, the action list.

Stdlib only; nothing here prints (main.py does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from probe_protocol.actions import ActionBody, ActionListBody, FinishedAction, ResumeBody

from ..group import rank_label
from ..result import RankResult
from .text import format_table

if TYPE_CHECKING:  # the protocol module needs httpx; rendering stays stdlib only
    from ..transport.step_actions import StepOutcome


def human_bytes(n: Any) -> str:
    if not isinstance(n, int):
        return ""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)


def render_lr(results: Sequence[RankResult], colour: bool = False) -> list[str]:
    """Before and after, one row per rank, optimizer and param group; then the schedulers."""
    rows, sched_lines = [], []
    for r in results:
        d = FinishedAction.from_wire(r.data).data
        for opt in d.get("optimizers", []):
            for i, g in enumerate(opt.get("groups", [])):
                rows.append([r.rank, d.get("step"), f"{opt.get('class')}[{opt.get('index')}]",
                             i, g.get("before"), g.get("after")])
        for s in d.get("schedulers", []):
            what = ", ".join(s.get("changed") or []) or "nothing to rescale"
            notes = "; ".join(s.get("notes") or [])
            line = f"{s.get('class')}: scaled {what}" + (f" ({notes})" if notes else "")
            if line not in sched_lines:
                sched_lines.append(line)
    out = format_table(["rank", "step", "optimizer", "group", "lr_before", "lr_after"], rows,
                       colour=colour)
    if sched_lines:
        out += ["", "schedulers (so the change survives their next step):",
                *(f"  {s}" for s in sched_lines)]
    else:
        out += ["", "no LR scheduler found for these optimizers"]
    return out


def render_checkpoint(results: Sequence[RankResult], colour: bool = False) -> list[str]:
    rows = []
    for r in results:
        d = FinishedAction.from_wire(r.data).data
        for f in d.get("files", []):
            rows.append([r.rank, d.get("step"), d.get("mode"), f.get("path"),
                         human_bytes(f.get("bytes"))])
    out = format_table(["rank", "step", "mode", "path", "size"], rows, colour=colour)
    names = next((FinishedAction.from_wire(r.data).data.get("names") for r in results), None)
    if names:
        out.append("")
        out += [f"{k}: {', '.join(v) if v else '-'}" for k, v in names.items()]
    written = next((w for r in results
                    if (w := FinishedAction.from_wire(r.data).data.get("written"))), None)
    if written:  # a DeepSpeed checkpoint: what went where, and how to load it
        out.append("")
        out += [f"written {k}: {v}" for k, v in written.items()]
    dcp = next((d for r in results if (d := FinishedAction.from_wire(r.data).data).get("mode")
                == "torch.distributed.checkpoint"), None)
    if dcp is not None:
        out += ["", *dcp_load_hint(str(dcp.get("directory") or "PATH"))]
    return out


def dcp_load_hint(directory: str) -> list[str]:
    """How to load a torch.distributed.checkpoint directory probe wrote: its keys are
    ``model``, ``optimizer``, ``scheduler.<i>``, ``step`` (one model; ``model.<name>`` for
    several), as actions/checkpoint.py saves them."""
    return [
        f"load it into the same sharded model and optimizer (any number of ranks): msd, osd = "
        f"torch.distributed.checkpoint.state_dict.get_state_dict(model, [optimizer]); "
        f"state = {{'model': msd, 'optimizer': osd}}; "
        f"torch.distributed.checkpoint.load(state, checkpoint_id={directory!r}); "
        "set_state_dict(model, [optimizer], model_state_dict=state['model'], "
        "optim_state_dict=state['optimizer'])",
        "or as one torch.save file, for one process: python -m "
        f"torch.distributed.checkpoint.format_utils dcp_to_torch {directory} OUT.pt",
    ]


def render_paused(results: Sequence[RankResult], colour: bool = False) -> list[str]:
    rows = [[r.rank, FinishedAction.from_wire(r.data).data.get("paused_at")] for r in results]
    return [*format_table(["rank", "paused_after_step"], rows, colour=colour), "",
            "training is held at the step boundary; query and eval work. `probe resume` "
            "releases it."]


def render_resumed(results: Sequence[RankResult], colour: bool = False) -> list[str]:
    bodies = [(r, ResumeBody.from_wire(r.data)) for r in results]
    rows = [[r.rank, b.was_paused_at, b.note, ",".join(b.cancelled) or None] for r, b in bodies]
    return format_table(["rank", "was_paused_at", "note", "cancelled_pauses"], rows,
                        colour=colour)


def _short(text: Any, n: int = 60) -> str | None:
    if text is None:
        return None
    s = str(text).replace("\n", "\\n")
    return s if len(s) <= n else s[: n - 1] + "…"


def render_action_list(results: Sequence[RankResult], colour: bool = False) -> list[str]:
    rows = []
    for r in results:
        for a in ActionListBody.from_wire(r.data).actions:
            outcome = a.get("error") if a.get("state") != "ok" else a.get("result")
            rows.append([r.rank, a.get("id"), a.get("kind"), a.get("step"), a.get("state"),
                         _short(a.get("code"), 40), _short(outcome)])
    if not rows:
        steps = ", ".join(f"rank {r.rank} at step {ActionListBody.from_wire(r.data).step}"
                          for r in results)
        return [f"no actions ({steps})"]
    return format_table(["rank", "id", "kind", "step", "state", "what", "outcome"], rows,
                        colour=colour)


def render_cancelled(results: Sequence[RankResult], colour: bool = False) -> list[str]:
    bodies = [(r, ActionBody.from_wire(r.data)) for r in results]
    rows = [[r.rank, b.state, b.step] for r, b in bodies]
    return format_table(["rank", "state", "current_step"], rows, colour=colour)


def render_step_header(outcome: StepOutcome) -> list[str]:
    """stderr: where a step-boundary action ran (``probe: action ID ran at step N on ...``)."""
    ran = [r.rank for r in outcome.results
           if FinishedAction.from_wire(r.data).state in ("ok", "error")]
    if not ran or outcome.target is None:
        return []
    return [f"probe: action {outcome.action_id} ran at step {outcome.target} on "
            f"{rank_label(ran)}"]
