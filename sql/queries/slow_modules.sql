-- name: slow_modules
-- description: Slowest modules over the last $steps traced steps of each rank, by self time (a module's time minus the time of the calls nested in it), forward against backward, per step. The optimizer step appears as its class (stage 'step'). Activation-checkpoint recompute calls are left out. The one slowest-modules query: `probe slow` and `probe doctor` both read it (issue 18).
-- params: steps, limit
WITH recent AS (
    SELECT rank, step FROM (SELECT DISTINCT rank, step FROM python.torch_trace)
    QUALIFY row_number() OVER (PARTITION BY rank ORDER BY step DESC) <= $steps
),
t AS (
    SELECT tt.* FROM python.torch_trace tt SEMI JOIN recent USING (rank, step)
    WHERE NOT coalesce(tt.recompute, false)
),
calls AS (
    SELECT p.rank, p.step, p.root, p.module, p.stage, p.seq, p.duration,
           p.duration - coalesce(sum(c.duration), 0) AS self
    FROM t p LEFT JOIN t c
      ON c.rank = p.rank AND c.step = p.step AND c.stage = p.stage AND c.depth = p.depth + 1
     AND c.timestamp >= p.timestamp AND c.timestamp < p.timestamp + p.cpu_duration
    GROUP BY p.rank, p.step, p.root, p.module, p.stage, p.seq, p.duration
),
per_module AS (
    SELECT rank, module, count(DISTINCT step) AS steps,
           count(*) FILTER (WHERE stage <> 'backward') AS calls,
           sum(duration) FILTER (WHERE stage <> 'backward') AS fwd,
           sum(duration) FILTER (WHERE stage = 'backward') AS bwd,
           sum(self) FILTER (WHERE stage <> 'backward') AS fwd_self,
           sum(self) FILTER (WHERE stage = 'backward') AS bwd_self,
           sum(self) AS self_total
    FROM calls GROUP BY rank, module
),
ranked AS (
    SELECT m.*, n.n_steps, sum(self_total) OVER (PARTITION BY m.rank) AS all_self
    FROM per_module m JOIN (SELECT rank, count(*) AS n_steps FROM recent GROUP BY rank) n
      USING (rank)
)
SELECT rank, module,
       round(calls / n_steps, 2) AS calls_per_step,
       round(coalesce(fwd_self, 0) / n_steps * 1e3, 3) AS fwd_self_ms,
       round(coalesce(bwd_self, 0) / n_steps * 1e3, 3) AS bwd_self_ms,
       round(self_total / n_steps * 1e3, 3) AS self_ms,
       round(100 * self_total / nullif(all_self, 0), 1) AS pct,
       round(coalesce(fwd, 0) / n_steps * 1e3, 3) AS fwd_ms,
       round(coalesce(bwd, 0) / n_steps * 1e3, 3) AS bwd_ms,
       n_steps AS steps
FROM ranked
QUALIFY row_number() OVER (PARTITION BY rank ORDER BY self_total DESC) <= $limit
ORDER BY rank, self_total DESC;
