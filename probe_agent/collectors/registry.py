"""Which collectors an agent runs. Each entry builds one from the agent, or returns None
when it does not apply (tracing off and not switchable, no torch, ...)."""

from __future__ import annotations

import importlib
import logging
from typing import Any

log = logging.getLogger(__name__)

#: name -> "module:factory"; the factory takes the agent and returns a Collector or None.
#: Modules are imported only here, at agent start, never at ``import probe_agent``.
FACTORIES: dict[str, str] = {
    # issue 4: rank discovery through the job's c10d store, and python.collectives.
    "ranks": "..ranks:build_registry",
    "collectives": ".collectives:build_recorder",
    # issue 3: python.steps/memory/metrics, then torch tracing (python.torch_trace). "steps"
    # comes first so its step subscriber sees whether the step just finished was traced.
    "steps": ".steps:build_recorder",
    "modules": ".tracer.tracer:build_tracer",
    # issue 7: DataLoader wait, gradient clipping and LR per step (python.step_stats).
    "trainloop": ".trainloop:build_monitor",
}


def build_collectors(agent: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, spec in FACTORIES.items():
        module_name, factory = spec.split(":")
        try:
            module = importlib.import_module(module_name, __package__)
            collector = getattr(module, factory)(agent)
        except Exception as e:  # one broken collector must not keep the others from starting
            log.warning("probe agent: collector %s unavailable: %s", name, e)
            continue
        if collector is not None:
            out[name] = collector
    return out
