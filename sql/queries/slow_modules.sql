-- name: slow_modules
-- description: Slowest modules over the last $last traced steps of each rank, by self time per step: the median over calls of a call's time minus the time of the calls nested in that same call, times the median number of calls per step (so a few steps disturbed by a probe command cannot dominate). Forward against backward; an activation-checkpoint recompute counts as backward time of the module it recomputes, never as a forward call. The optimizer step is not a module and is left out (its time is the optimizer column of `probe straggler`'s step split); a forward it runs through a closure still counts. The one slowest-modules computation: `probe slow` and `probe doctor` both read it.
-- params: last, limit
WITH recent AS (
    SELECT rank, step FROM (SELECT DISTINCT rank, step FROM python.torch_trace)
    QUALIFY row_number() OVER (PARTITION BY rank ORDER BY step DESC) <= $last
),
calls AS (SELECT * FROM python.module_calls($last)),
per_step AS (
    SELECT rank, module, part, step, count(*) AS n FROM calls GROUP BY ALL
),
-- calls per step: median over the rank's recent steps, a step without the call counting 0
cps AS (
    SELECT m.rank, m.module, m.part, median(coalesce(s.n, 0)) AS n
    FROM (SELECT DISTINCT rank, module, part FROM per_step) m
    JOIN recent r ON r.rank = m.rank
    LEFT JOIN per_step s ON s.rank = m.rank AND s.module = m.module AND s.part = m.part
                        AND s.step = r.step
    GROUP BY ALL
),
per_part AS (
    SELECT c.rank, c.module, c.part, cps.n AS calls, median(c.self) * cps.n AS self_s,
           median(c.duration) * cps.n AS total_s, count(DISTINCT c.step) AS steps
    FROM calls c JOIN cps USING (rank, module, part)
    GROUP BY c.rank, c.module, c.part, cps.n
),
-- the optimizer's step is no module: users read it as one with its time in the forward column
per_module AS (
    SELECT rank, module,
           coalesce(sum(calls) FILTER (WHERE part = 'forward'), 0) AS calls,
           coalesce(sum(self_s) FILTER (WHERE part = 'forward'), 0) AS fwd_self,
           coalesce(sum(self_s) FILTER (WHERE part IN ('backward', 'recompute')), 0) AS bwd_self,
           coalesce(sum(total_s) FILTER (WHERE part = 'forward'), 0) AS fwd,
           coalesce(sum(total_s) FILTER (WHERE part IN ('backward', 'recompute')), 0) AS bwd,
           sum(self_s) AS self_total
    FROM per_part WHERE part <> 'step' GROUP BY rank, module
),
ranked AS (
    SELECT m.*, n.n_steps, sum(self_total) OVER (PARTITION BY m.rank) AS all_self
    FROM per_module m JOIN (SELECT rank, count(*) AS n_steps FROM recent GROUP BY rank) n
      USING (rank)
)
SELECT rank, module,
       round(calls, 2) AS calls_per_step,
       round(fwd_self * 1e3, 3) AS fwd_self_ms,
       round(bwd_self * 1e3, 3) AS bwd_self_ms,
       round(self_total * 1e3, 3) AS self_ms,
       round(100 * self_total / nullif(all_self, 0), 1) AS pct,
       round(fwd * 1e3, 3) AS fwd_ms,
       round(bwd * 1e3, 3) AS bwd_ms,
       n_steps AS steps
FROM ranked
QUALIFY row_number() OVER (PARTITION BY rank ORDER BY self_total DESC, module) <= $limit
ORDER BY rank, self_total DESC, module;
