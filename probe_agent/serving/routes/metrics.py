"""``GET /v1/metrics``: this rank's live numbers in the Prometheus text format.

Written by hand (the format is a few lines per metric) because prometheus_client is not an
agent dependency; tests validate the output with prometheus_client's parser. One read of the
store per scrape, on the query pool, never on the training thread. Same access rule as every
data route: a scraper passes the job's token as ``Authorization: Bearer``.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from probe_protocol import routes

from ...store.catalog import shipped_sql

if TYPE_CHECKING:
    from ..parts import AgentParts

router = APIRouter()

#: name -> (type, help)
_META = {
    "probe_step": ("gauge", "Last finished optimizer step."),
    "probe_last_step_timestamp_seconds": ("gauge", "When the last optimizer step finished."),
    "probe_step_duration_seconds": ("gauge", "Duration of the last finished step."),
    "probe_samples_per_second": ("gauge", "Samples per second of the last step, when known."),
    "probe_tokens_per_second": ("gauge", "Tokens per second (median over the last "
                                "20 steps; probe throughput's number)."),
    "probe_flops_per_second": ("gauge", "Achieved model FLOP/s (FLOPs measured with "
                               "FlopCounterMode, median over the last 20 steps)."),
    "probe_mfu": ("gauge", "Model FLOPs utilisation: achieved FLOP/s over the device's peak."),
    "probe_step_share": ("gauge", "Share of a traced step per part: forward, backward, "
                         "optimizer, input, collective, host (medians; probe throughput)."),
    "probe_pause_share": ("gauge", "Share of the wall time of the last 20 steps spent in "
                          "pauses per part: checkpoint (saves on the training thread), eval "
                          "(model.eval() to model.train()); probe throughput."),
    "probe_memory_rss_bytes": ("gauge", "Process resident set size."),
    "probe_memory_agent_bytes": ("gauge", "The agent's own share of the RSS (its DuckDB)."),
    "probe_memory_job_bytes": ("gauge", "The job's own host memory: RSS minus the agent's share "
                               "and the free heap malloc keeps (python.job_memory, as judged "
                               "by probe memory and probe doctor)."),
    "probe_cuda_allocated_bytes": ("gauge", "CUDA memory allocated, per device."),
    "probe_cuda_reserved_bytes": ("gauge", "CUDA memory reserved by the caching allocator."),
    "probe_cuda_peak_allocated_bytes": ("gauge", "CUDA allocated high-water mark."),
    "probe_memory_kind_bytes": ("gauge", "Memory by kind at the last traced step, per device: "
                                "parameters, gradients, optimizer (this rank's shard), "
                                "activations (saved for backward), other (the rest)."),
    "probe_cuda_capacity_bytes": ("gauge", "The CUDA device's total memory."),
    "probe_collective_wait_seconds": ("gauge", "Age of the oldest collective still pending."),
    "probe_collectives_pending": ("gauge", "Collectives entered and not yet finished."),
    "probe_collective_seconds_total": ("counter", "Time spent in finished collectives."),
    "probe_nonfinite_grad_steps_total": ("counter",
                                         "Steps whose loss or gradient norm was NaN or Inf."),
    "probe_loss": ("gauge", "The last step's loss (python.steps.loss: the value backward() "
                   "was called on, unscaled, over the step's micro-batches)."),
    "probe_grad_norm": ("gauge", "The last step's total gradient norm before clipping "
                        "(python.numerics)."),
    "probe_trace_mode": ("gauge", "Module tracing mode (1 for the current mode)."),
    "probe_trace_dropped_rows_total": ("counter", "Trace rows dropped by full buffers."),
    "probe_up": ("gauge", "1 while the agent serves."),
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(base: dict[str, str], extra: dict[str, str] | None = None) -> str:
    items = {**base, **(extra or {})}
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in items.items()) + "}"


def _num(value: Any) -> str | None:
    if value is None:
        return None
    v = float(value)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def render(agent: AgentParts) -> str:
    """The exposition text; a metric with no value yet (no step so far) is left out."""
    ident = agent.identity
    base = {"rank": str(agent.rank), "local_rank": str(ident.local_rank), "host": ident.host,
            "job": os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID")
            or os.environ.get("PROBE_JOB", "")}
    samples: dict[str, list[tuple[dict[str, str] | None, str]]] = {k: [] for k in _META}

    def put(name: str, value: Any, extra: dict[str, str] | None = None) -> None:
        text = _num(value)
        if text is not None:
            samples[name].append((extra, text))

    put("probe_up", 1)
    clock = agent.stepclock.state()
    put("probe_step", clock["step"])
    put("probe_last_step_timestamp_seconds", clock["last_step_at"])
    tracer = agent.collectors.tracer
    mode = str(getattr(tracer, "mode", agent.config.trace))
    put("probe_trace_mode", 1, {"mode": mode})
    put("probe_trace_dropped_rows_total", getattr(tracer, "dropped", 0))
    rows = agent.store.query(shipped_sql("metrics_now")).rows
    for kind, device, a, b, c, d, e, f in rows:
        if kind == "step":
            put("probe_step_duration_seconds", a)
            put("probe_samples_per_second", b)
            put("probe_loss", c)
            put("probe_grad_norm", d)
        elif kind == "mem":
            mib = 2**20
            if device == "cpu" or d is not None and not str(device).startswith("cuda"):
                put("probe_memory_rss_bytes", None if d is None else d * mib)
                put("probe_memory_agent_bytes", None if e is None else e * mib)
                put("probe_memory_job_bytes", None if f is None else f * mib)
            if str(device).startswith("cuda"):
                dev = {"device": device}
                put("probe_cuda_allocated_bytes", None if a is None else a * mib, dev)
                put("probe_cuda_reserved_bytes", None if b is None else b * mib, dev)
                put("probe_cuda_peak_allocated_bytes", None if c is None else c * mib, dev)
                if not samples["probe_memory_rss_bytes"]:
                    put("probe_memory_rss_bytes", None if d is None else d * mib)
                    put("probe_memory_job_bytes", None if f is None else f * mib)
        elif kind == "kinds":
            mib = 2**20
            for name, v in zip(("parameters", "gradients", "optimizer", "activations", "other"),
                               (a, b, c, d, e)):
                put("probe_memory_kind_bytes", None if v is None else v * mib,
                    {"device": str(device), "kind": name})
            if f is not None:
                put("probe_cuda_capacity_bytes", f * mib, {"device": str(device)})
        elif kind == "wait":
            put("probe_collective_wait_seconds", a)
            put("probe_collectives_pending", b)
        elif kind == "coll":
            put("probe_collective_seconds_total", a)
        elif kind == "nonfinite":
            put("probe_nonfinite_grad_steps_total", a)
    _throughput(agent, put)
    out = []
    for name, (kind, help_text) in _META.items():
        if not samples[name]:
            continue
        # The metadata names the sample itself, `_total` included: text format 0.0.4 has no
        # suffix rule, and prometheus_client's parser reads a `# TYPE x counter` followed by
        # `x_total` samples as an empty counter and an `unknown` x_total.
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{name}{_labels(base, extra)} {text}" for extra, text in samples[name])
    return "\n".join(out) + "\n"


#: Steps the throughput gauges look back over (the throughput query's --last).
THROUGHPUT_STEPS = 20
_PARTS = ("forward", "backward", "optimizer", "input", "collective", "host")


def _throughput(agent: AgentParts, put: Any) -> None:
    """The throughput query's row (what `probe throughput` shows for this rank)."""
    res = agent.store.query(shipped_sql("throughput"), params={"last": THROUGHPUT_STEPS})
    if not res.rows:
        return
    row = dict(zip(res.columns, res.rows[0]))
    put("probe_tokens_per_second", row.get("tokens_per_s"))
    put("probe_flops_per_second", row.get("flops_per_s"))
    put("probe_mfu", row.get("mfu"))
    for part in _PARTS:
        put("probe_step_share", row.get(f"{part}_share"), {"part": part})
    for part in ("checkpoint", "eval"):
        put("probe_pause_share", row.get(f"{part}_share"), {"part": part})


@router.get(routes.METRICS.path)
async def metrics(request: Request) -> PlainTextResponse:
    """Prometheus text exposition (version 0.0.4) of this rank's step, memory and waits."""
    agent = request.app.state.agent
    t0 = time.perf_counter()
    text = await asyncio.get_running_loop().run_in_executor(agent.query_pool, render, agent)
    text += f"# probe render {1e3 * (time.perf_counter() - t0):.1f} ms\n"
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")
