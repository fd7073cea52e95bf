-- name: doctor_slow_modules
-- description: The $top modules with the most self time (their own time minus their children's) per traced step over this rank's last $last_steps traced steps (python.torch_trace, recompute excluded), forward and backward, and each one's share of the root models' forward+backward time. `probe doctor` reads it.
-- params: last_steps, top
WITH recent AS (
    SELECT DISTINCT step FROM python.torch_trace
    WHERE stage IN ('forward', 'backward')
    ORDER BY step DESC LIMIT $last_steps
),
calls AS (
    SELECT step, stage, root, module, sum(duration) AS d,
           CASE WHEN module = root THEN NULL
                WHEN contains(module, '.') THEN regexp_replace(module, '\.[^.]*$', '')
                ELSE root END AS parent
    FROM python.torch_trace
    WHERE stage IN ('forward', 'backward') AND NOT coalesce(recompute, false)
      AND step IN (SELECT step FROM recent)
    GROUP BY step, stage, root, module
),
children AS (
    SELECT step, stage, root, parent AS module, sum(d) AS c
    FROM calls WHERE parent IS NOT NULL GROUP BY step, stage, root, parent
),
self AS (
    SELECT k.step, k.stage, k.module, greatest(k.d - coalesce(ch.c, 0), 0) AS s
    FROM calls k LEFT JOIN children ch USING (step, stage, root, module)
),
total AS (
    SELECT sum(d) / count(DISTINCT step) AS per_step FROM calls WHERE module = root
)
SELECT module,
       round(sum(s) FILTER (WHERE stage = 'forward') / (SELECT count(*) FROM recent) * 1e3, 3)
           AS forward_ms,
       round(sum(s) FILTER (WHERE stage = 'backward') / (SELECT count(*) FROM recent) * 1e3, 3)
           AS backward_ms,
       round(sum(s) / (SELECT count(*) FROM recent) * 1e3, 3) AS self_ms,
       round(sum(s) / (SELECT count(*) FROM recent) / nullif((SELECT per_step FROM total), 0), 4)
           AS share,
       (SELECT count(*) FROM recent) AS steps
FROM self
WHERE module NOT IN (SELECT DISTINCT root FROM calls)  -- the roots contain everything
GROUP BY module
ORDER BY sum(s) DESC
LIMIT $top;
