-- name: doctor_loop
-- description: This rank's training loop over its last $last steps (python.step_stats): median step time, the share of it spent waiting in DataLoader iterators, the learning rate at the start and end of the window and how many steps changed it, how often clip_grad_norm_ ran with a finite norm and clipped, the median gradient norm before clipping, how often clip_grad_norm_ saw gradients an AMP GradScaler had not unscaled yet (and the median norm once unscaled), and non-finite gradient norms (first and last step), and the share of the steps' time (python.steps) the training thread waited for a CPU. `probe doctor` reads it.
-- params: last
WITH s AS (
    SELECT step, timestamp, data_wait, lr, grad_norm, clip_max_norm, clip_calls, grad_scale,
           timestamp - lag(timestamp) OVER (ORDER BY step) AS step_s,
           lr IS DISTINCT FROM lag(lr) OVER (ORDER BY step) AS lr_moved
    FROM python.step_stats
    WHERE step > (SELECT max(step) FROM python.step_stats) - $last - 1
)
SELECT count(step_s)                                                   AS steps,
       max(step)                                                       AS last_step,
       round(median(step_s) * 1e3, 3)                                  AS step_ms,
       round(sum(data_wait) FILTER (WHERE step_s IS NOT NULL)
             / nullif(sum(step_s), 0), 4)                              AS data_wait_share,
       round(median(data_wait) FILTER (WHERE step_s IS NOT NULL) * 1e3, 3) AS data_wait_ms,
       arg_min(lr, step)                                               AS lr_first,
       arg_max(lr, step)                                               AS lr_last,
       count(*) FILTER (WHERE lr_moved AND step_s IS NOT NULL)          AS lr_changes,
       count(*) FILTER (WHERE clip_calls > 0 AND step_s IS NOT NULL)   AS clip_steps,
       count(*) FILTER (WHERE clip_calls > 0 AND isfinite(grad_norm) AND step_s IS NOT NULL)
                                                                       AS clip_finite_steps,
       count(*) FILTER (WHERE grad_norm > clip_max_norm AND isfinite(grad_norm)
                        AND step_s IS NOT NULL)                        AS clipped_steps,
       max(clip_max_norm)                                              AS clip_max_norm,
       median(grad_norm) FILTER (WHERE isfinite(grad_norm))            AS grad_norm_median,
       count(*) FILTER (WHERE clip_calls > 0 AND grad_scale > 1 AND step_s IS NOT NULL)
                                                                       AS scaled_clip_steps,
       median(grad_scale) FILTER (WHERE grad_scale > 1)                AS grad_scale,
       median(grad_norm / coalesce(grad_scale, 1)) FILTER (WHERE isfinite(grad_norm))
                                                                       AS unscaled_norm_median,
       count(*) FILTER (WHERE NOT isfinite(grad_norm) AND step_s IS NOT NULL)
                                                                       AS nonfinite_grad_steps,
       min(step) FILTER (WHERE NOT isfinite(grad_norm) AND step_s IS NOT NULL)
                                                                       AS first_nonfinite_step,
       max(step) FILTER (WHERE NOT isfinite(grad_norm))                AS last_nonfinite_step,
       (SELECT round(sum(cpu_wait_ms) / nullif(sum(duration) FILTER (WHERE cpu_wait_ms IS NOT
                     NULL) * 1e3, 0), 4)
        FROM python.steps WHERE step > (SELECT max(step) FROM python.steps) - $last)
                                                                       AS cpu_wait_share
FROM s;
