"""Files for other tools: what `probe trace --perfetto`, `probe profile` and `probe flame`
write, and the computations over many ranks' data that those files need. Stdlib only; nothing
here prints (commands/ write the files' paths and render/ the tables).

- ``perfetto``: traced steps (``trace_timeline`` rows) as Chrome/Perfetto trace JSON
- ``trace_merge``: every rank's torch.profiler trace merged into one, streaming, on one clock;
  ``op_stats`` the per-operator totals computed while it reads them
- ``flame``: folded stacks merged across ranks, the widest and hottest frames, the frames where
  one rank differs, speedscope JSON; ``flame_svg`` the SVG and HTML flame graph
"""
