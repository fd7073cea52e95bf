-- name: schedule
-- description: The LR schedule of this rank as last read (python.schedule): each top-level scheduler with its kind, how it was known (read, measured, opaque), warmup and decay end in scheduler steps, what the LR does past the end, the scheduler's own step count against the optimizer step it was read at, and the total steps the framework declares. Beside each row, the LR as observed at the steps python.step_stats still holds (first, peak and last, with their steps): a loop that sets the LR itself has no scheduler to read, and this is its schedule so far.
WITH lr AS (SELECT step, lr FROM python.step_stats WHERE isfinite(lr)),
observed AS (
    SELECT arg_min(lr, step) AS lr_first, min(step) AS lr_first_step,
           max(lr) AS lr_peak,
           min(step) FILTER (WHERE lr >= (SELECT max(lr) FROM lr)) AS lr_peak_step,
           arg_max(lr, step) AS lr_last, max(step) AS lr_last_step
    FROM lr
)
SELECT step, scheduler, location, kind, method, warmup_steps, end_step, after_end, sched_steps,
       total_steps, total_source, framework, note,
       lr_first, lr_first_step, lr_peak, lr_peak_step, lr_last, lr_last_step
FROM python.schedule, observed
WHERE step = (SELECT max(step) FROM python.schedule)
ORDER BY scheduler NULLS LAST
