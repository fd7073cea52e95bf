"""Looking inside a slow step: a torch.profiler window over the same optimizer steps on
every rank, and sampled Python stacks for flame graphs.

- window.py: ``ProfileWindow``, one torch.profiler session from step boundary S to S+N (started
  by the ``profile`` step-boundary action, actions/profile.py), its ceiling and its export;
- sessions.py: ``Profiling``, the per-agent registry of windows and flame sessions (one of each
  at a time), and the cost of a window measured from ``python.steps``;
- flame.py: ``FlameSession``: ``py-spy record --nonblocking`` (pyspy.py) or the in-process stack
  sampler (collectors/sampler.py) run for T seconds, with its measured cost.

Nothing here imports torch at import time; the profiler is imported when a window starts, which
only happens on the training thread of a job that has stepped an optimizer.
"""

from .sessions import Profiling

__all__ = ["Profiling"]
