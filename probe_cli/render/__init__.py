"""Rendering: results and verdicts -> lines of text, tables, CSV and JSON. Pure and stdlib only;
nothing here prints (main.py does), nothing here decides (diagnose/ does), and files for other
tools (Perfetto traces, merged profiles, flame graphs) are export/'s.

- ``text``: cells, tables, CSV, the ``--json`` array, rank headers; query, info and eval results
- ``stacks``: backtraces in py-spy's shape
- ``actions``: step-boundary actions (lr, checkpoint, pause, the queue)
- ``profile``: `probe profile`'s per-rank operator and step-span tables
- ``flame``: `probe flame`'s tables of the widest and hottest frames and the rank differences
- ``verdicts``: the hang and straggler verdicts (and the straggler step table)
- ``doctor``: doctor's report, findings ranked by severity
"""
