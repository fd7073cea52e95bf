-- name: doctor_metrics
-- description: Logged scalars (python.metrics, from probe_agent.log) that were NaN or infinite: per name, how many values, the first and last such step, and the last finite value before the first one. `probe doctor` reads it.
-- params:
WITH bad AS (
    SELECT name, count(*) AS nonfinite, min(step) AS first_step, max(step) AS last_step
    FROM python.metrics WHERE NOT isfinite(value) GROUP BY name
)
SELECT b.name, b.nonfinite, b.first_step, b.last_step,
       (SELECT arg_max(m.value, m.step) FROM python.metrics m
        WHERE m.name = b.name AND isfinite(m.value) AND m.step < b.first_step) AS last_finite,
       (SELECT count(*) FROM python.metrics m WHERE m.name = b.name)            AS logged
FROM bad b
ORDER BY b.first_step, b.name;
