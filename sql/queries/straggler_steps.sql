-- name: straggler_steps
-- description: This rank's median step time over its last $last steps, split into forward, backward and optimizer time from python.torch_trace (the outermost module of each stage; NULL for steps that were not traced) and the rest ("other": data loading, host code, waits outside modules), and the share of those steps' time its training thread waited for a CPU (cpu_wait_share: a busy host; NULL off Linux). `probe straggler` compares it across ranks.
-- params: last
WITH recent AS (
    SELECT step, duration, cpu_wait_ms FROM python.steps
    WHERE step > (SELECT max(step) FROM python.steps) - $last
),
per_module AS (
    SELECT step, stage, module, sum(duration) AS d
    FROM python.torch_trace
    WHERE step IN (SELECT step FROM recent)
    GROUP BY step, stage, module
),
per_stage AS (  -- the outermost module of a stage contains the others: take the largest
    SELECT step,
           max(d) FILTER (WHERE stage = 'forward')  AS fwd,
           max(d) FILTER (WHERE stage = 'backward') AS bwd,
           max(d) FILTER (WHERE stage = 'step')     AS opt
    FROM per_module GROUP BY step
)
SELECT count(*)                                        AS steps,
       round(median(r.duration) * 1e3, 3)              AS step_ms,
       round(median(s.fwd) * 1e3, 3)                   AS forward_ms,
       round(median(s.bwd) * 1e3, 3)                   AS backward_ms,
       round(median(s.opt) * 1e3, 3)                   AS optimizer_ms,
       round(median(r.duration - coalesce(s.fwd, 0) - coalesce(s.bwd, 0) - coalesce(s.opt, 0))
             FILTER (WHERE s.step IS NOT NULL) * 1e3, 3) AS other_ms,
       round(sum(r.cpu_wait_ms) / nullif(sum(r.duration) FILTER (WHERE r.cpu_wait_ms IS NOT NULL)
             * 1e3, 0), 4)                             AS cpu_wait_share
FROM recent r LEFT JOIN per_stage s USING (step);
