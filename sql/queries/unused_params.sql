-- name: unused_params
-- description: The parameters that got no gradient on the recorded steps (python.unused_params: traced steps and the first steps of a multi-rank job), one row per module with its parameters, the steps it went unused on and the steps recorded, plus one row with module NULL counting the recorded steps where every parameter got a gradient; find_unused is the job's DDP find_unused_parameters.
WITH recorded AS (SELECT count(DISTINCT step) AS n, bool_or(find_unused) AS find_unused,
                         min(step) AS first_step, max(step) AS last_step
                  FROM python.unused_params)
SELECT module, string_agg(DISTINCT param, ', ' ORDER BY param) AS params,
       count(DISTINCT step) AS steps_unused, min(step) AS first_unused,
       sum(numel) // greatest(count(DISTINCT step), 1) AS numel,
       (SELECT n FROM recorded) AS steps_recorded,
       (SELECT first_step FROM recorded) AS first_step,
       (SELECT last_step FROM recorded) AS last_step,
       (SELECT find_unused FROM recorded) AS find_unused
FROM python.unused_params
WHERE param IS NOT NULL
GROUP BY module
UNION ALL
SELECT NULL, NULL, count(DISTINCT step), NULL, NULL, (SELECT n FROM recorded),
       (SELECT first_step FROM recorded), (SELECT last_step FROM recorded),
       (SELECT find_unused FROM recorded)
FROM python.unused_params
WHERE param IS NULL
ORDER BY module NULLS LAST
