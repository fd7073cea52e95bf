"""Rendering: results and verdicts -> lines of text, tables, CSV and JSON. Pure and stdlib only;
nothing here prints (main.py does) and nothing here decides (diagnose/ does).

- ``text``: cells, tables, CSV, the ``--json`` array, rank headers; query, info and eval results
- ``stacks``: backtraces in py-spy's shape
- ``actions``: step-boundary actions (lr, checkpoint, pause, the queue)
- ``perfetto``: traced steps as Chrome/Perfetto trace JSON
- ``verdicts``: the hang and straggler verdicts (and the straggler step table)
- ``doctor``: doctor's report, findings ranked by severity
"""
