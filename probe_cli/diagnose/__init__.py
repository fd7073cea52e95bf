"""Diagnoses: what every rank answered -> a verdict object with its evidence. Pure functions and
dataclasses; no I/O, no printing, no click. commands/ gather the answers; render/ turns the
verdicts into text and JSON (the dashboard renders the same objects); outcome.py turns a
verdict's ``problem`` into the exit code.

- ``verdict``: ``Verdict``, what a single-question diagnosis returns (``problem``, headline,
  details, culprits)
- ``hang``: who the others wait for, in which collective (``HangVerdict``)
- ``straggler``: which rank arrives last at collectives, and what it costs (``StragglerVerdict``)
- ``doctor``: every check in order -> ``findings.Report``; the checks are in ``time_checks``
  (hang, stall, straggler, collective and DataLoader wait, slowest modules) and
  ``number_checks`` (memory, NaN/Inf, learning rate and clipping)
"""
