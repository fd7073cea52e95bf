-- name: slow_modules
-- description: Slowest modules over the last $last traced steps of each rank, by self time per step: the median over calls of a call's time minus the time of the calls nested in that same call, times the median number of calls per step (so a few steps disturbed by a probe command cannot dominate). Forward against backward; an activation-checkpoint recompute counts as backward time of the module it recomputes, never as a forward call. The optimizer step is not a module and is left out (its time is the optimizer column of `probe straggler`'s step split); a forward it runs through a closure still counts. The one slowest-modules computation: `probe slow` and `probe doctor` both read it.
-- params: last, limit
WITH recent AS (
    SELECT rank, step FROM (SELECT DISTINCT rank, step FROM python.torch_trace)
    QUALIFY row_number() OVER (PARTITION BY rank ORDER BY step DESC) <= $last
),
-- part: calls that nest only among themselves (a recompute runs inside a backward span)
t AS (
    SELECT row_number() OVER () AS id, tt.rank, tt.step, tt.module, tt.depth, tt.duration,
           tt.timestamp AS t0, tt.timestamp + tt.cpu_duration AS t1,
           CASE WHEN coalesce(tt.recompute, false) AND tt.stage = 'forward' THEN 'recompute'
                ELSE tt.stage END AS part,
           tt.depth - 1 AS up
    FROM python.torch_trace tt SEMI JOIN recent USING (rank, step)
),
-- a call's parent: the latest call of its part one level up that started no later and
-- contains it, or a call of its own level that strictly contains it (the inner pass of a
-- reentrant checkpoint runs inside the checkpointed layer's backward); the later of the two
up1 AS (
    SELECT c.id, p.id AS pid, p.t0 AS pt0 FROM t c ASOF JOIN t p
      ON p.rank = c.rank AND p.step = c.step AND p.part = c.part AND p.depth = c.up
     AND p.t0 <= c.t0
    WHERE c.t1 <= p.t1 + 1e-6
),
up0 AS (
    SELECT c.id, p.id AS pid, p.t0 AS pt0 FROM t c ASOF JOIN t p
      ON p.rank = c.rank AND p.step = c.step AND p.part = c.part AND p.depth = c.depth
     AND p.t0 < c.t0
    WHERE c.t1 <= p.t1 + 1e-6
),
nested AS (
    SELECT id, arg_max(pid, pt0) AS pid FROM (SELECT * FROM up1 UNION ALL SELECT * FROM up0)
    GROUP BY id
),
-- a call with no parent in its part, nested in the innermost call of another part whose span
-- holds it: a recompute in the backward call whose node needed the activations, a forward or
-- backward in the optimizer step whose closure ran it (Lightning, LBFGS)
hosted AS (
    SELECT c.id, arg_max(p.id, p.depth * 1e12 + p.t0) AS pid
    FROM t c JOIN t p
      ON p.rank = c.rank AND p.step = c.step
     AND p.part = CASE c.part WHEN 'recompute' THEN 'backward' ELSE 'step' END
     AND p.t0 <= c.t0 AND c.t1 <= p.t1 + 1e-6
    WHERE c.part <> 'step' AND c.id NOT IN (SELECT id FROM nested)
    GROUP BY c.id
),
children AS (
    SELECT pid, sum(t.duration) AS inner_s
    FROM (SELECT * FROM nested UNION ALL SELECT * FROM hosted) k JOIN t USING (id)
    GROUP BY pid
),
-- per call: never negative, never more than the call (children that overlap, as parallel
-- backward branches can, are capped)
calls AS (
    SELECT t.rank, t.step, t.module, t.part, t.duration,
           greatest(t.duration - coalesce(c.inner_s, 0), 0) AS self
    FROM t LEFT JOIN children c ON c.pid = t.id
),
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
