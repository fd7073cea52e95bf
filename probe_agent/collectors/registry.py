"""Which collectors an agent runs, built from what each one uses, in the order they start.

Modules are imported here, at agent start, never at ``import probe_agent``. A collector that
cannot be built (no torch, a broken import) is left out with one warning; the others still run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

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
T = TypeVar("T")


@dataclass
class Collectors:
    """The collectors of one agent; a field is None when that collector is not running.

    The fields are in start order, which matters once: ``steps`` starts before ``tracer``.
    Both subscribe to the step clock, and the step recorder must read whether the step that
    just finished was traced before the tracer's subscriber moves on to the next step.
    """

    ranks: RankRegistry | None = None  # rank discovery through the job's c10d store
    collectives: CollectiveRecorder | None = None  # python.collectives
    steps: StepRecorder | None = None  # python.steps, memory, metrics
    tracer: TorchTracer | None = None  # python.torch_trace
    oom: OomRecorder | None = None  # python.ooms: a CUDA OOM caught in the act
    trainloop: LoopMonitor | None = None  # python.step_stats, the doctor's loop state
    numerics: NumericsRecorder | None = None  # python.numerics; the loss python.steps shows
    schedule: ScheduleWatcher | None = None  # python.schedule: the LR schedule in steps
    parallel: ParallelWatcher | None = None  # python.parallel: tensor/pipeline groups
    stacks: BacktraceTables | None = None  # python.backtrace(_all) by thread

    def running(self) -> list[tuple[str, Any]]:
        """``(name, collector)`` of those present, in start order."""
        return [(name, c) for name in _ORDER if (c := getattr(self, name)) is not None]

    def start(self, sink: Sink) -> None:
        """Start each in order; one that cannot start is dropped, the others still run."""
        for name, collector in self.running():
            try:
                collector.start(sink)
            except Exception as e:  # a collector that cannot start must not stop the agent
                log.warning("probe agent: collector %s did not start: %s", name, e)
                setattr(self, name, None)

    def stop(self) -> None:
        """Stop each in start order and forget it; one that fails does not keep the rest."""
        for name, collector in self.running():
            try:
                collector.stop()
            except Exception as e:  # keep stopping the rest
                log.warning("probe agent: collector %s did not stop cleanly: %s", name, e)
            setattr(self, name, None)


_ORDER = tuple(Collectors.__dataclass_fields__)


def build_collectors(clock: StepClock, rank: int, config: AgentConfig,
                     ranks: Callable[[], RankRegistry]) -> Collectors:
    """Build each collector from what it uses; ``ranks`` builds the rank registry (agent.py
    gives it the agent's identity and peers)."""
    # Here, at agent start, not at the top: the tracer and the step recorder import pyarrow
    # and duckdb, which must stay off `import probe_agent`.
    from .collectives import CollectiveRecorder
    from .numerics import NumericsRecorder
    from .oom import OomRecorder
    from .parallel import ParallelWatcher
    from .schedule import ScheduleWatcher
    from .stacks import BacktraceTables
    from .steps import StepRecorder
    from .tracer.tracer import TorchTracer
    from .trainloop import LoopMonitor

    tracer = _build("tracer", lambda: TorchTracer(clock, rank, config))
    trainloop = _build("trainloop", lambda: LoopMonitor(clock, rank))
    numerics = _build("numerics", lambda: NumericsRecorder(clock, rank, tracer, trainloop))
    steps = _build("steps", lambda: StepRecorder(clock, rank, tracer, config.run_dir, numerics))
    kinds = steps.last_kinds if steps is not None else dict
    return Collectors(
        ranks=_build("ranks", ranks),  # ranks.py
        collectives=_build("collectives", lambda: CollectiveRecorder(rank)),
        steps=steps,
        tracer=tracer,
        oom=_build("oom", lambda: OomRecorder(clock, rank, config.run_dir, kinds)),
        trainloop=trainloop,
        numerics=numerics,
        schedule=_build("schedule", lambda: ScheduleWatcher(clock, rank)),
        parallel=_build("parallel", lambda: ParallelWatcher(clock, rank)),
        stacks=_build("stacks", lambda: BacktraceTables(clock, rank)),
    )


def _build(name: str, factory: Callable[[], T]) -> T | None:
    try:
        return factory()
    except Exception as e:  # one broken collector must not keep the others from starting
        log.warning("probe agent: collector %s unavailable: %s", name, e)
        return None
