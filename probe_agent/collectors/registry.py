"""Which collectors an agent runs: each collector module declares itself once, as a
``COLLECTOR = CollectorSpec(...)`` at its end, and ``DEFAULT_COLLECTORS`` names the modules.

Adding a collector is one new module (its spec says its name, where it starts, what it is built
from and which collectors it needs built first) and one line in ``DEFAULT_COLLECTORS``
(datasette's ``DEFAULT_PLUGINS``: the project's own features are plugins of its registry).

Modules are imported here, at agent start, never at ``import probe_agent`` (the tracer and the
step recorder import pyarrow and duckdb). A collector that cannot be imported or built (no torch,
a broken import) is left out with one warning; the others still run.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import Sink

if TYPE_CHECKING:
    from ..clock import StepClock
    from ..config import AgentConfig
    from ..ranks import RankRegistry
    from .collectives import CollectiveRecorder
    from .numerics import NumericsRecorder
    from .oom import OomRecorder
    from .parallel import ParallelWatcher
    from .schedule import ScheduleWatcher
    from .stacks import BacktraceTables
    from .steps import StepRecorder
    from .tracer.tracer import TorchTracer
    from .trainloop import LoopMonitor

log = logging.getLogger(__name__)

#: The collector modules, under probe_agent.collectors, each ending in ``COLLECTOR = ...``.
#: The order here does not matter: each spec's ``order`` says when it starts.
DEFAULT_COLLECTORS = (
    "collectives",
    "steps",
    "tracer.tracer",
    "oom",
    "trainloop",
    "numerics",
    "schedule",
    "unused_params",
    "parallel",
    "stacks",
    "host_syncs",
    "compile_state",
    "moe",
)


@dataclass(frozen=True, slots=True)
class Built:
    """What a collector is built from: the agent's step clock, rank and config, and the
    collectors built before it (``get``; None for one that is not running)."""

    clock: StepClock
    rank: int
    config: AgentConfig
    ranks: Callable[[], RankRegistry]
    done: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str) -> Any:
        return self.done.get(name)


@dataclass(frozen=True, slots=True)
class CollectorSpec:
    """One collector, declared by its own module.

    Args:
        name: how the agent and its routes find it (``agent.collectors.get(name)``) and how
            warnings name it.
        order: start order, smallest first (gaps of 10 leave room). It matters where two
            collectors subscribe to the step clock: ``steps`` (30) starts before ``tracer``
            (40) so the step recorder reads whether the step that just finished was traced
            before the tracer's subscriber moves on to the next step.
        build: makes the collector from ``Built``; an exception leaves it out with a warning.
        needs: collectors built before this one, whatever their start order (``Built.get``
            then returns them, or None where they could not be built).
        tables: the tables it writes, for the reader (sql/schema.sql has them).
    """

    name: str
    order: int
    build: Callable[[Built], Any]
    needs: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()


#: Rank discovery is built from the agent's own identity and peers (agent.py's factory).
RANKS = CollectorSpec("ranks", 10, lambda b: b.ranks())


def default_specs() -> list[CollectorSpec]:
    """The specs of ``DEFAULT_COLLECTORS`` (and rank discovery), in start order. A module that
    cannot be imported is left out with one warning."""
    specs = [RANKS]
    for module in DEFAULT_COLLECTORS:
        try:
            specs.append(importlib.import_module(f"{__package__}.{module}").COLLECTOR)
        except Exception as e:  # one broken collector must not keep the others from starting
            log.warning("probe agent: collector module %s unavailable: %s", module, e)
    return sorted(specs, key=lambda s: s.order)


class Collectors:
    """The collectors of one agent, in start order; ``get(name)`` is None for one that is not
    running. The properties name those the agent's routes read."""

    def __init__(self, collectors: dict[str, Any] | None = None) -> None:
        self._by_name: dict[str, Any] = dict(collectors or {})

    def get(self, name: str) -> Any:
        return self._by_name.get(name)

    def running(self) -> list[tuple[str, Any]]:
        """``(name, collector)`` of those present, in start order."""
        return list(self._by_name.items())

    def start(self, sink: Sink) -> None:
        """Start each in order; one that cannot start is dropped, the others still run."""
        for name, collector in self.running():
            try:
                collector.start(sink)
            except Exception as e:  # a collector that cannot start must not stop the agent
                log.warning("probe agent: collector %s did not start: %s", name, e)
                del self._by_name[name]

    def stop(self) -> None:
        """Stop each in start order and forget it; one that fails does not keep the rest."""
        for name, collector in self.running():
            try:
                collector.stop()
            except Exception as e:  # keep stopping the rest
                log.warning("probe agent: collector %s did not stop cleanly: %s", name, e)
            del self._by_name[name]

    @property
    def ranks(self) -> RankRegistry | None:  # rank discovery through the job's c10d store
        return self.get("ranks")

    @property
    def collectives(self) -> CollectiveRecorder | None:  # python.collectives
        return self.get("collectives")

    @property
    def steps(self) -> StepRecorder | None:  # python.steps, memory, metrics
        return self.get("steps")

    @property
    def tracer(self) -> TorchTracer | None:  # python.torch_trace
        return self.get("tracer")

    @property
    def oom(self) -> OomRecorder | None:  # python.ooms: a CUDA OOM caught in the act
        return self.get("oom")

    @property
    def trainloop(self) -> LoopMonitor | None:  # python.step_stats, the doctor's loop state
        return self.get("trainloop")

    @property
    def numerics(self) -> NumericsRecorder | None:  # python.numerics; the loss python.steps shows
        return self.get("numerics")

    @property
    def schedule(self) -> ScheduleWatcher | None:  # python.schedule
        return self.get("schedule")

    @property
    def parallel(self) -> ParallelWatcher | None:  # python.parallel
        return self.get("parallel")

    @property
    def stacks(self) -> BacktraceTables | None:  # python.backtrace(_all) by thread
        return self.get("stacks")


def build_collectors(clock: StepClock, rank: int, config: AgentConfig,
                     ranks: Callable[[], RankRegistry],
                     specs: list[CollectorSpec] | None = None) -> Collectors:
    """Build each collector from what it uses, its ``needs`` first; ``ranks`` builds the rank
    registry (agent.py gives it the agent's identity and peers)."""
    specs = default_specs() if specs is None else specs
    by_name = {s.name: s for s in specs}
    built = Built(clock, rank, config, ranks)
    tried: set[str] = set()

    def ensure(spec: CollectorSpec) -> None:
        if spec.name in tried:
            return
        tried.add(spec.name)
        for need in spec.needs:
            if need in by_name:
                ensure(by_name[need])
        try:
            built.done[spec.name] = spec.build(built)
        except Exception as e:  # one broken collector must not keep the others from starting
            log.warning("probe agent: collector %s unavailable: %s", spec.name, e)
            built.done[spec.name] = None

    for spec in specs:
        ensure(spec)
    return Collectors({s.name: c for s in specs if (c := built.done.get(s.name)) is not None})
