-- name: numerics
-- description: This rank's loss and gradient health per step: the first 20 steps it recorded and its last $window steps, each with the loss (python.steps), the total gradient norm before clipping, clip_grad_norm_'s max_norm and the non-finite flag (python.numerics 'step' rows), the LR after the step (python.step_stats), and on traced steps the median and the largest update/weight ratio and the largest activation over the modules. `probe doctor` and `probe numerics` judge spikes, divergence, stalls and clipping from it.
-- params: window
WITH b AS (SELECT min(step) AS lo, max(step) AS hi FROM python.steps),
     n AS (SELECT step, any_value(grad_norm) AS grad_norm, any_value(clip_max_norm) AS clip_max_norm,
                  bool_or(grad_nonfinite) AS nonfinite
           FROM python.numerics WHERE kind = 'step' GROUP BY step),
     r AS (SELECT step, median(update_ratio) FILTER (WHERE isfinite(update_ratio)) AS update_ratio,
                  max(update_ratio) FILTER (WHERE isfinite(update_ratio)) AS max_ratio,
                  max(max_abs_act) AS max_act
           FROM python.numerics WHERE kind = 'module' GROUP BY step),
     l AS (SELECT step, any_value(lr) AS lr FROM python.step_stats GROUP BY step)
SELECT s.step, s.loss, n.grad_norm, n.clip_max_norm, n.nonfinite, l.lr, r.update_ratio,
       r.max_ratio, r.max_act
FROM python.steps s LEFT JOIN n USING (step) LEFT JOIN l USING (step) LEFT JOIN r USING (step), b
WHERE s.step <= b.lo + 19 OR s.step > b.hi - $window
ORDER BY s.step;
