"""Step-boundary actions: operator code and built-in actions (LR change, checkpoint,
pause) that run on the training thread right after optimizer step N, on every targeted rank or
on none.

- queue.py: ``ActionQueue``, the per-rank queue the routes submit to and the step clock drains;
- kinds/: one module per kind of action (what it checks, keeps and does at the boundary);
- agreement.py: the all-or-nothing vote through the job's store;
- lr.py, checkpoint.py, checkpoint_target.py, objects.py: the built-in actions and how they find
  the job's model, optimizers and schedulers.
"""

from .queue import ActionQueue

__all__ = ["ActionQueue"]
