-- name: module_self_steps
-- description: Self time of every module in each of the last $last traced steps of each rank (python.module_calls: a call's time minus the calls nested in it), summed over the step's calls, split into forward and backward (an activation-checkpoint recompute counts as backward). One row per rank, step, module and part: the per-step samples `probe compare` builds its intervals from. The optimizer step is left out, as in slow_modules.
-- params: last
SELECT rank, step, module,
       CASE part WHEN 'recompute' THEN 'backward' ELSE part END AS part,
       sum(self) AS self_s, count(*) AS calls
FROM python.module_calls($last)
WHERE part <> 'step'
GROUP BY ALL
ORDER BY rank, step, module, part
