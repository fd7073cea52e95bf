-- name: trace_timeline
-- description: Every row of the last $last traced steps of each rank, in time order (what `probe trace --perfetto` draws). Recompute calls are included and flagged.
-- params: last
WITH recent AS (
    SELECT rank, step FROM (SELECT DISTINCT rank, step FROM python.torch_trace)
    QUALIFY row_number() OVER (PARTITION BY rank ORDER BY step DESC) <= $last
)
SELECT t.rank, t.step, t.seq, t.root, t.module, t.stage, t.depth, t.recompute,
       t.timestamp, t.duration, t.cpu_duration, t.allocated, t.device
FROM python.torch_trace t SEMI JOIN recent USING (rank, step)
ORDER BY t.rank, t.timestamp, t.depth;
