"""Diagnoses: what every rank answered -> a verdict object with its evidence. Pure functions and
dataclasses; no I/O, no printing, no click. gather/ asks the ranks; render/ turns the
verdicts into text and JSON (the dashboard renders the same objects); outcome.py turns a
verdict's ``problem`` into the exit code.

- ``verdict``: ``Verdict``, what a single-question diagnosis returns (``problem``, headline,
  details, culprits)
- ``hang``: who the others wait for, in which collective (``HangVerdict``); ``rhythm``: how
  long a wait counts as stuck, from the job's own gaps between collectives
- ``straggler``: which rank arrives last at collectives, and what it costs (``StragglerVerdict``)
- ``doctor``: every check in order -> ``findings.Report``; the checks are in ``time_checks``
  (hang, stall, straggler, collective and DataLoader wait, slowest modules) and
  the numbers (``nonfinite``, ``memory_growth``, ``lr_checks``, ``numerics``, ``clipping``)

The JSON form (stable; `--json` prints it and the dashboard renders the same dicts)
---------------------------------------------------------------------------------
Every object has ``to_dict()``. Keys are only ever added, never renamed or removed.

- ``Verdict``: ``problem`` (bool: exit code 4), ``headline`` (str, the culprit first),
  ``details`` (list of str: evidence lines, stack frames indented by 4 spaces),
  ``culprits`` (list of int: the ranks blamed).
- ``HangVerdict`` adds ``waiting`` ({pg, seq, op, ranks, age_s} or null), ``confidence``
  ("high" | "medium" | "low"), ``basis`` (str: what it rests on), ``threshold_s`` (float: the
  wait that counted as stuck, from the job's own rhythm or --min-wait).
- ``StragglerVerdict`` adds ``window_s``, ``collectives``, ``p_value`` (binomial test of the
  most-often-last rank against 1/world_size; null without one) and ``ranks``: [{rank,
  arrived_last, others_waited_s, median_lag_ms}].
- ``Report`` (doctor): ``problem``, ``findings``: [{severity ("critical" | "warning" |
  "info"), check (hang, stall, straggler, collectives, dataloader, memory, oom, nonfinite, lr,
  modules), title, evidence (list of str), next (the command to run), ranks}], ``fine`` and
  ``unchecked`` (lists of str). A healthy job: ``problem`` false, only "info" findings.
"""
